"""The target's read-only web pages: the dashboard (``GET /``, which polls ``GET /api/dashboard``), the
speculative decoding simulator (``GET /simulator``) and their files (``GET /static/{name}``), all
read from the package ``node.target.http.static``. Only the files of ``STATIC_FILES`` are served; any
other name is a 404. Every answer says ``Cache-Control: no-cache``; the pages carry a
Content-Security-Policy that allows their own scripts and styles only (the node's strings are
attacker-controlled, and the pages never turn them into HTML anyway).

``write_simulator`` writes a self-contained simulator.html (its script and style inlined, a
measurement embedded) that works opened from disk, for the committed report.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.exceptions import HTTPException

log = logging.getLogger(__name__)

STATIC_PACKAGE = "node.target.http.static"
STATIC_FILES = frozenset({"dashboard.html", "dashboard.js", "simulator.html", "simulator.js", "style.css"})
PAGES = {"/": "dashboard.html", "/simulator": "simulator.html"}
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
# The pages refer to their files by relative name (so they also work opened from the package's
# folder); served at / and /simulator they resolve them under /static/.
BASE_TAG = '<base href="/static/">'
# both pages fetch from their own site alone: the dashboard its API, the simulator ?measured=<path>
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "base-uri 'self'; form-action 'none'; frame-ancestors 'none'; connect-src 'self'"
)
HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}

# write_simulator: what it replaces in simulator.html
STYLE_LINK = '<link rel="stylesheet" href="style.css">'
SCRIPT_TAG = '<script src="simulator.js"></script>'
MEASURED_BLOCK = '<script type="application/json" id="measured">null</script>'
SWEEP_KEYS = ("gamma", "alpha", "omega", "speedup")


@cache
def static_bytes(name: str) -> bytes:
    """The file ``name`` of node/target/http/static (one of STATIC_FILES)."""
    if name not in STATIC_FILES:
        raise KeyError(name)
    return resources.files(STATIC_PACKAGE).joinpath(name).read_bytes()


def content_type(name: str) -> str:
    return CONTENT_TYPES[Path(name).suffix]


@cache
def page_bytes(name: str) -> bytes:
    """A page as served at its route: its HTML with BASE_TAG at the top of its head."""
    html = static_bytes(name).decode("utf-8")
    if "<head>" not in html:
        raise ValueError(f"{name} has no <head>")
    return html.replace("<head>", "<head>\n" + BASE_TAG, 1).encode("utf-8")


def _answer(body: bytes, name: str) -> Response:
    headers = dict(HEADERS)
    if name in PAGES.values():
        headers["Content-Security-Policy"] = CSP
    return Response(body, media_type=content_type(name), headers=headers)


def add_pages(app: FastAPI) -> None:
    """GET / (the dashboard), GET /simulator and GET /static/{name}; none of them writes anything."""

    def page(name: str) -> Callable[[], Awaitable[Response]]:
        async def serve_page() -> Response:
            return _answer(page_bytes(name), name)

        return serve_page

    async def serve_static(name: str) -> Response:
        if name not in STATIC_FILES:  # also every name with a separator, a dot-dot or a query
            raise HTTPException(404)
        return _answer(static_bytes(name), name)

    for path, name in PAGES.items():
        app.add_api_route(path, page(name), methods=["GET"], include_in_schema=False, response_class=Response)
    app.add_api_route("/static/{name}", serve_static, methods=["GET"], include_in_schema=False, response_class=Response)


# ---- the self-contained simulator for the report -----------------------------------------------


def _find_bound(data: Any, depth: int = 0) -> dict | None:
    """A bench result's ``bound`` {alpha, c, v} (at the top or up to two levels down), as the page
    looks for it."""
    if not isinstance(data, dict | list) or depth > 2:
        return None
    if isinstance(data, dict):
        bound = data.get("bound")
        if isinstance(bound, dict) and all(isinstance(bound.get(k), int | float) for k in ("alpha", "c", "v")):
            return bound
    for value in data.values() if isinstance(data, dict) else data:
        if (found := _find_bound(value, depth + 1)) is not None:
            return found
    return None


def measurement_summary(measured: dict) -> dict:
    """What the simulator reads of a measurement: the demo's ``derived.fit`` and ``local_sweep``
    points, or a bench result's ``bound``. Anything else is a ValueError."""
    fit = (measured.get("derived") or {}).get("fit")
    if isinstance(fit, dict):
        sweep = [{k: p[k] for k in SWEEP_KEYS if k in p} for p in measured.get("local_sweep") or []]
        return {"derived": {"fit": fit}, "local_sweep": sweep}
    if (bound := _find_bound(measured)) is not None:
        return {"bound": bound}
    raise ValueError("the measurement has neither derived.fit (a demo report) nor a bound (a bench result)")


def embed_json(data: Any) -> str:
    """JSON that is safe inside a <script> element: no '<', '>' or '&' outside escapes."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _inline(html: str, placeholder: str, replacement: str) -> str:
    if placeholder not in html:
        raise ValueError(f"simulator.html lacks {placeholder!r}")
    return html.replace(placeholder, replacement, 1)


def simulator_html(measured: dict | None = None) -> str:
    """simulator.html with its style and script inlined and ``measured`` (summarised) embedded."""
    html = static_bytes("simulator.html").decode("utf-8")
    css = static_bytes("style.css").decode("utf-8")
    js = static_bytes("simulator.js").decode("utf-8")
    for text, name in ((css, "style.css"), (js, "simulator.js")):
        if "</s" in text.lower() or "<!--" in text:
            raise ValueError(f"{name} cannot be inlined: it contains '</s' or '<!--'")
    block = "null" if measured is None else embed_json(measurement_summary(measured))
    html = _inline(html, MEASURED_BLOCK, f'<script type="application/json" id="measured">{block}</script>')
    html = _inline(html, STYLE_LINK, f"<style>\n{css}</style>")
    return _inline(html, SCRIPT_TAG, f"<script>\n{js}</script>")


def write_simulator(out_dir: Path, measured: dict | None = None) -> Path:
    """out_dir/simulator.html: the simulator as one file (``simulator_html``); its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "simulator.html"
    path.write_text(simulator_html(measured), encoding="utf-8")
    log.info("wrote %s", path)
    return path
