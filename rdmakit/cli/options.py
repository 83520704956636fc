"""DOCA's general program flags, and the argument types every program's flags use.

DOCA's general program flags (DOCA Arg Parser): ``-l/--log-level`` with DOCA's
levels (DISABLE=10, CRITICAL=20, ERROR=30, WARNING=40, INFO=50, DEBUG=60),
``-v/--version``, ``-h/--help`` and ``--json FILE``, whose keys are the long
flag names (:func:`apply_json`). A bad value is a usage error (status 2)
naming it.
"""

import argparse
import json
import logging
import math
import sys
from collections.abc import Callable

from rdmakit.cli.about import version_line
from rdmakit.cli.errors import EXIT_STATUS_HELP, EXIT_USAGE, CliError
from rdmakit.cli.peer_files import MAX_PEER_FILE, read_peer_file

#: DOCA log levels (``doca_log.h``) and their Python equivalents.
DOCA_LOG_LEVELS = {
    10: logging.CRITICAL + 10,  # DISABLE
    20: logging.CRITICAL,
    30: logging.ERROR,
    40: logging.WARNING,
    50: logging.INFO,
    60: logging.DEBUG,
    70: logging.DEBUG - 5,  # TRACE
}


log = logging.getLogger("rdmakit")


def int_in(lo: int, hi: int, what: str = "") -> Callable[[str], int]:
    """An argparse type: an integer (``0x``/``0o``/``0b`` prefixes too) in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            value = int(text, 0)
        except (ValueError, TypeError):
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside [{lo}, {hi}]{what}")
        return value

    parse.__name__ = "integer"
    return parse


def float_in(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [lo, hi] (or (lo, hi] with ``lo_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except (ValueError, TypeError):
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
            bracket = "(" if lo_open else "["
            raise argparse.ArgumentTypeError(f"{text!r} is outside {bracket}{lo:g}, {hi:g}]")
        return value

    parse.__name__ = "number"
    return parse


U32 = int_in(0, (1 << 32) - 1)
U64 = int_in(0, (1 << 64) - 1, " (a 64-bit word: for -1 give 0xffffffffffffffff)")
#: Seconds to wait for a peer: positive, at most a year.
TIMEOUT = float_in(0.0, 365 * 86400.0, lo_open=True)


def add_general_flags(p: argparse.ArgumentParser, *, json_file: bool = True) -> None:
    p.add_argument(
        "-l", "--log-level", type=int, default=40, choices=sorted(DOCA_LOG_LEVELS), metavar="LEVEL",
        help="DOCA log level: 10 disable, 20 critical, 30 error, 40 warning (default), 50 info, 60 debug",
    )  # fmt: skip
    p.add_argument("-v", "--version", action="version", version=version_line())
    if json_file:
        p.add_argument("--json", metavar="FILE", help="read these options from a JSON file (long flag names)")
    if p.epilog is None:
        p.epilog = EXIT_STATUS_HELP


def add_foreign_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-foreign-descriptors",
        action="store_true",
        help="read peer files owned by another user (refused by default, as ssh's StrictModes does)",
    )


def apply_json(parser: argparse.ArgumentParser, args: argparse.Namespace, argv_flags: set[str]) -> None:
    """Fill options from ``--json FILE`` where the command line did not set them."""
    path = args.json
    raw = read_peer_file(path, "the options file", MAX_PEER_FILE, allow_foreign=foreign_allowed(args))
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as e:
        raise CliError(f"{path}: not UTF-8 text") from e
    except json.JSONDecodeError as e:
        raise CliError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from e
    except RecursionError as e:
        raise CliError(f"{path}: nested too deeply") from e
    if not isinstance(data, dict):
        raise CliError(f"{path}: expected a JSON object of flag names")
    known = {a.dest: a for a in parser._actions}
    by_flag = {s.lstrip("-"): a for a in parser._actions for s in a.option_strings}
    for key, value in data.items():
        action = by_flag.get(key) or known.get(key.replace("-", "_"))
        if action is None or action.dest in ("help", "version", "json"):
            raise CliError(f"{path}: unknown key {key!r}", EXIT_USAGE)
        if action.dest in argv_flags:
            continue
        if action.nargs == 0:  # a switch
            if not isinstance(value, bool):
                raise CliError(f"{path}: {key!r} is a switch: true or false", EXIT_USAGE)
        elif value is not None:
            if isinstance(value, bool | dict | list):
                raise CliError(f"{path}: bad value for {key!r}: {value!r}", EXIT_USAGE)
            if action.type is not None:
                try:
                    value = action.type(str(value))  # type: ignore[operator]
                except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
                    raise CliError(f"{path}: bad value for {key!r}: {str(value)[:64]!r}", EXIT_USAGE) from e
            if action.choices is not None and value not in action.choices:
                raise CliError(f"{path}: {key!r} must be one of {list(action.choices)}", EXIT_USAGE)
        setattr(args, action.dest, value)


def foreign_allowed(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "allow_foreign_descriptors", False))


def setup_logging(level: int) -> None:
    logging.basicConfig(
        level=DOCA_LOG_LEVELS.get(level, logging.WARNING),
        format="[%(asctime)s][%(name)s][%(levelname)s] %(message)s",
        stream=sys.stderr,
    )
    log.setLevel(DOCA_LOG_LEVELS.get(level, logging.WARNING))
