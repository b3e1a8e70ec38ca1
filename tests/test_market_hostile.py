"""Hostile peers against a real target process: each hostile drafter strategy alone and mixed with an
honest drafter, hypothesis-generated malformed/truncated/oversized frames against both nodes, and a
plaintext-only peer. The drafters run in this process (real libp2p hosts on loopback, in a trio
loop on a background thread); the target is a separate `specmarket target` process.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import msgpack
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.exceptions import BaseLibp2pError
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
from libp2p.utils.varint import encode_uvarint

from node.lab.trio_thread import TrioThread
from node.model.decoding import GenerateConfig, generate
from p2p.framing import FrameStream
from p2p.host import make_host, parse_listen, parse_peer_addr, peer_addrs
from p2p.messages import DRAFT_PROTOCOL_ID, GENERATE_PROTOCOL_ID, TO_TARGET, Draft, Open
from tests import netutil
from tests.hostile_frames import OPEN_BODY, REQUEST_BODY, frames_for
from tests.netutil import complete, http_json, start_target, wait_for_drafters

HOSTILE = ("random", "adversarial", "lying", "slow", "garbage", "flaky")
PROMPTS = ["def parse(self, text):\n", "import os\n\n", "class Cache:\n    def __init__("]
CLOSE_WAIT_S = 30.0  # a node must drop a bad stream (or finish a request that happens to be valid) by then
# Seven drafters share this process (one GIL, 2 cores) with the test's reference decoding: an honest
# draft can take several hundred ms here. Two misses bench a drafter for 30 s, longer than the mixed
# test, so the deadline leaves the honest one room; the slow one still misses it by far.
DRAFT_DEADLINE_MS = 1000
SLOW_MS = 3 * DRAFT_DEADLINE_MS
LATE_MS = DRAFT_DEADLINE_MS // 4  # slower than an honest drafter, well inside the deadline


def reference(pair, prompt: str, seed: int, max_tokens: int) -> list[int]:
    return generate(GenerateConfig(prompt, seed=seed, max_new_tokens=max_tokens, drafter="none"), pair)["tokens"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    deadline = ("--draft-deadline-ms", str(DRAFT_DEADLINE_MS))
    node = start_target(tmp_path_factory.mktemp("hostile"), *deadline, "--max-drafters", "8")
    yield node
    assert node.stop() == 0, node.log()[-3000:]


class InProcessDrafter(netutil.InProcessDrafter):
    def __init__(
        self, portal: TrioThread, tmp, bootstrap: str, strategy: str, slow_ms: int = SLOW_MS, **cfg: Any
    ) -> None:
        super().__init__(portal, tmp, bootstrap, strategy, slow_ms=slow_ms, **cfg)


def wait_until_forgotten(http: str, peer_id: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while peer_id in http_json(f"{http}/health")["drafters"]:
        assert time.monotonic() < deadline, f"target still lists {peer_id} after it withdrew"
        time.sleep(0.1)


NEVER_MATCHING = ("random", "adversarial", "lying")  # well-formed drafts whose first token never matches


def assert_misbehaviour_seen(strategy: str, stats: dict) -> None:
    assert stats["jobs"] >= 1, stats
    if strategy == "slow":  # alone it misses the deadline; behind a faster drafter its drafts come late
        assert stats["timeouts"] + stats["late"] >= 1, stats
    elif strategy in ("garbage", "flaky"):
        assert stats["errors"] >= 1, stats
    else:  # NEVER_MATCHING
        # among faster drafters its draft may lose every race to the round's close: that is a miss
        assert stats["lifetime_proposed"] > 0 or stats["timeouts"] + stats["late"] >= 1, stats
        assert stats["lifetime_matched"] <= 0.2 * max(stats["lifetime_proposed"], 1), stats


@pytest.mark.parametrize("strategy", HOSTILE)
def test_hostile_drafter_alone_cannot_change_the_output(portal, target, tmp_path, pair, strategy):
    http = target.lines["http"][0]
    drafter = InProcessDrafter(portal, tmp_path, target.lines["multiaddr"][0], strategy)
    try:
        health = wait_for_drafters(http, 1)
        assert list(health["drafters"]) == [drafter.peer_id]  # only this drafter is in the market
        for seed, prompt in enumerate(PROMPTS[:2]):
            answer = complete(http, prompt, seed=seed, max_tokens=24)
            assert answer["specmarket"]["tokens"] == reference(pair, prompt, seed, 24)
            if strategy in NEVER_MATCHING:  # on probation until a token matches: it never costs a verification
                assert answer["specmarket"]["stats"]["draft_tokens_proposed"] == 0, answer["specmarket"]["stats"]
        assert_misbehaviour_seen(strategy, http_json(f"{http}/health")["drafters"][drafter.peer_id])
    finally:
        drafter.stop()
    wait_until_forgotten(http, drafter.peer_id)


def test_mix_of_honest_and_hostile_drafters(portal, target, tmp_path, pair):
    http = target.lines["http"][0]
    bootstrap = target.lines["multiaddr"][0]
    drafters = [InProcessDrafter(portal, tmp_path, bootstrap, s) for s in ("honest", *HOSTILE)]
    try:
        wait_for_drafters(http, len(drafters))
        for seed in range(len(drafters) + 2):  # a job asks one untried drafter: every one gets its turn
            prompt = PROMPTS[seed % len(PROMPTS)]
            answer = complete(http, prompt, seed=100 + seed, max_tokens=32)
            assert answer["specmarket"]["tokens"] == reference(pair, prompt, 100 + seed, 32)
        stats = http_json(f"{http}/health")["drafters"]
        assert stats[drafters[0].peer_id].get("credited_tokens", 0) > 0, "the honest drafter earned nothing"
        for d, strategy in zip(drafters[1:], HOSTILE, strict=True):
            assert stats[d.peer_id].get("credited_tokens", 0) <= stats[drafters[0].peer_id]["credited_tokens"]
            assert_misbehaviour_seen(strategy, stats[d.peer_id])
    finally:
        for d in drafters:
            d.stop()
    for d in drafters:
        wait_until_forgotten(http, d.peer_id)


def test_a_drafter_slower_than_the_best_is_late_not_failed(portal, target, tmp_path, pair):
    """Rounds close as soon as the best-ranked drafter answers. A drafter whose draft comes after that,
    but inside the deadline, is recorded as late: no timeout, no bench (two timeouts would bench it)."""
    http = target.lines["http"][0]
    bootstrap = target.lines["multiaddr"][0]
    fixed = {"min_confidence": 0.0}  # blocks of γ: this is about lateness, not draft length
    fast = InProcessDrafter(portal, tmp_path, bootstrap, "honest", **fixed)
    behind = None
    try:
        wait_for_drafters(http, 1)
        complete(http, PROMPTS[1], seed=6, max_tokens=48)  # the fast drafter is judged: a job keeps it
        # the untried slot; answers only (no early drafts, which could be ready before their round):
        # every answer comes LATE_MS after the round asked, after the fast drafter's
        behind = InProcessDrafter(portal, tmp_path, bootstrap, "slow", slow_ms=LATE_MS, overlap=False, **fixed)
        wait_for_drafters(http, 2)
        # a round waits for the best-ranked drafter: while the newcomer's optimistic prior ranks it
        # first, its answer is waited for (in time, not late); once judged lower, it comes late
        for seed in (5, 7, 9, 11):
            answer = complete(http, PROMPTS[0], seed=seed, max_tokens=32)
            assert answer["specmarket"]["tokens"] == reference(pair, PROMPTS[0], seed, 32)
            stats = http_json(f"{http}/health")["drafters"]
            if stats[behind.peer_id]["late"]:
                break
        assert stats[behind.peer_id]["late"] >= 1, stats[behind.peer_id]
        for d in (fast, behind):
            assert stats[d.peer_id]["timeouts"] == 0 and not stats[d.peer_id]["benched"], stats[d.peer_id]
        assert stats[fast.peer_id]["credited_tokens"] > 0
    finally:
        for d in (fast, behind):
            if d is not None:
                d.stop()
    for d in (fast, behind):
        wait_until_forgotten(http, d.peer_id)


# -- malformed frames ----------------------------------------------------------------------------


async def _attack(host, peer: str, protocol: str, wire: bytes) -> None:
    """Send ``wire`` on a fresh stream, close our side, and wait for the node to drop the stream."""
    info = parse_peer_addr(peer)
    stream = await host.new_stream(info.peer_id, [protocol])
    await stream.write(wire)
    await stream.close_write()
    with trio.fail_after(CLOSE_WAIT_S):
        try:
            while await stream.read(65536):
                pass
        except BaseLibp2pError:
            pass  # a reset is a drop too


def send_all(portal, host, peer: str, protocol: str, wires: list[bytes]) -> None:
    async def go() -> None:
        await host.connect(parse_peer_addr(peer))
        for wire in wires:
            await _attack(host, peer, protocol, wire)

    portal.run(go)


@pytest.fixture(scope="module")
def lone_drafter(portal, point, tmp_path_factory):
    """A drafter registered with ``point``, a hostile target that attacks it on its draft protocol
    (a stranger's streams are refused before any frame is read: tests/test_bounded_load.py)."""
    drafter = InProcessDrafter(portal, tmp_path_factory.mktemp("fuzzed"), peer_addrs(point)[0], "honest")
    yield drafter
    drafter.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(frames_for(OPEN_BODY), min_size=1, max_size=3))
