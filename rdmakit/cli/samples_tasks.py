"""The DOCA RDMA sample pairs on the task API of DOCA 2.5+ (``--api task``).

The same subcommands, files and output as ``rdmakit.cli.samples``, written as
the DOCA 2.9 samples are (``samples/doca_rdma/*/rdma_*_sample.c``): the
context is connected to a progress engine, each task type is configured with
its callbacks before start, and after the connection is up a task is
allocated (``doca_rdma_task_<x>_allocate_init``), submitted
(``doca_task_submit``) and completed in ``doca_pe_progress``, then freed
(``doca_task_free``). Tasks are allocated in RUNNING only, so a receiver posts
its receive once connected; a send that arrives first is retried by the RC
transport (receiver not ready, IBTA §9.7.5.2.8).

``register`` adds ``--api {job,task}`` to every sample (job by default).
"""

import argparse
import json
import sys

from rdmakit.cli.errors import CliError
from rdmakit.cli.samples import (
    DONE_MAX,
    MEM_SIZE,
    SAMPLES,
    Files,
    Sample,
    _device,
    _requester,
    _start_and_connect,
    _string_bytes,
    _text,
    atomic_requester,
    read_requester,
    report_atomic,
    report_atomic_responder,
    write_imm_requester,
    write_requester,
)
from rdmakit.cli.samples_cli import register as register_samples
from rdmakit.cli.session import ConnectionBroke
from rdmakit.cli.task_session import TaskSession
from rdmakit.doca import AccessFlag, DocaErrorCode, RdmaOpcode, RdmaTaskReceive

RW = AccessFlag.LOCAL_READ_WRITE


def _session(args: argparse.Namespace, permissions: int, files: Files) -> TaskSession:
    s = TaskSession(_device(args), permissions=permissions, gid_index=args.gid_index)
    s.watch = files.watch
    if args.use_rdma_cm:
        s.enable_cm()
    return s


def _send_done(args: argparse.Namespace, s: TaskSession, note: dict[str, object]) -> None:
    mem = bytearray(json.dumps(note).encode())
    m = s.mmap(mem, RW)
    s.run_task(
        s.rdma.task_send_allocate_init(s.data(m, 0, len(mem))), args.timeout, "telling the responder"
    ).free()


def _receive(
    args: argparse.Namespace, s: TaskSession, dst_len: int, what: str
) -> tuple[RdmaTaskReceive, bytearray]:
    """Allocate and submit a receive task, wait for it; (the task, its memory)."""
    mem = bytearray(dst_len)
    dst = s.room(s.mmap(mem, RW), 0, dst_len) if dst_len else None
    task = s.rdma.task_receive_allocate_init(dst)
    task.submit()
    s.wait_tasks([task], args.timeout, what)
    if task.get_status() is not DocaErrorCode.SUCCESS:
        raise ConnectionBroke(f"{what} failed: {task.error}")
    return task, mem


def write_requester_t(args: argparse.Namespace, files: Files) -> int:
    data = _string_bytes(args.write_string)
    with _session(args, RW, files) as s:
        local, remote = _requester(args, files, s, bytearray(data))
        task = s.rdma.task_write_allocate_init(s.data(local, 0, len(data)), s.room(remote, 0, len(data)))
        s.run_task(task, args.timeout, "the RDMA write").free()
        _send_done(args, s, {"done": "write", "length": len(data)})
    print(f"Written to the responder: {_text(data)}")
    return 0


def read_requester_t(args: argparse.Namespace, files: Files) -> int:
    with _session(args, RW, files) as s:
        mem = bytearray(MEM_SIZE)
        local, remote = _requester(args, files, s, mem)
        task = s.rdma.task_read_allocate_init(s.data(remote, 0, remote.length), s.room(local, 0, MEM_SIZE))
        n = s.run_task(task, args.timeout, "the RDMA read").get_result_len()
        task.free()
        _send_done(args, s, {"done": "read", "length": n})
    print(f"Read from the responder: {mem[:n].decode(errors='replace')}")
    return 0


def write_imm_requester_t(args: argparse.Namespace, files: Files) -> int:
    data = _string_bytes(args.write_string)
    with _session(args, RW, files) as s:
        local, remote = _requester(args, files, s, bytearray(data))
        task = s.rdma.task_write_imm_allocate_init(
            s.data(local, 0, len(data)), s.room(remote, 0, len(data)), args.immediate
        )
        s.run_task(task, args.timeout, "the RDMA write with immediate").free()
    print(f"Written to the responder with immediate {args.immediate:#010x}: {_text(data)}")
    return 0


def _one_sided_responder_t(
    args: argparse.Namespace, files: Files, mem: bytearray, perms: int
) -> dict[str, object]:
    with _session(args, perms, files) as s:
        m = s.mmap(mem, perms)
        files.publish(files.resource, m.export_rdma(s.dev), "the memory descriptor")
        _start_and_connect(args, files, s)
        task, note_mem = _receive(args, s, DONE_MAX, "the requester to finish")
        n = task.get_result_len()
        task.free()
    try:
        note = json.loads(bytes(note_mem[:n]))
    except ValueError as e:
        raise CliError("the requester's completion note is not JSON") from e
    if not isinstance(note, dict):
        raise CliError("the requester's completion note is not a JSON object")
    return note


