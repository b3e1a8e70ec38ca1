"""Before a paid job, with ``--rpc``: is the escrow real, and does this drafter's lane cover it?

A paying ``open`` names the escrow, the operator and the lane it pays from (node.drafter.terms). A
drafter that checks the chain (``--rpc``) drafts only when
- the escrow's runtime code is the DrafterEscrow built from this repository (node.chain.codehash),
  on the chain the open names, and
- its lane holds, less any pending thaw, what its newest voucher on that lane leaves unredeemed plus
  this job's largest pay (``max_pay_wei``).
The lane's funds can leave only by this drafter's redemptions, or by a thaw that runs a whole
thawing period (more than the redeem window, in which the drafter redeems), so the most a drafter
that checks can lose to its operator is one job's pay. The target funds the lane when the drafter
names its payout address, so the first check of a new lane may have to wait for that transaction:
``wait_for_cover`` polls for up to COVER_WAIT_S.
"""

from __future__ import annotations

import logging
import time

from node.chain import ChainError
from node.chain.codehash import NotOurEscrow, check_escrow_code
from node.chain.contract import connect
from node.chain.deployment import format_ether
from node.chain.escrow import EscrowClient
from node.chain.vouchers import SignedVoucher
from node.drafter.terms import Terms

log = logging.getLogger(__name__)

COVER_WAIT_S = 5.0  # how long a drafter waits for its lane to be funded before it refuses the job
COVER_POLL_S = 0.25


class LaneUnreadable(ChainError):
    """The drafter's own chain endpoint did not tell what the lane holds: no verdict on the operator."""


class CoverChecks:
    """A drafter's chain checks (blocking: call from a worker thread). The code check is cached per
    escrow address, its verdict either way."""

    def __init__(self, rpc: str) -> None:
        self.rpc = rpc
        self._w3 = None
        self._verdicts: dict[str, str] = {}  # escrow -> "" (ours) or why not

    def escrow(self, terms: Terms) -> EscrowClient:
        """The open's escrow; NotOurEscrow when it is not the real one (or on another chain)."""
        if self._w3 is None:
            self._w3 = connect(self.rpc)
        chain_id = self._w3.eth.chain_id
        if chain_id != terms.chain_id:
            raise NotOurEscrow(f"the open names chain {terms.chain_id}, {self.rpc} is chain {chain_id}")
        if terms.escrow not in self._verdicts:
            try:
                check_escrow_code(self._w3, terms.escrow)
                self._verdicts[terms.escrow] = ""
            except NotOurEscrow as exc:
                self._verdicts[terms.escrow] = str(exc)
        if why := self._verdicts[terms.escrow]:
            raise NotOurEscrow(why)
        return EscrowClient(self._w3, terms.escrow)

    def shortfall(self, terms: Terms, payout: str, kept: SignedVoucher | None) -> str:
        """Why the lane does not cover this job ("" when it does); NotOurEscrow for a fake escrow."""
        lane = self.escrow(terms).lane(terms.operator, payout, terms.lane)
        unredeemed = max(0, kept.voucher.cumulative_wei - lane.paid) if kept is not None else 0
        needed = unredeemed + terms.max_pay_wei
        if lane.available() >= needed:
            return ""
        return (
            f"lane {terms.lane} of operator {terms.operator} holds {format_ether(lane.available())} "
            f"(after a pending thaw), short of {format_ether(needed)}: {format_ether(unredeemed)} unredeemed "
            f"plus this job's largest pay, {format_ether(terms.max_pay_wei)}"
        )

    def wait_for_cover(self, terms: Terms, payout: str, kept: SignedVoucher | None) -> str:
        """``shortfall``, polled until it is "" or COVER_WAIT_S has passed (the target funds a new lane
        when the drafter names its payout); LaneUnreadable when the last read failed."""
        ends = time.monotonic() + COVER_WAIT_S
        while True:
            unreadable = False
            try:
                why = self.shortfall(terms, payout, kept)
            except NotOurEscrow:
                raise
            except (ChainError, OSError) as exc:
                why, unreadable = f"cannot read the lane: {exc}", True
            if not why:
                return ""
            if time.monotonic() >= ends:
                if unreadable:
                    raise LaneUnreadable(why)
                return why
            time.sleep(COVER_POLL_S)
