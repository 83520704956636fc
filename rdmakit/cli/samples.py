"""The DOCA RDMA sample pairs (RDMA guide ch. 6), scriptable end to end.

Each pair swaps descriptor files as the DOCA samples do: every side writes its
connection descriptor to ``-ld`` and reads the peer's from ``-re``; a side
that exports memory writes its mmap descriptor to ``-m`` and the other reads
it. Files are written atomically and each side waits (``--timeout``) for the
peer's file to appear instead of asking for Enter (``--interactive`` brings the
prompt back). A side removes the files it wrote when it leaves.

A responder of a one-sided operation (read, write, atomics) learns that the
requester is done from a short SEND the requester makes on the same
connection after its operation completed (a JSON note saying what it did);
it then prints what it observed and exits. Exit status: 0 on success, 1 on an
error, 3 on a timeout; errors are one line.
"""

import argparse
import ipaddress
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rdmakit.cli.errors import EXIT_USAGE, CliError
from rdmakit.cli.options import (
    foreign_allowed,
    log,
)
from rdmakit.cli.session import ConnectionBroke, Session
from rdmakit.cli.status_files import PeerWatch, Run, StatusFile, wait_for_descriptor
from rdmakit.doca import (
    AccessFlag,
    DocaError,
    Mmap,
    RdmaAtomicCmpSwpJob,
    RdmaAtomicFetchAddJob,
    RdmaOpcode,
    RdmaReadJob,
    RdmaRecvJob,
    RdmaResult,
    RdmaSendImmJob,
    RdmaSendJob,
    RdmaWriteImmJob,
    RdmaWriteJob,
)
from rdmakit.doca.descriptor import MAX_DESCRIPTOR_SIZE, ConnectionDescriptor
from rdmakit.doca.mmap import MmapDescriptor

DEFAULT_STRING = "Hi DOCA RDMA!"
#: DOCA's sample defaults (``rdma_common.h``).
DEFAULT_LOCAL = "/tmp/local_connection_desc_path.txt"
DEFAULT_REMOTE = "/tmp/remote_connection_desc_path.txt"
DEFAULT_RESOURCE = "/tmp/remote_resource_desc_path.txt"
#: Memory each side offers: enough for any string given on the command line.
MEM_SIZE = 1 << 20
DONE_MAX = 4096
DEFAULT_IMMEDIATE = 0xABCD


