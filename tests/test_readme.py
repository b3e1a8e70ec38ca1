"""The README is executable: every shell block of its hand-run sections ("Run the market by hand",
"Bond the target and dispute its answers" and the payment block after "A bonded target also pays its
drafters", the curl examples included) runs here, read from README.md at run time, against real
processes: `specmarket target`, `drafter`, `referee`, `challenge`, anvil from npm through `chain up`.

Commands that serve until stopped (target, drafter, referee, anything ending in ``&``) start in the
background and are waited for (each prints when it is ready); the others must exit 0. Where the
README states an outcome, it is checked. Each section runs on its own free ports, directories and
chain, and every process it started is stopped at its end, also on a failure.

The README's fixed addresses, paths and defaults become this run's in ONE place, the tables below.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pytest
from readme_blocks import Block, Line, readme_blocks

from node.chain.anvil import DEFAULT_RPC, free_port, stop_detached
from node.client.http import http_json
from node.lab.procs import CHILD_ENV, STARTUP_TIMEOUT_S, NodeProcess, ProcessGroup, wait_for_drafters

pytestmark = pytest.mark.slow(seconds=120)

BIN = Path(sys.executable).parent  # the virtual environment running this test
TEST_PAIR = "tiny"  # the README's commands run the default (1.5B) pair; the test runs the small one

# ---------------------------------------------------------------------------------------------------
# 1. What the README's commands leave to the CLI's defaults, made explicit in the README's own terms
#    (inserted after the subcommand where the flag is absent; the substitutions below then apply),
#    and the model pair. No environment variable or default config file selects a pair, so the
#    existing --pair flag does. test_implied_values_are_the_cli_defaults checks them against the CLI.
README_HTTP = "127.0.0.1:8000"
README_RPC = "http://127.0.0.1:8545"
PAIR = ("--pair", TEST_PAIR)
RPC = ("--rpc", README_RPC)
IMPLIED: dict[str, tuple[tuple[str, str], ...]] = {
    "target": (PAIR, ("--http", README_HTTP)),
    "drafter": (PAIR,),
    "ask": (PAIR, RPC),
    "challenge": (PAIR, RPC),
    "referee": (PAIR, RPC),
    "chain up": (RPC,),
    "chain status": (RPC,),
    "chain fund": (RPC,),
    "drafter redeem": (RPC,),
    "escrow status": (RPC,),
    "escrow withdraw": (RPC,),
}
# 1b. One flag the test pair needs and the README's pair does not: the tiny target decodes a token in
#    about 3 ms, less than one libp2p round trip to a drafter (~15 ms), so the market's wait budget
#    rightly stops drafting after a few rounds and a drafter would earn nothing to redeem (the README's
#    1.5B target takes ~100 ms a token, where drafts pay). With the budget off the tiny pair's drafter
#    drafts every round, and the payment section's outcomes can be checked.
FOR_THE_TEST_PAIR: dict[str, tuple[tuple[str, str], ...]] = {"target": (("--wait-budget", "0"),)}
# 2. README text -> this run's; {fields}: the section's free ports and directories, the venv, and
#    the multiaddr of the target started last. One pass, first match wins (so a value is never
#    substituted again).
SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    (re.escape(".venv/bin/"), "{bin}/"),
    (re.escape("localhost:8000"), "127.0.0.1:{http_a}"),
    (re.escape("127.0.0.1:8000"), "127.0.0.1:{http_a}"),
    (re.escape("127.0.0.1:8001"), "127.0.0.1:{http_b}"),
    (re.escape("127.0.0.1:8545"), "127.0.0.1:{anvil}"),
    (re.escape("/tmp/"), "{tmp}/"),
    (r"/ip4/\S*\.\.\.", "{multiaddr}"),  # /ip4/127.0.0.1/tcp/41234/p2p/12D3KooW..., /ip4/..., /ip4/.../p2p/...
)
# 3. The environment: every default data directory (target, drafter, the chain's anvil state and
#    deployments, the referees' verdict pool) under the section's own XDG_DATA_HOME; commands run in
#    the section's directory (a relative path such as a key file lands there).
# ---------------------------------------------------------------------------------------------------

# test id -> (the ## heading, the prose that opens its part of it: "" for the heading's start). A part
# runs from its opening block to the next part's, so a block added to a section runs with its part.
SECTIONS = {
    "by_hand": ("Run the market by hand", ""),
    "bond": ("Bond the target and dispute its answers", ""),
    "payment": ("Bond the target and dispute its answers", "A bonded target also pays its drafters"),
}
SERVES = re.compile(r"specmarket (?:target|referee|drafter(?! redeem))\b")  # runs until stopped
READY = {"target": ("multiaddr", "http"), "drafter": ("registered",), "referee": ("referee",)}
REDEEM = re.compile(r"specmarket drafter redeem\b")
SETTLE_TIMEOUT_S = 20.0  # a job's voucher reaches its drafter after the answer
SUBCOMMAND = re.compile(r"\bspecmarket ((?:chain|keys|escrow) [\w-]+|drafter redeem|[\w-]+)")
SEGMENT_END = re.compile(r"&&|\|\||[;|]|&\s*$")
COMMAND_TIMEOUT_S = 300.0  # the longest: a challenge waiting for the referees' verdict


def fields(tmp: Path) -> dict[str, str]:
    return {
        "bin": str(BIN),
        "tmp": str(tmp),
        "http_a": str(free_port()),
        "http_b": str(free_port()),
        "anvil": str(free_port()),
    }


def make_implicit_explicit(command: str) -> str:
    """``command`` with the IMPLIED (and FOR_THE_TEST_PAIR) flags of each ``specmarket SUBCOMMAND`` in it
    that it lacks."""
    for match in reversed(list(SUBCOMMAND.finditer(command))):
        rest = command[match.end() :]
        end = SEGMENT_END.search(rest)
        words = (rest[: end.start()] if end else rest).split()
        wanted = (*IMPLIED.get(match.group(1), ()), *FOR_THE_TEST_PAIR.get(match.group(1), ()))
        missing = [(flag, value) for flag, value in wanted if flag not in words]
        extra = "".join(f" {flag} {value}" for flag, value in missing)
        command = command[: match.end()] + extra + rest
    return command


def substitute(command: str, values: dict[str, str]) -> str:
    pattern = re.compile("|".join(f"({p})" for p, _ in SUBSTITUTIONS))

    def replace(match: re.Match) -> str:
        template = SUBSTITUTIONS[match.lastindex - 1][1]
        try:
            return template.format(**values)
        except KeyError as exc:
            raise AssertionError(f"{match.group(0)!r} has no value yet ({exc}): no target started before it") from None

    return pattern.sub(replace, command)


def section_blocks(name: str) -> list[Block]:
    """The blocks of SECTIONS[name]: from the one its opening prose precedes to the next part's."""
    heading, opening = SECTIONS[name]
    in_heading = [b for b in readme_blocks() if b.section == heading]
    openings = [o for h, o in SECTIONS.values() if h == heading and o]
    starts = [i for i, b in enumerate(in_heading) if (opening in b.preceding if opening else i == 0)]
    assert len(starts) == 1, f"README.md: {len(starts)} shell blocks open {name!r} ({heading!r}, {opening!r})"
    ends = [i for i, b in enumerate(in_heading) if i > starts[0] and any(o in b.preceding for o in openings)]
    return in_heading[starts[0] : min(ends, default=len(in_heading))]


