"""The prefix cache (node.model.prefix_cache) tells no client about another's prompt: the positions
an answer reports (``target_positions``) are those it takes with nothing cached, whatever the last
job left in the cache. Before (issue 40 §6), a client learnt from them how many of its prompt's
tokens the previous client's prompt began with: a secret system prompt could be read a token at a
time. The timing of the first chunk still shrinks with a hit (docs/threat-model.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio

from node.target.engine import CompletionRequest, Engine

SECRET = "The launch code, known to nobody but this client, is"
TOKENS = 3


@pytest.fixture(scope="module")
def cached_pair(real_pair):
    """SmolLM2-135M on the lean forward with every pass on the skinny kernel: shape-invariant, so its
    engine keeps prompt prefixes (as the packed qwen2.5-coder target does)."""
    from node.model.kernels import library
    from node.model.kernels.llama import LeanLlamaLM

    lean = LeanLlamaLM(real_pair.target.model, real_pair.target.name, library(), shape_invariant=True)
    return replace(real_pair, target=lean)


def positions(engine: Engine, prompt: str) -> int:
    request = CompletionRequest(prompt, max_tokens=TOKENS, temperature=0.0, seed=1, ignore_eos=True)
    return trio.run(engine.complete, request).stats["target_positions"]


def test_target_positions_never_tell_a_client_how_much_of_its_prompt_another_shared(cached_pair):
    probe = SECRET + " 4"  # a guess at the secret's next token: the more of it is shared, the more is cached
    cold = positions(Engine(cached_pair, model_name="t", gamma=4), probe)
    engine = Engine(cached_pair, model_name="t", gamma=4)
    positions(engine, SECRET + " 7")  # the victim's job: its prompt stays in the cache
    assert positions(engine, probe) == cold
    assert engine.prefixes.reused > 10  # the probe's job did start from the victim's cached prefix
