"""DOCA DMA programs: the DMA Copy application and the DMA samples.

- ``rdmakit dma-copy``: DOCA's DMA Copy application. A host and a DPU copy a
  file one way or the other over DMA; the control path is a comm channel.
- ``rdmakit dma-local-copy``: the DMA Local Copy sample (one process).
- ``rdmakit dma-copy-host`` / ``rdmakit dma-copy-dpu``: the DMA Copy Host and
  DPU samples, which meet through ``export_desc.txt`` and ``buffer_info.txt``.

Without a BlueField, ``-p``/``-r`` name an emulated device pair: any
well-formed PCI address is accepted, and the two processes (both on this
machine) meet on the comm channel's service name. The host's memory reaches
the DPU process as shared memory (``rdmakit.doca.shm``); the DPU copies with
DMA jobs, no socket in the data path.

The DMA Copy protocol (the application's ``comch_msg`` types, as JSON)::

    host -> DPU   direction {file_in_host, file_size}
    DPU  -> host  direction {file_in_host, file_size}      or status {ok: false}
    host -> DPU   export {addr, length, descriptor, sha256} + the memory's fd
    DPU           copies in chunks, sending progress {phase, done, total}
    source side:  its sha256 (host: in export; DPU: copied {sha256})
    dest side:    verifies, renames the file into place, status {ok: true}

Across machines (``--transport rdma``, the default with a ``tcp:HOST:PORT``
service) the host exports its file buffer with ``export_rdma`` and each side
opens a soft RDMA device (``--device``, by default the comm channel's local
address). The DPU's direction reply carries its RDMA connection descriptor,
the host connects and sends its own with the export, the DPU connects and
its DMA jobs run as RDMA READs and WRITEs on that connection (`Dma.set_rdma`);
the host's side answers them while it waits for the DPU's messages.

Either side sends status {ok: false, error} when it fails, and a side that
goes away is noticed on the channel (CONNECTION_RESET). A side whose own
arguments are bad says so before it publishes or connects, and then tells a
peer that is already waiting (for a few seconds) so that it does not wait
out its timeout. A destination file is written unnamed (``O_TMPFILE``) and
linked into place only once its checksum matches, so a failed or killed
copy leaves no partial file behind.

Nothing a peer says is trusted beyond what the channel proves: a ``tcp:``
channel authenticates both sides with a shared secret (``--secret-file``,
``RDMAKIT_COMCH_SECRET`` or the user's default key), a Unix-socket channel
talks only to the same user (or root). Shared memory crosses only as a file
descriptor over a Unix socket, with the access that descriptor carries;
``--transport shm`` over ``tcp:`` is refused.
"""

import argparse
import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any, TextIO

from rdmakit.cli.errors import CliError
from rdmakit.cli.lifecycle import run
from rdmakit.cli.options import TIMEOUT, add_foreign_flag, add_general_flags, foreign_allowed
from rdmakit.cli.publishing import publish
from rdmakit.cli.status_files import wait_for_file
from rdmakit.doca import (
    AccessFlag,
    Buf,
    BufInventory,
    CommChannel,
    CommChannelServer,
    Dev,
    Dma,
    DmaMemcpyJob,
    DocaError,
    DocaErrorCode,
    DpuDescriptor,
    Mmap,
    Rdma,
    SharedMemory,
    WorkQ,
    devinfo_list,
    local_devinfo,
)
from rdmakit.transport.comm_auth import SECRET_ENV, default_key_path
from rdmakit.transport.driver import wait_readable

log = logging.getLogger("rdmakit.dma")

