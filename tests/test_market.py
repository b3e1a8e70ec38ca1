"""The market package: drafter registry, bench/selection policy and the SQLite ledger."""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest

from market import DrafterStats, Ledger, LedgerEntry, MarketError, Policy, PolicyConfig, Registry
from market.ledger import SCHEMA_VERSION, Pay
from verifier.errors import SpecmarketError


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def reg(clock: FakeClock) -> Registry:
    return Registry(clock)


@pytest.fixture
def policy(clock: FakeClock) -> Policy:
    return Policy(PolicyConfig(), clock)


def _draft(reg: Registry, policy: Policy, peer: str, proposed: int, matched: int, latency_s: float = 0.01) -> None:
    reg.record_draft(peer, proposed, matched, latency_s)
    policy.update(reg, peer)


# -- registry ----------------------------------------------------------------------------


def test_upsert_discovers_once_and_refreshes(reg: Registry, clock: FakeClock) -> None:
    assert reg.upsert("p1", ["/ip4/1.2.3.4/tcp/1"]) is True
    clock.advance(5)
    assert reg.upsert("p1", ["/ip4/5.6.7.8/tcp/2"]) is False
    info = reg.info("p1")
    assert (info.addrs, info.first_seen, info.last_seen) == (("/ip4/5.6.7.8/tcp/2",), 1000.0, 1005.0)
    assert "p1" in reg and "p2" not in reg and len(reg) == 1


def test_prune_forgets_only_stale_peers(reg: Registry, clock: FakeClock) -> None:
    reg.upsert("old", [])
    reg.upsert("busy", [])
    clock.advance(50)
    reg.upsert("new", [])
    reg.record_draft("busy", 4, 2, 0.01)  # an answering peer counts as seen
    clock.advance(20)
    assert reg.prune(60) == ["old"]
    assert reg.peers() == ["busy", "new"]
    reg.forget("busy")
    reg.forget("never-known")  # no-op
    assert reg.peers() == ["new"]
    with pytest.raises(MarketError):
        reg.stats("busy")


def test_stats_arithmetic(reg: Registry) -> None:
    reg.upsert("p", [])
    s = reg.stats("p")
    assert s.match_rate == 0.5 and s.latency_ms is None
    reg.record_timeout("p")
    reg.record_error("p", "bad frame")
    assert (s.timeouts, s.errors, s.consecutive_failures, s.last_error) == (1, 1, 2, "bad frame")
    reg.record_draft("p", 8, 6, 0.050)
    reg.record_draft("p", 8, 2, 0.100)
    reg.record_accepted("p", 5)
    reg.record_job("p")
    assert (s.rounds, s.proposed, s.matched, s.accepted, s.jobs) == (2, 16, 8, 5, 1)
    assert s.consecutive_failures == 0
    assert s.match_rate == pytest.approx(9 / 18)
    assert s.latency_ms == pytest.approx(0.8 * 50 + 0.2 * 100)
    reg.record_draft("p", 4, 4, None)  # an early draft, there before the round asked: no latency sample
    assert s.latency_ms == pytest.approx(0.8 * 50 + 0.2 * 100) and (s.rounds, s.proposed, s.matched) == (3, 20, 12)
    assert (s.lifetime_proposed, s.lifetime_matched) == (20, 12)


def test_snapshot_is_json_ready(reg: Registry, clock: FakeClock) -> None:
    reg.upsert("p", ["/ip4/1.2.3.4/tcp/1"])
    reg.record_draft("p", 10, 4, 0.02)
    clock.advance(3)
    snap = json.loads(json.dumps(reg.snapshot()))
    row = snap["p"]
    assert row["proposed"] == 10 and row["matched"] == 4 and row["match_rate"] == pytest.approx(5 / 12, abs=1e-4)
    assert row["latency_ms"] == pytest.approx(20.0) and row["seen_ago_s"] == pytest.approx(3.0)
    assert row["benched"] is False and row["addrs"] == ["/ip4/1.2.3.4/tcp/1"]


