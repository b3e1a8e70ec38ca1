"""`specmarket ask`: one completion from a target node, over HTTP or libp2p, with its receipt checked.

With ``chat`` the prompt is sent as one user message (after an optional system message) to
``/v1/chat/completions``, so the target applies its model's chat template; this needs an HTTP
target, since the libp2p generation protocol carries plain prompts.

The answer's receipt (when the node is bonded) is verified before it is saved: the signature, its
hashes, that it covers exactly the tokens received and the request made (the prompt tokenized here,
with the expected model's tokenizer, and that model's stop tokens), and on chain that it was signed
for the trusted deployment by a registered, active operator of the expected model, recently
(node/client/receipt_check.py).

What the checks need from this machine is prepared in background threads while the target works
(``Preparation``): the prompt's tokens and the model hash (node/client/expected.py: the
``tokenizers`` package, the chat template rendered without transformers, and a cached hash), the chain's id and
trusted deployment (node/client/chain_view.py: plain JSON-RPC, no web3). The signature is checked
with eth-keys (node/client/signature.py), not eth-account, whose import alone costs a third of a
second. So a bonded answer costs little more than the CLI's start-up over the job.

What cannot be checked is reported, not fatal: a client without the model's files, or whose chain
does not answer (or has no deployment recorded), still gets the answer and, with ``receipt_out``,
the receipt file; each part left unchecked is one "not checked" line (``ReceiptReport``) and the
exit status is 0. A check that fails is an error (exit status 2); when only the chain's check fails,
the receipt file is written first, and the error says so.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.chain.anvil import DEFAULT_RPC
from node.chain.deployment import DEFAULT_DEPLOYMENTS_DIR
from node.model.pairs import DEFAULT_PAIR, ModelNotPrepared, get_pair
from p2p import safe_json
from verifier.errors import InvalidParams
from verifier.noise import MAX_SEED
from verifier.params import SamplingParams

if TYPE_CHECKING:
    from node.chain.receipts import SignedReceipt
    from node.client.chain_view import ChainView
    from node.client.expected import Expected
    from node.client.receipt_check import Asked

HTTP_SCHEMES = ("http://", "https://")
HOST_PORT = re.compile(r"(?:[\w.-]+|\[[0-9a-fA-F:.]+\]):\d{1,5}/?")  # localhost:8000, [::1]:8000


@dataclass(frozen=True)
class AskConfig:
    """Every default of `specmarket ask`, written once (the CLI reads them from here)."""

    prompt: str
    target: str  # the target's multiaddr (/ip4/.../p2p/...) or http:// URL
    seed: int | None = None  # None: the target draws one and reports it
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    ignore_eos: bool = False  # run to max_new_tokens past the model's end-of-sequence tokens
    receipt_out: Path | None = None  # save the verified receipt here
    chat: bool = False  # send the prompt as a user message through the model's chat template
    system: str | None = None  # with chat: a system message before it
    # what a receipt is checked against: the model the target must be bonded for, and the deployment
    pair: str = DEFAULT_PAIR
    target_model: Path | None = None  # default: the pair's target
    verify_model: bool = False  # hash the model's files again rather than trust the hash cache
    rpc: str = DEFAULT_RPC
    deployments: Path = DEFAULT_DEPLOYMENTS_DIR
    # draft for the request here, over the same libp2p stream (node.client.drafting): the pair's draft
    # model, or draft_model
    draft: bool = False
    draft_model: Path | None = None

    def __post_init__(self) -> None:
        check_target(self.target)
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise InvalidParams(f"--seed must be in [0, {MAX_SEED}], got {self.seed}")
        self.params  # noqa: B018  (the sampling parameters are checked before anything is sent)
        if self.system is not None and not self.chat:
            raise InvalidParams("--system needs --chat")
        if self.chat and not self.over_http:
            raise InvalidParams("--chat needs an http:// target (the libp2p protocol carries plain prompts)")
        if self.draft and self.over_http:
            raise InvalidParams(
                "--draft needs the target's libp2p multiaddr: drafting for your own request sends drafts while the "
                "answer streams, which an HTTP request cannot (README, 'Draft for your own request')"
            )
        if self.draft_model is not None and not self.draft:
            raise InvalidParams("--draft-model needs --draft")

    @property
    def draft_dir(self) -> Path:
        """The draft model the client drafts with (``--draft``): ``draft_model``, else the pair's."""
        return get_pair(self.pair).draft_dir(self.draft_model)

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat: the system message (if any), then the prompt as the user's message."""
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        return [*system, {"role": "user", "content": self.prompt}]

    @property
    def over_http(self) -> bool:
        return self.target.startswith(HTTP_SCHEMES)

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


