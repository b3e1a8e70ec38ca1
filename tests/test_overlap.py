"""Drafting overlaps verification, end to end: a real `specmarket target` process and real drafter
peers (in this process) over libp2p on loopback.

Every output is compared token for token with plain decoding for the same seed. The job stats show
what the overlap did (early drafts used, stale ones ignored), so the equalities are not vacuous.
"""

from __future__ import annotations

import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from node.model.decoding import GenerateConfig, generate
from tests.netutil import InProcessDrafter, complete, http_json, start_target, wait_for_drafters
from verifier.params import SamplingParams

PROMPTS = ["import os\n\n", "def parse(self, text):\n", "class Cache:\n    def __init__("]
MAX_TOKENS = 48
GENEROUS_DEADLINE_MS = 1000  # correctness never depends on it; honest drafts come in well before it
SHORT_DEADLINE_MS = 200
SLOW_MS = 3000  # the slow drafter answers far past the short deadline
# the longest a round may take beyond the deadline: settling, the advance sends and trio waking up on
# a loaded 2-core machine (a round that waited for a slow drafter's answer would take 3000 ms)
WAIT_SLACK_MS = 150
# early drafts used, measured on the shipped pair (γ = 4, 48 tokens a job, the three prompts once, 8
# runs on 2 cores): T = 0: 12 to 18 hits in 37 rounds (one run before the fix of p2p/secure.py: 4);
# T = 0.8: 2 to 6 in 56. Whether a hit is counted depends on timing (an advance read before the
# early draft went out is answered from the path instead), so after the three prompts jobs go on,
# the prompts again with new seeds, until the bound is reached or MAX_JOBS have run.
MIN_EARLY_HITS = {0.0: 8, 0.8: 2}
MAX_JOBS = 9


