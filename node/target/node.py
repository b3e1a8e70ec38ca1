"""The target node: a libp2p host with the rendezvous point, the drafting market, the generation
protocol for peer clients, and the OpenAI-compatible HTTP API, all on one trio loop. Model forward
passes run in worker threads, one KV cache per job on shared weights.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import trio
from libp2p.abc import INetStream

from market.ledger import Ledger
from market.policy import Policy, PolicyConfig
from market.registry import Registry
from node.chain.cheat import Cheat
from node.chain.operator import Operator, OperatorConfig, open_operator
from node.target.market import DraftingConfig, MarketDrafting
from node.target.engine import CompletionRequest, Engine
from node.decoding import DEFAULT_GAMMA
from node.target.http_api import build_app, serve_http
from node.models import DEFAULT_DRAFT, DEFAULT_TARGET, ModelPair, load_pair
from p2p.discovery import RendezvousPoint, drafter_namespace
from p2p.framing import FrameStream, StreamFailed
from p2p.host import peer_addrs, running_host
from p2p.messages import GENERATE_PROTOCOL_ID, TO_SERVER, Chunk, Done, Error, InvalidMessage, Request
from verifier.errors import InvalidParams, SpecmarketError

log = logging.getLogger(__name__)

LEDGER_FILE = "ledger.sqlite"
REQUEST_TIMEOUT_S = 10.0  # a client must send its request this soon after opening the stream
CLIENT_SEND_TIMEOUT_S = 30.0
MODEL_NAME = "specmarket-target"
JUDGE_AFTER_TOKENS = 32


@dataclass(frozen=True)
class TargetConfig:
    listen: str = "/ip4/127.0.0.1/tcp/0"
    http: str = "127.0.0.1:8000"
    data_dir: Path = Path(".specmarket/target")
    gamma: int = DEFAULT_GAMMA
    draft_deadline_ms: float = 100.0
    max_drafters: int = 4
    target_model: Path = DEFAULT_TARGET
    draft_model: Path = DEFAULT_DRAFT  # loaded only for --cheat draft-model
    operator: OperatorConfig | None = None  # None: an unbonded node (no receipts)

    def __post_init__(self) -> None:
        if not 1 <= self.gamma <= 16:
            raise InvalidParams(f"--gamma must be in [1, 16], got {self.gamma}")
        if not 0 < self.draft_deadline_ms <= 60_000:
            raise InvalidParams(f"--draft-deadline-ms must be in (0, 60000], got {self.draft_deadline_ms}")
        if not 0 <= self.max_drafters <= 64:
            raise InvalidParams(f"--max-drafters must be in [0, 64], got {self.max_drafters}")
        self.http_host_port  # validates --http  # noqa: B018

    @property
    def http_host_port(self) -> tuple[str, int]:
        host, sep, port = self.http.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise InvalidParams(f"--http must be HOST:PORT (port 0 = any free port), got {self.http!r}")
        return host, int(port)


class TargetNode:
    def __init__(self, cfg: TargetConfig, pair: ModelPair | None = None) -> None:
        self.cfg = cfg
        cheat = cfg.operator.cheat if cfg.operator is not None else Cheat.NONE
        self.pair = pair or load_pair(cfg.target_model, cfg.draft_model if cheat is Cheat.DRAFT_MODEL else None)
        self.pair.target.fork().extend([self.pair.tokenizer.eos_token_id] * (cfg.gamma + 1))  # warm up
        self.registry = Registry()
        # 32 tokens judge a drafter: an honest one (per-token match ~0.5-0.7) matches nothing in 8 rounds
        # with probability ~0.3^8 < 1e-4, while a useless one costs half the default 64-token trial
        self.policy = Policy(
            PolicyConfig(min_tokens_to_judge=JUDGE_AFTER_TOKENS, latency_budget_ms=cfg.draft_deadline_ms)
        )
        self.ledger = Ledger(Path(cfg.data_dir) / LEDGER_FILE)
        self.engine: Engine | None = None
        self.operator: Operator | None = None
        if cfg.operator is not None:  # bond before serving: every answer must be receipted
            self.operator, _ = open_operator(cfg.operator, cfg.target_model, Path(cfg.data_dir))
        self.addrs: list[str] = []

    def status(self) -> dict:
        """JSON-ready node state for /health and /metrics."""
        drafters = self.registry.snapshot()  # drafters in the market now
        for peer, row in drafters.items():
            row["credited_tokens"] = self.ledger.get(peer).accepted  # lifetime, from the ledger
        op = self.operator
        return {
            "peer_id": self.addrs[0].rsplit("/", 1)[-1] if self.addrs else None,
            "multiaddrs": self.addrs,
            "drafters": drafters,
            "operator": None
            if op is None
            else {"address": op.address, "contract": op.client.address, "chain_id": op.client.domain.chain_id},
        }

    async def handle_generate(self, stream: INetStream) -> None:
        """The generation protocol: one ``request`` in, ``chunk`` frames and a ``done`` out."""
        assert self.engine is not None
        fs = FrameStream(stream, vocab_size=self.pair.target.vocab_size, allowed=TO_SERVER)
        try:
            req = await fs.receive(REQUEST_TIMEOUT_S)
            assert isinstance(req, Request)
            await self._serve_request(fs, req)
        except (InvalidMessage, StreamFailed) as exc:
            log.warning("generate stream from %s dropped: %s", fs.peer_id, exc)
        finally:
            await fs.close()

    async def _serve_request(self, fs: FrameStream, req: Request) -> None:
        assert self.engine is not None

        async def on_chunk(tokens: tuple[int, ...], text: str) -> None:
            await fs.send(Chunk(tokens, text), CLIENT_SEND_TIMEOUT_S)

        try:
            creq = CompletionRequest(req.prompt, req.max_new_tokens, req.temperature, req.top_p, req.top_k, req.seed)
            result = await self.engine.complete(creq, on_chunk)
        except StreamFailed:
            raise
        except SpecmarketError as exc:
            await fs.send(Error(str(exc)), CLIENT_SEND_TIMEOUT_S)
            return
        stats = {k: v for k, v in result.stats.items() if isinstance(v, (int, float))}
        receipt = json.dumps(result.receipt) if result.receipt is not None else ""
        done = Done(result.job, result.tokens, result.seed, stats, result.credits, receipt)
        await fs.send(done, CLIENT_SEND_TIMEOUT_S)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started({"multiaddrs": [...], "http": url})``."""
        cfg = self.cfg
        http_host, http_port = cfg.http_host_port
        async with running_host(cfg.data_dir, cfg.listen) as host, trio.open_nursery() as nursery:
            self.addrs = peer_addrs(host)
            point = RendezvousPoint(host, drafter_namespace(self.pair.fingerprint))
            drafting = MarketDrafting(
                host,
                self.registry,
                self.policy,
                self.ledger,
                DraftingConfig(cfg.draft_deadline_ms / 1000, cfg.max_drafters),
                self.pair.target.vocab_size,
            )
            self.engine = Engine(
                self.pair,
                model_name=MODEL_NAME,
                gamma=cfg.gamma,
                drafting=drafting if cfg.max_drafters else None,
                operator=self.operator,
                cheat=cfg.operator.cheat if cfg.operator is not None else Cheat.NONE,
            )
            host.set_stream_handler(GENERATE_PROTOCOL_ID, self.handle_generate)
            nursery.start_soon(point.watch, drafting.on_registration, drafting.on_gone)
            url = await nursery.start(serve_http, build_app(self.engine, self.status), http_host, http_port)
            log.info("target %s serving on %s and %s", host.get_id(), ", ".join(self.addrs), url)
            task_status.started({"multiaddrs": self.addrs, "http": url})

    def close(self) -> None:
        self.ledger.close()
        if self.operator is not None:
            self.operator.store.close()
