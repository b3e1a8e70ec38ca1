"""`specmarket demo-net` (what `make demo` runs): the thesis end to end, every party its own process.

1. an anvil chain (from npm) with SpecmarketBond deployed;
2. a bonded target node with four drafter peers over libp2p (two honest, two hostile), and a
   second bonded target that does not speculate; the same prompts go to both through the
   OpenAI-compatible API: speculation changes the target passes, not the answers;
3. every answer is re-executed the way a challenger would (the challenge's cost, with and without
   speculation);
4. two cheating operators (`--cheat flip-token`), one speculating with an honest drafter peer and
   one not: each answer is audited, challenged on chain, resolved by two referee processes (one
   key each, the contract's 2-of-3 quorum), and the operator is slashed; then a third
   (`--cheat stop-early`, in the place of the second) stops an answer half-way: challenged at its
   end, judged by its receipted stop rule, slashed;
5. the forgery row (the textbook rule against GUMBEL with a lying drafter) and the report
   (report/README.md with PNGs, from node/report.py).

Every process it starts is stopped when it ends, on an error or Ctrl-C/SIGTERM too.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from tqdm import tqdm

from node.client.http import http_json
from node.lab.config import NetDemoConfig
from node.lab.demo_payments import payees, redeem_rows, with_escrow
from node.lab.memory import MemoryPeak
from node.lab.procs import (
    STARTUP_TIMEOUT_S,
    NodeProcess,
    ProcessFailed,
    ProcessGroup,
    core_split,
    spawn,
    start_drafter,
    start_target,
    wait_for_drafters,
    warm_up_market,
)
from node.lab.workload import MODES, ask, credited, job_rounds, prompt_ids
from node.model.kernels import cpu_summary
from node.model.pairs import get_pair
from node.runtime.lifecycle import sigterm_unwinds
from node.target.config import TARGET_GAMMA, TargetConfig

log = logging.getLogger(__name__)

DEMO_DRAFTERS = ("honest", "honest", "lying", "garbage")  # two honest peers, two hostile ones
DEMO_TEMPERATURE = 0.8
DEMO_GAMMA = TARGET_GAMMA  # a round's most draft tokens; honest drafters end blocks early
# drafters asked per job: one. Every drafter peer of the demo shares one core (procs.core_split); two
# drafting for one job would halve each one's speed. The market still tries each peer (warm-up).
DEMO_MAX_DRAFTERS = "1"
CHEAT = "flip-token"
VERDICT_TIMEOUT_S = 120.0
REFEREE_OUTCOME_TIMEOUT_S = 30.0  # a resolved challenge: each referee has printed its outcome by now
DRAFTERS_TIMEOUT_S = 60.0
MAX_WARM_UP_JOBS_PER_DRAFTER = 4
WARM_UP_PROMPT, WARM_UP_SEED = "# warm-up\n", 10_000


def _worst_case_offered(tokens: int, gamma: int) -> int:
    """The most draft tokens a job of ``tokens`` offers: one token emitted a round, each round
    offering γ capped so as not to pass the end (verifier.decode)."""
    return sum(min(gamma, tokens - k - 1) for k in range(tokens))


# The longest warm-up job that can never get its drafter judged (judge_after_tokens offered) on its
# own: every drafter has its trial before one is judged, and with one slot per job the judged one
# keeps it (market/policy.py).
WARM_UP_TOKENS = max(t for t in range(2, 64) if _worst_case_offered(t, DEMO_GAMMA) < TargetConfig.judge_after_tokens)


def step(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _ask(http: str, cfg: NetDemoConfig, prompt: str, seed: int, max_tokens: int | None = None) -> dict:
    """One answer at the demo's temperature: a chat completion on a chat pair, else a completion."""
    tokens = max_tokens or cfg.max_tokens
    return ask(http, prompt, cfg.workload.chat, seed=seed, max_tokens=tokens, temperature=DEMO_TEMPERATURE)


def _ask_all(http: str, cfg: NetDemoConfig, label: str) -> list[dict]:
    prompts = tqdm(cfg.prompts, desc=label, unit="prompt", file=sys.stderr)
    return [_ask(http, cfg, prompt, seed) for seed, prompt in enumerate(prompts)]


