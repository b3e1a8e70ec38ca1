"""Noise sessions whose writes a cancellation cannot tear.

Noise encrypts each transport message under a counter nonce that both ends step in lockstep (the
Noise Protocol Framework, rev. 34, §5.1: ``EncryptWithAd`` increments ``n``; ``DecryptWithAd``
does the same on the other end). py-libp2p's session encrypts, then awaits the socket: the raw
stream's write lock and ``send_all`` are cancellation points. A task cancelled there (a drafting
session that ended, a job that finished and cancelled its readers, a deadline) has spent a nonce
and sent nothing, so the peer decrypts every later message with the wrong nonce, logs "Failed
authentication of message" and drops the connection with every stream on it. Yamux writes from
whichever task reads or writes a stream (a read sends a window update), so any cancelled stream
operation can do it. Seen in CI: a drafter whose session ended while it sent an early draft lost
its connection to the target, and the next job ran without drafts (about one run in six of test_overlap).

``CancelSafeNoise`` is py-libp2p's Noise transport whose sessions write atomically: a write runs
to its end shielded from ``cancel()``, within the caller's own deadline and at most
``WRITE_DEADLINE_S``. A deadline that stops a write half-way has left the connection unusable, so
it is closed at once (the peer sees it end, not a decryption failure later).
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from libp2p.abc import IRawConnection, ISecureConn
from libp2p.exceptions import BaseLibp2pError
from libp2p.io.exceptions import ConnectionClosedError
from libp2p.peer.id import ID
from libp2p.security.noise.transport import Transport as NoiseTransport

log = logging.getLogger(__name__)

WRITE_DEADLINE_S = 10.0  # the longest one write may take when its caller set no deadline
ABORT_TIMEOUT_S = 1.0  # closing a connection a torn write left unusable


class AtomicWrites:
    """An ``ISecureConn``: py-libp2p's session, each ``write`` sent whole or the connection closed.
    Every other attribute is the session's own."""

    def __init__(self, session: ISecureConn) -> None:
        self._session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    async def write(self, data: bytes) -> None:
        # cancelled already (a cancel() while the caller waited for a lock): stop before encrypting
        await trio.lowlevel.checkpoint_if_cancelled()
        deadline = min(trio.current_effective_deadline(), trio.current_time() + WRITE_DEADLINE_S)
        with trio.CancelScope(deadline=deadline, shield=True) as scope:
            await self._session.write(data)
        if not scope.cancelled_caught:
            return
        log.debug("a write of %d bytes to %s ran out of time; closing the connection", len(data), self.remote())
        with trio.move_on_after(ABORT_TIMEOUT_S, shield=True):
            try:
                await self._session.close()
            except (BaseLibp2pError, OSError) as exc:
                log.debug("closing the connection failed: %s", exc)
        await trio.lowlevel.checkpoint_if_cancelled()  # the caller's deadline: its own TooSlowError
        raise ConnectionClosedError(f"a write took longer than {WRITE_DEADLINE_S} s; connection closed")

    def remote(self) -> str:
        try:
            return str(self._session.get_remote_peer())
        except (AttributeError, BaseLibp2pError):
            return "a peer"


class CancelSafeNoise(NoiseTransport):
    """py-libp2p's Noise transport (XX handshake), its sessions wrapped in ``AtomicWrites``."""

    async def secure_inbound(self, conn: IRawConnection) -> ISecureConn:
        return AtomicWrites(await super().secure_inbound(conn))  # type: ignore[return-value]

    async def secure_outbound(self, conn: IRawConnection, peer_id: ID) -> ISecureConn:
        return AtomicWrites(await super().secure_outbound(conn, peer_id))  # type: ignore[return-value]
