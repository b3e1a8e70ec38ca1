"""A client that drafts for its own job (``/specmarket/generate/1.2.0``, a request with ``draft``).

The client's drafts come on its generate stream, between the chunks it receives, and the job's
``MarketProposer`` takes them like a drafter peer's: the same ``open`` / ``advance`` out, the same
``draft`` frames in, the same checks (``usable``, the flooding bound), the same deadline, early drafts
and, with trees, the same merge with the market's drafters. Three things differ:

- **Never paid.** Its ``open`` offers nothing (``UNPAID``), it cannot name a payout (its stream admits
  drafts only: ``TO_SERVER_DRAFTING``), and the market never credits it in the ledger.
- **Never in the market.** Its records go to a registry of the job's own (``JobRegistry``), made with
  the job and dropped with it: it is ranked against the job's drafters by the same score, and may be
  dropped from its own job (missed deadlines, a bench by the policy), but is never benched, ranked
  or remembered for any other job, and holds no slot of the market's.
- **Trusted, not on probation.** Only its own job is at stake: a lying or silent client costs its own
  answer time (at most a deadline a round, and two misses drop it), and under GUMBEL the output is
  the target's whatever the client sends.
"""

from __future__ import annotations

from market.registry import DrafterStats, Registry
from node.target.sessions import RemoteSession
from p2p.framing import FrameStream
from p2p.messages import TO_SERVER_DRAFTING

# the client's session id in its job: never a peer id, whose base58 alphabet has no "l"
CLIENT_SESSION = "client"


def client_session(fs: FrameStream, gamma: int) -> RemoteSession:
    """The job's session with its client, on the client's generate stream: from now on the stream
    admits drafts of at most ``gamma`` tokens (and an error frame: the client stops drafting)."""
    fs.allowed, fs.max_gamma = TO_SERVER_DRAFTING, gamma
    return RemoteSession(CLIENT_SESSION, fs)


class JobRegistry:
    """What a job's proposer records in when its client drafts: the client's records go to the
    job's own registry, every drafter peer's to the market's (the methods ``MarketProposer`` and
    ``Policy`` call, routed by peer id)."""

    def __init__(self, market: Registry) -> None:
        self.market = market
        self.own = Registry()
        self.own.upsert(CLIENT_SESSION, [])

    def _of(self, peer_id: str) -> Registry:
        return self.own if peer_id == CLIENT_SESSION else self.market

    def stats(self, peer_id: str) -> DrafterStats:
        return self._of(peer_id).stats(peer_id)

    def record_draft(self, peer_id: str, proposed: int, matched: int, latency_s: float | None, **kw) -> None:
        self._of(peer_id).record_draft(peer_id, proposed, matched, latency_s, **kw)

    def record_accepted(self, peer_id: str, accepted: int) -> None:
        self._of(peer_id).record_accepted(peer_id, accepted)

    def record_timeout(self, peer_id: str) -> None:
        self._of(peer_id).record_timeout(peer_id)

    def record_late(self, peer_id: str) -> None:
        self._of(peer_id).record_late(peer_id)

    def record_error(self, peer_id: str, reason: str) -> None:
        self._of(peer_id).record_error(peer_id, reason)

    def record_refusal(self, peer_id: str, reason: str) -> None:
        self._of(peer_id).record_refusal(peer_id, reason)
