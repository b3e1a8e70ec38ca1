"""node.lab.llama_cpp without building llama.cpp or the network: the JSON parser on a recorded real
llama-bench output and on broken ones, the sdist check, the stamp, and run_llama_bench's error paths
through small shell scripts standing in for llama-bench."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from node.lab import llama_cpp
from node.lab.llama_cpp import (
    LlamaCppError,
    ensure_llama_bench,
    ensure_llama_cpp,
    parse_llama_bench_json,
    run_llama_bench,
)
from node.lab.llama_tools import (
    parse_completion_stdout,
    parse_perplexity_output,
    parse_token_ids,
    parse_verbose_prompt,
    run_completion,
    run_perplexity,
    run_tokenize,
)
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


def stamped_build(cache: Path, record: dict, targets: tuple[str, ...] = llama_cpp.TARGETS) -> Path:
    for target in targets:
        binary = cache / "build" / "bin" / target
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_text("#!/bin/sh\n")
    (cache / "build" / llama_cpp.STAMP).write_text(json.dumps(record))
    return cache / "build" / "bin" / llama_cpp.TARGET


def test_reuses_a_stamped_build(tmp_path: Path) -> None:
    binary = stamped_build(tmp_path, llama_cpp._stamp_record())
    assert ensure_llama_bench(tmp_path, jobs=1, fetch=no_fetch) == binary
    assert ensure_llama_bench(tmp_path, jobs=1, fetch=no_fetch) == binary
    assert ensure_llama_cpp(tmp_path, jobs=1, fetch=no_fetch) == binary.parent
    assert {"llama-perplexity", "llama-completion", "llama-speculative-simple"} <= set(llama_cpp.TARGETS)


def rebuilds(cache: Path) -> bool:
    """Whether ensure_llama_cpp would build: a corrupt tarball stops it at the sha256 check if so."""
    (cache / llama_cpp.SDIST_NAME).write_bytes(b"corrupt")
    try:
        ensure_llama_cpp(cache, jobs=1, fetch=no_fetch)
    except LlamaCppError as e:
        assert "sha256" in str(e)
        return True
    return False


def test_rebuilds_a_build_with_other_flags(tmp_path: Path) -> None:
    stamped_build(tmp_path, {**llama_cpp._stamp_record(), "cmake_flags": ["-DGGML_NATIVE=OFF"]})
    assert rebuilds(tmp_path)


def test_builds_the_other_tools_beside_an_older_llama_bench_build(tmp_path: Path) -> None:
    older = {k: v for k, v in llama_cpp._stamp_record().items() if k != "targets"} | {"target": "llama-bench"}
    stamped_build(tmp_path, older, targets=("llama-bench",))
    assert rebuilds(tmp_path)


def test_rebuilds_when_a_stamped_tool_is_gone(tmp_path: Path) -> None:
    stamped_build(tmp_path, llama_cpp._stamp_record())
    (tmp_path / "build" / "bin" / "llama-perplexity").unlink()
    assert rebuilds(tmp_path)


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


# ---- llama.cpp's quality tools (node.lab.llama_tools), on outputs recorded from real runs ---------------
# Recorded on the qwen2.5-coder GGUFs (the 0.5B draft's, for speed), one thread: see tests/data/llama_cpp/README.

DATA = RECORDED.parent


def data(name: str) -> str:
    return (DATA / name).read_text()


def test_parses_a_recorded_perplexity_run() -> None:
    result = parse_perplexity_output(data("perplexity.stdout") + data("perplexity.stderr"))
    final = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", data("perplexity.stderr"))
    assert (result.ppl, result.plus_minus) == (float(final.group(1)), float(final.group(2)))
    assert result.n_ctx == 128 and result.chunks == len(result.running) == 4
    assert result.running[-1] == pytest.approx(result.ppl, rel=1e-3) and result.command == ()


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace("Final estimate", "Final guess"),
        lambda t: t.replace("calculating perplexity over", "computing over"),
        lambda t: re.sub(r"PPL = [0-9.]+", "PPL = nan", t),
        lambda t: re.sub(r"\[4\][0-9.]+,", "", t),  # a chunk's estimate missing
        lambda t: "main: you need at least 256 tokens to evaluate perplexity with a context of 128\n",
    ],
)
def test_refuses_broken_perplexity_output(change) -> None:
    with pytest.raises(LlamaCppError):
        parse_perplexity_output(change(data("perplexity.stdout") + data("perplexity.stderr")))


def test_parses_recorded_token_ids() -> None:
    assert parse_token_ids(data("tokenize.stdout")) == tuple(json.loads(data("tokenize.expected.json")))
    for broken_ids in ("", "no list\n", "[1, 2,\n", '["a"]\n', "[true]\n"):
        with pytest.raises(LlamaCppError):
            parse_token_ids(broken_ids)


@pytest.mark.parametrize(("name", "ended"), [("completion", False), ("completion_ended", True)])
def test_parses_recorded_completions(name: str, ended: bool) -> None:
    expected = json.loads(data(f"{name}.expected.json"))
    assert parse_verbose_prompt(data(f"{name}.stderr")) == tuple(expected["prompt_ids"])
    assert parse_completion_stdout(data(f"{name}.stdout")) == (expected["text"], ended)


def test_refuses_broken_completion_output() -> None:
    stderr = data("completion.stderr")
    with pytest.raises(LlamaCppError, match="number of tokens"):
        parse_verbose_prompt(stderr.replace("number of tokens in prompt", "prompt tokens"))
    count = re.search(r"number of tokens in prompt = (\d+)", stderr)
    with pytest.raises(LlamaCppError, match="listed"):
        parse_verbose_prompt(stderr.replace(count.group(0), f"number of tokens in prompt = {int(count.group(1)) + 1}"))
    with pytest.raises(LlamaCppError, match="finished run"):
        parse_completion_stdout(data("completion.stdout").rstrip("\n"))


def test_runs_the_quality_tools_with_the_inputs_rules(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    binary, gguf = fake_bench(
        tmp_path, f'echo "$@" > {tmp_path}/args; cat {DATA}/perplexity.stdout; cat {DATA}/perplexity.stderr >&2'
    )
    text.write_text("x\n")
    result = run_perplexity(binary, gguf, text, n_ctx=128, chunks=4, cpu=None)
    args = (tmp_path / "args").read_text().split()
    assert {"--no-escape", "-t", "1", "-c", "128", "-b", "--chunks", "4"} <= set(args) and result.chunks == 4
    binary.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/args; cat {DATA}/completion.stdout; cat {DATA}/completion.stderr >&2\n'
    )
    done = run_completion(binary, gguf, text, 16, cpu=None)
    args = (tmp_path / "args").read_text().split()
    assert {"--no-escape", "-no-cnv", "--verbose-prompt", "-sp", "--temp", "0", "--top-k", "-n", "16"} <= set(args)
    assert done.text == json.loads(data("completion.expected.json"))["text"] and not done.ended
    binary.write_text(f"#!/bin/sh\ncat {DATA}/tokenize.stdout\n")
    assert run_tokenize(binary, gguf, text) == tuple(json.loads(data("tokenize.expected.json")))


def test_quality_tools_report_failures(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("x\n")
    binary, gguf = fake_bench(tmp_path, "echo 'main: you need at least 1024 tokens' >&2; exit 1")
    with pytest.raises(LlamaCppError, match=r"(?s)exit status 1.*you need at least"):
        run_perplexity(binary, gguf, text, cpu=None)
    binary.write_text("#!/bin/sh\nexec sleep 10\n")
    with pytest.raises(LlamaCppError, match=r"ran past 0\.5 s"):
        run_completion(binary, gguf, text, 8, cpu=None, timeout_s=0.5)
    with pytest.raises(LlamaCppError, match=r"no .*absent"):
        run_tokenize(binary, gguf, tmp_path / "absent.txt")
