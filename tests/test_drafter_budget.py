"""Hostile drafters cannot slow a job by more than the bound (issue: hardening).

The attack: a drafter that answers every round with an *empty* draft just before the deadline.
It proposed no tokens, so it was never judged: it kept its exploration score and was always asked,
and four such identities shut honest drafters out, every token then costing a plain pass plus the
deadline. Now:

- an empty or short draft counts as the γ tokens the round offered, so the stalling peer is judged
  (and benched) like one that proposes nothing useful;
- a job asks at most one untried peer, beside the best judged ones;
- a job stops waiting for drafts once waiting has cost WAIT_BUDGET_SHARE of its time without
  paying for itself.

Each job-level test bounds the waiting that bought no token by a tenth of the job's wall time: for
stallers alone no draft token is accepted, so such a job is plain decoding plus that waiting, and
the bound is the issue's "≥ 0.9× plain decoding". Beside an honest drafter, whose accepted drafts
can pay for more waiting than that (the wait budget only stops a job slower than plain decoding),
a job may instead show that bound directly: its wall time against plain decoding estimated from
its own measured target passes. The side-by-side ratio against the same requests
decoded plainly on the same target once the drafters are gone (medians) is printed, not asserted:
on this 2-core machine two runs of the same job differ by up to 20 %. Jobs are 320 tokens, so the
half deadline of trial a staller gets is a few percent of a job, as 100 ms is on the real target. Against a real target
process with real drafter peers on loopback.
"""

from __future__ import annotations

import time

import pytest
import trio

from market.policy import Policy, PolicyConfig
from market.registry import Registry
from node.target.engine import Engine, TimedModel
from node.target.rounds import MarketProposer
from tests import netutil
from tests.netutil import complete, http_json, start_drafter, start_target, wait_for_drafters
from verifier.params import SamplingParams
from verifier.proposal import EMPTY

pytestmark = pytest.mark.slow(seconds=30)  # scheduled first (tests/conftest.py)

DEADLINE_MS = 60
STALL_MS = 50  # just under the deadline
MAX_TOKENS = 320  # long enough that one deadline is a few percent of the job, as on a real target
PROMPT = "def parse_args(argv):\n"
STALLERS = 4
REPEATS = 3
BOUND = 0.9  # the issue's: hostile drafters cost at most a tenth of a job


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    deadline = ("--draft-deadline-ms", str(DEADLINE_MS))
    node = start_target(tmp_path_factory.mktemp("budget"), *deadline, "--max-drafters", "8")
    yield node
    assert node.stop() == 0, node.log()[-3000:]


def _stallers(portal, tmp_path, target) -> list:
    bootstrap = target.lines["multiaddr"][0]
    return [
        netutil.InProcessDrafter(portal, tmp_path, bootstrap, "stall", name=f"stall{i}", slow_ms=STALL_MS)
        for i in range(STALLERS)
    ]


def _jobs(http: str, seeds) -> list[dict]:
    return [complete(http, PROMPT, seed=s, max_tokens=MAX_TOKENS, ignore_eos=True)["specmarket"] for s in seeds]


