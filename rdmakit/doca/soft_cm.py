"""`BackendCm` of soft RoCE-UDP devices: ``rdma_cm`` over the device's own QP1.

One connection manager per soft device (``rdmakit.transport.cma.RdmaCm``),
shared by every `SoftBackendDevice` opened on its address, as the device
is. The device's pump runs the CM's timers and QP1's I/O; `poll_events`
turns its events into `CmEvent` s after the QP transitions they imply. A
connection that is not established within its `connect` timeout is dropped
and reported UNREACHABLE. The TCP transport has no QP1: its devices have no
connection manager (NOT_SUPPORTED).
"""

import contextlib
import time
import weakref
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv6Address, ip_address

from rdmakit.doca._soft_pump import bell_of
from rdmakit.doca.backend import BackendQP, CmEvent, CmEventKind
from rdmakit.doca.errors import DocaError, DocaErrorCode, error_from_engine
from rdmakit.engine import EngineError, QueuePair
from rdmakit.transport.cma import MAX_ACCEPT_PRIVATE, MAX_CONNECT_PRIVATE, CmaEventKind, RdmaCm
from rdmakit.transport.connect import ConnectOptions
from rdmakit.transport.device import SoftDevice

__all__ = ["SoftBackendCm", "soft_cm"]

_KINDS = {
    CmaEventKind.CONNECT_REQUEST: CmEventKind.CONNECT_REQUEST,
    CmaEventKind.ESTABLISHED: CmEventKind.ESTABLISHED,
    CmaEventKind.REJECTED: CmEventKind.REJECTED,
    CmaEventKind.UNREACHABLE: CmEventKind.UNREACHABLE,
    CmaEventKind.DISCONNECTED: CmEventKind.DISCONNECTED,
}
_REASONS = {8: "no listener on that port (REJ: invalid service ID)", 28: "the peer rejected the connection"}
_cms: "weakref.WeakKeyDictionary[SoftDevice, SoftBackendCm]" = weakref.WeakKeyDictionary()


def soft_cm(dev: SoftDevice) -> "SoftBackendCm":
    """The connection manager of `dev`, made at the first call."""
    cm = _cms.get(dev)
    if cm is None:
        if dev.udp_port is None:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"{dev.name}: the TCP transport has no QP1, so no connection manager",
            )
        cm = _cms[dev] = SoftBackendCm(dev)
    return cm


def _engine_qp(dev: SoftDevice, qp: BackendQP) -> QueuePair:
    """The device's own engine QP behind `qp`, found by number: a QP of another device is refused."""
    for engine in dev.qps:
        if engine.qpn == qp.qpn:
            return engine
    raise DocaError(DocaErrorCode.INVALID_VALUE, f"QP {qp.qpn:#x} is not one of {dev.name}'s")


def _options(qp: BackendQP) -> ConnectOptions:
    """`qp`'s RTR/RTS attributes (its `connect_attrs`) for the CM's REQ or REP and transitions."""
    a = qp.connect_attrs
    return ConnectOptions(
        max_rd_atomic=a.max_rd_atomic, max_dest_rd_atomic=a.max_dest_rd_atomic, min_rnr_timer=a.min_rnr_timer,
        timeout=a.timeout, retry_cnt=a.retry_cnt, rnr_retry=a.rnr_retry,
    )  # fmt: skip