def _mode_row(answers: list[dict]) -> dict:
    stats = [a["specmarket"]["stats"] for a in answers]
    total = {key: sum(s.get(key, 0) for s in stats) for key in stats[0]}
    return {
        "answers": len(answers),
        "tokens": sum(len(a["specmarket"]["tokens"]) for a in answers),
        "wall_seconds": round(total["wall_seconds"], 4),
        "target_passes": total["target_passes"],
        "target_positions": total["target_positions"],
        "draft_tokens_proposed": total["draft_tokens_proposed"],
        "draft_tokens_accepted": total["draft_tokens_accepted"],
        "lookup_tokens_accepted": total.get("lookup_tokens_accepted", 0),  # of those: the target's own lookup's
        "draft_rounds": total.get("draft_rounds", 0),
        "draft_wait_seconds": round(total.get("draft_wait_seconds", 0.0), 4),
        "first_chunk_seconds": round(total.get("first_chunk_seconds", 0.0), 4),
        "first_chunk_tokens": total.get("first_chunk_tokens", 0),
        **_timing_row(stats, total),
        "output_hashes": [a["specmarket"]["receipt"]["receipt"]["output_hash"] for a in answers],
        "tokens_per_answer": [a["specmarket"]["tokens"] for a in answers],
    }


def _timing_row(stats: list[dict], total: dict) -> dict:
    """The drafting timings of a mode's answers taken together (node/target/draft_timing.py)."""
    answers = total.get("draft_answers", 0)
    round_trip = sum(s.get("draft_round_trip_ms_per_answer", 0) * s.get("draft_answers", 0) for s in stats)
    transport = 1000 * total.get("draft_transport_seconds", 0.0)
    return {
        "target_pass_seconds": round(total.get("target_pass_seconds", 0.0), 4),
        "draft_answers": answers,
        "draft_round_trip_ms_per_answer": round(round_trip / answers, 3) if answers else 0.0,
        "draft_transport_ms_per_answer": round(transport / answers, 3) if answers else 0.0,
        "draft_wait_ms_max": max(s.get("draft_wait_ms_max", 0.0) for s in stats),
        "draft_early_hits": total.get("draft_early_hits", 0),
        "draft_early_ready": total.get("draft_early_ready", 0),
        "draft_early_stale": total.get("draft_early_stale", 0),
    }


def _drafter_rows(http: str, drafters: dict[str, str], credits: dict[str, int]) -> list[dict]:
    """Per drafter peer (name -> multiaddr): what the target's market recorded about it."""
    stats = http_json(f"{http}/health")["drafters"]
    rows = []
    for name, addr in drafters.items():
        peer = addr.rsplit("/", 1)[-1]
        s = stats.get(peer, {})
        rows.append(
            {
                "name": name,
                "strategy": name.split("-", 1)[1],
                "peer_id": peer,
                "proposed": s.get("lifetime_proposed", 0),
                "matched": s.get("lifetime_matched", 0),
                "accepted": credits.get(peer, 0),
                "rounds_in_time": s.get("rounds", 0),
                "timeouts": s.get("timeouts", 0),
                "late": s.get("late", 0),
                "errors": s.get("errors", 0),
                "benched": bool(s.get("benched", False)),
            }
        )
    return rows


def _referee_starters(work: Path, chain_args: list[str], pair: str) -> list[partial]:
    """One `specmarket referee` process per key of a quorum (anvil dev referees; threshold of them),
    sharing one verdict pool: a challenge resolves only when enough of them have signed."""
    from node.chain.deployment import DEFAULT_THRESHOLD, DEV_REFEREES, dev_key
    from node.chain.keys import write_key

    starters = []
    for index in DEV_REFEREES[:DEFAULT_THRESHOLD]:
        key_file = work / f"referee{index}.key"
        write_key(key_file, dev_key(index))  # anvil's public dev key: a demo secret only
        args = [
            "referee",
            "--pair",
            pair,
            *chain_args_for_cli(chain_args),
            "--key-file",
            str(key_file),
            "--pool",
            str(work / "verdicts"),
            "--json",  # one 'outcome: {...}' line per verdict, with the cost of its re-execution
        ]
        starters.append(partial(spawn, args, work / f"referee{index}.log", ("referee",), STARTUP_TIMEOUT_S))
    return starters


def _drafter_names() -> list[str]:
    return [f"drafter{i}-{strategy}" for i, strategy in enumerate(DEMO_DRAFTERS)]