DEFAULT_SERVICE = "dma-copy"
SAMPLE_SERVICE = "dma-copy-sample"
DEFAULT_TIMEOUT = 60.0
DEFAULT_CHUNK = 1 << 20  # the guide's 1 MB hardware limit, now one job's size
SAMPLE_TEXT = "This is a sample piece of text"
_DEPTH = 16  # DMA jobs in flight
_HASH_BLOCK = 16 << 20
_PROGRESS_MIN = 8 << 20  # files this large get a progress bar on a TTY
_HEARTBEAT = 0.25  # seconds between progress messages on the channel
_POLL_CHANNEL = 0.05  # over RDMA the host waits on its device, looking at the channel this often
_PCI = re.compile(r"(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


# ---------------------------------------------------------------------------
# Shared pieces


def _pci(value: str | None, flag: str) -> str | None:
    if value is None:
        return None
    if not _PCI.fullmatch(value):
        raise CliError(f"{flag}: {value!r} is not a PCI address (BB:DD.F or DDDD:BB:DD.F)")
    return value.lower() if value.count(":") == 2 else f"0000:{value.lower()}"


def _open_dev(pci: str | None) -> Dev:
    """The DMA device at `pci`, or an emulated one (a local device carrying that address)."""
    if pci is None:
        return Dev.open(local_devinfo("local0"))
    for info in devinfo_list():
        if info.matches(pci) and Dma.cap_is_supported(info):
            return Dev.open(info)
    log.info("no DMA device at %s: using an emulated one", pci)
    return Dev.open(dataclasses.replace(local_devinfo(f"emu-{pci}"), pci_addr=pci))


class _Unwind(ExitStack):
    """An ExitStack whose clean-up errors never hide what made it unwind (an error or Ctrl-C).

    Unwinding after an interrupt, a view of the memory may still be held by a
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


@contextmanager
def _cli_errors() -> Iterator[None]:
    """TIME_OUT is exit status 3, as `wait_for_file`; other errors go to `run`."""
    try:
        yield
    except DocaError as exc:
        if exc.code is DocaErrorCode.TIME_OUT:
            raise CliError(str(exc), status=3) from exc
        raise


class _Progress:
    """A one-line progress bar on a TTY, for large transfers; silent otherwise."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._label = label
        self._total = total
        self._enabled = total >= _PROGRESS_MIN and self._stream.isatty()
        self._shown = False
        self._last = 0.0

    def update(self, done: int, *, force: bool = False) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        frac = done / self._total if self._total else 1.0
        width = 30
        bar = "#" * int(frac * width)
        self._stream.write(
            f"\r{self._label} [{bar:<{width}}] {frac:4.0%} {done / 2**20:.1f}/{self._total / 2**20:.1f} MiB"
        )
        self._stream.flush()
        self._shown = True

    def done(self) -> None:
        if self._enabled:
            self.update(self._total, force=True)
            self._stream.write("\n")
            self._stream.flush()
            self._enabled = False

    def abandon(self) -> None:
        if self._shown and self._enabled:
            self._stream.write("\n")
            self._stream.flush()
        self._enabled = False


class _Destination:
    """A file that appears under its name only when `commit` is called: ``O_TMPFILE``, linked in.

    Where ``O_TMPFILE`` is not supported, a hidden ``.NAME.*.partial`` file
    in the same directory (removed by `discard`; a process killed outright
    leaves it behind, under that name only).
    """

    def __init__(self, path: str, size: int) -> None:
        self.path = Path(path)
        parent = self.path.parent
        self._tmp: str | None = None
        self.fd = self._dir = -1
        try:
            self._dir = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            self.fd = os.open(parent, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            if self._dir < 0 or exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                self.discard()
                raise CliError(f"cannot write {path}: {exc.strerror}") from exc
            try:
                self.fd, self._tmp = tempfile.mkstemp(
                    prefix=f".{self.path.name}.", suffix=".partial", dir=parent
                )
            except OSError as exc2:
                self.discard()
                raise CliError(f"cannot write {path}: {exc2.strerror}") from exc2
        fd = self.fd
        try:
            if size:
                os.posix_fallocate(fd, 0, size)  # ENOSPC now, not SIGBUS in the middle of the copy
        except OSError as exc:
            self.discard()
            raise CliError(f"cannot write {path}: {exc.strerror}") from exc

    def commit(self) -> None:
        """Flush and link the file in; never replaces a file that appeared meanwhile."""
        try:
            os.fsync(self.fd)
            # linkat(AT_SYMLINK_FOLLOW) (a dir fd makes os.link use linkat), in the directory opened first
            if self._tmp is None:
                os.link(
                    f"/proc/self/fd/{self.fd}", self.path.name, dst_dir_fd=self._dir, follow_symlinks=True
                )
            else:
                os.link(self._tmp, self.path.name, dst_dir_fd=self._dir)
                os.unlink(self._tmp)
                self._tmp = None
        except OSError as exc:
            raise CliError(f"cannot create {self.path}: {exc.strerror}") from exc
        self.discard()

    def discard(self) -> None:
        """Close and forget the unnamed file; idempotent."""
        for fd in (self.fd, self._dir):
            if fd >= 0:
                os.close(fd)
        self.fd = self._dir = -1
        if self._tmp is not None:
            with suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = None


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _local_file(path: str) -> int | None:
    """The size of `path` if it exists (a readable regular file), else None (then it can be created).

    Checked before anything is published or connected: a source that cannot
    be read, or a destination that cannot be created, fails here.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            raise CliError(f"cannot write {path}: {os.strerror(errno.ENOENT)}") from None
        if not os.access(parent, os.W_OK | os.X_OK):
            raise CliError(f"cannot write {path}: {os.strerror(errno.EACCES)}") from None
        return None
    except IsADirectoryError:
        raise CliError(f"{path} is a directory") from None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        raise CliError(f"{path} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise CliError(f"{path} is not a regular file")
    return st.st_size


def _file_id(path: str) -> str:
    """Which file `path` is on this machine (boot id, device, inode): both sides naming one file show."""
    try:
        st = os.stat(path)
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
    return f"{boot}:{st.st_dev}:{st.st_ino}"


def _started_mmap(dev: Dev, memory: memoryview, access: AccessFlag) -> Mmap:
    mmap = Mmap()
    try:
        mmap.set_permissions(access)
        mmap.set_memrange(memory)
        mmap.add_dev(dev)
        mmap.start()
    except BaseException:
        mmap.destroy()
        raise
    return mmap


# ---------------------------------------------------------------------------
# The DMA Copy protocol

_SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "direction": {
        "file_in_host": (bool,),
        "file_size": (int,),
        "transport": (str,),
        "connection": (str, type(None)),
        "file_id": (str,),
    },
    "export": {
        "addr": (int,),
        "length": (int,),
        "descriptor": (str, type(None)),
        "sha256": (str,),
        "connection": (str, type(None)),
    },
    "progress": {"phase": (str,), "done": (int,), "total": (int,)},
    "copied": {"sha256": (str,)},
    "status": {"ok": (bool,), "error": (str,)},
}


class _PeerFailed(CliError):
    """The peer reported a failure: nothing to tell it back."""


class _Link:
    """This side's end of the DMA Copy conversation over a `CommChannel`."""

    def __init__(self, chan: CommChannel, peer: str, timeout: float) -> None:
        self.chan = chan
        self.peer = peer  # "host" or "DPU"
        self.timeout = timeout
        self._last_beat = 0.0
        # Over RDMA the host's device must answer the DPU's requests while the host waits here.
        self.rdma_wq: WorkQ | None = None

    def send(self, kind: str, *, fds: tuple[int, ...] = (), **fields: Any) -> None:
        data = json.dumps({"type": kind, **fields}, separators=(",", ":")).encode()
        self.chan.send(data, fds=fds, timeout=self.timeout)

    def settle(self, exc: CliError | DocaError) -> None:
        """This side failed with `exc`: tell the peer, or say plainly that the peer went away."""
        if isinstance(exc, DocaError) and exc.code in (
            DocaErrorCode.CONNECTION_RESET,
            DocaErrorCode.NOT_CONNECTED,
        ):
            raise CliError(f"the {self.peer} went away before the copy was complete ({exc.name})") from exc
        self.fail(str(exc))

    def fail(self, error: str) -> None:
        """Tell the peer this side failed; best effort (it may be gone)."""
        with suppress(DocaError):
            self.send("status", ok=False, error=error)

    def beat(self, phase: str, done: int, total: int) -> None:
        """A progress message, at most every `_HEARTBEAT` seconds: the peer's timeout restarts."""
        now = time.monotonic()
        if now - self._last_beat >= _HEARTBEAT or done == total:
            self._last_beat = now
            log.debug("%s: %d of %d bytes", phase, done, total)
            self.send("progress", phase=phase, done=done, total=total)

    def digest(self, view: memoryview | None, phase: str) -> str:
        """The sha256 of `view` (None: empty), with a progress bar and heartbeats to the peer."""
        total = len(view) if view is not None else 0
        bar = _Progress("hashing" if phase == "hash" else "verifying", total)
        digest = hashlib.sha256()
        for offset in range(0, total, _HASH_BLOCK):
            assert view is not None
            block = view[offset : offset + _HASH_BLOCK]
            done = offset + len(block)
            digest.update(block)
            block.release()
            bar.update(done)
            self.beat(phase, done, total)
        bar.done()
        return digest.hexdigest()

    def check_peer(self) -> None:
        """Between chunks: CONNECTION_RESET if the peer went away, its failure if it reported one."""
        data = self.chan.try_recv()
        if data is not None:
            msg = self._decode(data)
            if msg["type"] == "status" and not msg["ok"]:
                raise _PeerFailed(f"the {self.peer} failed: {msg['error']}")
            if msg["type"] != "progress":
                raise CliError(f"protocol error: the {self.peer} sent {msg['type']!r} during the copy")

    def recv(self, want: str, bar: _Progress | None = None) -> tuple[dict[str, Any], list[int]]:
        """The next `want` message; progress messages restart the timeout (and copy progress drives `bar`)."""
        while True:
            data, fds = self._next() if self.rdma_wq is not None else self.chan.recv_fds(self.timeout)
            try:
                msg = self._decode(data)
                if msg["type"] == "status" and not msg["ok"]:
                    raise _PeerFailed(f"the {self.peer} failed: {msg['error']}")
                if msg["type"] == "progress":
                    log.debug("the %s: %s %d of %d bytes", self.peer, msg["phase"], msg["done"], msg["total"])
                    if bar is not None and msg["phase"] == "copy":
                        bar.update(msg["done"])
                    continue
                if msg["type"] != want:
                    raise CliError(
                        f"protocol error: expected {want!r} from the {self.peer}, got {msg['type']!r}"
                    )
                if fds and want != "export":
                    raise CliError(f"protocol error: the {self.peer} sent file descriptors with {want!r}")
            except BaseException:
                for fd in fds:
                    os.close(fd)
                raise
            return msg, fds

    def _next(self) -> tuple[bytes, list[int]]:
        """`CommChannel.recv_fds`, pumping the RDMA device meanwhile (an event-driven WorkQ)."""
        wq = self.rdma_wq
        assert wq is not None
        deadline = time.monotonic() + self.timeout
        while (data := self.chan.try_recv()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DocaError(
                    DocaErrorCode.TIME_OUT,
                    f"comm channel {self.chan.service!r}: nothing from the {self.peer} "
                    f"after {self.timeout:g} s",
                )
            while wq.progress_retrieve() is not None:
                pass
            wq.arm()
            if wait_readable(wq.fileno(), min(left, _POLL_CHANNEL)):
                wq.clear()
        return data, []

    def _decode(self, data: bytes) -> dict[str, Any]:
        try:
            raw: object = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise CliError(f"protocol error: the {self.peer} sent a message that is not JSON") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str) or raw["type"] not in _SCHEMA:
            raise CliError(f"protocol error: the {self.peer} sent an unknown message")
        msg: dict[str, Any] = raw
        kind = msg["type"]
        for key, types in _SCHEMA[kind].items():
            if key == "error" and msg.get("ok", True):
                continue
            if key not in msg or type(msg[key]) not in types:
                raise CliError(f"protocol error: bad {kind} message from the {self.peer} ({key})")
        return msg


def _copy_chunks(
    link: _Link,
    dev: Dev,
    src: Mmap,
    dst: Mmap,
    size: int,
    *,
    chunk: int,
    bar: _Progress,
    pause: float,
    rdma: Rdma | None = None,
) -> None:
    """Copy `size` bytes from the start of `src` to the start of `dst`, `chunk` bytes per DMA job.

    With `rdma` (a connected context on `dev`) one of the mmaps may be the host's, over RDMA.
    """
    with ExitStack() as stack:
        dma = stack.enter_context(Dma(dev))
        workq = stack.enter_context(WorkQ(_DEPTH))
        if rdma is not None:
            # Closed on the way out (the copy is its only use): a failed copy's pieces still on
            # the connection are flushed, so the mmaps they use can be destroyed.
            stack.callback(rdma.close)
            dma.set_rdma(rdma)
        chunk = max(1, min(chunk, dma.max_buf_size))
        inventory = BufInventory(2 * _DEPTH)
        inventory.start()
        stack.callback(inventory.destroy)
        dma.workq_add(workq)
        dma.start()
        held: list[Buf] = []

        def release_all() -> None:
            for buf in held:
                buf.dec_refcount()
            held.clear()

        stack.callback(release_all)
        offset = done = inflight = 0
        last_check = time.monotonic()
        while done < size:
            while inflight < _DEPTH and offset < size:
                n = min(chunk, size - offset)
                s = inventory.get_by_args(src, src.addr + offset, n, src.addr + offset, n)
                held.append(s)
                d = inventory.get_by_args(dst, dst.addr + offset, n, dst.addr + offset, 0)
                held.append(d)
                workq.submit(DmaMemcpyJob(ctx=dma, src=s, dst=d))
                offset += n
                inflight += 1
            event = workq.progress_retrieve()
            if event is None:
                if rdma is not None and time.monotonic() - last_check > _HEARTBEAT:
                    last_check = time.monotonic()
                    link.check_peer()  # over RDMA a job waits for the host: notice it going away
                continue
            inflight -= 1
            job = event.job
            assert isinstance(job, DmaMemcpyJob)
            for buf in (job.src, job.dst):
                held.remove(buf)
                buf.dec_refcount()
            if not event.ok:
                assert event.error is not None
                link.check_peer()  # a host that went away explains a failed RDMA job best
                raise event.error
            assert isinstance(event.result, int)
            done += event.result
            bar.update(done)
            link.beat("copy", done, size)
            link.check_peer()
            if pause:
                time.sleep(pause)
        dma.stop()


# ---------------------------------------------------------------------------
# rdmakit dma-copy


def _dma_copy(args: argparse.Namespace) -> int:
    if not args.file:
        raise CliError("-f/--file is required")
    if args.role not in ("host", "dpu"):
        raise CliError("--role host|dpu is required")
    pci = _pci(args.pci_addr, "-p/--pci-addr")
    rep = _pci(args.rep_pci, "-r/--rep-pci")
    if args.chunk_size <= 0:
        raise CliError("--chunk-size must be positive")
    if args.role == "host" and rep is not None:
        log.debug("-r/--rep-pci is for the DPU side; ignored on the host")
    try:
        if _transport(args) == "shm" and str(args.service).startswith("tcp:"):
            raise CliError(
                "--transport shm shares memory on one machine, as a file descriptor over a Unix socket; "
                "a tcp: service cannot carry one (use --transport rdma, or a NAME or unix:PATH service)"
            )
        size = _local_file(args.file)
    except CliError as exc:
        _farewell(args, str(exc))
        raise
    with _cli_errors(), _Unwind() as stack:
        dev = stack.enter_context(_open_dev(pci))
        if args.role == "host":
            return _host(args, dev, stack, size)
        if rep is not None:
            log.info("DPU side: device %s, representor %s (emulated)", dev.name, rep)
        return _dpu(args, dev, stack, size)


_FAREWELL = 3.0  # seconds a side that cannot take part waits to tell a peer that is already there


def _farewell(args: argparse.Namespace, error: str) -> None:
    """This side failed before the conversation: tell a peer that is waiting already, briefly."""
    grace = min(float(args.timeout), _FAREWELL)
    try:
        if args.role == "host":
            with CommChannel.connect(args.service, timeout=grace, secret_file=args.secret_file) as chan:
                _Link(chan, "DPU", grace).fail(error)
                with suppress(DocaError):
                    chan.recv(grace)  # until the DPU has read it and hung up
        else:
            with (
                CommChannelServer(args.service, secret_file=args.secret_file) as server,
                server.accept(grace) as chan,
            ):
                _Link(chan, "host", grace).fail(error)
                with suppress(DocaError):  # read the host's request: closing with it unread would
                    chan.recv(grace)  # reset the connection before the host reads the answer
    except DocaError as exc:
        log.debug("no peer heard that this side failed: %s", exc)


def _transport(args: argparse.Namespace) -> str:
    """``shm`` (one machine: shared memory) or ``rdma`` (between machines); auto picks by the service."""
    if args.transport != "auto":
        return str(args.transport)
    return "rdma" if str(args.service).startswith("tcp:") else "shm"


def _check_transport(mine: str, theirs: str, peer: str) -> None:
    if theirs != mine:
        raise CliError(
            f"the {peer} copies over {theirs}, this side over {mine}: give both the same --transport"
        )


class _RdmaSide:
    """A soft RDMA device and a started `Rdma` context on it, polled through an event-driven WorkQ."""

    def __init__(
        self, args: argparse.Namespace, chan: CommChannel, stack: ExitStack, perms: AccessFlag
    ) -> None:
        spec = args.device
        if spec is None:  # the address this side of the comm channel uses
            spec = chan.local_ip
            if spec is None:
                raise CliError("--device is needed: the comm channel is not TCP, so it names no address")
        try:
            self.dev = stack.enter_context(Dev.open(spec))
        except DocaError as exc:
            hint = "" if args.device else " (choose an address with --device)"
            raise CliError(f"cannot open RDMA device {spec!r}: {exc.message}{hint}") from exc
        log.info("RDMA device %s", self.dev.name)
        self.wq = WorkQ(4, event_driven=True)
        stack.callback(self.wq.close)
        self.rdma = Rdma()
        stack.callback(self.rdma.close)  # before the WorkQ, the mmaps and the device
        self.rdma.add_dev(self.dev)
        self.rdma.set_permissions(AccessFlag.LOCAL_READ_WRITE | perms)
        self.rdma.workq_add(self.wq)
        self.rdma.start()

    def connect(self, descriptor: object, peer: str) -> None:
        if not isinstance(descriptor, str):
            raise CliError(f"protocol error: the {peer} sent no RDMA connection descriptor")
        self.rdma.connect(descriptor.encode())


def _host(args: argparse.Namespace, dev: Dev, stack: ExitStack, size: int | None) -> int:
    path: str = args.file
    source = stack.enter_context(SharedMemory.from_file(path)) if size else None
    log.info("connecting to the DPU on %r", args.service)
    chan = stack.enter_context(
        CommChannel.connect(args.service, timeout=args.timeout, secret_file=args.secret_file)
    )
    link = _Link(chan, "DPU", args.timeout)
    try:
        return _host_flow(args, dev, stack, link, size, source)
    except _PeerFailed:
        raise
    except (CliError, DocaError) as exc:
        link.settle(exc)
        raise


def _host_flow(
    args: argparse.Namespace,
    dev: Dev,
    stack: ExitStack,
    link: _Link,
    size: int | None,
    source: SharedMemory | None,
) -> int:
    path: str = args.file
    if size is not None:
        log.info("%s is on the host: it will be copied to the DPU", path)
    else:
        log.info("%s is not on the host: it will be copied from the DPU", path)
    transport = _transport(args)
    link.send(
        "direction", file_in_host=size is not None, file_size=size or 0, transport=transport,
        connection=None, file_id=_file_id(path) if size is not None else "",
    )  # fmt: skip
    reply, _ = link.recv("direction")
    _check_transport(transport, reply["transport"], "DPU")
    if reply["file_in_host"] != (size is not None):
        raise CliError("protocol error: the DPU disagrees about where the file is")
    side: _RdmaSide | None = None
    if transport == "rdma":
        # The DPU writes the new file, or reads the existing one.
        perms = AccessFlag.RDMA_WRITE if size is None else AccessFlag.RDMA_READ
        side = _RdmaSide(args, link.chan, stack, perms)
        side.connect(reply["connection"], "DPU")
        link.rdma_wq = side.wq
        dev = side.dev
    if size is None:
        size = int(reply["file_size"])
        if size < 0:
            raise CliError("protocol error: negative file size from the DPU")
        dest = _Destination(path, size)
        stack.callback(dest.discard)
        memory = stack.enter_context(SharedMemory.from_fd(dest.fd, writable=True)) if size else None
        if side is not None:
            # Unwinding closes the connection before the memory: its queue pair may hold a
            # view of the memory for a write the DPU never finished.
            stack.callback(side.rdma.close)
        access = AccessFlag.LOCAL_READ_WRITE | (
            AccessFlag.PCI_READ_WRITE if side is None else AccessFlag.RDMA_WRITE
        )
        digest = ""
    else:
        dest, memory = None, source
        access = AccessFlag.PCI_READ_ONLY if side is None else AccessFlag.RDMA_READ
        digest = link.digest(source.buf if source else None, "hash")
    connection = None if side is None else side.rdma.export().decode()
    if memory is not None:
        mmap = _started_mmap(dev, memory.buf, access)
        stack.callback(mmap.destroy)
        exported = mmap.export_dpu(dev) if side is None else mmap.export_rdma(dev)
        fds = (memory.fd,) if link.chan.fd_passing and side is None else ()
        link.send(
            "export", addr=mmap.addr, length=size, descriptor=exported.decode(), sha256=digest,
            connection=connection, fds=fds,
        )  # fmt: skip
    else:
        link.send("export", addr=0, length=0, descriptor=None, sha256=digest, connection=connection)
    bar = _Progress("DPU copying", size)
    stack.callback(bar.abandon)
    if dest is None:
        link.recv("status", bar)
        bar.done()
        print(f"dma-copy: {size} bytes host -> DPU, sha256 {digest}")
        return 0
    copied, _ = link.recv("copied", bar)
    bar.done()
    got = link.digest(memory.buf if memory else None, "verify")
    if got != copied["sha256"]:
        raise CliError(f"checksum mismatch: the DPU sent sha256 {copied['sha256']}, {path} has {got}")
    log.info("checksum verified; writing %s", path)
    dest.commit()
    try:
        link.send("status", ok=True, error="")
    except DocaError as exc:
        log.warning("the copy is complete, but the DPU did not hear so: %s", exc)
    print(f"dma-copy: {size} bytes DPU -> host, sha256 {got}")
    return 0


def _dpu(args: argparse.Namespace, dev: Dev, stack: ExitStack, size: int | None) -> int:
    server = CommChannelServer(args.service, secret_file=args.secret_file)
    try:
        log.info("waiting for the host on %r", args.service)
        chan = stack.enter_context(server.accept(args.timeout))
    finally:
        server.close()
    link = _Link(chan, "host", args.timeout)
    try:
        return _dpu_flow(args, dev, stack, link, size)
    except _PeerFailed:
        raise
    except (CliError, DocaError) as exc:
        link.settle(exc)
        raise


def _dpu_flow(args: argparse.Namespace, dev: Dev, stack: ExitStack, link: _Link, size: int | None) -> int:
    path: str = args.file
    request, _ = link.recv("direction")
    transport = _transport(args)
    _check_transport(transport, request["transport"], "host")
    host_has = request["file_in_host"]
    if host_has and size is not None and request["file_id"] and request["file_id"] == _file_id(path):
        raise CliError(
            f"the host's file and the DPU's {path} are the same file (both sides in one directory?): "
            "give the side that receives a name of its own with -f"
        )
    if host_has and size is not None:
        raise CliError(f"{path} exists on both the host and the DPU: which way to copy?")
    if not host_has and size is None:
        raise CliError(f"{path} exists on neither the host nor the DPU")
    dest: _Destination | None = None
    if size is None:
        size = int(request["file_size"])
        if size < 0:
            raise CliError("protocol error: negative file size from the host")
        log.info("%s will be copied from the host (%d bytes)", path, size)
        dest = _Destination(path, size)
        stack.callback(dest.discard)
        local = stack.enter_context(SharedMemory.from_fd(dest.fd, writable=True)) if size else None
        access = AccessFlag.LOCAL_READ_WRITE
    else:
        log.info("%s will be copied to the host (%d bytes)", path, size)
        local = stack.enter_context(SharedMemory.from_file(path)) if size else None
        access = AccessFlag.LOCAL_READ_ONLY
    side: _RdmaSide | None = None
    if transport == "rdma":
        side = _RdmaSide(args, link.chan, stack, AccessFlag.LOCAL_READ_WRITE)  # the DPU only requests
        dev = side.dev
    connection = None if side is None else side.rdma.export().decode()
    link.send(
        "direction", file_in_host=host_has, file_size=0 if host_has else size, transport=transport,
        connection=connection, file_id="",
    )  # fmt: skip
    export, fds = link.recv("export")
    stack.callback(_close_all, fds)
    if export["length"] != size or (size and export["descriptor"] is None):
        raise CliError("protocol error: the host exported the wrong size")
    if len(fds) != (1 if size and side is None else 0):
        raise CliError(
            f"protocol error: the host sent {len(fds)} file descriptors with its {transport} export"
        )
    if side is not None:
        side.connect(export["connection"], "host")
    if local is not None:
        descriptor = export["descriptor"].encode()
        if side is not None and DpuDescriptor.matches(descriptor):
            raise CliError("protocol error: the host sent a shared-memory export over the rdma transport")
        remote = Mmap.create_from_export(descriptor, dev, fd=fds[0] if fds else None)
        stack.callback(remote.destroy)
        if (remote.addr, remote.length) != (export["addr"], size):
            raise CliError("protocol error: the export descriptor and the buffer info disagree")
        mine = _started_mmap(dev, local.buf, access)
        stack.callback(mine.destroy)
        src, dst = (remote, mine) if host_has else (mine, remote)
        bar = _Progress("copying", size)
        stack.callback(bar.abandon)
        _copy_chunks(
            link, dev, src, dst, size, chunk=args.chunk_size, bar=bar, pause=args.pause,
            rdma=None if side is None else side.rdma,
        )  # fmt: skip
        bar.done()
        log.info("DMA copy of %d bytes done", size)
    if dest is None:
        digest = link.digest(local.buf if local else None, "hash")
        link.send("copied", sha256=digest)
        link.recv("status")
        print(f"dma-copy: {size} bytes DPU -> host, sha256 {digest}")
        return 0
    got = link.digest(local.buf if local else None, "verify")
    if got != export["sha256"]:
        raise CliError(f"checksum mismatch: the host sent sha256 {export['sha256']}, the copy has {got}")
    log.info("checksum verified; writing %s", path)
    dest.commit()
    try:
        link.send("status", ok=True, error="")
    except DocaError as exc:
        log.warning("the copy is complete, but the host did not hear so: %s", exc)
    print(f"dma-copy: {size} bytes host -> DPU, sha256 {got}")
    return 0


# ---------------------------------------------------------------------------
# The samples


def _chain(inventory: BufInventory, mmap: Mmap, addr: int, length: int, count: int, *, full: bool) -> Buf:
    """`count` bufs splitting ``[addr, addr+length)``, chained (the samples' ``allocat_doca_buf_list``).

    `full`: each buf's data is all of it (a source); else empty (a destination).
    """
    piece = length // count
    head: Buf | None = None
    for i in range(count):
        start = addr + i * piece
        size = length - i * piece if i == count - 1 else piece
        buf = inventory.get_by_args(mmap, start, size, start, size if full else 0)
        if head is None:
            head = buf
        else:
            head.chain_list(buf)
    assert head is not None
    return head


def _run_one(dma: Dma, workq: WorkQ, src: Buf, dst: Buf) -> int:
    """Submit one memcpy job and wait for its event (polling, as the samples do)."""
    workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))
    while (event := workq.progress_retrieve()) is None:
        time.sleep(0)
    if not event.ok:
        assert event.error is not None
        raise event.error
    assert isinstance(event.result, int)
    return event.result


