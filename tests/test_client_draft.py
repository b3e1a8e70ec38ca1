"""`specmarket ask --draft` (issue 42 §1): the client drafts for its own request over its generate
stream, to a real target process (the tiny pair) that also has a drafter peer in its market.

The promises and the attacks on them:
- the answer is plain decoding's, token for token, whatever the client sends (honest, lying, garbage);
- the client is never paid and never enters the market's registry, however it drafts;
- its drafts never touch another job, even one running beside it;
- it drafts the next block while the target verifies (early drafts), as a drafter peer does;
- an old target (1.1.0 only) refuses a drafting client with a clear error, and still answers a
  plain one.
"""

from __future__ import annotations

import msgpack
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.io.msgio import VarIntLengthMsgReadWriter

from node.client.drafting import ClientDraftConfig, ClientDrafter
from node.client.p2p import AskFailed, ask_p2p, make_request
from node.model.decoding import GenerateConfig, generate
from node.model.pairs import get_pair
from p2p.host import make_host, parse_listen, peer_addrs
from p2p.messages import GENERATE_PROTOCOL_V1_1, MAX_FRAME_BYTES, Done, encode
from tests.netutil import TEST_PAIR, InProcessDrafter, http_json, start_target, wait_for_drafters
from verifier.params import SamplingParams

pytestmark = pytest.mark.slow(seconds=60)

PROMPT = "def parse(self, text):\n"
MAX_TOKENS = 40
SEED = 5
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def market(portal, tmp_path_factory):
    """A target (never stops drafting: --wait-budget 0) with one honest drafter peer in its market."""
    tmp = tmp_path_factory.mktemp("client-draft")
    node = start_target(tmp, "--max-drafters", "1", "--wait-budget", "0")
    drafter = InProcessDrafter(portal, tmp, node.lines["multiaddr"][0], "honest")
    wait_for_drafters(node.lines["http"][0], 1)
    yield node, drafter
    drafter.stop()
    node.stop()


@pytest.fixture(scope="module")
def plain(pair):
    cfg = GenerateConfig(
        PROMPT, seed=SEED, max_new_tokens=MAX_TOKENS, params=SamplingParams(TEMPERATURE), drafter="none"
    )
    return generate(cfg, pair)


def client(strategy: str = "honest", **kw) -> ClientDrafter:
    return ClientDrafter(ClientDraftConfig(get_pair(TEST_PAIR).draft_dir(), strategy=strategy, **kw))


def ask(portal, target: str, drafter: ClientDrafter | None) -> Done:
    request = make_request(PROMPT, MAX_TOKENS, TEMPERATURE, 1.0, SEED)
    return portal.run(ask_p2p, target, request, lambda _: None, drafter)


@pytest.mark.parametrize("strategy", ["honest", "lying", "garbage", "flood"])
def test_a_drafting_client_gets_plain_decodings_answer_whatever_it_sends_succeeds(portal, market, plain, strategy):
    node, drafter = market
    done = ask(portal, node.lines["multiaddr"][0], client(strategy))
    assert list(done.tokens) == plain["tokens"], strategy
    assert "client" not in done.credits and set(done.credits) <= {drafter.peer_id}  # the client is never paid
    if strategy == "garbage":  # its first frame is malformed: its session ends there, the answer goes on
        assert done.stats["client_draft_tokens"] == 0, done.stats
    elif strategy != "flood":  # it drafted, and the target verified its drafts (a flood is cut off at once)
        assert done.stats["client_draft_tokens"] > 0, done.stats
    if strategy == "honest":
        assert done.stats["client_tokens_accepted"] > 0, done.stats


def test_a_lying_client_never_enters_the_market_nor_is_benched_there_succeeds(portal, market, plain):
    node, drafter = market
    http = node.lines["http"][0]
    before = http_json(f"{http}/health")["drafters"]
    for _ in range(3):  # past two misses and a judgement's worth of tokens, were it a market drafter
        assert list(ask(portal, node.lines["multiaddr"][0], client("lying")).tokens) == plain["tokens"]
    after = http_json(f"{http}/health")
    assert set(after["drafters"]) == set(before) == {drafter.peer_id}, after["drafters"]
    assert after["drafters_total"] == 1
    row = after["drafters"][drafter.peer_id]
    assert not row.get("benched"), row  # the market's drafter was not judged on the client's drafts


