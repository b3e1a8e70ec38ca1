"""DrafterEscrow over JSON-RPC: the operator's pool and the lanes that pay drafters' vouchers.

Kept apart from SpecmarketBond on purpose: paying drafters never touches the bond or a challenge.
The operator deposits into its pool, moves funds into one lane per (drafter, lane id), signs
cumulative vouchers per lane (node.chain.vouchers), and takes a lane's funds back only after
``thawingPeriod``; a drafter redeems its newest voucher of a lane and is paid, from that lane only,
the difference from what the lane paid before (contracts/src/DrafterEscrow.sol states the rules).
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_account import Account
from eth_utils import to_checksum_address
from web3 import Web3
from web3.exceptions import ContractLogicError

from node.chain import ChainError
from node.chain.contract import ContractClient, TxResult, send_signed
from node.chain.deployment import ESCROW, format_ether, load_artifact
from node.chain.vouchers import SignedVoucher, escrow_domain


@dataclass(frozen=True)
class LaneState:
    """One lane (operator, drafter, lane id), in wei: what it holds, what it paid and still owes
    its drafter, and a thaw waiting for the thawing period."""

    balance: int
    paid: int
    owed: int  # what the latest redeemed voucher on this lane still owes (the lane held less)
    thawing: int  # asked back by the operator; it leaves at ``thaw_ready_at`` unless redeemed first
    thaw_ready_at: int  # unix time; 0 when no thaw is pending

    def available(self) -> int:
        """What the lane holds for vouchers once the pending thaw is taken."""
        return max(0, self.balance - self.thawing)


@dataclass(frozen=True)
class Redemption:
    amount: int  # wei paid by this redemption
    short: int  # wei the voucher still owes (the lane held less)
    tx: TxResult


class EscrowClient(ContractClient):
    """One DrafterEscrow deployment."""

    artifact = ESCROW

    def __init__(self, w3: Web3, address: str, abi: list[dict] | None = None) -> None:
        super().__init__(w3, address, abi)
        self.domain = escrow_domain(self.domain.chain_id, self.address)

    def pool(self, operator: str) -> int:
        """The operator's unpledged funds (promised to no drafter)."""
        return int(self.call("poolOf", to_checksum_address(operator)))

    def lane(self, operator: str, drafter: str, lane: int) -> LaneState:
        row = self.call("lane", to_checksum_address(operator), to_checksum_address(drafter), lane)
        return LaneState(*(int(x) for x in row))

    def thawing_period(self) -> int:
        return int(self.call("thawingPeriod"))

    def deposit(self, key: bytes | str, amount: int, operator: str | None = None) -> TxResult:
        """Deposit ``amount`` wei into ``operator``'s pool (default: the sender's)."""
        if operator is None:
            return self.send(key, "deposit", value=amount)
        return self.send(key, "depositFor", to_checksum_address(operator), value=amount)

    def fund_lane(self, key: bytes | str, drafter: str, lane: int, from_pool: int, value: int = 0) -> TxResult:
        """Move ``from_pool`` wei of the sender's pool, plus ``value`` sent along, into a lane."""
        return self.send(key, "fundLane", to_checksum_address(drafter), lane, from_pool, value=value)

    def redeem(self, key: bytes | str, signed: SignedVoucher) -> Redemption:
        """Redeem ``signed`` from its drafter's account (only the drafter may)."""
        if signed.domain != self.domain:
            raise ChainError(
                f"the voucher is for escrow {signed.domain.contract} on chain {signed.domain.chain_id}, "
                f"not {self.address} on chain {self.domain.chain_id}"
            )
        tx = self.send(key, "redeem", signed.voucher.as_tuple(), signed.signature)
        (redeemed,) = self.decode_events(tx, "Redeemed")
        short = sum(int(e["shortWei"]) for e in self.decode_events(tx, "Owed"))
        return Redemption(int(redeemed["amount"]), short, tx)

    def request_thaw(self, key: bytes | str, drafter: str, lane: int, amount: int) -> TxResult:
        return self.send(key, "requestThaw", to_checksum_address(drafter), lane, amount)

    def cancel_thaw(self, key: bytes | str, drafter: str, lane: int) -> TxResult:
        return self.send(key, "cancelThaw", to_checksum_address(drafter), lane)

    def thaw(self, key: bytes | str, drafter: str, lane: int) -> TxResult:
        return self.send(key, "thaw", to_checksum_address(drafter), lane)

    def funded_lanes(self, operator: str | None = None) -> list[tuple[str, str, int, LaneState]]:
        """Every lane ever funded (``operator``'s only, when given), sorted: (operator, drafter, lane
        id, its state now)."""
        wanted = to_checksum_address(operator) if operator is not None else None
        keys = {(e["operator"], e["drafter"], int(e["lane"])) for e in self.events("LaneFunded")}
        return [(op, dr, i, self.lane(op, dr, i)) for op, dr, i in sorted(keys) if wanted in (None, op)]

    def withdraw(self, key: bytes | str, amount: int) -> TxResult:
        """Take ``amount`` wei of the sender's pool back (at once: the pool is promised to nobody)."""
        return self.send(key, "withdraw", amount)


def deploy_escrow(w3: Web3, deployer_key: bytes | str, thawing_period: int) -> tuple[str, TxResult]:
    """Deploy a new DrafterEscrow; its address and the transaction."""
    abi, bytecode = load_artifact(ESCROW)
    deployer = Account.from_key(deployer_key)
    factory = w3.eth.contract(abi=abi, bytecode=bytecode)
    try:
        tx = factory.constructor(thawing_period).build_transaction(
            {"from": deployer.address, "nonce": w3.eth.get_transaction_count(deployer.address, "pending")}
        )
    except ContractLogicError as exc:
        raise ChainError(f"deploying DrafterEscrow reverted: {exc.data or exc}") from None
    result = send_signed(w3, deployer, tx, "deploy escrow")
    return to_checksum_address(w3.eth.get_transaction_receipt(result.tx_hash)["contractAddress"]), result


def escrow_status(escrow: EscrowClient) -> dict:
    """JSON-ready, for `specmarket chain status`: each operator's pool and each funded lane (balance,
    paid, owed, a pending thaw), every amount in ETH."""
    operators = sorted({e["operator"] for e in escrow.events("Deposited")})
    pools = {op: format_ether(escrow.pool(op)) for op in operators}
    rows = []
    for op, dr, lane_id, state in escrow.funded_lanes():
        rows.append({
            "operator": op,
            "drafter": dr,
            "lane": lane_id,
            "balance": format_ether(state.balance),
            "paid": format_ether(state.paid),
            "owed": format_ether(state.owed),
            "thawing": format_ether(state.thawing),
            "thaw_ready_at": state.thaw_ready_at or None,
        })  # fmt: skip
    return {"address": escrow.address, "thawing_period": escrow.thawing_period(), "pools": pools, "lanes": rows}


def escrow_lines(status: dict | None) -> list[str]:
    """``escrow_status`` as text lines (none when no escrow is deployed)."""
    if status is None:
        return ["drafter escrow: none deployed (`specmarket chain deploy` deploys one)"]
    lines = [f"drafter escrow {status['address']} (thawing period {status['thawing_period']} s):"]
    for operator, pool in status["pools"].items():
        lines.append(f"  {operator}  pool {pool}")
    for row in status["lanes"]:
        thawing = f", thawing {row['thawing']}" if row["thaw_ready_at"] else ""
        lines.append(
            f"  {row['operator']} -> {row['drafter']} lane {row['lane']}  holds {row['balance']}{thawing}  "
            f"paid {row['paid']}  owed {row['owed']}"
        )
    return lines
