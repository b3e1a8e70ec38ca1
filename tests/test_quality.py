"""node.lab.quality on the shipped tiny pair: the perplexity against a direct torch computation of the
same quantity (llama-perplexity's: chunks, the second half of each scored), the chunking rule, the
greedy comparison, the draft's acceptance against a direct argmax count, and `bench-quality` end to
end on the tiny pair without llama.cpp."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from node.cli import build_parser, main
from node.lab.quality import (
    QualityError,
    agreement,
    chunk_bos,
    chunk_windows,
    greedy_acceptance,
    greedy_answer,
    held_out_text,
    perplexity,
    second_half_nll,
    summarize,
    text_ids,
    until_end,
)
from node.model.pairs import MODELS_DIR

TEXT = (
    "import os\nimport sys\n\n\ndef main(argv):\n    parser = argparse.ArgumentParser()\n"
    "    parser.add_argument('--verbose', action='store_true')\n    args = parser.parse_args(argv)\n"
    "    for name in sorted(os.listdir('.')):\n        if name.endswith('.py'):\n            print(name)\n"
    "    return 0\n\n\nif __name__ == '__main__':\n    sys.exit(main(sys.argv[1:]))\n"
) * 3


def direct_perplexity(hf_model, ids: list[int], n_ctx: int) -> tuple[float, float]:
    """exp(mean NLL) and llama-perplexity's ± over the second half of each n_ctx chunk, in torch."""
    import torch

    nll = []
    for c in range(len(ids) // n_ctx):
        window = torch.tensor([ids[c * n_ctx : (c + 1) * n_ctx]])
        with torch.inference_mode():
            logp = torch.log_softmax(hf_model(input_ids=window).logits[0].double(), dim=-1)
        first = n_ctx // 2
        nll += [-logp[i, window[0, i + 1]].item() for i in range(first, n_ctx - 1)]
    x = torch.tensor(nll, dtype=torch.float64)
    ppl = math.exp(x.mean().item())
    return ppl, ppl * math.sqrt(((x * x).mean() - x.mean() ** 2).item() / (len(nll) - 1))


def test_perplexity_is_the_direct_computation(pair):
    ids = text_ids(pair.tokenizer, TEXT)
    n_ctx = 64
    windows = chunk_windows(ids, n_ctx, chunk_bos(pair.tokenizer))
    assert len(windows) == len(ids) // n_ctx >= 2
    ours = perplexity(pair.target.fork(), windows)
    ppl, spread = direct_perplexity(pair.target.model, ids, n_ctx)
    assert ours.ppl == pytest.approx(ppl, rel=1e-5) and ours.plus_minus == pytest.approx(spread, rel=1e-4)
    assert ours.scored == len(windows) * (n_ctx // 2 - 1) and ours.chunks == len(windows)
    assert 1.0 < ours.ppl < pair.target.vocab_size


def test_chunks_are_llama_perplexitys():
    ids = list(range(1050))
    windows = chunk_windows(ids, 100, None)
    assert len(windows) == 10 and windows[3] == list(range(300, 400))  # the partial last chunk dropped
    assert len(chunk_windows(ids, 100, None, chunks=3)) == 3 and len(chunk_windows(ids, 100, None, 99)) == 10
    with_bos = chunk_windows(ids, 100, 7)
    assert [w[0] for w in with_bos] == [7] * 10 and with_bos[1][1:] == list(range(101, 200))  # replaced, not shifted
    assert ids == list(range(1050))  # the caller's ids untouched
    with pytest.raises(QualityError, match="2 × n_ctx"):
        chunk_windows(ids[:199], 100, None)
    with pytest.raises(QualityError, match="even"):
        chunk_windows(ids, 101, None)


def test_the_second_half_is_scored_but_its_first_token():
    vocab = 10
    logits = np.zeros((8, vocab), dtype=np.float32)
    logits[5, 3] = 50.0  # position 5 all but certain of token 3
    window = [0, 0, 0, 0, 0, 0, 3, 9]
    nll = second_half_nll(logits, window)
    assert len(nll) == 3  # logits at 4, 5, 6 against tokens 5, 6, 7
    assert nll[0] == pytest.approx(math.log(vocab)) and nll[2] == pytest.approx(math.log(vocab))
    assert nll[1] == pytest.approx(0.0, abs=1e-12)
    flat = summarize(np.full(10, math.log(vocab)), 2)
    assert flat.ppl == pytest.approx(vocab) and flat.plus_minus == 0.0 and flat.scored == 10


def test_bos_only_where_the_vocabulary_asks_for_it(pair):
    assert chunk_bos(SimpleNamespace(add_bos_token=False, bos_token_id=151643)) is None  # Qwen2's GGUF and HF
    assert chunk_bos(SimpleNamespace(add_bos_token=True, bos_token_id=1)) == 1  # Llama's
    assert chunk_bos(SimpleNamespace(add_bos_token=True, bos_token_id=None)) is None
    assert chunk_bos(pair.tokenizer) is None


def test_special_token_text_is_plain_text(pair):
    eos = pair.tokenizer.eos_token
    assert pair.tokenizer.eos_token_id not in text_ids(pair.tokenizer, f"a {eos} b")


def test_greedy_agreement():
    same = agreement([1, 2, 3, 4], [1, 2, 3, 4])
    assert (same.common_prefix, same.equal_fraction) == (4, 1.0)
    one_off = agreement([1, 2, 3, 4], [1, 2, 5, 4])
    assert (one_off.common_prefix, one_off.equal_fraction) == (2, 0.75)
    shorter = agreement([1, 2, 3], [1, 2, 3, 9, 9])
    assert (shorter.common_prefix, shorter.equal_fraction, shorter.ours, shorter.theirs) == (3, 0.6, 3, 5)
    assert agreement([], []).equal_fraction == 1.0 and agreement([5], []).equal_fraction == 0.0
    assert until_end([5, 6, 0, 7, 0], (0, 9)) == [5, 6, 0] and until_end([5, 6], (0,)) == [5, 6]


def test_acceptance_counts_the_drafts_argmax_on_the_targets_answer(pair):
    ids = pair.tokenizer.encode("def parse(self, text):\n")
    answer = greedy_answer(pair.target.fork(), ids, 20)
    assert len(answer) == 20
    rows = pair.draft.fork().extend([*ids, *answer[:-1]])[len(ids) - 1 :]
    expected = int((rows.argmax(axis=-1) == np.array(answer)).sum())
    assert greedy_acceptance(pair.draft, ids, answer) == (expected, 20)


def test_the_held_out_text_is_the_documentation_sorted():
    held = held_out_text()
    assert held.files[0] == "README.md" and list(held.files[1:]) == sorted(held.files[1:])
    assert all(f.startswith("docs/") for f in held.files[1:]) and "docs/exact-arithmetic.md" in held.files
    assert held.text.startswith(Path(MODELS_DIR.parent, "README.md").read_text()) and len(held.sha256) == 64


def test_bench_quality_runs_on_the_tiny_pair(tmp_path, capsys):
    out, text = tmp_path / "quality.json", tmp_path / "held_out.txt"
    text.write_text(held_out_text().text)
    argv = ["bench-quality", "--target-dir", str(MODELS_DIR / "target"), "--draft-dir", str(MODELS_DIR / "draft")]
    argv += ["--ppl-sides", "exact", "--no-llama", "--parts", "perplexity,acceptance", "--draft-tokens", "8"]
    argv += ["--text-file", str(text), "--cpu", "none", "--out", str(out)]
    assert main([*argv, "--chunks", "40"]) == 0
    report = json.loads(out.read_text())
    ppl = report["perplexity"]
    assert ppl["evaluated_tokens"] == 40 * 512 and ppl["rows"]["exact"]["scored"] == 40 * 255
    assert ppl["text_sha256"] == held_out_text().sha256 and 1 < ppl["rows"]["exact"]["ppl"] < 4096
    rows = report["acceptance"]["rows"]
    assert len(rows) == 8 and all(r["positions"] == 8 for r in rows)
    assert report["acceptance"]["acceptance"] == pytest.approx(sum(r["matches"] for r in rows) / 64)
    printed = capsys.readouterr().out
    assert "draft greedy acceptance" in printed and "40 chunks of 512 evaluated" in printed
    assert main([*argv, "--chunks", "39"]) == 2  # 39 chunks are 19,968 tokens: a SpecmarketError, one line
    assert "fewer than the 20000" in capsys.readouterr().err


@pytest.mark.parametrize(
    "bad", [["--parts", "perplexity,speed"], ["--ppl-sides", "bf16"], ["--cpu", "first"], ["--cpu", "-1"]]
)
def test_bench_quality_refuses_bad_options(bad, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench-quality", *bad])