class SoftBackendCm:
    """`BackendCm` over a soft device's `RdmaCm`."""

    def __init__(self, dev: SoftDevice) -> None:
        self.dev = dev
        self.cma = RdmaCm(dev)
        self._ports: set[int] = set()
        self._deadlines: dict[int, float] = {}  # active handles not yet established -> when they give up
        self._closed = False

    def _check(self) -> None:
        if self._closed or self.dev.closed:
            raise DocaError(DocaErrorCode.BAD_STATE, f"{self.dev.name}'s connection manager is closed")

    def listen(self, port: int) -> None:
        with bell_of(self.dev):
            self._check()
            if type(port) is not int or not 0 < port <= 0xFFFF:
                raise DocaError(DocaErrorCode.INVALID_VALUE, f"port {port!r} is not a port number")
            if port in self._ports:
                raise DocaError(DocaErrorCode.IN_USE, f"{self.dev.name} already listens on port {port}")
            self._ports.add(port)
            self.cma.listen(port)

    def stop_listen(self, port: int) -> None:
        with bell_of(self.dev):
            if port in self._ports:
                self._ports.discard(port)
                self.cma.unlisten(port)

    def connect(
        self, qp: BackendQP, addr: IPv4Address | IPv6Address, port: int, private_data: bytes, timeout: float
    ) -> int:
        with bell_of(self.dev):
            self._check()
            if len(private_data) > MAX_CONNECT_PRIVATE:
                raise DocaError(
                    DocaErrorCode.INVALID_VALUE,
                    f"connect private data is at most {MAX_CONNECT_PRIVATE} bytes",
                )
            if type(port) is not int or not 0 < port <= 0xFFFF:
                raise DocaError(DocaErrorCode.INVALID_VALUE, f"port {port!r} is not a port number")
            now = time.monotonic()
            try:
                handle = self.cma.connect(
                    str(ip_address(addr)), port, _engine_qp(self.dev, qp), now, private_data=private_data,
                    options=_options(qp),
                )  # fmt: skip
            except EngineError as e:
                raise error_from_engine(e) from e
            self._deadlines[handle] = now + timeout
            return handle

    def accept(self, conn: int, qp: BackendQP, private_data: bytes) -> None:
        with bell_of(self.dev):
            self._check()
            if len(private_data) > MAX_ACCEPT_PRIVATE:
                raise DocaError(
                    DocaErrorCode.INVALID_VALUE, f"accept private data is at most {MAX_ACCEPT_PRIVATE} bytes"
                )
            try:
                self.cma.accept(
                    conn, _engine_qp(self.dev, qp), time.monotonic(), private_data=private_data,
                    options=_options(qp),
                )  # fmt: skip
            except EngineError as e:
                raise error_from_engine(e) from e

    def reject(self, conn: int, private_data: bytes) -> None:
        with bell_of(self.dev):
            try:
                self.cma.reject(conn, time.monotonic(), private_data=private_data)
            except EngineError as e:
                raise error_from_engine(e) from e

    def disconnect(self, conn: int) -> None:
        with bell_of(self.dev), contextlib.suppress(EngineError):  # gone already: idempotent
            self.cma.disconnect(conn, time.monotonic())

    def poll_events(self) -> Sequence[CmEvent]:
        with bell_of(self.dev):
            if self._closed:
                return ()
            now = time.monotonic()
            out: list[CmEvent] = []
            for handle, deadline in list(self._deadlines.items()):
                if now > deadline:
                    del self._deadlines[handle]
                    self.cma.cm.destroy(handle)
                    gone = CmEvent(kind=CmEventKind.UNREACHABLE, conn=handle, detail="connection timed out")
                    out.append(gone)
            while (ev := self.cma.poll_event(now)) is not None:
                if ev.kind is not CmaEventKind.CONNECT_REQUEST:
                    self._deadlines.pop(ev.conn, None)
                if ev.kind is CmaEventKind.UNREACHABLE:
                    detail = "no answer from the peer's connection manager"
                else:
                    detail = _REASONS.get(ev.reason or 0, f"REJ reason {ev.reason}" if ev.reason else "")
                peer_port = ev.peer_port if ev.kind is CmaEventKind.CONNECT_REQUEST else 0
                out.append(
                    CmEvent(
                        kind=_KINDS[ev.kind],
                        conn=ev.conn,
                        private_data=ev.private_data,
                        reason=ev.reason,
                        peer=(ip_address(ev.peer_ip), peer_port),
                        local_port=ev.listen_port,
                        detail=detail,
                        peer_guid=ev.peer_guid,
                    )
                )
            return out

    def close(self) -> None:
        with bell_of(self.dev):
            if self._closed:
                return
            self._closed = True
            for port in list(self._ports):
                self.stop_listen(port)