class Files:
    """The descriptor files of one side: what it publishes, what it reads, and its peer.

    Published files go through :func:`rdmakit.cli.publishing.publish` (removed on
    any exit) and are listed in this side's status file beside ``-ld``, which
    the peer watches; the peer's status file, beside ``-re``, is watched in
    turn once connected (:class:`PeerWatch`).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.local = Path(args.local_descriptor_path)
        self.remote = Path(args.remote_descriptor_path)
        self.resource = Path(args.remote_resource_descriptor_path)
        self.allow_foreign = foreign_allowed(args)
        self.run = Run()
        self.status: StatusFile | None = None
        self.peer: PeerWatch | None = None

    def publish(self, path: Path, data: bytes, what: str) -> None:
        if self.status is None:
            self.status = StatusFile(self.local, self.run)
        self.status.published(path, data, what)

    def wait(self, path: Path, timeout: float, what: str, status_of: Path | None = None) -> bytes:
        pf, status = wait_for_descriptor(
            path, timeout, what, limit=MAX_DESCRIPTOR_SIZE, allow_foreign=self.allow_foreign,
            me=self.run, status_of=status_of,
        )  # fmt: skip
        if self.peer is None and status_of is None:
            self.peer = PeerWatch(path, status, self.allow_foreign)
        return pf.data

    def watch(self) -> None:
        if self.peer is not None:
            self.peer.check()

    def failed(self, reason: str, broke: bool = False) -> str:
        """Tell the peer why this side ends, and return the reason to print.

        A side whose connection broke (``broke``) first gives a live peer a
        moment to say why (its reason is added); a side that failed for a
        reason of its own keeps its status file while a live peer has yet
        to read it. Both waits are bounded (``LINGER``).
        """
        if self.status is None:
            return reason
        cause = None
        if broke and self.peer is not None:
            self._while_peer_runs()
            failed = self.peer.cause()
            cause = f"the peer failed ({failed.who()}): {failed.reason}" if failed else self.peer.ended()
        self.status.fail(reason, broke)
        if not broke:
            self._while_peer_runs()
        return reason if cause is None else f"{reason}; {cause}"

    def _while_peer_runs(self) -> None:
        end = time.monotonic() + LINGER
        while self.peer is not None and time.monotonic() < end and self.peer.peer_alive():
            time.sleep(0.05)


#: Longest a failing side keeps its status file for a live peer to read (seconds).
LINGER = 2.0


def _device(args: argparse.Namespace) -> str:
    if not args.device:  # not required by argparse: --json FILE may give it
        raise CliError("the -d/--device argument is required (an address, tcp:ADDR, or a verbs device)", 2)
    return str(args.device)


def _session(args: argparse.Namespace, permissions: int, files: Files) -> Session:
    s = Session(_device(args), permissions=permissions, gid_index=args.gid_index)
    s.watch = files.watch
    if args.use_rdma_cm:
        s.enable_cm()
    elif args.server_addr is not None:
        raise CliError("-sa/--server-addr goes with -cm/--use-rdma-cm", EXIT_USAGE)
    return s


def _peer_descriptor(args: argparse.Namespace, files: Files) -> bytes:
    """Wait for the peer's connection descriptor; validate it (errors name file and field)."""
    if args.interactive:
        try:
            input(f"Peer's connection descriptor expected in {files.remote}; press Enter when it is there ")
        except EOFError:
            raise CliError("--interactive needs a terminal: standard input is closed") from None
    raw = files.wait(files.remote, args.timeout, "the peer's connection descriptor")
    try:
        return ConnectionDescriptor.from_bytes(raw).to_bytes()
    except DocaError as e:
        raise CliError(f"{files.remote}: {e}") from e


def _remote_mmap(args: argparse.Namespace, files: Files, s: Session) -> Mmap:
    raw = files.wait(files.resource, args.timeout, "the peer's memory descriptor", status_of=files.remote)
    try:
        desc = MmapDescriptor.from_bytes(raw).to_bytes()
    except DocaError as e:
        raise CliError(f"{files.resource}: {e}") from e
    try:
        return s.import_mmap(desc)
    except DocaError as e:
        raise CliError(f"cannot use the memory in {files.resource}: {e}") from e


def _start_and_connect(args: argparse.Namespace, files: Files, s: Session, desc: bytes | None = None) -> None:
    """Publish this side's descriptor (starting the context unless ``desc`` is given) and connect.

    With ``-cm`` (DOCA 2.9's samples), connect by address instead: to ``-sa`` if given, else
    listen on ``--port`` on the ``-d`` device's address; the memory descriptor still goes by file.
    """
    if args.use_rdma_cm:
        kind, server = args.server_addr_type, args.server_addr
        if kind is not None and server is not None and ipaddress.ip_address(server).version != int(kind[-1]):
            raise CliError(f"-sa {server} is not an {kind} address", EXIT_USAGE)
        if desc is None:
            s.rdma.start()
        s.cm_connect(args.server_addr, args.port, args.timeout)
        log.info("connected by rdma_cm")
        return
    files.publish(files.local, desc if desc is not None else s.start(), "the connection descriptor")
    log.info("connection descriptor written to %s", files.local)
    peer = _peer_descriptor(args, files)
    try:
        s.rdma.connect(peer)
    except DocaError as e:
        raise CliError(f"cannot connect to the peer in {files.remote}: {e}") from e
    s.wait_running(args.timeout)
    log.info("connected")


def _string_bytes(text: str) -> bytes:
    data = text.encode(errors="surrogateescape")  # argv bytes that are not UTF-8 go as they came
    if len(data) > MEM_SIZE:
        raise CliError(f"the string is {len(data)} bytes; at most {MEM_SIZE} fit", EXIT_USAGE)
    return data


