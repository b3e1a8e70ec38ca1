"""Counter-based Gumbel noise: the shared randomness of the GUMBEL rule (docs/design.md §2).

Exact construction, reproducible bit for bit in any language:

1. Philox-4x64-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") as in
   numpy: ``numpy.random.Philox(key=[seed, k], counter=[0, 0, 0, stream])``, where ``seed`` and
   ``k`` are unsigned 64-bit integers (``k`` = index of the generated token, 0 for the first new
   token) and ``stream`` separates independent uses of the same (seed, k).
2. Draw ``n`` raw 64-bit words ``w_0 .. w_{n-1}`` with ``random_raw(n)``.
3. Uniforms in the open interval (0, 1): ``u_i = ((w_i >> 11) + 0.5) * 2**-53`` (float64).
4. Standard Gumbel: ``g_i = -log(-log(u_i))`` (float64).

``argmax(logits / T + g)`` is then an exact sample from ``softmax(logits / T)`` (Gumbel-max trick).
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from verifier.errors import InvalidParams

MAX_U64 = (1 << 64) - 1
MAX_SEED = MAX_U64  # every seed the noise accepts; the engine, the wire and receipts use this bound
STREAM_GUMBEL = 0  # noise for the target token y_k (and the honest drafter's coupled draft)
STREAM_ACCEPT = 1  # LEVIATHAN only: the acceptance uniform r_k
STREAM_RESIDUAL = 2  # LEVIATHAN only: noise for sampling the residual (p - q)+
_TWO_POW_MINUS_53 = 2.0**-53
NOISE_CACHE_SIZE = 256
_PHILOX_BUFFER_EMPTY = 4  # numpy's Philox buffers 4 words; position 4 = nothing buffered
_local = threading.local()


def _check_u64(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) <= MAX_U64:
        raise InvalidParams(f"{name} must be an integer in [0, 2**64), got {value!r}")


def raw_words(seed: int, k: int, n: int, stream: int = STREAM_GUMBEL) -> np.ndarray:
    """``n`` raw uint64 words of the Philox stream keyed by (seed, k)."""
    _check_u64("seed", seed)
    _check_u64("k", k)
    key = np.array([int(seed), int(k)], dtype=np.uint64)
    counter = np.array([0, 0, 0, stream], dtype=np.uint64)
    # Same words as np.random.Philox(key=key, counter=counter).random_raw(n), but re-keying one
    # per-thread generator is ~7x cheaper than constructing a new one.
    bitgen = getattr(_local, "philox", None)
    if bitgen is None:
        bitgen = _local.philox = np.random.Philox(key=key, counter=counter)
    state = bitgen.state
    state["state"] = {"counter": counter, "key": key}
    state["buffer_pos"] = _PHILOX_BUFFER_EMPTY
    bitgen.state = state
    return bitgen.random_raw(n)


def uniforms(seed: int, k: int, n: int, stream: int = STREAM_GUMBEL) -> np.ndarray:  # [n] float64 in (0, 1)
    words = raw_words(seed, k, n, stream)
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) * _TWO_POW_MINUS_53


@functools.lru_cache(maxsize=NOISE_CACHE_SIZE)
def gumbel(seed: int, k: int, n: int, stream: int = STREAM_GUMBEL) -> np.ndarray:  # [n] float64, read-only
    """Cached: within a round the drafter and the verifier ask for the same (seed, k)."""
    noise = -np.log(-np.log(uniforms(seed, k, n, stream)))
    noise.flags.writeable = False
    return noise
