"""``rdmakit dma-copy``: DOCA's DMA Copy application, a file copied between a host and a DPU.

A host and a DPU copy a file one way or the other over DMA; the control path
is ``doca_comch`` (a server context on the DPU, a client on the host, on the
DMA device's progress engine: ``rdmakit.cli.dma_comch``), on which the two sides hold the conversation of
``rdmakit.cli.dma_protocol``. This module is the program around it: it checks
the arguments and the file (``rdmakit.cli.dma_files``), pumps the
conversation through a :class:`~rdmakit.cli.dma_link.Link`, and runs the DMA
jobs.

Without a BlueField, ``-p``/``-r`` name an emulated device pair: any
well-formed PCI address is accepted, and the two processes (both on this
machine) meet on the comm channel's service name. The host's memory reaches
the DPU process as shared memory (``rdmakit.doca.shm``); the DPU copies with
DMA jobs, no socket in the data path.

Across machines (``--transport rdma``, the default with a ``tcp:HOST:PORT``
service) the host exports its file buffer with ``export_rdma`` and each side
opens a soft RDMA device (``--device``, by default the comm channel's local
address). The DPU's direction reply carries its RDMA connection descriptor,
the host connects and sends its own with the export, the DPU connects and
its DMA jobs run as RDMA READs and WRITEs on that connection (``rdmakit.cli.dma_rdma``:
DOCA DMA itself never crosses the network);
the host's side answers them while it waits for the DPU's messages.

Either side sends status {ok: false, error} when it fails, and a side that
goes away is noticed on the channel (CONNECTION_RESET). A side whose own
arguments are bad says so before it publishes or connects, and then tells a
peer that is already waiting (for a few seconds) so that it does not wait
out its timeout.

Nothing a peer says is trusted beyond what the channel proves: a ``tcp:``
channel authenticates both sides with a shared secret (``--secret-file``,
``RDMAKIT_COMCH_SECRET`` or the user's default key), a Unix-socket channel
talks only to the same user (or root). Shared memory crosses only as a file
descriptor over a Unix socket, with the access that descriptor carries;
``--transport shm`` over ``tcp:`` is refused.
"""

import argparse
import logging
import os
import time
from contextlib import ExitStack, suppress
from typing import Any

from rdmakit.cli.dma_comch import ComchEndpoint
from rdmakit.cli.dma_files import Destination, LocalFile, close_fds, local_file
from rdmakit.cli.dma_link import HEARTBEAT, Link, ProgressBar
from rdmakit.cli.dma_protocol import Copied, Direction, Export, PeerFailed, RemoteProtocolError, Role, Status
from rdmakit.cli.dma_rdma import DmaOverRdma
from rdmakit.cli.dma_setup import add_service, open_dev, pci_address, started_mmap
from rdmakit.cli.errors import EXIT_USAGE, CliError, doca_timeouts
from rdmakit.cli.lifecycle import Unwind, run
from rdmakit.cli.options import add_general_flags
from rdmakit.doca import (
    AccessFlag,
    Buf,
    BufInventory,
    Dev,
    Dma,
    DmaMemcpyJob,
    DocaError,
    DpuDescriptor,
    Mmap,
    Rdma,
    SharedMemory,
    WorkQ,
)

log = logging.getLogger("rdmakit.dma")

DEFAULT_SERVICE = "dma-copy"
DEFAULT_CHUNK = 1 << 20  # the guide's 1 MB hardware limit, now one job's size
_DEPTH = 16  # DMA jobs in flight


