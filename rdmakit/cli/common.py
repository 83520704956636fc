"""What every rdmakit program shares: DOCA's general flags, errors, exit statuses, files, signals.

DOCA's general program flags (DOCA Arg Parser): ``-l/--log-level`` with DOCA's
levels (DISABLE=10, CRITICAL=20, ERROR=30, WARNING=40, INFO=50, DEBUG=60),
``-v/--version``, ``-h/--help`` and ``--json FILE``, whose keys are the long
flag names.

The life of a program, in one place:

- Exit statuses (:data:`EXIT_STATUSES`): 0 ok, 1 error, 2 usage, 3 timeout,
  and 128 + the signal's number when a signal stopped it (129 SIGHUP,
  130 SIGINT, 143 SIGTERM). Errors are one line on stderr.
- Files a program publishes for a peer (:func:`publish`) are written
  atomically and listed in one registry; they are removed when the program
  ends, however it ends short of SIGKILL: SIGTERM and SIGHUP become a
  :class:`Terminated` exception (:func:`signals_as_exceptions`) so that the
  same clean-up runs as for Ctrl-C.
- Files a program reads from a peer (:func:`read_peer_file`) must be regular
  files, at most a size limit (never read past it), owned by the caller or
  root unless the user allows another owner, as OpenSSH's ``StrictModes``
  refuses a file another user could have planted.
- Beside a published descriptor, a *status file* (:class:`StatusFile`) says
  which run wrote it (a random run id, the boot id, the writer's pid and
  start time) and how that run is doing (``running`` or ``failed`` with the
  reason). The writer holds an ``flock`` on it for as long as it lives, so a
  reader knows whether the run is still there without trusting the pid: a
  descriptor whose run is gone (or from another boot) is stale, and a peer
  that failed or died is noticed at once (:class:`PeerWatch`). A pid read
  from a file is only ever printed.
"""

import argparse
import contextlib
import fcntl
import json
import logging
import math
import os
import secrets
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from rdmakit import __version__
from rdmakit.doca import DocaError
from rdmakit.transport import fastpath

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

#: Largest file read by default from a path a user named (a peer's file, ``--json``).
MAX_PEER_FILE = 1 << 16
#: Largest status file.
MAX_STATUS = 4096
STATUS_FORMAT = "rdmakit.status/1"
STATUS_SUFFIX = ".status"

log = logging.getLogger("rdmakit")

