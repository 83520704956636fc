"""The life of a program: its handler wrapped (:func:`run`), signals, and the clean-up on the way out.

Errors are one line on stderr with the exit status of
:data:`rdmakit.cli.errors.EXIT_STATUSES`. Files a program published
(``rdmakit.cli.publishing``) are removed when it ends, however it ends short
of SIGKILL: SIGTERM and SIGHUP become a :class:`Terminated` exception
(:func:`signals_as_exceptions`) so that the same clean-up runs as for Ctrl-C,
and the program exits with 128 + the signal's number.
"""

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from rdmakit.cli.errors import EXIT_ERROR, EXIT_OK, CliError, error
from rdmakit.cli.options import apply_json, setup_logging
from rdmakit.cli.publishing import cleanup_published
from rdmakit.doca import DocaError

log = logging.getLogger("rdmakit")

Handler = Callable[[argparse.Namespace], int]


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind as for Ctrl-C, then exit with ``128 + signo``."""

    def __init__(self, signo: int) -> None:
        super().__init__(signal.Signals(signo).name)
        self.signo = signo


def run(parser: argparse.ArgumentParser, handler: Handler) -> Handler:
    """Wrap a handler: apply ``--json``, set up logging, turn errors into one line.

    Files published through ``rdmakit.cli.publishing.publish`` are removed when the handler ends,
    by an error, Ctrl-C or a :class:`Terminated` signal alike.
    """

    def wrapped(args: argparse.Namespace) -> int:
        try:
            if getattr(args, "json", None):
                argv = getattr(args, "argv", sys.argv[1:])
                given = {a.dest for a in parser._actions if any(s in argv for s in a.option_strings)}
                apply_json(parser, args, given)
            setup_logging(getattr(args, "log_level", 40))
            return handler(args)
        except CliError as e:
            error(args.command, str(e))
            return e.status
        except DocaError as e:
            error(args.command, str(e))
            return EXIT_ERROR
        except BrokenPipeError:
            raise
        except OSError as e:
            error(args.command, f"{e.strerror or e}: {e.filename or ''}".rstrip(": "))
            return EXIT_ERROR
        finally:
            cleanup_published()

    return wrapped


@contextlib.contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise :class:`Terminated` (SIGINT raises KeyboardInterrupt).

    Only the first one raises: a second signal during the clean-up it
    started is noted and does not interrupt the clean-up. The previous
    handlers come back on the way out (``main`` may run in-process).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signo: int, _frame: FrameType | None) -> None:
        fired.append(signo)
        if len(fired) == 1:
            raise Terminated(signo)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def main_errors(body: Callable[[], int]) -> int:
    """Run ``body``: signals become exit statuses after clean-up, a closed stdout is not an error."""
    try:
        with signals_as_exceptions():
            try:
                return body()
            finally:
                cleanup_published()
    except KeyboardInterrupt:
        error("", "interrupted")
        return 128 + signal.SIGINT
    except Terminated as t:
        error("", f"stopped by {signal.Signals(t.signo).name}")
        return 128 + t.signo
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK


def _quiet_stdout() -> None:
    """After the reader of stdout went away (``| head``): no error at exit when Python flushes it."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class Unwind(contextlib.ExitStack):
    """An ExitStack whose clean-up errors never hide what made it unwind (an error or Ctrl-C).

    Unwinding after an interrupt, a view of a memory may still be held by a
    frame of the traceback, and closing the memory then fails (IN_USE): that
    is logged, and the interrupt goes on.
    """

    def __exit__(self, *exc_info: Any) -> None:  # never swallows: what made it unwind goes on
        cause = exc_info[1]
        try:
            super().__exit__(*exc_info)
        except Exception as exc:
            if cause is None or exc is cause:
                raise
            log.debug("clean-up after %r failed: %s", cause, exc)
