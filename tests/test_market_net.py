"""The drafting market over real libp2p on loopback: target and drafters as separate processes.

Every output is compared token for token with `specmarket generate --drafter none` (plain decoding
of the shipped target) for the same seed; every hostile drafter is checked to have actually been
asked (its counters moved), so the equality is not vacuous.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node.model.decoding import GenerateConfig, generate
from tests.netutil import SPECMARKET, complete, http_json, start_drafter, start_target, wait_for_drafters

PROMPTS = ["def parse(self, text):\n", "import os\n\n", "class Cache:\n    def __init__("]
GENEROUS_DEADLINE = ("--draft-deadline-ms", "1000")  # correctness never depends on it; CI machines are slow
SERVED_MODEL = "target"  # /v1/models names the served model by its directory: the tiny pair's models/target


def reference(pair, prompt: str, seed: int, max_tokens: int, **params) -> list[int]:
    cfg = GenerateConfig(prompt, seed=seed, max_new_tokens=max_tokens, drafter="none", **params)
    return generate(cfg, pair)["tokens"]


def peer_id_of(node) -> str:
    return node.lines["multiaddr"][0].rsplit("/", 1)[-1]


@pytest.fixture(scope="module")
def honest_net(tmp_path_factory):
    """A target with one honest drafter that knew nothing but the target's multiaddr."""
    tmp = tmp_path_factory.mktemp("honest")
    target = start_target(tmp, *GENEROUS_DEADLINE)
    drafter = start_drafter(tmp, target.lines["multiaddr"][0], "honest", "honest")
    yield target, drafter
    assert drafter.stop(sig=signal.SIGINT) == 0, drafter.log()[-2000:]  # Ctrl-C: a clean exit
    assert "unregistered from" in drafter.log(), drafter.log()[-2000:]
    assert target.stop() == 0, target.log()[-2000:]


def test_discovery_from_bootstrap_address_alone(honest_net):
    target, drafter = honest_net
    health = wait_for_drafters(target.lines["http"][0], 1)
    assert peer_id_of(drafter) in health["drafters"]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.0, 1.0), (0.8, 0.9)])
def test_honest_drafter_output_equals_plain_decoding(honest_net, pair, temperature, top_p):
    target, _ = honest_net
    http = target.lines["http"][0]
    wait_for_drafters(http, 1)
    accepted = 0
    for seed, prompt in enumerate(PROMPTS):
        answer = complete(http, prompt, seed=seed, max_tokens=40, temperature=temperature, top_p=top_p)
        ext = answer["specmarket"]
        assert ext["tokens"] == reference(pair, prompt, seed, 40, params=_params(temperature, top_p))
        assert ext["seed"] == seed
        accepted += ext["stats"]["draft_tokens_accepted"]
        assert sum(ext["credits"].values()) == ext["stats"]["draft_tokens_accepted"]
    assert accepted > 0, "the honest drafter's tokens were never accepted: drafting did not happen"


def _params(temperature: float, top_p: float):
    from verifier.params import SamplingParams

    return SamplingParams(temperature, 0, top_p)


