"""``rdmakit sync-event-host`` / ``sync-event-dpu``: DOCA's sync_event sample pair (DOCA 2.6 samples).

The host creates a sync event with a DPU publisher and a CPU subscriber,
exports it to the DPU (``doca_sync_event_export_to_dpu``) and sends the blob
over the comm channel; the DPU builds its handle from it
(``doca_sync_event_create_from_export``). Then the host signals (sets 1, or
adds 1 with ``--atomic``) and waits for the value to pass 1; the DPU waits for
it to pass 0 and answers (sets 2, or adds 1). ``--async`` does the same with
the sync event's tasks on a progress engine (``--async_num_tasks`` of each).
The flags are the samples': ``-d/--pci-addr`` on both sides, ``-r/--rep-pci``
on the DPU; the lines printed are the samples' log lines.

Without a BlueField both sides are processes on this machine: ``-d``/``-r``
name emulated devices, the comm channel is ``doca_comch`` on a Unix socket
(``--service``), and the counter's page crosses it as a file descriptor
(``rdmakit.doca.sync_event_dpu``). A side whose peer goes away stops with one
line saying so rather than waiting out ``--timeout``.
"""

import argparse
import logging
import os
import time
from typing import Any

from rdmakit.cli.dma_comch import ComchEndpoint
from rdmakit.cli.dma_setup import add_service, open_dev, pci_address
from rdmakit.cli.errors import EXIT_USAGE, CliError, doca_timeouts
from rdmakit.cli.lifecycle import Unwind, run
from rdmakit.cli.options import add_general_flags
from rdmakit.doca import (
    U64_MAX,
    DocaError,
    DocaErrorCode,
    ProgressEngine,
    SyncEvent,
    SyncEventTaskWaitGt,
    Task,
)

log = logging.getLogger("rdmakit.sync_event")

DEFAULT_SERVICE = "sync-event"
_U32 = (1 << 32) - 1
_LOOK = 0.05  # seconds between looks at the comm channel while waiting on the counter


def _say(line: str) -> None:
    print(line, flush=True)


def _check(args: argparse.Namespace, *, dpu: bool) -> tuple[str, str | None]:
    if args.pci_addr is None:
        raise CliError("-d/--pci-addr is required", EXIT_USAGE)
    pci = pci_address(args.pci_addr, "-d/--pci-addr")
    assert pci is not None
    rep = None
    if dpu:
        if args.rep_pci is None:
            raise CliError("-r/--rep-pci is required on the DPU", EXIT_USAGE)
        rep = pci_address(args.rep_pci, "-r/--rep-pci")
    if not 0 <= args.async_num_tasks <= _U32:
        raise CliError(
            "Please specify num async tasks in the range [0, 4294967295] (asynchronous mode)", EXIT_USAGE
        )
    if str(args.service).startswith("tcp:"):
        raise CliError(
            "the sync event's page reaches the DPU process as a file descriptor over a Unix socket: "
            "--service must be a NAME or unix:PATH"
        )
    return pci, rep


class _Ops:
    """Signal and wait on a sync event, directly (synchronous mode) or with tasks (``--async``)."""

    def __init__(
        self, se: SyncEvent, chan: ComchEndpoint | None, args: argparse.Namespace, peer: str
    ) -> None:
        self._se = se
        self._chan = chan
        self._timeout = float(args.timeout)
        self._peer = peer
        self._async = bool(args.async_mode)
        self._done: list[Task] = []
        if self._async:
            n = int(args.async_num_tasks)
            for set_conf in (
                se.task_get_set_conf,
                se.task_notify_set_set_conf,
                se.task_notify_add_set_conf,
                se.task_wait_gt_set_conf,
            ):
                set_conf(self._completed, self._completed, n)

    def attach(self, chan: ComchEndpoint) -> None:
        self._chan = chan

    def _completed(self, task: Task, task_ud: object, ctx_ud: object) -> None:
        self._done.append(task)

    def start(self, pe: ProgressEngine) -> None:
        if self._async:
            pe.connect_ctx(self._se)
        self._se.start()

    def signal(self, atomic: bool, value: int) -> None:
        se = self._se
        if not self._async:
            if atomic:
                se.update_add(1)
            else:
                se.update_set(value)
            return
        task: Task = se.task_notify_add_alloc_init(1) if atomic else se.task_notify_set_alloc_init(value)
        self._run(task)

    def wait_gt(self, value: int) -> None:
        """Until the counter passes `value`; the peer going away (and not having signalled) ends it."""
        deadline = time.monotonic() + self._timeout
        se = self._se
        task: SyncEventTaskWaitGt | None = None
        if self._async:
            task = se.task_wait_gt_alloc_init(value, U64_MAX)
            task.submit()
        while True:
            if task is not None:
                pe = se.pe
                assert pe is not None
                pe.progress()
                if task in self._done:
                    self._finish(task)
                    return
                time.sleep(0.001)
            else:
                try:
                    se.wait_gt(value, timeout=_LOOK)
                    return
                except DocaError as exc:
                    if exc.code is not DocaErrorCode.TIME_OUT:
                        raise
            if se.get() > value:
                continue  # the next round completes it
            self._peer_alive()
            if time.monotonic() > deadline:
                raise DocaError(
                    DocaErrorCode.TIME_OUT,
                    f"the sync event was not signaled from the {self._peer} in {self._timeout:g} s",
                )

    def _peer_alive(self) -> None:
        chan = self._chan
        if chan is None:
            return
        try:
            chan.try_recv()
        except DocaError as exc:
            if exc.code in (DocaErrorCode.CONNECTION_RESET, DocaErrorCode.NOT_CONNECTED):
                raise CliError(f"the {self._peer} went away before it signaled the sync event") from exc
            raise

    def _run(self, task: Task) -> None:
        task.submit()
        pe = self._se.pe
        assert pe is not None
        deadline = time.monotonic() + self._timeout
        while task not in self._done:
            if not pe.progress() and time.monotonic() > deadline:
                raise DocaError(DocaErrorCode.TIME_OUT, f"{task.doca_name} did not complete")
        self._finish(task)

    def _finish(self, task: Task) -> None:
        self._done.remove(task)
        status, error = task.get_status(), task.error
        task.free()
        if status is not DocaErrorCode.SUCCESS:
            assert error is not None
            raise error