@pytest.mark.parametrize(
    "call",
    [
        lambda r: r.record_draft("p", -1, 0, 0.01),
        lambda r: r.record_draft("p", 3, 4, 0.01),
        lambda r: r.record_draft("p", 3, 1, -0.5),
        lambda r: r.record_draft("p", 3, 1, float("nan")),
        lambda r: r.record_draft("p", 3.0, 1, 0.01),
        lambda r: r.record_accepted("p", -2),
        lambda r: r.record_draft("ghost", 1, 1, 0.01),
        lambda r: r.record_timeout("ghost"),
        lambda r: r.info("ghost"),
        lambda r: r.upsert("", []),
        lambda r: r.upsert("x" * 129, []),
        lambda r: r.upsert("q", "/ip4/1.2.3.4"),
        lambda r: r.prune(-1),
    ],
)
def test_registry_validation(reg: Registry, call) -> None:
    reg.upsert("p", [])
    before = reg.snapshot()
    with pytest.raises(MarketError) as exc:
        call(reg)
    assert isinstance(exc.value, SpecmarketError)
    assert reg.snapshot() == before  # a refused record changes nothing


# -- policy ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_tokens_to_judge": 0},
        {"min_match_rate": 1.0},
        {"min_match_rate": -0.1},
        {"max_consecutive_failures": 0},
        {"bench_base_s": 0.0},
        {"bench_base_s": 100.0, "bench_max_s": 50.0},
        {"bench_max_s": float("inf")},
        {"latency_budget_ms": float("nan")},
        {"explore_match_rate": 0.0},
    ],
)
def test_policy_config_validation(kwargs) -> None:
    with pytest.raises(MarketError):
        PolicyConfig(**kwargs)


def test_bench_duration_doubles_and_caps() -> None:
    cfg = PolicyConfig(bench_base_s=30.0, bench_max_s=600.0)
    assert [cfg.bench_duration(k) for k in (1, 2, 3, 5, 6, 10_000)] == [30.0, 60.0, 120.0, 480.0, 600.0, 600.0]


def test_never_matching_drafter_is_benched_retried_and_benched_longer(
    reg: Registry, policy: Policy, clock: FakeClock
) -> None:
    reg.upsert("bad", [])
    reg.upsert("good", [])
    for _ in range(7):  # 56 < 64 tokens: no verdict yet, and it is still explored
        _draft(reg, policy, "bad", 8, 0)
        _draft(reg, policy, "good", 8, 6)
    # nothing judged yet: one untried peer per job, the better record first (lifetime match rate)
    assert policy.select(reg, 2) == ["good"]
    _draft(reg, policy, "bad", 8, 0)  # 64 tokens, match rate 1/66 < 0.05
    _draft(reg, policy, "good", 8, 6)
    assert policy.eligible(reg) == ["good"] and policy.select(reg, 2) == ["good"]
    assert reg.stats("bad").benched_until == pytest.approx(clock() + 30.0)
    clock.advance(29.9)
    assert "bad" not in policy.select(reg, 2)
    clock.advance(0.2)  # bench over: a fresh trial, in the one untried slot beside the judged peer
    assert policy.select(reg, 2) == ["good", "bad"]
    assert reg.stats("bad").proposed == 0 and reg.stats("bad").lifetime_proposed == 64
    for _ in range(8):
        _draft(reg, policy, "bad", 8, 0)
    s = reg.stats("bad")
    assert s.bench_count == 2 and s.benched_until == pytest.approx(clock() + 60.0)
    assert policy.select(reg, 2) == ["good"]


def test_health_shows_a_benched_peer_the_window_its_bench_reason_judged(
    reg: Registry, policy: Policy, clock: FakeClock
) -> None:
    """A benched liar showed ``match_rate`` 0.5 (an emptied window's prior) beside ``bench_reason``
    "match rate 0.026 < 0.05": benching emptied the window at once. It is kept as judged until the
    bench ends, a stray late draft counting for the lifetime only; then the trial starts afresh."""
    reg.upsert("liar", [])
    for _ in range(8):
        _draft(reg, policy, "liar", 8, 0)
    row = reg.snapshot()["liar"]
    assert row["benched"] and row["bench_reason"] == "match rate 0.015 < 0.05 over 64 offered tokens"
    assert (row["match_rate"], row["offered"], row["matched"]) == (round(1 / 66, 4), 64, 0)
    assert f"match rate {row['match_rate']:.3f}" in row["bench_reason"]
    assert f"over {row['offered']} offered" in row["bench_reason"]
    reg.record_draft("liar", 8, 8, 0.01)  # a late draft of a round it was still in when benched
    reg.record_timeout("liar")
    row = reg.snapshot()["liar"]
    assert (row["offered"], row["matched"], row["consecutive_failures"]) == (64, 0, 0)
    assert (row["lifetime_proposed"], row["lifetime_matched"], row["timeouts"]) == (72, 8, 1)
    clock.advance(30.1)  # the bench is over: a fresh trial
    row = reg.snapshot()["liar"]
    assert not row["benched"] and (row["offered"], row["matched"], row["match_rate"]) == (0, 0, 0.5)
    assert "window_closed" not in row


