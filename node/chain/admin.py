"""Running the local chain: which deployment to talk to, whose keys to use, deploying, and status.

Roles on a local anvil chain (chain id 31337) default to anvil's public dev accounts (deployer 0,
referees 1-3, challenger 5); anywhere else every key must come from a file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

from node.chain import ChainError
from node.chain.anvil import ANVIL_CHAIN_ID, chain_id_at, ensure_anvil
from node.chain.challenger import challenge_receipt, read_receipt_file, wait_for_outcome
from node.chain.challenges import DEFAULT_LIMIT, challenge_ids, challenge_table, newest, rows_of, span, utc
from node.chain.client import BondClient, connect, deploy
from node.chain.config import ChainConfig, ChallengeConfig, DeployConfig, RefereeConfig
from node.chain.deployment import (
    DEFAULT_THRESHOLD,
    DEV_CHALLENGER,
    DEV_DEPLOYER,
    DEV_REFEREES,
    Deployment,
    dev_address,
    dev_key,
    format_ether,
    require_dev_chain,
)
from node.chain.escrow import EscrowClient, deploy_escrow, escrow_lines, escrow_status
from node.chain.keys import read_key
from node.chain.referee import Referee
from node.model.decoding import text_of
from node.model.loading import load_model_dir, model_hash

log = logging.getLogger(__name__)

AMOUNT_FIELDS = ("min_bond", "challenger_bond", "slash_amount")  # BondConfig's amounts: shown in ETH
DURATION_FIELDS = ("challenge_window", "resolve_timeout", "unbonding_delay", "referee_set_delay")


def role_keys(files: Sequence[Path] | None, chain_id: int, dev_indices: Sequence[int], role: str) -> list[bytes]:
    """The keys in ``files``; without files, anvil's dev keys ``dev_indices`` (on anvil only)."""
    if files:
        return [read_key(f) for f in files]
    require_dev_chain(chain_id, f"{role} key")
    return [dev_key(i) for i in dev_indices]


def role_key(file: Path | None, chain_id: int, dev_index: int, role: str) -> bytes:
    return role_keys([file] if file else None, chain_id, (dev_index,), role)[0]


def bond_client(chain: ChainConfig) -> BondClient:
    """A client of the deployment recorded for the chain at ``chain.rpc``."""
    w3 = connect(chain.rpc)
    return BondClient(w3, Deployment.load(chain.deployments, int(w3.eth.chain_id)).address)


def deploy_fresh(chain: ChainConfig, cfg: DeployConfig) -> tuple[Deployment, Path, int]:
    """Start anvil if nothing answers, deploy SpecmarketBond and DrafterEscrow, record them; (deployment,
    file, gas of both)."""
    ensure_anvil(chain.rpc, chain.state_dir)
    w3 = connect(chain.rpc)
    chain_id = int(w3.eth.chain_id)
    deployer = role_key(cfg.deployer_key, chain_id, DEV_DEPLOYER, "deployer")
    referees = list(cfg.referees) or ([dev_address(i) for i in DEV_REFEREES] if chain_id == ANVIL_CHAIN_ID else [])
    if not referees:
        raise ChainError("off a dev chain, name the referees with --referee ADDRESS (repeatable)")
    threshold = cfg.threshold if cfg.threshold is not None else min(DEFAULT_THRESHOLD, len(referees))
    deployment, tx = deploy(w3, deployer, cfg.bond, referees, threshold)
    escrow, escrow_tx = deploy_escrow(w3, deployer, cfg.thawing_period)
    deployment = replace(deployment, escrow=escrow, thawing_period=cfg.thawing_period)
    return deployment, deployment.save(chain.deployments), tx.gas_used + escrow_tx.gas_used


def ensure_deployed(chain: ChainConfig, cfg: DeployConfig) -> tuple[bool, Deployment | None]:
    """`chain up`: start anvil if nothing answers and deploy unless the recorded deployment is
    there; (anvil started, the new deployment or None when the recorded one is current)."""
    started = ensure_anvil(chain.rpc, chain.state_dir)
    try:
        bond_client(chain)
        return started, None
    except ChainError as exc:  # no deployment file, or its contract is not on this chain (a fresh anvil)
        log.info("deploying: %s", exc)
        return started, deploy_fresh(chain, cfg)[0]


def fund_from_dev_account(rpc: str, address: str, wei: int) -> tuple[str, int]:
    """`chain fund`: send ``wei`` to ``address`` from anvil's dev account 0 (anvil only: its keys are
    public); (the sender's address, the new balance of ``address``)."""
    from eth_utils import is_address, to_checksum_address

    from node.chain.contract import transfer

    if not isinstance(address, str) or not is_address(address):
        raise ChainError(f"not an address: {address!r} (0x and 40 hex digits)")
    chain_id = chain_id_at(rpc)
    if chain_id is None:
        raise ChainError(f"nothing answers at {rpc}: run `specmarket chain up`")
    if chain_id != ANVIL_CHAIN_ID:
        raise ChainError(
            f"chain {chain_id} at {rpc} is no local anvil (chain id {ANVIL_CHAIN_ID}): `chain fund` only spends "
            "anvil's public dev ETH; fund the address from an account of your own there"
        )
    w3 = connect(rpc)
    transfer(w3, dev_key(DEV_DEPLOYER), address, wei)
    return dev_address(DEV_DEPLOYER), int(w3.eth.get_balance(to_checksum_address(address)))


