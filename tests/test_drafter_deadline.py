"""The promise to an honest drafter whose draft is slow beside the target: it is never benched for it.

The target waits ``--draft-deadline-ms`` for an answer to each round; a late answer misses its round,
and two misses in a row bench the drafter (market.policy). Beside the exact target the 0.5B draft takes
about a third of a target step a token, so a whole block of γ tokens can take longer than the deadline
of two plain steps. The target states its deadline in the open (``/specmarket/draft/3.1.0``), and an
honest drafter answers an advance with the tokens it has drafted by ``ANSWER_SHARE`` of it
(node.drafter.session, "Answers in time"). Here a real target process (the tiny pair) and an honest
in-process drafter whose every token takes ``TOKEN_S``: a block of γ tokens takes 2× the deadline.
"""

from __future__ import annotations

import json
import time

import pytest

from node.drafter import peer
from node.model.decoding import GenerateConfig, generate
from tests.netutil import InProcessDrafter, complete, http_json, start_target, wait_for_drafters

pytestmark = pytest.mark.slow(seconds=30)

DEADLINE_MS = 300
TOKEN_S = 0.1  # γ = 6 tokens: 0.6 s, twice the deadline; by the answer's clock (0.24 s), 2 or 3 tokens
PROMPTS = ("def parse(self, text):\n", "class Cache:\n    def __init__(")
MAX_TOKENS = 24


class SlowHonest:
    """The honest proposer, ``TOKEN_S`` slower a token (a bigger draft on a slower machine)."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name

    def propose(self, context, **kwargs):
        time.sleep(TOKEN_S)
        return self.inner.propose(context, **kwargs)


@pytest.fixture
def slow_drafts(monkeypatch):
    honest = peer.make_proposer
    monkeypatch.setattr(peer, "make_proposer", lambda *a: SlowHonest(honest(*a)))


def test_an_honest_drafter_slower_than_a_block_per_deadline_answers_in_time_and_is_never_benched(
    portal, tmp_path, pair, slow_drafts
):
    target = start_target(tmp_path, "--draft-deadline-ms", str(DEADLINE_MS))
    try:
        http = target.lines["http"][0]
        # every block as long as γ allows: without the answer's clock each one would miss its round
        drafter = InProcessDrafter(portal, tmp_path, target.lines["multiaddr"][0], "honest", min_confidence=0.0)
        try:
            wait_for_drafters(http, 1)
            for seed, prompt in enumerate(PROMPTS):
                answer = complete(http, prompt, seed=seed, max_tokens=MAX_TOKENS)
                plain = generate(GenerateConfig(prompt, seed=seed, max_new_tokens=MAX_TOKENS, drafter="none"), pair)
                assert answer["specmarket"]["tokens"] == plain["tokens"]
            stats = http_json(f"{http}/health")["drafters"][drafter.peer_id]
        finally:
            drafter.stop()
    finally:
        assert target.stop() == 0, target.log()[-3000:]
    assert stats["timeouts"] == 0 and stats["bench_count"] == 0, json.dumps(stats)
    assert stats["jobs"] == len(PROMPTS) and stats.get("credited_tokens", 0) > 0, stats