def _check_lists(dma: Dma, *counts: int) -> None:
    for count in counts:
        if count > dma.max_buf_list_len:
            raise CliError(f"{count} bufs in a list: {dma.dev.name} takes at most {dma.max_buf_list_len}")


def _local_copy(args: argparse.Namespace) -> int:
    text: str = args.text
    data = text.encode() + b"\0"
    with _cli_errors(), ExitStack() as stack:
        dev = stack.enter_context(_open_dev(_pci(args.pci_addr, "-p/--pci-addr")))
        src_mem, dst_mem = bytearray(data), bytearray(len(data))
        dma = stack.enter_context(Dma(dev))
        _check_lists(dma, args.num_src_buf, args.num_dst_buf)
        src_mmap = _started_mmap(dev, memoryview(src_mem), AccessFlag.LOCAL_READ_WRITE)
        stack.callback(src_mmap.destroy)
        dst_mmap = _started_mmap(dev, memoryview(dst_mem), AccessFlag.LOCAL_READ_WRITE)
        stack.callback(dst_mmap.destroy)
        inventory = BufInventory(args.num_src_buf + args.num_dst_buf)
        inventory.start()
        stack.callback(inventory.destroy)
        src = _chain(inventory, src_mmap, src_mmap.addr, len(data), args.num_src_buf, full=True)
        stack.callback(src.dec_refcount)
        dst = _chain(inventory, dst_mmap, dst_mmap.addr, len(data), args.num_dst_buf, full=False)
        stack.callback(dst.dec_refcount)
        workq = stack.enter_context(WorkQ(1))
        dma.workq_add(workq)
        dma.start()
        copied = _run_one(dma, workq, src, dst)
        if bytes(dst_mem) != data:
            raise CliError("the destination does not hold the source after the copy")
        log.info("DMA copy was done successfully (%d bytes)", copied)
        print(f"Memory content: {dst_mem[:-1].decode(errors='replace')}")
    return 0


