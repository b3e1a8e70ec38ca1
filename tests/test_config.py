"""One source for every default and bound: each role's options default to its config dataclass,
and a seed or γ that one part accepts is accepted by every other part (client, wire, engine,
receipt), while the next value is refused by all of them."""

from __future__ import annotations

import argparse

import pytest
import trio

from node.chain.receipts import RequestSpec
from node.cli import build_parser
from node.cli.options import ConfigError, defaults, resolve
from node.client.ask import AskConfig
from node.drafter.config import DrafterConfig
from node.model.decoding import GenerateConfig, generate
from node.target.config import TargetConfig
from node.target.engine import CompletionRequest, Engine
from p2p.messages import InvalidMessage, Open, Request, decode, encode
from verifier import MAX_GAMMA, MAX_SEED, InvalidParams, SamplingParams

NOT_OPTIONS = {"help", "config", "json", "prompt"}  # flags that are no config value, and positionals
ROLES = {"target": (TargetConfig,), "drafter": (DrafterConfig,), "ask": (AskConfig,)}
ROLES["generate"] = (GenerateConfig, SamplingParams)


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", sorted(ROLES))
def test_every_option_defaults_to_its_config_dataclass(command):
    """An option with a default of its own would be a second source: every option of the role
    must be a field of its dataclass and default to None (not given)."""
    fields = set(defaults(*ROLES[command])) | {"bootstrap", "target", "prompt"}
    for action in _subparser(command)._actions:
        if action.dest in NOT_OPTIONS or not action.option_strings:
            continue
        assert action.dest in fields, f"{command} --{action.dest} is no field of {ROLES[command]}"
        if action.dest not in ("target",):
            assert action.default is None, f"{command} --{action.dest} has its own default {action.default!r}"


def test_resolve_merges_cli_over_file_over_defaults(tmp_path):
    cfg = tmp_path / "t.toml"
    cfg.write_text('[target]\ngamma = 6\ndraft-deadline-ms = 250\ncheat = "none"\n')
    args = argparse.Namespace(config=cfg, gamma=3)
    merged = resolve(args, "target", TargetConfig)
    assert merged["gamma"] == 3 and merged["draft_deadline_ms"] == 250.0  # CLI > file; an int coerced to float
    assert merged["max_drafters"] == TargetConfig().max_drafters  # the dataclass default
    assert TargetConfig(**merged).gamma == 3
    cfg.write_text("[target]\ngamma = [1]\n")
    with pytest.raises(ConfigError, match="gamma"):
        resolve(argparse.Namespace(config=cfg), "target", TargetConfig)


def test_the_largest_seed_is_accepted_everywhere_and_the_next_refused_everywhere(pair):
    prompt = pair.tokenizer.encode("x = ")
    CompletionRequest("x = ", 4, seed=MAX_SEED)
    RequestSpec.build(prompt, SamplingParams(), MAX_SEED, 4)
    AskConfig(prompt="x", target="http://127.0.0.1:1", seed=MAX_SEED)
    wire = Request("x = ", 4, 1.0, 0, 1.0, MAX_SEED)
    assert decode(encode(wire), vocab_size=pair.target.vocab_size) == wire
    with pytest.raises(InvalidParams):
        CompletionRequest("x = ", 4, seed=MAX_SEED + 1)
    with pytest.raises(InvalidParams):
        AskConfig(prompt="x", target="http://127.0.0.1:1", seed=MAX_SEED + 1)
    with pytest.raises(OverflowError):  # msgpack's integers end at 2^64 - 1: no frame can carry a larger seed
        encode(Request("x = ", 4, 1.0, 0, 1.0, MAX_SEED + 1))


def test_the_target_serves_the_largest_seed_as_generate_does(pair):
    """Before, the client and the wire allowed seeds < 2^64 while the engine refused seeds >= 2^63."""
    engine = Engine(pair, model_name="t", gamma=4)
    served = trio.run(engine.complete, CompletionRequest("x = ", 6, seed=MAX_SEED))
    local = generate(GenerateConfig("x = ", seed=MAX_SEED, max_new_tokens=6, drafter="none"), pair)
    assert list(served.tokens) == local["tokens"] and served.seed == MAX_SEED


def test_one_gamma_bound():
    assert TargetConfig(gamma=MAX_GAMMA).gamma == MAX_GAMMA
    with pytest.raises(InvalidParams, match=str(MAX_GAMMA)):
        TargetConfig(gamma=MAX_GAMMA + 1)
    wide = Open("j", (1, 2), 1.0, 0, 1.0, 0, MAX_GAMMA, 0)
    assert decode(encode(wide), vocab_size=10).gamma == MAX_GAMMA
    with pytest.raises(InvalidMessage):
        decode(encode(Open("j", (1, 2), 1.0, 0, 1.0, 0, MAX_GAMMA + 1, 0)), vocab_size=10)
