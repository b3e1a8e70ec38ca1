"""A drafter's cover checks as trio tasks: one job at a time at risk per operator.

``node.drafter.cover`` says what is checked; this module says when, and what a failure means:
- A job's check runs beside its first drafts (a new lane is funded only when the target reads the
  drafter's payout, and a short job would be over before a check that waited for it), in the
  drafter's own nursery: a job that ends first does not cancel it, so every check concludes.
- A failed check (the escrow is not ours, or the lane is still short after COVER_WAIT_S) is a
  verdict on the operator in the wallet: its sessions are refused until the verdict lapses
  (``VERDICT_TTL_S``), and the next job is judged again. A chain endpoint of the drafter's own that
  does not answer is no verdict: only that job is refused.
- A job that opens while a check of the same operator is still in flight drafts only once its own
  check has passed, so the jobs at risk at once are one.

So an operator that never funds its lanes gets one job drafted unpaid per verdict period, whatever
the jobs' length or number: exposure stays at one job's pay (issue 40 §2).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

import trio

from node.chain.codehash import NotOurEscrow
from node.drafter.cover import COVER_WAIT_S, CoverChecks, LaneUnreadable
from node.drafter.terms import Terms
from node.drafter.wallet import Wallet

log = logging.getLogger(__name__)

CHAIN_SLACK_S = 5.0  # on top of COVER_WAIT_S: the last read's own time


@dataclass
class CoverCheck:
    """One job's check: ``why`` is "" when the lane covers the job, once ``done`` is set."""

    done: trio.Event = field(default_factory=trio.Event)
    why: str = ""


class CoverWatch:
    """The checks of one drafter (``checks``: its --rpc endpoint) and their verdicts (``wallet``)."""

    def __init__(self, checks: CoverChecks, wallet: Wallet) -> None:
        self.checks, self.wallet = checks, wallet
        self.in_flight: dict[str, CoverCheck] = {}  # operator account -> its newest check not yet concluded

    def start(self, nursery: trio.Nursery, terms: Terms, payout: str) -> tuple[CoverCheck, bool]:
        """Start a job's check in ``nursery`` (one that outlives the job); and whether it must pass
        before the job drafts (another check of the same operator was still in flight)."""
        wait_first = terms.account in self.in_flight
        check = self.in_flight[terms.account] = CoverCheck()
        nursery.start_soon(self._run, check, terms, payout)
        return check, wait_first

    async def _run(self, check: CoverCheck, terms: Terms, payout: str) -> None:
        try:
            check.why, verdict = await self._judge(terms, payout)
            if verdict or not check.why:  # a pass clears a lapsed verdict; a failure is one
                self.wallet.mark_cover(terms.account, check.why)
        finally:
            if self.in_flight.get(terms.account) is check:
                del self.in_flight[terms.account]
            check.done.set()

    async def _judge(self, terms: Terms, payout: str) -> tuple[str, bool]:
        """(why the job is not covered, "" if it is; whether that is a verdict on the operator)."""
        call = partial(self.checks.wait_for_cover, terms, payout, self.wallet.lane_voucher(terms))
        try:
            with trio.fail_after(COVER_WAIT_S + CHAIN_SLACK_S):
                why = await trio.to_thread.run_sync(call, abandon_on_cancel=True)
        except NotOurEscrow as exc:
            return str(exc), True
        except LaneUnreadable as exc:
            return str(exc), False
        except trio.TooSlowError:
            return f"the chain did not answer within {COVER_WAIT_S + CHAIN_SLACK_S:.0f} s", False
        return why, bool(why)