@dataclass
class Ran:
    line: Line
    command: str  # as run, after the substitutions
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Due:
    data_dir: Path  # the drafter's
    operator: str  # the target's operator address ("" for an unbonded target)
    wei: int  # price x the drafter's credited tokens

    def settled(self) -> bool:
        """The drafter's wallet holds a voucher for all it earned from the target's operator (the wallet
        keys accounts by "<chain id>:<escrow>:<operator>")."""
        wallet = self.data_dir / "wallet.json"
        accounts = json.loads(wallet.read_text())["accounts"] if wallet.exists() else {}
        account = next((a for key, a in accounts.items() if self.operator and key.endswith(":" + self.operator)), {})
        return account.get("earned_wei", 0) == self.wei and (not self.wei or bool(account.get("lanes")))


def peer_id(node: NodeProcess) -> str:
    return node.lines["multiaddr"][0].rsplit("/", 1)[-1]


def data_dir(command: str, xdg: Path) -> Path:
    """A drafter command's data directory: --data-dir, else its default under XDG_DATA_HOME."""
    given = re.search(r"--data-dir (\S+)", command)
    return Path(given.group(1)) if given else xdg / "specmarket" / "drafter"


@dataclass
class Shell:
    """One section's commands, run as a reader would: long-running ones in the background."""

    tmp: Path
    values: dict[str, str]
    variables: dict[str, str] = field(default_factory=dict)  # NAME=$(...) assignments, exported
    group: ProcessGroup = field(default_factory=ProcessGroup)
    targets: list[NodeProcess] = field(default_factory=list)
    background: dict[int, NodeProcess] = field(default_factory=dict)  # README line -> process
    drafter_nodes: list[tuple[int, NodeProcess, Path]] = field(default_factory=list)  # (target, node, data dir)
    ran: list[Ran] = field(default_factory=list)

    @property
    def xdg(self) -> Path:
        return self.tmp / "xdg"

    def env(self) -> dict[str, str]:
        return {**os.environ, **CHILD_ENV, "XDG_DATA_HOME": str(self.xdg), **self.variables}

    def command(self, line: Line) -> str:
        return substitute(make_implicit_explicit(line.command), self.values)

    def run(self, line: Line) -> Ran:
        command = self.command(line)
        if SERVES.search(command) or command.endswith("&"):
            ran = self.start(line, command.removesuffix("&").strip())
        else:
            if REDEEM.search(command):  # a reader's pause: each job's voucher reaches the drafter after its answer
                self.wait_for_vouchers()
            ran = self.foreground(line, command)
        self.ran.append(ran)
        return ran

    def dues(self) -> list[Due]:
        """What each drafter started here has earned from its target, by the target's own ledger."""
        out = []
        for index, node, directory in self.drafter_nodes:
            health = http_json(f"{self.targets[index].lines['http'][0]}/health")
            operator = health.get("operator") or {}
            payments = operator.get("payments") or {}
            credited = health["drafters"].get(peer_id(node), {}).get("credited_tokens", 0)
            out.append(Due(directory, operator.get("address", ""), payments.get("price_wei", 0) * credited))
        return out

    def wait_for_vouchers(self) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while not all(due.settled() for due in self.dues()):
            assert time.monotonic() < deadline, f"no voucher for what the drafters earned: {self.dues()}"
            time.sleep(0.2)

    def foreground(self, line: Line, command: str) -> Ran:
        assignment = re.fullmatch(r"([A-Za-z_]\w*)=(.+)", command)
        script = f'{command}\nprintf %s "${assignment.group(1)}"' if assignment else command
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=self.tmp,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            late = f"README.md:{line.number} ran past {COMMAND_TIMEOUT_S:.0f} s: {command}\n{err}"
            raise AssertionError(late) from None
        assert proc.returncode == 0, f"README.md:{line.number} exited {proc.returncode}: {command}\n{out}\n{err}"
        if assignment:
            self.variables[assignment.group(1)] = out.strip()
        return Ran(line, command, out, err)

    def start(self, line: Line, command: str) -> Ran:
        assert not SEGMENT_END.search(command), f"README.md:{line.number}: one command to a background line"
        role = SERVES.search(command)
        assert role, f"README.md:{line.number}: no readiness rule for a background {command!r}"
        role_name = role.group(0).split()[1]
        log = self.tmp / f"line{line.number}.log"
        with log.open("w") as stderr:
            proc = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=self.tmp,
                env=self.env(),
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        node = self.group.add(NodeProcess(proc, log))
        node.start_reading()
        ready = node.wait_until(lambda lines: all(k in lines for k in READY[role_name]), STARTUP_TIMEOUT_S)
        assert ready, f"README.md:{line.number} not ready (exit {proc.poll()}): {command}\n{node.log()[-3000:]}"
        self.background[line.number] = node
        if role_name == "target":
            self.targets.append(node)
            self.values["multiaddr"] = node.lines["multiaddr"][0]
        elif role_name == "drafter":  # a reader asks once the drafter shows up; so does the test
            index = len(self.targets) - 1
            self.drafter_nodes.append((index, node, data_dir(command, self.xdg)))
            wait_for_drafters(self.targets[index].lines["http"][0], sum(i == index for i, *_ in self.drafter_nodes))
        return Ran(line, command, "", "")

    def close(self) -> None:
        """Stop every process the section started, the chain `chain up` left running included."""
        self.group.stop_all()
        stop_detached(self.xdg / "specmarket" / "chain")


