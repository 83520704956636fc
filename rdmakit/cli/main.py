"""The ``rdmakit`` command (also ``python -m rdmakit``).

Each module in :data:`COMMAND_MODULES` adds its subcommands with
``register(subparsers)``; a subcommand's handler takes the parsed arguments and
returns the exit status (:data:`rdmakit.cli.errors.EXIT_STATUSES`). Errors a
user can act on are one line on stderr; SIGINT, SIGTERM and SIGHUP remove
what the program published and exit with 128 + the signal's number.
"""

import argparse
import importlib
import sys
from collections.abc import Sequence

from rdmakit.cli.about import notice_pure_python, version_line
from rdmakit.cli.errors import EXIT_STATUS_HELP, EXIT_USAGE
from rdmakit.cli.lifecycle import main_errors

#: Modules that contribute subcommands, in help order.
COMMAND_MODULES = (
    "rdmakit.cli.devices",
    "rdmakit.cli.samples_tasks",  # the samples, with --api task
    "rdmakit.cli.demo",
    "rdmakit.cli.bench",
    "rdmakit.cli.dma_copy",
    "rdmakit.cli.dma_samples",
    "rdmakit.cli.sync_event_samples",
    "rdmakit.cli.capture",
    "rdmakit.cli.perftest",
    "rdmakit.cli.rc_pingpong",
    "rdmakit.cli.rping",
    "rdmakit.cli.conformance",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rdmakit",
        description="RDMA for Python: DOCA-style tools over rdmakit's soft-RoCE or rdma-core.",
        epilog=EXIT_STATUS_HELP,
    )
    parser.add_argument("-v", "--version", action="version", version=version_line())
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


def _parser_of(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The subcommand's own parser (the top level's when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            sub: argparse.ArgumentParser = action.choices[command]
            return sub
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        parser = build_parser()
        try:
            args, extra = parser.parse_known_args(argv)
            if extra:  # the subcommand's usage, not the top level's, names what it takes
                _parser_of(parser, getattr(args, "command", None)).error(
                    f"unrecognized arguments: {' '.join(extra)}"
                )
        except SystemExit as e:  # --help, --version (0) or a usage error (2, already printed)
            return e.code if isinstance(e.code, int) else EXIT_USAGE
        handler = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return EXIT_USAGE
        args.argv = argv
        notice_pure_python()
        return int(handler(args))

    return main_errors(body)


if __name__ == "__main__":
    sys.exit(main())
