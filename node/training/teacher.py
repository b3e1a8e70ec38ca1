"""Teacher data for a draft model of the real target: the target's own answers to chat and code prompts.

There is no hub here, so the prompts are made on this machine: chat prompts from a fixed list of
topics and question templates, code prompts from the docstrings of this interpreter's standard
library. Each prompt is assigned to the train or held-out split by a hash of its text, so held-out
answers come from prompts no training step ever saw. The target samples every answer through its
chat template; answers are appended to JSON-lines shards, one line per prompt, so an interrupted
run resumes where it stopped (``python -m node.training.teacher --help``).
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import itertools
import json
import logging
import random
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from node.runtime.dirs import default_data_dir
from node.training.corpus import split_corpus

log = logging.getLogger(__name__)

HELDOUT_EVERY = 20  # one prompt in ~20 (by text hash) is held out
SHARD_PROMPTS = 256
TOPICS = (
    "the water cycle",
    "photosynthesis",
    "black holes",
    "the French Revolution",
    "compound interest",
    "vaccines",
    "the immune system",
    "plate tectonics",
    "machine learning",
    "climate change",
    "the stock market",
    "healthy sleep",
    "learning a new language",
    "the Roman Empire",
    "electric cars",
    "recycling",
    "the human heart",
    "volcanoes",
    "the internet",
    "encryption",
    "gardening",
    "coffee",
    "the moon landing",
    "renewable energy",
    "budgeting",
    "time management",
    "the solar system",
    "dinosaurs",
    "earthquakes",
    "bread baking",
    "chess",
    "the Olympic Games",
    "honey bees",
    "rainbows",
    "the printing press",
    "democracy",
    "inflation",
    "antibiotics",
    "ocean tides",
    "public speaking",
    "meditation",
    "the Great Wall of China",
    "electricity",
    "magnets",
    "friendship",
    "job interviews",
    "writing a resume",
    "running a marathon",
    "cats",
    "dogs",
    "the Amazon rainforest",
    "deserts",
    "glaciers",
    "the periodic table",
    "DNA",
    "evolution",
    "gravity",
    "the speed of light",
    "music theory",
    "painting with watercolors",
    "photography",
    "cooking pasta",
    "the history of computers",
    "robots",
    "space stations",
    "nutrition",
    "drinking water",
    "hurricanes",
    "bicycles",
    "trains",
    "airplanes",
    "the Renaissance",
    "ancient Egypt",
    "libraries",
    "museums",
    "poetry",
    "chemistry experiments",
    "prime numbers",
    "probability",
    "statistics",
    "fractions",
    "the Pythagorean theorem",
    "saving money",
)
TEMPLATES = (
    "Explain {topic} in simple terms.",
    "What are three interesting facts about {topic}?",
    "Write a short paragraph about {topic}.",
    "Why is {topic} important?",
    "Give me a beginner's guide to {topic}.",
    "What is a common misconception about {topic}?",
    "Summarize the history of {topic} in a few sentences.",
    "How would you explain {topic} to a child?",
    "What questions should I ask to learn more about {topic}?",
    "Write a short poem about {topic}.",
)
CODE_TEMPLATES = (
    "Write a Python function `{name}({args})` that does the following: {doc}",
    "Explain what a Python function named `{name}` that '{doc}' might look like, with code.",
)


@dataclass(frozen=True)
class Prompt:
    kind: str  # "chat" | "code"
    text: str

    @property
    def heldout(self) -> bool:
        digest = hashlib.sha256(self.text.encode()).digest()
        return int.from_bytes(digest[:4], "big") % HELDOUT_EVERY == 0


def chat_prompts() -> list[Prompt]:
    return [Prompt("chat", t.format(topic=topic)) for topic, t in itertools.product(TOPICS, TEMPLATES)]


def _documented_functions(path: Path) -> Iterator[tuple[str, str, str]]:
    try:
        with warnings.catch_warnings():  # some stdlib test files hold deliberately odd escapes
            warnings.simplefilter("ignore")
            tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            doc = (ast.get_docstring(node) or "").strip().split("\n", 1)[0].strip()
            if 20 <= len(doc) <= 160 and doc.endswith("."):
                args = ", ".join(a.arg for a in node.args.args if a.arg != "self")
                yield node.name, args, doc


@functools.cache
def _code_prompts_with_sources(limit: int = 4000) -> tuple[tuple[Prompt, Path], ...]:
    seen: set[str] = set()
    prompts: list[tuple[Prompt, Path]] = []
    split = split_corpus()
    for i, path in enumerate(sorted([*split.train, *split.heldout])):
        for name, args, doc in _documented_functions(path):
            if doc in seen:
                continue
            seen.add(doc)
            template = CODE_TEMPLATES[(i + len(seen)) % len(CODE_TEMPLATES)]
            prompts.append((Prompt("code", template.format(name=name, args=args, doc=doc)), path))
    random.Random(0).shuffle(prompts)
    return tuple(prompts[:limit])


def code_prompts(limit: int = 4000) -> list[Prompt]:
    """Function-writing requests from the standard library's one-line docstrings (deduplicated)."""
    return [prompt for prompt, _ in _code_prompts_with_sources(limit)]