Handler = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """An error the user can act on: printed as one line, exit status ``status``."""

    def __init__(self, message: str, status: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.status = status


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind as for Ctrl-C, then exit with ``128 + signo``."""

    def __init__(self, signo: int) -> None:
        super().__init__(signal.Signals(signo).name)
        self.signo = signo


def data_plane() -> str:
    """Which UDP data plane this process runs: native (and its CRC-32) or pure Python (and why)."""
    return fastpath.describe()


def notice_pure_python() -> None:
    """Say once per user (a marker in the cache directory) that the native data plane did not build."""
    if fastpath.native is not None or os.environ.get("RDMAKIT_PURE_PYTHON", "") not in ("", "0"):
        return
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rdmakit"
    marker = cache / "pure-python-noticed"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError:
        return  # said before, or nowhere to note it: stay quiet
    os.close(fd)
    print(
        "rdmakit: the native UDP data plane is not built; the pure-Python path is in use "
        "(slower; reinstall with a C compiler to build it; 'rdmakit --version' tells which runs)",
        file=sys.stderr,
    )


def version_line() -> str:
    return f"rdmakit {__version__} (UDP data plane: {data_plane()})"


# -- argument types: a bad value is a usage error (status 2) naming it -------------------------


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


def _apply_json(parser: argparse.ArgumentParser, args: argparse.Namespace, argv_flags: set[str]) -> None:
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


def run(parser: argparse.ArgumentParser, handler: Handler) -> Handler:
    """Wrap a handler: apply ``--json``, set up logging, turn errors into one line.

    Files published through :func:`publish` are removed when the handler ends,
    by an error, Ctrl-C or a :class:`Terminated` signal alike.
    """

    def wrapped(args: argparse.Namespace) -> int:
        try:
            if getattr(args, "json", None):
                argv = getattr(args, "argv", sys.argv[1:])
                given = {a.dest for a in parser._actions if any(s in argv for s in a.option_strings)}
                _apply_json(parser, args, given)
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


def error(command: str, message: str) -> None:
    """One line on stderr; a message never spans lines."""
    line = " ".join(message.split("\n"))
    with contextlib.suppress(OSError):
        print(f"rdmakit {command}: {line}" if command else f"rdmakit: {line}", file=sys.stderr, flush=True)


def setup_logging(level: int) -> None:
    logging.basicConfig(
        level=DOCA_LOG_LEVELS.get(level, logging.WARNING),
        format="[%(asctime)s][%(name)s][%(levelname)s] %(message)s",
        stream=sys.stderr,
    )
    log.setLevel(DOCA_LOG_LEVELS.get(level, logging.WARNING))


# -- signals ----------------------------------------------------------------------------------


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


# -- files this program publishes -------------------------------------------------------------

#: Files this process published for a peer, removed by :func:`cleanup_published` (once each).
_PUBLISHED: list[Path] = []
#: Status files this process holds, closed by :func:`cleanup_published`.
_STATUS: list["StatusFile"] = []


def _writable_dir(p: Path, what: str) -> None:
    """``p`` can be published: its directory exists, and it is not something other than a file."""
    parent = p.parent
    if not parent.is_dir():
        raise CliError(f"cannot write {what} {p}: the directory {parent} does not exist")
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(p.lstat().st_mode):
            raise CliError(f"cannot write {what} {p}: something other than a file is there")


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or nothing (rename).

    Errors name ``path``, never the temporary file beside it.
    """
    p = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(p)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OSError(e.errno, e.strerror, str(p)) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def publish(path: str | os.PathLike[str], data: bytes, what: str = "file") -> Path:
    """Write ``data`` atomically to ``path`` and list it for removal when the program ends."""
    p = Path(path)
    _writable_dir(p, what)
    try:
        write_atomic(p, data)
    except OSError as e:
        raise CliError(f"cannot write {what} {p}: {e.strerror}") from e
    if p not in _PUBLISHED:
        _PUBLISHED.append(p)
    return p


def cleanup_published() -> None:
    """Remove every published file and close every status file; errors are logged, never raised."""
    while _PUBLISHED:
        p = _PUBLISHED.pop()
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("could not remove %s: %s", p, e.strerror)
    while _STATUS:
        s = _STATUS.pop()
        try:
            s.close()
        except OSError as e:
            log.warning("could not remove %s: %s", s.path, e.strerror)


# -- files this program reads -----------------------------------------------------------------


def _owner_name(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


@dataclass(frozen=True, slots=True)
class PeerFile:
    """What was read from a peer's file, and which file (device, inode) it was."""

    data: bytes
    dev: int
    ino: int
    mtime: float


def _open_checked(path: str | os.PathLike[str], what: str, allow_foreign: bool) -> tuple[int, os.stat_result]:
    """A descriptor of ``path`` opened without blocking, checked to be a regular file we may trust.

    FileNotFoundError propagates (the caller may wait); anything else is a CliError.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CliError(f"cannot read {what} {path}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a directory" if stat.S_ISDIR(st.st_mode)
                else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file"
            )  # fmt: skip
            raise CliError(f"{what} {path} is {kind}, not a regular file")
        if st.st_uid not in (os.getuid(), 0) and not allow_foreign:
            raise CliError(
                f"{what} {path} belongs to {_owner_name(st.st_uid)}, not to you or root: refused "
                "(another user may have planted it; --allow-foreign-descriptors to trust it)"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_limited(fd: int, limit: int) -> bytes:
    out = bytearray()
    while len(out) <= limit:
        chunk = os.read(fd, limit + 1 - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def read_peer_file(
    path: str | os.PathLike[str], what: str, limit: int = MAX_PEER_FILE, *, allow_foreign: bool = False
) -> bytes:
    """The contents of a file a user named: checked for type, owner and size (never read past it)."""
    try:
        return _read_peer(path, what, limit, allow_foreign).data
    except FileNotFoundError as e:
        raise CliError(f"cannot read {what} {path}: it does not exist") from e


def _read_peer(path: str | os.PathLike[str], what: str, limit: int, allow_foreign: bool) -> PeerFile:
    fd, st = _open_checked(path, what, allow_foreign)
    try:
        data = _read_limited(fd, limit)
    except OSError as e:
        raise CliError(f"cannot read {what} {path}: {e.strerror}") from e
    finally:
        os.close(fd)
    if len(data) > limit:
        raise CliError(f"{what} {path} is larger than {limit} bytes: not one")
    return PeerFile(data, st.st_dev, st.st_ino, st.st_mtime)


def wait_for_file(
    path: str | os.PathLike[str],
    timeout: float,
    what: str,
    *,
    limit: int = MAX_PEER_FILE,
    allow_foreign: bool = False,
) -> bytes:
    """The contents of ``path`` once it exists (checked as :func:`read_peer_file` does).

    CliError with status 3 after ``timeout`` seconds; at once when the file is
    not a regular file, belongs to another user, or is larger than ``limit``.
    """
    return wait_for_descriptor(path, timeout, what, limit=limit, allow_foreign=allow_foreign)[0].data


# -- run status files -----------------------------------------------------------------------------


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass
class Run:
    """This process's run: what its status files say about it."""

    run: str = field(default_factory=lambda: secrets.token_hex(8))
    boot: str = field(default_factory=boot_id)
    pid: int = field(default_factory=os.getpid)
    started: float = field(default_factory=time.time)


def status_path(descriptor: str | os.PathLike[str]) -> Path:
    p = Path(descriptor)
    return p.with_name(p.name + STATUS_SUFFIX)


class StatusFile:
    """The status file beside a published descriptor, locked (``flock``) while this run lives.

    It lists the (device, inode) of each descriptor this run published, so a
    reader can tell a descriptor of this run from one a dead run left.
    Rewritten atomically; the new file is locked before it replaces the old.
    """

    def __init__(self, descriptor: str | os.PathLike[str], run: Run) -> None:
        self.path = status_path(descriptor)
        self.run = run
        self.state: Literal["running", "failed"] = "running"
        self.reason = ""
        self.failed_at = 0.0
        #: The failure is the connection breaking (its cause may be the peer's failure).
        self.broke = False
        self.files: list[tuple[int, int]] = []
        self._fd: int | None = None
        self._write()
        _STATUS.append(self)

    def _content(self) -> bytes:
        return json.dumps(
            {
                "format": STATUS_FORMAT,
                "run": self.run.run,
                "boot": self.run.boot,
                "pid": self.run.pid,
                "started": self.run.started,
                "state": self.state,
                "reason": self.reason[:1000],
                "failed_at": self.failed_at,
                "broke": self.broke,
                "files": self.files,
            }
        ).encode()

    def _write(self) -> None:
        p = self.path
        _writable_dir(p, "the status file")
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
        except OSError as e:
            raise CliError(f"cannot write the status file {p}: {e.strerror}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, self._content())
            os.fchmod(fd, 0o644)
            os.replace(tmp, p)
        except OSError as e:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise CliError(f"cannot write the status file {p}: {e.strerror}") from e
        old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)

    def published(self, path: Path, data: bytes, what: str) -> None:
        """Publish a descriptor of this run (the status file lists it)."""
        publish(path, data, what)
        st = path.stat()
        self.files.append((st.st_dev, st.st_ino))
        self._write()

    def fail(self, reason: str, broke: bool = False) -> None:
        """Tell a watching peer why this run ends (the file stays locked until :meth:`close`)."""
        if self._fd is None:
            return
        self.state, self.reason, self.failed_at, self.broke = "failed", reason, time.time(), broke
        with contextlib.suppress(CliError):
            self._write()

    def close(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        finally:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True, slots=True)
class PeerStatus:
    """A peer run's status file as a reader sees it."""

    #: absent: no status file (a descriptor from another tool); running: the run holds its lock;
    #: gone: nobody holds it (the run died or exited); failed: the run says why it ends.
    state: Literal["absent", "running", "gone", "failed"]
    run: str = ""
    boot: str = ""
    pid: int = 0
    started: float = 0.0
    reason: str = ""
    failed_at: float = 0.0
    broke: bool = False
    files: tuple[tuple[int, int], ...] = ()

    def names(self, pf: PeerFile) -> bool:
        return (pf.dev, pf.ino) in self.files

    def who(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.started)) if self.started else "?"
        return f"pid {self.pid}, run {self.run}, started {when}"


def _status_of(data: bytes, state: Literal["running", "gone"]) -> PeerStatus:
    try:
        obj = json.loads(data)
        if not isinstance(obj, dict) or obj.get("format") != STATUS_FORMAT:
            raise ValueError("not a status file")
        files = tuple((int(d), int(i)) for d, i in obj.get("files", []))
        failed = obj.get("state") == "failed"
        return PeerStatus(
            "failed" if failed else state, run=str(obj["run"])[:32], boot=str(obj.get("boot", ""))[:64],
            pid=int(obj.get("pid", 0)), started=float(obj.get("started", 0.0)),
            reason=str(obj.get("reason", ""))[:1000], failed_at=float(obj.get("failed_at", 0.0)),
            broke=obj.get("broke") is True, files=files,
        )  # fmt: skip
    except (ValueError, TypeError, KeyError, RecursionError):
        return PeerStatus("absent")


def read_status(descriptor: str | os.PathLike[str], allow_foreign: bool = False) -> PeerStatus:
    """The status of the run that published ``descriptor`` (its status file and lock)."""
    path = status_path(descriptor)
    for _ in range(5):
        try:
            fd, st = _open_checked(path, "status file", allow_foreign)
        except FileNotFoundError:
            return PeerStatus("absent")
        try:
            data = _read_limited(fd, MAX_STATUS)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _status_of(data, "running")
            # Unlocked: its run is gone, unless it was replaced meanwhile (the run rewrote it).
            try:
                now = os.stat(path)
            except FileNotFoundError:
                return PeerStatus("absent")
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                return _status_of(data, "gone")
        finally:
            os.close(fd)
    return PeerStatus("absent")


def _stale_reason(status: PeerStatus, me: Run | None) -> str:
    if me is not None and status.boot and me.boot and status.boot != me.boot:
        return f"written before the last reboot ({status.who()})"
    if status.state == "gone":
        return f"left by a run that is no longer running ({status.who()})"
    if status.state == "failed":
        return f"left by a run that failed ({status.who()}): {status.reason}"
    return f"not among the files of the run now there ({status.who()})"


def wait_for_descriptor(
    path: str | os.PathLike[str],
    timeout: float,
    what: str,
    *,
    limit: int = MAX_PEER_FILE,
    allow_foreign: bool = False,
    me: Run | None = None,
    status_of: str | os.PathLike[str] | None = None,
) -> tuple[PeerFile, PeerStatus]:
    """A peer's file once it exists and is fresh; CliError (status 3) after ``timeout`` seconds.

    A file whose status file says its run is gone (or from another boot) is
    stale: it is skipped (logged once) while the peer may still replace it,
    and the timeout names it. A peer run that failed ends the wait at once
    with its reason. A file without a status file (written by another tool)
    is taken as it is. The status file is the one beside ``status_of`` when
    given (a peer's other descriptor), else beside ``path``.
    """
    end = time.monotonic() + timeout
    delay = 0.005
    stale = ""
    while True:
        try:
            pf = _read_peer(path, what, limit, allow_foreign)
        except FileNotFoundError:
            pf = None
        if pf is not None:
            status = read_status(path if status_of is None else status_of, allow_foreign)
            if status.state == "absent":
                return pf, status
            fresh = not (me is not None and status.boot and me.boot and status.boot != me.boot)
            if status.state == "running" and fresh and status.names(pf):
                return pf, status
            if status.state == "failed" and fresh and status.names(pf):
                raise CliError(f"the peer failed ({status.who()}): {status.reason}")
            if status.state != "running" or not fresh:
                why = _stale_reason(status, me)
                if why != stale:
                    log.info("%s: stale, waiting for a fresh one: %s", path, why)
                stale = why
        if time.monotonic() >= end:
            note = f"; the file there is stale, {stale}" if stale else ""
            raise CliError(
                f"timed out after {timeout:g} s waiting for {what} ({path}){note}", EXIT_TIMEOUT
            ) from None
        time.sleep(min(delay, max(0.0, end - time.monotonic())))
        delay = min(delay * 2, 0.1)


class PeerWatch:
    """Watches the status of the peer run a side connected to; :meth:`check` raises when it ends badly.

    ``failed``: the peer's reason. ``gone`` while still listed, or a status
    file now of another run: the peer exited without clean-up (killed).
    A status file removed is a peer that ended cleanly: a short grace for
    completions still in flight, then an error.
    """

    GRACE = 1.0

    def __init__(self, descriptor: Path, status: PeerStatus, allow_foreign: bool) -> None:
        self.descriptor = descriptor
        self.status = status
        self.allow_foreign = allow_foreign
        self._gone_since: float | None = None

    def check(self) -> None:
        if self.status.state == "absent":
            return  # a peer without a status file: nothing to watch
        now = read_status(self.descriptor, self.allow_foreign)
        who = self.status.who()
        if now.state == "absent" or now.run != self.status.run:
            if self._gone_since is None:
                self._gone_since = time.monotonic()
            elif time.monotonic() - self._gone_since > self.GRACE:
                raise CliError(f"the peer exited ({who})")
            return
        if now.state == "failed":
            raise CliError(f"the peer failed ({who}): {now.reason}")
        if now.state == "gone":
            raise CliError(f"the peer died without a word ({who}; killed?)")

    def cause(self) -> PeerStatus | None:
        """The peer's status if it failed for a reason of its own (not the connection breaking)."""
        if self.status.state == "absent":
            return None
        now = read_status(self.descriptor, self.allow_foreign)
        if now.state == "failed" and now.run == self.status.run and not now.broke:
            return now
        return None

    def ended(self) -> str | None:
        """How the peer's run ended, when it did without saying why (a clause for a message)."""
        if self.status.state == "absent":
            return None
        now = read_status(self.descriptor, self.allow_foreign)
        if now.state == "gone" and now.run == self.status.run:
            return f"the peer died without a word ({self.status.who()}; killed?)"
        if now.state == "absent" or now.run != self.status.run:
            return f"the peer exited ({self.status.who()})"
        return None

    def peer_alive(self) -> bool:
        if self.status.state == "absent":
            return False
        now = read_status(self.descriptor, self.allow_foreign)
        return now.state == "running" and now.run == self.status.run


def parse_json_file(data: bytes, path: str | os.PathLike[str]) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise CliError(f"{path}: not a descriptor (not JSON: {e})") from e


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