def test_malformed_frames_never_crash_the_drafter(portal, point, lone_drafter, frames):
    send_all(portal, point, lone_drafter.addrs[0], DRAFT_PROTOCOL_ID, [wire for _, wire in frames])
    assert lone_drafter.node.sessions == 0  # every hostile stream was dropped


def test_drafter_still_drafts_and_logs_after_malformed_frames(portal, point, lone_drafter, caplog):
    caplog.set_level(logging.INFO, logger="node.drafter.peer")
    peer = lone_drafter.addrs[0]
    vocab = lone_drafter.node.model.vocab_size

    async def bad_then_good(host):
        await host.connect(parse_peer_addr(peer))
        await _attack(host, peer, DRAFT_PROTOCOL_ID, encode_uvarint(3) + b"\xc1\xc1\xc1")
        stream = await host.new_stream(parse_peer_addr(peer).peer_id, [DRAFT_PROTOCOL_ID])
        fs = FrameStream(stream, vocab_size=vocab, allowed=TO_TARGET)
        await fs.send(Open("job-ok", (0, 5, 9), 1.0, 0, 1.0, 3, 4, 0), 5.0)
        draft = await fs.receive(30.0)
        await fs.close()
        return draft

    draft = portal.run(bad_then_good, point)
    assert isinstance(draft, Draft) and draft.job == "job-ok" and draft.start == 0 and 1 <= len(draft.tokens) <= 4
    assert any("dropping the stream from" in r.getMessage() and "msgpack" in r.getMessage() for r in caplog.records)


