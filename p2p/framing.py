"""Varint-length-prefixed msgpack frames on a libp2p stream, every read under a deadline.

A ``FrameStream`` turns every way a remote peer can misbehave (a frame over the size cap, bytes that
are not msgpack, a schema violation, a reset, EOF, silence past the deadline) into one of two
exceptions, ``InvalidMessage`` or ``StreamFailed``, so callers drop the stream with one log line.
The peer closing its side between two frames, the normal end of a session, is ``StreamEnded``: a
``StreamFailed`` (the stream is over all the same) that callers may tell apart from a failure.
"""

from __future__ import annotations

import logging

import trio
from libp2p.abc import INetStream
from libp2p.exceptions import BaseLibp2pError
from libp2p.io.exceptions import IncompleteReadError, MessageTooLarge
from libp2p.io.msgio import VarIntLengthMsgReadWriter

from p2p.messages import MAX_FRAME_BYTES, InvalidMessage, Message, decode, encode
from verifier.errors import SpecmarketError
from verifier.proposal import MAX_GAMMA

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 2.0


class StreamFailed(SpecmarketError):
    """The stream was reset, closed, or went silent past its deadline."""


class StreamEnded(StreamFailed):
    """The peer closed its side of the stream between two frames: no frame was cut short."""


class _FrameReader:
    """The stream as msgio reads it, noting whether the frame being read has begun: EOF before its
    first byte is a close between frames (``StreamEnded``), after it a truncated frame."""

    def __init__(self, stream: INetStream) -> None:
        self.stream = stream
        self.begun = False

    async def read(self, n: int | None = None) -> bytes:
        data = await self.stream.read(n)
        self.begun = self.begun or bool(data)
        return data

    async def write(self, data: bytes) -> None:
        await self.stream.write(data)

    async def close(self) -> None:
        await self.stream.close()


class FrameStream:
    """One libp2p stream carrying validated protocol messages in both directions."""

    def __init__(
        self,
        stream: INetStream,
        *,
        vocab_size: int,
        allowed: frozenset[str],
        max_gamma: int = MAX_GAMMA,
    ) -> None:
        self.stream = stream
        self.reader = _FrameReader(stream)
        self.rw = VarIntLengthMsgReadWriter(self.reader, max_msg_size=MAX_FRAME_BYTES)
        self.vocab_size = vocab_size
        self.allowed = allowed
        self.max_gamma = max_gamma
        self.sending = trio.Lock()  # one frame at a time: a generate stream carries chunks and draft messages

    @property
    def peer_id(self) -> str:
        return str(self.stream.muxed_conn.peer_id)

    async def send(self, message: Message, timeout_s: float) -> None:
        data = encode(message)
        try:
            with trio.fail_after(timeout_s):
                async with self.sending:
                    await self.rw.write_msg(data)
        except trio.TooSlowError as exc:
            raise StreamFailed(f"writing to {self.peer_id} took longer than {timeout_s:.3f} s") from exc
        except (BaseLibp2pError, OSError, EOFError) as exc:
            raise StreamFailed(f"writing to {self.peer_id} failed: {type(exc).__name__}: {exc}") from exc

    async def receive(self, timeout_s: float) -> Message:
        """The next frame, validated; at most ``timeout_s`` seconds. The frame size is checked
        against MAX_FRAME_BYTES from its length prefix, before its body is read. The peer closing
        the stream before the frame's first byte raises ``StreamEnded``."""
        self.reader.begun = False
        try:
            with trio.fail_after(timeout_s):
                frame = await self.rw.read_msg()
        except trio.TooSlowError as exc:
            raise StreamFailed(f"no frame from {self.peer_id} within {timeout_s:.3f} s") from exc
        except MessageTooLarge as exc:
            raise InvalidMessage(f"oversized frame from {self.peer_id}: {exc}") from exc
        except (BaseLibp2pError, OSError, EOFError) as exc:
            if not self.reader.begun and isinstance(exc, (EOFError, IncompleteReadError)):
                raise StreamEnded(f"{self.peer_id} closed the stream") from exc
            raise StreamFailed(f"stream from {self.peer_id} failed: {type(exc).__name__}: {exc}") from exc
        return decode(frame, vocab_size=self.vocab_size, max_gamma=self.max_gamma, allowed=self.allowed)

    async def close(self) -> None:
        """Close politely; reset if the peer does not let us."""
        with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
            try:
                await self.stream.close()
                return
            except (BaseLibp2pError, OSError):
                pass
        if scope.cancelled_caught:
            log.debug("closing the stream to %s timed out; resetting", self.peer_id)
        await self.reset()

    async def reset(self) -> None:
        with trio.move_on_after(CLOSE_TIMEOUT_S):
            try:
                await self.stream.reset()
            except (BaseLibp2pError, OSError):
                log.debug("reset of the stream to %s failed (already gone)", self.peer_id)