def test_concurrent_requests_are_each_correct(honest_net, pair):
    target, _ = honest_net
    http = target.lines["http"][0]
    results: dict[int, list[int]] = {}

    def ask(seed: int) -> None:
        results[seed] = complete(http, PROMPTS[seed % 3], seed=seed, max_tokens=32)["specmarket"]["tokens"]

    threads = [threading.Thread(target=ask, args=(seed,)) for seed in (11, 12, 13)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [11, 12, 13]
    for seed, tokens in results.items():
        assert tokens == reference(pair, PROMPTS[seed % 3], seed, 32)


def test_ask_over_libp2p_and_http(honest_net, pair):
    target, _ = honest_net
    expected = reference(pair, PROMPTS[0], 5, 16)
    for address in (target.lines["multiaddr"][0], target.lines["http"][0]):
        cmd = [*SPECMARKET, "ask", "--target", address, "--seed", "5", "--max-new-tokens", "16", "--json", PROMPTS[0]]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
        assert json.loads(out.stdout)["tokens"] == expected, address
    multiaddr = target.lines["multiaddr"][0]
    streamed = subprocess.run(
        [*SPECMARKET, "ask", "--target", multiaddr, "--seed", "5", "--max-new-tokens", "16", PROMPTS[0]],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert streamed.stdout.rstrip("\n") == pair.tokenizer.decode(expected)


def test_metrics_carry_per_drafter_counters(honest_net):
    target, drafter = honest_net
    http = target.lines["http"][0]
    complete(http, PROMPTS[1], seed=99, max_tokens=16)
    with urllib.request.urlopen(f"{http}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    assert f'peer="{peer_id_of(drafter)}"' in text
    requests = [line for line in text.splitlines() if line.startswith("specmarket_requests_total")]
    assert requests and float(requests[0].split()[-1]) >= 1
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
    for histogram in ("time_to_first_token", "inter_token_latency", "draft_wait"):  # rounds with a real drafter
        assert samples[f"specmarket_{histogram}_seconds_count"] >= 1, histogram


def test_drafter_killed_mid_job(honest_net, tmp_path, pair):
    target, _ = honest_net
    drafter = start_drafter(tmp_path, target.lines["multiaddr"][0], "honest", "victim")
    try:
        http = target.lines["http"][0]
        wait_for_drafters(http, 2)
        body = json.dumps({"prompt": PROMPTS[2], "seed": 8, "max_tokens": 200, "stream": True}).encode()
        req = urllib.request.Request(f"{http}/v1/completions", body, {"Content-Type": "application/json"})
        tokens: list[int] = []
        with urllib.request.urlopen(req, timeout=120) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[len("data: ") :])
                if chunk["choices"][0]["finish_reason"] is None:
                    tokens.extend(chunk["specmarket"]["tokens"])
                if len(tokens) >= 20 and drafter.proc.poll() is None:
                    drafter.kill()  # SIGKILL in the middle of the job
        assert drafter.proc.returncode is not None and len(tokens) == 200
        assert tokens == reference(pair, PROMPTS[2], 8, 200)
        time.sleep(0.2)
        stats = http_json(f"{http}/health")["drafters"][peer_id_of(drafter)]
        assert stats["jobs"] >= 1 and stats["errors"] + stats["timeouts"] >= 1, stats
    finally:
        drafter.kill()


def test_openai_client_against_the_target_with_a_drafter(honest_net, pair):
    import openai

    from node.model.loading import model_hash
    from node.model.pairs import get_pair

    target, _ = honest_net
    client = openai.OpenAI(base_url=target.lines["http"][0] + "/v1", api_key="unused", timeout=120)
    (card,) = client.models.list().data  # the served model by name, and the commitment receipts name
    assert (
        card.id == SERVED_MODEL
        and card.model_extra["model_hash"] == "0x" + model_hash(get_pair("tiny").target_dir()).hex()
    )
    expected = reference(pair, PROMPTS[1], 21, 24)
    answer = client.completions.create(model=SERVED_MODEL, prompt=PROMPTS[1], max_tokens=24, seed=21)
    assert answer.model_extra["specmarket"]["tokens"] == expected
    assert answer.choices[0].text == pair.tokenizer.decode(expected, skip_special_tokens=True)
    chunks = list(client.completions.create(model=SERVED_MODEL, prompt=PROMPTS[1], max_tokens=24, seed=21, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == answer.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.asyncio
async def test_async_openai_client_against_the_target_with_a_drafter(honest_net, pair):
    import openai

    target, _ = honest_net
    client = openai.AsyncOpenAI(base_url=target.lines["http"][0] + "/v1", api_key="unused", timeout=120)
    expected = reference(pair, PROMPTS[2], 22, 24)
    answer = await client.completions.create(model=SERVED_MODEL, prompt=PROMPTS[2], max_tokens=24, seed=22)
    assert answer.model_extra["specmarket"]["tokens"] == expected
    stream = await client.completions.create(model=SERVED_MODEL, prompt=PROMPTS[2], max_tokens=24, seed=22, stream=True)
    text = "".join([chunk.choices[0].text async for chunk in stream])
    assert text == pair.tokenizer.decode(expected, skip_special_tokens=True)