@settings(max_examples=100, deadline=None)
@given(frames=st.lists(frames_for(REQUEST_BODY), min_size=1, max_size=3))
def test_malformed_frames_never_crash_the_target(portal, attacker, target, frames):
    send_all(portal, attacker, target.lines["multiaddr"][0], GENERATE_PROTOCOL_ID, [wire for _, wire in frames])
    assert target.proc.poll() is None, target.log()[-3000:]


def test_target_logs_the_drop_and_still_serves(portal, attacker, target, pair):
    body = msgpack.packb({**REQUEST_BODY, "prompt": 7})
    send_all(portal, attacker, target.lines["multiaddr"][0], GENERATE_PROTOCOL_ID, [encode_uvarint(len(body)) + body])
    deadline = time.monotonic() + CLOSE_WAIT_S
    while "'prompt' must be a string" not in target.log():
        assert time.monotonic() < deadline, target.log()[-2000:]
        time.sleep(0.1)
    assert "generate stream from" in target.log()
    answer = complete(target.lines["http"][0], PROMPTS[0], seed=4, max_tokens=12)
    assert answer["specmarket"]["tokens"] == reference(pair, PROMPTS[0], 4, 12)


def test_plaintext_only_peer_is_refused(portal, target):
    peer = parse_peer_addr(target.lines["multiaddr"][0])

    async def dial(secure: bool) -> bool:
        key_pair = create_new_key_pair()
        host = (
            make_host(key_pair)
            if secure
            else new_host(key_pair=key_pair, sec_opt={PLAINTEXT_PROTOCOL_ID: InsecureTransport(key_pair)})
        )
        async with host.run(listen_addrs=[parse_listen("/ip4/127.0.0.1/tcp/0")]):
            try:
                with trio.fail_after(10):
                    await host.connect(peer)
            except (BaseLibp2pError, OSError, trio.TooSlowError):
                return False
            return True

    assert portal.run(dial, False) is False
    assert portal.run(dial, True) is True  # the same dial with Noise succeeds: the refusal is the security protocol


def test_a_job_whose_drafter_is_dropped_drafts_on_with_another_succeeds(portal, tmp_path, pair):
    """One slot per job, and the job's drafter sends garbage and is dropped at its first draft: the
    job asks the policy's next choice among the peers it has not had (a refill) and drafts on with
    the honest one, instead of decoding the rest of the answer alone."""
    node = start_target(tmp_path, "--draft-deadline-ms", str(DRAFT_DEADLINE_MS), "--max-drafters", "1")
    try:
        http, bootstrap = node.lines["http"][0], node.lines["multiaddr"][0]
        drafters = [InProcessDrafter(portal, tmp_path, bootstrap, s) for s in ("garbage", "honest")]
        try:
            wait_for_drafters(http, 2)
            refills = []
            for seed in range(3):
                answer = complete(http, PROMPTS[0], seed=200 + seed, max_tokens=24)
                assert answer["specmarket"]["tokens"] == reference(pair, PROMPTS[0], 200 + seed, 24)
                stats = answer["specmarket"]["stats"]
                assert stats["draft_tokens_accepted"] > 0, stats  # drafted with the honest peer in the end
                refills.append(stats["draft_refills"])
            assert sum(refills) >= 1, refills  # the garbage peer had its trial in some job, and was replaced
        finally:
            for d in drafters:
                d.stop()
    finally:
        assert node.stop() == 0, node.log()[-3000:]
