"""Drafter payments in the networked demo: each market drafter is paid at an address of its own,
and after the run redeems its newest voucher at the operator's DrafterEscrow.

A row per drafter: the tokens the speculating target credited it in all (warm-up included), the
price, what the drafter's own wallet says it earned, its voucher, and what the redemption paid
(checked against the drafter's balance, less gas). Payments come out of the escrow, never the bond.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from node.chain.deployment import (
    DEFAULT_DRAFTER_PRICE_WEI,
    DEFAULT_THAWING_PERIOD_S,
    DEV_DEPLOYER,
    ETHER,
    Deployment,
    dev_key,
    format_ether,
)
from node.chain.keys import write_key

REDEEM_GAS_FUNDS_WEI = ETHER // 100  # each drafter's account is funded with this for its redeem's gas


@dataclass(frozen=True)
class Payee:
    name: str
    key_file: Path
    address: str


def with_escrow(w3, deployment: Deployment) -> Deployment:
    """``deployment`` with a DrafterEscrow deployed beside its bond (what `specmarket chain deploy` does)."""
    from node.chain.escrow import deploy_escrow

    escrow, _ = deploy_escrow(w3, dev_key(DEV_DEPLOYER), DEFAULT_THAWING_PERIOD_S)
    return replace(deployment, escrow=escrow, thawing_period=DEFAULT_THAWING_PERIOD_S)


def payees(work: Path, names: list[str]) -> dict[str, Payee]:
    """A fresh key per drafter (a demo secret, in the demo's temporary folder)."""
    from eth_account import Account

    out = {}
    for name in names:
        account = Account.create()
        key_file = write_key(work / "payout" / f"{name}.key", bytes(account.key))
        out[name] = Payee(name, key_file, account.address)
    return out


def redeem_rows(rpc: str, work: Path, payees_by_name: dict[str, Payee], credited: dict[str, int]) -> list[dict]:
    """Redeem each drafter's vouchers (its data dir's wallet) and report what it earned and was paid.
    ``credited``: drafter name -> the tokens the target's ledger credited it in all."""
    from node.chain.contract import connect, transfer
    from node.chain.keys import read_key
    from node.drafter.redeem import redeem_all
    from node.drafter.wallet import Wallet

    w3 = connect(rpc)
    rows = []
    for name, payee in payees_by_name.items():
        transfer(w3, dev_key(DEV_DEPLOYER), payee.address, REDEEM_GAS_FUNDS_WEI)
        accounts = list(Wallet.open(work / name, None).accounts.values())  # one per operator (the demo has one)
        before = w3.eth.get_balance(payee.address)
        redeemed = redeem_all(work / name, rpc, read_key(payee.key_file))
        gas_wei = sum(_gas_wei(w3, r.tx) for r in redeemed if r.tx)
        rows.append(
            {
                "name": name,
                "strategy": name.split("-", 1)[1],
                "credited": credited.get(name, 0),
                "price_wei": accounts[0].price_wei if accounts else DEFAULT_DRAFTER_PRICE_WEI,
                "earned_wei": sum(a.earned_wei for a in accounts),
                "voucher_wei": sum(a.voucher_wei() for a in accounts),  # the newest voucher of every lane
                "redeemed_wei": sum(r.paid_wei for r in redeemed),
                "balance_gain_wei": w3.eth.get_balance(payee.address) - before + gas_wei,
                "redeem_gas": sum(r.gas for r in redeemed),
            }
        )
    return rows


def _gas_wei(w3, tx_hash: str) -> int:
    receipt = w3.eth.get_transaction_receipt(tx_hash)
    return receipt["gasUsed"] * receipt["effectiveGasPrice"]


def payments_ok(rows: list[dict]) -> bool:
    """Each drafter earned price x credited tokens, and was paid exactly that."""
    return all(
        r["earned_wei"] == r["price_wei"] * r["credited"] == r["redeemed_wei"] == r["balance_gain_wei"] for r in rows
    )


def render_payments(rows: list[dict] | None) -> str:
    if not rows:
        return ""
    header = ["peer", "strategy", "accepted (credited, all jobs)", "price / token", "earned (own wallet)"]
    header += ["voucher", "redeemed", "balance rise + gas", "redeem gas"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for r in rows:
        cells = [r["name"], r["strategy"], r["credited"], f"{r['price_wei']:,} wei", format_ether(r["earned_wei"])]
        cells += [format_ether(r["voucher_wei"]), format_ether(r["redeemed_wei"]), format_ether(r["balance_gain_wei"])]
        cells += [f"{r['redeem_gas']:,}" if r["redeem_gas"] else "–"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    verdict = "yes" if payments_ok(rows) else "**NO**"
    return (
        "## Drafter payments\n\n"
        "The operator pays each drafter a price per accepted draft token with signed cumulative vouchers, "
        "sent at the end of each job and redeemed on chain from the operator's DrafterEscrow, never its bond "
        "(docs/market.md). After the run each drafter redeemed its newest voucher.\n\n"
        + "\n".join(lines)
        + f"\n\nEvery drafter earned price × its credited tokens and was paid exactly that: **{verdict}**. "
        "Under GUMBEL a draft token is accepted only when it is the token the target samples itself, so a "
        "hostile drafter is paid only for the tokens it happened to get right (the lying one proposes one "
        "fixed token every time), never for what it claims."
    )