def reference(pair, prompt: str, seed: int, temperature: float = 1.0) -> list[int]:
    params = SamplingParams(temperature=temperature)
    return generate(GenerateConfig(prompt, seed, MAX_TOKENS, params, drafter="none"), pair)["tokens"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    deadline = ("--draft-deadline-ms", str(GENEROUS_DEADLINE_MS))
    node = start_target(tmp_path_factory.mktemp("overlap"), *deadline, "--max-drafters", "4")
    yield node
    assert node.stop() == 0, node.log()[-3000:]


@contextmanager
def drafters(portal, node, tmp, *strategies: str, **cfg) -> Iterator[list[InProcessDrafter]]:
    """Drafter peers of ``strategies`` in the market of ``node`` (and only they), stopped after."""
    http = node.lines["http"][0]
    started = [
        InProcessDrafter(portal, tmp, node.lines["multiaddr"][0], s, f"{s}{i}", **cfg) for i, s in enumerate(strategies)
    ]
    try:
        health = wait_for_drafters(http, len(started))
        assert sorted(health["drafters"]) == sorted(d.peer_id for d in started)
        yield started
    finally:
        for d in started:
            d.stop()
        wait_until_forgotten(http, [d.peer_id for d in started])


def wait_until_forgotten(http: str, peers: list[str], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while set(peers) & set(http_json(f"{http}/health")["drafters"]):
        assert time.monotonic() < deadline, "the target still lists drafters that withdrew"
        time.sleep(0.1)


def sitting_out(node) -> list[str]:
    """The target's log lines on drafters that sat a job out, or whose session failed."""
    return [line for line in node.log().splitlines() if "sits the job out" in line or "failed" in line][-10:]


def ask(node, prompt: str, seed: int, temperature: float = 1.0) -> dict:
    return complete(node.lines["http"][0], prompt, seed=seed, max_tokens=MAX_TOKENS, temperature=temperature)[
        "specmarket"
    ]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_an_overlapping_drafter_changes_nothing_but_the_wait(portal, target, tmp_path, pair, temperature):
    hits = []
    with drafters(portal, target, tmp_path, "honest") as (honest,):
        for seed in range(MAX_JOBS):
            prompt = PROMPTS[seed % len(PROMPTS)]
            ext = ask(target, prompt, seed, temperature)
            assert ext["tokens"] == reference(pair, prompt, seed, temperature), prompt
            stats = ext["stats"]
            assert "draft_rounds" in stats, ("the job ran without drafts", sitting_out(target))
            # after every rejection the drafter answered the new k in time: no round went without a draft
            # but its rounds on probation (unverified, until its first matched token: the first job's)
            assert stats["draft_empty_rounds"] == stats["draft_probation_rounds"] <= (3 if seed == 0 else 0), stats
            assert stats["draft_answers"] + stats["draft_early_hits"] == stats["draft_rounds"], stats
            assert sum(ext["credits"].values()) == stats["draft_tokens_accepted"] > 0
            assert stats["draft_round_trip_ms_per_answer"] >= stats["draft_transport_ms_per_answer"] >= 0
            assert (
                stats["target_pass_ms_per_round"] > 0
                and stats["draft_wait_ms_max"] <= GENEROUS_DEADLINE_MS + WAIT_SLACK_MS
            )
            check_round_records(target, ext)
            hits.append(stats["draft_early_hits"])
            if seed + 1 >= len(PROMPTS) and sum(hits) >= MIN_EARLY_HITS[temperature]:
                break
        health = http_json(f"{target.lines['http'][0]}/health")["drafters"][honest.peer_id]
    assert health["timeouts"] == 0 and health["errors"] == 0, health
    assert sum(hits) >= MIN_EARLY_HITS[temperature], hits


def check_round_records(node, ext: dict) -> None:
    """The job's rounds (``GET /api/jobs/{id}/rounds``) add up to its stats."""
    http, stats = node.lines["http"][0], ext["stats"]
    rounds = http_json(f"{http}/api/jobs/{ext['job']}/rounds")["rounds"]
    kinds = [r["kind"] for r in rounds]
    probation = stats["draft_probation_rounds"]  # the drafter's one answer in each was only measured
    assert len(rounds) == stats["draft_rounds"] and kinds.count("probation") == probation, kinds
    assert kinds.count("alone") + probation == stats["draft_empty_rounds"], kinds
    drafts = stats["draft_early_hits"] + stats["draft_answers"]
    assert kinds.count("early") + kinds.count("answer") + probation == drafts, kinds
    if not probation:
        assert kinds.count("early") == stats["draft_early_hits"] and kinds.count("answer") == stats["draft_answers"]
    assert sum(r["drafted"] for r in rounds) == stats["draft_tokens_proposed"]
    assert sum(r["accepted"] for r in rounds) == stats["draft_tokens_accepted"]
    assert [r["k"] for r in rounds] == sorted({r["k"] for r in rounds}), "one record per round, in order"
    # the prompt's round (PREFILL_ALONE) is sent and prefilled without waiting: no draft round, the
    # first one asks at k = 1 (and a last round with room for no draft token asks nobody either)
    assert rounds[0]["k"] == 1 and stats["target_passes"] in (len(rounds) + 1, len(rounds) + 2), (rounds[0], stats)
    for r in rounds:
        assert 0 <= r["accepted"] <= r["drafted"] and r["verify_ms"] > 0 and r["wait_ms"] >= 0, r
        assert r["draft_ms"] >= 0 and r["transport_ms"] >= 0 and (r["kind"] == "answer" or r["draft_ms"] == 0), r
    with pytest.raises(urllib.error.HTTPError, match="404"):
        http_json(f"{http}/api/jobs/no-such-job/rounds")


def test_without_overlap_no_early_drafts(portal, target, tmp_path, pair):
    with drafters(portal, target, tmp_path, "honest", overlap=False):
        ext = ask(target, PROMPTS[0], 0, 0.0)
    assert ext["tokens"] == reference(pair, PROMPTS[0], 0, 0.0)
    stats = ext["stats"]
    assert stats["draft_early_hits"] == stats["draft_early_stale"] == 0, stats
    assert stats["draft_answers"] == stats["draft_rounds"], stats  # a new drafter's: its probation rounds too
    assert stats["draft_empty_rounds"] == stats["draft_probation_rounds"] <= 3, stats


def test_early_drafts_with_a_forged_basis_are_never_used_or_credited(portal, target, tmp_path, pair):
    """The forged drafter drafts honestly but claims a wrong token at the first basis position and
    sends empty answers: were the basis not checked, its early drafts would be used and credited."""
    http = target.lines["http"][0]
    with drafters(portal, target, tmp_path, "forged") as (forged,):
        stale = 0
        for seed, prompt in enumerate(PROMPTS[:2]):
            ext = ask(target, prompt, seed, 0.0)
            assert ext["tokens"] == reference(pair, prompt, seed, 0.0)
            # its empty answers count as offered tokens: once judged it is benched, and a later job
            # runs without it (and without the drafting stats)
            stats = {"draft_early_hits": 0, "draft_rounds": 0, "draft_empty_rounds": 0, "draft_early_stale": 0}
            stats |= ext["stats"]
            assert stats["draft_early_hits"] == 0 and stats["draft_tokens_accepted"] == 0, stats
            assert ext["credits"] == {} and stats["draft_empty_rounds"] == stats["draft_rounds"], stats
            stale += stats["draft_early_stale"]
        row = http_json(f"{http}/health")["drafters"][forged.peer_id]
    assert stale > 0  # its early drafts came, and were judged stale
    assert row["lifetime_proposed"] == 0 and row["credited_tokens"] == 0, row


def test_a_flooding_drafter_is_dropped_and_changes_nothing(portal, target, tmp_path, pair):
    http = target.lines["http"][0]
    with drafters(portal, target, tmp_path, "flood") as (flood,):
        ext = ask(target, PROMPTS[1], 3, 0.8)
        row = http_json(f"{http}/health")["drafters"][flood.peer_id]
    assert ext["tokens"] == reference(pair, PROMPTS[1], 3, 0.8)
    assert row["errors"] >= 1 and "flooding" in row["last_error"], row
    assert "flooding" in target.log()
    assert ext["stats"]["draft_empty_rounds"] >= ext["stats"]["draft_rounds"] - 1  # dropped at its first draft


@pytest.fixture(scope="module")
def short_target(tmp_path_factory):
    deadline = ("--draft-deadline-ms", str(SHORT_DEADLINE_MS))
    node = start_target(tmp_path_factory.mktemp("short"), *deadline, "--max-drafters", "4")
    yield node
    assert node.stop() == 0, node.log()[-3000:]


def test_with_overlap_a_slow_drafter_still_costs_at_most_the_deadline(portal, short_target, tmp_path, pair):
    with drafters(portal, short_target, tmp_path, "slow", slow_ms=SLOW_MS):
        ext = ask(short_target, PROMPTS[0], 4, 0.0)
    assert ext["tokens"] == reference(pair, PROMPTS[0], 4, 0.0)
    stats = ext["stats"]
    assert stats["draft_wait_ms_max"] <= SHORT_DEADLINE_MS + WAIT_SLACK_MS, stats
    # it misses two deadlines and is dropped for the job: the later rounds wait for nobody
    assert stats["draft_wait_seconds"] * 1000 <= 2 * SHORT_DEADLINE_MS + stats["draft_rounds"] * WAIT_SLACK_MS / 10, (
        stats
    )
    assert stats["draft_early_hits"] == 0 and stats["draft_empty_rounds"] == stats["draft_rounds"], stats
