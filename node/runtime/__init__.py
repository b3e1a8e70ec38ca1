"""Process runtime shared by every long-running role and by the lab: data directories, logging
set-up, the start-up heap freeze, signal handling, and holding a port until its server binds.

- ``dirs``       each role's default data directory
- ``logs``       logging set-up: one timestamped line per record, the libraries' loggers adopted
- ``lifecycle``  the start-up heap freeze, serving until signalled, SIGTERM unwinding
- ``ports``      holding a port until its server binds

It belongs to no role: the CLI calls it to run a node, the lab calls it to run its children and
its own timed work, and product code may call it; it imports nothing of the project but the root
exception (and the lazy exports below: names are imported on first use).
"""

from verifier.exports import lazy_exports

EXPORTS = {
    "node.runtime.dirs": ("default_data_dir",),
    "node.runtime.lifecycle": ("GRACE_S", "freeze_startup_heap", "serve_until_signalled", "sigterm_unwinds"),
    "node.runtime.logs": ("LOG_FORMAT", "OneLineFormatter", "node_logging", "stderr_handler"),
    "node.runtime.ports": ("PortInUse", "holding_port"),
}
__getattr__, __all__ = lazy_exports(__name__, EXPORTS)
