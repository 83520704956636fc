"""The ``rdmakit`` command (also ``python -m rdmakit``).

Each module in :data:`COMMAND_MODULES` adds its subcommands with
``register(subparsers)``; a subcommand's handler takes the parsed arguments and
returns the exit status. Errors a user can act on are one line on stderr.
"""

import argparse
import importlib
import sys
from collections.abc import Sequence

from rdmakit import __version__

#: Modules that contribute subcommands, in help order.
COMMAND_MODULES = (
    "rdmakit.cli.devices",
    "rdmakit.cli.samples",
    "rdmakit.cli.demo",
    "rdmakit.cli.bench",
    "rdmakit.cli.dma",
    "rdmakit.cli.capture",
    "rdmakit.cli.perftest",
    "rdmakit.cli.rc_pingpong",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rdmakit",
        description="RDMA for Python: DOCA-style tools over rdmakit's soft-RoCE or rdma-core.",
    )
    parser.add_argument("-v", "--version", action="version", version=f"rdmakit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        print("rdmakit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