_HOST_GONE = 5.0  # seconds the DPU sample waits for the host sample that wrote the files to answer


def _sample_service(args: argparse.Namespace) -> None:
    if str(args.service).startswith("tcp:"):
        raise CliError(
            "the DMA Copy samples share memory on one machine, as a file descriptor over a Unix socket: "
            "--service must be a NAME or unix:PATH"
        )


def _copy_host(args: argparse.Namespace) -> int:
    _sample_service(args)
    data = args.text.encode() + b"\0"
    with _cli_errors(), _Unwind() as stack:
        dev = stack.enter_context(_open_dev(_pci(args.pci_addr, "-p/--pci-addr")))
        server = stack.enter_context(CommChannelServer(args.service))
        memory = stack.enter_context(SharedMemory(len(data)))
        memory.buf[:] = data
        mmap = _started_mmap(dev, memory.buf, AccessFlag.LOCAL_READ_WRITE | AccessFlag.PCI_READ_ONLY)
        stack.callback(mmap.destroy)
        descriptor = mmap.export_dpu(dev)

        # Published files are removed however the program ends (SIGTERM and SIGHUP included).
        publish(args.descriptor_path, descriptor, "the export descriptor")
        publish(args.buffer_path, f"{mmap.addr}\n{mmap.length}\n".encode(), "the buffer information")
        log.info("wrote %s and %s; waiting for the DPU sample", args.descriptor_path, args.buffer_path)
        print(f"Exported {mmap.length} bytes at {mmap.addr:#x}; waiting for the DPU", flush=True)
        chan = stack.enter_context(server.accept(args.timeout))
        # The pages go to the DPU sample as a descriptor, over a socket whose peer the kernel vouched for.
        chan.send(json.dumps({"type": "memory"}).encode(), fds=(memory.fd,), timeout=args.timeout)
        result = _sample_message(chan.recv(args.timeout), "done")
        if not result.get("ok"):
            raise CliError(f"the DPU sample failed: {result.get('error')}")
        log.info("the DPU sample finished")
        print("DPU copy done; exiting")
    return 0


