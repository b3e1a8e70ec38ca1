"""Draft invariance: GUMBEL speculative output == plain decoding output, for every proposer.

20 prompts x {honest, random, adversarial, lying, garbage} x T in {0, 0.8, 1.0}, same seed.
A mismatch is only tolerated where plain decoding's top-two noisy scores nearly tie (margin below
TOLERANCE_DELTA, docs/design.md §4); every such flip is reported with its margin, never hidden.
"""

from __future__ import annotations

import pytest

from node.model.decoding import encode_prompt, pair_proposer
from tests.invariance import check_invariance
from verifier.decode import decode_plain, decode_speculative
from verifier.params import SamplingParams

pytestmark = pytest.mark.slow(seconds=50)  # scheduled first (tests/conftest.py)

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


def test_speculative_output_equals_plain_output(pair):
    prompts = [encode_prompt(pair.tokenizer, text) for text in PROMPTS]
    report = check_invariance(pair, prompts, PROPOSERS, TEMPERATURES, max_new=MAX_NEW, gamma=GAMMA)
    report.check(MAX_NEAR_TIE_FRACTION, "draft invariance")


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