# --- outcomes the README states, each checked on the output of the line it is stated on --------------


def check_quoted(ran: Ran, shell: Shell) -> None:
    """A comment's quoted output, "first ... last", appears in the output, its parts in order."""
    for quoted in re.findall(r'"([^"]+)"', ran.line.comment):
        at = 0
        for part in quoted.split("..."):
            found = ran.stdout.find(part.strip(), at)
            assert found >= 0, f"README.md:{ran.line.number}: {part.strip()!r} not in the output:\n{ran.stdout}"
            at = found + len(part.strip())


def check_target_prints(ran: Ran, shell: Shell) -> None:
    """`target` prints its multiaddr and its HTTP address (the one it was given)."""
    node = shell.background[ran.line.number]
    assert node.lines["multiaddr"][0].startswith("/ip4/127.0.0.1/tcp/") and "/p2p/" in node.lines["multiaddr"][0]
    http = re.search(r"--http (\S+)", ran.command)
    assert http and node.lines["http"][0] == f"http://{http.group(1)}", node.lines


def check_bonded(ran: Ran, shell: Shell) -> None:
    """ "registers and bonds N ETH": the target's /health shows its bond."""
    eth = re.search(r"bonds ([0-9.]+) ETH", ran.line.comment)
    assert eth, ran.line.comment
    node = shell.background[ran.line.number]
    health = http_json(f"{node.lines['http'][0]}/health")
    assert health["operator"]["bond_wei"] == int(float(eth.group(1)) * 10**18), health


