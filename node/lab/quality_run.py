"""`specmarket bench-quality`, run: the measurements of node.lab.quality on the real models, beside
llama.cpp's tools, one thread on one core, with a table and a JSON report (see node.lab.quality)."""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from node.lab.llama_cpp import LlamaCppError
from node.lab.quality import (
    MIN_TEXT_TOKENS,
    N_CTX,
    HeldOutText,
    QualityError,
    agreement,
    chunk_bos,
    chunk_windows,
    greedy_acceptance,
    greedy_answer,
    held_out_text,
    perplexity,
    relative,
    text_ids,
    until_end,
)
from node.lab.workload import QWEN_PROMPTS, prompt_ids
from node.model.pairs import QWEN_DRAFT_DIR, QWEN_F16_TARGET_DIR, QWEN_TARGET_DIR
from verifier.model import common_prefix

log = logging.getLogger(__name__)

PARTS = ("perplexity", "agreement", "acceptance")
PPL_SIDES = ("exact", "float16", "llama.cpp")  # whose perplexity: ours in both arithmetics, llama.cpp's tool
PPL_GOAL = 0.01  # |exact / float16 − 1| on the held-out text
ACCEPTANCE_GOAL = 0.82  # the 0.5B draft's greedy acceptance against the exact target


@dataclass(frozen=True)
class QualityConfig:
    target_dir: Path = QWEN_TARGET_DIR  # the exact target (its model.gguf is what llama.cpp runs)
    f16_dir: Path = QWEN_F16_TARGET_DIR  # the float16 target beside it
    draft_dir: Path = QWEN_DRAFT_DIR
    parts: tuple[str, ...] = PARTS
    ppl_sides: tuple[str, ...] = PPL_SIDES
    n_ctx: int = N_CTX
    chunks: int | None = None  # the first N chunks of the text (None: all)
    text_file: Path | None = None  # the held-out text from this file instead of the documentation
    greedy_tokens: int = 64  # agreement with llama.cpp: tokens generated a prompt
    draft_tokens: int = 48  # draft acceptance: positions of the target's answer a prompt
    llama: bool = True  # build and run llama.cpp's tools beside ours
    cpu: int | None = 0  # the core everything runs on, one thread (None: unpinned, torch's threads)
    out: Path = Path("bench_out/quality.json")


def _one_core(cpu: int | None):
    from node.lab.bench_exact import one_core

    return contextlib.nullcontext() if cpu is None else one_core(cpu)


def _llama_bin(cfg: QualityConfig) -> Path | None:
    """llama.cpp's tools, built if need be; None (with the reason logged) where it cannot be built."""
    from node.lab.llama_cpp import ensure_llama_cpp

    wanted = "agreement" in cfg.parts or ("perplexity" in cfg.parts and "llama.cpp" in cfg.ppl_sides)
    if not (cfg.llama and wanted):
        return None
    try:
        return ensure_llama_cpp()
    except LlamaCppError as e:
        log.warning("llama.cpp is not available, so its columns stay empty: %s", e)
        return None


def run_quality(cfg: QualityConfig) -> dict:
    from node.lab.bench_local import write_json
    from node.model.loading import load_model_dir

    started = time.perf_counter()
    report: dict = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}}
    with _one_core(cfg.cpu), tempfile.TemporaryDirectory(prefix="specmarket-quality-") as tmp:
        bin_dir = _llama_bin(cfg)
        target, tokenizer = load_model_dir(cfg.target_dir, "target")
        gguf = Path(cfg.target_dir) / "model.gguf"
        if "perplexity" in cfg.parts:
            report["perplexity"] = perplexity_part(cfg, target, tokenizer, bin_dir, gguf, Path(tmp))
        if {"agreement", "acceptance"} & set(cfg.parts):
            prompts = [prompt_ids(tokenizer, text, chat=True) for text in QWEN_PROMPTS]
            n = max(cfg.greedy_tokens if "agreement" in cfg.parts else 0, cfg.draft_tokens)
            answers = [greedy_answer(target, p, n) for p in tqdm(prompts, desc="exact greedy", file=sys.stderr)]
            if "agreement" in cfg.parts:
                report["agreement"] = agreement_part(cfg, tokenizer, prompts, answers, bin_dir, gguf, Path(tmp))
            if "acceptance" in cfg.parts:
                report["acceptance"] = acceptance_part(cfg, prompts, answers)
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(f"\nwall time {report['wall_seconds']:.0f} s")
    write_json(cfg.out, report)
    return report