def _sample_message(data: bytes, kind: str) -> dict[str, Any]:
    try:
        msg = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        msg = None
    if not isinstance(msg, dict) or msg.get("type") != kind:
        raise CliError(f"protocol error: expected {kind!r} from the other sample")
    return msg


def _read_buffer_info(data: bytes, path: str) -> tuple[int, int]:
    """``ADDR\\nLENGTH`` (each as ``strtoull(.., 0)`` reads it: decimal, 0x hex or 0 octal)."""
    lines = data.decode(errors="replace").split()
    try:
        addr, length = (int(word, 0) for word in lines[:2])
    except ValueError:
        raise CliError(f"{path}: expected the buffer address and length") from None
    if len(lines) != 2 or not 0 <= addr < 1 << 64 or not 0 <= length < 1 << 64:
        raise CliError(f"{path}: expected the buffer address and length")
    if length == 0:
        raise CliError(f"{path}: the remote buffer is empty")
    return addr, length


def _copy_dpu(args: argparse.Namespace) -> int:
    _sample_service(args)
    foreign = foreign_allowed(args)
    descriptor = wait_for_file(
        args.descriptor_path, args.timeout, "the export descriptor", allow_foreign=foreign
    )
    info = wait_for_file(args.buffer_path, args.timeout, "the buffer information", allow_foreign=foreign)
    # The host sample listens before it writes the files: if it does not answer now, it is gone.
    with _cli_errors():
        try:
            chan = CommChannel.connect(args.service, timeout=min(args.timeout, _HOST_GONE))
        except DocaError as exc:
            if exc.code is not DocaErrorCode.TIME_OUT:
                raise
            raise DocaError(
                DocaErrorCode.NOT_FOUND,
                f"the exported memory is gone: the host sample that wrote {args.descriptor_path} does not "
                f"answer on comm channel {args.service!r}",
            ) from exc
    with chan:
        # From here on the host sample hears how the copy ended, whatever happens.
        outcome: dict[str, object] = {"type": "done", "ok": False, "error": ""}
        try:
            with _cli_errors():
                text = _copy_dpu_flow(args, chan, descriptor, info)
            outcome["ok"] = True
            print(f"Memory content: {text}")
            return 0
        except (CliError, DocaError) as exc:
            outcome["error"] = str(exc)[:1000]
            raise
        finally:
            try:
                chan.send(json.dumps(outcome).encode(), timeout=min(args.timeout, _HOST_GONE))
            except DocaError as exc:
                level = logging.WARNING if outcome["ok"] else logging.INFO
                log.log(level, "could not tell the host sample: %s", exc)