def check_answer(ran: Ran, shell: Shell) -> None:
    """`ask` prints an answer (and, with --receipt-out, saves its receipt)."""
    assert ran.stdout.strip(), f"README.md:{ran.line.number}: no answer\n{ran.stderr}"
    receipt = re.search(r"--receipt-out (\S+)", ran.command)
    if receipt:
        assert json.loads(Path(receipt.group(1)).read_text()), ran.stderr


def check_own_drafts(ran: Ran, shell: Shell) -> None:
    """`ask --draft`: the same answer as the first `ask` of the section (the same seed), and the
    count of the client's own draft tokens the target accepted."""
    first = next(r for r in shell.ran if "specmarket ask" in r.line.command)
    assert ran.stdout == first.stdout, (ran.stdout, first.stdout)
    assert re.search(r"your drafts: \d+ of \d+ tokens accepted", ran.stderr), ran.stderr


def check_curl(ran: Ran, shell: Shell) -> None:
    """The HTTP API answers the curl examples with JSON choices (OpenAI-compatible)."""
    try:
        answer = json.loads(ran.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"README.md:{ran.line.number}: not JSON: {ran.stdout[:500]!r}") from None
    choices = answer.get("choices") if isinstance(answer, dict) else None
    assert choices, f"README.md:{ran.line.number}: no choices in {answer!r}"
    first = choices[0]
    text = first["message"]["content"] if "/chat/" in ran.command else first["text"]
    assert isinstance(text, str), first


def check_slashed(ran: Ran, shell: Shell) -> None:
    """ "challenged, resolved, slashed, paid": the challenge opened, the referees found the operator at
    fault on chain (which slashes it), and the challenger withdrew its bond and reward."""
    out = ran.stdout
    assert re.search(r"challenge \d+ opened at position \d+", out), out
    paid = re.search(r"outcome: operator at fault; withdrew ([0-9.]+) ETH", out)
    assert paid and float(paid.group(1)) > 0, out
    referee = next(node for node in shell.background.values() if " referee" in node.proc.args[-1])
    assert referee.wait_until(resolved_at_fault, 10.0), referee.lines
    operator = json.loads(Path(re.search(r"--receipt (\S+)", ran.command).group(1)).read_text())["receipt"]["operator"]
    rpc = re.search(r"--rpc (\S+)", ran.command).group(1)
    status = json.loads(shell.foreground(ran.line, f"{BIN}/specmarket chain status --json --rpc {rpc}").stdout)
    config, bonded = status["config"], status["operators"][operator]
    assert ether(bonded["bond"]) == ether(config["min_bond"]) - ether(config["slash_amount"]), (bonded, config)
    assert [row["state"] for row in status["challenges"] if row["operator"] == operator] == ["operator at fault"]


def ether(amount: str) -> float:
    """'0.1 ETH' -> 0.1 (how `chain status --json` shows amounts)."""
    value, unit = amount.split()
    assert unit == "ETH", amount
    return float(value)


