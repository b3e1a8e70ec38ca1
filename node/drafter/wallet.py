"""The drafter's wallet: what each operator owes it, the newest voucher it signed on each lane, and
whether to keep drafting for it.

Accounts are keyed by the *operator*, not by the target's peer id: ``<chain id>:<escrow>:<operator
address>`` (node.drafter.terms.account_key), from the paying ``open``. Every node of one operator (a
target restarted under a fresh peer identity, a replica with a ledger of its own) adds to the same
account, so an unpaid verdict against the operator holds whatever peer id it comes back under, and
what it owes is reckoned over all its nodes together.

Within an account, each *lane* (DrafterEscrow's funds for this drafter per lane id; every ledger of
the operator has a lane of its own) keeps its own newest voucher, checked before it is kept: signed
by the open's operator, payable to this drafter's payout address, on the open's lane, at the open's
escrow (chain id and address), and larger than the lane's last (an older or equal one is not kept).
A voucher on one lane never replaces another lane's. The account sums the wei the drafter has earned
by the targets' own per-job counts (``settle``; the last ``advance`` when a job ends without one) over
every node of the operator, and compares it with the sum of the newest vouchers over all its lanes.
Vouchers that pay less than earned leave the drafter *short*: the wallet logs one line, and after more
than ``MAX_UNPAID_JOBS`` such jobs in a row it refuses the operator's sessions, so an operator that
stops paying costs the drafter at most about one job's pay. A drafter with ``--rpc`` also checks on
chain that the lane covers what is owed (node.drafter.cover) and records its verdict (``mark_cover``).

A refusal verdict ("unpaid", or "the escrow cannot cover") lapses after ``VERDICT_TTL_S``: the
drafter then drafts one more job for that operator (with ``--rpc`` it first checks the escrow again),
so an operator that paid up late is served again, and one that did not costs one more job's pay an
hour.

The wallet is one JSON file in the drafter's data dir, written atomically (a temporary file, fsync,
rename, fsync of the directory) whenever it changes, so a crash never loses a voucher that was kept.
Its size is bounded whatever peers do: at most ``MAX_ACCOUNTS`` accounts of at most ``MAX_LANES``
lanes each, all of bounded size (a new operator beyond that is refused while every account holds a
voucher; a new lane beyond that is refused, never a kept voucher dropped). A running drafter holds a
lock on it, so two drafters never share one. A file that cannot be read is set aside, never
overwritten, and the valid vouchers in it are recovered. A format-1 wallet (accounts by peer id, with
vouchers for the old single-pool escrow, which a lane escrow cannot redeem) is set aside unread.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from eth_utils import to_checksum_address

from node.chain.deployment import format_ether
from node.chain.vouchers import MAX_VOUCHER_BYTES, SignedVoucher, VoucherError, escrow_domain
from node.drafter.terms import Terms, account_key
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

WALLET_FILE = "wallet.json"
LOCK_FILE = "wallet.lock"
WALLET_FORMAT = 2  # 2: accounts by operator (chain id, escrow, operator address), vouchers by lane
MAX_UNPAID_JOBS = 1  # short vouchers in a row tolerated (one job's pay may lag, e.g. a crash between jobs)
MAX_LANES = 16  # lanes remembered per operator account (a new lane beyond: WalletFull, never a voucher dropped)
MAX_LANE_BYTES = MAX_VOUCHER_BYTES + 64  # one lane as JSON: its id and its voucher, escaped (~560 bytes)
MAX_ACCOUNT_BYTES = MAX_LANES * MAX_LANE_BYTES + 2048  # and a bounded reason, the key's fields, numbers
# INVARIANT: a full wallet of maximal accounts is still readable: MAX_ACCOUNTS x MAX_ACCOUNT_BYTES (4.75 MiB, plus
# the file's indentation) < MAX_WALLET_BYTES (tests/test_wallet.py measures a maximal account)
MAX_ACCOUNTS = 256  # operators remembered
MAX_WALLET_BYTES = 8 << 20
MAX_REASON_CHARS = 240  # why an escrow cannot cover, as kept
MAX_SALVAGE_BYTES = 64 << 20  # an unreadable wallet larger than this is set aside unread
VERDICT_TTL_S = 3600.0  # a refusal verdict lapses after this long (wall-clock seconds: it outlives restarts)


class WalletError(SpecmarketError):
    """An unreadable wallet file, or one already in use by another drafter."""


class WalletFull(WalletError):
    """A new operator while every one of MAX_ACCOUNTS accounts holds a voucher, or a new lane while the
    operator's account holds MAX_LANES: it cannot be remembered without dropping a voucher."""


