"""The simulator page's formulas (window.SpecTheory in node/target/http/static/simulator.js, run by Node.js in
a vm context, no browser) against verifier/theory.py, and its measurement parser against the
committed report and the self-contained page that ``write_simulator`` embeds it in."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from node.target.http.pages import measurement_summary, simulator_html
from verifier.theory import expected_tokens, optimal_gamma, speedup

ROOT = Path(__file__).resolve().parent.parent
SIMULATOR_JS = ROOT / "node" / "target" / "http" / "static" / "simulator.js"
DEMO_JSON = ROOT / "report" / "demo_net.json"
ALPHAS = [round(0.05 * i, 10) for i in range(21)]  # 0, 0.05, ..., 1.0
GAMMAS = range(17)
COSTS = (0.0, 0.05, 0.2, 0.5, 1.0)
VERIFY_COSTS = (1.0, 1.2)
TOLERANCE = 1e-9
PAGE_MAX_GAMMA = 16

# Loads simulator.js in a fresh vm context (no document: only its formulas run), then answers each
# [name, args] of stdin with {"value": ...} or {"error": message}. "meanTokens" runs rounds.
RUNNER = r"""
const fs = require("fs");
const vm = require("vm");
const context = vm.createContext({});
vm.runInContext(fs.readFileSync(process.argv[1], "utf8"), context, { filename: "simulator.js" });
const T = context.SpecTheory;
const extra = {
  meanTokens(seed, alpha, gamma, rounds) {
    const rng = T.makeRng(seed);
    let total = 0;
    for (let i = 0; i < rounds; i++) total += T.simulateRound(rng, alpha, gamma).tokens;
    return total / rounds;
  },
  hasDocumentCode() { return typeof context.SpecSimulator !== "undefined"; },
};
const calls = JSON.parse(fs.readFileSync(0, "utf8"));
const answers = calls.map(([name, args]) => {
  try {
    return { value: (extra[name] || T[name])(...args) };
  } catch (err) {
    return { error: String(err && err.message) };
  }
});
process.stdout.write(JSON.stringify(answers));
"""


def node_binary() -> str:
    found = shutil.which("node")
    if found is None:
        message = "Node.js (`node`) is needed to run the simulator's JS (make setup installs the node tooling)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def run_js(calls: list[tuple[str, list]]) -> list[dict]:
    """Each (SpecTheory function, args) evaluated by simulator.js in Node: {"value"} or {"error"}."""
    out = subprocess.run(
        [node_binary(), "-e", RUNNER, str(SIMULATOR_JS)],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    answers = json.loads(out.stdout)
    assert len(answers) == len(calls)
    return answers


def values(calls: list[tuple[str, list]]) -> list:
    answers = run_js(calls)
    errors = [(call, a["error"]) for call, a in zip(calls, answers, strict=True) if "error" in a]
    assert not errors, errors[:5]
    return [a["value"] for a in answers]


def close(js: float, py: float) -> bool:
    return abs(js - py) <= TOLERANCE * max(1.0, abs(py))


def test_expected_tokens_and_speedup_match_theory_on_a_grid():
    omega_cases = [(a, g) for a in ALPHAS for g in GAMMAS]
    speed_cases = [(a, g, c, v) for a, g in omega_cases for c in COSTS for v in VERIFY_COSTS]
    calls = [("expectedTokens", list(x)) for x in omega_cases] + [("speedup", list(x)) for x in speed_cases]
    got = values(calls)
    omegas, speeds = got[: len(omega_cases)], got[len(omega_cases) :]
    wrong = [(x, js) for x, js in zip(omega_cases, omegas, strict=True) if not close(js, expected_tokens(*x))]
    assert not wrong, wrong[:5]
    wrong = [(x, js) for x, js in zip(speed_cases, speeds, strict=True) if not close(js, speedup(*x))]
    assert not wrong, wrong[:5]
    assert omegas[omega_cases.index((1.0, 16))] == 17  # α = 1: γ + 1 exactly


def test_optimal_gamma_matches_theory():
    cases = [(a, c) for a in ALPHAS for c in COSTS]
    calls = [("optimalGamma", [a, c]) for a, c in cases]  # theory's default max_gamma
    calls += [("optimalGamma", [a, c, PAGE_MAX_GAMMA]) for a, c in cases]  # the page's range
    calls += [("optimalGamma", [a, c, PAGE_MAX_GAMMA, v]) for a, c in cases for v in VERIFY_COSTS]
    got = values(calls)
    n = len(cases)
    assert got[:n] == [optimal_gamma(a, c) for a, c in cases]
    assert got[n : 2 * n] == [optimal_gamma(a, c, max_gamma=PAGE_MAX_GAMMA) for a, c in cases]
    with_v = [optimal_gamma(a, c, PAGE_MAX_GAMMA, v) for a, c in cases for v in VERIFY_COSTS]
    assert got[2 * n :] == with_v
    assert len(set(got[n : 2 * n])) > 3, "the grid should move the optimum around"


def test_invalid_parameters_are_refused_as_theory_refuses_them():
    bad = [
        ("expectedTokens", [-0.1, 3]),
        ("expectedTokens", [1.1, 3]),
        ("expectedTokens", [0.5, -1]),
        ("speedup", [0.5, 3, -0.1, 1.0]),
        ("speedup", [0.5, 3, 0.1, 0.0]),
    ]
    assert all("error" in a for a in run_js(bad))


def test_simulated_rounds_converge_to_omega_and_are_seeded():
    alpha, gamma, rounds = 0.7, 4, 20000
    first, again, other = values([("meanTokens", [s, alpha, gamma, rounds]) for s in (1, 1, 2)])
    assert first == again and first != other
    omega = expected_tokens(alpha, gamma)
    spread = (gamma + 1) / rounds**0.5  # tokens per round lie in [1, γ+1]: a loose bound on 1 SE
    assert abs(first - omega) < 4 * spread and abs(other - omega) < 4 * spread
    assert values([("hasDocumentCode", [])]) == [False]  # without a document only the formulas ran


def test_measurements_are_parsed_from_the_demo_report_and_bench_results():
    demo = json.loads(DEMO_JSON.read_text())
    fit = demo["derived"]["fit"]
    bench = {"temperature": 0.8, "modes": {}, "bound": {"alpha": 0.61, "c": 0.08, "v": 1.15, "bound": 1.7}}
    nested = {"runs": [bench]}
    parsed, from_summary, from_bench, from_nested = values(
        [("parseMeasurement", [x]) for x in (demo, measurement_summary(demo), bench, nested)]
    )
    assert (parsed["alpha"], parsed["c"], parsed["v"], parsed["gamma"]) == (
        fit["alpha"],
        fit["cost"],
        fit["verify_cost"],
        fit["gamma"],
    )
    assert len(parsed["points"]) == len(demo["local_sweep"]) + 1  # the sweep and the networked run
    assert from_summary == parsed  # what write_simulator embeds says the same
    assert from_bench["kind"] == from_nested["kind"] == "bench"
    assert (from_bench["alpha"], from_bench["c"], from_bench["v"]) == (0.61, 0.08, 1.15)
    assert all("error" in a for a in run_js([("parseMeasurement", [{}]), ("parseMeasurement", [{"bound": {}}])]))


def test_the_self_contained_simulator_inlines_everything():
    demo = json.loads(DEMO_JSON.read_text())
    hostile = {"derived": {"fit": {**demo["derived"]["fit"], "note": "</script><script>alert(1)</script>"}}}
    html = simulator_html(hostile)
    assert 'src="simulator.js"' not in html and 'href="style.css"' not in html
    assert "root.SpecTheory = " in html and "--accent" in html  # the script and the style, inline
    assert html.count("</script>") == 2  # the JSON block and the inlined script: the note did not close one
    block = html.split('<script type="application/json" id="measured">', 1)[1].split("</script>", 1)[0]
    assert json.loads(block)["derived"]["fit"]["note"] == hostile["derived"]["fit"]["note"]
    assert '<script type="application/json" id="measured">null</script>' in simulator_html(None)
