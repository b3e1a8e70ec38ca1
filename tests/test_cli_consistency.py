"""One consistent CLI (issue 38): `drafter redeem` is a subcommand with its own help and an honest
exit status; every `chain` subcommand has a description, and `chain down` takes --rpc; a subcommand
refuses an unknown option with its own usage; `keys new` and `chain fund` give a drafter a payout
key with gas; `target --cheat` lists every cheat. The payment flow runs on a real anvil from npm,
with `specmarket` processes."""

from __future__ import annotations

import argparse
import json
import re
import stat
import subprocess
import time

import pytest
from chainutil import deployed_chain
from eth_account import Account
from netutil import SPECMARKET

from node.chain.anvil import chain_id_at, free_port, tool_path
from node.chain.cheat import Cheat
from node.chain.deployment import DEV_OPERATOR, ETHER, dev_address, dev_key, format_ether
from node.chain.escrow import EscrowClient
from node.chain.keys import read_key
from node.chain.vouchers import Voucher, escrow_domain, sign_voucher
from node.cli import build_parser, main
from node.drafter.wallet import Wallet

RUN_TIMEOUT_S = 180
BOOTSTRAP = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWTarget"
LANE = 1
PRICE_WEI, ACCEPTED = 10**9, 7


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECMARKET, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare words


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


# ------------------------------------------------------------------------- parsing and help


def test_drafter_redeem_has_its_own_help(capsys):
    redeem = help_of(capsys, "drafter", "redeem")
    assert "usage: specmarket drafter redeem" in redeem
    for option in ("--rpc", "--key-file", "--data-dir", "--config"):
        assert option in redeem
    for run_only in ("--bootstrap", "--strategy", "--payout", "--redeem-above"):
        assert run_only not in redeem
    drafter = help_of(capsys, "drafter")
    assert "--bootstrap" in drafter and "redeem" in drafter


def test_drafter_without_a_subcommand_runs_as_before():
    parse = build_parser().parse_args
    plain = parse(["drafter", "--bootstrap", BOOTSTRAP, "--no-overlap", "--payout", dev_address(6)])
    assert plain.func.__name__ == "_cmd_drafter" and plain.bootstrap == BOOTSTRAP and plain.overlap is False
    assert parse(["drafter", "--bootstrap", BOOTSTRAP]).overlap is None  # not given: the config decides
    run = parse(["drafter", "run", "--bootstrap", BOOTSTRAP, "--seed", "3"])
    assert run.func.__name__ == "_cmd_drafter" and (run.bootstrap, run.seed) == (BOOTSTRAP, 3)
    before = parse(["drafter", "--seed", "3", "run", "--bootstrap", BOOTSTRAP])  # a value before `run` stays
    assert (before.seed, before.bootstrap) == (3, BOOTSTRAP)
    redeem = parse(["drafter", "redeem", "--rpc", "http://127.0.0.1:8545", "--key-file", "k"])
    assert redeem.func.__name__ == "_cmd_redeem" and redeem.rpc == "http://127.0.0.1:8545"


def test_every_chain_and_keys_subcommand_has_a_description(capsys):
    top = subcommands(build_parser())
    for group in ("chain", "keys"):
        for name, parser in subcommands(top[group]).items():
            assert parser.description and len(parser.description) > 40, f"{group} {name}"
            assert parser.description.split()[0] in help_of(capsys, group, name), f"{group} {name}"
    assert "--rpc" in help_of(capsys, "chain", "down")


@pytest.mark.parametrize(
    "argv,usage",
    [
        (["chain", "down", "--bogus"], "usage: specmarket chain down"),
        (["drafter", "redeem", "--bootstrap", BOOTSTRAP], "usage: specmarket drafter redeem"),
        (["keys", "new", "--out", "k", "--force"], "usage: specmarket keys new"),
    ],
)
def test_an_unknown_option_is_refused_with_the_subcommands_usage(capsys, argv, usage):
    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and usage in err and "unrecognized arguments" in err, err


def test_target_cheat_help_lists_every_cheat(capsys):
    text = help_of(capsys, "target")
    for cheat in Cheat:
        assert cheat.value in text
        if cheat is not Cheat.NONE:
            assert f"{cheat.value} = {cheat.description}" in text


# ------------------------------------------------------------------------- keys


def test_keys_new_writes_a_private_file_and_prints_only_its_address(tmp_path):
    out = tmp_path / "payout.key"
    made = cli("keys", "new", "--out", str(out))
    assert made.returncode == 0, made.stderr
    key = read_key(out)  # what every --key-file reads
    address = Account.from_key(key).address
    assert made.stdout == f"{address}\n"
    assert key.hex() not in made.stdout + made.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    shown = cli("keys", "address", "--key-file", str(out))
    assert shown.returncode == 0 and shown.stdout == f"{address}\n", shown.stderr
    again = cli("keys", "new", "--out", str(out))
    assert again.returncode == 2 and "never overwritten" in again.stderr and not again.stdout
    assert read_key(out) == key


# ------------------------------------------------------------------------- chain up / down / fund