class _FormerFormat(WalletError):
    """A format-1 wallet (accounts by peer id, vouchers for the single-pool escrow)."""


@dataclass(frozen=True)
class Account:
    """What one operator owes this drafter at one escrow, over all its nodes, as the drafter sees it."""

    chain_id: int = 0
    escrow: str = ""  # checksummed
    operator: str = ""  # checksummed: the address that signs the vouchers
    price_wei: int = 0  # announced in the newest open
    earned_wei: int = 0  # price x accepted tokens, summed over every settle from any node of this operator
    jobs: int = 0  # jobs settled
    unpaid_jobs: int = 0  # jobs in a row whose voucher left the drafter short
    lanes: dict[str, str] = field(default_factory=dict)  # lane id (decimal) -> the newest kept voucher there, JSON
    uncovered: str = ""  # why the escrow cannot cover what is owed ("" when it can or is unknown)
    judged_at: float = 0.0  # unix time of the last refusal verdict (unpaid or uncovered): it lapses after a while

    def voucher_wei(self) -> int:
        """What the newest vouchers pay in all: the sum over lanes (each lane counts its own total)."""
        return sum(SignedVoucher.loads(v).voucher.cumulative_wei for v in self.lanes.values())

    def short_wei(self) -> int:
        return max(0, self.earned_wei - self.voucher_wei())


def _blank(key: str) -> Account:
    """A new account for ``key`` (``<chain id>:<escrow>:<operator>``); Account() when it is not one."""
    try:
        chain_id, escrow, operator = key.split(":")
        return Account(int(chain_id), to_checksum_address(escrow), to_checksum_address(operator))
    except (ValueError, TypeError):
        return Account()