def _start_parties(group: ProcessGroup, work: Path, chain_args: list[str], pair: str, payees: dict) -> dict:
    """Four bonded targets (speculating, plain, and a cheating one of each) and a quorum of referee
    processes, then the drafter peers: the four of the market (each paid at its own address), and one
    honest peer for the speculating cheat. Returns the targets' HTTP URLs, the drafters' multiaddrs and the referee
    processes."""
    target_cpus, drafter_cpus = core_split()
    target = partial(start_target, work, *chain_args, "--gamma", str(DEMO_GAMMA), pair=pair, cpus=target_cpus)
    cheat = ("--cheat", CHEAT)
    speculating = ("--max-drafters", DEMO_MAX_DRAFTERS, "--wait-budget", "0")
    referees = _referee_starters(work, chain_args, pair)
    step(f"starting 4 bonded targets and {len(referees)} referee processes (each loads its models: about a minute)")
    spec, plain, cheat_spec, cheat_plain, *referee_nodes = group.start_all(
        [
            # --wait-budget 0: the demo measures speculation as such, not the market's fallback to plain
            partial(target, *speculating, name="target-spec"),
            partial(target, "--max-drafters", "0", name="target-plain"),
            partial(target, *speculating, *cheat, name="target-cheat-spec"),
            partial(target, "--max-drafters", "0", *cheat, name="target-cheat-plain"),
            *referees,
        ]
    )
    names = _drafter_names()
    bootstrap = spec.lines["multiaddr"][0]
    drafter = partial(start_drafter, work, pair=pair, cpus=drafter_cpus)
    starters = [
        partial(drafter, bootstrap, s, n, "--seed", str(i), "--payout", payees[n].address)
        for i, (s, n) in enumerate(zip(DEMO_DRAFTERS, names, strict=True))
    ]
    starters.append(partial(drafter, cheat_spec.lines["multiaddr"][0], "honest", "drafter-for-cheat"))
    step(f"starting {len(starters)} drafter peers")
    drafters = group.start_all(starters)
    wait_for_drafters(spec.lines["http"][0], len(DEMO_DRAFTERS), DRAFTERS_TIMEOUT_S)
    wait_for_drafters(cheat_spec.lines["http"][0], 1, DRAFTERS_TIMEOUT_S)
    step(f"targets and referees up; {len(DEMO_DRAFTERS)} drafter peers ({', '.join(DEMO_DRAFTERS)}) registered")
    return {
        "spec": spec.lines["http"][0],
        "plain": plain.lines["http"][0],
        "cheat_with_speculation": cheat_spec.lines["http"][0],
        "cheat_without_speculation": cheat_plain.lines["http"][0],
        "cheat_plain_process": cheat_plain,  # stopped for the stop-early operator (_stop_early_episode)
        "drafters": {n: d.lines["multiaddr"][0] for n, d in zip(names, drafters, strict=False)},
        "referees": referee_nodes,  # their outcome lines say what each re-executed
    }


def _warm_up(urls: dict, cfg: NetDemoConfig) -> None:
    """Short requests, not counted: a target's first job opens its drafter sessions and fills its
    caches. A job asks at most one untried drafter, and while no drafter is judged (the target's
    ``judge_after_tokens`` offered tokens) a job's one slot goes to the least tried peer, hostile
    ones included. So the speculating target is warmed until every drafter has had its trial and
    one that is not benched has been judged: the measured prompts then see the market in its
    steady state (each request has its own seed: a repeated one is replayed from the receipt
    store, not decoded). The report says so."""
    _ask(urls["plain"], cfg, WARM_UP_PROMPT, WARM_UP_SEED, WARM_UP_TOKENS)
    n = len(urls["drafters"])

    def warm(i: int) -> None:
        _ask(urls["spec"], cfg, WARM_UP_PROMPT, WARM_UP_SEED + i, WARM_UP_TOKENS)

    warm_up_market(urls["spec"], n, warm, MAX_WARM_UP_JOBS_PER_DRAFTER * n)


def _serve_and_compare(urls: dict, cfg: NetDemoConfig) -> dict:
    _warm_up(urls, cfg)
    with_spec = _ask_all(urls["spec"], cfg, "with speculation")
    without = _ask_all(urls["plain"], cfg, "without speculation")
    credits = credited(with_spec)
    identical = [a["specmarket"]["tokens"] for a in with_spec] == [a["specmarket"]["tokens"] for a in without]
    spec_row = _mode_row(with_spec)
    spec_row["rounds"] = [r for a in with_spec for r in job_rounds(urls["spec"], a["specmarket"]["job"])]
    return {
        "with_speculation": spec_row,
        "without_speculation": _mode_row(without),
        "identical_outputs": identical,
        "drafters": _drafter_rows(urls["spec"], urls["drafters"], credits),
        "receipts": {
            "with_speculation": [a["specmarket"]["receipt"] for a in with_spec],
            "without_speculation": [a["specmarket"]["receipt"] for a in without],
        },
    }


