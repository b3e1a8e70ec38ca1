"""The `specmarket` command line: each subcommand turns its arguments into a role's config
dataclass and calls that role; nothing else happens here.

Errors the project raises on purpose (``SpecmarketError``) exit with status 2 and one line; Ctrl-C
exits with status 130 and one line, whatever it interrupted.
"""

from __future__ import annotations

import argparse
import logging
import sys

from node.cli.anchor import add_anchor_commands
from node.cli.chain import add_chain_commands
from node.cli.escrow import add_escrow_commands
from node.cli.lab import add_lab_commands
from node.cli.local import add_local_commands
from node.cli.market import add_market_commands
from node.cli.options import CommandParser
from node.cli.quality import add_quality_commands
from node.cli.training import add_training_commands
from node.runtime.logs import stderr_handler
from node.runtime.redact import redact
from verifier.errors import SpecmarketError, error_leaves

log = logging.getLogger("specmarket")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="specmarket",
        description="Verifiable, permissionless speculative decoding (see README.md).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    add_local_commands(sub)
    add_market_commands(sub)
    add_chain_commands(sub)
    add_escrow_commands(sub)
    add_lab_commands(sub)
    add_training_commands(sub)
    add_quality_commands(sub)
    add_anchor_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, handlers=[stderr_handler()])
    # py-libp2p's logger stops propagating once imported (`ask` over libp2p, `chain`, the lab): its
    # records reach the last-resort handler, which gets the same timestamped one-line format
    logging.lastResort = stderr_handler(logging.WARNING)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("specmarket: interrupted", file=sys.stderr)
        return 130
    except BaseException as exc:  # a trio nursery's group too: report its SpecmarketError plainly
        leaves = error_leaves(exc)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):  # Ctrl-C inside a trio nursery
            print("specmarket: interrupted", file=sys.stderr)
            return 130
        if not all(isinstance(leaf, SpecmarketError) for leaf in leaves):
            raise
        print(f"specmarket: error: {redact(str(leaves[0]))}", file=sys.stderr)
        return 2
