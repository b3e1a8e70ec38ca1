"""The drafter's wallet: what each operator owes it, the newest voucher it signed, and whether to keep
drafting for it.

Per target (by peer id), the wallet keeps the price it announced, the wei the drafter has earned by
the target's own per-job counts (``settle``; the last ``advance`` when a job ends without one), and
the newest voucher, checked before it is kept: signed by its operator, payable to this drafter's
payout address, at the same escrow as before, and never smaller than the last. A voucher that pays
less than earned is *short*: the wallet logs one line, and after more than
``MAX_UNPAID_JOBS`` such jobs in a row it refuses that target's sessions, so an operator that stops
paying costs the drafter at most about one job's pay. A drafter with ``--rpc`` also checks after
each voucher that the escrow can cover what is unredeemed, and stops drafting for a target whose
escrow cannot.

A refusal verdict ("unpaid", or "the escrow cannot cover") lapses after ``VERDICT_TTL_S``: the
drafter then drafts one more job for that target (with ``--rpc`` it first checks the escrow again), so
an operator that paid up late is served again, and one that did not costs one more job's pay an hour.

The wallet is one JSON file in the drafter's data dir, written atomically (a temporary file, fsync,
rename, fsync of the directory) whenever it changes, so a crash never loses a voucher that was kept.
Its size is bounded whatever peers do: at most ``MAX_ACCOUNTS`` accounts of bounded size (a new
target beyond that is refused while every account holds a voucher). A running drafter holds a lock on
it, so two drafters never share one. A file that cannot be read is set aside, never overwritten, and
the valid vouchers in it are recovered.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eth_utils import to_checksum_address

from node.chain.deployment import format_ether
from node.chain.vouchers import SignedVoucher, VoucherError
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

WALLET_FILE = "wallet.json"
LOCK_FILE = "wallet.lock"
WALLET_FORMAT = 1
MAX_UNPAID_JOBS = 1  # short vouchers in a row tolerated (one job's pay may lag, e.g. a crash between jobs)
MAX_WALLET_BYTES = 4 << 20
MAX_ACCOUNT_BYTES = 2048  # one account as JSON: a voucher (<= MAX_VOUCHER_BYTES), a bounded reason, numbers
# INVARIANT: a full wallet of maximal accounts is still readable: MAX_ACCOUNTS x MAX_ACCOUNT_BYTES (2 MiB, plus
# the file's indentation) < MAX_WALLET_BYTES (tests/test_wallet.py measures a maximal account)
MAX_ACCOUNTS = 1024  # targets remembered
MAX_REASON_CHARS = 240  # why an escrow cannot cover, as kept
MAX_SALVAGE_BYTES = 64 << 20  # an unreadable wallet larger than this is set aside unread
VERDICT_TTL_S = 3600.0  # a refusal verdict lapses after this long (wall-clock seconds: it outlives restarts)


class WalletError(SpecmarketError):
    """An unreadable wallet file, or one already in use by another drafter."""


class WalletFull(WalletError):
    """Every one of MAX_ACCOUNTS accounts holds a voucher: a new target cannot be remembered."""


@dataclass(frozen=True)
class Account:
    """What one target's operator owes this drafter, as the drafter sees it."""

    operator: str = ""  # the voucher signer's address, once one voucher came
    price_wei: int = 0  # announced in the newest open
    earned_wei: int = 0  # price x accepted tokens, summed over the target's settles
    jobs: int = 0  # jobs settled
    unpaid_jobs: int = 0  # jobs in a row whose voucher left the drafter short
    voucher: str = ""  # the newest kept voucher, JSON
    uncovered: str = ""  # why the escrow cannot cover the unredeemed vouchers ("" when it can or is unknown)
    judged_at: float = 0.0  # unix time of the last refusal verdict (unpaid or uncovered): it lapses after a while

    def voucher_wei(self) -> int:
        return SignedVoucher.loads(self.voucher).voucher.cumulative_wei if self.voucher else 0

    def short_wei(self) -> int:
        return max(0, self.earned_wei - self.voucher_wei())


