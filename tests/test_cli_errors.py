"""Every failure a user can cause ends in one line on stderr with exit status 2 (130 for Ctrl-C),
over HTTP and libp2p alike, never in a traceback; and a challenge certain to fail is refused before
it spends the challenger's bond."""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import subprocess
import threading

import pytest
from chainutil import deployed_chain, new_operator, sign_raw
from netutil import SPECMARKET, complete, start_target

from node.chain.deployment import DEV_CHALLENGER, dev_address
from node.chain.receipts import RequestSpec
from node.cli import main
from node.model.loading import TINY_TARGET, model_hash
from verifier.params import SamplingParams

RUN_TIMEOUT_S = 120
ACCEPT_TIMEOUT_S = 60.0  # `ask` imports libp2p and dials; on a busy 2-core machine that takes seconds
EXIT_TIMEOUT_S = 15.0
WAIT_S = "20"  # a forced challenge's --wait-s: no referee answers, so it waits this long


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECMARKET, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def assert_one_line(done: subprocess.CompletedProcess, status: int, reason: str) -> None:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == status, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0], done.stderr[-3000:]


@pytest.fixture(scope="module")
def own_chain(tmp_path_factory):
    """An anvil of this module's own: the forced challenge below stays open, and the session
    chain's referee tests count the challenges open on theirs."""
    with deployed_chain(tmp_path_factory.mktemp("deployments")) as chain:
        yield chain


@pytest.fixture(scope="module")
def target(own_chain, tmp_path_factory):
    """A bonded target process (tiny pair, no drafters)."""
    tmp = tmp_path_factory.mktemp("target")
    node = start_target(
        tmp, "--chain", own_chain.rpc, "--deployments", str(own_chain.deployments), "--max-drafters", "0"
    )
    yield node
    node.stop()


@pytest.mark.parametrize("over", ["libp2p", "http"])
@pytest.mark.parametrize(
    ("args", "reason"),
    [(["", "--max-new-tokens", "8"], "prompt"), (["hi", "--max-new-tokens", "100000"], "max")],
    ids=["empty-prompt", "oversized-max-new-tokens"],
)
def test_ask_prints_the_targets_reason_on_both_transports(target, over, args, reason):
    address = target.lines["multiaddr"][0] if over == "libp2p" else target.lines["http"][0]
    done = cli("ask", "--target", address, *args)
    assert_one_line(done, 2, reason)
    assert "StreamEOF" not in done.stderr and "stream failed" not in done.stderr


