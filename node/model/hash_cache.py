"""The model hash of a local model directory, and a cache of it keyed by the files' metadata.

The hash (``compute_model_hash``) is the commitment an operator bonds and signs receipts for: sha256
over the sorted ``name sha256(file)`` lines of every file in the directory (weights, config,
tokenizer), except a conversion's record (``CONVERTED_MARKER``), which describes the model and holds
this hash. Reading gigabytes of weights takes seconds, so a client (`specmarket ask`) reads it from
``cached_model_hash``'s cache instead.

A cache entry is keyed by the directory's resolved path and lists every file with its size, mtime,
ctime, inode and device; it is used only while the directory holds exactly those files, each
unchanged, else the hash is computed again and the entry replaced. A cache file that is not JSON, or
an entry of the wrong shape, is ignored (recomputed), never trusted. An entry is stored only when
no file changed while it was hashed. The cache lives in the user's data dir
(``default_data_dir("cache")``), never in the repository.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.model.pairs import CONVERTED_MARKER
from node.runtime.dirs import default_data_dir
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

CACHE_FILE = "model-hashes.json"
CACHE_VERSION = 1
MAX_CACHE_BYTES = 1 << 20  # a larger cache file is not read (and is replaced)
MAX_CACHE_ENTRIES = 64  # model directories remembered; the oldest entries go first


class ModelHashError(SpecmarketError):
    """A model directory whose hash cannot be computed (missing, or no config.json)."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """A file's sha256, read in chunks: a 3 GB weights file never sits in memory whole (six processes
    hashing one at start-up at once took 18 GB)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def model_files(path: Path) -> list[Path]:
    """The files the model hash covers, sorted; ModelHashError unless ``path`` is a model directory."""
    if not (path / "config.json").is_file():
        raise ModelHashError(f"model directory {path} has no config.json")
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name != CONVERTED_MARKER)


def compute_model_hash(path: Path | str) -> bytes:
    """The 32-byte model commitment of the directory ``path``, every file read (module docstring)."""
    path = Path(path)
    lines = [f"{file.relative_to(path).as_posix()} {sha256_file(file)}\n" for file in model_files(path)]
    return hashlib.sha256("".join(lines).encode()).digest()


@dataclass(frozen=True)
class Fingerprint:
    """What a cache entry is keyed by: each file's relative path and metadata, in hash order."""

    files: tuple[tuple[str, int, int, int, int, int], ...]  # (name, size, mtime_ns, ctime_ns, inode, device)

    @classmethod
    def of(cls, path: Path) -> Fingerprint:
        rows = []
        for file in model_files(path):
            st = file.stat()
            rows.append(
                (file.relative_to(path).as_posix(), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
            )
        return cls(tuple(rows))

    def to_json(self) -> list[list[Any]]:
        return [list(row) for row in self.files]


def default_cache_path() -> Path:
    return default_data_dir("cache") / CACHE_FILE


def cached_model_hash(path: Path | str, *, cache: Path | None = None, verify: bool = False) -> bytes:
    """``compute_model_hash(path)``, from the cache while every file is unchanged; ``verify``: compute
    it again whatever the cache says (and store it). The cache file is ``cache`` (default
    ``default_cache_path()``)."""
    path, cache = Path(path).resolve(), cache or default_cache_path()
    before = Fingerprint.of(path)
    entries = _read_entries(cache)
    if not verify and (hit := _lookup(entries, path, before)) is not None:
        return hit
    digest = compute_model_hash(path)
    if Fingerprint.of(path) == before:  # nothing changed while it was read: safe to remember
        _store(cache, entries, path, before, digest)
    else:
        log.info("the files of %s changed while they were hashed: not cached", path)
    return digest


def _lookup(entries: dict[str, Any], path: Path, fingerprint: Fingerprint) -> bytes | None:
    entry = entries.get(str(path))
    if not isinstance(entry, dict) or entry.get("files") != fingerprint.to_json():
        return None
    value = entry.get("hash")
    if not isinstance(value, str) or len(value) != 64:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def _read_entries(cache: Path) -> dict[str, Any]:
    """The cache's entries by directory; {} for a missing, oversized, unreadable or malformed cache."""
    try:
        if cache.stat().st_size > MAX_CACHE_BYTES:
            return {}
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def _store(cache: Path, entries: dict[str, Any], path: Path, fingerprint: Fingerprint, digest: bytes) -> None:
    """Write the cache with this entry (atomically: a reader sees the old file or the new one)."""
    kept = {k: v for k, v in entries.items() if k != str(path)}
    kept = dict(list(kept.items())[-(MAX_CACHE_ENTRIES - 1) :])
    kept[str(path)] = {"files": fingerprint.to_json(), "hash": digest.hex()}
    text = json.dumps({"version": CACHE_VERSION, "entries": kept})
    tmp: Path | None = None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=cache.parent, prefix=".model-hashes-")
        tmp = Path(name)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, cache)
    except OSError as exc:  # a read-only home: the hash is right, only not remembered
        log.warning("cannot write the model hash cache %s: %s", cache, exc)
        if tmp is not None:
            tmp.unlink(missing_ok=True)
