"""Plain `ask` over libp2p across a flaky link (issue 42 §2, the part that needs no client drafting):
a real target process, and the client dialing it through node.lab.flaky_link. With 20, 50 and 100 ms
of round trip the answer is plain decoding's, token for token; a link cut mid-answer gives the client
one clear error, and asking again with the same seed gives the whole answer."""

from __future__ import annotations

import pytest

from node.client.p2p import AskFailed, ask_p2p, make_request
from node.lab.flaky_link import FlakyLink, LinkConfig
from node.model.decoding import GenerateConfig, generate
from tests.netutil import start_target
from verifier.params import SamplingParams

pytestmark = pytest.mark.slow(seconds=30)

PROMPT = "def parse(self, text):\n"
MAX_TOKENS = 24
SEED = 5


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    node = start_target(tmp_path_factory.mktemp("flaky"))
    yield node
    node.stop()


def via(link_port: int, target_addr: str) -> str:
    """The target's multiaddr with the flaky link's port in place of its own."""
    peer = target_addr.rsplit("/p2p/", 1)[1]
    return f"/ip4/127.0.0.1/tcp/{link_port}/p2p/{peer}"


def upstream(target_addr: str) -> tuple[str, int]:
    parts = target_addr.split("/")
    return parts[2], int(parts[4])


def ask_through(portal, target, cfg: LinkConfig) -> tuple[str, str | None, FlakyLink]:
    """Ask once through a fresh link: (text streamed, error or None, the link)."""
    addr = target.lines["multiaddr"][0]
    link = FlakyLink(upstream(addr), cfg)
    port, stop = portal.start(link.serve)
    streamed: list[str] = []
    request = make_request(PROMPT, MAX_TOKENS, 0.8, 1.0, SEED)
    try:
        portal.run(ask_p2p, via(port, addr), request, streamed.append)
        error = None
    except AskFailed as exc:
        error = str(exc)
    finally:
        stop()
    return "".join(streamed), error, link


@pytest.fixture(scope="module")
def plain(pair):
    cfg = GenerateConfig(PROMPT, seed=SEED, max_new_tokens=MAX_TOKENS, params=SamplingParams(0.8), drafter="none")
    return generate(cfg, pair)


@pytest.mark.parametrize("rtt_ms", [20, 50, 100])
def test_an_answer_across_a_slow_link_is_plain_decodings_succeeds(portal, target, plain, rtt_ms):
    text, error, link = ask_through(portal, target, LinkConfig(delay_ms=rtt_ms / 2, jitter_ms=rtt_ms / 10))
    assert error is None, error
    assert text == plain["text"]
    assert min(link.stats.delays_ms) >= 0 and link.stats.bytes_to_client > 0


def test_a_link_cut_mid_answer_is_one_clear_error_and_the_same_ask_again_completes_succeeds(portal, target, plain):
    _, _, whole = ask_through(portal, target, LinkConfig())
    cut_at = whole.stats.bytes_to_client * 2 // 3  # past the handshake, before the answer's end
    text, error, link = ask_through(portal, target, LinkConfig(cut_after_bytes=cut_at))
    assert link.stats.cuts == 1
    assert error is not None and error.startswith("the generation stream failed"), error
    assert plain["text"].startswith(text) and text != plain["text"], (text, plain["text"])  # a part, then the error
    again, error, _ = ask_through(portal, target, LinkConfig())  # the client resumes: the same request again
    assert error is None and again == plain["text"]