def _withdraw_all(client, keys: list[str]) -> dict[str, int]:
    """Pull every credit of ``keys`` (address -> amount withdrawn), so the next resolution starts
    from the same storage state and its gas is comparable."""
    from eth_account import Account

    paid = {}
    for key in keys:
        address = Account.from_key(key).address
        if client.credits(address):
            paid[address] = int(client.decode_events(client.withdraw(key), "Withdrawn")[0]["amount"])
    return paid


def _referee_work(referees: list[NodeProcess], cid: int) -> list[dict]:
    """What each referee process re-executed to judge challenge ``cid`` (from its outcome lines):
    only the disputed step, prompt + the output before it, in one pass."""

    def outcomes(lines: dict[str, list[str]]) -> list[dict]:
        return [o for o in map(json.loads, lines.get("outcome", [])) if o["challenge_id"] == cid]

    work = []
    for referee in referees:
        if not referee.wait_until(lambda lines: bool(outcomes(lines)), REFEREE_OUTCOME_TIMEOUT_S):
            raise ProcessFailed(f"a referee printed no outcome for challenge {cid}:\n{referee.log()[-3000:]}")
        first = outcomes(referee.lines)[0]
        work.append({"target_positions": first["target_positions"], "seconds": first["seconds"]})
    return work


def _cheating_episode(http: str, client, model, cfg: NetDemoConfig, referees: list[NodeProcess]) -> dict:
    """One cheating answer: audited, challenged, resolved by the referee processes, slashed; the
    challenger and the treasury then withdraw what the slash credited them."""
    from node.chain.challenger import challenge_receipt
    from node.chain.client import ChallengeStatus
    from node.chain.deployment import DEV_CHALLENGER, DEV_TREASURY, dev_address, dev_key
    from node.chain.receipts import SignedReceipt
    from node.lab.trust import resolution
    from node.model.loading import model_hash

    answer = _ask(http, cfg, cfg.prompts[0], seed=0)
    signed = SignedReceipt.from_json(answer["specmarket"]["receipt"])
    operator = signed.receipt.operator
    bond_before = client.operator_info(operator).bond
    report = challenge_receipt(
        client, dev_key(DEV_CHALLENGER), model, model_hash(get_pair(cfg.pair).target_dir()), signed
    )
    cid = report.challenge_id
    step(f"cheating operator {operator}: first wrong token at {report.audit.first_wrong}; challenge {cid} opened")
    status = client.wait_closed(cid, VERDICT_TIMEOUT_S)  # the referee processes resolve it
    paid = _withdraw_all(client, [dev_key(DEV_CHALLENGER), dev_key(DEV_TREASURY)])
    stats = answer["specmarket"]["stats"]
    return {
        "receipt": answer["specmarket"]["receipt"],  # popped once the quiet re-timing has used it
        "operator": operator,
        "tokens": len(signed.output),
        "target_passes": stats["target_passes"],
        "draft_tokens_accepted": stats["draft_tokens_accepted"],
        "first_wrong": report.audit.first_wrong,
        "challenge_id": cid,
        "challenge_gas": report.gas_used,
        "audit_target_positions": report.audit.target_positions,
        "audit_seconds": round(report.audit.seconds, 4),
        "referee_work": _referee_work(referees, cid),
        "at_fault": status is ChallengeStatus.OPERATOR_AT_FAULT,
        **resolution(client, cid),
        "bond_before_wei": bond_before,
        "bond_after_wei": client.operator_info(operator).bond,
        "challenger_paid_wei": paid.get(dev_address(DEV_CHALLENGER), 0),
        "treasury_paid_wei": paid.get(dev_address(DEV_TREASURY), 0),
    }


