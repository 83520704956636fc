"""The DOCA DMA samples: DMA Local Copy, and DMA Copy Host and DPU.

- ``rdmakit dma-local-copy``: the DMA Local Copy sample (one process).
- ``rdmakit dma-copy-host`` / ``rdmakit dma-copy-dpu``: the DMA Copy Host and
  DPU samples, which meet through ``export_desc.txt`` and ``buffer_info.txt``.

Without a BlueField, ``-p`` names an emulated device: any well-formed PCI
address is accepted. The host sample's memory reaches the DPU sample as a
file descriptor of shared memory (``rdmakit.doca.shm``), passed over the comm
channel's Unix socket, with the access that descriptor carries.
"""

import argparse
import json
import logging
import time
from contextlib import ExitStack
from typing import Any

from rdmakit.cli.dma_files import close_fds
from rdmakit.cli.dma_setup import add_service, open_dev, pci_address, started_mmap
from rdmakit.cli.errors import CliError, doca_timeouts
from rdmakit.cli.lifecycle import Unwind, run
from rdmakit.cli.options import add_foreign_flag, add_general_flags, foreign_allowed, int_in
from rdmakit.cli.publishing import publish
from rdmakit.cli.status_files import wait_for_file
from rdmakit.doca import (
    AccessFlag,
    Buf,
    BufInventory,
    CommChannel,
    CommChannelServer,
    Dma,
    DmaMemcpyJob,
    DmaTaskMemcpy,
    DocaError,
    DocaErrorCode,
    Mmap,
    SharedMemory,
    WorkQ,
)

log = logging.getLogger("rdmakit.dma")

SAMPLE_SERVICE = "dma-copy-sample"
SAMPLE_TEXT = "This is a sample piece of text"


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


def _run_one_task(dma: Dma, src: Buf, dst: Buf) -> int:
    """One memcpy task on the context's progress engine, as DOCA 2.9's ``dma_local_copy_sample.c``
    runs it: ``doca_dma_task_memcpy_set_conf`` before the start, ``..._alloc_init``,
    ``doca_task_submit``, then ``doca_pe_progress`` until a callback has run (inside it only)."""
    done: list[DmaTaskMemcpy] = []

    def finished(task: DmaTaskMemcpy, task_user_data: object, ctx_user_data: object) -> None:
        done.append(task)

    pe = dma.dev.pe
    pe.connect_ctx(dma)
    dma.task_memcpy_set_conf(finished, finished, 1)
    dma.start()
    task = dma.task_memcpy_alloc_init(src, dst)
    task.submit()
    while not done:
        if not pe.progress():
            time.sleep(0)
    status, copied = task.get_status(), task.get_result_len()
    task.free()
    if status is not DocaErrorCode.SUCCESS:
        raise DocaError(status, "the DMA memcpy task failed")
    return copied


def _copy(api: str, dma: Dma, stack: ExitStack, src: Buf, dst: Buf) -> int:
    """Start `dma` and run one memcpy through `api`: the job API (a WorkQ) or DOCA 2.5+ tasks (a PE)."""
    if api == "task":
        return _run_one_task(dma, src, dst)
    workq = stack.enter_context(WorkQ(1))
    dma.workq_add(workq)
    dma.start()
    return _run_one(dma, workq, src, dst)


def _check_lists(dma: Dma, *counts: int) -> None:
    for count in counts:
        if count > dma.max_buf_list_len:
            raise CliError(f"{count} bufs in a list: {dma.dev.name} takes at most {dma.max_buf_list_len}")