def _text(data: bytes | bytearray) -> str:
    return bytes(data).decode(errors="replace")


# -- the "done" note of one-sided pairs --------------------------------------------------------


def _send_done(args: argparse.Namespace, s: Session, note: dict[str, object]) -> None:
    mem = bytearray(json.dumps(note).encode())
    m = s.mmap(mem, AccessFlag.LOCAL_READ_WRITE)
    s.run(RdmaSendJob(ctx=s.rdma, src_buf=s.data(m, 0, len(mem))), args.timeout, "telling the responder")


def _post_done_recv(s: Session) -> tuple[RdmaRecvJob, bytearray]:
    mem = bytearray(DONE_MAX)
    m = s.mmap(mem, AccessFlag.LOCAL_READ_WRITE)
    job = RdmaRecvJob(ctx=s.rdma, dst_buf=s.room(m, 0, DONE_MAX))
    s.submit(job)
    return job, mem


def _wait_done(args: argparse.Namespace, s: Session, job: RdmaRecvJob, mem: bytearray) -> dict[str, object]:
    ev = s.wait([job], args.timeout, "the requester to finish")[0]
    if not ev.ok:
        raise ConnectionBroke(f"the connection failed before the requester finished: {ev.error}")
    assert isinstance(ev.result, RdmaResult)
    try:
        note = json.loads(bytes(mem[: ev.result.length]))
    except (ValueError, RecursionError) as e:
        raise CliError("the requester's completion note is not JSON") from e
    if not isinstance(note, dict):
        raise CliError("the requester's completion note is not a JSON object")
    return note


# -- the pairs ------------------------------------------------------------------------------------


def write_requester(args: argparse.Namespace, files: Files) -> int:
    data = _string_bytes(args.write_string)
    with _session(args, AccessFlag.LOCAL_READ_WRITE, files) as s:
        local, remote = _requester(args, files, s, bytearray(data))
        job = RdmaWriteJob(
            ctx=s.rdma, src_buf=s.data(local, 0, len(data)), dst_buf=s.room(remote, 0, len(data))
        )
        s.run(job, args.timeout, "the RDMA write")
        _send_done(args, s, {"done": "write", "length": len(data)})
    print(f"Written to the responder: {_text(data)}")
    return 0


def _one_sided_responder(
    args: argparse.Namespace, files: Files, mem: bytearray, perms: int
) -> dict[str, object]:
    """Export ``mem`` with ``perms``, connect, and wait for the requester's completion note."""
    with _session(args, perms, files) as s:
        m = s.mmap(mem, perms)
        files.publish(files.resource, m.export_rdma(s.dev), "the memory descriptor")
        desc = s.start()
        job, note_mem = _post_done_recv(s)  # receives may be posted once started (INIT)
        _start_and_connect(args, files, s, desc)
        return _wait_done(args, s, job, note_mem)


def _requester(args: argparse.Namespace, files: Files, s: Session, mem: bytearray) -> tuple[Mmap, Mmap]:
    """Register ``mem``, connect, and import the responder's memory: (local, remote)."""
    local = s.mmap(mem, AccessFlag.LOCAL_READ_WRITE)
    _start_and_connect(args, files, s)
    return local, _remote_mmap(args, files, s)


def write_responder(args: argparse.Namespace, files: Files) -> int:
    mem = bytearray(MEM_SIZE)
    note = _one_sided_responder(args, files, mem, AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE)
    n = int(note.get("length", 0))  # type: ignore[call-overload]
    print(f"Remote write: {mem[: max(0, min(n, MEM_SIZE))].decode(errors='replace')}")
    return 0


def read_requester(args: argparse.Namespace, files: Files) -> int:
    with _session(args, AccessFlag.LOCAL_READ_WRITE, files) as s:
        mem = bytearray(MEM_SIZE)
        local, remote = _requester(args, files, s, mem)
        job = RdmaReadJob(
            ctx=s.rdma, src_buf=s.data(remote, 0, remote.length), dst_buf=s.room(local, 0, MEM_SIZE)
        )
        ev = s.run(job, args.timeout, "the RDMA read")
        assert isinstance(ev.result, RdmaResult)
        n = ev.result.length
        _send_done(args, s, {"done": "read", "length": n})
    print(f"Read from the responder: {mem[:n].decode(errors='replace')}")
    return 0