def test_a_peer_benched_for_failures_shows_the_streak_it_was_benched_on(reg: Registry, policy: Policy) -> None:
    reg.upsert("slow", [])
    for _ in range(2):
        reg.record_timeout("slow")
        policy.update(reg, "slow")
    reg.record_error("slow", "a late stream reset")
    row = reg.snapshot()["slow"]
    assert row["benched"] and row["bench_reason"] == "2 consecutive timeouts/errors"
    assert row["consecutive_failures"] == 2 and row["errors"] == 1


def test_improved_drafter_stays_after_its_bench(reg: Registry, policy: Policy, clock: FakeClock) -> None:
    reg.upsert("p", [])
    for _ in range(8):
        _draft(reg, policy, "p", 8, 0)
    assert policy.eligible(reg) == []
    clock.advance(31)
    for _ in range(20):
        _draft(reg, policy, "p", 8, 5)
    assert policy.eligible(reg) == ["p"] and reg.stats("p").bench_count == 1


def test_consecutive_timeouts_bench(reg: Registry, policy: Policy) -> None:
    reg.upsert("slow", [])
    reg.record_timeout("slow")
    policy.update(reg, "slow")
    assert policy.eligible(reg) == ["slow"]
    reg.record_error("slow", "stream reset")
    policy.update(reg, "slow")
    assert policy.eligible(reg) == []
    assert "2 consecutive" in reg.stats("slow").bench_reason


def test_in_time_draft_resets_consecutive_failures(reg: Registry, policy: Policy) -> None:
    reg.upsert("flaky", [])
    for _ in range(5):
        reg.record_timeout("flaky")
        policy.update(reg, "flaky")
        _draft(reg, policy, "flaky", 4, 3)
        assert reg.stats("flaky").consecutive_failures == 0
    assert policy.eligible(reg) == ["flaky"] and reg.stats("flaky").timeouts == 5


def test_score_monotone_in_match_rate_and_latency(policy: Policy) -> None:
    def stats(matched: int, latency_ms: float | None) -> DrafterStats:
        return DrafterStats(rounds=10, proposed=100, matched=matched, latency_ms=latency_ms)

    by_rate = [policy.score(stats(m, 40.0)) for m in (0, 10, 50, 90, 100)]
    assert by_rate == sorted(by_rate) and len(set(by_rate)) == len(by_rate)
    by_latency = [policy.score(stats(60, ms)) for ms in (1.0, 50.0, 100.0, 150.0, 400.0)]
    assert by_latency == sorted(by_latency, reverse=True) and len(set(by_latency)) == len(by_latency)
    assert policy.score(stats(60, 100.0)) == pytest.approx(policy.score(stats(60, 0.0)) / 2)  # half at the budget
    assert policy.score(stats(60, None)) == policy.score(stats(60, 0.0))
    unreliable = DrafterStats(rounds=10, timeouts=10, proposed=100, matched=60, latency_ms=40.0)
    assert policy.score(unreliable) < policy.score(stats(60, 40.0))


def test_rank_orders_by_match_rate_then_latency(reg: Registry, policy: Policy) -> None:
    for peer, matched, latency_s in [("a", 20, 0.01), ("b", 60, 0.01), ("c", 60, 0.09), ("d", 40, 0.01)]:
        reg.upsert(peer, [])
        _draft(reg, policy, peer, 64, matched, latency_s)
    assert policy.rank(reg, ["a", "b", "c", "d"]) == ["b", "d", "c", "a"]
    assert policy.rank(reg, ["d", "a", "d"]) == ["d", "a"]
    assert policy.select(reg, 2) == ["b", "d"] and policy.select(reg, 0) == []
    with pytest.raises(MarketError):
        policy.select(reg, -1)