def resolved_at_fault(lines: dict[str, list[str]]) -> bool:
    """The referee printed ``challenge N: operator at fault; resolved on chain``."""
    verdicts = (v for key, values in lines.items() if key.startswith("challenge ") for v in values)
    return any(v.startswith("operator at fault; resolved on chain") for v in verdicts)


def check_key(ran: Ran, shell: Shell) -> None:
    """`keys new` prints the new key's address."""
    name = ran.line.command.split("=", 1)[0]
    assert re.fullmatch(r"0x[0-9a-fA-F]{40}", shell.variables[name]), shell.variables[name]


def check_paid(ran: Ran, shell: Shell) -> None:
    """ "prints what was paid": the drafter redeemed exactly the price of the tokens the target credited
    it with, and more than nothing."""
    paid = re.findall(r"redeemed ([0-9.]+) ETH", ran.stdout)
    owed = sum(due.wei for due in shell.dues() if due.data_dir == data_dir(ran.command, shell.xdg))
    assert owed > 0, f"README.md:{ran.line.number}: no draft token was accepted, so nothing was earned"
    assert sum(Decimal(eth) * 10**18 for eth in paid) == owed, f"owed {owed} wei, paid:\n{ran.stdout}"


def check_paid_shown(ran: Ran, shell: Shell) -> None:
    """ "each drafter's lane: held, paid, owed": `chain status` lists the payout address's lane."""
    for address in (v for v in shell.variables.values() if re.fullmatch(r"0x[0-9a-fA-F]{40}", v)):
        lane = rf"-> {address} lane \d+\s+holds [0-9.]+ ETH.*\s+paid [0-9.]+ ETH\s+owed [0-9.]+ ETH"
        assert re.search(lane, ran.stdout), ran.stdout


def check_operator_view(ran: Ran, shell: Shell) -> None:
    """ "the operator's pool and lanes": `escrow status` lists the payout address's lane."""
    assert re.search(r"operator 0x[0-9a-fA-F]{40}: pool [0-9.]+ ETH, [1-9]\d* lane", ran.stdout), ran.stdout
    for address in (v for v in shell.variables.values() if re.fullmatch(r"0x[0-9a-fA-F]{40}", v)):
        assert re.search(rf"{address} lane \d+: holds [0-9.]+ ETH", ran.stdout), ran.stdout


def check_pool_back(ran: Ran, shell: Shell) -> None:
    """ "the pool back, at once": `escrow withdraw --all` empties the pool."""
    assert re.search(r"withdrew [0-9.]+ ETH to 0x[0-9a-fA-F]{40}; pool now 0 ETH", ran.stdout), ran.stdout


# (name, applies to a line when, check); each section names the checks it must have made
CHECKS: tuple[tuple[str, Callable[[Line], bool], Callable[[Ran, Shell], None]], ...] = (
    ("quoted", lambda line: '"' in line.comment, check_quoted),
    ("target", lambda line: bool(re.search(r"specmarket target\b", line.command)), check_target_prints),
    ("bonded", lambda line: "bonds" in line.comment and "ETH" in line.comment, check_bonded),
    ("ask", lambda line: "specmarket ask" in line.command, check_answer),
    ("curl", lambda line: line.command.startswith("curl "), check_curl),
    ("own drafts", lambda line: "your drafts" in line.comment, check_own_drafts),
    ("slashed", lambda line: "challenged, resolved, slashed, paid" in line.comment, check_slashed),
    ("key", lambda line: "specmarket keys new" in line.command, check_key),
    ("paid", lambda line: "prints what was paid" in line.comment, check_paid),
    ("paid shown", lambda line: "each drafter's lane" in line.comment, check_paid_shown),
    ("operator view", lambda line: "the operator's pool and lanes" in line.comment, check_operator_view),
    ("pool back", lambda line: "the pool back" in line.comment, check_pool_back),
)
EXPECTED_CHECKS = {
    "by_hand": {"target", "ask", "own drafts", "curl"},
    "bond": {"quoted", "target", "bonded", "ask", "slashed"},
    "payment": {"target", "key", "ask", "paid", "paid shown", "operator view", "pool back"},
}