def _stop_early_episode(group: ProcessGroup, work: Path, chain_args: list[str], urls: dict, client, pair, cfg) -> dict:
    """A third cheating operator (`--cheat stop-early`, in the plain cheat's place: the same memory):
    every token the target's, but stopped at half of max_tokens and receipted as done. The
    challenger finds the early end, opens an end challenge, the referee processes judge it by the
    stop rule the receipt commits to, and the operator is slashed."""
    from node.chain.challenger import challenge_receipt
    from node.chain.client import ChallengeStatus
    from node.chain.deployment import DEV_CHALLENGER, DEV_TREASURY, dev_key
    from node.chain.receipts import SignedReceipt
    from node.model.decoding import text_of
    from node.model.loading import model_hash

    urls.pop("cheat_plain_process").stop()
    target_cpus, _ = core_split()
    (stopper,) = group.start_all(
        [partial(start_target, work, *chain_args, "--max-drafters", "0", "--cheat", "stop-early",
                 name="target-cheat-stop", pair=cfg.pair, cpus=target_cpus)]
    )  # fmt: skip
    answer = _ask(stopper.lines["http"][0], cfg, cfg.prompts[0], seed=0)
    signed = SignedReceipt.from_json(answer["specmarket"]["receipt"])
    operator = signed.receipt.operator
    bond_before = client.operator_info(operator).bond
    committed = model_hash(get_pair(cfg.pair).target_dir())
    text = partial(text_of, pair.tokenizer)
    report = challenge_receipt(client, dev_key(DEV_CHALLENGER), pair.target, committed, signed, text=text)
    cid = report.challenge_id
    step(
        f"stop-early operator {operator}: {len(signed.output)} of at most {signed.request.max_tokens} tokens, "
        f"every one right; the target's next was {report.audit.next_token}; end challenge {cid} opened"
    )
    status = client.wait_closed(cid, VERDICT_TIMEOUT_S) if cid is not None else None
    _withdraw_all(client, [dev_key(DEV_CHALLENGER), dev_key(DEV_TREASURY)])
    return {
        "operator": operator,
        "tokens": len(signed.output),
        "max_tokens": signed.request.max_tokens,
        "early_end": report.audit.early_end,
        "next_token": report.audit.next_token,
        "challenge_id": cid,
        "challenge_gas": report.gas_used,
        "at_fault": status is ChallengeStatus.OPERATOR_AT_FAULT,
        "bond_before_wei": bond_before,
        "bond_after_wei": client.operator_info(operator).bond,
    }


def _cheating_episodes(urls: dict, client, model, cfg: NetDemoConfig) -> dict:
    return {mode: _cheating_episode(urls[f"cheat_{mode}"], client, model, cfg, urls["referees"]) for mode in MODES}


def chain_args_for_cli(chain_args: list[str]) -> list[str]:
    """--chain URL --deployments DIR (target flags) -> --rpc URL --deployments DIR (chain commands)."""
    return ["--rpc" if a == "--chain" else a for a in chain_args]


def _measure_offchain(result: dict, pair, cfg: NetDemoConfig) -> None:
    """With every process stopped: the challenger's re-execution of every answer, FLOPs per
    position, the forgery row, and the in-process γ sweep."""
    from node.lab.forgery import measure_forgery
    from node.lab.gamma_sweep import local_sweep
    from node.lab.trust import audit_all, forward_flops_per_position
    from verifier.params import SamplingParams

    model, tokenizer = pair.target, pair.tokenizer
    result["audits"] = audit_all(model, {mode: result["receipts"][mode] for mode in MODES})
    cheats = audit_all(model, {mode: [e.pop("receipt")] for mode, e in result["cheating"]["episodes"].items()})
    for mode, audit in cheats.items():  # re-timed here, quiet: the first was timed with every process up
        episode = result["cheating"]["episodes"][mode]
        episode["audit_seconds"] = audit["seconds"]
        episode["audit_target_positions"] = audit["target_positions"]
        episode["quiet_audit_first_wrong"] = audit["first_wrong"][0]
    result["target_flops_per_position"] = forward_flops_per_position(model)
    step(f"forgery row: {cfg.forgery_samples} seeds per rule")
    prompts = [prompt_ids(tokenizer, p, cfg.workload.chat) for p in cfg.prompts]
    prompt = prompts[0]
    params = SamplingParams(temperature=DEMO_TEMPERATURE)
    result["forgery"] = measure_forgery(model, tokenizer, prompt, params, cfg.forgery_samples).to_dict()
    step("in-process drafter at γ = 1, 2, 4, 8 (measured points for S against γ)")
    work = cfg.workload
    swept = prompts[: work.sweep] if work.sweep else prompts
    result["local_sweep"] = local_sweep(pair, swept, cfg.max_tokens, DEMO_TEMPERATURE, repeats=work.sweep_repeats)
    result["local_sweep_runs"] = {"prompts": len(swept), "of": len(prompts), "repeats": work.sweep_repeats}


