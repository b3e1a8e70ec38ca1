"""A referee: watch for wrong-token challenges, re-execute the disputed step, sign and submit verdicts.

One referee process may hold several referee keys (the local setup runs anvil's accounts 1-3 in one
process), and several referee processes can cooperate through a shared *verdict pool* directory:
each writes its signature to ``<pool>/<chain>-<contract>/<id>/<verdict>/<address>.sig``, and
whoever sees a quorum (``threshold`` valid signatures of current referees for one verdict) submits
``resolve``. Signatures read from the pool are checked before use: the pool is not trusted.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from eth_account import Account
from web3.exceptions import Web3Exception

from node.chain import ChainError
from node.chain.audit import Judgement, judge_step
from node.chain.client import BondClient, ChainRevert, ChallengeStatus
from node.chain.config import DEFAULT_POLL_S
from node.chain.receipts import MICROS, sign_verdict, verdict_signable
from node.models import HFCausalLM
from verifier.params import SamplingParams

log = logging.getLogger(__name__)

MAX_SIG_FILE_BYTES = 256


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

    def _path(self, challenge_id: int, at_fault: bool) -> Path:
        return self.dir / str(challenge_id) / ("fault" if at_fault else "cleared")

    def put(self, challenge_id: int, at_fault: bool, signer: str, signature: bytes) -> None:
        folder = self._path(challenge_id, at_fault)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{signer}.tmp"
        tmp.write_text(signature.hex())
        tmp.replace(folder / f"{signer}.sig")  # atomic: readers never see half a signature

    def collect(self, challenge_id: int, at_fault: bool, referees: set[str]) -> dict[str, bytes]:
        """Valid signatures of current referees for this verdict, keyed by signer."""
        found: dict[str, bytes] = {}
        signable = verdict_signable(self.client.domain, challenge_id, at_fault)
        folder = self._path(challenge_id, at_fault)
        for path in sorted(folder.glob("*.sig")) if folder.is_dir() else []:
            try:
                if path.stat().st_size > MAX_SIG_FILE_BYTES:
                    raise ValueError("oversized")
                signature = bytes.fromhex(path.read_text().strip())
                signer = Account.recover_message(signable, signature=signature)
            except (OSError, ValueError, TypeError) as exc:
                log.warning("ignoring unreadable verdict signature %s: %s", path, exc)
                continue
            if signer in referees and path.stem == signer:
                found[signer] = signature
            else:
                log.warning("ignoring %s: signed by %s, not a current referee of that name", path, signer)
        return found


class Referee:
    """Judges the open challenges of one deployment with the target model it was given."""

    def __init__(self, client: BondClient, keys: list[bytes], model: HFCausalLM, model_hash: bytes, pool: Path):
        if not keys:
            raise ChainError("a referee needs at least one referee key")
        self.client = client
        self._keys = {Account.from_key(k).address: k for k in keys}  # address -> key; keys never logged
        self.model = model
        self.model_hash = model_hash
        self.pool = VerdictPool(pool, client)
        self.from_block = 0
        self._verdicts: dict[int, Judgement | None] = {}  # challenge id -> our verdict (None: cannot judge)

    def open_challenges(self) -> list[dict]:
        events = self.client.events("ChallengeOpened", from_block=self.from_block)
        return [e for e in events if self.client.challenge_status(e["id"]) is ChallengeStatus.OPEN]

    def _judge(self, event: dict) -> Judgement | None:
        cid = int(event["id"])
        if cid not in self._verdicts:
            if bytes(event["modelHash"]) != self.model_hash:
                log.warning("challenge %d is about model 0x%s, not ours: not judging it", cid, event["modelHash"].hex())
                self._verdicts[cid] = None
            else:
                p = event["params"]
                params = SamplingParams(p["temperatureMicros"] / MICROS, p["topK"], p["topPMicros"] / MICROS)
                try:
                    self._verdicts[cid] = judge_step(
                        self.model, event["prompt"], event["output"], event["position"], params, p["seed"]
                    )
                except ChainError as exc:
                    log.warning("challenge %d cannot be re-executed (%s): not judging it", cid, exc)
                    self._verdicts[cid] = None
        return self._verdicts[cid]

    def handle(self, event: dict) -> Outcome:
        """Judge one open challenge, add our signatures to the pool, resolve when a quorum exists."""
        cid = int(event["id"])
        judgement = self._judge(event)
        if judgement is None:
            return Outcome(cid, None, 0, False)
        at_fault = judgement.at_fault
        cost = {"target_positions": judgement.target_positions, "seconds": round(judgement.seconds, 4)}
        referees = set(self.client.referees())
        for address, key in self._keys.items():
            if address in referees:
                self.pool.put(cid, at_fault, address, sign_verdict(key, self.client.domain, cid, at_fault))
        sigs = self.pool.collect(cid, at_fault, referees)
        if len(sigs) < self.client.threshold():
            log.info("challenge %d: %d verdict signature(s) so far, waiting for a quorum", cid, len(sigs))
            return Outcome(cid, at_fault, len(sigs), False, **cost)
        try:
            tx = self.client.resolve(next(iter(self._keys.values())), cid, at_fault, sigs)
        except ChainRevert as exc:
            if exc.name != "ChallengeNotOpen":
                raise
            log.info("challenge %d was resolved by someone else", cid)
            return Outcome(cid, at_fault, len(sigs), False, **cost)
        log.info("challenge %d resolved: operator %s (gas %d)", cid, "at fault" if at_fault else "cleared", tx.gas_used)
        return Outcome(cid, at_fault, len(sigs), True, tx.gas_used, **cost)

    def run_once(self) -> list[Outcome]:
        return [self.handle(event) for event in self.open_challenges()]

    def watch(self, stop: threading.Event, poll_s: float = DEFAULT_POLL_S, on_outcome=None) -> None:
        """Handle challenges as they open until ``stop`` is set; ``on_outcome`` hears of each change."""
        seen: set[tuple] = set()
        while not stop.is_set():
            try:
                outcomes = self.run_once()
            except (ChainError, OSError, Web3Exception) as exc:  # the chain went away (requests' errors are
                # OSErrors) or a transaction failed: say so, retry
                log.warning("referee round failed: %s", exc)
                outcomes = []
            for outcome in outcomes:
                if on_outcome is not None and outcome not in seen:
                    on_outcome(outcome)
                seen.add(outcome)
            stop.wait(poll_s)
