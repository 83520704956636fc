"""How an rdmakit program fails: its exit statuses and its one-line errors.

- Exit statuses (:data:`EXIT_STATUSES`): 0 ok, 1 error, 2 usage, 3 timeout,
  and 128 + the signal's number when a signal stopped it (129 SIGHUP,
  130 SIGINT, 143 SIGTERM).
- An error the user can act on is a :class:`CliError`, printed as one line on
  stderr (:func:`error`); a DOCA ``TIME_OUT`` is exit status 3
  (:func:`doca_timeouts`).
"""

import contextlib
import signal
import sys
from collections.abc import Iterator

from rdmakit.doca import DocaError, DocaErrorCode

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_TIMEOUT = 0, 1, 2, 3
#: Every status an rdmakit program exits with.
EXIT_STATUSES = {
    EXIT_OK: "success",
    EXIT_ERROR: "an error (one line on stderr)",
    EXIT_USAGE: "a usage error (bad or missing arguments)",
    EXIT_TIMEOUT: "a timeout (the peer or its file did not come in time)",
    128 + signal.SIGHUP: "stopped by SIGHUP (the terminal closed)",
    128 + signal.SIGINT: "stopped by SIGINT (Ctrl-C)",
    128 + signal.SIGTERM: "stopped by SIGTERM",
}
EXIT_STATUS_HELP = "exit status: " + ", ".join(
    f"{k} {v.split(' (')[0].removeprefix('a ').removeprefix('an ')}" for k, v in EXIT_STATUSES.items()
)


class CliError(Exception):
    """An error the user can act on: printed as one line, exit status ``status``."""

    def __init__(self, message: str, status: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.status = status


def error(command: str, message: str) -> None:
    """One line on stderr; a message never spans lines."""
    line = " ".join(message.split("\n"))
    with contextlib.suppress(OSError):
        print(f"rdmakit {command}: {line}" if command else f"rdmakit: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def doca_timeouts() -> Iterator[None]:
    """A DOCA ``TIME_OUT`` is exit status 3, as a peer's file that never came; other errors pass."""
    try:
        yield
    except DocaError as exc:
        if exc.code is DocaErrorCode.TIME_OUT:
            raise CliError(str(exc), status=EXIT_TIMEOUT) from exc
        raise