def _copy_dpu_flow(args: argparse.Namespace, chan: CommChannel, descriptor: bytes, info: bytes) -> str:
    data, fds = chan.recv_fds(args.timeout)  # first: the host sample is sending it
    with _Unwind() as stack:
        stack.callback(_close_all, fds)
        _sample_message(data, "memory")
        addr, length = _read_buffer_info(info, args.buffer_path)
        if len(fds) != 1:
            raise CliError(f"protocol error: the host sample sent {len(fds)} file descriptors, not 1")
        dev = stack.enter_context(_open_dev(_pci(args.pci_addr, "-p/--pci-addr")))
        dma = stack.enter_context(Dma(dev))
        _check_lists(dma, args.num_src_buf, args.num_dst_buf)
        if length > dma.max_buf_size:
            raise CliError(f"remote buffer of {length} bytes; {dev.name} copies at most {dma.max_buf_size}")
        remote = Mmap.create_from_export(descriptor, dev, fd=fds[0])
        stack.callback(remote.destroy)
        if not remote.contains(addr, length):
            raise CliError(f"{args.buffer_path}: {addr:#x}+{length} is outside the exported range")
        local_mem = bytearray(length)
        local = _started_mmap(dev, memoryview(local_mem), AccessFlag.LOCAL_READ_WRITE)
        stack.callback(local.destroy)
        inventory = BufInventory(args.num_src_buf + args.num_dst_buf)
        inventory.start()
        stack.callback(inventory.destroy)
        src = _chain(inventory, remote, addr, length, args.num_src_buf, full=True)
        stack.callback(src.dec_refcount)
        dst = _chain(inventory, local, local.addr, length, args.num_dst_buf, full=False)
        stack.callback(dst.dec_refcount)
        workq = stack.enter_context(WorkQ(1))
        dma.workq_add(workq)
        dma.start()
        _run_one(dma, workq, src, dst)
        log.info("remote DMA copy was done successfully")
        return bytes(local_mem).rstrip(b"\0").decode(errors="replace")


