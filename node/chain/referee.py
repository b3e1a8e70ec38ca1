"""A referee: watch for wrong-token challenges, re-execute the disputed step, sign and submit verdicts.

One referee process may hold several referee keys (the local setup runs anvil's accounts 1-3 in one
process), and several referee processes can cooperate through a shared *verdict pool* directory:
each writes its signature to ``<pool>/<chain>-<contract>/<id>-<tag>/<verdict>/<address>.sig`` (the
tag names the disputed receipt, position and challenger that the verdict signs), and whoever sees a
quorum (the threshold of the challenge's own referee epoch, snapshotted when it opened) submits
``resolve``. Signatures read from the pool are checked before use: the pool is not trusted.

One challenge never stops the others: a receipt that cannot be judged (parameters out of range,
another model, a context that does not fit) is logged once and skipped, a challenge whose resolve
window has closed is skipped (its challenger can refund it), and a revert is logged and the round
goes on. Challenges are handled earliest deadline first. New events are read from a block cursor,
kept with the ids still open in ``<pool>/<chain>-<contract>/cursor-<address>.json``, so a restart
neither rescans the chain from block 0 nor forgets an open challenge. Each scan reads the last
REORG_DEPTH blocks again (node.chain.events): a challenge whose block a reorganisation replaced is
read anew, so its id never stands for a challenge the chain no longer holds.

A chain that stops answering never floods the log: the watch loop waits longer after each failed
round (from its poll interval up to ``BACKOFF_MAX_S``), logs one short line when the chain goes
away, one when the wait grows, a reminder every ``OUTAGE_REMINDER_S``, and one when it is back.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from eth_account import Account
from web3.exceptions import Web3Exception

from node.chain import ChainError
from node.chain.audit import Judgement, TextOf, judge_end, judge_step
from node.chain.client import BondClient, ChainRevert, ChallengeStatus
from node.chain.config import DEFAULT_POLL_S
from node.chain.events import rescan_from
from node.chain.receipts import (
    MICROS,
    Disputed,
    ReceiptError,
    RequestSpec,
    check_canonical,
    sign_verdict,
    verdict_signable,
)
from node.model.adapter import HFCausalLM
from node.runtime.redact import redact, shown_url
from verifier.errors import SpecmarketError
from verifier.params import SamplingParams

log = logging.getLogger(__name__)

MAX_SIG_FILE_BYTES = 256
BACKOFF_FACTOR = 2  # each failed round in a row multiplies the wait before the next one ...
BACKOFF_MAX_S = 30.0  # ... up to this
OUTAGE_REMINDER_S = 600.0  # while the chain stays away at the longest wait, say so this often
REASON_CHARS = 100  # of an error's text in a log line
ERRNO_REASON = re.compile(r"\[Errno -?\d+\][^'\")]*")  # "[Errno 111] Connection refused" inside requests' text


@dataclass(frozen=True)
class Outcome:
    challenge_id: int
    operator_at_fault: bool | None  # None: this referee could not judge it (another model)
    signatures: int  # valid verdict signatures seen for that verdict (own + pool)
    resolved: bool  # this call submitted the resolving transaction
    gas_used: int = 0
    target_positions: int = 0  # what this referee's re-execution of the disputed step scored
    seconds: float = 0.0  # ... and how long it took

    def to_json(self) -> dict:
        return asdict(self)


class VerdictPool:
    """Verdict signatures shared between referee processes through a directory."""

    def __init__(self, root: Path, client: BondClient) -> None:
        self.client = client
        self.dir = root / f"{client.domain.chain_id}-{client.address.lower()}"

    def _path(self, disputed: Disputed, at_fault: bool) -> Path:
        return self.dir / f"{disputed.challenge_id}-{disputed.tag()}" / ("fault" if at_fault else "cleared")

    def put(self, disputed: Disputed, at_fault: bool, signer: str, signature: bytes) -> None:
        folder = self._path(disputed, at_fault)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{signer}.tmp"
        tmp.write_text(signature.hex())
        tmp.replace(folder / f"{signer}.sig")  # atomic: readers never see half a signature

    def collect(self, disputed: Disputed, at_fault: bool, referees: set[str]) -> dict[str, bytes]:
        """Valid signatures of ``referees`` (the challenge's epoch) for this verdict, keyed by signer."""
        found: dict[str, bytes] = {}
        signable = verdict_signable(self.client.domain, disputed, at_fault)
        folder = self._path(disputed, at_fault)
        for path in sorted(folder.glob("*.sig")) if folder.is_dir() else []:
            try:
                if path.stat().st_size > MAX_SIG_FILE_BYTES:
                    raise ValueError("oversized")
                signature = bytes.fromhex(path.read_text().strip())
                check_canonical(signature)  # a high-s twin would pass here and revert on chain
                signer = Account.recover_message(signable, signature=signature)
            except (OSError, ValueError, TypeError, ReceiptError) as exc:
                log.warning("ignoring unreadable verdict signature %s: %s", path, exc)
                continue
            if signer in referees and path.stem == signer:
                found[signer] = signature
            else:
                log.warning("ignoring %s: signed by %s, not a referee of that name in its epoch", path, signer)
        return found


class Cursor:
    """The next block to scan and the open challenges seen so far (id -> block), kept in a file."""

    def __init__(self, path: Path) -> None:
        self.path, self.next_block, self.pending = path, 0, {}
        try:
            state = json.loads(path.read_text())
            self.next_block = int(state["next_block"])
            self.pending = {int(cid): int(block) for cid, block in state["pending"].items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable referee cursor %s (%s): scanning from block 0", path, exc)

    def save(self, next_block: int, pending: dict[int, int]) -> None:
        self.next_block, self.pending = next_block, dict(pending)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"next_block": next_block, "pending": pending}))
        tmp.replace(self.path)  # atomic: a crash leaves the old cursor or the new one