def check_target(target: str) -> None:
    """An http(s):// URL or a multiaddr; a bare HOST:PORT is refused with the URL it likely means."""
    if target.startswith((*HTTP_SCHEMES, "/")):
        return
    hint = f"; did you mean http://{target.rstrip('/')}?" if HOST_PORT.fullmatch(target) else ""
    raise InvalidParams(
        f"--target {target!r} is neither an http:// URL nor a peer multiaddr (/ip4/HOST/tcp/PORT/p2p/PEER_ID){hint}"
    )


@dataclass(frozen=True)
class ReceiptReport:
    """What `ask` made of the answer's receipt: ``signed`` None when the target is not bonded."""

    signed: SignedReceipt | None = None
    saved: Path | None = None
    not_checked: tuple[str, ...] = ()  # one line per part that could not be checked, with why

    def lines(self) -> list[str]:
        """For the user (stderr): the receipt, then one warning per part left unchecked."""
        if self.signed is None:
            return []
        saved = f", saved to {self.saved}" if self.saved is not None else ""
        r = self.signed
        head = f"[receipt signed by operator {r.receipt.operator} on chain {r.domain.chain_id}{saved}]"
        return [head, *(f"warning: not checked: {what}" for what in self.not_checked)]


def ask(cfg: AskConfig, on_text: Callable[[str], None]) -> tuple[dict[str, Any], ReceiptReport]:
    """Stream one completion; return its summary (job, tokens, seed, stats, credits, receipt) and
    what became of its receipt."""
    prepared = Preparation(cfg)  # runs while the target works
    summary = answer(cfg, on_text)
    return summary, verify_receipt(summary, cfg, prepared)


def answer(cfg: AskConfig, on_text: Callable[[str], None]) -> dict[str, Any]:
    """The target's answer, streamed to ``on_text``; its summary."""
    if not cfg.over_http:
        import trio

        return trio.run(_ask_p2p, cfg, on_text)
    from node.client.http import stream_chat, stream_completion

    sampling = {"max_tokens": cfg.max_new_tokens, "seed": cfg.seed, "temperature": cfg.temperature}
    sampling |= {"top_k": cfg.top_k, "top_p": cfg.top_p, "ignore_eos": cfg.ignore_eos, "on_text": on_text}
    if cfg.chat:
        return stream_chat(cfg.target, cfg.messages, **sampling)
    return stream_completion(cfg.target, cfg.prompt, **sampling)


async def _ask_p2p(cfg: AskConfig, on_text: Callable[[str], None]) -> dict[str, Any]:
    import trio

    from node.client.p2p import ask_p2p, make_request

    request = make_request(
        cfg.prompt, cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.seed, top_k=cfg.top_k, ignore_eos=cfg.ignore_eos
    )
    drafter = None
    if cfg.draft:
        from node.client.drafting import ClientDraftConfig, ClientDrafter

        drafter = await trio.to_thread.run_sync(ClientDrafter, ClientDraftConfig(cfg.draft_dir))
    done = await ask_p2p(cfg.target, request, on_text, drafter)
    return {
        "job": done.job,
        "tokens": list(done.tokens),
        "seed": done.seed,
        "stats": done.stats,
        "credits": done.credits,
        "receipt": safe_json.loads(done.receipt, "the receipt") if done.receipt else None,
    }