def read_responder(args: argparse.Namespace, files: Files) -> int:
    mem = bytearray(_string_bytes(args.read_string))
    note = _one_sided_responder(args, files, mem, AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ)
    print(f"The requester read {note.get('length')} bytes: {_text(mem)}")
    return 0


def write_imm_requester(args: argparse.Namespace, files: Files) -> int:
    data = _string_bytes(args.write_string)
    with _session(args, AccessFlag.LOCAL_READ_WRITE, files) as s:
        local, remote = _requester(args, files, s, bytearray(data))
        job = RdmaWriteImmJob(
            ctx=s.rdma,
            src_buf=s.data(local, 0, len(data)),
            dst_buf=s.room(remote, 0, len(data)),
            immediate=args.immediate,
        )
        s.run(job, args.timeout, "the RDMA write with immediate")
    print(f"Written to the responder with immediate {args.immediate:#010x}: {_text(data)}")
    return 0


def write_imm_responder(args: argparse.Namespace, files: Files) -> int:
    perms = AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE
    with _session(args, perms, files) as s:
        mem = bytearray(MEM_SIZE)
        m = s.mmap(mem, perms)
        files.publish(files.resource, m.export_rdma(s.dev), "the memory descriptor")
        desc = s.start()
        job = RdmaRecvJob(ctx=s.rdma, dst_buf=None)
        s.submit(job)
        _start_and_connect(args, files, s, desc)
        ev = s.wait([job], args.timeout, "the write with immediate")[0]
        if not ev.ok:
            raise ConnectionBroke(f"the write with immediate failed: {ev.error}")
    r = ev.result
    assert isinstance(r, RdmaResult)
    if r.opcode is not RdmaOpcode.RECV_WRITE_WITH_IMM or r.immediate is None:
        raise CliError(f"expected a write with immediate, received {r.opcode!r}")
    print(f"Remote write with immediate {r.immediate:#010x}: {mem[: r.length].decode(errors='replace')}")
    return 0


def _sender(imm: bool) -> Callable[[argparse.Namespace, Files], int]:
    def sender(args: argparse.Namespace, files: Files) -> int:
        data = _string_bytes(args.send_string)
        with _session(args, AccessFlag.LOCAL_READ_WRITE, files) as s:
            mem = bytearray(data)
            local = s.mmap(mem, AccessFlag.LOCAL_READ_WRITE)
            _start_and_connect(args, files, s)
            src = s.data(local, 0, len(data)) if data else None
            job = (
                RdmaSendImmJob(ctx=s.rdma, src_buf=src, immediate=args.immediate)
                if imm
                else RdmaSendJob(ctx=s.rdma, src_buf=src)
            )
            s.run(job, args.timeout, "the send")
        extra = f" with immediate {args.immediate:#010x}" if imm else ""
        print(f"Sent{extra}: {_text(data)}")
        return 0

    return sender


def _receiver(imm: bool) -> Callable[[argparse.Namespace, Files], int]:
    def receiver(args: argparse.Namespace, files: Files) -> int:
        with _session(args, AccessFlag.LOCAL_READ_WRITE, files) as s:
            mem = bytearray(MEM_SIZE)
            m = s.mmap(mem, AccessFlag.LOCAL_READ_WRITE)
            desc = s.start()
            job = RdmaRecvJob(ctx=s.rdma, dst_buf=s.room(m, 0, MEM_SIZE))
            s.submit(job)  # before connecting, so the first send finds it
            _start_and_connect(args, files, s, desc)
            ev = s.wait([job], args.timeout, "a message")[0]
            if not ev.ok:
                raise ConnectionBroke(f"the receive failed: {ev.error}")
        r = ev.result
        assert isinstance(r, RdmaResult)
        text = mem[: r.length].decode(errors="replace")
        if imm:
            if r.immediate is None:
                raise CliError("expected a send with immediate, received a plain send")
            print(f"Received with immediate {r.immediate:#010x}: {text}")
        else:
            print(f"Received: {text}")
        return 0

    return receiver


