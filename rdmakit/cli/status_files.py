"""Status files: which run published a peer's descriptor, and whether that run is still there.

Beside a published descriptor, a *status file* (:class:`StatusFile`) says
which run wrote it (a random run id, the boot id, the writer's pid and start
time) and how that run is doing (``running`` or ``failed`` with the reason).
The writer holds an ``flock`` on it for as long as it lives, so a reader
knows whether the run is still there without trusting the pid: a descriptor
whose run is gone (or from another boot) is stale (:func:`wait_for_descriptor`
waits past it), and a peer that failed or died is noticed at once
(:class:`PeerWatch`). A pid read from a file is only ever printed.

A status file written on another machine (a folder both mount) says nothing
a reader can check: locks, inode numbers and boots are each machine's own.
Its descriptor is taken as one without a status file is.
"""

import contextlib
import fcntl
import json
import logging
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rdmakit.cli.errors import EXIT_TIMEOUT, EXIT_USAGE, CliError
from rdmakit.cli.peer_files import FOREIGN_FLAG, MAX_PEER_FILE, read_peer, trust
from rdmakit.cli.publishing import hold, publish, writable_target
from rdmakit.transport.user_files import UserFile, UserFileError, opened, read_bounded

#: Largest status file.
MAX_STATUS = 4096
STATUS_FORMAT = "rdmakit.status/1"
STATUS_SUFFIX = ".status"

log = logging.getLogger("rdmakit")


def host_id() -> str:
    """This machine: its host name and ``/etc/machine-id`` (cloned images may share the latter)."""
    try:
        machine = Path("/etc/machine-id").read_text().strip()[:64]
    except OSError:
        machine = ""
    return f"{os.uname().nodename[:255]}/{machine}"


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
    host: str = field(default_factory=host_id)
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
        _refuse_live_owner(descriptor, run)
        self._write()
        hold(self)

    def _content(self) -> bytes:
        return json.dumps(
            {
                "format": STATUS_FORMAT,
                "run": self.run.run,
                "boot": self.run.boot,
                "host": self.run.host,
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
        writable_target(p, "the status file")
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


def _refuse_live_owner(descriptor: str | os.PathLike[str], run: Run) -> None:
    """A descriptor path whose run still lives (it holds its status file's lock) is that run's: a
    second program given the same ``-ld`` would take its peer over, so it stops before it writes."""
    owner = read_status(descriptor, allow_foreign=True)
    if owner.state == "running" and owner.run != run.run and (not owner.boot or owner.boot == run.boot):
        raise CliError(
            f"{descriptor} is the descriptor of a run still going ({owner.who()}): give this one another "
            "path, or end that run first",
            EXIT_USAGE,
        )


@dataclass(frozen=True, slots=True)
class PeerStatus:
    """A peer run's status file as a reader sees it."""

    #: absent: no status file (a descriptor from another tool); running: the run holds its lock;
    #: gone: nobody holds it (the run died or exited); failed: the run says why it ends.
    state: Literal["absent", "running", "gone", "failed"]
    run: str = ""
    boot: str = ""
    host: str = ""
    pid: int = 0
    started: float = 0.0
    reason: str = ""
    failed_at: float = 0.0
    broke: bool = False
    files: tuple[tuple[int, int], ...] = ()

    def names(self, pf: UserFile) -> bool:
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
            host=str(obj.get("host", ""))[:320], pid=int(obj.get("pid", 0)),
            started=float(obj.get("started", 0.0)),
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
            with opened(path, "status file", trust(allow_foreign), override=FOREIGN_FLAG) as (fd, st):
                data = read_bounded(fd, MAX_STATUS)
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return _status_of(data, "running")
        except UserFileError as e:
            if e.kind == "missing":
                return PeerStatus("absent")
            raise CliError(e.message) from None
        # Unlocked: its run is gone, unless it was replaced meanwhile (the run rewrote it).
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return PeerStatus("absent")
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            return _status_of(data, "gone")
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
) -> tuple[UserFile, PeerStatus]:
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
        pf = read_peer(path, what, limit, allow_foreign)
        if pf is not None:
            status = read_status(path if status_of is None else status_of, allow_foreign)
            if status.state == "absent":
                return pf, status
            if me is not None and status.host and me.host and status.host != me.host:
                return pf, PeerStatus("absent")  # another machine's: nothing here can check it
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


def wait_for_file(
    path: str | os.PathLike[str],
    timeout: float,
    what: str,
    *,
    limit: int = MAX_PEER_FILE,
    allow_foreign: bool = False,
) -> bytes:
    """The contents of ``path`` once it exists (checked as ``rdmakit.cli.peer_files.read_peer`` does).

    CliError with status 3 after ``timeout`` seconds; at once when the file is
    not a regular file, belongs to another user, or is larger than ``limit``.
    """
    return wait_for_descriptor(path, timeout, what, limit=limit, allow_foreign=allow_foreign)[0].data