def test_new_drafters_are_explored(reg: Registry, policy: Policy) -> None:
    reg.upsert("veteran", [])
    for _ in range(10):
        _draft(reg, policy, "veteran", 8, 7)
    reg.upsert("newcomer", [])
    assert policy.select(reg, 1) == ["veteran"]  # one slot: the best judged drafter keeps it
    assert policy.select(reg, 2) == ["veteran", "newcomer"]  # the untried slot
    assert policy.rank(reg, ["veteran", "newcomer"], explore=False) == ["veteran", "newcomer"]
    _draft(reg, policy, "newcomer", 8, 2)  # still unjudged: still explored
    assert policy.rank(reg, ["veteran", "newcomer"]) == ["newcomer", "veteran"]
    for _ in range(7):
        _draft(reg, policy, "newcomer", 8, 2)  # judged now (64 tokens, ~0.26): ranked on merit
    assert policy.select(reg, 2) == ["veteran", "newcomer"]


def test_ties_broken_by_peer_id(reg: Registry, policy: Policy) -> None:
    for peer in ["zeta", "alpha", "mike"]:
        reg.upsert(peer, [])
    assert policy.select(reg, 3) == ["alpha"]  # untried: one slot, ties by peer id
    for peer in ["zeta", "alpha", "mike"]:
        _draft(reg, policy, peer, 64, 32, 0.02)
    assert policy.rank(reg, ["zeta", "mike", "alpha"]) == ["alpha", "mike", "zeta"]


def test_policy_unknown_peer(reg: Registry, policy: Policy) -> None:
    with pytest.raises(MarketError):
        policy.update(reg, "ghost")
    with pytest.raises(MarketError):
        policy.rank(reg, ["ghost"])


# -- ledger ------------------------------------------------------------------------------


def test_ledger_persists_across_reopen(tmp_path) -> None:
    path = tmp_path / "data" / "sub" / "ledger.sqlite"
    with Ledger(path) as ledger:
        assert ledger.credit("job-1", {"p1": (5, 8), "p2": (0, 4)}) is True
        assert ledger.credit("job-2", {"p1": (3, 3)}) is True
    assert path.exists()
    with Ledger(path) as ledger:
        assert ledger.totals() == {"p1": LedgerEntry("p1", 8, 11, 2), "p2": LedgerEntry("p2", 0, 4, 1)}
        assert ledger.get("p3") == LedgerEntry("p3", 0, 0, 0)
        assert ledger.has_job("job-1") and not ledger.has_job("job-3")
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_a_version_1_ledger_upgrades_in_place_and_keeps_its_credits(tmp_path) -> None:
    """A ledger written before payments (schema 1: no earnings or vouchers) opens, keeps its totals
    and pays from then on."""
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        ledger.credit("old-job", {"p1": (5, 8)})
    conn = sqlite3.connect(path)
    conn.executescript("DROP TABLE earnings; DROP TABLE vouchers; PRAGMA user_version=1;")
    conn.close()
    with Ledger(path) as ledger:
        assert ledger.totals() == {"p1": LedgerEntry("p1", 5, 8, 1)}
        pay = Pay("31337:escrow", 10, {"p1": "0xdrafter"}, lambda drafter, lane, wei: f"{drafter}:{lane}:{wei}")
        assert ledger.credit_and_pay("new-job", {"p1": (2, 2)}, pay) == {"p1": f"0xdrafter:{ledger.lane}:20"}
        assert ledger.earnings() == {"p1": 20}


def test_each_ledger_file_has_a_lane_of_its_own_and_keeps_it(tmp_path) -> None:
    """Two ledgers under one operator key (a fresh data dir, a replica) count their vouchers' totals
    on different lanes (tests/test_escrow_chain.py pays both on chain); a reopened file keeps its lane."""
    lanes = []
    for name in ("a", "b"):
        with Ledger(tmp_path / name / "ledger.sqlite") as ledger:
            assert 0 < ledger.lane < 2**63
            lanes.append(ledger.lane)
    assert lanes[0] != lanes[1]
    with Ledger(tmp_path / "a" / "ledger.sqlite") as again:
        assert again.lane == lanes[0]


