"""A draft model with a frequency-ranked sub-vocabulary head, for a target with a large vocabulary.

With SmolLM2's 49,152-token vocabulary the LM head dominates a small draft's cost: 49152 × 576 fp32
weights are 113 MB read per drafted token. FR-Spec (Zhao et al., "FR-Spec: Accelerating
Large-Vocabulary Language Models via Frequency-Ranked Speculative Sampling", 2025) restricts the
draft's head to the most frequent tokens. Here:

- the draft is a ``LlamaForCausalLM`` with a few decoder layers of the target's width;
- its input embedding is the target's own (read from the converted target at load time, so it
  is not shipped twice);
- its head scores only ``ids`` (the sub-vocabulary) and writes ``FILL_LOGIT`` elsewhere, so the
  draft still returns logits over the full vocabulary and every proposer works unchanged. Tokens
  outside the sub-vocabulary are never drafted; the target still verifies against its full
  distribution, so this costs acceptance, never exactness.

A draft directory holds ``config.json``, the tokenizer, ``draft.safetensors`` (decoder layers,
final norm, ``head.weight`` [S, d] and ``head.ids`` [S]) and ``specmarket_draft.json`` naming the
pair whose target supplies the embedding and that target's model hash.
"""

from __future__ import annotations

import json
from pathlib import Path

from verifier.errors import SpecmarketError

DRAFT_RECORD = "specmarket_draft.json"
DRAFT_WEIGHTS = "draft.safetensors"
EMBED_KEY = "model.embed_tokens.weight"
FILL_LOGIT = -1.0e4  # never wins an argmax against real logits, even with Gumbel noise (< 50)


class DraftLoadError(SpecmarketError):
    """A sub-vocabulary draft whose files or target embedding do not fit together."""


def is_subvocab_draft(path: Path) -> bool:
    return (Path(path) / DRAFT_RECORD).is_file()


def make_head(ids, weight, vocab_size: int):
    """The sub-vocabulary head module: hidden [..., d] -> logits [..., V]."""
    import torch

    class SubVocabHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("ids", ids.long())  # [S]
            self.weight = torch.nn.Parameter(weight)  # [S, d]
            self.vocab_size = vocab_size

        def forward(self, hidden):  # [..., d] -> [..., V]
            sub = hidden @ self.weight.T  # [..., S]
            out = sub.new_full((*sub.shape[:-1], self.vocab_size), FILL_LOGIT)
            out[..., self.ids] = sub
            return out

    return SubVocabHead()


def read_record(path: Path) -> dict:
    try:
        record = json.loads((Path(path) / DRAFT_RECORD).read_text())
    except (OSError, ValueError) as exc:
        raise DraftLoadError(f"{path / DRAFT_RECORD} is unreadable: {exc}") from exc
    if not isinstance(record, dict) or not {"pair", "target_model_hash"} <= set(record):
        raise DraftLoadError(f"{path / DRAFT_RECORD} lacks 'pair' or 'target_model_hash'")
    return record


def load_subvocab_draft(path: Path):
    """The draft in ``path`` as a ``LlamaForCausalLM`` (fp32) whose embedding is its target's."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from node.model.pairs import check_prepared, get_pair

    path = Path(path)
    record = read_record(path)
    target_dir = get_pair(record["pair"]).target
    prepared = check_prepared(target_dir)
    if prepared["model_hash"] != record["target_model_hash"]:
        raise DraftLoadError(
            f"draft {path} was trained for target 0x{record['target_model_hash'][:12]}, but {target_dir} is "
            f"0x{prepared['model_hash'][:12]}"
        )
    config = LlamaConfig.from_pretrained(path)
    model = LlamaForCausalLM(config)
    with safe_open(target_dir / "model.safetensors", framework="pt") as f:
        embed = f.get_tensor(EMBED_KEY)
    state = load_file(path / DRAFT_WEIGHTS)
    ids, head_weight = state.pop("head.ids"), state.pop("head.weight").float()
    state = {k: v.float() for k, v in state.items()}
    state[EMBED_KEY] = embed
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise DraftLoadError(f"draft {path}: missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}")
    model.lm_head = make_head(ids, head_weight, config.vocab_size)
    return model.to(torch.float32).eval()