def test_chain_up_names_both_contracts_and_down_takes_rpc(tmp_path):
    rpc = f"http://127.0.0.1:{free_port()}"
    where = ["--rpc", rpc, "--deployments", str(tmp_path / "dep"), "--state-dir", str(tmp_path / "chain")]
    try:
        up = cli("chain", "up", *where)
        assert up.returncode == 0, up.stderr
        record = json.loads((tmp_path / "dep" / "31337.json").read_text())
        assert f"SpecmarketBond at {record['address']}" in up.stdout
        assert f"DrafterEscrow at {record['escrow']}" in up.stdout
        other = f"http://127.0.0.1:{free_port()}"
        wrong = cli("chain", "down", "--rpc", other, "--state-dir", str(tmp_path / "chain"))
        assert wrong.returncode == 2 and "not stopped" in wrong.stderr, wrong.stderr
        assert chain_id_at(rpc) is not None
    finally:
        down = cli("chain", "down", "--rpc", rpc, "--state-dir", str(tmp_path / "chain"))
    assert down.returncode == 0 and "stopped anvil" in down.stdout, down.stderr
    assert chain_id_at(rpc) is None


def test_chain_fund_refuses_any_chain_but_anvils():
    port = free_port()
    proc = subprocess.Popen(
        [str(tool_path("anvil")), "--port", str(port), "--chain-id", "1", "--silent"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rpc = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while chain_id_at(rpc, timeout=0.5) != 1:
            assert time.monotonic() < deadline and proc.poll() is None, "anvil --chain-id 1 never answered"
            time.sleep(0.1)
        refused = cli("chain", "fund", dev_address(7), "--rpc", rpc)
    finally:
        proc.terminate()
        proc.wait(10)
    assert refused.returncode == 2 and "no local anvil" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------- the payment flow


def test_make_a_key_fund_it_and_redeem_with_an_honest_exit_status(tmp_path):
    """A payout key with no ETH cannot redeem: status 2 and the reason once; funded, it redeems
    (once), and a second redeem has nothing new (status 0)."""
    with deployed_chain(tmp_path / "deployments", escrow=True) as chain:
        key_file = tmp_path / "payout.key"
        payout = cli("keys", "new", "--out", str(key_file)).stdout.strip()
        escrow = EscrowClient(chain.client.w3, chain.deployment.escrow)
        escrow.fund_lane(dev_key(DEV_OPERATOR), payout, LANE, 0, value=ETHER // 10)
        _keep_voucher(tmp_path / "drafter", chain.deployment.escrow, payout)
        row = f"31337:{chain.deployment.escrow}:{dev_address(DEV_OPERATOR)}:{LANE}"  # the wallet's lane key
        redeem = ["drafter", "redeem", "--rpc", chain.rpc, "--key-file", str(key_file)]
        redeem += ["--data-dir", str(tmp_path / "drafter")]

        broke = cli(*redeem)
        assert broke.returncode == 2, broke.stdout + broke.stderr
        assert re.search(r"not redeemed: .*insufficient funds", broke.stdout, re.IGNORECASE), broke.stdout
        assert _mentions(broke, row) == 1  # the row, printed once (not logged as well)
        assert broke.stderr.strip() == "specmarket: error: 1 of 1 voucher(s) not redeemed (the line of each says why)"

        funded = cli("chain", "fund", payout, "--eth", "0.5", "--rpc", chain.rpc)
        assert funded.returncode == 0, funded.stderr
        assert funded.stdout.strip().endswith("its balance: 0.5 ETH"), funded.stdout
        assert chain.client.w3.eth.get_balance(payout) == ETHER // 2

        paid = cli(*redeem)
        assert paid.returncode == 0 and _mentions(paid, row) == 1, paid.stdout + paid.stderr
        assert f"redeemed {format_ether(PRICE_WEI * ACCEPTED)}" in paid.stdout, paid.stdout
        assert escrow.lane(dev_address(DEV_OPERATOR), payout, LANE).paid == PRICE_WEI * ACCEPTED
        again = cli(*redeem)
        assert again.returncode == 0 and "nothing new" in again.stdout and _mentions(again, row) == 1


def _keep_voucher(data_dir, escrow: str, payout: str) -> None:
    """The drafter's wallet keeps a voucher of the dev operator's for ACCEPTED tokens to ``payout``."""
    from node.drafter.terms import Terms

    lane, operator = LANE, dev_address(DEV_OPERATOR)
    voucher = Voucher(operator, payout, lane, PRICE_WEI * ACCEPTED, int(time.time()))
    signed = sign_voucher(dev_key(DEV_OPERATOR), escrow_domain(31337, escrow), voucher)
    terms = Terms(31337, escrow, operator, lane, PRICE_WEI, PRICE_WEI * ACCEPTED)
    assert Wallet.open(data_dir, payout).settle(terms, "job-1", ACCEPTED, signed.dumps()) is not None


def _mentions(done: subprocess.CompletedProcess, text: str) -> int:
    return (done.stdout + done.stderr).count(text)


def test_generate_defaults_to_the_targets_gamma():
    """`generate` decodes as a served job does: one γ for both, written once."""
    from node.model.decoding import GenerateConfig
    from node.target.config import TargetConfig

    assert GenerateConfig("x").gamma == TargetConfig().gamma == 6