def write_responder_t(args: argparse.Namespace, files: Files) -> int:
    mem = bytearray(MEM_SIZE)
    note = _one_sided_responder_t(args, files, mem, RW | AccessFlag.RDMA_WRITE)
    n = int(note.get("length", 0))  # type: ignore[call-overload]
    print(f"Remote write: {mem[: max(0, min(n, MEM_SIZE))].decode(errors='replace')}")
    return 0


def read_responder_t(args: argparse.Namespace, files: Files) -> int:
    mem = bytearray(_string_bytes(args.read_string))
    note = _one_sided_responder_t(args, files, mem, RW | AccessFlag.RDMA_READ)
    print(f"The requester read {note.get('length')} bytes: {_text(mem)}")
    return 0


def write_imm_responder_t(args: argparse.Namespace, files: Files) -> int:
    perms = RW | AccessFlag.RDMA_WRITE
    with _session(args, perms, files) as s:
        mem = bytearray(MEM_SIZE)
        m = s.mmap(mem, perms)
        files.publish(files.resource, m.export_rdma(s.dev), "the memory descriptor")
        _start_and_connect(args, files, s)
        task, _ = _receive(args, s, 0, "the write with immediate")
        opcode, n, imm = task.get_result_opcode(), task.get_result_len(), task.get_result_immediate_data()
        task.free()
    if opcode is not RdmaOpcode.RECV_WRITE_WITH_IMM or imm is None:
        raise CliError(f"expected a write with immediate, received {opcode!r}")
    print(f"Remote write with immediate {imm:#010x}: {mem[:n].decode(errors='replace')}")
    return 0


def _sender_t(imm: bool) -> Sample:
    def sender(args: argparse.Namespace, files: Files) -> int:
        data = _string_bytes(args.send_string)
        with _session(args, RW, files) as s:
            local = s.mmap(bytearray(data), RW)
            _start_and_connect(args, files, s)
            src = s.data(local, 0, len(data)) if data else None
            if imm:
                s.run_task(
                    s.rdma.task_send_imm_allocate_init(src, args.immediate), args.timeout, "the send"
                ).free()
            else:
                s.run_task(s.rdma.task_send_allocate_init(src), args.timeout, "the send").free()
        extra = f" with immediate {args.immediate:#010x}" if imm else ""
        print(f"Sent{extra}: {_text(data)}")
        return 0

    return sender


def _receiver_t(imm: bool) -> Sample:
    def receiver(args: argparse.Namespace, files: Files) -> int:
        with _session(args, RW, files) as s:
            _start_and_connect(args, files, s)
            task, mem = _receive(args, s, MEM_SIZE, "a message")
            n, immediate = task.get_result_len(), task.get_result_immediate_data()
            task.free()
        text = mem[:n].decode(errors="replace")
        if imm:
            if immediate is None:
                raise CliError("expected a send with immediate, received a plain send")
            print(f"Received with immediate {immediate:#010x}: {text}")
        else:
            print(f"Received: {text}")
        return 0

    return receiver


def atomic_requester_t(args: argparse.Namespace, files: Files) -> int:
    with _session(args, RW, files) as s:
        result = bytearray(8)
        res, remote = _requester(args, files, s, result)
        if remote.length < 8:
            raise CliError("the responder's memory is smaller than one 8-byte word")
        dst, out = s.data(remote, 0, 8), s.room(res, 0, 8)
        if args.op == "cas":
            task = s.rdma.task_atomic_cmp_swp_allocate_init(dst, out, args.compare, args.swap)
            s.run_task(task, args.timeout, "the atomic cas").free()
        else:
            s.run_task(
                s.rdma.task_atomic_fetch_add_allocate_init(dst, out, args.add), args.timeout, "the atomic faa"
            ).free()
        original = int.from_bytes(result, sys.byteorder)
        _send_done(args, s, {"done": args.op, "original": original})
    return report_atomic(args, original)


def atomic_responder_t(args: argparse.Namespace, files: Files) -> int:
    word = bytearray(args.initial.to_bytes(8, sys.byteorder))
    perms = RW | AccessFlag.RDMA_ATOMIC | AccessFlag.RDMA_READ
    return report_atomic_responder(args, word, _one_sided_responder_t(args, files, word, perms))


_BY_NAME: dict[str, Sample] = {
    "rdma-read-requester": read_requester_t,
    "rdma-read-responder": read_responder_t,
    "rdma-write-requester": write_requester_t,
    "rdma-write-responder": write_responder_t,
    "rdma-write-immediate-requester": write_imm_requester_t,
    "rdma-write-immediate-responder": write_imm_responder_t,
    "rdma-send": _sender_t(False),
    "rdma-receive": _receiver_t(False),
    "rdma-send-immediate": _sender_t(True),
    "rdma-receive-immediate": _receiver_t(True),
    "rdma-atomic-requester": atomic_requester_t,
    "rdma-atomic-responder": atomic_responder_t,
}
#: Each job-API sample -> its task-API version.
TASK_SAMPLES: dict[Sample, Sample] = {SAMPLES[name][1]: fn for name, fn in _BY_NAME.items()}
assert {write_requester, read_requester, write_imm_requester, atomic_requester} <= TASK_SAMPLES.keys()


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """The samples, each with ``--api task`` running its version here."""
    register_samples(sub, TASK_SAMPLES)