def test_a_version_2_ledger_keeps_its_credits_and_starts_its_lane_afresh(tmp_path) -> None:
    """Schema 2's vouchers were for the single-pool escrow: the upgrade keeps credits and earnings,
    draws a lane and drops the old vouchers, so the lane's first voucher counts from 0."""
    path = tmp_path / "ledger.sqlite"
    sign = lambda drafter, lane, wei: f"{drafter}:{lane}:{wei}"  # noqa: E731
    with Ledger(path) as ledger:
        ledger.credit_and_pay("old-job", {"p1": (3, 3)}, Pay("e", 10, {"p1": "0xd"}, sign))
    conn = sqlite3.connect(path)
    conn.executescript("DROP TABLE meta; PRAGMA user_version=2;")
    conn.close()
    with Ledger(path) as ledger:
        assert ledger.totals() == {"p1": LedgerEntry("p1", 3, 3, 1)} and ledger.earnings() == {"p1": 30}
        assert ledger.voucher("e", "0xd") is None
        assert ledger.credit_and_pay("new-job", {"p1": (2, 2)}, Pay("e", 10, {"p1": "0xd"}, sign)) == {
            "p1": f"0xd:{ledger.lane}:20"
        }


def test_ledger_job_credit_is_idempotent(tmp_path) -> None:
    with Ledger(tmp_path / "l.sqlite") as ledger:
        assert ledger.credit("job-1", {"p1": (5, 8)}) is True
        assert ledger.credit("job-1", {"p1": (5, 8)}) is False
        assert ledger.credit("job-1", {"p1": (7, 9), "p2": (1, 1)}) is False
        assert ledger.totals() == {"p1": LedgerEntry("p1", 5, 8, 1)}


