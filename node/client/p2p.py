"""`specmarket ask` over libp2p: a throwaway Noise-only host speaks the generation protocol.

A plain request is a 1.1.0 request, so it is answered by a 1.2.0 target and by an older one alike. A
request that drafts for itself (``drafter``: node.client.drafting) needs ``/specmarket/generate/1.2.0``;
a target that does not speak it is told apart from one that cannot be reached."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.exceptions import BaseLibp2pError

from p2p.framing import FrameStream, StreamFailed
from p2p.host import make_host, parse_listen, parse_peer_addr
from p2p.messages import (
    DEFAULT_LISTEN,
    GENERATE_PROTOCOL_ID,
    GENERATE_PROTOCOL_V1_1,
    TO_CLIENT,
    TO_CLIENT_DRAFTING,
    Chunk,
    Done,
    Error,
    InvalidMessage,
    Request,
)
from verifier.errors import SpecmarketError, error_leaves

if TYPE_CHECKING:
    from node.client.drafting import ClientDrafter

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
CHUNK_TIMEOUT_S = 60.0  # the longest silence between two chunks (a long prompt's prefill)
CLIENT_VOCAB_BOUND = 1 << 20  # the client does not know V; token ids are bounded loosely


class AskFailed(SpecmarketError):
    """The target refused or failed the request, or could not be reached."""


async def ask_p2p(
    target: str, request: Request, on_text: Callable[[str], None], drafter: ClientDrafter | None = None
) -> Done:
    """Send ``request`` to the target at multiaddr ``target``; stream text; return the summary.
    With ``drafter`` the client drafts for the request itself (``request.draft`` is set here).
    AskFailed, one error, whatever else the host's nursery saw end with it (a lost connection)."""
    if drafter is not None:
        request = replace(request, draft=True)
    try:
        return await _ask(target, request, on_text, drafter)
    except BaseExceptionGroup as group:
        failed = [leaf for leaf in error_leaves(group) if isinstance(leaf, AskFailed)]
        if failed:
            raise failed[0] from None
        raise


async def _ask(target: str, request: Request, on_text: Callable[[str], None], drafter: ClientDrafter | None) -> Done:
    info = parse_peer_addr(target)
    host = make_host(create_new_key_pair())  # an ephemeral identity: clients need no reputation
    async with host.run(listen_addrs=[parse_listen(DEFAULT_LISTEN)]):
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                await host.connect(info)
        except trio.TooSlowError:
            raise AskFailed(f"cannot reach the target at {target}: no answer in {CONNECT_TIMEOUT_S:.0f} s") from None
        except (BaseLibp2pError, OSError) as exc:
            raise AskFailed(f"cannot reach the target at {target}: {str(exc) or type(exc).__name__}") from exc
        opening = time.perf_counter()
        stream = await _open_stream(host, info.peer_id, target, drafting=drafter is not None)
        if drafter is not None:  # the protocol's negotiation is one round trip: the link's, near enough
            drafter.link_rtt_s = time.perf_counter() - opening
        fs = FrameStream(stream, vocab_size=CLIENT_VOCAB_BOUND, allowed=TO_CLIENT_DRAFTING if drafter else TO_CLIENT)
        try:
            return await _exchange(fs, request, on_text, drafter)
        finally:
            await fs.close()


async def _open_stream(host, peer_id, target: str, *, drafting: bool):
    """The generate stream: 1.2.0 for a drafting client (an older target cannot serve it: a clear
    error), else whichever of 1.2.0 and 1.1.0 the target speaks."""
    protocols = [GENERATE_PROTOCOL_ID] if drafting else [GENERATE_PROTOCOL_ID, GENERATE_PROTOCOL_V1_1]
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            return await host.new_stream(peer_id, protocols)
    except trio.TooSlowError:
        raise AskFailed(f"the target at {target} opened no stream in {CONNECT_TIMEOUT_S:.0f} s") from None
    except (BaseLibp2pError, OSError) as exc:
        if drafting and _not_supported(exc):
            raise AskFailed(
                f"the target at {target} does not support client drafting ({GENERATE_PROTOCOL_ID}): "
                "ask without --draft, or upgrade the target"
            ) from exc
        raise AskFailed(f"cannot reach the target at {target}: {str(exc) or type(exc).__name__}") from exc


def _not_supported(exc: BaseException) -> bool:
    """Whether a failed stream open was the protocol negotiation's refusal (multistream-select's
    "na"), not a lost connection."""
    text = " ".join(f"{type(e).__name__} {e}" for e in _chain(exc)).lower()
    return "protocol" in text and ("not supported" in text or "negotiat" in text or "multiselect" in text)


def _chain(exc: BaseException | None):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


async def _exchange(
    fs: FrameStream, request: Request, on_text: Callable[[str], None], drafter: ClientDrafter | None
) -> Done:
    """The request out, then the answer's frames in; a drafting client's draft protocol messages go
    to its drafter, which drafts beside the reads."""
    async with trio.open_nursery() as nursery:
        try:
            if drafter is not None:
                drafter.asked()
            await fs.send(request, CONNECT_TIMEOUT_S)
            while True:
                msg = await fs.receive(CHUNK_TIMEOUT_S)
                if isinstance(msg, Chunk):
                    on_text(msg.text)
                elif isinstance(msg, Done):
                    return msg
                elif isinstance(msg, Error):
                    raise AskFailed(f"the target refused the request: {msg.message}")
                elif drafter is not None:  # an open or an advance (TO_CLIENT_DRAFTING admits no more)
                    await drafter.take(msg, fs, nursery)
        except (StreamFailed, InvalidMessage) as exc:
            raise AskFailed(f"the generation stream failed: {exc}") from exc
        finally:
            if drafter is not None:
                drafter.close()  # a block being drafted stops at its next token: the nursery ends at once
            nursery.cancel_scope.cancel()


def make_request(
    prompt: str,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    *,
    top_k: int = 0,
    ignore_eos: bool = False,
) -> Request:
    """The generation request (the seed's bound is checked by AskConfig, before anything is sent)."""
    return Request(prompt, max_new_tokens, temperature, top_k, top_p, seed, ignore_eos)
