"""`bench-draft-length`'s replay (node.lab.draft_length) against real speculative decoding, on the
shipped tiny pair.

Under GUMBEL a round's accepted tokens depend only on the draft's tokens up to its first mismatch,
all drafted from the true context, so replaying a policy on a teacher-forced trace must give exactly
the rounds that real decoding with that policy runs: checked here for fixed blocks and for blocks that
end at the first unsure token, at T = 0 and T = 0.8.
"""

from __future__ import annotations

import json

import pytest

from node.cli import build_parser, main
from node.lab.draft_length import Costs, block_length, replay_overlapped, replay_sequential, trace_of
from node.model.pairs import DEFAULT_PAIR
from verifier.decode import decode_speculative
from verifier.params import SamplingParams
from verifier.proposers import LocalDraftProposer

PROMPTS = ["def parse(self, text):\n", "import os\n\n"]
MAX_TOKENS = 32
POLICIES = [(4, 0.0), (4, 0.5), (6, 0.3), (2, 0.9)]  # (γ, threshold)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_replay_runs_exactly_the_rounds_of_real_decoding(pair, temperature):
    params = SamplingParams(temperature=temperature)
    costs = Costs(t1_s=1.0, draft_s=0.0, transport_s=0.0, verify=(1.0,) * 8)
    cut = 0
    for seed, prompt in enumerate(PROMPTS):
        ids = pair.tokenizer.encode(prompt)
        trace = trace_of(pair, ids, params, seed, MAX_TOKENS)
        assert len(trace.matches) == MAX_TOKENS and all(0.0 < c <= 1.0 for c in trace.confidence)
        for gamma, threshold in POLICIES:
            real = decode_speculative(
                pair.target.fork(),
                LocalDraftProposer(pair.draft.fork(), min_confidence=threshold),
                ids,
                params=params,
                seed=seed,
                max_new_tokens=MAX_TOKENS,
                gamma=gamma,
            )
            seconds, rounds = replay_sequential(trace, gamma, threshold, costs)
            assert rounds == real.stats.target_passes, (prompt, gamma, threshold)
            assert sum(trace.matches[:1]) <= real.stats.draft_tokens_accepted  # the first position is drafted
            # with free drafts and transport, overlapping changes nothing: both replays cost one pass a round
            assert replay_overlapped(trace, gamma, threshold, costs) == (seconds, rounds) == (rounds * 1.0, rounds)
            cut += sum(block_length(trace, k, gamma, threshold) < gamma for k in range(MAX_TOKENS - gamma - 1))
    assert cut > 0, "no block ended early: the thresholds test nothing"


def test_overlapping_hides_the_draft_time_of_early_drafts(pair):
    """With every draft token right and confident, each block after the first is drafted while the
    previous one is verified: the overlapped replay waits for the first block only."""
    params = SamplingParams(temperature=0.0)
    trace = trace_of(pair, pair.tokenizer.encode(PROMPTS[0]), params, 0, MAX_TOKENS)
    perfect = type(trace)((True,) * MAX_TOKENS, (1.0,) * MAX_TOKENS)
    costs = Costs(t1_s=1.0, draft_s=0.1, transport_s=0.0, verify=(1.0,) * 8)
    sequential, rounds = replay_sequential(perfect, 4, 0.5, costs)
    overlapped, same_rounds = replay_overlapped(perfect, 4, 0.5, costs)
    # every round emits its block and the bonus: the draft tokens are all but one token a round
    assert rounds == same_rounds and sequential == pytest.approx(rounds + 0.1 * (MAX_TOKENS - rounds))
    assert overlapped == pytest.approx(0.4 + rounds * 1.0)  # the first answer's 4 draft tokens, then passes


def test_the_command_writes_every_policy_and_defaults_to_the_default_pair(tmp_path, capsys):
    out = tmp_path / "draft_length.json"
    args = ["--pair", "tiny", "--prompts", "1", "--seeds", "2", "--max-tokens", "8", "--gammas", "2", "3"]
    assert main(["bench-draft-length", *args, "--thresholds", "0", "0.5", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["answers"] == 2 and report["positions"] == 16 and len(report["rows"]) == 4
    assert {(r["max_gamma"], r["threshold"]) for r in report["rows"]} == {(2, 0.0), (2, 0.5), (3, 0.0), (3, 0.5)}
    assert all(r["speedup_overlapped"] > 0 and 1.0 <= r["tokens_per_pass"] <= 4.0 for r in report["rows"])
    assert "tokens/pass" in capsys.readouterr().out
    again = tmp_path / "again.json"  # the same traces and costs, other policies, nothing decoded
    assert (
        main(["bench-draft-length", "--replay", str(out), "--gammas", "2", "--thresholds", "0.5", "--out", str(again)])
        == 0
    )
    replayed = json.loads(again.read_text())
    assert replayed["traces"] == report["traces"] and replayed["rows"] == [
        r for r in report["rows"] if r["max_gamma"] == 2 and r["threshold"] == 0.5
    ]
    parser_args = build_parser().parse_args(["bench-draft-length"])
    assert parser_args.pair == DEFAULT_PAIR and parser_args.gammas == [4, 5, 6, 8]