def _host(args: argparse.Namespace) -> int:
    pci, _ = _check(args, dpu=False)
    with doca_timeouts(), Unwind() as stack:
        dev = stack.enter_context(open_dev(pci))
        se = SyncEvent()
        stack.callback(se.close)
        se.add_publisher_location_dpu()
        se.add_subscriber_location_cpu(dev)
        ops = _Ops(se, None, args, "DPU")
        ops.start(dev.pe)
        _say("Connecting to DPU")
        chan = stack.enter_context(
            ComchEndpoint.connect(dev, args.service, timeout=args.timeout, secret_file=None)
        )
        stack.callback(se.stop)  # stopped before the channel closes and the device goes
        ops.attach(chan)
        _say("Connection to DPU has been established")
        blob = se.export_to_dpu(dev)
        _say("Sending exported DOCA Sync Event to DPU")
        chan.send(blob, fds=(se.export_fd,), timeout=args.timeout)
        _say("Exported DOCA Sync Event has been sent to DPU successfully")
        _say("Signaling sync event for DPU")
        ops.signal(args.atomic, 1)
        _say("Waiting for sync event to be signaled from DPU")
        ops.wait_gt(1)
        _say("Done")
    return 0


def _dpu(args: argparse.Namespace) -> int:
    pci, rep = _check(args, dpu=True)
    with doca_timeouts(), Unwind() as stack:
        dev = stack.enter_context(open_dev(pci))
        log.info("DPU side: device %s, representor %s (emulated)", dev.name, rep)
        _say("Listening to host")
        chan = stack.enter_context(
            ComchEndpoint.accept(dev, args.service, timeout=args.timeout, secret_file=None)
        )
        blob, fds = chan.recv_fds(args.timeout)
        stack.callback(_close_all, fds)
        if len(fds) > 1:
            raise CliError(f"protocol error: the host sent {len(fds)} file descriptors with its export")
        _say("Received blob from host")
        se = SyncEvent.create_from_export(dev, blob, fds[0] if fds else None)
        stack.callback(se.close)
        ops = _Ops(se, chan, args, "host")
        ops.start(dev.pe)
        stack.callback(se.stop)
        _say("Waiting for sync event to be signaled from host")
        ops.wait_gt(0)
        _say("Signaling sync event for host")
        ops.signal(args.atomic, 2)
        _say("Done")
    return 0


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _flags(p: argparse.ArgumentParser, *, dpu: bool) -> None:
    p.add_argument("-d", "--pci-addr", metavar="PCI", help="Device PCI address (mandatory)")
    if dpu:
        p.add_argument("-r", "--rep-pci", metavar="PCI", help="DPU representor PCI address (mandatory)")
    p.add_argument(
        "--async", dest="async_mode", action="store_true",
        help="Start DOCA Sync Event in asynchronous mode (synchronous mode by default)",
    )  # fmt: skip
    p.add_argument(
        "--async_num_tasks", type=int, default=1, metavar="N", help="Async num tasks for asynchronous mode"
    )
    p.add_argument(
        "--atomic", action="store_true",
        help="Update DOCA Sync Event using Add operation (Set operation by default)",
    )  # fmt: skip
    add_service(p, DEFAULT_SERVICE)
    add_general_flags(p)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sync-event-host", help="DOCA Sync Event sample, host side: export a sync event to the DPU"
    )
    _flags(p, dpu=False)
    p.set_defaults(handler=run(p, _host))
    p = subparsers.add_parser(
        "sync-event-dpu", help="DOCA Sync Event sample, DPU side: signal the host's sync event"
    )
    _flags(p, dpu=True)
    p.set_defaults(handler=run(p, _dpu))
