"""The target node's HTTP side: the OpenAI-compatible API (``api``: FastAPI on hypercorn, on the
node's trio loop), its wire format (``schema``), one job as a response (``jobs``), ``/metrics``
(``metrics``), the dashboard's data (``dashboard``) and the read-only pages (``pages``, serving the
files of ``static``).

Names are imported on first use, so importing this package loads neither FastAPI nor hypercorn.
"""

from verifier.exports import lazy_exports

EXPORTS = {
    "node.target.http.api": ("build_app", "http_config", "parse_body", "read_body", "serve_http"),
    "node.target.http.dashboard": ("ResponseLog", "dashboard_view", "node_condition"),
    "node.target.http.jobs": ("JobResponse", "error_response", "json_response"),
    "node.target.http.metrics": ("ApiMetrics",),
    "node.target.http.pages": ("add_pages", "simulator_html", "write_simulator"),
    "node.target.http.schema": ("ChatBody", "CompletionBody", "HttpError", "http_error_for"),
}
__getattr__, __all__ = lazy_exports(__name__, EXPORTS)
