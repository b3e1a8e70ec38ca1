"""`specmarket ask` over libp2p: a throwaway Noise-only host speaks the generation protocol."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.exceptions import BaseLibp2pError

from p2p.framing import FrameStream, StreamFailed
from p2p.host import make_host, parse_listen, parse_peer_addr
from p2p.messages import DEFAULT_LISTEN, GENERATE_PROTOCOL_ID, TO_CLIENT, Chunk, Done, Error, InvalidMessage, Request
from verifier.errors import SpecmarketError, error_leaves

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
CHUNK_TIMEOUT_S = 60.0  # the longest silence between two chunks (a long prompt's prefill)
CLIENT_VOCAB_BOUND = 1 << 20  # the client does not know V; token ids are bounded loosely


class AskFailed(SpecmarketError):
    """The target refused or failed the request, or could not be reached."""


async def ask_p2p(target: str, request: Request, on_text: Callable[[str], None]) -> Done:
    """Send ``request`` to the target at multiaddr ``target``; stream text; return the summary.
    AskFailed, one error, whatever else the host's nursery saw end with it (a lost connection)."""
    try:
        return await _ask(target, request, on_text)
    except BaseExceptionGroup as group:
        failed = [leaf for leaf in error_leaves(group) if isinstance(leaf, AskFailed)]
        if failed:
            raise failed[0] from None
        raise


async def _ask(target: str, request: Request, on_text: Callable[[str], None]) -> Done:
    info = parse_peer_addr(target)
    host = make_host(create_new_key_pair())  # an ephemeral identity: clients need no reputation
    async with host.run(listen_addrs=[parse_listen(DEFAULT_LISTEN)]):
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                await host.connect(info)
                stream = await host.new_stream(info.peer_id, [GENERATE_PROTOCOL_ID])
        except trio.TooSlowError:
            raise AskFailed(f"cannot reach the target at {target}: no answer in {CONNECT_TIMEOUT_S:.0f} s") from None
        except (BaseLibp2pError, OSError) as exc:
            raise AskFailed(f"cannot reach the target at {target}: {str(exc) or type(exc).__name__}") from exc
        fs = FrameStream(stream, vocab_size=CLIENT_VOCAB_BOUND, allowed=TO_CLIENT)
        try:
            return await _exchange(fs, request, on_text)
        except (StreamFailed, InvalidMessage) as exc:
            raise AskFailed(f"the generation stream failed: {exc}") from exc
        finally:
            await fs.close()


async def _exchange(fs: FrameStream, request: Request, on_text: Callable[[str], None]) -> Done:
    await fs.send(request, CONNECT_TIMEOUT_S)
    while True:
        msg = await fs.receive(CHUNK_TIMEOUT_S)
        if isinstance(msg, Chunk):
            on_text(msg.text)
        elif isinstance(msg, Done):
            return msg
        elif isinstance(msg, Error):
            raise AskFailed(f"the target refused the request: {msg.message}")


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