def test_a_drafting_clients_job_never_touches_the_job_beside_it_succeeds(portal, market, plain):
    node, _ = market
    target = node.lines["multiaddr"][0]
    lying = client("lying")
    done: dict[str, Done] = {}

    async def both() -> None:
        request = make_request(PROMPT, MAX_TOKENS, TEMPERATURE, 1.0, SEED)

        async def one(name: str, drafter: ClientDrafter | None) -> None:
            done[name] = await ask_p2p(target, request, lambda _: None, drafter)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "lying", lying)
            nursery.start_soon(one, "beside", None)

    portal.run(both)
    assert list(done["beside"].tokens) == list(done["lying"].tokens) == plain["tokens"]
    assert "client_draft_tokens" not in done["beside"].stats and done["lying"].stats["client_draft_tokens"] > 0


def test_a_drafting_client_drafts_the_next_block_while_the_target_verifies_succeeds(portal, market, plain):
    node, _ = market
    drafter = client("honest")
    done = ask(portal, node.lines["multiaddr"][0], drafter)
    assert list(done.tokens) == plain["tokens"]
    assert drafter.session is not None and drafter.session.early_sent > 0, "no early draft was sent"
    assert done.stats["draft_early_hits"] > 0, done.stats  # ... and the target used one


async def _old_target(task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A target that speaks /specmarket/generate/1.1.0 only, and parses requests as 1.1.0 did: the
    exact field set of a 1.1.0 request, or no answer."""
    fields_1_1 = {"type", "prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "ignore_eos"}

    async def handle(stream) -> None:
        rw = VarIntLengthMsgReadWriter(stream, max_msg_size=MAX_FRAME_BYTES)
        body = msgpack.unpackb(await rw.read_msg())
        if set(body) == fields_1_1:
            await rw.write_msg(encode(Done("old-job", (1, 2), 7, {}, {})))
        await stream.close()

    host = make_host(create_new_key_pair())
    async with host.run(listen_addrs=[parse_listen("/ip4/127.0.0.1/tcp/0")]):
        host.set_stream_handler(GENERATE_PROTOCOL_V1_1, handle)
        task_status.started(peer_addrs(host)[0])
        await trio.sleep_forever()


def test_an_old_target_refuses_a_drafting_client_clearly_and_answers_a_plain_one_succeeds(portal):
    addr, stop = portal.start(_old_target)
    try:
        assert ask(portal, addr, None).job == "old-job"  # a plain request is still a 1.1.0 request
        with pytest.raises(AskFailed, match=r"does not support client drafting.*ask without --draft"):
            ask(portal, addr, client("honest"))
    finally:
        stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "http://127.0.0.1:1", "--draft"], "--draft needs the target's libp2p multiaddr"),
        (["--target", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWA", "--draft-model", "/tmp/m"], "--draft-model needs --draft"),
    ],
)
def test_ask_draft_options_are_checked_reverts(args, message, capsys):
    from node.cli import main

    assert main(["ask", *args, "hi"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("speedups", "accepted", "stops"),
    [
        ({0: 1.3, 20: 1.2, 50: 1.05, 100: 0.97}, {0: 9, 20: 9, 50: 9, 100: 9}, 100),  # pays until 50 ms
        ({0: 1.3, 20: 0.99, 50: 1.01, 100: 0.9}, {0: 9, 20: 9, 50: 9, 100: 9}, 100),  # 50 ms pays again: from 100
        ({0: 1.3, 20: 0.9, 50: 1.04, 100: 1.0}, {0: 9, 20: 9, 50: 0, 100: 0}, 20),  # 1.04x with nothing drafted: noise
        ({0: 1.3, 20: 1.2, 50: 1.1, 100: 1.02}, {0: 9, 20: 9, 50: 9, 100: 9}, None),  # pays at the longest measured
        ({0: 0.95, 20: 0.97}, {0: 9, 20: 9}, 0),  # never paid
    ],
)
def test_bench_link_names_the_round_trip_from_which_client_drafting_stops_paying(speedups, accepted, stops):
    from node.lab.bench_link import stops_paying

    assert stops_paying(tuple(speedups), speedups, accepted) == stops