@dataclass
class Wallet:
    path: Path
    payout: str | None  # this drafter's payout address (None: it asks to be paid nowhere)
    accounts: dict[str, Account] = field(default_factory=dict)  # account key -> account
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
            except _FormerFormat:
                _set_aside_format1(path)
                _write(path, wallet.accounts)
            except WalletError as exc:
                wallet.accounts = _salvage(path, exc)
                _write(path, wallet.accounts)
        return wallet

    def close(self) -> None:
        """Release the lock (the wallet is saved at every change: nothing else to do)."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # closing the descriptor releases its flock
            self.lock_fd = None

    def account(self, key: str) -> Account:
        """The account of ``key`` (Terms.account: ``<chain id>:<escrow>:<operator>``)."""
        return self.accounts.get(key) or _blank(key)

    def refusal(self, key: str, now: float | None = None) -> str | None:
        """Why this drafter no longer drafts for the operator of account ``key``; None: it does (a
        verdict older than VERDICT_TTL_S has lapsed: one more job, judged again)."""
        a = self.account(key)
        if self.lapsed(key, now):
            return None
        if a.unpaid_jobs > MAX_UNPAID_JOBS:
            return f"unpaid: vouchers short by {a.short_wei()} wei over {a.unpaid_jobs} jobs"
        if a.uncovered:
            return f"unpaid: {a.uncovered}"
        return None

    def lapsed(self, key: str, now: float | None = None) -> bool:
        """Whether account ``key`` has a refusal verdict that has lapsed (to be judged again)."""
        a = self.account(key)
        judged = a.unpaid_jobs > MAX_UNPAID_JOBS or bool(a.uncovered)
        return judged and (time.time() if now is None else now) - a.judged_at >= VERDICT_TTL_S

    def opened(self, terms: Terms) -> None:
        """A paying session opened on ``terms``: its price is kept for the job's settle. WalletFull when
        the operator's account or its lane cannot be remembered without dropping a voucher."""
        a = self._of(terms)
        if str(terms.lane) not in a.lanes and len(a.lanes) >= MAX_LANES:
            raise WalletFull(
                f"the wallet {self.path} holds vouchers on {MAX_LANES} lanes of operator {terms.operator}, "
                f"not lane {terms.lane}: redeem them (`specmarket drafter redeem`) and move the wallet aside "
                "to serve a new lane"
            )
        if terms.account not in self.accounts or a.price_wei != terms.price_wei:
            self._store(terms.account, replace(a, price_wei=terms.price_wei))

    def settle(self, terms: Terms, job: str, accepted: int, voucher: str) -> SignedVoucher | None:
        """Record a finished job on ``terms``: its accepted tokens at the open's price, and the voucher
        that came with it ("" for none), kept on the open's lane; the kept voucher when it is new,
        else None (an older or equal one on that lane: the kept one covers it)."""
        a = self._of(terms)
        a = replace(a, earned_wei=a.earned_wei + terms.price_wei * accepted, jobs=a.jobs + 1)
        kept = None
        if voucher and self.payout is not None:
            try:
                kept = self._check(terms, a, SignedVoucher.loads(voucher))
            except VoucherError as exc:
                log.warning("job %s: refusing the voucher from operator %s: %s", job, terms.operator, exc)
            if kept is not None:
                a = replace(a, lanes={**a.lanes, str(terms.lane): kept.dumps()})
        short = a.short_wei() if self.payout is not None else 0
        if short and (accepted or a.unpaid_jobs):
            log.warning(
                "job %s: operator %s's vouchers (%d lanes) pay %d wei of the %d earned (short %d wei, %s)",
                job, terms.operator, len(a.lanes), a.voucher_wei(), a.earned_wei, short, format_ether(short),
            )  # fmt: skip
            a = replace(a, unpaid_jobs=a.unpaid_jobs + 1)
            if a.unpaid_jobs > MAX_UNPAID_JOBS:
                a = replace(a, judged_at=time.time())  # refused from now on, for VERDICT_TTL_S
        elif not short:
            a = replace(a, unpaid_jobs=0)
        self._store(terms.account, a)
        return kept

    def _check(self, terms: Terms, a: Account, signed: SignedVoucher) -> SignedVoucher | None:
        """The voucher if it is to be kept (newer than its lane's); VoucherError if it is not valid."""
        signed.check()
        v = signed.voucher
        if v.operator != terms.operator:
            raise VoucherError(f"it is signed by {v.operator}, not by this job's operator {terms.operator}")
        if v.drafter != self.payout:
            raise VoucherError(f"it pays {v.drafter}, not this drafter's payout address {self.payout}")
        if v.lane != terms.lane:
            raise VoucherError(f"it is for lane {v.lane}, not this job's lane {terms.lane}")
        if signed.domain != escrow_domain(terms.chain_id, terms.escrow):
            raise VoucherError(
                f"it is for escrow {signed.domain.contract} on chain {signed.domain.chain_id}, "
                f"not {terms.escrow} on chain {terms.chain_id}"
            )
        old = a.lanes.get(str(v.lane))
        if old is None and len(a.lanes) >= MAX_LANES:
            raise VoucherError(f"the wallet already keeps vouchers on {MAX_LANES} lanes of this operator")
        if old is not None and v.cumulative_wei <= SignedVoucher.loads(old).voucher.cumulative_wei:
            return None  # an older one (jobs settle out of order): the kept one covers it
        return signed

    def mark_cover(self, key: str, uncovered: str) -> None:
        """The escrow check's verdict on account ``key`` (``""``: the escrow covers what is owed)."""
        uncovered = uncovered[:MAX_REASON_CHARS]
        a = self.account(key)
        if uncovered:
            log.warning("operator %s's escrow: %s; not drafting for it", a.operator or key, uncovered)
            self._store(key, replace(a, uncovered=uncovered, judged_at=time.time()))
        elif a.uncovered:
            self._store(key, replace(a, uncovered=""))

    def lane_voucher(self, terms: Terms) -> SignedVoucher | None:
        """The newest kept voucher on ``terms``' lane of its operator's account."""
        kept = self.account(terms.account).lanes.get(str(terms.lane))
        return SignedVoucher.loads(kept) if kept else None

    def vouchers(self) -> dict[str, SignedVoucher]:
        """``<account key>:<lane>`` -> the newest voucher on that lane, for every lane of every account."""
        return {
            f"{key}:{lane}": SignedVoucher.loads(v) for key, a in self.accounts.items() for lane, v in a.lanes.items()
        }

    def _of(self, terms: Terms) -> Account:
        """``terms``' account, a new one when the operator is new."""
        return self.accounts.get(terms.account) or Account(terms.chain_id, terms.escrow, terms.operator)

    def _store(self, key: str, account: Account) -> None:
        if key not in self.accounts and len(self.accounts) >= MAX_ACCOUNTS:
            # forget the oldest account that holds no voucher; none: refuse the newcomer, never a voucher
            old = next((k for k, a in self.accounts.items() if not a.lanes), None)
            if old is None:
                raise WalletFull(
                    f"the wallet {self.path} remembers {MAX_ACCOUNTS} operators, each with a voucher: "
                    "redeem them (`specmarket drafter redeem`) and move the wallet aside to serve a new operator"
                )
            del self.accounts[old]
        self.accounts[key] = account
        _write(self.path, self.accounts)


