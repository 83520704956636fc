"""What every rdmakit program shares: DOCA's general flags, errors, descriptor files.

DOCA's general program flags (DOCA Arg Parser): ``-l/--log-level`` with DOCA's
levels (CRITICAL=20, ERROR=30, WARNING=40, INFO=50, DEBUG=60), ``-v/--version``,
``-h/--help`` and ``--json FILE``, whose keys are the long flag names.
"""

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rdmakit import __version__
from rdmakit.doca import DocaError

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

Handler = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """An error the user can act on: printed as one line, exit status ``status``."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def add_general_flags(p: argparse.ArgumentParser, *, json_file: bool = True) -> None:
    p.add_argument(
        "-l", "--log-level", type=int, default=40, choices=sorted(DOCA_LOG_LEVELS), metavar="LEVEL",
        help="DOCA log level: 10 disable, 20 critical, 30 error, 40 warning (default), 50 info, 60 debug",
    )  # fmt: skip
    p.add_argument("-v", "--version", action="version", version=f"rdmakit {__version__}")
    if json_file:
        p.add_argument("--json", metavar="FILE", help="read these options from a JSON file (long flag names)")


def _apply_json(parser: argparse.ArgumentParser, args: argparse.Namespace, argv_flags: set[str]) -> None:
    """Fill options from ``--json FILE`` where the command line did not set them."""
    path = args.json
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise CliError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(data, dict):
        raise CliError(f"{path}: expected a JSON object of flag names")
    known = {a.dest: a for a in parser._actions}
    by_flag = {s.lstrip("-"): a for a in parser._actions for s in a.option_strings}
    for key, value in data.items():
        action = by_flag.get(key) or known.get(key.replace("-", "_"))
        if action is None or action.dest in ("help", "version", "json"):
            raise CliError(f"{path}: unknown key {key!r}")
        if action.dest in argv_flags:
            continue
        if action.type is not None and value is not None and not isinstance(value, bool):
            try:
                value = action.type(value)  # type: ignore[operator]
            except (TypeError, ValueError) as e:
                raise CliError(f"{path}: bad value for {key!r}: {value!r}") from e
        setattr(args, action.dest, value)


def run(parser: argparse.ArgumentParser, handler: Handler) -> Handler:
    """Wrap a handler: apply ``--json``, set up logging, turn errors into one line."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            if getattr(args, "json", None):
                given = {a.dest for a in parser._actions if any(s in sys.argv for s in a.option_strings)}
                _apply_json(parser, args, given)
            setup_logging(getattr(args, "log_level", 40))
            return handler(args)
        except CliError as e:
            print(f"rdmakit {args.command}: {e}", file=sys.stderr)
            return e.status
        except DocaError as e:
            print(f"rdmakit {args.command}: {e}", file=sys.stderr)
            return 1
        except OSError as e:
            print(
                f"rdmakit {args.command}: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr
            )
            return 1

    return wrapped


def setup_logging(level: int) -> None:
    logging.basicConfig(
        level=DOCA_LOG_LEVELS.get(level, logging.WARNING),
        format="[%(asctime)s][%(name)s][%(levelname)s] %(message)s",
        stream=sys.stderr,
    )
    log.setLevel(DOCA_LOG_LEVELS.get(level, logging.WARNING))


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or nothing (rename)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def wait_for_file(path: str | os.PathLike[str], timeout: float, what: str) -> bytes:
    """The contents of ``path`` once it exists, or CliError after ``timeout`` seconds."""
    p = Path(path)
    end = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            return p.read_bytes()
        except FileNotFoundError:
            if time.monotonic() >= end:
                raise CliError(f"timed out after {timeout:g} s waiting for {what} ({p})", status=3) from None
        except OSError as e:
            raise CliError(f"cannot read {what} {p}: {e.strerror}") from e
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def parse_json_file(data: bytes, path: str | os.PathLike[str]) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CliError(f"{path}: not a descriptor (not JSON: {e})") from e