class Background:
    """``fn()`` in a daemon thread (an exiting process never waits for it); ``result()`` waits for
    it and returns its value or raises its error."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class Preparation:
    """This machine's side of the receipt checks, started before the request is sent so that it
    runs while the target works: what the receipt must commit to (``expected``), and the trusted
    deployment on the chain (``chain``; its thread imports the receipt's code too)."""

    def __init__(self, cfg: AskConfig) -> None:
        model_dir, present = expected_model(cfg)
        self._expected = Background(partial(_expect, cfg, model_dir, present), "ask-expected")
        self._chain = Background(partial(_connect, cfg.rpc, cfg.deployments), "ask-chain")

    def expected(self) -> Expected:
        return self._expected.result()

    def chain(self) -> ChainView:
        """The deployment this client trusts; ChainError when it cannot be read."""
        return self._chain.result()


def expected_model(cfg: AskConfig) -> tuple[Path, bool]:
    """The model the target must be bonded for (``--target-model``, else the pair's target), and
    whether its files are on this machine (a model directory, prepared where set-up prepares it)."""
    if cfg.target_model is not None:
        return cfg.target_model, (cfg.target_model / "config.json").is_file()
    pair = get_pair(cfg.pair)
    try:
        return pair.target_dir(), True
    except ModelNotPrepared:
        return pair.target, False


def _expect(cfg: AskConfig, model_dir: Path, present: bool) -> Expected:
    from node.client.expected import expect, no_model_files

    if not present:
        return no_model_files(model_dir)
    return expect(model_dir, cfg.messages if cfg.chat else cfg.prompt, verify_model=cfg.verify_model)


def _connect(rpc: str, deployments: Path) -> ChainView:
    from node.client.chain_view import ChainView

    return ChainView.connect(rpc, deployments)


def verify_receipt(summary: dict[str, Any], cfg: AskConfig, prepared: Preparation | None = None) -> ReceiptReport:
    """Check the answer's receipt (node/client/receipt_check.py) and save it to ``cfg.receipt_out``;
    ReceiptError when a check fails or ``receipt_out`` is asked of a target that sent no receipt."""
    from node.chain.receipts import ReceiptError, SignedReceipt
    from node.client.receipt_check import check_covers
    from node.client.signature import check_signed

    data, out = summary.get("receipt"), cfg.receipt_out
    if data is None:
        if out is not None:
            raise ReceiptError("the target sent no receipt (it is not bonded), so there is nothing to save")
        return ReceiptReport()
    prepared = prepared or Preparation(cfg)
    signed = SignedReceipt.from_json(data)
    check_signed(signed)  # SignedReceipt.check without eth-account's import (node/client/signature.py)
    expected = prepared.expected()
    check_covers(signed, asked(cfg, expected, signed), summary.get("tokens", []))
    if out is not None:
        save_receipt(signed, out)
    unchecked = _check_chain(signed, prepared, expected.model_hash, out)
    return ReceiptReport(signed, out, expected.missing + unchecked)


def asked(cfg: AskConfig, expected: Expected, signed: SignedReceipt) -> Asked:
    """The request this client made, as a receipt must name it; where the client has no model files,
    with the receipt's own prompt and stop tokens (``Expected.missing`` says so)."""
    from node.client.receipt_check import Asked

    prompt = signed.request.prompt if expected.prompt is None else expected.prompt
    stops = signed.request.stop_tokens if expected.stop_tokens is None else expected.stop_tokens
    return Asked(prompt, cfg.params, cfg.seed, cfg.max_new_tokens, () if cfg.ignore_eos else stops)


def save_receipt(signed: SignedReceipt, out: Path) -> None:
    from node.client.http import ClientError

    try:
        out.write_text(signed.dumps() + "\n")
    except OSError as exc:
        raise ClientError(f"cannot write the receipt to {out}: {exc}") from exc


def _check_chain(
    signed: SignedReceipt, prepared: Preparation, model_hash: bytes | None, out: Path | None
) -> tuple[str, ...]:
    """The on-chain checks; () when done, else the line saying why they could not be."""
    from node.chain import ChainError
    from node.chain.receipts import ReceiptError
    from node.client.receipt_check import check_on_chain

    try:
        check_on_chain(signed, prepared.chain(), model_hash)
    except ReceiptError as exc:  # checked, and wrong
        if out is None:
            raise
        raise ReceiptError(f"{exc} (the receipt is saved to {out})") from exc
    except ChainError as exc:  # not checked: no chain answers, no deployment recorded, ...
        return (f"the operator's registration and the receipt's freshness on chain ({exc})",)
    return ()


def check_receipt(summary: dict[str, Any], cfg: AskConfig) -> str:
    """``verify_receipt``'s report as the lines `ask` prints ("" when the node is not bonded)."""
    return "\n".join(verify_receipt(summary, cfg).lines())