def _local_copy(args: argparse.Namespace) -> int:
    text: str = args.text
    data = text.encode() + b"\0"
    with doca_timeouts(), ExitStack() as stack:
        dev = stack.enter_context(open_dev(pci_address(args.pci_addr, "-p/--pci-addr")))
        src_mem, dst_mem = bytearray(data), bytearray(len(data))
        dma = stack.enter_context(Dma(dev))
        _check_lists(dma, args.num_src_buf, args.num_dst_buf)
        src_mmap = started_mmap(dev, memoryview(src_mem), AccessFlag.LOCAL_READ_WRITE)
        stack.callback(src_mmap.destroy)
        dst_mmap = started_mmap(dev, memoryview(dst_mem), AccessFlag.LOCAL_READ_WRITE)
        stack.callback(dst_mmap.destroy)
        inventory = BufInventory(args.num_src_buf + args.num_dst_buf)
        inventory.start()
        stack.callback(inventory.destroy)
        src = _chain(inventory, src_mmap, src_mmap.addr, len(data), args.num_src_buf, full=True)
        stack.callback(src.dec_refcount)
        dst = _chain(inventory, dst_mmap, dst_mmap.addr, len(data), args.num_dst_buf, full=False)
        stack.callback(dst.dec_refcount)
        copied = _copy(args.api, dma, stack, src, dst)
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
    with doca_timeouts(), Unwind() as stack:
        dev = stack.enter_context(open_dev(pci_address(args.pci_addr, "-p/--pci-addr")))
        server = stack.enter_context(CommChannelServer(args.service))
        memory = stack.enter_context(SharedMemory(len(data)))
        memory.buf[:] = data
        mmap = started_mmap(dev, memory.buf, AccessFlag.LOCAL_READ_WRITE | AccessFlag.PCI_READ_ONLY)
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
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
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
    with doca_timeouts():
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
            with doca_timeouts():
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
    with Unwind() as stack:
        stack.callback(close_fds, fds)
        _sample_message(data, "memory")
        addr, length = _read_buffer_info(info, args.buffer_path)
        if len(fds) != 1:
            raise CliError(f"protocol error: the host sample sent {len(fds)} file descriptors, not 1")
        dev = stack.enter_context(open_dev(pci_address(args.pci_addr, "-p/--pci-addr")))
        dma = stack.enter_context(Dma(dev))
        _check_lists(dma, args.num_src_buf, args.num_dst_buf)
        if length > dma.max_buf_size:
            raise CliError(f"remote buffer of {length} bytes; {dev.name} copies at most {dma.max_buf_size}")
        remote = Mmap.create_from_export(descriptor, dev, fd=fds[0])
        stack.callback(remote.destroy)
        if not remote.contains(addr, length):
            raise CliError(f"{args.buffer_path}: {addr:#x}+{length} is outside the exported range")
        local_mem = bytearray(length)
        local = started_mmap(dev, memoryview(local_mem), AccessFlag.LOCAL_READ_WRITE)
        stack.callback(local.destroy)
        inventory = BufInventory(args.num_src_buf + args.num_dst_buf)
        inventory.start()
        stack.callback(inventory.destroy)
        src = _chain(inventory, remote, addr, length, args.num_src_buf, full=True)
        stack.callback(src.dec_refcount)
        dst = _chain(inventory, local, local.addr, length, args.num_dst_buf, full=False)
        stack.callback(dst.dec_refcount)
        _copy(args.api, dma, stack, src, dst)
        log.info("remote DMA copy was done successfully")
        return bytes(local_mem).rstrip(b"\0").decode(errors="replace")


_positive = int_in(1, 1 << 31)


def _add_sample_flags(p: argparse.ArgumentParser, *, remote: bool, dpu: bool) -> None:
    p.add_argument(
        "-p", "--pci-addr", metavar="PCI", help="DOCA DMA device PCI address (emulated without a BlueField)"
    )
    if not dpu:
        p.add_argument("-t", "--text", default=SAMPLE_TEXT, help="text to DMA copy")
    if remote:
        p.add_argument(
            "-d", "--descriptor-path", default="/tmp/export_desc.txt", metavar="PATH",
            help="exported descriptor file to save (host) or read (DPU) (default /tmp/export_desc.txt); "
            "DOCA's dma_copy samples' -d is this path, not the device that -d names in rdmakit's other "
            "programs (the device is -p)",
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
    if dpu or not remote:  # the side that copies
        p.add_argument(
            "--api", choices=("job", "task"), default="job",
            help="DOCA's job and work-queue API (default), or the task and progress-engine API of DOCA 2.5+",
        )  # fmt: skip
    if remote:
        add_service(p, SAMPLE_SERVICE)
        if dpu:
            add_foreign_flag(p)


def register(subparsers: Any) -> None:
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
