"""`specmarket escrow ...`: an operator takes its money back by hand, on a real anvil, through the CLI
as a user runs it. The pool leaves at once; a lane's funds only after the thawing period, and a
voucher the drafter redeems before then is paid first (the drafter's promise, DrafterEscrow's rule)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from chainutil import deployed_chain, warp
from eth_account import Account

from node.chain.contract import transfer
from node.chain.deployment import DEFAULT_THAWING_PERIOD_S, DEV_DEPLOYER, ETHER, dev_key
from node.chain.escrow import EscrowClient
from node.chain.vouchers import Voucher, sign_voucher

TIMEOUT_S = 120
LANE = 12345
MILLI = ETHER // 1000


@pytest.fixture(scope="module")
def escrow_chain(tmp_path_factory):
    with deployed_chain(tmp_path_factory.mktemp("escrow-cli"), escrow=True) as chain:
        yield chain, EscrowClient(chain.client.w3, chain.deployment.escrow)


def cli(chain, *argv: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "node", "escrow", argv[0], *chain.cli_args(), *argv[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)


def account(chain, tmp_path, name: str) -> tuple[bytes, str, str]:
    """A fresh key with 1 ETH from anvil's account 0: (key, address, key file)."""
    key = bytes(Account.create().key)
    address = Account.from_key(key).address
    transfer(chain.client.w3, dev_key(DEV_DEPLOYER), address, ETHER)
    path = tmp_path / f"{name}.key"
    path.write_text(key.hex())
    return key, address, str(path)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_an_operator_takes_its_pool_at_once_and_a_lane_only_after_the_thaw_succeeds(escrow_chain, tmp_path):
    chain, escrow = escrow_chain
    operator_key, operator, key_file = account(chain, tmp_path, "operator")
    drafter_key, drafter, _ = account(chain, tmp_path, "drafter")
    ok(cli(chain, "deposit", "--key-file", key_file, "--eth", "0.03"))
    ok(cli(chain, "fund-lane", drafter, "--lane", str(LANE), "--eth", "0.02", "--key-file", key_file))
    assert (escrow.pool(operator), escrow.lane(operator, drafter, LANE).balance) == (10 * MILLI, 20 * MILLI)

    status = json.loads(ok(cli(chain, "status", "--operator", operator, "--json")))
    assert status["pool"] == 10 * MILLI and status["thawing_period"] == DEFAULT_THAWING_PERIOD_S
    assert [(r["drafter"], r["lane"], r["balance"]) for r in status["lanes"]] == [(drafter, LANE, 20 * MILLI)]

    ok(cli(chain, "request-thaw", drafter, "--lane", str(LANE), "--all", "--key-file", key_file))
    early = cli(chain, "thaw", drafter, "--lane", str(LANE), "--key-file", key_file)
    assert early.returncode == 2 and "ThawNotReady" in early.stderr, early.stderr
    assert "ready in" in ok(cli(chain, "status", "--key-file", key_file))

    # the drafter redeems a voucher while the thaw runs: it is paid first, from the lane
    signed = sign_voucher(operator_key, escrow.domain, Voucher(operator, drafter, LANE, 5 * MILLI, 1))
    assert escrow.redeem(drafter_key, signed).amount == 5 * MILLI

    warp(chain, DEFAULT_THAWING_PERIOD_S + 1)
    ok(cli(chain, "thaw", drafter, "--lane", str(LANE), "--key-file", key_file))
    lane = escrow.lane(operator, drafter, LANE)
    assert (lane.balance, lane.paid, lane.thawing) == (0, 5 * MILLI, 0)
    assert escrow.pool(operator) == 10 * MILLI + 15 * MILLI  # what the redemption left came back

    before = chain.client.w3.eth.get_balance(operator)
    ok(cli(chain, "withdraw", "--all", "--key-file", key_file))
    assert escrow.pool(operator) == 0
    assert 25 * MILLI - MILLI < chain.client.w3.eth.get_balance(operator) - before <= 25 * MILLI  # less gas


def test_a_thaw_can_be_cancelled_and_the_lane_stays_whole_succeeds(escrow_chain, tmp_path):
    chain, escrow = escrow_chain
    _, operator, key_file = account(chain, tmp_path, "operator")
    _, drafter, _ = account(chain, tmp_path, "drafter")
    ok(cli(chain, "fund-lane", drafter, "--lane", "0", "--send-eth", "0.01", "--key-file", key_file))
    ok(cli(chain, "request-thaw", drafter, "--lane", "0", "--eth", "0.004", "--key-file", key_file))
    assert escrow.lane(operator, drafter, 0).thawing == 4 * MILLI
    ok(cli(chain, "cancel-thaw", drafter, "--lane", "0", "--key-file", key_file))
    warp(chain, DEFAULT_THAWING_PERIOD_S + 1)
    late = cli(chain, "thaw", drafter, "--lane", "0", "--key-file", key_file)
    assert late.returncode == 2 and "NoPendingThaw" in late.stderr, late.stderr  # the lane keeps its 0.01
    assert escrow.lane(operator, drafter, 0).balance == 10 * MILLI


def test_bad_input_is_refused_with_one_clear_line_succeeds(escrow_chain, tmp_path):
    chain, _ = escrow_chain
    _, _, key_file = account(chain, tmp_path, "operator")
    drafter = Account.create().address
    cases = {
        ("fund-lane", drafter, "--lane", "-1", "--eth", "0.01", "--key-file", key_file): "lane id",
        ("deposit", "--eth", "lots", "--key-file", key_file): "not an amount of ETH",
        ("withdraw", "--eth", "5", "--key-file", key_file): "AmountExceedsPool",
        ("fund-lane", drafter, "--lane", "1", "--key-file", key_file): "nothing to move",
        ("status",): "name the operator",
        ("deposit", "--eth", "1", "--key-file", str(tmp_path / "missing.key")): "cannot read a private key",
    }
    for argv, expected in cases.items():
        result = cli(chain, *argv)
        assert result.returncode == 2 and expected in result.stderr, (argv, result.stderr)
        assert "Traceback" not in result.stderr
