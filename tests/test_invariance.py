"""Draft invariance: GUMBEL speculative output == plain decoding output, for every proposer.

20 prompts x {honest, random, adversarial, lying, garbage} x T in {0, 0.8, 1.0}, same seed.
A mismatch is only tolerated where plain decoding's top-two noisy scores nearly tie (margin below
TOLERANCE_DELTA, docs/design.md §4); every such flip is reported with its margin, never hidden.
"""

from __future__ import annotations

import warnings

import pytest

from node.decoding import encode_prompt, pair_proposer
from verifier.decode import decode_plain, decode_speculative
from verifier.model import score
from verifier.params import SamplingParams
from verifier.verify import TOLERANCE_DELTA, score_margin

PROMPTS = [
    "import os\n",
    "def main():\n    ",
    "class Config:\n    def __init__(self, path):\n        self.",
    "for i in range(",
    "    if not isinstance(value, str):\n        raise ",
    "from collections import ",
    "try:\n    import ",
    "    return self._",
    "# Copyright (C) 2001 Python Software Foundation\n",
    "def __repr__(self):\n        return ",
    "with open(filename, 'rb') as f:\n    ",
    "    @property\n    def name(self):\n        ",
    "import unittest\n\n\nclass Test",
    "        except KeyError:\n            ",
    "    def test_",
    '"""Utilities for ',
    "    parser.add_argument(",
    "        self.assertEqual(",
    "    while True:\n        line = ",
    "if __name__ == '__main__':\n    ",
]
PROPOSERS = ["honest", "random", "adversarial", "lying", "garbage"]
TEMPERATURES = [0.0, 0.8, 1.0]
MAX_NEW = 20
GAMMA = 4
MAX_NEAR_TIE_FRACTION = 0.01


def _first_diff(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_speculative_output_equals_plain_output(pair):
    near_ties, failures, runs = [], [], 0
    for temperature in TEMPERATURES:
        params = SamplingParams(temperature=temperature)
        for seed, prompt in enumerate(PROMPTS):
            ids = encode_prompt(pair.tokenizer, prompt)
            plain = decode_plain(pair.target, ids, params=params, seed=seed, max_new_tokens=MAX_NEW).tokens
            for name in PROPOSERS:
                runs += 1
                proposer = pair_proposer(name, pair, rng_seed=seed)
                spec = decode_speculative(
                    pair.target, proposer, ids, params=params, seed=seed, max_new_tokens=MAX_NEW, gamma=GAMMA
                ).tokens
                if spec == plain:
                    continue
                k = _first_diff(spec, plain)
                logits = score(pair.target.fork(), [*ids, *plain[:k]])[0][-1]
                margin = score_margin(logits, params, seed, k)
                record = f"T={temperature} prompt#{seed} {name}: token {k} differs, margin {margin:.2e}"
                (near_ties if margin < TOLERANCE_DELTA else failures).append(record)
    for record in near_ties:
        warnings.warn(f"near-tie flip: {record}", stacklevel=1)
    print(f"draft invariance: {runs} runs, {len(near_ties)} near-tie flips, {len(failures)} real mismatches")
    assert not failures, "speculative output differs from plain decoding:\n" + "\n".join(failures)
    assert len(near_ties) <= MAX_NEAR_TIE_FRACTION * runs, near_ties


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_invariance_across_gamma_and_top_k_top_p(pair, gamma):
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.9)
    ids = encode_prompt(pair.tokenizer, PROMPTS[2])
    plain = decode_plain(pair.target, ids, params=params, seed=123, max_new_tokens=30).tokens
    spec = decode_speculative(
        pair.target, pair_proposer("honest", pair), ids, params=params, seed=123, max_new_tokens=30, gamma=gamma
    )
    assert spec.tokens == plain
    assert spec.stats.target_passes < 30  # the honest draft actually saved target passes
