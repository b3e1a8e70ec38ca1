"""The `specmarket` CLI: JSON output, defaults, precedence, clear errors, theory plots."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from node.cli import main

JSON_STATS = {
    "target_passes",
    "draft_tokens_proposed",
    "draft_tokens_accepted",
    "acceptance_rate",
    "mean_accepted_length",
    "tokens_per_second",
    "wall_seconds",
}


def _run_json(capsys, *args: str) -> dict:
    assert main(["generate", "--pair", "tiny", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_console_script_generate_json():
    out = subprocess.run(
        [sys.executable, "-m", "node", "generate", "--prompt", "import os\n", "--max-new-tokens", "8", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.stdout)
    assert len(result["tokens"]) == 8 and isinstance(result["text"], str)
    assert set(result["stats"]) >= JSON_STATS
    assert result["seed"] == 0 and result["rule"] == "gumbel" and result["drafter"] == "honest"


def test_drafters_do_not_change_the_json_output(capsys):
    base = ["--prompt", "def f(x):\n    ", "--max-new-tokens", "16", "--seed", "5", "--temperature", "0.8"]
    plain = _run_json(capsys, *base, "--drafter", "none")
    assert plain["stats"]["draft_tokens_proposed"] == 0 and plain["stats"]["target_passes"] == 16
    for drafter in ("honest", "random", "adversarial", "lying"):
        spec = _run_json(capsys, *base, "--drafter", drafter, "--gamma", "3")
        assert spec["tokens"] == plain["tokens"], drafter
        assert spec["stats"]["draft_tokens_proposed"] > 0


def test_config_file_precedence(tmp_path, capsys):
    cfg = tmp_path / "sm.toml"
    cfg.write_text('[generate]\nmax-new-tokens = 5\nseed = 3\ndrafter = "none"\n')
    from_file = _run_json(capsys, "--prompt", "x = ", "--config", str(cfg))
    assert len(from_file["tokens"]) == 5 and from_file["seed"] == 3 and from_file["drafter"] == "none"
    cli_wins = _run_json(capsys, "--prompt", "x = ", "--config", str(cfg), "--seed", "4")
    assert cli_wins["seed"] == 4 and len(cli_wins["tokens"]) == 5


@pytest.mark.parametrize(
    "args,message",
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "2"], "top_p"),
        (["--gamma", "99"], "gamma"),
        (["--max-new-tokens", "-3"], "max_new_tokens"),
        (["--target-model", "/nonexistent"], "no config.json"),
        (["--max-new-tokens", "4000"], "context window"),
        (["--pair", "smollm2", "--max-new-tokens", "9000"], "context window of 8192"),  # the real target
    ],
)
def test_bad_input_exits_2_with_a_clear_message(args, message, capsys):
    """On the tiny pair unless the case names another (the last --pair wins)."""
    assert main(["generate", "--prompt", "x", "--json", "--pair", "tiny", *args]) == 2
    assert message in capsys.readouterr().err


def test_unknown_config_key_is_rejected(tmp_path, capsys):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[generate]\ntemprature = 0.5\n")
    assert main(["generate", "--prompt", "x", "--config", str(cfg)]) == 2
    assert "temprature" in capsys.readouterr().err


def test_theory_writes_pngs(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"measured_points": [{"gamma": 4, "alpha": 0.6, "speedup": 1.3}]}))
    assert (
        main(
            [
                "theory",
                "--alpha",
                "0.6",
                "0.8",
                "--cost",
                "0.1",
                "--measured",
                str(bench),
                "--rounds",
                "300",
                "--out",
                str(tmp_path / "plots"),
            ]
        )
        == 0
    )
    for name in ("omega_convergence.png", "speedup_vs_gamma.png"):
        data = (tmp_path / "plots" / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