# ---------------------------------------------------------------------------
# Registration


def _positive(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return number


def _add_service(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument(
        "--service", default=default, metavar="NAME",
        help=f"comm channel service name, the same on both sides: NAME, unix:PATH or tcp:HOST:PORT "
        f"(default {default})",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=TIMEOUT, default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"how long to wait for the other side (default {DEFAULT_TIMEOUT:g})",
    )  # fmt: skip
    p.add_argument(
        "--secret-file", metavar="FILE",
        help="tcp: services: the file holding the secret both sides share, in hex, mode 0600 (default: "
        f"${SECRET_ENV}, else {default_key_path()}, made on first use)",
    )  # fmt: skip


def _add_sample_flags(p: argparse.ArgumentParser, *, remote: bool, dpu: bool) -> None:
    p.add_argument(
        "-p", "--pci-addr", metavar="PCI", help="DOCA DMA device PCI address (emulated without a BlueField)"
    )
    if not dpu:
        p.add_argument("-t", "--text", default=SAMPLE_TEXT, help="text to DMA copy")
    if remote:
        p.add_argument(
            "-d", "--descriptor-path", default="/tmp/export_desc.txt", metavar="PATH",
            help="exported descriptor file to save (host) or read (DPU) (default /tmp/export_desc.txt)",
        )  # fmt: skip
        p.add_argument(
            "-b", "--buffer-path", default="/tmp/buffer_info.txt", metavar="PATH",
            help="buffer information file to save (host) or read (DPU) (default /tmp/buffer_info.txt)",
        )  # fmt: skip
    if dpu or not remote:
        p.add_argument(
            "--num-src-buf", type=_positive, default=1, metavar="N", help="source bufs in the list"
        )
        p.add_argument(
            "--num-dst-buf", type=_positive, default=1, metavar="N", help="destination bufs in the list"
        )
    if remote:
        _add_service(p, SAMPLE_SERVICE)
        if dpu:
            add_foreign_flag(p)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "dma-copy",
        help="DOCA DMA Copy: copy a file between host and DPU over DMA",
        description="Copy a file between a host and a DPU with DOCA DMA. Run it on both sides: the "
        "side where its -f exists sends it, the other creates its own -f. Without a BlueField both sides "
        "run on this machine and meet on the comm channel's service name; there give them different "
        "files (e.g. -f data.bin on the host, -f copy.bin on the DPU).",
    )  # fmt: skip
    p.add_argument("-f", "--file", help="file to copy (on the side that has it) or to create (mandatory)")
    p.add_argument("-p", "--pci-addr", metavar="PCI", help="DOCA Comm Channel device PCI address")
    p.add_argument(
        "-r", "--rep-pci", metavar="PCI", help="DOCA Comm Channel device representor PCI address (DPU only)"
    )
    p.add_argument("--role", choices=("host", "dpu"), help="which side this is (mandatory)")
    _add_service(p, DEFAULT_SERVICE)
    p.add_argument(
        "--chunk-size", type=int, default=DEFAULT_CHUNK, metavar="BYTES",
        help=f"bytes per DMA job (default {DEFAULT_CHUNK})",
    )  # fmt: skip
    p.add_argument(
        "--transport", choices=("auto", "shm", "rdma"), default="auto",
        help="shm: one machine, shared memory; rdma: between machines, DMA jobs as RDMA READ/WRITE "
        "(default: rdma for a tcp: service, else shm); the same on both sides",
    )  # fmt: skip
    p.add_argument(
        "--device", metavar="ADDR",
        help="RDMA transport: this side's soft RDMA device, e.g. 127.0.0.2, udp:ADDR or tcp:ADDR "
        "(default: the address the comm channel uses here)",
    )  # fmt: skip
    p.add_argument(
        "--pause", type=float, default=0.0, help=argparse.SUPPRESS
    )  # tests: seconds after each job
    add_general_flags(p)
    p.set_defaults(handler=run(p, _dma_copy))

    p = subparsers.add_parser("dma-local-copy", help="DOCA DMA sample: copy a buffer locally")
    _add_sample_flags(p, remote=False, dpu=False)
    add_general_flags(p)
    p.set_defaults(handler=run(p, _local_copy))

    p = subparsers.add_parser(
        "dma-copy-host", help="DOCA DMA sample, host side: export a buffer for the DPU sample"
    )
    _add_sample_flags(p, remote=True, dpu=False)
    add_general_flags(p)
    p.set_defaults(handler=run(p, _copy_host))

    p = subparsers.add_parser("dma-copy-dpu", help="DOCA DMA sample, DPU side: copy the host's buffer")
    _add_sample_flags(p, remote=True, dpu=True)
    add_general_flags(p)
    p.set_defaults(handler=run(p, _copy_dpu))