def _dma_copy(args: argparse.Namespace) -> int:
    if not args.file:
        raise CliError("-f/--file is required", EXIT_USAGE)
    if args.role not in ("host", "dpu"):
        raise CliError("--role host|dpu is required", EXIT_USAGE)
    pci = pci_address(args.pci_addr, "-p/--pci-addr")
    rep = pci_address(args.rep_pci, "-r/--rep-pci")
    if args.chunk_size <= 0:
        raise CliError("--chunk-size must be positive", EXIT_USAGE)
    if args.role == "host" and rep is not None:
        log.debug("-r/--rep-pci is for the DPU side; ignored on the host")
    try:
        if _transport(args) == "shm" and str(args.service).startswith("tcp:"):
            raise CliError(
                "--transport shm shares memory on one machine, as a file descriptor over a Unix socket; "
                "a tcp: service cannot carry one (use --transport rdma, or a NAME or unix:PATH service)"
            )
        src = local_file(args.file)
    except CliError as exc:
        _farewell(args, str(exc))
        raise
    with doca_timeouts(), Unwind() as stack:
        if src is not None:
            stack.callback(os.close, src.fd)
        dev = stack.enter_context(open_dev(pci))
        if args.role == "host":
            return _host(args, dev, stack, src)
        if rep is not None:
            log.info("DPU side: device %s, representor %s (emulated)", dev.name, rep)
        return _dpu(args, dev, stack, src)


_FAREWELL = 3.0  # seconds a side that cannot take part waits to tell a peer that is already there


def _farewell(args: argparse.Namespace, error: str) -> None:
    """This side failed before the conversation: tell a peer that is waiting already, briefly."""
    grace = min(float(args.timeout), _FAREWELL)
    try:
        with open_dev(pci_address(args.pci_addr, "-p/--pci-addr")) as dev:
            if args.role == "host":
                with ComchEndpoint.connect(
                    dev, args.service, timeout=grace, secret_file=args.secret_file
                ) as chan:
                    Link(chan, Role.HOST, _transport(args), grace).fail(error)
                    with suppress(DocaError):
                        chan.recv(grace)  # until the DPU has read it and hung up
                return
            with ComchEndpoint.accept(dev, args.service, timeout=grace, secret_file=args.secret_file) as chan:
                Link(chan, Role.DPU, _transport(args), grace).fail(error)
                with suppress(DocaError):  # read the host's request: closing with it unread would
                    chan.recv(grace)  # reset the connection before the host reads the answer
    except DocaError as exc:
        log.debug("no peer heard that this side failed: %s", exc)


def _transport(args: argparse.Namespace) -> str:
    """``shm`` (one machine: shared memory) or ``rdma`` (between machines); auto picks by the service."""
    if args.transport != "auto":
        return str(args.transport)
    return "rdma" if str(args.service).startswith("tcp:") else "shm"


