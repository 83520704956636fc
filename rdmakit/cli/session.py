"""One side of an RDMA program: what every DOCA RDMA sample allocates.

As ``rdma_common.c`` ``allocate_rdma_resources`` does: open the device, create
the RDMA context with its permissions and a work queue, a buffer inventory,
and memory maps on demand. `Session.run` submits jobs and waits for their
events on the work queue's event handle (event-driven mode), with a deadline.
"""

import contextlib
import ipaddress
import re
import time
from collections.abc import Callable, Iterable

from rdmakit.cli.errors import EXIT_USAGE, CliError
from rdmakit.doca import (
    AccessFlag,
    Buf,
    BufInventory,
    CtxState,
    Dev,
    DocaError,
    DocaErrorCode,
    Event,
    Job,
    Mmap,
    Rdma,
    RdmaAddr,
    RdmaConnection,
    WorkQ,
)
from rdmakit.transport.driver import wait_readable
from rdmakit.verbs import pyverbs_missing

#: How often a waiting side looks at its peer's status (seconds).
WATCH_PERIOD = 0.1


def _soft_spec(device: str) -> bool:
    """Whether ``device`` names a soft device (an address, ``tcp:``/``udp:`` ADDR), not a verbs one."""
    if device.startswith(("tcp:", "udp:")):
        return True
    try:
        ipaddress.ip_address(device)
    except ValueError:
        return False
    return True


#: What a verbs device's name looks like (``rxe0``, ``mlx5_0``, ``siw_eth0``): letters, then a number.
_VERBS_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*[0-9]")


def no_such_device(device: str) -> CliError:
    """The error for a device that did not open (a usage error): for a verbs device's name, why verbs
    may be missing; for an address, that it is not one of this machine's."""
    hint = ""
    if _soft_spec(device):
        hint = ": not an address of this machine"
    elif _VERBS_NAME.fullmatch(device):
        missing = pyverbs_missing()
        if missing is not None:
            hint = f"; verbs devices need pyverbs: {missing}"
    return CliError(f"no such device: {device!r} (see 'rdmakit devices'){hint}", EXIT_USAGE)


class ConnectionBroke(CliError):
    """A job failed because the connection went to the error state (the peer may say why)."""


def job_failed(what: str, error: DocaError | None) -> CliError:
    # SHUTDOWN: flushed, the connection is in error; TIME_OUT: the peer stopped answering.
    if error is not None and error.code in (DocaErrorCode.SHUTDOWN, DocaErrorCode.TIME_OUT):
        return ConnectionBroke(f"{what} failed: {error}")
    return CliError(f"{what} failed: {error}")