def _write(path: Path, accounts: dict[str, Account]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    data = {"format": WALLET_FORMAT, "accounts": {k: asdict(a) for k, a in accounts.items()}}
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


def _set_aside_format1(path: Path) -> None:
    """A format-1 wallet is renamed, unread and never deleted: its vouchers are for another escrow."""
    aside = path.with_name(f"{path.name}.format1-{time.time_ns()}")
    os.replace(path, aside)
    log.error(
        "%s is a format-1 wallet (accounts by target peer id); it is kept unread as %s: its vouchers belong to "
        "the old single-pool DrafterEscrow deployment and cannot be redeemed at a lane escrow (redeem them at the "
        "old escrow with the specmarket release that wrote them); this wallet starts empty",
        path, aside,
    )  # fmt: skip


def _salvage(path: Path, exc: WalletError) -> dict[str, Account]:
    """The accounts of an unreadable wallet that still read as accounts, their vouchers valid; the file
    itself is set aside (renamed, never deleted), so nothing in it is lost."""
    aside = path.with_name(f"{path.name}.unreadable-{time.time_ns()}")
    os.replace(path, aside)
    accounts: dict[str, Account] = {}
    try:
        if aside.stat().st_size <= MAX_SALVAGE_BYTES:
            raw = json.loads(aside.read_text(errors="replace")).get("accounts", {})
            read = [(str(k), a) for k, f in raw.items() if (a := _account(k, f)) is not None]
            read.sort(key=lambda item: not item[1].lanes)  # stable: the accounts with a voucher first
            accounts = dict(read[:MAX_ACCOUNTS])
    except (OSError, ValueError, AttributeError) as err:
        log.error("nothing could be recovered from %s: %s", aside, err)
    log.error(
        "%s; it is kept as %s, and %d accounts (%d with a voucher) were recovered from it",
        exc, aside, len(accounts), sum(1 for a in accounts.values() if a.lanes),
    )  # fmt: skip
    return accounts


_TYPES = {"int": int, "str": str, "float": (int, float), "dict[str, str]": dict}


def _account(key: object, stored: object) -> Account | None:
    """One stored account, or None when it does not read as one: a field of the wrong type, a key that
    is not its operator's, more than MAX_LANES lanes, a voucher that does not parse or is not for its
    account and lane, or more than MAX_ACCOUNT_BYTES in all."""
    try:
        account = Account(**stored)  # type: ignore[arg-type]
        for f in fields(Account):
            value = getattr(account, f.name)
            if not isinstance(value, _TYPES[str(f.type)]) or isinstance(value, bool):
                return None
        if not isinstance(key, str) or key != account_key(account.chain_id, account.escrow, account.operator):
            return None
        if len(account.lanes) > MAX_LANES or len(json.dumps(asdict(account))) > MAX_ACCOUNT_BYTES:
            return None
        domain = escrow_domain(account.chain_id, account.escrow)
        for lane, text in account.lanes.items():
            signed = SignedVoucher.loads(text)
            v = signed.voucher
            if lane != str(v.lane) or v.operator != account.operator or signed.domain != domain:
                return None
        return account
    except (TypeError, ValueError, AttributeError, VoucherError):
        return None


def _read(path: Path) -> dict[str, Account]:
    try:
        if path.stat().st_size > MAX_WALLET_BYTES:
            raise WalletError(f"{path} is larger than {MAX_WALLET_BYTES} bytes")
        data: Any = json.loads(path.read_text())
        if data.get("format") == 1:
            raise _FormerFormat(f"{path} is a format-1 wallet")
        if data.get("format") != WALLET_FORMAT:
            raise WalletError(f"{path}: unknown wallet format {data.get('format')!r}")
        accounts = {}
        for key, stored in data["accounts"].items():
            if (account := _account(key, stored)) is None:
                raise ValueError(f"the account {key!r:.120} does not read as one")
            accounts[key] = account
        if len(accounts) > MAX_ACCOUNTS:
            raise ValueError(f"{len(accounts)} accounts, more than {MAX_ACCOUNTS}")
        return accounts
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WalletError(f"cannot read the wallet {path}: {exc}") from exc
