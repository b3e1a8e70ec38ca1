"""The demo report's per-round tables: what each draft round of the speculative answers cost and
bought, from the target's own records (``GET /api/jobs/{id}/rounds``, node.target.draft_timing).

Round kinds: *early* (an early draft, drafted while the previous round was verified, was there and
usable), *answer* (the round waited for a drafter's answer to its own message), *alone* (no usable
draft: the target decoded one token), *probation* (only drafters on probation were asked: their
drafts were measured, not verified, and the target decoded one token). The prompt's round (k = 0)
is no draft round: the target prefills alone while the drafters prefill (``PREFILL_ALONE``); where
a round at k = 0 is recorded (a target without it), its pass also prefilled the prompt, so the
verification column leaves it out.
"""

from __future__ import annotations

from collections.abc import Sequence

KINDS = ("early", "answer", "alone", "probation")
KIND_TITLES = {
    "early": "early draft (no wait for a round trip)",
    "answer": "answer (waited for the drafter)",
    "alone": "no usable draft",
    "probation": "drafters on probation (measured, not verified)",
}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else 0.0


def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)])


def _row(title: str, rounds: list[dict]) -> list[object]:
    verify = [r["verify_ms"] for r in rounds if r["k"] > 0]
    answers = [r for r in rounds if r["kind"] == "answer"]
    emitted = sum(r["accepted"] + 1 for r in rounds)
    return [
        title,
        len(rounds),
        f"{_mean([r['drafted'] for r in rounds]):.2f}",
        f"{_mean([r['accepted'] for r in rounds]):.2f}",
        emitted,
        f"{_mean([r['wait_ms'] for r in rounds]):.0f} / {_p95([r['wait_ms'] for r in rounds]):.0f}",
        f"{_mean([r['draft_ms'] for r in answers]):.0f}" if answers else "–",
        f"{_mean([r['transport_ms'] for r in answers]):.1f}" if answers else "–",
        f"{_mean(verify):.0f}" if verify else "–",
    ]


def by_kind(rounds: list[dict]) -> str:
    header = ["round", "rounds", "draft tokens", "accepted", "tokens emitted", "wait ms (mean / p95)"]
    header += ["draft ms", "transport ms", "verify ms"]
    rows = [_row(KIND_TITLES[k], [r for r in rounds if r["kind"] == k]) for k in KINDS]
    return _table(header, [*(row for row in rows if row[1]), _row("all", rounds)])


def by_length(rounds: list[dict]) -> str:
    """Rounds by the number of draft tokens verified: how the drafter's block length played out."""
    lengths = sorted({r["drafted"] for r in rounds})
    rows = []
    for n in lengths:
        same = [r for r in rounds if r["drafted"] == n]
        verify = [r["verify_ms"] for r in same if r["k"] > 0]
        accepted = sum(r["accepted"] for r in same)
        rate = f"{accepted / (n * len(same)):.2f}" if n else "–"
        rows.append([n, len(same), f"{_mean([r['accepted'] for r in same]):.2f}", rate, f"{_mean(verify):.0f}"])
    header = ["draft tokens", "rounds", "accepted (mean)", "accepted / drafted", "verify ms (mean)"]
    return _table(header, rows)


def render_rounds(rounds: list[dict] | None) -> str:
    if not rounds:
        return ""
    return (
        "## Draft rounds\n\nEvery round of the speculative answers, as the target recorded it. *Draft ms* is the "
        "drafter's own account of its time on an answer (clamped to the measured round trip), *transport* the "
        "rest of that round trip; *wait* is what the target's decode loop waited in the round, *verify* its "
        "verification pass (rounds at k = 0 left out: their pass also prefills the prompt).\n\n"
        f"{by_kind(rounds)}\n\nBy the length of the verified draft (honest drafters end a block at a token "
        f"they are unsure of):\n\n{by_length(rounds)}"
    )
