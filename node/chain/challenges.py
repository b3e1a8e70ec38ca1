"""The challenges of one deployment as rows an operator can act on: against whom, at which
position, in what state, until when (`specmarket chain status`, the target node's dashboard).

A row's ``state`` is one of ``STATES``: "open" until a referee quorum resolves it or its resolve
window closes; then "refundable" (open past its deadline: anyone can `specmarket chain refund ID`)
until it is refunded, "expired (refunded)". Resolved ones are "operator at fault" or "operator
cleared". ``deadline`` is when the resolve window closes: ``opened_at`` + the contract's
``resolveTimeout`` (unix time on the chain's clock).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from eth_utils import to_checksum_address

from node.chain import ChainError
from node.chain.client import BondClient, ChallengeStatus
from node.chain.deployment import format_ether

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 50  # rows shown: the newest challenges
OPEN, REFUNDABLE = "open", "refundable"
STATES = {
    ChallengeStatus.NONE: "unknown",  # no such challenge (an id from a block that was reorganised away)
    ChallengeStatus.OPEN: OPEN,
    ChallengeStatus.OPERATOR_AT_FAULT: "operator at fault",
    ChallengeStatus.OPERATOR_CLEARED: "operator cleared",
    ChallengeStatus.EXPIRED: "expired (refunded)",
}
COLUMNS = ("id", "operator", "position", "state", "bond", "deadline")


@dataclass(frozen=True)
class ChallengeRow:
    id: int
    operator: str
    challenger: str
    position: int
    state: str  # one of STATES' values or REFUNDABLE
    opened_at: int  # unix time on the chain's clock
    deadline: int  # opened_at + resolveTimeout: the last second a verdict can land
    bond_wei: int  # the challenger's bond (the contract's challengerBond)

    def to_json(self) -> dict[str, Any]:
        """The row with its bond in ETH, as every amount `chain status` prints ("0.1 ETH")."""
        row = asdict(self)
        row["bond"] = format_ether(row.pop("bond_wei"))
        return row


def challenge_ids(client: BondClient, operator: str | None = None) -> Sequence[int]:
    """Every challenge id, oldest first; only those against ``operator`` when given (read from the
    ChallengeOpened events; without an operator from the contract's id counter, no log scan)."""
    if operator is None:
        return range(1, int(client.call("nextChallengeId")))
    try:
        address = to_checksum_address(operator)
    except (ValueError, TypeError):
        raise ChainError(f"not an operator address: {operator!r}") from None
    return sorted({int(e["id"]) for e in client.events("ChallengeOpened", operator=address)})


def newest(ids: Sequence[int], limit: int) -> list[int]:
    """The ``limit`` highest of ascending ``ids``, newest first."""
    return list(reversed(ids[max(len(ids) - max(limit, 0), 0) :]))


def rows_of(client: BondClient, ids: Sequence[int], resolve_timeout: int) -> list[ChallengeRow]:
    """The rows of ``ids``, in that order; ``resolve_timeout`` is the contract's (an immutable: a
    caller that polls reads it once)."""
    if not ids:
        return []
    now = client.chain_time()
    return [_row(client, cid, resolve_timeout, now) for cid in ids]


def challenge_rows(client: BondClient, operator: str | None = None, limit: int = DEFAULT_LIMIT) -> list[ChallengeRow]:
    """The newest ``limit`` challenges (against ``operator`` when given), newest first."""
    ids = newest(challenge_ids(client, operator), limit)
    return rows_of(client, ids, int(client.call("resolveTimeout"))) if ids else []


def _row(client: BondClient, cid: int, timeout: int, now: int) -> ChallengeRow:
    record = client.challenge_record(cid)
    opened = int(record["created_at"])
    status = int(record["status"])
    state = STATES.get(status, f"status {status}")
    if state == OPEN and now > opened + timeout:
        state = REFUNDABLE
    return ChallengeRow(
        id=cid,
        operator=record["operator"],
        challenger=record["challenger"],
        position=int(record["position"]),
        state=state,
        opened_at=opened,
        deadline=opened + timeout,
        bond_wei=int(record["bond"]),
    )


# ------------------------------------------------------------------------- text


def challenge_table(rows: Sequence[Mapping[str, Any]], now: int) -> list[str]:
    """Lines of a table of ``ChallengeRow.to_json()`` rows, deadlines relative to ``now`` (chain time),
    then a refund hint for each refundable one."""
    cells = [COLUMNS] + [tuple(_cell(row, column, now) for column in COLUMNS) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip() for line in cells]
    for row in rows:
        if row["state"] == REFUNDABLE:
            lines.append(f"challenge {row['id']}: unresolved past its deadline; `specmarket chain refund {row['id']}`")
    return lines


def _cell(row: Mapping[str, Any], column: str, now: int) -> str:
    if column != "deadline":
        return str(row[column])
    deadline = int(row["deadline"])
    when = utc(deadline)
    if row["state"] == OPEN:
        return f"{when} (in {span(deadline - now)})"
    if row["state"] == REFUNDABLE:
        return f"{when} ({span(now - deadline)} ago)"
    return when


def span(seconds: int) -> str:
    """'45 s', '12 min', '3 h', '3 h 5 min', '2 d 4 h' (rounded down)."""
    seconds = max(int(seconds), 0)
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if minutes < 1:
        return f"{seconds} s"
    if hours < 1:
        return f"{minutes} min"
    if days < 1:
        return f"{hours} h {minutes % 60} min" if minutes % 60 else f"{hours} h"
    return f"{days} d {hours % 24} h" if hours % 24 else f"{days} d"


def utc(ts: int) -> str:
    """Unix time ``ts`` as '2026-12-02 01:20:00 UTC'."""
    return datetime.fromtimestamp(int(ts), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