def heldout_sources() -> frozenset[Path]:
    """The stdlib files held-out code prompts were made from: training on their raw code would
    show the draft the held-out functions."""
    return frozenset(path for prompt, path in _code_prompts_with_sources() if prompt.heldout)


@functools.cache
def all_prompts() -> tuple[Prompt, ...]:
    """Chat and code prompts interleaved (so any prefix of the run has both), in a fixed order."""
    chat, code = chat_prompts(), code_prompts()
    random.Random(1).shuffle(chat)
    out: list[Prompt] = []
    for a, b in itertools.zip_longest(chat, code):
        out.extend(p for p in (a, b) if p is not None)
    return tuple(out)


def _done_count(out_dir: Path) -> int:
    """Prompts already answered (complete lines; shards are written in prompt order)."""
    return sum(1 for shard in out_dir.glob("shard-*.jsonl") for line in shard.open() if line.endswith("\n"))


def generate_answers(model_dir: Path, out_dir: Path, *, batch: int, max_new_tokens: int, temperature: float) -> None:
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    prompts = all_prompts()
    done = _done_count(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    bar = tqdm(total=len(prompts), initial=done, unit="prompt", desc="teacher answers")
    for start in range(done, len(prompts), batch):
        chunk = prompts[start : start + batch]
        ids = [_chat_ids(tokenizer, p.text) for p in chunk]
        enc = tokenizer.pad({"input_ids": ids}, return_tensors="pt")
        torch.manual_seed(start)
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                **enc,
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        wall = time.perf_counter() - started
        rows = out[:, enc["input_ids"].shape[1] :].tolist()
        lines = []
        for p, prompt_ids, row in zip(chunk, ids, rows, strict=True):
            answer = row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row
            record = {"kind": p.kind, "heldout": p.heldout, "prompt": p.text, "prompt_ids": prompt_ids}
            lines.append(json.dumps({**record, "answer_ids": answer, "temperature": temperature, "seed": start}))
        with (out_dir / f"shard-{start // SHARD_PROMPTS:05d}.jsonl").open("a") as f:
            f.write("\n".join(lines) + "\n")  # one write per batch: a crash loses at most this batch
        bar.update(len(chunk))
        bar.set_postfix(tok_s=f"{sum(map(len, rows)) / wall:.0f}")


def _chat_ids(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"])  # transformers 5 returns a BatchEncoding


def main(argv: list[str] | None = None) -> int:
    from node.training.smollm2 import convert

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    base = default_data_dir("training")
    p.add_argument("--model-dir", type=Path, default=base / "smollm2-135m-instruct", help="the converted target")
    p.add_argument("--out-dir", type=Path, default=base / "teacher" / "smollm2", help="JSON-lines shards of answers")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(args.threads)
    convert(args.model_dir)
    generate_answers(
        args.model_dir, args.out_dir, batch=args.batch, max_new_tokens=args.max_new_tokens, temperature=args.temperature
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