def perplexity_part(cfg: QualityConfig, target, tokenizer, bin_dir: Path | None, gguf: Path, tmp: Path) -> dict:
    held = held_out_text() if cfg.text_file is None else HeldOutText(cfg.text_file.read_text(), (str(cfg.text_file),))
    ids = text_ids(tokenizer, held.text)
    windows = chunk_windows(ids, cfg.n_ctx, chunk_bos(tokenizer), cfg.chunks)
    evaluated = len(windows) * cfg.n_ctx
    print(f"held-out text: {len(held.files)} files, {len(held.text)} characters, sha256 {held.sha256}")
    print(f"  {len(ids)} tokens; {len(windows)} chunks of {cfg.n_ctx} evaluated ({evaluated} tokens)")
    if evaluated < MIN_TEXT_TOKENS:
        raise QualityError(f"{evaluated} tokens evaluated, fewer than the {MIN_TEXT_TOKENS} issue 39 §5 asks for")
    part = {"text_sha256": held.sha256, "files": held.files, "text_tokens": len(ids), "evaluated_tokens": evaluated}
    rows = {}
    for side in cfg.ppl_sides:
        t0 = time.perf_counter()
        if side == "llama.cpp":
            if bin_dir is None:
                continue
            try:
                part["llama_tokens_match"], rows[side] = llama_perplexity(bin_dir, gguf, held.text, ids, cfg, tmp)
            except LlamaCppError as e:
                log.warning("llama-perplexity failed, so its row stays empty: %s", e)
                continue
        else:
            rows[side] = asdict(perplexity(_ppl_model(cfg, side, target), windows, f"{side} perplexity"))
        rows[side]["seconds"] = time.perf_counter() - t0
    part["rows"] = rows
    names = list(rows)  # in PPL_SIDES' order, each against those after it
    part["relative"] = {
        f"{a} vs {b}": relative(rows[a]["ppl"], rows[b]["ppl"]) for i, a in enumerate(names) for b in names[i + 1 :]
    }
    if {"exact", "float16"} <= set(rows):
        gap = abs(relative(rows["exact"]["ppl"], rows["float16"]["ppl"]))
        part["goal"] = {"measured": gap, "bound": PPL_GOAL, "holds": gap <= PPL_GOAL}
    print_perplexity(part)
    return part


def _ppl_model(cfg: QualityConfig, side: str, target):
    from node.model.loading import load_model_dir

    return target if side == "exact" else load_model_dir(cfg.f16_dir, "float16 target", "skinny")[0]


def llama_perplexity(bin_dir: Path, gguf: Path, text: str, ids: list[int], cfg: QualityConfig, tmp: Path):
    """(whether llama.cpp tokenizes the text to our ids, llama-perplexity's row) on the same chunks."""
    from node.lab.llama_tools import run_perplexity, run_tokenize

    (tmp / "text.txt").write_text(text)
    (tmp / "ppl.txt").write_text(text + "\n")  # llama-perplexity's -f drops one trailing newline
    theirs = run_tokenize(bin_dir / "llama-tokenize", gguf, tmp / "text.txt")
    match = list(theirs) == ids
    if not match:
        at = common_prefix(theirs, ids)
        log.warning(
            "llama.cpp tokenizes the text to %d tokens, we to %d (first difference at %d)", len(theirs), len(ids), at
        )
    chunks = len(chunk_windows(ids, cfg.n_ctx, None, cfg.chunks))
    result = run_perplexity(bin_dir / "llama-perplexity", gguf, tmp / "ppl.txt", cfg.n_ctx, chunks, cfg.cpu)
    return match, {
        "ppl": result.ppl,
        "plus_minus": result.plus_minus,
        "chunks": result.chunks,
        "command": " ".join(result.command),
    }


def print_perplexity(part: dict) -> None:
    print(f"\nperplexity, {part['evaluated_tokens']} tokens in chunks, the second half of each scored")
    print(f"  {'model':<10} {'PPL':>9} {'±':>8} {'seconds':>8}")
    for name, r in part["rows"].items():
        print(f"  {name:<10} {r['ppl']:>9.4f} {r['plus_minus']:>8.4f} {r['seconds']:>8.0f}")
    for pair, value in part["relative"].items():
        print(f"  {pair}: {value:+.3%}")
    if "llama_tokens_match" in part:
        print(f"  llama.cpp tokenizes the text to the same ids: {part['llama_tokens_match']}")
    if "goal" in part:
        g = part["goal"]
        verdict = "held" if g["holds"] else "missed"
        print(f"  goal |exact / float16 − 1| ≤ {g['bound']:.0%}: {g['measured']:.3%}, {verdict}")