class Session:
    """A device, an `Rdma` context on an event-driven `WorkQ`, an inventory, mmaps."""

    def __init__(
        self, device: str, *, permissions: int, gid_index: int = 0, depth: int = 64, buffers: int = 64
    ) -> None:
        try:
            self.dev = Dev.open(device)
        except DocaError as e:
            if e.code is DocaErrorCode.NOT_FOUND:
                raise no_such_device(device) from e
            raise
        self.rdma = Rdma()
        self.rdma.add_dev(self.dev)
        self.rdma.set_permissions(permissions)
        if gid_index:
            self.rdma.set_gid_index(gid_index)
        self.wq = WorkQ(depth, event_driven=True)
        self.rdma.workq_add(self.wq)
        self.inv = BufInventory(buffers)
        self.inv.start()
        self.mmaps: list[Mmap] = []
        self._events: dict[int, Event] = {}
        #: Called while waiting (every WATCH_PERIOD): raises when the peer is known to have failed.
        self.watch: Callable[[], None] | None = None

    def mmap(self, memory: bytearray | memoryview, permissions: int) -> Mmap:
        m = Mmap()
        m.set_permissions(permissions)
        m.set_memrange(memory)
        m.add_dev(self.dev)
        m.start()
        self.mmaps.append(m)
        return m

    def import_mmap(self, descriptor: bytes) -> Mmap:
        m = Mmap.create_from_export(descriptor, self.dev)
        self.mmaps.append(m)
        return m

    def data(self, m: Mmap, offset: int, length: int) -> Buf:
        """A buffer whose data is ``length`` bytes at ``offset`` (a source)."""
        return self.inv.get_by_data(m, m.addr + offset, length)

    def room(self, m: Mmap, offset: int, length: int) -> Buf:
        """An empty buffer of ``length`` bytes at ``offset`` (a destination)."""
        return self.inv.get_by_addr(m, m.addr + offset, length)

    def start(self) -> bytes:
        """Start the context and return its connection descriptor."""
        self.rdma.start()
        return self.rdma.export()

    def submit(self, job: Job) -> None:
        self.wq.submit(job)

    def wait(self, jobs: Iterable[Job], timeout: float, what: str) -> list[Event]:
        """The events of ``jobs`` (in order), or CliError after ``timeout`` seconds."""
        jobs = list(jobs)
        want = {id(j) for j in jobs}
        events = self._events
        deadline = time.monotonic() + timeout
        while not want <= events.keys():
            while (ev := self.wq.progress_retrieve()) is not None:
                events[id(ev.job)] = ev
            if want <= events.keys():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise CliError(f"timed out after {timeout:g} s waiting for {what}", status=3)
            if self.watch is not None:
                try:
                    self.watch()
                except CliError:
                    # What the peer did before it failed may have arrived meanwhile (an ACK, a NAK).
                    while (ev := self.wq.progress_retrieve()) is not None:
                        events[id(ev.job)] = ev
                    if not want <= events.keys():
                        raise
                    break
            self.wq.arm()
            if wait_readable(self.wq.fileno(), min(left, WATCH_PERIOD)):
                self.wq.clear()
        return [events.pop(id(j)) for j in jobs]

    def run(self, job: Job, timeout: float, what: str) -> Event:
        """Submit ``job`` and wait for its event; a failed job is a CliError naming ``what``."""
        self.submit(job)
        ev = self.wait([job], timeout, what)[0]
        if not ev.ok:
            raise job_failed(what, ev.error)
        return ev

    # -- connecting by address (DOCA 2.9 samples' -cm) ------------------------------------------

    def enable_cm(self) -> None:
        """Set the connection callbacks (``doca_rdma_set_connection_state_callbacks``); before start."""
        self._cm_state: dict[str, object] = {}
        state = self._cm_state

        def request(conn: RdmaConnection, ud: object) -> None:
            if "conn" in state:
                conn.reject()
                return
            state["conn"] = conn
            conn.accept()

        def established(conn: RdmaConnection, conn_ud: object, ud: object) -> None:
            state["established"] = conn

        def failure(conn: RdmaConnection, conn_ud: object, ud: object) -> None:
            state["failed"] = str(self.rdma.error or "the connection failed")

        def disconnect(conn: RdmaConnection, conn_ud: object, ud: object) -> None:
            state["disconnected"] = True

        self.rdma.set_connection_state_callbacks(request, established, failure, disconnect)

    def pump(self) -> None:
        """Progress the context once (connection callbacks run here)."""
        while (ev := self.wq.progress_retrieve()) is not None:
            self._events[id(ev.job)] = ev

    def wait_running(self, timeout: float) -> None:
        """Progress until the context is RUNNING, after ``connect``.

        On a progress engine the context is STARTING until progress moves it (``doca_rdma.h``,
        doca_rdma_connect); on a WorkQ it is RUNNING already.
        """
        deadline = time.monotonic() + timeout
        while self.rdma.state is CtxState.STARTING:
            self.pump()
            if time.monotonic() > deadline:
                raise CliError(f"timed out after {timeout:g} s waiting for the connection", status=3)

    def cm_connect(self, server: str | None, port: int, timeout: float) -> None:
        """Connect to `server`:`port` by address, or listen on `port` for one client; until established."""
        state = self._cm_state
        deadline = time.monotonic() + timeout

        def begin() -> None:
            try:
                if server is not None:
                    self.rdma.connect_to_addr(RdmaAddr(server, port))
                else:
                    self.rdma.start_listen_to_port(port)
            except DocaError as e:
                raise CliError(f"rdma_cm: {e}") from e

        begin()
        while "established" not in state:
            self.pump()
            if "failed" in state:
                # The server may not listen yet: the samples start in either order, so a client
                # tries again until --timeout, as it waits for a descriptor file.
                if "no listener" in str(state["failed"]) and time.monotonic() + 0.2 < deadline:
                    del state["failed"]
                    time.sleep(0.2)
                    begin()
                    continue
                raise CliError(f"rdma_cm: {state['failed']}")
            if time.monotonic() > deadline:
                what = f"the connection to {server}:{port}" if server else f"a client on port {port}"
                raise CliError(f"timed out after {timeout:g} s waiting for {what}", status=3)
            time.sleep(0.0005)

    def close(self) -> None:
        """Children before parents: context, work queue, mmaps, inventory, device."""
        steps = [self.rdma.close, self.wq.close, *(m.destroy for m in reversed(self.mmaps)), self.inv.destroy]
        for step in steps:
            with contextlib.suppress(DocaError):
                step()
        self.dev.close_all()  # teardown on every exit: whatever the steps above left

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


ALL_REMOTE = AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC
