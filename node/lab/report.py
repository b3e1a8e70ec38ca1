"""The demo's report: README.md, its PNGs and demo_net.json (in demo_out/report/, or report/ for
the committed example), from one run's measurements.

Every number in the report is computed here from what `node.lab.demo_net` measured in that run; the
only inputs that are not measured are the two named assumptions of the bond sizing
(``PRICE_WEI_PER_TOKEN``, ``AUDIT_RATE``), printed next to the result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from node.chain.deployment import ETHER
from node.lab.demo_payments import payments_ok, render_payments
from node.lab.gamma_sweep import measured_alpha
from node.lab.plots import plot_drafter_acceptance, plot_omega_convergence, plot_speedup_measured, plot_with_without
from node.lab.report_serving import serving_sections
from node.lab.round_table import render_rounds
from node.lab.trust import BondSizing
from node.lab.workload import MODE_TITLES, MODES
from node.target.http.pages import write_simulator
from verifier.theory import speedup

PRICE_WEI_PER_TOKEN = 10**12  # assumption: an answer's fee, 10⁻⁶ ETH per output token
AUDIT_RATE = 0.01  # assumption: challengers re-execute 1 answer in 100
# the goals for speculation over the network on the qwen2.5-coder pair, a 1.5B target and its
# pretrained 0.5B sibling (docs/target-performance.md)
NETWORK_SPEEDUP_GOAL = 2.0
NETWORK_SPEEDUP_STRETCH = 3.0
OMEGA_ROUNDS = 2000  # simulated rounds in the Ω-convergence plot

TRUST_NOTES = (
    "Re-execution is the challenger's audit: plain decoding replayed on the answer's own tokens in one "
    "teacher-forced pass (timed after a warm-up, fastest of 3). Each referee process re-executes only the "
    "disputed step (the prompt and the output before it, one pass) before it signs, and reports its own "
    "positions and seconds (timed while every process was up). Gas differs by a few units at most: "
    "calldata bytes of signatures and addresses cost 4 gas when zero, 16 otherwise."
)
DRAFTER_COLUMNS = ("name", "strategy", "proposed", "matched", "accepted", "late", "timeouts", "errors")


def derive(result: dict) -> dict[str, dict]:
    """Per mode: latency, throughput, passes, positions and FLOPs per output token."""
    flops = result["target_flops_per_position"]
    rows = {}
    for mode in MODES:
        r = result[mode]
        tokens, wall = r["tokens"], r["wall_seconds"]
        first_s, first_n = r.get("first_chunk_seconds", 0.0), r.get("first_chunk_tokens", 0)
        rows[mode] = {
            **r,
            "latency_ms_per_token": round(1000 * wall / tokens, 2),
            "first_chunk_ms_per_answer": round(1000 * first_s / r["answers"], 1),
            "decode_ms_per_token": round(1000 * (wall - first_s) / max(tokens - first_n, 1), 2),
            "tokens_per_second": round(tokens / wall, 2),
            "passes_per_token": round(r["target_passes"] / tokens, 4),
            "positions_per_token": round(r["target_positions"] / tokens, 4),
            "flops_per_token": flops * r["target_positions"] / tokens,
        }
    return rows


def speculation_fit(result: dict, rows: dict[str, dict]) -> dict:
    """Measured Ω (tokens per target pass), the α that explains it, the measured speed-up, and the
    two costs of Leviathan et al. (2023) §3.4 in units of one plain target pass: c = draft wait per
    round / γ, and v = the rest of a speculative round (verification pass, settling, streaming).
    Departure: the paper takes v = 1; over the network and on a CPU a wider pass costs more."""
    spec, plain = rows["with_speculation"], rows["without_speculation"]
    # drafters end blocks early (node.drafter.session): γ here is the mean draft length per round, the
    # configured γ is only its cap. Departure: the paper's γ is fixed; Ω(α, γ) is used at the mean.
    gamma = spec["draft_tokens_proposed"] / spec["draft_rounds"] if spec["draft_rounds"] else result["setup"]["gamma"]
    omega = spec["tokens"] / spec["target_passes"]
    alpha = measured_alpha(omega, gamma)
    plain_pass_s = plain["wall_seconds"] / plain["target_passes"]
    wait_per_round = spec["draft_wait_seconds"] / spec["draft_rounds"] if spec["draft_rounds"] else 0.0
    verify_s = (spec["wall_seconds"] - spec["draft_wait_seconds"]) / spec["target_passes"]
    cost, verify_cost = wait_per_round / (gamma * plain_pass_s), verify_s / plain_pass_s
    return {
        "gamma": max(1, round(gamma)),  # for the plots, which simulate whole rounds
        "mean_draft_length": round(gamma, 3),
        "max_gamma": result["setup"]["gamma"],
        "omega": round(omega, 4),
        "alpha": round(alpha, 4),
        "acceptance_rate": round(spec["draft_tokens_accepted"] / max(spec["draft_tokens_proposed"], 1), 4),
        "speedup": round(plain["wall_seconds"] / spec["wall_seconds"], 4),
        "cost": round(cost, 4),
        "verify_cost": round(verify_cost, 4),
        "predicted_speedup": round(speedup(alpha, gamma, cost, verify_cost), 4),
    }


def bond_sizing(result: dict, rows: dict[str, dict]) -> dict[str, BondSizing]:
    out = {}
    for mode in MODES:
        episode = result["cheating"]["episodes"][mode]
        caught = episode["at_fault"] and episode["slashed_wei"] > 0
        audits = result["audits"][mode]
        out[mode] = BondSizing(
            tokens_per_answer=rows[mode]["tokens"] / rows[mode]["answers"],
            price_wei_per_token=PRICE_WEI_PER_TOKEN,
            audit_rate=AUDIT_RATE,
            catch_rate=1.0 if caught else 0.0,  # one cheating episode per mode in a run
            challenge_gas=episode["challenge_gas"],
            resolve_gas=episode["resolve_gas"],
            audit_seconds_per_answer=audits["seconds"] / max(audits["answers"], 1),
            gas_price_wei=result["gas_price_wei"],
        )
    return out


def run_ok(result: dict) -> bool:
    """The run showed the thesis: same outputs; every cheat slashed the configured amount; every
    drafter paid exactly price x its credited tokens."""
    slash = result["bond_config"]["slash_amount"]
    episodes = result["cheating"]["episodes"].values()
    slashed = all(e["at_fault"] and e["slashed_wei"] == slash for e in episodes)
    return result["identical_outputs"] and slashed and payments_ok(result.get("payments", []))


def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _seconds(value: float) -> str:
    return f"{value:.3f} s"


def _eth(wei: float) -> str:
    return f"{wei / ETHER:.6g} ETH"


def _side_by_side(label_rows: list[tuple[str, str, Callable]], data: dict[str, dict]) -> str:
    header = ["", *(MODE_TITLES[m] for m in MODES)]
    return _table(header, [[label, *(fmt(data[m][key]) for m in MODES)] for label, key, fmt in label_rows])


def _headline(rows: dict[str, dict], result: dict) -> str:
    same = "yes" if result["identical_outputs"] else "**NO**"
    spec, plain = rows["with_speculation"], rows["without_speculation"]
    accepted = {m: f"{rows[m]['draft_tokens_accepted']} / {rows[m]['draft_tokens_proposed']}" for m in MODES}
    table = _side_by_side(
        [
            ("output tokens", "tokens", str),
            ("latency per token", "latency_ms_per_token", lambda v: f"{v} ms"),
            ("first chunk (the prompt's prefill), per answer", "first_chunk_ms_per_answer", lambda v: f"{v} ms"),
            ("latency per token after the first chunk", "decode_ms_per_token", lambda v: f"{v} ms"),
            ("tokens / s", "tokens_per_second", str),
            ("target forward passes", "target_passes", str),
            ("target positions scored", "target_positions", str),
            ("positions per output token", "positions_per_token", str),
            ("target FLOPs per output token", "flops_per_token", lambda v: f"{v:.3g}"),
        ],
        rows,
    )
    table += (
        f"\n| draft tokens accepted / proposed | {accepted['with_speculation']} | {accepted['without_speculation']} |"
    )
    table += f"\n| output hashes | {same} (identical) | |"
    speed = plain["wall_seconds"] / spec["wall_seconds"]
    decode = plain["decode_ms_per_token"] / spec["decode_ms_per_token"]
    return (
        f"{table}\n\nSpeed-up (wall time without ÷ with): **{speed:.2f}×**; outputs identical: **{same}**. After "
        f"each answer's first chunk (the prompt's prefill, which speculation does not shorten: the first round "
        f"is decoded alone while the drafters prefill, `PREFILL_ALONE`): **{decode:.2f}×**."
    )


def _rate(drafter: dict) -> str:
    return f"{drafter['matched'] / drafter['proposed']:.2f}" if drafter["proposed"] else "–"


def _drafters(result: dict) -> str:
    rows = [[*(d[k] for k in DRAFTER_COLUMNS), _rate(d), "yes" if d["benched"] else "no"] for d in result["drafters"]]
    header = ["peer", "strategy", "proposed", "matched", "accepted (credited)", "late", "timeouts", "errors"]
    header += ["match rate", "benched at the end"]
    return _table(header, rows)


def _stop_early(result: dict) -> str:
    """The stop-early operator's episode, one paragraph (absent from reports of older runs)."""
    e = result["cheating"].get("stop_early")
    if e is None:
        return ""
    verdict = "at fault, slashed" if e["at_fault"] else "**not slashed**"
    return (
        f"\n\nAn operator that stops early (`--cheat stop-early`) answered {e['tokens']} of at most "
        f"{e['max_tokens']} tokens, every one the target's, and receipted the answer as done. The challenger's "
        f"re-execution found the early end (the target's next token: {e['next_token']}) and opened an end "
        f"challenge (gas {e['challenge_gas']:,}); the referees judged it by the stop rule the receipt commits "
        f"to: {verdict} ({_eth(e['bond_before_wei'] - e['bond_after_wei'])})."
    )


def _trust_budget(result: dict, rows: dict[str, dict]) -> str:
    audits, episodes, cfg = result["audits"], result["cheating"]["episodes"], result["bond_config"]
    data = {
        m: {
            "serve": rows[m]["positions_per_token"],
            "audit_positions": audits[m]["target_positions"],
            "audit_per_token": audits[m]["positions_per_token"],
            "audit_all_seconds": audits[m]["seconds"],
            "audit_ok": "yes" if audits[m]["all_correct"] else "**NO**",
            **episodes[m],
            "referee_positions": ", ".join(str(w["target_positions"]) for w in episodes[m]["referee_work"]),
            "referee_seconds": ", ".join(_seconds(w["seconds"]) for w in episodes[m]["referee_work"]),
            "min_bond": cfg["min_bond"],
            "paid_from": "the DrafterEscrow, never the bond" if m == "with_speculation" else "– (no drafters)",
        }
        for m in MODES
    }
    return _side_by_side(
        [
            ("target positions per output token, serving", "serve", str),
            ("challenger re-execution of all honest answers: positions", "audit_positions", str),
            ("… per output token", "audit_per_token", str),
            ("… seconds", "audit_all_seconds", _seconds),
            ("… every honest answer found correct", "audit_ok", str),
            ("cheating answer: first wrong token", "first_wrong", str),
            ("cheating answer: re-execution positions", "audit_target_positions", str),
            ("cheating answer: re-execution seconds", "audit_seconds", _seconds),
            ("referees' re-execution of the disputed step: positions (each referee)", "referee_positions", str),
            ("… seconds (each referee)", "referee_seconds", str),
            ("gas: challenge", "challenge_gas", lambda v: f"{v:,}"),
            ("gas: resolution (referee quorum, at fault)", "resolve_gas", lambda v: f"{v:,}"),
            ("referee signatures on the resolution (separate processes)", "referee_signatures", str),
            ("drafter payments come out of", "paid_from", str),
            ("bond required (contract minimum)", "min_bond", _eth),
            ("bond posted by the operator", "bond_before_wei", _eth),
            ("slashed", "slashed_wei", _eth),
            ("challenger paid (bond back + reward), withdrawn", "challenger_paid_wei", _eth),
        ],
        data,
    )


def _forgery(f: dict) -> str:
    rows = [
        ["textbook min(1, p/q) (Leviathan et al. 2023)", f"{f['textbook_freq']:.4f}", f"{f['textbook_tv']:.4f}"],
        ["GUMBEL sample-and-match (this system)", f"{f['gumbel_freq']:.4f}", f"{f['gumbel_tv']:.4f}"],
        ["exact samples from the target (noise floor)", "–", f"{f['noise_floor_tv']:.4f}"],
    ]
    table = _table(
        ["rule, same lying drafter", f"P(first token = {f['wanted_text']!r})", "TV distance from target"], rows
    )
    return (
        f"The lying drafter always proposes token {f['wanted_token']} ({f['wanted_text']!r}), to which the target "
        f"gives probability {f['target_prob']:.3g}, and claims q = 1e-9 for it. First output token after the "
        f"first prompt, {f['samples']} seeds per rule, shipped target model:\n\n{table}"
    )


def _bond(sizing: dict[str, BondSizing], result: dict) -> str:
    data = {m: s.to_dict() for m, s in sizing.items()}
    table = _side_by_side(
        [
            ("output tokens per answer (measured)", "tokens_per_answer", lambda v: f"{v:g}"),
            ("g: gain from cheating one answer (its fee)", "gain_wei", _eth),
            ("catch rate (cheats challenged → slashed, measured)", "catch_rate", lambda v: f"{v:g}"),
            ("p = audit rate × catch rate", "detection_probability", lambda v: f"{v:g}"),
            ("**B ≥ g / p**", "min_bond_wei", lambda v: f"**{_eth(v)}**"),
            (
                "challenger's cost: re-execution per answer (measured)",
                "audit_seconds_per_answer",
                _seconds,
            ),
            ("challenger's cost: challenge gas × gas price", "challenge_cost_wei", _eth),
        ],
        data,
    )
    cfg = result["bond_config"]
    reward = cfg["slash_amount"] * cfg["challenger_reward_bps"] // 10_000
    return (
        f"Assumptions (not measured): fee {_eth(PRICE_WEI_PER_TOKEN)} per output token, audit rate {AUDIT_RATE:g}.\n\n"
        f"{table}\n\nEvery input to B is the same with and without speculation: the answer (so its fee) is identical, "
        f"and a challenge re-executes plain decoding on the answer's tokens whoever drafted them. The contract's "
        f"minimum bond is {_eth(cfg['min_bond'])} and a slash pays the challenger {_eth(reward)} on top of its "
        f"{_eth(cfg['challenger_bond'])} challenger bond, against the challenge's gas cost above."
    )


def _rounds_at(result: dict, fit: dict) -> list[int]:
    """Tokens per target pass, round by round, of the in-process run at the p2p run's γ."""
    return next((p["tokens_per_round"] for p in result["local_sweep"] if p["gamma"] == fit["gamma"]), [])


def write_plots(result: dict, rows: dict[str, dict], fit: dict, out: Path) -> list[Path]:
    return [
        plot_with_without({MODE_TITLES[m]: rows[m] for m in MODES}, out / "with_without.png"),
        plot_drafter_acceptance(result["drafters"], out / "drafter_acceptance.png"),
        plot_omega_convergence(
            [fit["alpha"]],
            fit["gamma"],
            OMEGA_ROUNDS,
            out / "omega_convergence.png",
            fit["omega"],
            _rounds_at(result, fit),
        ),
        plot_speedup_measured(fit, result["local_sweep"], out / "speedup_vs_gamma.png"),
    ]


def _intro(s: dict) -> str:
    quick = " --quick" if s["mode"] == "quick" else ""
    kind = "chat messages through the target's chat template" if s.get("chat") else "completion prompts"
    cores = s.get("cores", {})
    return (
        f"Generated by `specmarket demo-net{quick} --pair {s.get('pair', '?')}` on {s['date']} ({s['cpus']} CPUs"
        f"{', ' + s['cpu'] if s.get('cpu') else ''}, "
        f"{s['demo_seconds']} s end to end; targets on cores {cores.get('targets', '?')}, drafter peers on cores "
        f"{cores.get('drafters', '?')}). {len(s['prompts'])} {kind} × at most {s['max_tokens']} tokens at temperature "
        f"{s['temperature']}, "
        f"seeds 0…{len(s['prompts']) - 1}, γ = {s['gamma']}; drafter peers: {', '.join(s['drafters'])}; "
        f"{s['warm_up']}. Every "
        "figure below was measured in that run; `demo_net.json` holds the raw numbers."
    )


def _memory(memory: dict | None) -> str:
    if not memory:
        return ""
    return (
        f"\n\nMemory: the demo's processes (every target, referee, drafter peer and the demo itself) held at "
        f"most **{memory['tree_pss_peak_gib']} GiB** together (summed PSS: the memory-mapped weights they share "
        f"count once), and the machine's memory in use peaked {memory['system_used_peak_above_idle_gib']} GiB "
        f"above its idle {memory['system_used_idle_gib']} GiB (goal ≤ 12 GiB above idle)."
    )


