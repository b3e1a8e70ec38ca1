"""`specmarket demo` (what `make demo` runs): GUMBEL identical for every drafter, LEVIATHAN forged."""

from __future__ import annotations

import json

from node.cli import main


def test_demo_runs_and_shows_the_thesis(tmp_path, capsys):
    assert main(["demo", "--max-new-tokens", "16", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "demo.json").read_text())["rows"]
    by_key = {(r["drafter"], r["rule"]): r for r in rows}
    assert all(r["identical_to_plain"] for r in rows if r["rule"] == "gumbel")
    assert not by_key[("lying", "leviathan")]["identical_to_plain"]
    assert by_key[("honest", "gumbel")]["target_passes"] < by_key[("none", "gumbel")]["target_passes"]
    assert by_key[("garbage", "gumbel")]["invalid_proposals"] > 0
    assert (tmp_path / "speedup_vs_gamma.png").exists() and (tmp_path / "omega_convergence.png").exists()
    assert "forged by the lying drafter: True" in capsys.readouterr().out