class Referee:
    """Judges the open challenges of one deployment with the target model it was given."""

    def __init__(
        self,
        client: BondClient,
        keys: list[bytes],
        model: HFCausalLM,
        model_hash: bytes,
        pool: Path,
        text: TextOf | None = None,  # the tokenizer's text: end challenges whose rule has stop sequences need it
    ):
        if not keys:
            raise ChainError("a referee needs at least one referee key")
        self.client = client
        self.text = text
        self._keys = {Account.from_key(k).address: k for k in keys}  # address -> key; keys never logged
        self.model = model
        self.model_hash = model_hash
        self.pool = VerdictPool(pool, client)
        self.cursor = Cursor(self.pool.dir / f"cursor-{min(self._keys).lower()}.json")
        self._pending: dict[int, dict] = {}  # open challenge id -> its ChallengeOpened event
        self._epochs: dict[int, int] = {}  # open challenge id -> the referee epoch it snapshotted
        # our verdicts on the open challenges (None: cannot judge); closed ones leave with them, so
        # however many challenges a flood opens over time, this holds the open ones alone
        self._verdicts: dict[Disputed, Judgement | None] = {}
        self._resolve_timeout = int(client.call("resolveTimeout"))  # immutable

    def _scan(self, latest: int) -> None:
        """Add the ChallengeOpened events up to ``latest``, reorg-safe (node.chain.events): the
        REORG_DEPTH blocks before the cursor are read again, and a pending challenge whose block
        was replaced is dropped for what the new blocks hold (its id may now name another one)."""
        if not self._pending and self.cursor.pending:  # after a restart: fetch what was still open
            for cid, block in self.cursor.pending.items():
                for event in self.client.events("ChallengeOpened", from_block=block, to_block=latest, id=cid):
                    self._pending[int(event["id"])] = event
        start = rescan_from(self.cursor.next_block, latest)
        fresh = {int(e["id"]): e for e in self.client.events("ChallengeOpened", from_block=start, to_block=latest)}
        for cid, event in list(self._pending.items()):
            if int(event["block"]) >= start and fresh.get(cid, {}).get("block_hash") != event.get("block_hash"):
                log.info("challenge %d: its block was replaced (a reorganisation); reading it anew", cid)
                del self._pending[cid]
        self._pending.update(fresh)  # closed ones among them leave again in open_challenges

    def open_challenges(self) -> list[dict]:
        """Open challenges whose resolve window is still open, earliest deadline first."""
        latest = self.client.w3.eth.block_number
        self._scan(latest)
        now = self.client.w3.eth.get_block(latest)["timestamp"]
        live = []
        for cid, event in list(self._pending.items()):
            record = self.client.challenge_record(cid)
            self._epochs[cid] = int(record["referee_epoch"])
            deadline = int(record["created_at"]) + self._resolve_timeout
            if ChallengeStatus(record["status"]) is not ChallengeStatus.OPEN:
                del self._pending[cid]
            elif now > deadline:
                log.info("challenge %d: its resolve window closed at %d, skipping it (refundable)", cid, deadline)
                del self._pending[cid]
            else:
                live.append((deadline, cid, event))
        self.cursor.save(latest + 1, {cid: int(event["block"]) for cid, event in self._pending.items()})
        open_now = {Disputed.from_event(event) for event in self._pending.values()}
        self._verdicts = {key: verdict for key, verdict in self._verdicts.items() if key in open_now}
        return [event for _, _, event in sorted(live, key=lambda item: item[:2])]

    def _judge(self, event: dict) -> Judgement | None:
        key = Disputed.from_event(event)
        if key not in self._verdicts:
            self._verdicts[key] = self._judge_now(event)
        return self._verdicts[key]

    def _judge_now(self, event: dict) -> Judgement | None:
        cid = int(event["id"])
        if bytes(event["modelHash"]) != self.model_hash:
            log.warning("challenge %d is about model 0x%s, not ours: not judging it", cid, event["modelHash"].hex())
            return None
        p = event["params"]
        try:
            if int(event["position"]) == len(event["output"]):  # an end challenge: the answer stopped early
                return self._judge_end(event)
            params = SamplingParams(p["temperatureMicros"] / MICROS, p["topK"], p["topPMicros"] / MICROS)
            return judge_step(self.model, event["prompt"], event["output"], event["position"], params, p["seed"])
        except SpecmarketError as exc:  # out-of-range parameters, a context that does not fit
            log.warning("challenge %d cannot be judged (%s): skipping it", cid, exc)
            return None

    def _judge_end(self, event: dict) -> Judgement | None:
        """An end challenge: the stop rule it named (its EndChallenged event), judged by that rule."""
        cid, p = int(event["id"]), event["params"]
        rule = self.client.end_rule(cid, int(event["block"]))
        if rule is None:
            log.warning("challenge %d is at the answer's end but names no stop rule: not judging it", cid)
            return None
        if rule[1] and self.text is None:
            log.warning("challenge %d names stop sequences and this referee has no tokenizer: not judging it", cid)
            return None
        fields = (p["seed"], p["temperatureMicros"], p["topK"], p["topPMicros"], p["maxTokens"])
        request = RequestSpec(tuple(event["prompt"]), *fields, *rule)
        if request.stop_hash() != bytes(p["stopHash"]):  # the contract checked it; a reorg could not change it
            log.warning("challenge %d: its stop rule does not hash to the request's stopHash: not judging it", cid)
            return None
        return judge_end(self.model, request, event["output"], self.text)

    def handle(self, event: dict) -> Outcome:
        """Judge one open challenge, add our signatures to the pool, resolve when a quorum exists."""
        cid, disputed = int(event["id"]), Disputed.from_event(event)
        judgement = self._judge(event)
        if judgement is None:
            return Outcome(cid, None, 0, False)
        at_fault = judgement.at_fault
        cost = {"target_positions": judgement.target_positions, "seconds": round(judgement.seconds, 4)}
        epoch = self._epochs.get(cid) or int(self.client.challenge_record(cid)["referee_epoch"])
        referees = set(self.client.referees_at(epoch))  # the set the challenge snapshotted, not today's
        for address, key in self._keys.items():
            if address in referees:
                self.pool.put(disputed, at_fault, address, sign_verdict(key, self.client.domain, disputed, at_fault))
        sigs = self.pool.collect(disputed, at_fault, referees)
        if len(sigs) < self.client.threshold_at(epoch):
            log.info("challenge %d: %d verdict signature(s) so far, waiting for a quorum", cid, len(sigs))
            return Outcome(cid, at_fault, len(sigs), False, **cost)
        try:
            tx = self.client.resolve(next(iter(self._keys.values())), cid, at_fault, sigs)
        except ChainError as exc:
            if not self._resolved_elsewhere(cid, exc):
                raise
            log.info("challenge %d was resolved by someone else", cid)
            return Outcome(cid, at_fault, len(sigs), False, **cost)
        log.info("challenge %d resolved: operator %s (gas %d)", cid, "at fault" if at_fault else "cleared", tx.gas_used)
        return Outcome(cid, at_fault, len(sigs), True, tx.gas_used, **cost)

    def _resolved_elsewhere(self, cid: int, exc: ChainError) -> bool:
        """Whether our resolve failed because another referee's resolve came first: refused at the
        gas estimate (``ChallengeNotOpen``), or, when both estimates ran while the challenge was
        still open, mined after the other one and reverted on chain (two referee processes
        reaching the quorum together)."""
        if isinstance(exc, ChainRevert):
            return exc.name == "ChallengeNotOpen"
        return ChallengeStatus(self.client.challenge_record(cid)["status"]) is not ChallengeStatus.OPEN

    def run_once(self) -> list[Outcome]:
        outcomes = []
        for event in self.open_challenges():
            try:
                outcomes.append(self.handle(event))
            except ChainError as exc:  # a revert on one challenge never stops the others
                log.warning("challenge %d: %s; going on with the others", int(event["id"]), exc)
        return outcomes

    def watch(self, stop: threading.Event, poll_s: float = DEFAULT_POLL_S, on_outcome=None) -> None:
        """Handle challenges as they open until ``stop`` is set; ``on_outcome`` hears of each change.
        A failed round (the chain went away: requests' errors are OSErrors; or a transaction
        failed) is retried after a wait that grows while the failures go on (``Outage``)."""
        seen: set[tuple] = set()
        outage = Outage(poll_s)
        while not stop.is_set():
            try:
                outcomes = self.run_once()
            except (ChainError, OSError, Web3Exception) as exc:
                stop.wait(outage.failed(_rpc(self.client), exc))
                continue
            outage.recovered(_rpc(self.client))
            for outcome in outcomes:
                if on_outcome is not None and outcome not in seen:
                    on_outcome(outcome)
                seen.add(outcome)
            stop.wait(poll_s)