def _theory(fit: dict) -> str:
    verdict = "bought" if fit["speedup"] > 1 else "did not buy"
    return (
        f"Measured Ω = {fit['omega']} tokens per target pass ⇒ α = {fit['alpha']} (raw acceptance "
        f"{fit['acceptance_rate']}). In units of one plain target pass: drafting cost c = {fit['cost']} per draft "
        f"token (the wait for drafts over libp2p), verification v = {fit['verify_cost']} per round. The theory's "
        f"S = Ω / (γc + v) with these measured terms gives {fit['predicted_speedup']}× (an accounting of the run, "
        f"not an independent prediction); measured {fit['speedup']}× with {fit['mean_draft_length']} draft tokens per "
        f"round on average (γ ≤ {fit['max_gamma']}: drafters end a block at a token they are unsure of): "
        f"speculation over the network {verdict} wall-clock latency in this run. It always cuts the target's "
        "sequential passes; it pays in wall time only while γc + v < Ω, that is when a target pass is expensive "
        "next to a draft round trip."
    )


def alpha_needed(target: float, gamma: int, cost: float, verify_cost: float) -> float | None:
    """The α at which S(α, γ, c, v) reaches ``target`` (bisection; S increases with α), or None
    when even α = 1 falls short."""
    if speedup(1.0, gamma, cost, verify_cost) < target:
        return None
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if speedup(mid, gamma, cost, verify_cost) < target else (low, mid)
    return high


def _goals(fit: dict, points: list[dict]) -> str:
    """The network speed-up against its goal, p2p against in-process speculation at the same γ, and
    what α the run's own costs would need for the goal."""
    local = max(points, key=lambda p: p["speedup"], default=None)
    met = "met" if fit["speedup"] >= NETWORK_SPEEDUP_GOAL else "**NOT met**"
    lines = [
        f"- Speculation over libp2p against plain decoding: **{fit['speedup']}×** (goal ≥ {NETWORK_SPEEDUP_GOAL}×, "
        f"stretch {NETWORK_SPEEDUP_STRETCH}×): {met}."
    ]
    if local is not None:
        verdict = "met" if fit["speedup"] >= local["speedup"] else "**NOT met**"
        lines.append(
            f"- p2p against the best in-process speculation (γ = {local['gamma']}): {fit['speedup']}× against "
            f"{local['speedup']}× (goal: p2p ≥ in-process, since the drafting moved off the target's core): {verdict}."
        )
    need = alpha_needed(NETWORK_SPEEDUP_GOAL, fit["mean_draft_length"], fit["cost"], fit["verify_cost"])
    needed = f"α ≈ {need:.2f}" if need is not None else "more than α = 1 can give: c and v must fall first"
    lines.append(
        f"- Decomposition: the draft's α = {fit['alpha']} (tokens per pass Ω = {fit['omega']}), the wait for drafts "
        f"c = {fit['cost']} plain passes per draft token, a speculative round v = {fit['verify_cost']} plain passes. "
        f"With this run's c and v, {NETWORK_SPEEDUP_GOAL}× at {fit['mean_draft_length']} draft tokens per round "
        f"needs {needed}."
    )
    return "\n".join(lines)


def _sweep(points: list[dict], runs: dict | None) -> str:
    subset = ""
    if runs is not None and runs["prompts"] < runs["of"]:
        subset = f" (the first {runs['prompts']} of the {runs['of']} prompts, {runs['repeats']} run(s) each)"
    rows = [
        [p["gamma"], p["omega"], p["alpha"], f"{p['speedup']}×", "yes" if p["identical"] else "**NO**"] for p in points
    ]
    header = ["γ", "Ω (tokens / pass)", "α", "speed-up vs plain", "same tokens as plain"]
    return (
        f"The same pair, prompts{subset} and seeds decoded in the demo process with the in-process drafter (no "
        f"network round trip; one torch thread, as the targets):\n\n{_table(header, rows)}"
    )


