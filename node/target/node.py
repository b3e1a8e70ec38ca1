"""The target node: a libp2p host with the rendezvous point, the drafting market, the generation
protocol for peer clients, and the OpenAI-compatible HTTP API, all on one trio loop. Model forward
passes run in worker threads, one KV cache per job on shared weights.
"""

from __future__ import annotations

import contextlib
import json
import logging
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from libp2p.abc import INetStream

from market.ledger import Ledger
from market.policy import Policy, PolicyConfig
from market.registry import Registry
from node.chain.cheat import Cheat
from node.model.loading import ModelPair, load_pair
from node.runtime.ports import holding_port
from node.target.client_drafts import client_session
from node.target.config import TargetConfig, auto_deadline_ms
from node.target.counters import ClientGone
from node.target.engine import CompletionRequest, Engine, measure_plain_pass
from node.target.http.api import build_app, serve_http
from node.target.http.metrics import MAX_LISTED_DRAFTERS
from node.target.market import MarketDrafting
from p2p.discovery import RendezvousPoint, drafter_namespace
from p2p.framing import FrameStream, StreamFailed
from p2p.host import peer_addrs, running_host
from p2p.messages import (
    GENERATE_PROTOCOL_ID,
    GENERATE_PROTOCOL_V1_1,
    TO_SERVER,
    Chunk,
    Done,
    Error,
    InvalidMessage,
    Request,
)
from verifier.errors import SpecmarketError

if TYPE_CHECKING:  # the chain's stack (web3, eth-account) loads only for a bonded target: see _bond
    from node.chain.operator import Operator

log = logging.getLogger(__name__)

LEDGER_FILE = "ledger.sqlite"
REQUEST_TIMEOUT_S = 10.0  # a client must send its request this soon after opening the stream
CLIENT_SEND_TIMEOUT_S = 30.0
MAX_ERROR_CHARS = 1000  # an error frame says why in a line, not the whole offending frame
# Generate streams open at once (waiting for their request or running): one more is answered with an
# error frame at once. Jobs behind them are bounded by max_jobs; these bound the waiting streams too.
MAX_GENERATE_STREAMS_PER_PEER = 4
MAX_GENERATE_STREAMS = 256  # all peers together (peer ids are free to mint)
REFUSE_SEND_TIMEOUT_S = 2.0  # a refused stream hears why this soon, or is closed without it


def summed_counts(rows: list[dict]) -> dict[str, int]:
    """The counts (int and bool fields) of ``rows`` summed, and how many rows: the drafters a
    status view does not list one by one."""
    totals = {"drafters": len(rows)}
    for row in rows:
        for key, value in row.items():
            if type(value) in (int, bool):
                totals[key] = totals.get(key, 0) + int(value)
    return totals


def ranked_drafters(drafters: dict[str, dict]) -> dict[str, dict]:
    """Best first: most credited tokens, then longest known (Sybils that never drafted sink)."""
    order = sorted(drafters, key=lambda p: (-drafters[p].get("credited_tokens", 0), -drafters[p].get("known_for_s", 0)))
    return {peer: drafters[peer] for peer in order}