def test_ctrl_c_on_ask_over_libp2p_exits_130_with_one_line(target, tmp_path):
    """Ctrl-C while `ask` waits on a target that accepted the TCP connection but never answers."""
    peer_id = target.lines["multiaddr"][0].rsplit("/", 1)[-1]
    silent = socket.create_server(("127.0.0.1", 0))
    accepted = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        held.append(silent.accept()[0])
        accepted.set()

    threading.Thread(target=accept, daemon=True).start()
    address = f"/ip4/127.0.0.1/tcp/{silent.getsockname()[1]}/p2p/{peer_id}"
    proc = subprocess.Popen(
        [*SPECMARKET, "ask", "--target", address, "hi"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert accepted.wait(ACCEPT_TIMEOUT_S), "ask never dialled"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        proc.kill()
        silent.close()
        for conn in held:
            conn.close()
    assert_one_line(subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr), 130, "interrupted")


@pytest.mark.parametrize(
    ("line", "reason"),
    [('gamma = "four"', "[target] gamma: expected int, got str"), ("max_drafters = true", "[target] max_drafters")],
    ids=["string-for-int", "bool-for-int"],
)
def test_a_config_value_of_the_wrong_type_is_one_line(tmp_path, capsys, line, reason):
    config = tmp_path / "bad.toml"
    config.write_text(f"[target]\n{line}\n")
    where = ["--data-dir", str(tmp_path / "t"), "--http", "127.0.0.1:0", "--chain", "http://127.0.0.1:1"]
    status = main(["target", "--pair", "tiny", "--config", str(config), *where])  # past it, the chain fails
    assert_one_line(subprocess.CompletedProcess([], status, "", capsys.readouterr().err), 2, reason)


@pytest.mark.parametrize("signature", [bytes(65), bytes(64) + b"\x1b"], ids=["65-zero-bytes", "zero-r-s-v27"])
def test_challenge_of_a_receipt_with_a_null_signature_is_one_line(own_chain, tmp_path, capsys, signature):
    committed = model_hash(TINY_TARGET)
    _, key = new_operator(own_chain, tmp_path, committed)
    signed = sign_raw(key, own_chain, RequestSpec.build([5, 6, 7], SamplingParams(), 1, 2), (3, 4), committed)
    path = tmp_path / "receipt.json"
    path.write_text(dataclasses.replace(signed, signature=signature).dumps())
    status = main(["challenge", "--pair", "tiny", "--receipt", str(path), *own_chain.cli_args()])  # in-process
    assert_one_line(subprocess.CompletedProcess([], status, "", capsys.readouterr().err), 2, "signature")


def test_a_challenge_certain_to_fail_is_refused_before_it_spends_and_a_forced_one_prints_its_id_at_once(
    own_chain, target, tmp_path, capsys
):
    answer = complete(target.lines["http"][0], "def main(", seed=3, max_tokens=8)
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(answer))  # an honest answer: every token is inside the band
    challenger = dev_address(DEV_CHALLENGER)
    nonce = own_chain.client.w3.eth.get_transaction_count(challenger)
    args = ["challenge", "--pair", "tiny", "--receipt", str(path), "--position", "0", *own_chain.cli_args()]
    refused = subprocess.CompletedProcess([], main(args), "", capsys.readouterr().err)  # in-process
    assert_one_line(refused, 2, "certain to fail")
    assert "--force" in refused.stderr
    assert own_chain.client.w3.eth.get_transaction_count(challenger) == nonce  # nothing sent
    proc = subprocess.Popen(
        [*SPECMARKET, *args, "--force", "--wait", "--wait-s", WAIT_S], stdout=subprocess.PIPE, text=True
    )
    try:
        opened = proc.stdout.readline()  # printed (and flushed) before the wait for the verdict
        still_waiting = proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    assert opened.startswith("challenge ") and "opened at position 0" in opened, opened
    assert still_waiting
    assert own_chain.client.w3.eth.get_transaction_count(challenger) == nonce + 1


@pytest.mark.parametrize(
    "args,reason",
    [
        (["drafter", "redeem"], "needs --rpc URL and --key-file"),
        (["drafter", "--bootstrap", "/ip4/127.0.0.1/tcp/1/p2p/x", "--payout", "0x12"], "--payout must be an address"),
        (["target", "--drafter-price", "-1"], "--drafter-price"),
        (["target", "--escrow-deposit", "lots"], "not an amount of ETH"),
    ],
)
def test_bad_payment_options_exit_2_with_one_line(args, reason, tmp_path):
    assert_one_line(cli(*args, "--data-dir", str(tmp_path)), 2, reason)


def test_redeem_with_a_wallet_that_names_no_voucher_says_so(own_chain, tmp_path):
    key_file = tmp_path / "payout.key"
    key_file.write_text("0x" + "11" * 32 + "\n")
    done = cli("drafter", "redeem", "--rpc", own_chain.rpc, "--key-file", str(key_file), "--data-dir", str(tmp_path))
    assert done.returncode == 0 and "nothing to redeem" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize(
    "args,reason",
    [
        (["target", "--tree-nodes", "99", "--data-dir", "/nonexistent"], "--tree-nodes must be in [0, 32]"),
        (["target", "--batch-rows", "-1", "--data-dir", "/nonexistent"], "--batch-rows must be in [0, 512]"),
        (["bench-trees", "--gamma", "17"], "--gamma at most 16"),
        (["bench-serve", "--clients", "1", "65"], "--clients at most 64"),
    ],
)
def test_bad_serving_options_exit_2_with_one_line(args, reason):
    assert_one_line(cli(*args), 2, reason)
