"""One packed weights file per model, memory-mapped by every process that runs it.

A converted Qwen2-architecture model (the qwen2.5-coder pair) is a directory with ``config.json``,
the tokenizer, ``weights.bin`` and its index ``weights.json``. The index lists each tensor's byte
offset, dtype, shape and layout:

- ``skinny``: a linear layer's weight [N, K] as float16 in the skinny kernel's packed layout
  (node/model/kernels/skinny_gemm.c: blocks of ``ROWS_PER_BLOCK`` rows, and inside a block, for each
  group of 8 k's, the rows' 8 values after each other; rows past N are zero). The kernel reads it
  straight from the page cache: nothing is repacked or copied at load.
- ``q5`` / ``q4``: a draft's linear weight in 5 or 4 bits with a float16 scale per group of 32 k's
  (uint8 bytes in skinny_gemm.c's group layout; ``pack_groups``).
- ``rows``: a plain row-major array (the token embedding in float16; norms and biases in float32).

Q, K and V are written as one fused matrix (and one bias), and so are the MLP's gate and up: each
output element is still its own dot product, so fusing changes nothing but the number of calls.

**Precision.** The GGUF's quantized weights are dequantized to fp32 and rounded once, here, to
float16. That rounding defines the served model, the one whose hash receipts commit to; the
kernel widens float16 to fp32 exactly (F16C) and accumulates in fp32, so every party computing on
this file gets the same products. Norm weights and biases stay fp32 (they are fp32 in the GGUF).

Opening maps the file read-only (``mmap``), so targets, referees, challengers and drafters on one
machine share one copy of the weights through the page cache; no process keeps a private one.
"""

from __future__ import annotations

import json
import mmap
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from node.model.kernels import LANES, ROWS_PER_BLOCK
from verifier.errors import SpecmarketError

WEIGHTS_FILE = "weights.bin"
INDEX_FILE = "weights.json"
PACKED_FORMAT = 1
ALIGN = 64  # bytes: every tensor starts on a cache line
DTYPES = {"float16": np.float16, "float32": np.float32, "int8": np.int8, "uint8": np.uint8}
SCALE_SUFFIX = ".scale"  # an int8 matrix's per-row scales, fp32 [N], beside it in the index
Q8_LEVELS = 127  # symmetric int8: q = round(w / s), s = max |w_row| / 127
GROUP = 32  # k's per group of a 4- or 5-bit matrix, each group with its own float16 scale
QUANT_BITS = {"q4": 4, "q5": 5}  # group-quantized layouts (skinny_gemm.c's "4- and 5-bit weights")


class PackedModelError(SpecmarketError):
    """A packed model directory whose index and weights file do not fit together."""


def is_packed_model(path: Path | str) -> bool:
    return (Path(path) / INDEX_FILE).is_file()