class TargetNode:
    def __init__(self, cfg: TargetConfig, pair: ModelPair | None = None) -> None:
        self.cfg = cfg
        self.pair = pair or load_pair(
            cfg.target_dir, cfg.draft_dir if cfg.cheat is Cheat.DRAFT_MODEL else None, cfg.kernel
        )
        self.pair.target.fork().extend([self.pair.tokenizer.eos_token_id] * (cfg.gamma + 1))  # warm up
        self.plain_pass_s = measure_plain_pass(self.pair.target)
        self.deadline_ms = cfg.draft_deadline_ms or auto_deadline_ms(self.plain_pass_s)
        log.info("draft deadline %.0f ms (plain decoding step %.1f ms)", self.deadline_ms, 1000 * self.plain_pass_s)
        self.registry = Registry()
        judging = PolicyConfig(min_tokens_to_judge=cfg.judge_after_tokens, latency_budget_ms=self.deadline_ms)
        self.policy = Policy(judging)
        self.ledger = Ledger(Path(cfg.data_dir) / LEDGER_FILE)
        # each drafter's lifetime credited tokens, read once here (before the trio loop runs) and
        # kept up to date by the market as it credits jobs: status() never reads SQLite
        self.credited = {peer: entry.accepted for peer, entry in self.ledger.totals().items()}
        self.engine: Engine | None = None
        self.generate_streams: dict[str, int] = {}  # peer -> its generate streams open now
        self.operator: Operator | None = None  # bonded in run(), once every listener is bound
        self.addrs: list[str] = []
        self.point: RendezvousPoint | None = None

    def status(self) -> dict:
        """JSON-ready node state for /health, the dashboard and /metrics, from memory alone (the
        ledger's lifetime credits are mirrored in ``credited``: no SQLite on the trio loop): the
        MAX_LISTED_DRAFTERS best drafters (``ranked_drafters``), how many there are, and the
        others' counts summed, so a scrape's size and work stay bounded whatever the Sybils."""
        drafters = self.registry.snapshot()  # drafters in the market now
        for peer, row in drafters.items():
            row["credited_tokens"] = self.credited.get(peer, 0)  # lifetime
        ranked = list(ranked_drafters(drafters).items())
        op = self.operator
        return {
            "peer_id": self.addrs[0].rsplit("/", 1)[-1] if self.addrs else None,
            "multiaddrs": self.addrs,
            "drafters": dict(ranked[:MAX_LISTED_DRAFTERS]),
            "drafters_total": len(ranked),
            "drafters_others": summed_counts([row for _, row in ranked[MAX_LISTED_DRAFTERS:]]),
            "rendezvous": None if self.point is None else self.point.stats(),
            "operator": None if op is None else op.describe(),
        }

    async def handle_generate(self, stream: INetStream) -> None:
        """The generation protocol: one ``request`` in, ``chunk`` frames and a ``done`` out. Past the
        stream caps, or with ``max_jobs`` running (``Overloaded``), the answer is an ``error`` frame."""
        assert self.engine is not None
        fs = FrameStream(stream, vocab_size=self.pair.target.vocab_size, allowed=TO_SERVER)
        peer = fs.peer_id
        if (refusal := self._stream_refusal(peer)) is not None:
            log.info("refusing a generate stream from %s: %s", peer, refusal)
            with contextlib.suppress(StreamFailed, InvalidMessage):
                await fs.send(Error(refusal), REFUSE_SEND_TIMEOUT_S)
            await fs.close()
            return
        self.generate_streams[peer] = self.generate_streams.get(peer, 0) + 1
        try:
            req = await fs.receive(REQUEST_TIMEOUT_S)
            assert isinstance(req, Request)
            await self._serve_request(fs, req)
        except InvalidMessage as exc:  # the peer hears why, then the stream closes
            log.warning("generate stream from %s: invalid request: %s", peer, exc)
            with contextlib.suppress(StreamFailed):
                await fs.send(Error(f"invalid request: {exc}"[:MAX_ERROR_CHARS]), CLIENT_SEND_TIMEOUT_S)
        except ClientGone as exc:
            log.info("generate stream from %s: job cancelled: %s", peer, exc)
        except StreamFailed as exc:
            log.warning("generate stream from %s dropped: %s", peer, exc)
        finally:
            try:
                await fs.close()
            finally:
                self.generate_streams[peer] -= 1
                if not self.generate_streams[peer]:
                    del self.generate_streams[peer]

    def _stream_refusal(self, peer: str) -> str | None:
        """Why a new generate stream from ``peer`` is refused; None: it is served."""
        if self.generate_streams.get(peer, 0) >= MAX_GENERATE_STREAMS_PER_PEER:
            return f"too many concurrent generate streams from this peer (at most {MAX_GENERATE_STREAMS_PER_PEER})"
        if sum(self.generate_streams.values()) >= MAX_GENERATE_STREAMS:
            return f"the target has {MAX_GENERATE_STREAMS} generate streams open; retry later"
        return None

    async def _serve_request(self, fs: FrameStream, req: Request) -> None:
        assert self.engine is not None
        # a drafting client's drafts come on this stream from now on (node.target.client_drafts)
        client = client_session(fs, self.engine.gamma) if req.draft else None

        async def on_chunk(tokens: tuple[int, ...], text: str) -> None:
            try:
                await fs.send(Chunk(tokens, text), CLIENT_SEND_TIMEOUT_S)
            except StreamFailed as exc:  # the job is cancelled, not failed
                raise ClientGone(f"the client's stream failed: {exc}") from exc

        try:
            creq = CompletionRequest(
                req.prompt, req.max_new_tokens, req.temperature, req.top_p, req.top_k, req.seed, req.ignore_eos
            )
            result = await self.engine.complete(creq, on_chunk, client=client)
        except (StreamFailed, ClientGone):
            raise
        except SpecmarketError as exc:
            await fs.send(Error(str(exc)), CLIENT_SEND_TIMEOUT_S)
            return
        stats = {k: v for k, v in result.stats.items() if isinstance(v, (int, float))}
        receipt = json.dumps(result.receipt) if result.receipt is not None else ""
        done = Done(result.job, result.tokens, result.seed, stats, result.credits, receipt)
        await fs.send(done, CLIENT_SEND_TIMEOUT_S)

    async def _bond(self) -> None:
        """Register and bond if the node is bonded (blocking chain calls, in a thread), before it
        serves: every answer must be receipted. Only after every local check (model, key, ports).
        A signal meanwhile stops the node at once (the thread dies with the process): what was
        sent stands (each transaction is atomic, and the next start tops up what is missing)."""
        if (operator := self.cfg.operator) is not None:
            from node.chain.operator import open_operator

            bond = partial(open_operator, operator, self.cfg.target_dir, Path(self.cfg.data_dir))
            self.operator, _ = await trio.to_thread.run_sync(bond, abandon_on_cancel=True)

    async def _model_hash(self) -> bytes:
        """The served model's commitment (what a bonded operator signs receipts for), for /v1/models."""
        if self.operator is not None:
            return self.operator.model_hash
        from node.model.loading import model_hash

        return await trio.to_thread.run_sync(model_hash, self.cfg.target_dir, abandon_on_cancel=True)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started({"multiaddrs": [...], "http": url})``."""
        cfg = self.cfg
        http_host, http_port = cfg.http_host_port
        async with (
            holding_port(http_host, http_port, "HTTP") as http_port_held,
            running_host(cfg.data_dir, cfg.listen) as host,
            trio.open_nursery() as nursery,
        ):
            self.addrs = peer_addrs(host)
            await self._bond()  # both ports are ours now: a node that cannot serve never bonds
            self.point = point = RendezvousPoint(host, drafter_namespace(self.pair.fingerprint))
            drafting = MarketDrafting(
                host,
                self.registry,
                self.policy,
                self.ledger,
                credited=self.credited,
                background=nursery,
                deadline_s=self.deadline_ms / 1000,
                max_drafters=cfg.max_drafters,
                wait_budget=cfg.wait_budget,
                tree_nodes=cfg.tree_nodes,
                vocab_size=self.pair.target.vocab_size,
                paymaster=self.operator.paymaster if self.operator is not None else None,
            )
            self.engine = Engine(
                self.pair,
                model_name=Path(cfg.target_dir).name,  # what /v1/models names, as vLLM names its --model
                model_hash=await self._model_hash(),
                gamma=cfg.gamma,
                drafting=drafting,  # with --max-drafters 0, the jobs of clients drafting for themselves only
                operator=self.operator,
                cheat=cfg.cheat,
                max_jobs=cfg.max_jobs,
                plain_pass_s=self.plain_pass_s,
                batch_rows=cfg.batch_rows,
            )
            for protocol in (GENERATE_PROTOCOL_ID, GENERATE_PROTOCOL_V1_1):  # 1.1.0: a request never drafts
                host.set_stream_handler(protocol, self.handle_generate)
            nursery.start_soon(point.watch, drafting.on_registration, drafting.on_gone)
            app = build_app(self.engine, self.status, cfg.http_limits)
            http_port_held.close()  # hypercorn binds it next
            url = await nursery.start(partial(serve_http, limits=cfg.http_limits), app, http_host, http_port)
            log.info("target %s serving on %s and %s", host.get_id(), ", ".join(self.addrs), url)
            task_status.started({"multiaddrs": self.addrs, "http": url})

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.ledger.close()
        if self.operator is not None:
            self.operator.close()
