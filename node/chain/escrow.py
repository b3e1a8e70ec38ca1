"""DrafterEscrow over JSON-RPC: the operator's deposit that pays drafters' vouchers.

Kept apart from SpecmarketBond on purpose: paying drafters never touches the bond or a challenge.
The operator deposits, signs cumulative vouchers (node.chain.vouchers) and may withdraw only after
``withdrawalDelay``; a drafter redeems its newest voucher and is paid the difference from what it
was paid before (contracts/src/DrafterEscrow.sol states the rules).
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
class EscrowState:
    """One operator's escrow, in wei: what it holds, and a withdrawal waiting for its delay."""

    balance: int
    pending_withdrawal: int
    withdrawal_ready_at: int  # unix time; 0 when none is pending

    def available(self) -> int:
        """What is left for vouchers once the pending withdrawal is taken."""
        return max(0, self.balance - self.pending_withdrawal)


@dataclass(frozen=True)
class Redemption:
    amount: int  # wei paid by this redemption
    short: int  # wei the voucher still owes (the escrow held less)
    tx: TxResult


class EscrowClient(ContractClient):
    """One DrafterEscrow deployment."""

    artifact = ESCROW

    def __init__(self, w3: Web3, address: str, abi: list[dict] | None = None) -> None:
        super().__init__(w3, address, abi)
        self.domain = escrow_domain(self.domain.chain_id, self.address)

    def state(self, operator: str) -> EscrowState:
        operator = to_checksum_address(operator)
        amount, ready_at = self.call("pendingWithdrawal", operator)
        return EscrowState(int(self.call("balanceOf", operator)), int(amount), int(ready_at))

    def paid(self, operator: str, drafter: str) -> int:
        return int(self.call("paid", to_checksum_address(operator), to_checksum_address(drafter)))

    def owed(self, operator: str, drafter: str) -> int:
        return int(self.call("owed", to_checksum_address(operator), to_checksum_address(drafter)))

    def withdrawal_delay(self) -> int:
        return int(self.call("withdrawalDelay"))

    def deposit(self, key: bytes | str, amount: int, operator: str | None = None) -> TxResult:
        """Deposit ``amount`` wei for ``operator`` (default: the sender)."""
        if operator is None:
            return self.send(key, "deposit", value=amount)
        return self.send(key, "depositFor", to_checksum_address(operator), value=amount)

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

    def request_withdrawal(self, key: bytes | str, amount: int) -> TxResult:
        return self.send(key, "requestWithdrawal", amount)

    def cancel_withdrawal(self, key: bytes | str) -> TxResult:
        return self.send(key, "cancelWithdrawal")

    def withdraw(self, key: bytes | str) -> TxResult:
        return self.send(key, "withdraw")


def deploy_escrow(w3: Web3, deployer_key: bytes | str, withdrawal_delay: int) -> tuple[str, TxResult]:
    """Deploy a new DrafterEscrow; its address and the transaction."""
    abi, bytecode = load_artifact(ESCROW)
    deployer = Account.from_key(deployer_key)
    factory = w3.eth.contract(abi=abi, bytecode=bytecode)
    try:
        tx = factory.constructor(withdrawal_delay).build_transaction(
            {"from": deployer.address, "nonce": w3.eth.get_transaction_count(deployer.address, "pending")}
        )
    except ContractLogicError as exc:
        raise ChainError(f"deploying DrafterEscrow reverted: {exc.data or exc}") from None
    result = send_signed(w3, deployer, tx, "deploy escrow")
    return to_checksum_address(w3.eth.get_transaction_receipt(result.tx_hash)["contractAddress"]), result


def escrow_status(escrow: EscrowClient) -> dict:
    """JSON-ready, for `specmarket chain status`: each operator's escrow (balance, a pending
    withdrawal) and each paid pair's paid and still-owed amounts, every amount in ETH."""
    operators = sorted({e["operator"] for e in escrow.events("Deposited")})
    pairs = sorted({(e["operator"], e["drafter"]) for e in escrow.events("Redeemed")})
    escrows = {}
    for operator in operators:
        state = escrow.state(operator)
        escrows[operator] = {
            "balance": format_ether(state.balance),
            "pending_withdrawal": format_ether(state.pending_withdrawal),
            "withdrawal_ready_at": state.withdrawal_ready_at or None,
        }
    paid = [
        {
            "operator": op,
            "drafter": dr,
            "paid": format_ether(escrow.paid(op, dr)),
            "owed": format_ether(escrow.owed(op, dr)),
        }
        for op, dr in pairs
    ]
    return {"address": escrow.address, "withdrawal_delay": escrow.withdrawal_delay(), "escrows": escrows, "paid": paid}


def escrow_lines(status: dict | None) -> list[str]:
    """``escrow_status`` as text lines (none when no escrow is deployed)."""
    if status is None:
        return ["drafter escrow: none deployed (`specmarket chain deploy` deploys one)"]
    lines = [f"drafter escrow {status['address']} (withdrawal delay {status['withdrawal_delay']} s):"]
    for operator, row in status["escrows"].items():
        pending = f", withdrawing {row['pending_withdrawal']}" if row["withdrawal_ready_at"] else ""
        lines.append(f"  {operator}  holds {row['balance']}{pending}")
    for row in status["paid"]:
        lines.append(f"  {row['operator']} -> {row['drafter']}  paid {row['paid']}  owed {row['owed']}")
    return lines