def pack_skinny(weight: np.ndarray) -> np.ndarray:  # [N, K] -> flat float16, the kernel's layout
    """``weight`` rounded to float16 in skinny_gemm.c's packed layout (``skinny_pack``'s, in numpy)."""
    rows, k = weight.shape
    if k % LANES:
        raise PackedModelError(f"a packed matrix needs K a multiple of {LANES}, got {k}")
    blocks = -(-rows // ROWS_PER_BLOCK)
    padded = np.zeros((blocks * ROWS_PER_BLOCK, k), dtype=np.int8 if weight.dtype == np.int8 else np.float16)
    padded[:rows] = weight
    # [B, R, G, L] -> [B, G, R, L]: block b, group g, row r, lane l at ((b G + g) R + r) L + l
    return padded.reshape(blocks, ROWS_PER_BLOCK, k // LANES, LANES).transpose(0, 2, 1, 3).ravel()


def quantize_rows_q8(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # [N, K] -> q [N, K] int8, s [N]
    """Weight-only int8 with one absmax scale per output row (per-channel, as in LLM.int8's weight
    quantization: Dettmers et al. 2022). For a draft only: its precision changes acceptance, never
    what the target samples."""
    scales = np.abs(weight).max(axis=1) / Q8_LEVELS
    scales[scales == 0] = 1.0
    q = np.clip(np.rint(weight / scales[:, None]), -Q8_LEVELS, Q8_LEVELS).astype(np.int8)
    return q, scales.astype(np.float32)


def group_bytes(bits: int) -> int:
    """Bytes per block of ROWS_PER_BLOCK rows and group: nibbles, fifth bits (5-bit only), 4 scales."""
    return ROWS_PER_BLOCK * GROUP // 2 + (ROWS_PER_BLOCK * GROUP // 8 if bits == 5 else 0) + ROWS_PER_BLOCK * 2


def quantize_groups(weight: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:  # [N, K] -> q, s [N, K/32]
    """Weight-only quantization with one float16 scale per group of GROUP k's: llama.cpp's Q4_0 and
    Q5_0 (ggml, Gerganov et al.). The group's weight of largest magnitude m maps to level 0,
    s = m / -z with z = 2^(bits-1), and q = round(w / s) + z clipped to 0 .. 2z - 1, so w ≈ (q - z) s.
    A GGUF tensor that is already Q5_0 comes back exactly (its blocks were made by the same rule).
    For a draft only: its precision changes acceptance, never what the target samples."""
    rows, k = weight.shape
    if k % GROUP:
        raise PackedModelError(f"a {bits}-bit matrix needs K a multiple of {GROUP}, got {k}")
    zero = 1 << (bits - 1)
    groups = weight.reshape(rows, k // GROUP, GROUP).astype(np.float32)
    at = np.abs(groups).argmax(axis=2)[..., None]
    scales = (np.take_along_axis(groups, at, axis=2)[..., 0] / -zero).astype(np.float16)  # [N, G]
    wide = scales.astype(np.float32)
    inverse = np.divide(1.0, wide, out=np.zeros_like(wide), where=wide != 0)
    q = np.clip(np.rint(groups * inverse[..., None]) + zero, 0, 2 * zero - 1).astype(np.uint8)
    return q.reshape(rows, k), scales


def pack_groups(q: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:  # q [N, K], s [N, K/32] -> uint8
    """skinny_gemm.c's group layout: per block of ROWS_PER_BLOCK rows and group g, 64 bytes with the low
    4 bits of row r's k = 32 g + j in the low nibble of byte 16 r + j and of k = 32 g + 16 + j in its
    high nibble; for 5 bits, two 64-bit masks of the fifth bits (bit 16 r + j); then the rows' 4
    float16 scales (rows past N: q = z, scale 0)."""
    rows, k = q.shape
    blocks, groups, half = -(-rows // ROWS_PER_BLOCK), k // GROUP, GROUP // 2
    padded = np.full((blocks * ROWS_PER_BLOCK, k), 1 << (bits - 1), dtype=np.uint8)
    padded[:rows] = q
    s = np.zeros((blocks * ROWS_PER_BLOCK, groups), dtype=np.float16)
    s[:rows] = scales
    g = padded.reshape(blocks, ROWS_PER_BLOCK, groups, GROUP).transpose(0, 2, 1, 3)  # [B, G, R, 32]
    low, high = g[..., :half] & 0x0F, g[..., half:] & 0x0F
    parts = [(low | (high << 4)).reshape(blocks, groups, -1)]  # [B, G, 64]
    if bits == 5:
        for plane in (g[..., :half], g[..., half:]):  # bit 16 r + j of a little-endian 64-bit mask
            fifth = (plane >> 4).reshape(blocks, groups, -1).astype(bool)
            parts.append(np.packbits(fifth, axis=2, bitorder="little"))  # [B, G, 8]
    parts.append(s.reshape(blocks, ROWS_PER_BLOCK, groups).transpose(0, 2, 1).copy().view(np.uint8))  # [B, G, 8]
    return np.concatenate(parts, axis=2).ravel()


def unpack_groups(flat: np.ndarray, shape: tuple[int, ...], bits: int) -> np.ndarray:  # -> [N, K] fp32
    """The inverse of ``pack_groups``, dequantized: (q - z) x scale."""
    rows, k = shape
    blocks, groups, half = -(-rows // ROWS_PER_BLOCK), k // GROUP, GROUP // 2
    data = flat.reshape(blocks, groups, group_bytes(bits))
    nibbles = data[..., : ROWS_PER_BLOCK * half].reshape(blocks, groups, ROWS_PER_BLOCK, half)
    low, high = nibbles & 0x0F, nibbles >> 4
    if bits == 5:
        masks = data[..., ROWS_PER_BLOCK * half : ROWS_PER_BLOCK * half + 16].reshape(blocks, groups, 2, 8)
        fifth = np.unpackbits(masks, axis=3, bitorder="little").reshape(blocks, groups, 2, ROWS_PER_BLOCK, half)
        low, high = low | (fifth[:, :, 0] << 4), high | (fifth[:, :, 1] << 4)
    q = np.concatenate([low, high], axis=3).astype(np.float32)  # [B, G, R, 32]
    scales = data[..., -ROWS_PER_BLOCK * 2 :].copy().view(np.float16).astype(np.float32)  # [B, G, R]
    w = (q - (1 << (bits - 1))) * scales[..., None]
    return w.transpose(0, 2, 1, 3).reshape(blocks * ROWS_PER_BLOCK, k)[:rows]


@dataclass(frozen=True)
class Entry:
    """One tensor of the index."""

    offset: int
    dtype: str
    shape: tuple[int, ...]
    layout: str  # "skinny", "rows", or a group-quantized "q4" / "q5"

    @property
    def nbytes(self) -> int:
        if self.layout in QUANT_BITS:
            return -(-self.shape[0] // ROWS_PER_BLOCK) * (self.shape[1] // GROUP) * group_bytes(QUANT_BITS[self.layout])
        count = int(np.prod(self.shape))
        if self.layout == "skinny":
            count = -(-self.shape[0] // ROWS_PER_BLOCK) * ROWS_PER_BLOCK * self.shape[1]
        return count * np.dtype(DTYPES[self.dtype]).itemsize


class PackedWriter:
    """Writes ``weights.bin`` tensor by tensor (so conversion holds one dequantized matrix at a time),
    then the index. The caller renames the finished directory into place."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._file = (directory / WEIGHTS_FILE).open("wb")
        self._entries: dict[str, Entry] = {}

    def _write(self, name: str, data: np.ndarray, shape: tuple[int, ...], layout: str) -> None:
        if name in self._entries:
            raise PackedModelError(f"tensor {name} written twice")
        offset = self._file.tell()
        pad = -offset % ALIGN
        self._file.write(b"\0" * pad)
        dtype = {np.dtype(np.float16): "float16", np.dtype(np.int8): "int8", np.dtype(np.uint8): "uint8"}
        dtype = dtype.get(data.dtype, "float32")
        self._entries[name] = Entry(offset + pad, dtype, tuple(int(s) for s in shape), layout)
        self._file.write(np.ascontiguousarray(data).tobytes())

    def linear(self, name: str, weight: np.ndarray, quant: str | None = None) -> None:  # weight [N, K]
        """A linear layer's weight, float16, or a draft's (``quant``) int8 with its row scales ("q8")
        or 4- or 5-bit with group scales ("q4", "q5")."""
        if quant in QUANT_BITS:
            bits = QUANT_BITS[quant]
            self._write(name, pack_groups(*quantize_groups(weight, bits), bits), weight.shape, quant)
            return
        if quant == "q8":
            weight, scales = quantize_rows_q8(weight)
            self._write(name + SCALE_SUFFIX, scales, scales.shape, "rows")
        elif quant is not None:
            raise PackedModelError(f"unknown quantization {quant!r} (q8, q5 or q4)")
        self._write(name, pack_skinny(weight), weight.shape, "skinny")

    def rows(self, name: str, array: np.ndarray, dtype=np.float32) -> None:
        self._write(name, array.astype(dtype), array.shape, "rows")

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        index = {
            "format": PACKED_FORMAT,
            "rows_per_block": ROWS_PER_BLOCK,
            "lanes": LANES,
            "tensors": {name: {**e.__dict__, "shape": list(e.shape)} for name, e in self._entries.items()},
        }
        (self.directory / INDEX_FILE).write_text(json.dumps(index, indent=1) + "\n")


class PackedWeights:
    """The tensors of a packed model, as torch tensors over one read-only memory map."""

    def __init__(self, directory: Path | str) -> None:
        directory = Path(directory)
        try:
            index = json.loads((directory / INDEX_FILE).read_text())
            self._entries = {
                name: Entry(int(e["offset"]), str(e["dtype"]), tuple(e["shape"]), str(e["layout"]))
                for name, e in index["tensors"].items()
            }
            if index.get("format") != PACKED_FORMAT or index.get("rows_per_block") != ROWS_PER_BLOCK:
                raise PackedModelError(f"{directory / INDEX_FILE}: format {index.get('format')} is not {PACKED_FORMAT}")
            with (directory / WEIGHTS_FILE).open("rb") as f:
                # MAP_POPULATE: the page tables are filled once, here, instead of by ~800k faults
                # during the first passes (the pages themselves are the page cache's, shared)
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                self._map = mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PackedModelError(f"cannot open the packed model in {directory}: {exc}") from exc
        for name, entry in self._entries.items():
            if entry.dtype not in DTYPES or entry.offset + entry.nbytes > len(self._map):
                raise PackedModelError(f"{directory}: tensor {name} lies outside {WEIGHTS_FILE} (truncated?)")

    def parameter_count(self) -> int:
        return sum(int(np.prod(e.shape)) for name, e in self._entries.items() if not name.endswith(SCALE_SUFFIX))

    def pass_bytes(self) -> int:
        """Bytes one forward pass reads: every tensor but the embedding, of which it reads a few rows."""
        return sum(e.nbytes for name, e in self._entries.items() if name != "model.embed_tokens.weight")

    def holds(self, tensor) -> bool:
        """Whether ``tensor``'s memory lies inside the mapped file (a view of it, not a copy)."""
        base = np.frombuffer(self._map, dtype=np.uint8).ctypes.data
        return base <= tensor.data_ptr() < base + len(self._map)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> Iterable[str]:
        return self._entries.keys()

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise PackedModelError(f"the packed model has no tensor {name}") from None

    def tensor(self, name: str):
        """The tensor, flat for the ``skinny`` layout, else in its shape; read-only, never copied."""
        import torch

        entry = self.entry(name)
        dtype = DTYPES[entry.dtype]
        count = entry.nbytes // np.dtype(dtype).itemsize
        array = np.frombuffer(self._map, dtype=dtype, count=count, offset=entry.offset)
        with warnings.catch_warnings():  # the map is read-only by design: nothing writes to weights
            warnings.simplefilter("ignore", UserWarning)
            tensor = torch.from_numpy(array)
        return tensor if entry.layout == "skinny" or entry.layout in QUANT_BITS else tensor.view(*entry.shape)


def write_packed(
    directory: Path, config: dict, tensors: Iterable[tuple[str, np.ndarray]], quant: str | None = None
) -> None:
    """A packed model directory from HF-named Qwen2 tensors (fp32 arrays, any order): linear
    weights rounded to float16 (or, with ``quant``, a draft's int8 or 4-bit; q/k/v and gate/up fused),
    the embedding to float16, norms and biases kept in fp32. ``config`` is the HF-style config
    written as ``config.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    writer = PackedWriter(directory)
    pending: dict[str, np.ndarray] = {}
    for name, array in tensors:
        pending[name] = array
        _flush_ready(writer, pending, quant)
    if pending:
        raise PackedModelError(f"tensors left unwritten (a fused part is missing?): {sorted(pending)[:4]}")
    writer.close()
    (directory / "config.json").write_text(json.dumps(config, indent=1) + "\n")


FUSED = {  # fused name -> its parts, in order
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "self_attn.qkv_proj.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}
LINEARS = ("self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight")


def _flush_ready(writer: PackedWriter, pending: dict[str, np.ndarray], quant: str | None) -> None:
    """Write every pending tensor that is complete: a plain one at once, a fused one with all its parts."""
    for name in list(pending):
        if name not in pending:
            continue
        prefix, _, suffix = name.partition(".layers.")
        layer, _, local = suffix.partition(".")
        fused = next((f for f, parts in FUSED.items() if local in parts), None)
        if fused is not None:
            base = f"{prefix}.layers.{layer}."
            parts = [base + p for p in FUSED[fused]]
            if all(p in pending for p in parts):
                _write_one(writer, base + fused, np.concatenate([pending.pop(p) for p in parts]), quant)
            continue
        _write_one(writer, name, pending.pop(name), quant)


def _write_one(writer: PackedWriter, name: str, array: np.ndarray, quant: str | None) -> None:
    if name == "lm_head.weight" or any(name.endswith(linear) for linear in LINEARS):
        writer.linear(name, array, quant)
    elif name == "model.embed_tokens.weight":
        writer.rows(name, array, np.float16)
    else:
        writer.rows(name, array, np.float32)


def unpack_skinny(flat: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:  # -> [N, K] as stored (float16)
    """The inverse of ``pack_skinny``: a packed matrix back in row-major order."""
    rows, k = shape
    blocks = -(-rows // ROWS_PER_BLOCK)
    return flat.reshape(blocks, k // LANES, ROWS_PER_BLOCK, LANES).transpose(0, 2, 1, 3).reshape(-1, k)[:rows]


def to_hf_model(directory: Path | str):
    """The packed model as a transformers ``Qwen2ForCausalLM`` in fp32 with exactly its float16 values
    (for comparisons with transformers' own decoding, such as HF assisted generation; ~4 bytes per
    parameter of private memory, unlike the shared packed file)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    directory = Path(directory)
    cfg = json.loads((directory / "config.json").read_text())
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    keys += ("rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size", "bos_token_id", "eos_token_id")
    config = Qwen2Config(**{k: cfg[k] for k in keys if k in cfg}, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    packed, state = PackedWeights(directory), {}
    for name in packed.names():
        entry = packed.entry(name)
        if name.endswith(SCALE_SUFFIX):
            continue
        array = packed.tensor(name).numpy()
        if entry.layout in QUANT_BITS:
            array = unpack_groups(array, entry.shape, QUANT_BITS[entry.layout])
        elif entry.layout == "skinny":
            array = unpack_skinny(array, entry.shape).astype(np.float32)
        if entry.dtype == "int8":
            array = array * packed.tensor(name + SCALE_SUFFIX).numpy()[:, None]
        split = _split_fused(name, np.asarray(array, dtype=np.float32), cfg)
        state.update({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in split.items()})
    model.load_state_dict(state, strict=True)
    return model


def _split_fused(name: str, array: np.ndarray, cfg: dict) -> dict[str, np.ndarray]:
    """A fused tensor's parts under their HF names (the inverse of ``write_packed``'s fusing)."""
    base, _, fused = name.rpartition("layers.")
    layer, _, local = fused.partition(".")
    if local not in FUSED:
        return {name: array}
    d = cfg["hidden_size"]
    kv = cfg["num_key_value_heads"] * (d // cfg["num_attention_heads"])
    sizes = (d, kv, kv) if local.startswith("self_attn") else (cfg["intermediate_size"],) * 2
    parts = np.split(array, np.cumsum(sizes)[:-1])
    return {f"{base}layers.{layer}.{part}": value for part, value in zip(FUSED[local], parts, strict=True)}