def render(result: dict, rows: dict[str, dict], fit: dict, sizing: dict[str, BondSizing]) -> str:
    drafters = "Drafters post no bond and are never slashed; a hostile one only loses its turn."
    trust = (
        "Speculation moves the target's work into fewer, wider passes; it does not lower what checking the "
        "operator costs."
    )
    sections = [
        "# specmarket: the thesis, measured",
        _intro(result["setup"]) + _memory(result.get("memory")),
        "## With and without speculation\n\n" + _headline(rows, result),
        "![with and without speculation](with_without.png)",
        render_rounds(result["with_speculation"].get("rounds")),
        f"## Drafter peers\n\n{drafters}\n\n{_drafters(result)}",
        "![per-drafter acceptance](drafter_acceptance.png)",
        render_payments(result.get("payments")),
        f"## The trust budget\n\n{trust}\n\n{_trust_budget(result, rows)}\n\n{TRUST_NOTES}{_stop_early(result)}",
        "## The forgery row\n\n" + _forgery(result["forgery"]),
        "## Bond sizing\n\n" + _bond(sizing, result),
        "## Theory against the run\n\n" + _theory(fit),
        "### The goals\n\n" + _goals(fit, result["local_sweep"]),
        _sweep(result["local_sweep"], result.get("local_sweep_runs")),
        "![Ω convergence](omega_convergence.png)\n\n![S against γ](speedup_vs_gamma.png)\n\n"
        "The [interactive simulator](simulator.html) (open it in a browser; it works offline) runs these rounds "
        "one at a time and draws S(γ) for any α, c and v, with this run's measurements preselected.",
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


def write_report(result: dict, out: Path) -> list[Path]:
    """report/README.md, the PNGs, demo_net.json (with the derived rows) and simulator.html."""
    out.mkdir(parents=True, exist_ok=True)
    rows = derive(result)
    fit = speculation_fit(result, rows)
    sizing = bond_sizing(result, rows)
    derived = {"rows": rows, "fit": fit, "bond_sizing": {m: s.to_dict() for m, s in sizing.items()}}
    paths = write_plots(result, rows, fit, out)
    serving = serving_sections(out)  # bench-serve and bench-trees, where their JSON lies beside the report
    (out / "README.md").write_text(render(result, rows, fit, sizing) + (f"\n{serving}\n" if serving else ""))
    (out / "demo_net.json").write_text(json.dumps({**result, "derived": derived}, indent=2) + "\n")
    simulator = write_simulator(out, {**result, "derived": derived})  # the measurements preselected
    return [*paths, out / "README.md", out / "demo_net.json", simulator]


def print_summary(result: dict) -> None:
    rows = derive(result)
    print(f"{'':<22}{'tok/s':>8}{'ms/token':>10}{'passes':>8}{'positions':>11}{'accepted':>10}")
    for mode in MODES:
        r = rows[mode]
        accepted = f"{r['draft_tokens_accepted']}/{r['draft_tokens_proposed']}"
        print(
            f"{MODE_TITLES[mode]:<22}{r['tokens_per_second']:>8}{r['latency_ms_per_token']:>10}"
            f"{r['target_passes']:>8}{r['target_positions']:>11}{accepted:>10}"
        )
    print(f"identical outputs with and without speculation: {result['identical_outputs']}")
    for mode, e in result["cheating"]["episodes"].items():
        print(
            f"cheating operator {MODE_TITLES[mode]}: wrong token {e['first_wrong']}, "
            f"challenge gas {e['challenge_gas']}, resolution gas {e['resolve_gas']}, slashed {_eth(e['slashed_wei'])}"
        )
    if (stop := result["cheating"].get("stop_early")) is not None:
        print(
            f"stop-early operator: {stop['tokens']} of at most {stop['max_tokens']} tokens, end challenge gas "
            f"{stop['challenge_gas']}, slashed {_eth(stop['bond_before_wei'] - stop['bond_after_wei'])}"
        )
    for r in result.get("payments", []):
        earned, redeemed = _eth(r["earned_wei"]), _eth(r["redeemed_wei"])
        print(f"drafter {r['name']}: {r['credited']} tokens credited, earned {earned}, redeemed {redeemed}")
    f = result["forgery"]
    print(
        f"forgery (TV distance from the target): textbook rule {f['textbook_tv']:.3f}, "
        f"GUMBEL {f['gumbel_tv']:.3f}, noise floor {f['noise_floor_tv']:.3f}"
    )
