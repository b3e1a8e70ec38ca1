"""What the chain says about a bonded operator, watched while it serves.

An operator signs a receipt only while the chain says it may: it is registered and active (not
unbonding) with the committed model, it has not been slashed since this node started, and the
chain answered recently. Anything else stops signing at once; the node says why in its log and
in /health, and clients get the reason instead of an answer (a receipt nobody could hold it to
would be worthless to them).

The watch also keeps the chain's clock: receipts are stamped with the chain's time (the pending
block's timestamp, what a challenge is checked against), not the node's, and it warns when the
owner has proposed a new referee set (the operator may want to leave before it takes effect).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass

from web3.exceptions import Web3Exception

from node.chain import ChainError
from node.chain.challenges import ChallengeRow, newest, rows_of
from node.chain.client import BondClient
from node.chain.events import EventWindow
from node.runtime.redact import describe
from verifier.errors import Unavailable

log = logging.getLogger(__name__)

STANDING_POLL_S = 5.0  # how often the chain is asked
STANDING_MAX_AGE_S = 3 * STANDING_POLL_S  # an answer older than this counts as no answer
MAX_REASON_CHARS = 200  # a reason is one line of the log and of /health
MAX_SHOWN_CHALLENGES = 20  # the newest challenges against the operator, for /health and the dashboard


class NotServing(ChainError, Unavailable):
    """The operator may not sign now (slashed, unbonding, unregistered, or no chain)."""


@dataclass(frozen=True)
class Standing:
    """One look at the chain. ``reason`` is "" while the operator may sign."""

    reason: str
    checked_at: float  # time.monotonic() of the look
    clock_offset_s: float = 0.0  # chain time - local time
    bond: int = 0
    notice: str = ""  # something the operator should know that does not stop it
    reachable: bool = True  # the chain answered this look (False: the other fields are defaults)
    registered: bool = False
    unbond_at: int = 0  # unix time the bond may leave; 0: not unbonding
    challenges: tuple[ChallengeRow, ...] = ()  # the newest against this operator, newest first

    @property
    def serving(self) -> bool:
        return not self.reason

    @property
    def active(self) -> bool:
        """Registered and not unbonding: the contract lets the operator serve."""
        return self.reachable and self.registered and not self.unbond_at

    def to_json(self) -> dict:
        return {
            "serving": self.serving,
            "reason": self.reason,
            "chain_reachable": self.reachable,
            "bond_wei": self.bond,
            "active": self.active,
            "unbonding": bool(self.unbond_at),
            "unbond_at": self.unbond_at,
            "notice": self.notice,
            "challenges": [asdict(row) for row in self.challenges],
        }


class StandingWatch:
    """Polls the chain for one operator in a daemon thread; ``current()`` is the latest standing."""

    def __init__(self, client: BondClient, address: str, model_hash: bytes, poll_s: float = STANDING_POLL_S) -> None:
        self.client, self.address, self.model_hash, self.poll_s = client, address, model_hash, poll_s
        since = int(client.w3.eth.block_number) + 1  # slashes before this start were seen at bonding
        self._slashes = EventWindow(client, "OperatorSlashed", since, operator=address)
        self._challenges = EventWindow(client, "ChallengeOpened", 0, operator=address)  # all, from the start
        self._resolve_timeout = int(client.call("resolveTimeout"))  # immutable: read once, not every look
        self._standing: Standing | None = None  # None until the first look, just below
        self.check()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> Standing:
        """Ask the chain now (also what the polling thread does)."""
        try:
            standing = self._look()
        except (ChainError, OSError, Web3Exception) as exc:
            reason = f"the chain does not answer ({describe(exc)})"[:MAX_REASON_CHARS]
            standing = Standing(reason, time.monotonic(), reachable=False)
        previous = self._standing
        if previous is None or previous.reason != standing.reason:
            if standing.serving:
                log.info("operator %s may sign receipts", self.address)
            else:
                log.warning("operator %s STOPS signing receipts: %s", self.address, standing.reason)
        if standing.notice and (previous is None or previous.notice != standing.notice):
            log.warning("operator %s: %s", self.address, standing.notice)
        self._standing = standing
        return standing

    def _look(self) -> Standing:
        latest = int(self.client.w3.eth.block_number)
        slashes = self._slashes.scan(latest)  # reorg-safe: a slash in a replaced block is gone, a new one seen
        info = self.client.operator_info(self.address)
        pending_ts = int(self.client.w3.eth.get_block("pending")["timestamp"])
        offset = pending_ts - time.time()
        reason = f"slashed {slashes[-1]['amount']} wei in block {slashes[-1]['block']}" if slashes else ""
        if not info.registered:
            reason = reason or "not registered with the bond contract"
        elif info.unbond_at:
            reason = reason or f"unbonding (the bond can leave at unix time {info.unbond_at})"
        elif info.model_hash != self.model_hash:
            reason = reason or f"bonded for model 0x{info.model_hash.hex()}, not the served one"
        shown = newest(self._challenged(latest), MAX_SHOWN_CHALLENGES)
        challenges = tuple(rows_of(self.client, shown, self._resolve_timeout))
        return Standing(
            reason,
            time.monotonic(),
            offset,
            info.bond,
            self._notice(),
            registered=info.registered,
            unbond_at=info.unbond_at,
            challenges=challenges,
        )

    def _challenged(self, latest: int) -> list[int]:
        """Ids of every challenge against this operator, oldest first (reorg-safe: ``EventWindow``)."""
        return sorted({int(e["id"]) for e in self._challenges.scan(latest)})

    def _notice(self) -> str:
        pending = self.client.pending_referee_set()
        if pending is None:
            return ""
        members, threshold, eta = pending
        return (
            f"the owner proposed a new referee set ({threshold} of {len(members)}) that decides challenges "
            f"opened from unix time {eta}; unbond before then if you do not accept it"
        )

    def current(self) -> Standing:
        """The latest standing; a stale one (the poller is stuck) means no chain."""
        standing = self._standing
        if standing.serving and time.monotonic() - standing.checked_at > STANDING_MAX_AGE_S:
            return Standing(
                f"no answer from the chain for over {STANDING_MAX_AGE_S:.0f} s", standing.checked_at, reachable=False
            )
        return standing

    def require_serving(self) -> Standing:
        standing = self.current()
        if not standing.serving:
            raise NotServing(f"operator {self.address} is not signing receipts: {standing.reason}")
        return standing

    def chain_time(self) -> int:
        """Now on the chain's clock, in unix seconds."""
        return int(time.time() + self.current().clock_offset_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="operator-standing", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 1)
