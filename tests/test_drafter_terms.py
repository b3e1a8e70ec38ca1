"""A drafter's terms (issue 40 §1): it drafts only for the target it registered with (the stranger's
side: tests/test_bounded_load.py), and never below its --min-price, which a drafter with a payout
address sets above 0 by default: an ``open`` that offers less is refused before any work."""

from __future__ import annotations

import pytest

from node.drafter.config import DrafterConfig
from p2p.framing import FrameStream
from p2p.host import parse_peer_addr, peer_addrs
from p2p.messages import DRAFT_PROTOCOL_ID, TO_TARGET, Draft, Error, Open
from tests.netutil import InProcessDrafter
from verifier.errors import InvalidParams

PAYOUT = "0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB"  # 0xabab...ab, checksummed as the wallet keeps it
READ_TIMEOUT_S = 30.0


ESCROW, OPERATOR = "0x" + "e5" * 20, "0x" + "0b" * 20  # a paying open names them (no --rpc here: not checked)


def _open(price_wei: int) -> Open:
    terms = {"chain_id": 31337, "escrow": ESCROW, "operator": OPERATOR, "lane": 1, "max_pay_wei": 64 * price_wei}
    return Open(
        f"job-{price_wei}", (0, 5, 9), 1.0, 0, 1.0, 3, 4, 0, price_wei=price_wei, **(terms if price_wei else {})
    )


def ask(portal, point, drafter: InProcessDrafter, price_wei: int) -> object:
    """``point`` (the drafter's own target) opens a session at ``price_wei``: the drafter's first frame."""
    info = parse_peer_addr(drafter.addrs[0])

    async def go() -> object:
        await point.connect(info)
        stream = await point.new_stream(info.peer_id, [DRAFT_PROTOCOL_ID])
        fs = FrameStream(stream, vocab_size=drafter.node.model.vocab_size, allowed=TO_TARGET | {"payout"})
        await fs.send(_open(price_wei), 5.0)
        first = await fs.receive(READ_TIMEOUT_S)
        await fs.close()
        return first

    return portal.run(go)


@pytest.fixture(scope="module")
def paid_drafter(portal, point, tmp_path_factory):
    """A drafter with a payout address and the default --min-price, registered with ``point``."""
    drafter = InProcessDrafter(portal, tmp_path_factory.mktemp("paid"), peer_addrs(point)[0], "honest", payout=PAYOUT)
    yield drafter
    drafter.stop()


def test_a_drafter_with_a_payout_address_refuses_a_free_session_before_any_work(portal, point, paid_drafter):
    """The attack: its own target opens at price 0 (old: drafted for free, no account kept)."""
    answer = ask(portal, point, paid_drafter, 0)
    assert isinstance(answer, Error), answer
    assert "below this drafter's minimum 1 wei" in answer.message
    assert paid_drafter.node.wallet.accounts == {}  # nothing recorded: refused before the session began
    assert paid_drafter.node.sessions == 0


def test_a_paying_session_is_served_and_names_the_payout_first(portal, point, paid_drafter):
    answer = ask(portal, point, paid_drafter, 7)
    assert getattr(answer, "address", None) == PAYOUT  # the payout message comes before any draft


def test_a_min_price_refuses_a_cheaper_open_and_serves_one_at_the_price(portal, point, tmp_path):
    drafter = InProcessDrafter(portal, tmp_path, peer_addrs(point)[0], "honest", payout=PAYOUT, min_price=10)
    try:
        cheap = ask(portal, point, drafter, 9)
        assert isinstance(cheap, Error) and "price 9 wei per accepted token is below" in cheap.message
        assert getattr(ask(portal, point, drafter, 10), "address", None) == PAYOUT
    finally:
        drafter.stop()


def test_an_unpaid_drafter_drafts_for_free(portal, point, tmp_path):
    drafter = InProcessDrafter(portal, tmp_path, peer_addrs(point)[0], "honest")
    try:
        answer = ask(portal, point, drafter, 0)
        assert isinstance(answer, Draft) and 1 <= len(answer.tokens) <= 4
    finally:
        drafter.stop()


@pytest.mark.parametrize(
    ("payout", "min_price", "expected"), [(None, None, 0), (PAYOUT, None, 1), (PAYOUT, 0, 0), (None, 5, 5)]
)
def test_the_min_price_default_follows_the_payout_address(payout, min_price, expected):
    cfg = DrafterConfig(bootstrap=f"/ip4/127.0.0.1/tcp/1/p2p/{PEER}", payout=payout, min_price=min_price)
    assert cfg.min_price_wei == expected


def test_a_negative_min_price_is_refused():
    with pytest.raises(InvalidParams, match="--min-price must be a number of wei >= 0"):
        DrafterConfig(bootstrap=f"/ip4/127.0.0.1/tcp/1/p2p/{PEER}", min_price=-1)


PEER = "12D3KooWGJVjGmUQhTYBsxQ1nqRhUBbrxcpRfFd6mjhCJ6VUW4dE"