def backoff_delay(poll_s: float, failures: int) -> float:
    """The wait after ``failures`` failed rounds in a row: the poll interval, doubled per further
    failure, at most ``BACKOFF_MAX_S`` (never less than the poll interval)."""
    steps = min(max(failures - 1, 0), 32)  # bounded: a float overflows after ~1000 doublings
    return max(poll_s, min(BACKOFF_MAX_S, poll_s * BACKOFF_FACTOR**steps))


class Outage:
    """Failed rounds in a row of one watch loop: how long to wait, and the few lines to log."""

    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self.failures = 0
        self.since = 0.0  # monotonic time of the first failure
        self.last_log = 0.0

    def failed(self, rpc: str, exc: BaseException) -> float:
        """Count a failed round; log it when the chain just went away, the wait grew, or a reminder
        is due. The wait before the next round."""
        self.failures += 1
        now, delay = time.monotonic(), backoff_delay(self.poll_s, self.failures)
        if self.failures == 1:
            self.since = self.last_log = now
            what = "unreachable" if isinstance(exc, OSError) else "answered with an error"
            log.warning("referee round failed: chain at %s %s (%s); retrying in %g s", rpc, what, _reason(exc), delay)
            return delay
        grew = delay != backoff_delay(self.poll_s, self.failures - 1)
        if grew or now - self.last_log >= OUTAGE_REMINDER_S:
            self.last_log = now
            failing = f"{self.failures} rounds in {now - self.since:.0f} s"
            log.warning("chain at %s still failing (%s); retrying in %g s", rpc, failing, delay)
        return delay

    def recovered(self, rpc: str) -> None:
        if self.failures:
            down = time.monotonic() - self.since
            log.warning("chain at %s reachable again after %d failed round(s) in %.0f s", rpc, self.failures, down)
        self.failures = 0


def _rpc(client: BondClient) -> str:
    return shown_url(str(getattr(client.w3.provider, "endpoint_uri", None) or "?"))


def _reason(exc: BaseException) -> str:
    """``ExcType: reason``, short: the errno phrase buried in requests' text where there is one."""
    text = " ".join(redact(str(exc)).split())  # one line
    found = ERRNO_REASON.search(text)
    reason = found.group(0).strip() if found else text[:REASON_CHARS]
    return f"{type(exc).__name__}: {reason}"
