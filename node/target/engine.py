"""The target's generation engine: requests in, verified tokens out, drafting delegated to a market.

One request is one *job*: a fresh KV cache on the shared target weights (``HFCausalLM.fork``), the
decode loop of ``verifier.decode`` in a worker thread, and a proposer supplied by the drafting
backend (remote drafter peers) or none (plain decoding). Chunks of tokens are handed back to the
trio loop through a memory channel as they are verified, so a slow reader never stalls decoding.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import trio

from node.chain.cheat import Cheat
from node.chain.receipts import RequestSpec, SignedReceipt, check_stop_sequences
from node.model.decoding import check_fits, encode_prompt, end_of_sequence_tokens, text_of
from node.model.loading import ModelPair
from node.model.prefix_cache import PrefixCache
from node.target.batching import BatchedLM, PassBatcher
from node.target.config import DEFAULT_BATCH_ROWS, DEFAULT_MAX_JOBS
from node.target.counters import EngineCounters, JobHistory, JobRecord, format_stats, new_job_id
from node.target.stops import StopText, cut_text, finished_by_rule, stop_rule
from p2p.messages import MAX_NEW_TOKENS
from verifier.decode import DecodeResult, DecodeStats, Proposer, decode
from verifier.errors import InvalidParams, sole_error
from verifier.model import LanguageModel
from verifier.noise import MAX_SEED
from verifier.params import SamplingParams
from verifier.proposal import MAX_GAMMA
from verifier.tree import supports_trees

if TYPE_CHECKING:
    from node.chain.operator import Operator
    from node.target.sessions import RemoteSession

log = logging.getLogger(__name__)

MAX_PROMPT_CHARS = 32_768
PLAIN_PASS_PROBES = 3  # one-position passes timed when an engine starts: plain decoding's first estimate
DRAWN_SEED_BOUND = 1 << 53  # seeds the server draws stay exact in JSON/JavaScript numbers, so they can be replayed
FLIP_AT = 1  # Cheat.FLIP_TOKEN's output index (at most; see flip_position)
REPLACEMENT_CHAR = "\ufffd"  # what a partial UTF-8 sequence decodes to; held back until completed


@dataclass(frozen=True)
class CompletionRequest:
    """One job. ``prompt`` is text (encoded as the document boundary + text) or token ids that are
    used as they are, e.g. the output of a chat template (``node.target.chat``)."""

    prompt: str | tuple[int, ...]
    max_tokens: int | None = 16  # None: as many as the context window leaves, at most MAX_NEW_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None  # None: the server draws one and reports it
    # False: the answer ends at the model's first end-of-sequence token (the receipt names them);
    # True: it runs to max_tokens (vLLM's ignore_eos)
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()  # OpenAI's stop sequences: the answer ends at the token that completes one

    def __post_init__(self) -> None:
        check_stop_sequences(self.stop, InvalidParams)
        if isinstance(self.prompt, tuple):
            if not self.prompt or not all(type(t) is int and t >= 0 for t in self.prompt):
                raise InvalidParams("a token prompt must be a non-empty tuple of token ids")
        elif not isinstance(self.prompt, str) or not self.prompt:
            raise InvalidParams("'prompt' must be a non-empty string")
        elif len(self.prompt) > MAX_PROMPT_CHARS:
            raise InvalidParams(f"'prompt' is {len(self.prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            raise InvalidParams(f"'max_tokens' must be a positive integer, got {self.max_tokens!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED
        ):
            raise InvalidParams(f"'seed' must be an integer in [0, {MAX_SEED}], got {self.seed!r}")
        self.params  # validates temperature / top_k / top_p  # noqa: B018

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


@dataclass(frozen=True)
class CompletionResult:
    job: str
    text: str
    tokens: tuple[int, ...]
    prompt_tokens: tuple[int, ...]
    seed: int
    finish_reason: str  # "length" | "stop"
    stats: dict[str, float | int]
    credits: dict[str, int]  # drafter peer id -> draft tokens of its that were accepted
    receipt: dict | None = None  # the operator's signed receipt (SignedReceipt.to_json), if bonded


@dataclass(frozen=True)
class JobSpec:
    """What one job decodes: the receipted request (its stop tokens included)."""

    request: RequestSpec


ChunkSink = Callable[[tuple[int, ...], str], Awaitable[None]]


class JobProposer(Proposer, Protocol):
    """A proposer for one job that can report, at the end, whose draft tokens were accepted. It may
    also have ``watch_passes(timed_model)`` (it is handed the job's timed target) and
    ``round_records()`` (one dict per draft round, ``node.target.draft_timing.RoundRecord``, kept in
    the job history for ``GET /api/jobs/{id}/rounds``)."""

    def finish(self, context: Sequence[int]) -> dict[str, int]:
        """Settle the last round against the final ``context`` (prompt + output); drafter -> credits."""

    def timing(self) -> dict[str, float | int]:
        """Drafting overheads (rounds, seconds spent waiting for drafts)."""


class JobObserver(Protocol):
    """Latency samples of every decoded job (the HTTP API turns them into Prometheus histograms).
    Called from the trio loop (tokens) and from the decode worker thread (draft waits)."""

    def first_token(self, seconds: float) -> None:
        """From the start of the job to its first verified chunk."""

    def inter_token(self, seconds: float) -> None:
        """Once per token after the first chunk: the gap since the previous chunk / its tokens."""

    def draft_wait(self, seconds: float) -> None:
        """One draft round: the time the decode loop waited in ``propose`` (send, wait for drafts)."""


class DraftingBackend(Protocol):
    def job(
        self, job_id: str, params: SamplingParams, seed: int, gamma: int, max_tokens: int
    ) -> AbstractAsyncContextManager[JobProposer | None]:
        """Open draft sessions for one job of at most ``max_tokens`` new tokens; yields None when no
        drafter is available. A backend that serves clients drafting for themselves also takes
        ``client`` (a session on the client's own stream: node.target.client_drafts)."""


class TextStream:
    """Incremental detokenisation: the text added by each chunk, holding back partial UTF-8."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.emitted = 0  # characters of decode(tokens) already handed out

    def feed(self, tokens: Sequence[int]) -> str:
        self.tokens.extend(tokens)
        text = text_of(self.tokenizer, self.tokens)
        end = len(text.rstrip(REPLACEMENT_CHAR))
        delta, self.emitted = text[self.emitted : end], max(self.emitted, end)
        return delta

    def flush(self) -> str:
        text = text_of(self.tokenizer, self.tokens)
        delta, self.emitted = text[self.emitted :], len(text)
        return delta


class TimedProposer:
    """A proposer that reports, for every round, how long the decode loop waited for its draft."""

    def __init__(self, inner: Proposer, observers: Sequence[JobObserver]) -> None:
        self.inner, self.name, self.observers = inner, inner.name, observers

    def propose(self, context: Sequence[int], **kwargs) -> object:
        started = time.perf_counter()
        try:
            return self.inner.propose(context, **kwargs)
        finally:
            waited = time.perf_counter() - started
            for observer in self.observers:
                observer.draft_wait(waited)


class ChunkClock:
    """Time to first token and inter-token latency of one job, from its chunks' arrival times."""

    def __init__(self, observers: Sequence[JobObserver]) -> None:
        self.observers = observers
        self.started = time.perf_counter()
        self.last: float | None = None
        self.first_s, self.first_tokens = 0.0, 0  # the first chunk: when, and how many tokens

    def tick(self, tokens: int) -> None:
        """A chunk of ``tokens`` verified tokens arrived."""
        if not tokens:
            return
        now = time.perf_counter()
        if self.last is None:
            self.first_s, self.first_tokens = now - self.started, tokens
        for observer in self.observers:
            if self.last is None:
                observer.first_token(now - self.started)
            else:
                for _ in range(tokens):
                    observer.inter_token((now - self.last) / tokens)
        self.last = now


class TimedModel:
    """The job's target cache (a ``LanguageModel``) that times its forward passes: the first pass
    also prefills the prompt, every later one is a verification pass (or a plain decoding step).
    ``prior_plain_pass_s``: the plain step's cost as known before this job measures its own."""

    def __init__(self, model: LanguageModel, prior_plain_pass_s: float | None = None) -> None:
        self.model = model
        self.vocab_size = model.vocab_size
        self.pass_seconds: list[float] = []
        self.pass_widths: list[int] = []  # positions scored by each pass (the first also prefills)
        self.prior_plain_pass_s = prior_plain_pass_s

    def cached(self) -> Sequence[int]:
        return self.model.cached()

    def extend(self, tokens: Sequence[int]) -> np.ndarray:
        return self._timed(self.model.extend, tokens)

    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        return self._timed(self.model.extend_tree, tokens, parents)

    def _timed(self, forward, tokens: Sequence[int], *args) -> np.ndarray:
        started = time.perf_counter()
        try:
            return forward(tokens, *args)
        finally:
            self.pass_seconds.append(time.perf_counter() - started)
            self.pass_widths.append(len(tokens))

    def keep_path(self, path: Sequence[int]) -> None:
        self.model.keep_path(path)

    @property
    def supports_trees(self) -> bool:
        return supports_trees(self.model)

    def measured_plain_pass_s(self) -> float | None:
        """The median one-position pass after the prefill (a plain decoding step), None before one."""
        single = sorted(s for s, w in zip(self.pass_seconds[1:], self.pass_widths[1:], strict=True) if w == 1)
        return single[len(single) // 2] if single else None

    def plain_pass_s(self) -> float | None:
        """A plain decoding step's cost: this job's own measurement, else the prior. A job whose
        every round had a draft never measures one, and the wait budget must still judge it (a
        drafter pacing correct drafts just before each deadline wastes no round, yet is slower)."""
        return self.measured_plain_pass_s() or self.prior_plain_pass_s

    def rollback(self, n: int) -> None:
        self.model.rollback(n)

    def stats(self) -> dict[str, float]:
        later = self.pass_seconds[1:] or self.pass_seconds  # without the prompt's prefill, when there is more
        return {
            "target_pass_seconds": round(sum(self.pass_seconds), 4),
            "target_pass_ms_per_round": round(1000 * sum(later) / len(later), 3) if later else 0.0,
        }


def measure_plain_pass(model) -> float:
    """A plain decoding step's cost before any job has measured one: the median of
    PLAIN_PASS_PROBES one-position passes after a one-token prefill, timed as a job times its own
    (token 0 is in every vocabulary)."""
    timed = TimedModel(model.fork())
    for _ in range(1 + PLAIN_PASS_PROBES):
        timed.extend([0])
    measured = timed.measured_plain_pass_s()
    assert measured is not None
    return measured


@asynccontextmanager
async def _no_drafting() -> AsyncIterator[None]:
    yield None


def flip_position(spec: RequestSpec) -> int:
    """Where Cheat.FLIP_TOKEN changes a token: early enough that an answer ended by its stop rule
    still has it (the second token, or the first of a one-token request)."""
    return min(spec.max_tokens // 2, FLIP_AT)


def flip_tokens(tokens: Sequence[int], offset: int, position: int, vocab_size: int) -> tuple[int, ...]:
    """Cheat.FLIP_TOKEN: ``tokens`` (starting at output index ``offset``) with the one at ``position``
    replaced by the next id."""
    out = list(tokens)
    if offset <= position < offset + len(out):
        out[position - offset] = (out[position - offset] + 1) % vocab_size
    return tuple(out)


class Engine:
    """Serves completions from one target model; thread-safe across concurrent jobs.

    With an ``operator`` every answer carries a signed receipt, and a request answered before is
    answered again from the receipt store (never signed twice). ``cheat`` makes it dishonest.
    """

    def __init__(
        self,
        pair: ModelPair,
        *,
        model_name: str,
        gamma: int,
        model_hash: bytes | None = None,  # the served model's commitment (node.model.loading.model_hash)
        drafting: DraftingBackend | None = None,
        operator: Operator | None = None,
        cheat: Cheat = Cheat.NONE,
        max_jobs: int = DEFAULT_MAX_JOBS,
        plain_pass_s: float | None = None,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        batch_workers: int | None = None,  # passes at once (None: one per core the process may use)
    ):
        if not 1 <= gamma <= MAX_GAMMA:
            raise InvalidParams(f"gamma must be in [1, {MAX_GAMMA}], got {gamma}")
        if cheat is Cheat.DRAFT_MODEL and pair.draft is None:
            raise InvalidParams("--cheat draft-model needs the draft model loaded")
        self.operator = operator
        self.cheat = cheat
        self.pair = pair
        self.model_name = model_name
        self.model_hash = model_hash
        self.gamma = gamma
        self.drafting = drafting
        self.max_jobs = max_jobs  # jobs at once; one more raises Overloaded (HTTP 503, a libp2p error)
        self.counters = EngineCounters()
        self.history = JobHistory()
        self.observers: list[JobObserver] = []  # e.g. the HTTP API's latency histograms
        # plain decoding's step, measured now and then by every job that measures one of its own
        self.plain_pass_s = plain_pass_s or measure_plain_pass(pair.target)
        self.prefixes = PrefixCache(pair.target)  # node.model.prefix_cache: only where the forward is shape-invariant
        # batched verification (node.target.batching): only where a shared pass keeps every job's bits
        shared = batch_rows > 0 and getattr(pair.target, "shape_invariant", False)
        self.batcher = PassBatcher(batch_rows, batch_workers) if shared else None

    def close(self) -> None:
        """Stop the pass batcher once the passes queued now have run; a later pass is refused."""
        if self.batcher is not None:
            self.batcher.close()

    def _room(self, prompt_len: int) -> int:
        """A request with no max_tokens (a chat runs to the end of its turn): what the context window
        leaves after the prompt, at most MAX_NEW_TOKENS (a full window is refused as too long)."""
        return max(1, min(MAX_NEW_TOKENS, self.pair.target.max_positions - prompt_len))

    def _job_context(self, job_id: str, spec: RequestSpec, client: RemoteSession | None = None):
        if self.drafting is None:
            return _no_drafting()
        if client is not None:  # the job's client drafts for itself (node.target.client_drafts)
            return self.drafting.job(job_id, spec.params, spec.seed, self.gamma, spec.max_tokens, client=client)
        return self.drafting.job(job_id, spec.params, spec.seed, self.gamma, spec.max_tokens)

    def _decode(self, proposer: Proposer | None, job: JobSpec, on_token, timer: list[TimedModel]) -> DecodeResult:
        spec = job.request
        # shared weights, own KV cache, holding the longest prefix of the prompt the last job cached
        cache = self.prefixes.fork_for(spec.prompt)
        target = TimedModel(BatchedLM(cache, self.batcher) if self.batcher else cache, self.plain_pass_s)
        if self.cheat is Cheat.DRAFT_MODEL:  # the cheap model answers, the receipt will claim the target
            target, proposer = TimedModel(self.pair.draft.fork()), None
        timer.append(target)
        reused = len(target.cached())  # the prompt's prefix another job left in the cache (prefix_cache)
        if proposer is not None and hasattr(proposer, "watch_passes"):
            proposer.watch_passes(target)  # the market's wait budget compares against plain passes
        if self.cheat is Cheat.FLIP_TOKEN and on_token is not None:
            on_token = self._flipping(on_token, flip_position(spec))
        if proposer is not None and self.observers:
            proposer = TimedProposer(proposer, self.observers)
        result = decode(
            target,
            proposer,
            list(spec.prompt),
            params=spec.params,
            seed=spec.seed,
            max_new_tokens=max(1, spec.max_tokens // 2) if self.cheat is Cheat.STOP_EARLY else spec.max_tokens,
            gamma=self.gamma,
            stop_tokens=spec.stop_tokens,
            on_token=on_token,
            stop_at=stop_rule(spec, self.pair.tokenizer),
        )
        self.plain_pass_s = target.measured_plain_pass_s() or self.plain_pass_s  # the freshest measurement
        # a client is told the positions its answer takes, as if nothing were cached: never how long a
        # prefix its prompt shares with another client's (issue 40 §6)
        result.stats.target_positions += reused
        if self.cheat is not Cheat.DRAFT_MODEL:
            self.prefixes.keep(cache, len(spec.prompt))
        if self.cheat is Cheat.FLIP_TOKEN:
            flipped = flip_tokens(result.tokens, 0, flip_position(spec), self.pair.target.vocab_size)
            result = DecodeResult(flipped, result.stats)
        return result

    def _flipping(self, on_token, position: int):
        emitted = 0

        def flipping_on_token(tokens: Sequence[int]) -> None:
            nonlocal emitted
            on_token(flip_tokens(tokens, emitted, position, self.pair.target.vocab_size))
            emitted += len(tokens)

        return flipping_on_token

    async def complete(
        self,
        req: CompletionRequest,
        on_chunk: ChunkSink | None = None,
        job_id: str | None = None,
        client: RemoteSession | None = None,
    ) -> CompletionResult:
        """Run one job. ``on_chunk(tokens, text)`` is awaited in order for every verified chunk.
        ``job_id``: the id the caller already told its client (a stream's id); None: a new one.
        ``client``: the client drafts for its job on this session (node.target.client_drafts)."""
        if client is not None and self.drafting is None:
            raise InvalidParams("this target drafts nothing (no drafting backend): ask without drafting")
        prompt = list(req.prompt) if isinstance(req.prompt, tuple) else encode_prompt(self.pair.tokenizer, req.prompt)
        if max(prompt) >= self.pair.target.vocab_size:
            raise InvalidParams(f"a prompt token id is outside the vocabulary of {self.pair.target.vocab_size}")
        max_tokens = req.max_tokens if req.max_tokens is not None else self._room(len(prompt))
        check_fits(self.pair, len(prompt), max_tokens)
        seed = req.seed if req.seed is not None else secrets.randbelow(DRAWN_SEED_BOUND)
        stops = () if req.ignore_eos else end_of_sequence_tokens(self.pair.tokenizer)
        # temperature and top-p in millionths, exactly as the receipt will name them, and the stop rule
        job = JobSpec(RequestSpec.build(prompt, req.params, seed, max_tokens, stops, req.stop))
        job_id = job_id or new_job_id()
        if self.operator is not None:
            self.operator.require_serving()  # before any work: an answer it cannot receipt is refused
        self.counters.start_job(self.max_jobs)
        try:
            # SQLite and perhaps a signature (a stale stored receipt is re-signed): off the trio thread
            op = self.operator
            stored = await trio.to_thread.run_sync(op.lookup, job.request) if op is not None else None
            if stored is not None:
                return await self._replay(job_id, job, stored, on_chunk)
            return await self._run_job(job_id, job, on_chunk, client)
        except BaseExceptionGroup as group:  # trio's nurseries wrap; callers want the one real error
            error = sole_error(group)
            self.counters.count_end(error)
            raise error from None
        except BaseException as error:
            self.counters.count_end(error)
            raise
        finally:
            self.counters.active_jobs -= 1

    async def _replay(self, job_id: str, job: JobSpec, stored: SignedReceipt, on_chunk) -> CompletionResult:
        """A request this operator answered before: the same answer and receipt, no decoding."""
        log.info("job %s: request answered before; replaying its receipted answer", job_id)
        text = cut_text(text_of(self.pair.tokenizer, stored.output), stored.request.stop_sequences)
        if on_chunk is not None:
            await on_chunk(stored.output, text)
        result = DecodeResult(stored.output, DecodeStats())
        stats = {**result.stats.to_dict(), "replayed": 1}
        return self._result(job_id, JobSpec(stored.request), result, {}, stats, stored)

    async def _run_job(self, job_id: str, job: JobSpec, on_chunk, client: RemoteSession | None = None):
        spec = job.request
        text = StopText(TextStream(self.pair.tokenizer), spec.stop_sequences)
        send, receive = trio.open_memory_channel[tuple[int, ...]](math.inf)

        def on_token(tokens: Sequence[int]) -> None:  # runs in the worker thread
            trio.from_thread.check_cancelled()  # client gone: stop at the end of this round
            trio.from_thread.run_sync(send.send_nowait, tuple(tokens))

        clock = ChunkClock(self.observers)

        async def forward_chunks() -> None:
            hold = getattr(proposer, "hold_stream", None)  # a market job's: its probation answers first
            async for tokens in receive:
                if hold is not None:
                    await hold()
                clock.tick(len(tokens))
                delta = text.feed(tokens)
                if on_chunk is not None:
                    await on_chunk(tokens, delta)

        started, timer = clock.started, []
        async with self._job_context(job_id, spec, client) as proposer, trio.open_nursery() as nursery:
            nursery.start_soon(forward_chunks)
            try:
                result = await trio.to_thread.run_sync(self._decode, proposer, job, on_token, timer)
            finally:
                send.close()
            credits = proposer.finish([*spec.prompt, *result.tokens]) if proposer is not None else {}
            timing = {**timer[0].stats(), **(proposer.timing() if proposer is not None else {})}
            rounds = proposer.round_records() if hasattr(proposer, "round_records") else []  # optional
        tail = text.flush()
        if tail and on_chunk is not None:
            await on_chunk((), tail)
        wall = time.perf_counter() - started
        stats = {**result.stats.to_dict(), **timing, "wall_seconds": round(wall, 4)}
        stats |= {"first_chunk_seconds": round(clock.first_s, 4), "first_chunk_tokens": clock.first_tokens}
        stats["tokens_per_second"] = round(len(result.tokens) / wall, 2) if wall > 0 else 0.0
        signed = await trio.to_thread.run_sync(self._sign, spec, result.tokens)
        return self._result(job_id, job, result, credits, stats, signed, rounds)

    def _sign(self, spec: RequestSpec, tokens: tuple[int, ...]) -> SignedReceipt | None:
        if self.operator is None:
            return None
        signed = self.operator.sign(spec, tokens)
        if signed.output != tokens:  # an identical request finished first: its answer stands
            log.warning("an identical request was answered concurrently; returning that receipted answer")
        return signed

    def _result(
        self, job_id, job: JobSpec, result: DecodeResult, credits, stats, signed: SignedReceipt | None, rounds=None
    ) -> CompletionResult:
        self.counters.add(result)
        spec = job.request
        tokens = signed.output if signed is not None else result.tokens
        stopped = finished_by_rule(spec, self.pair.tokenizer, tokens)
        log.info("job %s: %d tokens, %s", job_id, len(tokens), format_stats(stats))
        self.history.add(JobRecord.of(job_id, len(tokens), stats), rounds)
        return CompletionResult(
            job=job_id,
            text=cut_text(text_of(self.pair.tokenizer, tokens), spec.stop_sequences),
            tokens=tokens,
            prompt_tokens=spec.prompt,
            seed=spec.seed,
            finish_reason="stop" if stopped else "length",
            stats=stats,
            credits=credits,
            receipt=signed.to_json() if signed is not None else None,
        )
