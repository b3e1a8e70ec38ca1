"""Secrets never leave a process as text. A hosted RPC endpoint carries its API key in the URL's
path, query or user part (``https://…/v3/<key>``), and the exceptions of requests and web3.py
quote the whole URL ("429 Client Error: Too Many Requests for url: …"). So the two boundaries
where such text becomes something a person or a client reads go through ``redact``:

- ``describe(exc)``: an exception as text (a standing's reason, and from it /health, the
  dashboard, every 503 body and libp2p error frame; the chain client's errors; the CLI's error line);
- the log formatter (node.runtime.logs): every record, a library's traceback included.

``redact`` keeps a URL's scheme, host and port, which say where, and drops the rest.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# a URL runs to the first space or quote; punctuation that ends a sentence or a bracket is not its own
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,;:!?)\]}]", re.IGNORECASE)
HIDDEN = "/…"  # what stands for a URL's path, query and user part
UNPARSABLE = "<a URL>"


def shown_url(url: str) -> str:
    """``url`` as logs and errors show it: scheme, host and port as written (``HIDDEN`` where there
    was more: a path, a query, a fragment or a user part, where a hosted endpoint keeps its key)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unbalanced IPv6 bracket
        return UNPARSABLE
    where = parts.netloc.rpartition("@")[2]  # host and port, the user part left out
    if not parts.scheme or not where:
        return UNPARSABLE
    secret = parts.path.strip("/") or parts.query or parts.fragment or "@" in parts.netloc
    return f"{parts.scheme}://{where}{HIDDEN if secret else ''}"


def redact(text: str) -> str:
    """``text`` with every URL in it shortened to ``shown_url``."""
    return URL.sub(lambda found: shown_url(found.group(0)), text)


def describe(exc: BaseException) -> str:
    """``ExcType: message``, redacted: how an exception becomes text."""
    message = str(exc)
    return redact(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
