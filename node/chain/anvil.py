"""A local Anvil chain from npm (`@foundry-rs/anvil`): find it, start it, check it, stop it.

Anvil runs as its own process. ``AnvilProcess`` owns one for the lifetime of a ``with`` block (tests,
the demo); ``ensure_anvil`` starts a detached one for ``specmarket chain up|deploy`` that outlives
the command, remembered by a pid file so ``specmarket chain down`` can stop it by its own pid.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from node.chain import ChainError

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = REPO_ROOT / "node_modules"
NODE_BIN = NODE_MODULES / ".bin"
ANVIL_CHAIN_ID = 31337
DEFAULT_RPC = "http://127.0.0.1:8545"
RPC_PROBE_TIMEOUT_S = 2.0
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
PID_FILE = "anvil.pid"
LOG_FILE = "anvil.log"
STATE_FILE = "anvil-state.json"


_PLATFORMS = {("Linux", "x86_64"): "linux-amd64", ("Linux", "aarch64"): "linux-arm64",
              ("Darwin", "x86_64"): "darwin-amd64", ("Darwin", "arm64"): "darwin-arm64"}  # fmt: skip


def tool_path(name: str) -> Path:
    """An npm-installed Foundry binary (``anvil`` or ``forge``); a clear error when missing.

    The platform binary itself, not npm's launcher in node_modules/.bin: the launcher of
    @foundry-rs 1.7.1 always exits 0 (foundry-rs/foundry#14781) and runs the tool as its child, so
    neither its exit status nor its pid would be the tool's.
    """
    platform = _PLATFORMS.get((os.uname().sysname, os.uname().machine), "unknown")
    for path in (NODE_MODULES / "@foundry-rs" / f"{name}-{platform}" / "bin" / name, NODE_BIN / name):
        if path.exists():
            return path
    raise ChainError(f"{name} not found under {NODE_MODULES}: run `npm ci` in {REPO_ROOT} (or `make setup`)")


def free_port() -> int:
    """A loopback TCP port nothing listens on right now (for a new anvil)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chain_id_at(url: str, timeout: float = RPC_PROBE_TIMEOUT_S) -> int | None:
    """The chain id an Ethereum JSON-RPC endpoint reports, or None when nothing answers there."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read(4096))
        return int(answer["result"], 16)
    except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError):
        return None


def local_port(url: str) -> int:
    """The port of a loopback RPC URL; an error for any other host (we only start local chains)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOCAL_HOSTS or parts.port is None:
        raise ChainError(f"nothing answers at {url}, and only http://127.0.0.1:PORT can be started locally")
    return parts.port


def _wait_until_up(url: str, proc: subprocess.Popen, log_path: Path | None) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text()[-2000:] if log_path and log_path.exists() else ""
            raise ChainError(f"anvil exited with code {proc.returncode} before answering at {url}\n{tail}")
        chain_id = chain_id_at(url, timeout=0.5)
        if chain_id is not None:
            return chain_id
        time.sleep(0.1)
    proc.kill()
    raise ChainError(f"anvil did not answer at {url} within {START_TIMEOUT_S:.0f} s")


def _anvil_argv(port: int, state_file: Path | None) -> list[str]:
    argv = [str(tool_path("anvil")), "--host", "127.0.0.1", "--port", str(port), "--silent"]
    if state_file is not None:  # keep the chain (deployment, bonds, challenges) across restarts
        argv += ["--state", str(state_file), "--state-interval", "5"]
    return argv


class AnvilProcess:
    """One anvil child process on a loopback port, stopped (by its own pid) when the block exits."""

    def __init__(self, port: int, state_file: Path | None = None) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.state_file = state_file
        self.proc: subprocess.Popen | None = None
        self.chain_id: int | None = None

    def __enter__(self) -> AnvilProcess:
        if chain_id_at(self.url, timeout=0.5) is not None:
            raise ChainError(f"something already answers at {self.url}; pick another port")
        self.proc = subprocess.Popen(
            _anvil_argv(self.port, self.state_file), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.chain_id = _wait_until_up(self.url, self.proc, None)
        log.info("anvil pid %d answers at %s (chain id %d)", self.proc.pid, self.url, self.chain_id)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            _stop_pid(self.proc.pid, self.proc)
            self.proc = None


def _stop_pid(pid: int, proc: subprocess.Popen | None = None) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if proc is not None:
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def ensure_anvil(url: str, state_dir: Path) -> bool:
    """Make sure a chain answers at ``url``: start a detached anvil there if nothing does.

    Returns True when this call started it. Its pid, log and state file go under ``state_dir``.
    """
    if chain_id_at(url) is not None:
        return False
    port = local_port(url)
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / LOG_FILE
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            _anvil_argv(port, state_dir / STATE_FILE),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives this command and its Ctrl-C
        )
    (state_dir / PID_FILE).write_text(f"{proc.pid}\n")
    chain_id = _wait_until_up(url, proc, log_path)
    log.info("started anvil (pid %d, chain id %d) at %s; `specmarket chain down` stops it", proc.pid, chain_id, url)
    return True


def stop_detached(state_dir: Path, url: str | None = None) -> int | None:
    """Stop the anvil ``ensure_anvil`` started (by the pid in its pid file); its pid, or None.
    With ``url``, only if that anvil is the one serving it (an error otherwise: nothing stopped)."""
    pid_file = state_dir / PID_FILE
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if not _is_anvil(pid):  # a stale pid file: that pid may belong to someone else by now
        pid_file.unlink(missing_ok=True)
        return None
    if url is not None and _port_of(pid) != local_port(url):
        raise ChainError(
            f"the anvil started in {state_dir} (pid {pid}) listens on port {_port_of(pid)}, not at {url}: "
            "not stopped (give the --state-dir of the `chain up` that started it)"
        )
    _stop_pid(pid)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    return pid


def _is_anvil(pid: int) -> bool:
    try:
        return b"anvil" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _port_of(pid: int) -> int | None:
    """The --port an anvil process was started with (``_anvil_argv``); None if unknown."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if b"--port" not in argv[:-1]:
        return None
    value = argv[argv.index(b"--port") + 1]
    return int(value) if value.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