def chain_status(chain: ChainConfig, operator: str | None = None, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """The chain, the contract, its config, referees, operators, the newest ``limit`` challenges
    (against ``operator`` when given) with their total count, and the drafter escrow's balances and
    payments; JSON-ready, every amount in ETH."""
    chain_id = chain_id_at(chain.rpc)
    if chain_id is None:
        raise ChainError(f"nothing answers at {chain.rpc}: run `specmarket chain up`")
    client = bond_client(chain)
    cfg, ids = client.config(), challenge_ids(client, operator)
    return {
        "rpc": chain.rpc,
        "chain_id": chain_id,
        "block": client.w3.eth.block_number,
        "chain_time": client.chain_time(),
        "contract": client.address,
        "config": {**asdict(cfg), **{name: format_ether(getattr(cfg, name)) for name in AMOUNT_FIELDS}},
        "referee_epoch": client.referee_epoch(),
        "referees": client.referees(),
        "threshold": client.threshold(),
        "pending_referee_set": _pending_row(client),
        "operators": {e["operator"]: _operator_row(client, e["operator"]) for e in client.events("OperatorRegistered")},
        "challenge_count": len(ids),
        "challenges_of": operator,
        "challenges": [row.to_json() for row in rows_of(client, newest(ids, limit), cfg.resolve_timeout)],
        "escrow": _escrow(client, chain),
    }


def _escrow(client: BondClient, chain: ChainConfig) -> dict[str, Any] | None:
    deployment = Deployment.load(chain.deployments, client.domain.chain_id)
    return escrow_status(EscrowClient(client.w3, deployment.escrow)) if deployment.escrow else None


def _pending_row(client: BondClient) -> dict[str, Any] | None:
    pending = client.pending_referee_set()
    if pending is None:
        return None
    members, threshold, eta = pending
    return {"referees": members, "threshold": threshold, "takes_effect_at": eta}


def _operator_row(client: BondClient, address: str) -> dict[str, Any]:
    info = client.operator_info(address)
    return {"active": info.active, "bond": format_ether(info.bond), "open_challenges": info.open_challenges}


def format_status(status: dict[str, Any]) -> str:
    """``chain_status``'s answer as text for a person: a few lines and a table of challenges."""
    cfg, now = status["config"], int(status["chain_time"])
    lines = [
        f"chain {status['chain_id']} at {status['rpc']}: block {status['block']}, chain time {utc(now)}",
        f"contract {status['contract']}",
        f"bonds: min bond {cfg['min_bond']}, slash {cfg['slash_amount']}, challenger bond {cfg['challenger_bond']}, "
        f"challenger reward {cfg['challenger_reward_bps'] / 100:g} % of a slash; treasury {cfg['treasury']}",
        "times: " + ", ".join(f"{name.replace('_', ' ')} {span(int(cfg[name]))}" for name in DURATION_FIELDS),
        f"referees (epoch {status['referee_epoch']}, {status['threshold']} of {len(status['referees'])} decide): "
        + ", ".join(status["referees"]),
    ]
    if (pending := status["pending_referee_set"]) is not None:
        lines.append(
            f"proposed referee set ({pending['threshold']} of {len(pending['referees'])}): "
            f"{', '.join(pending['referees'])}; can be activated from {utc(pending['takes_effect_at'])}"
        )
    operators = status["operators"]
    lines.append(f"operators ({len(operators)}):" if operators else "operators: none registered")
    for address, row in operators.items():
        state = "active" if row["active"] else "inactive"
        lines.append(f"  {address}  {state}  bond {row['bond']}  open challenges {row['open_challenges']}")
    lines.extend(_challenge_lines(status, now))
    lines.extend(escrow_lines(status["escrow"]))
    return "\n".join(lines)


def _challenge_lines(status: dict[str, Any], now: int) -> list[str]:
    rows, count = status["challenges"], status["challenge_count"]
    against = f" against {status['challenges_of']}" if status["challenges_of"] else ""
    if not count:
        return [f"challenges{against}: none"]
    shown = "" if len(rows) == count else f", the newest {len(rows)} shown (--limit N)"
    return [f"challenges{against}: {count}{shown}"] + ["  " + line for line in challenge_table(rows, now)]


def open_referee(chain: ChainConfig, cfg: RefereeConfig) -> Referee:
    """A referee with its keys and the committed target model, warmed up (the first forward pass
    is slow, and is no verdict's cost)."""
    client = bond_client(chain)
    keys = role_keys(cfg.key_files, client.domain.chain_id, DEV_REFEREES, "referee")
    model, tokenizer = load_model_dir(cfg.target_dir, "target")
    model.fork().extend([tokenizer.eos_token_id])
    return Referee(client, keys, model, model_hash(cfg.target_dir), cfg.pool, partial(text_of, tokenizer))


def run_challenge(
    chain: ChainConfig, cfg: ChallengeConfig, on_opened: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Audit the receipt, challenge its first wrong token (or spend nothing), optionally wait for
    the outcome; the report as JSON (``challenge_id`` None when the receipt is correct).
    ``on_opened(report)`` hears of an opened challenge at once, before any wait for its outcome."""
    signed = read_receipt_file(cfg.receipt)
    client = bond_client(chain)
    key = role_key(cfg.key_file, client.domain.chain_id, DEV_CHALLENGER, "challenger")
    model, tokenizer = load_model_dir(cfg.target_dir, "target")
    committed = model_hash(cfg.target_dir)
    text = partial(text_of, tokenizer)
    report = challenge_receipt(
        client, key, model, committed, signed, force_position=cfg.position, force=cfg.force, text=text
    )
    result = report.to_json()
    if report.challenge_id is not None and on_opened is not None:
        on_opened(result)
    if report.challenge_id is not None and cfg.wait:
        result["outcome"] = wait_for_outcome(client, key, report.challenge_id, cfg.wait_s)
    return result
