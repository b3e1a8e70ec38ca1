"""Private-key files: 32 bytes in hex (an optional 0x), written once with mode 0600.

A key is never logged or printed; errors name the file, never its content.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from node.chain import ChainError

log = logging.getLogger(__name__)

KEY_BYTES = 32
KEY_FILE_MODE = 0o600
OPERATOR_KEY_FILE = "operator.key"  # in DATA_DIR/keys/ of a bonded target


def read_key(path: Path) -> bytes:
    """The private key in ``path``, which must exist."""
    try:
        text = Path(path).read_text().strip()
    except OSError as exc:
        raise ChainError(f"cannot read a private key from {path}: {exc.strerror or exc}") from None
    try:
        key = bytes.fromhex(text.removeprefix("0x"))
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise ChainError(f"{path} must hold a {KEY_BYTES}-byte private key in hex")
    return key


def write_key(path: Path, key: bytes) -> Path:
    """Write ``key`` to a new file ``path`` (mode 0600; an existing file is never overwritten)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_FILE_MODE)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return path


def new_key_file(path: Path) -> str:
    """A fresh random key in a new file ``path`` (mode 0600; an existing file is refused); its
    address. The key itself is never printed or logged."""
    from eth_account import Account

    account = Account.create()
    try:
        write_key(path, bytes(account.key))
    except FileExistsError:
        raise ChainError(f"{path} exists: a key file is never overwritten (choose another --out)") from None
    except OSError as exc:
        raise ChainError(f"cannot write a key to {path}: {exc.strerror or exc}") from None
    return account.address


def key_address(path: Path) -> str:
    """The address of the key in ``path``."""
    from eth_account import Account

    return Account.from_key(read_key(path)).address


def load_or_create_key(path: Path) -> bytes:
    """The key in ``path``; a fresh random key is created there (0600) when the file is missing."""
    from eth_account import Account

    if not Path(path).exists():
        write_key(path, bytes(Account.create().key))
        log.info("created a new private key in %s", path)  # the path, never the key
    return read_key(path)
