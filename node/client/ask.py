"""`specmarket ask`: one completion from a target node, over HTTP or libp2p, with its receipt checked.

With ``chat`` the prompt is sent as one user message (after an optional system message) to
``/v1/chat/completions``, so the target applies its model's chat template; this needs an HTTP
target, since the libp2p generation protocol carries plain prompts.

The answer's receipt (when the node is bonded) is verified before it is shown or saved: the
signature, its hashes, that it covers exactly the tokens received and the request made (the prompt
tokenized here, with the expected model's tokenizer), and on chain that it was signed for the
trusted deployment by a registered, active operator of the expected model, recently
(node/client/receipt_check.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.chain.anvil import DEFAULT_RPC
from node.chain.deployment import DEFAULT_DEPLOYMENTS_DIR
from node.model.pairs import DEFAULT_PAIR, get_pair
from p2p import safe_json
from verifier.errors import InvalidParams
from verifier.noise import MAX_SEED

HTTP_SCHEMES = ("http://", "https://")


@dataclass(frozen=True)
class AskConfig:
    """Every default of `specmarket ask`, written once (the CLI reads them from here)."""

    prompt: str
    target: str  # the target's multiaddr (/ip4/.../p2p/...) or http:// URL
    seed: int | None = None  # None: the target draws one and reports it
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    receipt_out: Path | None = None  # save the verified receipt here
    chat: bool = False  # send the prompt as a user message through the model's chat template
    system: str | None = None  # with chat: a system message before it
    # what a receipt is checked against: the model the target must be bonded for, and the deployment
    pair: str = DEFAULT_PAIR
    target_model: Path | None = None  # default: the pair's target
    rpc: str = DEFAULT_RPC
    deployments: Path = DEFAULT_DEPLOYMENTS_DIR

    def __post_init__(self) -> None:
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise InvalidParams(f"--seed must be in [0, {MAX_SEED}], got {self.seed}")
        if self.system is not None and not self.chat:
            raise InvalidParams("--system needs --chat")
        if self.chat and not self.over_http:
            raise InvalidParams("--chat needs an http:// target (the libp2p protocol carries plain prompts)")

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat: the system message (if any), then the prompt as the user's message."""
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        return [*system, {"role": "user", "content": self.prompt}]

    @property
    def over_http(self) -> bool:
        return self.target.startswith(HTTP_SCHEMES)


def ask(cfg: AskConfig, on_text: Callable[[str], None]) -> tuple[dict[str, Any], str]:
    """Stream one completion; return its summary (job, tokens, seed, stats, credits, receipt) and
    a line about the receipt ("" when the node is not bonded)."""
    if cfg.over_http:
        from node.client.http import stream_chat, stream_completion

        sampling = {"max_tokens": cfg.max_new_tokens, "seed": cfg.seed, "temperature": cfg.temperature}
        if cfg.chat:
            summary = stream_chat(cfg.target, cfg.messages, **sampling, top_p=cfg.top_p, on_text=on_text)
        else:
            summary = stream_completion(cfg.target, cfg.prompt, **sampling, top_p=cfg.top_p, on_text=on_text)
    else:
        import trio

        summary = trio.run(_ask_p2p, cfg, on_text)
    return summary, check_receipt(summary, cfg)


async def _ask_p2p(cfg: AskConfig, on_text: Callable[[str], None]) -> dict[str, Any]:
    from node.client.p2p import ask_p2p, make_request

    request = make_request(cfg.prompt, cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.seed)
    done = await ask_p2p(cfg.target, request, on_text)
    return {
        "job": done.job,
        "tokens": list(done.tokens),
        "seed": done.seed,
        "stats": done.stats,
        "credits": done.credits,
        "receipt": safe_json.loads(done.receipt, "the receipt") if done.receipt else None,
    }


def check_receipt(summary: dict[str, Any], cfg: AskConfig) -> str:
    """Verify the answer's receipt (node/client/receipt_check.py) and save it to ``cfg.receipt_out``.
    Returns a line for the user ("" when the node is not bonded)."""
    from node.chain.receipts import ReceiptError, SignedReceipt

    data, out = summary.get("receipt"), cfg.receipt_out
    if data is None:
        if out is not None:
            raise ReceiptError("the target sent no receipt (it is not bonded), so there is nothing to save")
        return ""
    signed = SignedReceipt.from_json(data)
    signed.check()
    _check_against_request_and_chain(signed, summary, cfg)
    if out is not None:
        out.write_text(signed.dumps() + "\n")
    saved = f", saved to {out}" if out is not None else ""
    return f"[receipt signed by operator {signed.receipt.operator} on chain {signed.domain.chain_id}{saved}]"


def _check_against_request_and_chain(signed, summary: dict[str, Any], cfg: AskConfig) -> None:
    from transformers import AutoTokenizer

    from node.chain.admin import bond_client
    from node.chain.config import ChainConfig
    from node.client.receipt_check import Asked, check_covers, check_on_chain
    from node.model.decoding import encode_prompt
    from node.model.loading import model_hash
    from node.target.chat import chat_prompt
    from verifier.params import SamplingParams

    model_dir = get_pair(cfg.pair).target_dir(cfg.target_model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    prompt = chat_prompt(tokenizer, cfg.messages) if cfg.chat else encode_prompt(tokenizer, cfg.prompt)
    asked = Asked(tuple(prompt), SamplingParams(cfg.temperature, 0, cfg.top_p), cfg.seed, cfg.max_new_tokens)
    check_covers(signed, asked, summary.get("tokens", []))
    check_on_chain(signed, bond_client(ChainConfig(cfg.rpc, cfg.deployments)), model_hash(model_dir))