def _median_wall(jobs: list[dict]) -> float:
    walls = sorted(job["stats"]["wall_seconds"] for job in jobs)
    return walls[len(walls) // 2]


def _plain_wall(http: str) -> float:
    """Plain decoding of the same requests on the same target, once no drafter is left."""
    deadline = time.monotonic() + 30
    while http_json(f"{http}/health")["drafters"]:
        assert time.monotonic() < deadline, "drafters still listed"
        time.sleep(0.1)
    plain = _jobs(http, range(REPEATS))
    assert all(job["stats"]["draft_tokens_proposed"] == 0 for job in plain)
    return _median_wall(plain)


def _report(label: str, jobs: list[dict], plain_s: float) -> float:
    ratio = plain_s / _median_wall(jobs)
    stops = [job["stats"]["draft_budget_stopped_at_round"] for job in jobs]
    wasted = [job["stats"]["draft_wasted_wait_seconds"] for job in jobs]
    print(f"{label}: {ratio:.2f}x plain decoding ({plain_s:.3f} s median); budget stopped at rounds {stops}")
    print(f"{label}: wasted waiting {wasted} s")
    return ratio


def test_stalling_drafters_alone_cost_at_most_a_tenth_succeeds(portal, target, tmp_path):
    http = target.lines["http"][0]
    stallers = _stallers(portal, tmp_path, target)
    try:
        wait_for_drafters(http, STALLERS)
        jobs = _jobs(http, range(REPEATS))
    finally:
        for d in stallers:
            d.stop()
    assert all(job["stats"]["draft_budget_stopped_at_round"] >= 0 for job in jobs)  # each stopped waiting
    assert all(job["stats"]["draft_tokens_accepted"] == 0 for job in jobs)
    _report("stallers alone", jobs, _plain_wall(http))
    for job in jobs:  # no draft token was accepted: the job is plain decoding plus its waiting
        assert job["stats"]["draft_wait_seconds"] <= (1 - BOUND) * job["stats"]["wall_seconds"], job["stats"]


def test_stalling_drafters_beside_an_honest_one_cost_at_most_a_tenth_succeeds(portal, target, tmp_path):
    http = target.lines["http"][0]
    honest = start_drafter(tmp_path, target.lines["multiaddr"][0], "honest", "honest")  # its own process
    stallers = _stallers(portal, tmp_path, target)
    try:
        wait_for_drafters(http, STALLERS + 1)
        jobs = _jobs(http, range(REPEATS + STALLERS))  # every staller gets its untried slot once
        rows = http_json(f"{http}/health")["drafters"]
    finally:
        for d in [honest, *stallers]:
            d.stop()
    honest_id = honest.lines["multiaddr"][0].rsplit("/", 1)[-1]
    assert rows[honest_id]["lifetime_proposed"] > 0  # the honest drafter was asked, beside the stallers
    _report("stallers beside an honest drafter", jobs[-REPEATS:], _plain_wall(http))
    for job in jobs:  # waiting that bought no token (the stallers' rounds, and the honest misses)...
        stats = job["stats"]
        wasted_ok = stats["draft_wasted_wait_seconds"] <= (1 - BOUND) * stats["wall_seconds"]
        # ...or, where the honest drafts paid for more than that waiting, the job itself is at least
        # BOUND x plain decoding by its own measured target passes (plain_estimate_seconds counts
        # passes only, not the serving loop's per-token overhead: it errs towards plain being faster)
        assert wasted_ok or stats["plain_estimate_seconds"] >= BOUND * stats["wall_seconds"], stats


def test_an_empty_draft_counts_as_the_tokens_it_did_not_offer_succeeds():
    """A peer answering 16 rounds of γ = 4 with nothing is judged (64 offered tokens) and benched;
    it used to stay unjudged forever with proposed = 0."""
    now = [0.0]
    registry, policy = Registry(clock=lambda: now[0]), Policy(PolicyConfig(), clock=lambda: now[0])
    registry.upsert("staller", ["/ip4/127.0.0.1/tcp/1"])
    for _ in range(16):
        registry.record_draft("staller", 0, 0, 0.095, offered=4)
        policy.update(registry, "staller")
    stats = registry.stats("staller")
    assert policy.is_benched(stats) and "offered tokens" in stats.bench_reason


def test_a_job_asks_at_most_one_untried_peer_beside_the_best_judged_succeeds():
    registry, policy = Registry(), Policy(PolicyConfig())
    for peer in ("good", "new1", "new2", "new3", "new4"):
        registry.upsert(peer, [])
    for _ in range(20):
        registry.record_draft("good", 4, 3, 0.01, offered=4)  # judged: 80 offered tokens
    assert policy.select(registry, 5) == ["good", "new1"]
    assert policy.select(registry, 1) == ["good"]
    registry.record_job("new1")
    assert policy.select(registry, 5) == ["good", "new2"]  # the least tried goes next
    fresh = Registry()
    for peer in ("a", "b", "c"):
        fresh.upsert(peer, [])
    assert len(policy.select(fresh, 3)) == 1  # nothing judged yet: one untried peer per job


class MeasuredPasses:
    """A job's measured target passes, as the engine's TimedModel reports them: the prefill, then
    one-position passes of ``plain_s`` each (None: no such pass yet)."""

    def __init__(self, prefill_s: float, plain_s: float | None) -> None:
        self.pass_seconds, self._plain_s = [prefill_s], plain_s

    def plain_pass_s(self) -> float | None:
        return self._plain_s


def _proposer(plain_pass_s: float | None, prefill_alone: bool = False) -> MarketProposer:
    """A job's proposer with no drafters, a 60 ms deadline, a 10 ms prefill and these plain passes
    (by default every round a draft round: the budget is about those)."""
    proposer = MarketProposer(
        [], job="j", params=SamplingParams(), seed=0, gamma=4, deadline_s=DEADLINE_MS / 1000,
        registry=Registry(), policy=Policy(), prefill_alone=prefill_alone,
    )  # fmt: skip
    proposer.watch_passes(MeasuredPasses(0.01, plain_pass_s))
    return proposer


def _budget(elapsed_s: float, wasted_s: float, plain_pass_s: float | None, tokens: int = 100) -> bool | None:
    """The wait budget's verdict for a job ``elapsed_s`` in, ``tokens`` emitted, 60 ms deadline."""
    proposer = _proposer(plain_pass_s)
    proposer.rounds, proposer.wasted_s = 20, wasted_s
    now = time.perf_counter()
    proposer.started = now - elapsed_s
    return proposer._over_budget(now, tokens)


def test_a_job_slower_than_plain_by_more_than_the_allowance_stops_drafting_succeeds():
    # plain: 0.01 + 100 x 0.005 = 0.51 s; allowance: 5 % of the job + half the 60 ms deadline
    assert _budget(elapsed_s=0.80, wasted_s=0.0, plain_pass_s=0.005) is True  # whatever its drafts bought
    assert _budget(elapsed_s=0.55, wasted_s=0.0, plain_pass_s=0.005) is False  # within the allowance
    assert _budget(elapsed_s=0.45, wasted_s=0.3, plain_pass_s=0.005) is False  # faster than plain
    assert _budget(elapsed_s=0.55, wasted_s=0.3, plain_pass_s=0.005) is True  # wasted, and slower


def test_without_any_plain_pass_known_a_round_alone_measures_one_succeeds():
    """Not only after wasted waiting: a job whose drafts all pay may still be slower than plain
    decoding (drafts paced just before each deadline), and only a plain pass tells."""
    assert _budget(elapsed_s=5.0, wasted_s=0.0, plain_pass_s=None) is None  # one round alone, to measure
    assert _budget(elapsed_s=5.0, wasted_s=1.0, plain_pass_s=None) is None


def test_a_job_whose_drafts_all_pay_is_still_judged_against_plain_decoding_succeeds(pair):
    """The oracle-paced drafter: correct drafts (it drafts with the target's own model), each
    answered late enough that the job runs slower than plain decoding. No round is wasted and
    none is decoded alone, so the job measures no plain pass of its own; the budget used to wait
    for one forever (about 0.55x plain decoding with one-token drafts). The engine measures a plain
    step when it starts, and every job's timed target carries it until it measures its own."""
    engine = Engine(pair, model_name="t", gamma=4)
    assert engine.plain_pass_s > 0
    passes = TimedModel(pair.target.fork(), engine.plain_pass_s)
    passes.extend([1, 2, 3, 4, 5, 6])  # the prefill
    passes.extend([7, 8, 9, 10, 11])  # a verification pass: every round had a draft
    assert passes.measured_plain_pass_s() is None and passes.plain_pass_s() == engine.plain_pass_s
    proposer = _proposer(plain_pass_s=None)
    proposer.watch_passes(passes)
    proposer.rounds, proposer.wasted_s = 20, 0.0  # 20 rounds, all paid for by accepted drafts
    plain_s = proposer._plain_seconds(100)
    now = time.perf_counter()
    proposer.started = now - (2 * plain_s + DEADLINE_MS / 1000)  # twice plain decoding's time, and more
    assert proposer._over_budget(now, 100) is True
    passes.extend([12])  # a round decoded alone: the job's own measurement takes over
    assert passes.plain_pass_s() == passes.measured_plain_pass_s() == passes.pass_seconds[-1]


def test_plain_estimate_counts_the_whole_output_of_a_job_the_budget_stopped_succeeds():
    """The job's stats estimate plain decoding of all its output tokens: not the prompt, not only
    up to the last round's k, and the rounds decoded alone after the budget stopped count too."""
    prompt, output = [7] * 9, list(range(12))
    proposer = _proposer(plain_pass_s=0.005)
    trio.run(proposer._round, prompt, 0, 4)  # a drafted round (no drafter answers)
    proposer.started -= 10.0  # the job has run far slower than plain decoding: the budget stops it
    trio.run(proposer._round, [*prompt, *output[:1]], 1, 4)
    for k in (2, 5, 8):  # decoded alone: no hop into the trio loop
        proposer.propose([*prompt, *output[:k]], start=k, gamma=4, params=SamplingParams(), seed=0)
    proposer.finish([*prompt, *output])
    stats = proposer.timing()
    assert (stats["draft_rounds"], stats["draft_budget_stopped_at_round"]) == (5, 1)
    assert stats["plain_estimate_seconds"] == round(0.01 + 0.005 * len(output), 4)


def test_the_prompt_round_is_sent_and_prefilled_alone_succeeds():
    """PREFILL_ALONE: the first round sends the prompt and returns at once, without a draft; it is no
    draft round (no record, no wait judged); the next round asks for drafts."""
    proposer = _proposer(plain_pass_s=0.005, prefill_alone=True)
    prompt = [7] * 9
    assert trio.run(proposer._round, prompt, 0, 4) is EMPTY
    assert not proposer.send_only and (proposer.rounds, proposer.empty_rounds, proposer.records) == (0, 0, [])
    trio.run(proposer._round, [*prompt, 1], 1, 4)  # no drafter answers: a draft round decoded alone
    proposer.finish([*prompt, 1, 2])
    assert (proposer.rounds, [r.k for r in proposer.records]) == (1, [1])