@dataclass
class Wallet:
    path: Path
    payout: str | None  # this drafter's payout address (None: it asks to be paid nowhere)
    accounts: dict[str, Account] = field(default_factory=dict)  # target peer id -> account
    lock_fd: int | None = None  # held while a drafter runs on this wallet (open(..., lock=True))

    @classmethod
    def open(cls, data_dir: Path, payout: str | None, *, lock: bool = False) -> Wallet:
        """The wallet in ``data_dir``; ``lock``: hold it for this drafter alone (WalletError when another
        process holds it) until ``close``."""
        path = Path(data_dir) / WALLET_FILE
        wallet = cls(path, to_checksum_address(payout) if payout else None)
        if lock:
            wallet.lock_fd = _lock(Path(data_dir))
        if path.exists():
            try:
                wallet.accounts = _read(path)
            except WalletError as exc:
                wallet.accounts = _salvage(path, exc)
                _write(path, wallet.accounts)
        return wallet

    def close(self) -> None:
        """Release the lock (the wallet is saved at every change: nothing else to do)."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # closing the descriptor releases its flock
            self.lock_fd = None

    def account(self, target: str) -> Account:
        return self.accounts.get(target, Account())

    def refusal(self, target: str, now: float | None = None) -> str | None:
        """Why this drafter no longer drafts for ``target``; None: it does (a verdict older than
        VERDICT_TTL_S has lapsed: one more job, judged again)."""
        a = self.account(target)
        if self.lapsed(target, now):
            return None
        if a.unpaid_jobs > MAX_UNPAID_JOBS:
            return f"unpaid: vouchers short by {a.short_wei()} wei over {a.unpaid_jobs} jobs"
        if a.uncovered:
            return f"unpaid: {a.uncovered}"
        return None

    def lapsed(self, target: str, now: float | None = None) -> bool:
        """Whether ``target`` has a refusal verdict that has lapsed (to be judged again)."""
        a = self.account(target)
        judged = a.unpaid_jobs > MAX_UNPAID_JOBS or bool(a.uncovered)
        return judged and (time.time() if now is None else now) - a.judged_at >= VERDICT_TTL_S

    def opened(self, target: str, price_wei: int) -> None:
        """A session opened at ``price_wei`` per accepted token (kept for the job's settle)."""
        if self.account(target).price_wei != price_wei:
            self._store(target, replace(self.account(target), price_wei=price_wei))

    def settle(self, target: str, job: str, price_wei: int, accepted: int, voucher: str) -> SignedVoucher | None:
        """Record a finished job: its accepted tokens at ``price_wei`` and the voucher that came with
        it ("" for none); the kept voucher when it is new, else None."""
        a = self.account(target)
        a = replace(a, earned_wei=a.earned_wei + price_wei * accepted, jobs=a.jobs + 1)
        kept = None
        if voucher and self.payout is not None:
            try:
                kept = self._check(a, SignedVoucher.loads(voucher))
            except VoucherError as exc:
                log.warning("job %s: refusing the voucher from %s: %s", job, target, exc)
            if kept is not None:
                a = replace(a, operator=kept.voucher.operator, voucher=kept.dumps())
        short = a.short_wei() if self.payout is not None else 0
        if short and (accepted or a.unpaid_jobs):
            log.warning(
                "job %s: %s's vouchers pay %d wei of the %d earned (short %d wei, %s)",
                job, target, a.voucher_wei(), a.earned_wei, short, format_ether(short),
            )  # fmt: skip
            a = replace(a, unpaid_jobs=a.unpaid_jobs + 1)
            if a.unpaid_jobs > MAX_UNPAID_JOBS:
                a = replace(a, judged_at=time.time())  # refused from now on, for VERDICT_TTL_S
        elif not short:
            a = replace(a, unpaid_jobs=0)
        self._store(target, a)
        return kept

    def _check(self, a: Account, signed: SignedVoucher) -> SignedVoucher | None:
        """The voucher if it is to be kept (newer than the kept one); VoucherError if it is not valid."""
        signed.check()
        v = signed.voucher
        if v.drafter != self.payout:
            raise VoucherError(f"it pays {v.drafter}, not this drafter's payout address {self.payout}")
        if a.operator and v.operator != a.operator:
            raise VoucherError(f"it is signed by {v.operator}, not by this target's operator {a.operator}")
        if a.voucher:
            old = SignedVoucher.loads(a.voucher)
            if old.domain != signed.domain:
                raise VoucherError(f"it is for escrow {signed.domain.contract}, not {old.domain.contract}")
            if v.cumulative_wei <= old.voucher.cumulative_wei:
                return None  # an older one (jobs settle out of order): the kept one covers it
        return signed

    def mark_cover(self, target: str, uncovered: str) -> None:
        """The escrow check's verdict (``""``: the escrow covers the unredeemed vouchers)."""
        uncovered = uncovered[:MAX_REASON_CHARS]
        a = self.account(target)
        if uncovered:
            log.warning("%s's escrow: %s; not drafting for it", target, uncovered)
            self._store(target, replace(a, uncovered=uncovered, judged_at=time.time()))
        elif a.uncovered:
            self._store(target, replace(a, uncovered=""))

    def vouchers(self) -> dict[str, SignedVoucher]:
        """Target peer id -> its newest kept voucher."""
        return {t: SignedVoucher.loads(a.voucher) for t, a in self.accounts.items() if a.voucher}

    def _store(self, target: str, account: Account) -> None:
        if target not in self.accounts and len(self.accounts) >= MAX_ACCOUNTS:
            # forget the oldest target that holds no voucher; none: refuse the newcomer, never a voucher
            old = next((t for t, a in self.accounts.items() if not a.voucher), None)
            if old is None:
                raise WalletFull(
                    f"the wallet {self.path} remembers {MAX_ACCOUNTS} targets, each with a voucher: "
                    "redeem them (`specmarket drafter redeem`) and move the wallet aside to serve a new target"
                )
            del self.accounts[old]
        self.accounts[target] = account
        _write(self.path, self.accounts)


def _write(path: Path, accounts: dict[str, Account]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    data = {"format": WALLET_FORMAT, "accounts": {t: asdict(a) for t, a in accounts.items()}}
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic: the old wallet or the new one, never half of either
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power loss
    finally:
        os.close(dir_fd)


def _lock(data_dir: Path) -> int:
    """An exclusive lock on the data dir's wallet, for one running drafter (released with its fd)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise WalletError(
            f"another drafter is running on {data_dir} (its wallet is locked): give each drafter its own --data-dir"
        ) from None
    return fd


def _salvage(path: Path, exc: WalletError) -> dict[str, Account]:
    """The accounts of an unreadable wallet that still read as accounts, their vouchers valid; the file
    itself is set aside (renamed, never deleted), so nothing in it is lost."""
    aside = path.with_name(f"{path.name}.unreadable-{time.time_ns()}")
    os.replace(path, aside)
    accounts: dict[str, Account] = {}
    try:
        if aside.stat().st_size <= MAX_SALVAGE_BYTES:
            raw = json.loads(aside.read_text(errors="replace")).get("accounts", {})
            read = [(str(t), a) for t, f in raw.items() if (a := _account(t, f)) is not None]
            read.sort(key=lambda item: not item[1].voucher)  # stable: the accounts with a voucher first
            accounts = dict(read[:MAX_ACCOUNTS])
    except (OSError, ValueError, AttributeError) as err:
        log.error("nothing could be recovered from %s: %s", aside, err)
    log.error(
        "%s; it is kept as %s, and %d accounts (%d with a voucher) were recovered from it",
        exc, aside, len(accounts), sum(1 for a in accounts.values() if a.voucher),
    )  # fmt: skip
    return accounts


def _account(target: object, fields: object) -> Account | None:
    """One stored account, or None when it does not read as one (or its voucher does not parse)."""
    try:
        account = Account(**fields)  # type: ignore[arg-type]
        if account.voucher:
            SignedVoucher.loads(account.voucher)
        if len(json.dumps(asdict(account))) > MAX_ACCOUNT_BYTES or not isinstance(target, str):
            return None
        return account
    except (TypeError, ValueError, VoucherError):
        return None


def _read(path: Path) -> dict[str, Account]:
    try:
        if path.stat().st_size > MAX_WALLET_BYTES:
            raise WalletError(f"{path} is larger than {MAX_WALLET_BYTES} bytes")
        data: Any = json.loads(path.read_text())
        if data.get("format") != WALLET_FORMAT:
            raise WalletError(f"{path}: unknown wallet format {data.get('format')!r}")
        accounts = {str(t): Account(**a) for t, a in data["accounts"].items()}
        for a in accounts.values():
            if a.voucher:
                SignedVoucher.loads(a.voucher)
        return accounts
    except (OSError, ValueError, KeyError, TypeError, AttributeError, VoucherError) as exc:
        raise WalletError(f"cannot read the wallet {path}: {exc}") from exc


def escrow_shortfall(rpc: str, kept: SignedVoucher) -> str:
    """Why the escrow cannot pay what ``kept`` leaves unredeemed ("" when it can); blocking chain reads.
    What a pending withdrawal will take is not counted as there: the drafter redeems before it can."""
    from node.chain.contract import connect
    from node.chain.escrow import EscrowClient

    escrow = EscrowClient(connect(rpc), kept.domain.contract)
    if escrow.domain != kept.domain:
        return f"the voucher names chain {kept.domain.chain_id}, {rpc} is chain {escrow.domain.chain_id}"
    v = kept.voucher
    unredeemed = v.cumulative_wei - escrow.paid(v.operator, v.drafter)
    state = escrow.state(v.operator)
    if state.pending_withdrawal:
        log.warning(
            "operator %s asked to withdraw %s from its escrow (ready at unix time %d): redeem before then "
            "(`specmarket drafter redeem`)",
            v.operator, format_ether(state.pending_withdrawal), state.withdrawal_ready_at,
        )  # fmt: skip
    if unredeemed > state.available():
        return (
            f"escrow {escrow.address} holds {format_ether(state.available())} for {format_ether(unredeemed)} unredeemed"
        )
    return ""