def run_section(name: str, tmp: Path) -> list[Ran]:
    lines = [line for block in section_blocks(name) for line in block.lines]
    shell = Shell(tmp, fields(tmp))
    made: set[str] = set()
    try:
        for line in lines:
            ran = shell.run(line)
            for check_name, applies, check in CHECKS:
                if applies(line):
                    check(ran, shell)
                    made.add(check_name)
    finally:
        shell.close()
    assert lines and [r.line for r in shell.ran] == lines, "a README line was not run"
    assert EXPECTED_CHECKS[name] <= made, f"outcomes the README states went unchecked: {EXPECTED_CHECKS[name] - made}"
    return shell.ran


def same_answers(ran: list[Ran], tmp: Path) -> None:
    """ "The answer is the same, token for token, as `specmarket generate --drafter none --seed 7` with
    the same prompt and parameters, whichever drafters are connected": over libp2p and HTTP alike."""
    asks: dict[str, list[Ran]] = {}
    for r in ran:
        if "specmarket ask" in r.command and "--chat" not in r.command:
            asks.setdefault(re.sub(r" --target \S+", "", r.command), []).append(r)
    both = [same for same in asks.values() if len(same) > 1]
    assert both, "no request asked both over libp2p and over HTTP"
    for same in both:
        assert len({r.stdout for r in same}) == 1, [r.stdout for r in same]
        plain = subprocess.run(
            [str(BIN / "specmarket"), "generate", "--drafter", "none", *generate_args(same[0].command), "--json"],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            cwd=tmp,
            env={**os.environ, **CHILD_ENV},
        )
        assert plain.returncode == 0, plain.stderr
        assert same[0].stdout == json.loads(plain.stdout)["text"] + "\n", (same[0].stdout, plain.stdout)


def generate_args(ask: str) -> list[str]:
    """`generate`'s arguments for the request an `ask` command line makes (its prompt, seed, sampling)."""
    words = shlex.split(ask)
    kept = ("--pair", "--seed", "--temperature", "--top-p", "--max-new-tokens")
    pairs = [w for i, w in enumerate(words) if w in kept or (i and words[i - 1] in kept)]
    return [*pairs, "--prompt", words[-1]]


@pytest.mark.parametrize("name", list(SECTIONS))
def test_readme_section_runs(name: str, tmp_path: Path) -> None:
    ran = run_section(name, tmp_path)
    if name == "by_hand":
        same_answers(ran, tmp_path)


def test_every_hand_run_block_is_tested() -> None:
    """A new block in the hand-run sections, or a curl example elsewhere, cannot go untested."""
    headings = {heading for heading, _ in SECTIONS.values()}
    in_sections = [b for b in readme_blocks() if b.section in headings]
    tested = [b for name in SECTIONS for b in section_blocks(name)]
    assert sorted(b.first_line for b in tested) == [b.first_line for b in in_sections]  # each block once
    curls = [line for b in readme_blocks() for line in b.lines if line.command.startswith("curl ")]
    assert curls and all(any(line in b.lines for b in tested) for line in curls)


def test_implied_values_are_the_cli_defaults() -> None:
    """IMPLIED writes out the CLI's own defaults, in the README's terms (and pins the pair only)."""
    from node.model.pairs import DEFAULT_PAIR, PAIRS
    from node.target.config import DEFAULT_HTTP

    assert DEFAULT_HTTP == README_HTTP and DEFAULT_RPC == README_RPC
    assert TEST_PAIR in PAIRS and TEST_PAIR != DEFAULT_PAIR


def test_substitutions() -> None:
    values = {"bin": "/v/bin", "tmp": "/t", "http_a": "1", "http_b": "2", "anvil": "3", "multiaddr": "/ip4/m"}
    line = ".venv/bin/specmarket target --chain http://127.0.0.1:8545 --data-dir /tmp/op"
    assert substitute(make_implicit_explicit(line), values) == (
        "/v/bin/specmarket target --pair tiny --http 127.0.0.1:1 --wait-budget 0"
        " --chain http://127.0.0.1:3 --data-dir /t/op"
    )
    both = ".venv/bin/specmarket chain status && .venv/bin/specmarket chain down"
    assert substitute(make_implicit_explicit(both), values) == (
        "/v/bin/specmarket chain status --rpc http://127.0.0.1:3 && /v/bin/specmarket chain down"
    )
    assert substitute("drafter --bootstrap /ip4/.../p2p/12D3KooW... x", values) == "drafter --bootstrap /ip4/m x"