def agreement_part(cfg: QualityConfig, tokenizer, prompts, answers, bin_dir: Path | None, gguf: Path, tmp: Path):
    """Per prompt, our greedy answer (to its first end of sequence) against llama-completion's."""
    from node.model.decoding import end_of_sequence_tokens

    if bin_dir is None:
        return None
    stop, rows = end_of_sequence_tokens(tokenizer), []
    for i, (prompt, answer) in enumerate(tqdm(list(zip(prompts, answers, strict=True)), desc="llama.cpp greedy")):
        try:
            row = _agreement_row(
                cfg, tokenizer, prompt, until_end(answer[: cfg.greedy_tokens], stop), bin_dir, gguf, tmp
            )
        except LlamaCppError as e:
            log.warning("llama-completion failed on prompt %d, which is left out: %s", i, e)
            continue
        rows.append({"prompt": QWEN_PROMPTS[i], **row})
    if not rows:
        return None
    part = {
        "tokens": cfg.greedy_tokens,
        "rows": rows,
        "mean_common_prefix": sum(r["common_prefix"] for r in rows) / len(rows),
        "mean_equal_fraction": sum(r["equal_fraction"] for r in rows) / len(rows),
    }
    print_agreement(part)
    return part


def _agreement_row(cfg: QualityConfig, tokenizer, prompt, ours, bin_dir: Path, gguf: Path, tmp: Path) -> dict:
    """llama-completion on the chat-templated prompt text (special tokens parsed, so the same ids: it
    lists them, and the row says whether they are), its answer text read back to ids with special
    tokens parsed (``-sp`` writes its end-of-turn token out)."""
    from node.lab.llama_tools import run_completion

    path = tmp / "prompt.txt"
    path.write_text(tokenizer.decode(prompt, skip_special_tokens=False) + "\n")  # -f drops one newline
    done = run_completion(bin_dir / "llama-completion", gguf, path, cfg.greedy_tokens, cfg.cpu)
    theirs = list(tokenizer(done.text, add_special_tokens=False)["input_ids"])
    return {
        "same_prompt_ids": list(done.prompt_ids) == list(prompt),
        **asdict(agreement(ours, theirs)),
        "llama_ended": done.ended,
        "ours_ids": list(ours),
        "theirs_ids": theirs,
        "theirs_text": done.text,
    }


def print_agreement(part: dict) -> None:
    print(f"\ngreedy agreement with llama-completion on the same GGUF, {part['tokens']} tokens a prompt")
    print(f"  {'prompt':<44} {'same ids':>8} {'prefix':>7} {'equal':>6} {'ours':>5} {'theirs':>6}")
    for r in part["rows"]:
        print(
            f"  {r['prompt'][:44]:<44} {r['same_prompt_ids']!s:>8} {r['common_prefix']:>7} "
            f"{r['equal_fraction']:>6.3f} {r['ours']:>5} {r['theirs']:>6}"
        )
    mean_prefix, mean_equal = part["mean_common_prefix"], part["mean_equal_fraction"]
    print(f"  mean common prefix {mean_prefix:.1f}, mean fraction equal {mean_equal:.3f}")


def acceptance_part(cfg: QualityConfig, prompts, answers) -> dict:
    from node.model.loading import load_model_dir

    draft = load_model_dir(cfg.draft_dir, "draft", "skinny")[0]
    rows = []
    for text, prompt, answer in zip(QWEN_PROMPTS, prompts, answers, strict=True):
        matches, positions = greedy_acceptance(draft, prompt, answer[: cfg.draft_tokens])
        rows.append({"prompt": text, "matches": matches, "positions": positions, "acceptance": matches / positions})
    pooled = sum(r["matches"] for r in rows) / sum(r["positions"] for r in rows)
    part = {"tokens": cfg.draft_tokens, "rows": rows, "acceptance": pooled, "goal": ACCEPTANCE_GOAL}
    part["holds"] = pooled >= ACCEPTANCE_GOAL
    print(f"\ndraft greedy acceptance, teacher-forced on the exact target's {cfg.draft_tokens}-token greedy answers")
    for r in rows:
        print(f"  {r['prompt'][:60]:<60} {r['acceptance']:.3f}")
    print(
        f"  all {sum(r['positions'] for r in rows)} positions: {pooled:.3f}; goal ≥ {ACCEPTANCE_GOAL}: "
        f"{'held' if part['holds'] else 'missed'}"
    )
    return part