class _RdmaSide:
    """A soft RDMA device and a started `Rdma` context on it, polled through an event-driven WorkQ."""

    def __init__(
        self, args: argparse.Namespace, chan: ComchEndpoint, stack: ExitStack, perms: AccessFlag
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

    def connect(self, descriptor: str | None, peer: str) -> None:
        if descriptor is None:
            raise RemoteProtocolError(f"the {peer} sent no RDMA connection descriptor")
        self.rdma.connect(descriptor.encode())


def _host(args: argparse.Namespace, dev: Dev, stack: ExitStack, src: LocalFile | None) -> int:
    source = (
        stack.enter_context(SharedMemory.from_fd(src.fd, writable=False))
        if src is not None and src.size
        else None
    )
    log.info("connecting to the DPU on %r", args.service)
    chan = stack.enter_context(
        ComchEndpoint.connect(dev, args.service, timeout=args.timeout, secret_file=args.secret_file)
    )
    link = Link(chan, Role.HOST, _transport(args), args.timeout)
    try:
        return _host_flow(args, dev, stack, link, src, source)
    except PeerFailed:
        raise
    except (CliError, DocaError) as exc:
        link.settle(exc)
        raise


def _host_flow(
    args: argparse.Namespace,
    dev: Dev,
    stack: ExitStack,
    link: Link,
    src: LocalFile | None,
    source: SharedMemory | None,
) -> int:
    path: str = args.file
    size = None if src is None else src.size
    if size is not None:
        log.info("%s is on the host: it will be copied to the DPU", path)
    else:
        log.info("%s is not on the host: it will be copied from the DPU", path)
    transport = _transport(args)
    link.send(
        Direction(
            file_in_host=size is not None, file_size=size or 0, transport=transport, connection=None,
            file_id=src.ident if src is not None else "",
        )
    )  # fmt: skip
    reply, _ = link.recv(Direction)  # the same transport, and file_in_host
    side: _RdmaSide | None = None
    if transport == "rdma":
        # The DPU writes the new file, or reads the existing one.
        perms = AccessFlag.RDMA_WRITE if size is None else AccessFlag.RDMA_READ
        side = _RdmaSide(args, link.chan, stack, perms)
        side.connect(reply.connection, "DPU")
        link.rdma_wq = side.wq
        dev = side.dev
    if size is None:
        size = reply.file_size
        if size < 0:
            raise RemoteProtocolError("negative file size from the DPU")
        dest = Destination(path, size)
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
        mmap = started_mmap(dev, memory.buf, access)
        stack.callback(mmap.destroy)
        exported = mmap.export_dpu(dev) if side is None else mmap.export_rdma(dev)
        fds = (memory.fd,) if link.chan.fd_passing and side is None else ()
        link.send(
            Export(
                addr=mmap.addr, length=size, descriptor=exported.decode(), sha256=digest,
                connection=connection,
            ),
            fds=fds,
        )  # fmt: skip
    else:
        link.send(Export(addr=0, length=0, descriptor=None, sha256=digest, connection=connection))
    bar = ProgressBar("DPU copying", size)
    stack.callback(bar.abandon)
    if dest is None:
        link.recv(Status, bar)
        bar.done()
        print(f"dma-copy: {size} bytes host -> DPU, sha256 {digest}")
        return 0
    copied, _ = link.recv(Copied, bar)
    bar.done()
    view = memory.buf if memory else None
    return _verify_and_commit(link, dest, view, copied.sha256, path, f"{size} bytes DPU -> host", copy=path)


def _dpu(args: argparse.Namespace, dev: Dev, stack: ExitStack, src: LocalFile | None) -> int:
    log.info("waiting for the host on %r", args.service)
    chan = stack.enter_context(
        ComchEndpoint.accept(dev, args.service, timeout=args.timeout, secret_file=args.secret_file)
    )
    link = Link(chan, Role.DPU, _transport(args), args.timeout)
    try:
        return _dpu_flow(args, dev, stack, link, src)
    except PeerFailed:
        raise
    except (CliError, DocaError) as exc:
        link.settle(exc)
        raise


def _dpu_flow(args: argparse.Namespace, dev: Dev, stack: ExitStack, link: Link, own: LocalFile | None) -> int:
    path: str = args.file
    size = None if own is None else own.size
    request, _ = link.recv(Direction)  # the same transport
    transport = _transport(args)
    host_has = request.file_in_host
    if host_has and own is not None and request.file_id and request.file_id == own.ident:
        raise CliError(
            f"the host's file and the DPU's {path} are the same file (both sides in one directory?): "
            "give the side that receives a name of its own with -f"
        )
    if host_has and size is not None:
        raise CliError(f"{path} exists on both the host and the DPU: which way to copy?")
    if not host_has and size is None:
        raise CliError(f"{path} exists on neither the host nor the DPU")
    dest: Destination | None = None
    if size is None:
        size = request.file_size
        if size < 0:
            raise RemoteProtocolError("negative file size from the host")
        log.info("%s will be copied from the host (%d bytes)", path, size)
        dest = Destination(path, size)
        stack.callback(dest.discard)
        local = stack.enter_context(SharedMemory.from_fd(dest.fd, writable=True)) if size else None
        access = AccessFlag.LOCAL_READ_WRITE
    else:
        log.info("%s will be copied to the host (%d bytes)", path, size)
        assert own is not None
        local = stack.enter_context(SharedMemory.from_fd(own.fd, writable=False)) if size else None
        access = AccessFlag.LOCAL_READ_ONLY
    side: _RdmaSide | None = None
    if transport == "rdma":
        side = _RdmaSide(args, link.chan, stack, AccessFlag.LOCAL_READ_WRITE)  # the DPU only requests
        dev = side.dev
    connection = None if side is None else side.rdma.export().decode()
    link.send(
        Direction(
            file_in_host=host_has, file_size=0 if host_has else size, transport=transport,
            connection=connection, file_id="",
        )
    )  # fmt: skip
    export, fds = link.recv(Export)
    stack.callback(close_fds, fds)
    if export.length != size or (size and export.descriptor is None):
        raise RemoteProtocolError("the host exported the wrong size")
    if len(fds) != (1 if size and side is None else 0):
        raise RemoteProtocolError(f"the host sent {len(fds)} file descriptors with its {transport} export")
    if side is not None:
        side.connect(export.connection, "host")
    if local is not None:
        assert export.descriptor is not None  # checked with the size
        descriptor = export.descriptor.encode()
        if side is not None and DpuDescriptor.matches(descriptor):
            raise RemoteProtocolError("the host sent a shared-memory export over the rdma transport")
        remote = Mmap.create_from_export(descriptor, dev, fd=fds[0] if fds else None)
        stack.callback(remote.destroy)
        if (remote.addr, remote.length) != (export.addr, size):
            raise RemoteProtocolError("the export descriptor and the buffer info disagree")
        mine = started_mmap(dev, local.buf, access)
        stack.callback(mine.destroy)
        src, dst = (remote, mine) if host_has else (mine, remote)
        bar = ProgressBar("copying", size)
        stack.callback(bar.abandon)
        _copy_chunks(
            link, dev, src, dst, size, chunk=args.chunk_size, bar=bar, pause=args.pause,
            rdma=None if side is None else side.rdma,
        )  # fmt: skip
        bar.done()
        log.info("DMA copy of %d bytes done", size)
    if dest is None:
        digest = link.digest(local.buf if local else None, "hash")
        link.send(Copied(sha256=digest))
        link.recv(Status)
        print(f"dma-copy: {size} bytes DPU -> host, sha256 {digest}")
        return 0
    view = local.buf if local else None
    return _verify_and_commit(
        link, dest, view, export.sha256, path, f"{size} bytes host -> DPU", copy="the copy"
    )


def _verify_and_commit(
    link: Link, dest: Destination, view: memoryview | None, sent: str, path: str, what: str, *, copy: str
) -> int:
    """The receiving side's end: the copy in `view` has the sha256 the peer `sent`; link it in, say ok."""
    got = link.digest(view, "verify")
    if got != sent:
        raise CliError(f"checksum mismatch: the {link.peer} sent sha256 {sent}, {copy} has {got}")
    log.info("checksum verified; writing %s", path)
    dest.commit()
    try:
        link.send(Status(ok=True))
    except DocaError as exc:
        log.warning("the copy is complete, but the %s did not hear so: %s", link.peer, exc)
    print(f"dma-copy: {what}, sha256 {got}")
    return 0


def _copy_chunks(
    link: Link,
    dev: Dev,
    src: Mmap,
    dst: Mmap,
    size: int,
    *,
    chunk: int,
    bar: ProgressBar,
    pause: float,
    rdma: Rdma | None = None,
) -> None:
    """Copy `size` bytes from the start of `src` to the start of `dst`, `chunk` bytes per DMA job.

    With `rdma` (a connected context on `dev`) one of the mmaps may be the host's, over RDMA.
    """
    with ExitStack() as stack:
        dma = stack.enter_context(Dma(dev) if rdma is None else DmaOverRdma(dev))
        workq = stack.enter_context(WorkQ(_DEPTH))
        if rdma is not None:
            assert isinstance(dma, DmaOverRdma)
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
                if rdma is not None and time.monotonic() - last_check > HEARTBEAT:
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
        dma.workq_rm(workq)  # DOCA 2.0 doca_ctx_stop: NOT_PERMITTED while a WorkQ is attached
        dma.stop()


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
    add_service(p, DEFAULT_SERVICE)
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