def atomic_requester(args: argparse.Namespace, files: Files) -> int:
    with _session(args, AccessFlag.LOCAL_READ_WRITE, files) as s:
        result = bytearray(8)
        res, remote = _requester(args, files, s, result)
        if remote.length < 8:
            raise CliError("the responder's memory is smaller than one 8-byte word")
        dst = s.data(remote, 0, 8)
        if args.op == "cas":
            job: RdmaAtomicCmpSwpJob | RdmaAtomicFetchAddJob = RdmaAtomicCmpSwpJob(
                ctx=s.rdma, dst_buf=dst, result_buf=s.room(res, 0, 8), cmp=args.compare, swap=args.swap
            )
        else:
            job = RdmaAtomicFetchAddJob(ctx=s.rdma, dst_buf=dst, result_buf=s.room(res, 0, 8), add=args.add)
        s.run(job, args.timeout, f"the atomic {args.op}")
        original = int.from_bytes(result, sys.byteorder)
        _send_done(args, s, {"done": args.op, "original": original})
    return report_atomic(args, original)


def report_atomic(args: argparse.Namespace, original: int) -> int:
    """The atomic requester's last line (both APIs)."""
    if args.op == "cas":
        swapped = "swapped" if original == args.compare else "not swapped"
        print(f"Compare-and-swap: original value {original}, {swapped}")
    else:
        print(f"Fetch-and-add: original value {original}, added {args.add}")
    return 0


def atomic_responder(args: argparse.Namespace, files: Files) -> int:
    word = bytearray(args.initial.to_bytes(8, sys.byteorder))
    perms = AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_ATOMIC | AccessFlag.RDMA_READ
    return report_atomic_responder(args, word, _one_sided_responder(args, files, word, perms))


def report_atomic_responder(args: argparse.Namespace, word: bytearray, note: dict[str, object]) -> int:
    """The atomic responder's last line (both APIs)."""
    final = int.from_bytes(word, sys.byteorder)
    print(f"Atomic {note.get('done')}: value was {args.initial}, is now {final}")
    return 0


#: A sample side: its arguments and descriptor files in, its exit status out.
Sample = Callable[[argparse.Namespace, Files], int]

SAMPLES: dict[str, tuple[str, Sample, tuple[str, ...]]] = {
    "rdma-read-requester": ("read the responder's memory", read_requester, ()),
    "rdma-read-responder": ("export memory holding --read-string for reading", read_responder, ("read",)),
    "rdma-write-requester": ("write --write-string into the responder's memory", write_requester, ("write",)),
    "rdma-write-responder": ("export memory for writing; print what was written", write_responder, ()),
    "rdma-write-immediate-requester": ("write with immediate", write_imm_requester, ("write", "imm")),
    "rdma-write-immediate-responder": ("receive a write with immediate", write_imm_responder, ()),
    "rdma-send": ("send --send-string", _sender(False), ("send",)),
    "rdma-receive": ("receive one message", _receiver(False), ()),
    "rdma-send-immediate": ("send --send-string with an immediate", _sender(True), ("send", "imm")),
    "rdma-receive-immediate": ("receive one message with its immediate", _receiver(True), ()),
    "rdma-atomic-requester": (
        "compare-and-swap or fetch-and-add a remote word",
        atomic_requester,
        ("atomic",),
    ),
    "rdma-atomic-responder": ("export one 8-byte word for atomics", atomic_responder, ("initial",)),
}
#: The sides that use no memory descriptor.
_TWO_SIDED = {
    SAMPLES[n][1] for n in ("rdma-send", "rdma-receive", "rdma-send-immediate", "rdma-receive-immediate")
}
#: The sides that publish a memory descriptor at -m.
_EXPORTERS = {write_responder, read_responder, write_imm_responder, atomic_responder}