def test_ledger_concurrent_credits(tmp_path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite")
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for j in range(25):
                ledger.credit(f"t{t}-j{j}", {"shared": (1, 2), f"own{t}": (j % 3, 3)})
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    totals = ledger.totals()
    assert totals["shared"] == LedgerEntry("shared", 100, 200, 100)
    for t in range(4):
        assert totals[f"own{t}"] == LedgerEntry(f"own{t}", sum(j % 3 for j in range(25)), 75, 25)
    ledger.close()


@pytest.mark.parametrize(
    ("job_id", "credits"),
    [
        ("j", {"p": (5, 4)}),
        ("j", {"p": (-1, 4)}),
        ("j", {"p": (1, -4)}),
        ("j", {"p": (True, 4)}),
        ("j", {"p": (1.0, 4)}),
        ("j", {"p": (1, 2, 3)}),
        ("j", {"": (1, 2)}),
        ("j", {"x" * 129: (1, 2)}),
        ("", {"p": (1, 2)}),
        ("j", {"ok": (1, 2), "bad": (3, 2)}),
    ],
)
def test_ledger_validation_is_all_or_nothing(tmp_path, job_id, credits) -> None:
    with Ledger(tmp_path / "l.sqlite") as ledger:
        with pytest.raises(MarketError):
            ledger.credit(job_id, credits)
        assert ledger.totals() == {} and not ledger.has_job("j")
        assert ledger.credit("j", {"ok": (1, 2)}) is True  # the refused job id was not burnt


def test_ledger_closed_and_bad_get(tmp_path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite")
    with pytest.raises(MarketError):
        ledger.get("")
    ledger.close()
    ledger.close()  # idempotent
    with pytest.raises(MarketError, match="closed"):
        ledger.totals()
    with pytest.raises(MarketError, match="closed"):
        ledger.credit("j", {"p": (1, 1)})


def test_leaving_and_registering_again_keeps_the_judgement(reg: Registry, policy: Policy, clock: FakeClock) -> None:
    """A drafter that re-registers after each job (with a peer id that sorts first) keeps its jobs,
    trial and bench: honest newcomers get the untried slot before it is asked again."""
    reg.upsert("veteran", [])
    for _ in range(10):
        _draft(reg, policy, "veteran", 8, 7)
    reg.upsert("0-evader", [])
    assert policy.select(reg, 2) == ["veteran", "0-evader"]
    reg.record_job("0-evader")
    reg.record_timeout("0-evader")
    reg.forget("0-evader")  # it withdraws after the job...
    clock.advance(1)
    reg.upsert("newcomer", [])
    assert reg.upsert("0-evader", []) is True  # ...and registers again: known again, judged as before
    assert reg.stats("0-evader").jobs == 1 and reg.stats("0-evader").timeouts == 1
    assert policy.select(reg, 2) == ["veteran", "newcomer"]
    reg.record_job("newcomer")
    reg.record_timeout("newcomer")
    assert policy.select(reg, 2) == ["veteran", "0-evader"]  # both tried alike: the one seen first


def test_a_benched_drafter_that_leaves_is_still_benched_when_it_returns(
    reg: Registry, policy: Policy, clock: FakeClock
) -> None:
    reg.upsert("bad", [])
    for _ in range(8):
        _draft(reg, policy, "bad", 8, 0)
    assert policy.is_benched(reg.stats("bad"))
    reg.forget("bad")
    reg.upsert("bad", [])
    assert policy.is_benched(reg.stats("bad")) and "bad" not in policy.select(reg, 3)


def test_departed_peers_are_remembered_for_a_while_and_in_bounded_number(
    reg: Registry, clock: FakeClock, monkeypatch
) -> None:
    import market.registry as registry_module

    monkeypatch.setattr(registry_module, "MAX_DEPARTED", 3)
    for peer in ["a", "b", "c", "d"]:
        reg.upsert(peer, [])
        reg.record_job(peer)
        reg.forget(peer)
    reg.upsert("a", [])  # the oldest departure went past the cap: a starts afresh
    assert reg.stats("a").jobs == 0
    clock.advance(registry_module.REMEMBER_DEPARTED_S + 1)
    reg.upsert("d", [])  # remembered, but too long ago
    assert reg.stats("d").jobs == 0


def _ask_once(reg: Registry, policy: Policy, clock: FakeClock, refusers: set[str]) -> list[str]:
    """One job as the target runs it (node.target.market): the policy's choice without the busy
    peers; a chosen refuser opens its stream (a job) and refuses, as a full drafter does."""
    busy = {p for p in reg.peers() if reg.is_busy(p)}
    chosen = [p for p in policy.select(reg, 1 + len(busy)) if p not in busy][:1]  # as the target did before
    for peer in chosen:
        reg.record_job(peer)
        if peer in refusers:
            reg.record_refusal(peer, "busy: 32 sessions open")
            policy.update(reg, peer)
    clock.advance(0.5)  # a short job: every refuser's busy back-off (5 s) outlasts several
    return chosen


def test_refusing_sybils_cannot_hold_the_untried_slot_from_a_veteran_back_from_a_bench(
    reg: Registry, policy: Policy, clock: FakeClock
) -> None:
    """Issue 40 §4: an honest drafter H (50 jobs, its bench over) beside 10 Sybils that refuse every
    open is selected within 10 selections. Old: the slot went by lifetime jobs (H's 50 against the
    Sybils' few), and a refusal never judged a Sybil, so H waited about 10 x 50 jobs."""
    reg.upsert("H", [])
    for _ in range(50):
        reg.record_job("H")
        _draft(reg, policy, "H", 8, 7)
    for _ in range(2):
        reg.record_timeout("H")  # a bad moment: benched, and its trial window emptied after the bench
    policy.update(reg, "H")
    assert policy.is_benched(reg.stats("H"))
    clock.advance(policy.config.bench_duration(1) + 1)
    assert not policy.is_judged(reg.stats("H")) and reg.stats("H").jobs == 50  # untried again, 50 jobs
    sybils = {f"sybil-{i}" for i in range(10)}
    for peer in sorted(sybils):
        reg.upsert(peer, [])
    chosen = [_ask_once(reg, policy, clock, sybils) for _ in range(10)]
    assert ["H"] in chosen, chosen


def test_an_untried_peer_that_keeps_refusing_is_benched_and_a_judged_one_is_not(
    reg: Registry, policy: Policy, clock: FakeClock
) -> None:
    reg.upsert("judged", [])
    _draft(reg, policy, "judged", 64, 50)
    reg.upsert("refuser", [])
    for peer in ("judged", "refuser"):
        for _ in range(policy.config.max_untried_refusals):
            reg.record_refusal(peer, "busy")
            policy.update(reg, peer)
    assert not policy.is_benched(reg.stats("judged"))  # a judged drafter that is full is only busy a while
    s = reg.stats("refuser")
    assert policy.is_benched(s) and s.bench_reason == "2 refusals in a row before it was judged"
    clock.advance(policy.config.bench_duration(1) + 1)
    assert reg.stats("refuser").consecutive_refusals == 0 and reg.stats("refuser").window_jobs == 0  # a fresh trial


def test_a_busy_peer_never_takes_the_untried_slot(reg: Registry, policy: Policy) -> None:
    for peer in ("first", "second"):
        reg.upsert(peer, [])
    assert policy.select(reg, 1) == ["first"]
    assert policy.select(reg, 1, exclude={"first"}) == ["second"]  # old: the slot stayed with the busy one