def _run(cfg: NetDemoConfig, work: Path, group: ProcessGroup) -> dict:
    from node.chain.anvil import AnvilProcess, free_port
    from node.chain.client import BondClient, connect, deploy
    from node.chain.deployment import DEFAULT_THRESHOLD, DEV_DEPLOYER, DEV_REFEREES, BondConfig, dev_address, dev_key
    from node.model.kernels import DEFAULT_KERNEL
    from node.model.loading import load_pair
    from node.runtime.lifecycle import freeze_startup_heap

    with AnvilProcess(free_port()) as anvil:
        w3 = connect(anvil.url)
        config = BondConfig()
        referees = [dev_address(i) for i in DEV_REFEREES]
        deployment, tx = deploy(w3, dev_key(DEV_DEPLOYER), config, referees, DEFAULT_THRESHOLD)
        deployment = with_escrow(w3, deployment)
        deployment.save(work / "deployments")
        client = BondClient(w3, deployment.address)
        step(f"anvil at {anvil.url}; SpecmarketBond at {deployment.address} (gas {tx.gas_used})")
        step(f"DrafterEscrow at {deployment.escrow}: the targets pay their drafters from it")
        payout = payees(work, _drafter_names())
        chain_args = ["--chain", anvil.url, "--deployments", str(work / "deployments")]
        urls = _start_parties(group, work, chain_args, cfg.pair, payout)
        result = _serve_and_compare(urls, cfg)
        named = get_pair(cfg.pair)
        pair = load_pair(named.target_dir(), named.draft_dir(), DEFAULT_KERNEL)  # the kernel the targets serve with
        freeze_startup_heap()  # no ~0.5 s collections of torch's heap inside the timed re-executions and sweep
        step("cheating-operator episodes (with and without speculation)")
        result["cheating"] = {"episodes": _cheating_episodes(urls, client, pair.target, cfg)}
        step("a third cheating operator (--cheat stop-early): it stops half-way and charges for the answer")
        result["cheating"]["stop_early"] = _stop_early_episode(group, work, chain_args, urls, client, pair, cfg)
        result["bond_config"] = {k: v for k, v in vars(config).items() if k != "treasury"}
        result["gas_price_wei"] = int(w3.eth.gas_price)
        result["deploy_gas"] = tx.gas_used
        credited = _credited(urls)
        step("stopping every process (before anvil, so no referee loses its chain)")
        group.stop_all()
        step("each drafter redeems its vouchers at the operator's escrow")
        result["payments"] = redeem_rows(anvil.url, work, payout, credited)
    step("every process stopped; re-executing every answer as a challenger would")
    _measure_offchain(result, pair, cfg)
    return result


def _credited(urls: dict) -> dict[str, int]:
    """Drafter name -> the tokens the speculating target's ledger credited it in all (warm-up included)."""
    stats = http_json(f"{urls['spec']}/health")["drafters"]
    return {
        name: stats.get(addr.rsplit("/", 1)[-1], {}).get("credited_tokens", 0)
        for name, addr in urls["drafters"].items()
    }


def _cores(cores: frozenset[int] | None) -> list[int] | str:
    return sorted(cores) if cores is not None else "unpinned"


def run_demo_net(cfg: NetDemoConfig) -> int:
    from node.lab.report import print_summary, run_ok, write_report

    cfg = cfg.effective()
    started = time.perf_counter()
    with (
        sigterm_unwinds(),
        tempfile.TemporaryDirectory(prefix="specmarket_demo_") as tmp,
        ProcessGroup() as group,
        MemoryPeak() as memory,
    ):
        result = _run(cfg, Path(tmp), group)
    result["memory"] = memory.report()
    result["setup"] = {
        "mode": "quick" if cfg.quick else "full",
        "pair": cfg.pair,
        "chat": cfg.workload.chat,
        "cores": {"targets": _cores(core_split()[0]), "drafters": _cores(core_split()[1])},
        "prompts": list(cfg.prompts),
        "max_tokens": cfg.max_tokens,
        "temperature": DEMO_TEMPERATURE,
        "gamma": DEMO_GAMMA,
        "drafters": list(DEMO_DRAFTERS),
        "cpus": os.cpu_count(),
        "cpu": cpu_summary(),
        "warm_up": f"{WARM_UP_TOKENS}-token requests before the measured prompts, not counted: one to the plain "
        "target, and to the speculating one until every drafter had its trial and one drafter not benched was "
        "judged (so no measured prompt is spent exploring)",
        "demo_seconds": round(time.perf_counter() - started, 1),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    written = write_report(result, cfg.out)
    print_summary(result)
    print(f"wrote {len(written)} files to {cfg.out}/ (report: {cfg.out / 'README.md'})")
    return 0 if run_ok(result) else 1
