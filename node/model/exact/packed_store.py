"""The packed K-quant matrices (exact_pack.c's layout) kept in one file per model and mapped
read-only and shared, so that every process of a machine that loads the model (a target, its
referees, a challenger, plain decoding) holds one copy in the page cache rather than a private one
each: the demo's eight processes that load the target would otherwise hold 8 GB of identical bytes.
The file lives in a folder beside the model's (``store_dir``: ``<model>.packed``), never in the model's
directory itself, whose every file is hashed into the model commitment that receipts sign.

The file is written once, under a lock, to a partial name and renamed into place (a crash leaves no
half-written file under the real name), and named after what decides its bytes: the kernel's sources
and each matrix's format and shape. At every load each matrix's packed bytes are compared with a fresh
packing of the GGUF's own blocks (``ex_pack_check``, tile-block by tile-block, no second copy in
memory) before any product reads them: a stale, truncated or corrupted file is packed again, never
computed with. Where the folder cannot be written, ``open_packed`` returns None and the caller packs
into private memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import logging
import mmap
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

STORE_SUFFIX = ".packed"

PREFIX = "packed-"
SUFFIX = ".bin"
LOCK_NAME = "packed.lock"

Matrix = tuple[int, int, int, int]  # (type code, raw address, n, k)


class PackedStoreError(OSError):
    """The packed file cannot be written or mapped here (a read-only directory, a full disk)."""


def store_dir(model_dir: Path) -> Path:
    """The folder of one model's packed file: beside the model's directory, its name + ``.packed``."""
    model_dir = Path(model_dir).resolve()
    return model_dir.with_name(model_dir.name + STORE_SUFFIX)


def file_name(sources: Sequence[Path], matrices: Sequence[Matrix], sizes: Sequence[int]) -> str:
    """``packed-<digest>.bin``: the digest of the kernel's sources and each matrix's (type, n, k, size)."""
    h = hashlib.sha256()
    for source in sources:
        h.update(source.read_bytes())
    for (code, _, n, k), size in zip(matrices, sizes, strict=True):
        h.update(f"{code},{n},{k},{size};".encode())
    return f"{PREFIX}{h.hexdigest()[:24]}{SUFFIX}"


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    with open(directory / LOCK_NAME, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _offsets(sizes: Sequence[int]) -> list[int]:
    return [int(x) for x in np.concatenate([[0], np.cumsum(sizes)[:-1]])]


def _write(lib: ctypes.CDLL, path: Path, matrices: Sequence[Matrix], sizes: Sequence[int]) -> None:
    """Pack every matrix into ``path`` (via a partial file, renamed once complete and on disk)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        with open(partial, "w+b") as f:
            f.truncate(sum(sizes))
            with mmap.mmap(f.fileno(), sum(sizes)) as out:
                base = ctypes.addressof(ctypes.c_char.from_buffer(out))
                for (code, raw, n, k), size, at in zip(matrices, sizes, _offsets(sizes), strict=True):
                    if size and lib.ex_pack(code, raw, n, k, base + at):
                        raise PackedStoreError(f"matrix [{n}, {k}] of type {code} cannot be packed")
                out.flush()
            os.fsync(f.fileno())
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    for stale in path.parent.glob(f"{PREFIX}*{SUFFIX}"):  # another kernel's layout: never read again
        if stale != path:
            stale.unlink(missing_ok=True)


def _map(path: Path, total: int) -> tuple[mmap.mmap, int] | None:
    """``path`` mapped read-only and shared, its pages read in; None if it is not ``total`` bytes."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size != total:
            return None
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        view = mmap.mmap(f.fileno(), total, flags=flags, prot=mmap.PROT_READ)
    return view, int(np.frombuffer(view, dtype=np.uint8, count=1).ctypes.data)


def _matches(lib: ctypes.CDLL, base: int, matrices: Sequence[Matrix], sizes: Sequence[int]) -> bool:
    return all(
        not size or lib.ex_pack_check(code, raw, n, k, base + at) == 0
        for (code, raw, n, k), size, at in zip(matrices, sizes, _offsets(sizes), strict=True)
    )


def open_packed(
    lib: ctypes.CDLL, directory: Path, sources: Sequence[Path], matrices: Sequence[Matrix], sizes: Sequence[int]
) -> tuple[mmap.mmap, list[int]] | None:
    """The shared packed copy of ``matrices`` (each ``sizes[i]`` bytes packed; 0: not packed) from the
    file in ``directory`` (the model's ``store_dir``), written first where it is missing or does not
    match the GGUF's blocks: (the mapping, to keep alive; each matrix's packed address, 0 where not
    packed). None where the directory cannot hold it."""
    path = directory / file_name(sources, matrices, sizes)
    total = sum(sizes)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _locked(directory):
            for attempt in range(2):
                if not path.is_file() or attempt:
                    log.info("packing the model's K-quant matrices into %s (once per kernel)", path)
                    _write(lib, path, matrices, sizes)
                mapped = _map(path, total)
                if mapped is not None and _matches(lib, mapped[1], matrices, sizes):
                    view, base = mapped
                    return view, [base + at if size else 0 for size, at in zip(sizes, _offsets(sizes), strict=True)]
                log.warning("%s does not match the model's blocks: packing it again", path)
            raise PackedStoreError(f"{path} does not match the model's blocks right after it was written")
    except OSError as exc:  # a read-only directory, a full disk: the caller packs in private memory
        level = logging.WARNING if isinstance(exc, PackedStoreError) else logging.INFO
        log.log(level, "the packed weights cannot be shared through %s (%s): packed in this process", directory, exc)
        return None
