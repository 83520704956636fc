"""The target agent on a verbs device (kernel rxe, or any RoCE NIC), through ``rdmakit.verbs``.

The device's kernel or firmware runs the transport; the agent only creates,
modifies and destroys QPs with the attributes each case names
(``rdmakit.verbs.qp_modify``), registers memory, posts work requests and polls
the one completion queue of each QP, sorting what it finds into the send and
receive completions the tester asks for. Its connection manager is the
kernel's, through librdmacm (``rdmakit.verbs.cm``): made at the first
``cm_listen``, it accepts every request with a fresh QP, as the soft
target's does, and notes each event for ``cm_events``.
"""

from ipaddress import IPv6Address, ip_address
from typing import TYPE_CHECKING, Any

from rdmakit.engine import Access, QpCaps, QpState, WcOpcode
from rdmakit.verbs import VerbsDevice, VerbsError
from rdmakit.verbs.device import VerbsQP
from rdmakit.verbs.qp_modify import modify_qp, path_mig_state

from .target import CM_LOG_MAX, CM_QPS_MAX, Refused, Region, Remote, Target, _Qp

if TYPE_CHECKING:
    from rdmakit.verbs.cm import VerbsCm

__all__ = ["VerbsTarget"]

_RECV = (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM)


class VerbsTarget(Target):
    """The agent's requests carried out by ``ibv_*`` calls on `dev`."""

    kind = "verbs"

    def __init__(self, dev: VerbsDevice) -> None:
        super().__init__()
        self.dev = dev
        self.device_errors = (*Target.device_errors, VerbsError)
        self.cm: VerbsCm | None = None
        self._cm_log: list[dict[str, Any]] = []
        self._cm_qps: list[VerbsQP] = []

    def _dev_info(self) -> dict[str, Any]:
        gid = self.dev.gid
        ip = gid.ipv4_mapped or gid
        mtus = [m for m in (256, 512, 1024, 2048, 4096) if m <= self.dev.mtu]
        return {"device": self.dev.name, "ip": str(ip), "port": 4791, "mtus": mtus}

    def _dev_create_qp(self, caps: QpCaps) -> VerbsQP:
        return self.dev.create_qp(caps)

    def _dev_destroy_qp(self, qp: VerbsQP) -> None:
        qp.close()

    def _dev_modify(self, qp: VerbsQP, state: QpState, kw: dict[str, int], remote: Remote) -> None:
        dgid = None
        if remote is not None:
            try:
                addr = ip_address(remote[0])
            except ValueError:
                raise VerbsError("INVALID_VALUE", f"{remote[0][:64]!r} is not an IP address") from None
            dgid = IPv6Address(f"::ffff:{addr}") if addr.version == 4 else IPv6Address(int(addr))
        modify_qp(qp, state, kw, dgid=dgid)

    def _dev_state(self, qp: VerbsQP) -> QpState:
        return qp.state

    def _dev_stats(self, qp: VerbsQP) -> dict[str, Any]:
        return {"path_mig_state": path_mig_state(qp)}

    def _dev_register(self, length: int, access: Access, mid: int) -> Region:
        buf = bytearray(length)
        mr = self.dev.register(buf, access)
        return Region(mr.addr, length, mr.lkey, mr.rkey, memoryview(buf), (mr, buf))

    def _dev_deregister(self, region: Region) -> None:
        self.dev.deregister(region.handle[0])

    def _dev_poll(self, q: _Qp, n: int) -> None:
        for wc in q.qp.poll(2 * n):
            (q.recv if wc.opcode in _RECV else q.send).append(wc)

    def _dev_cm_listen(self, port: int) -> None:
        if self.cm is None:
            from rdmakit.verbs.cm import VerbsCm

            self.cm = VerbsCm(self.dev)
        self.cm.listen(port)

    def _dev_cm_unlisten(self, port: int) -> None:
        if self.cm is not None:
            self.cm.stop_listen(port)

    def _dev_cm_events(self) -> list[dict[str, Any]]:
        if self.cm is None:
            raise Refused("the agent listens on no port")
        self.progress()
        out, self._cm_log = self._cm_log, []
        return out

    def progress(self) -> None:
        """Accept every connection request with a fresh QP; note each event for `cm_events`."""
        cm = self.cm
        if cm is None:
            return
        for n in cm.poll():
            peer = str(n.peer[0]) if n.peer is not None else ""
            self._cm_log.append({"event": n.kind.name, "peer": peer, "reason": n.reason})
            if n.kind.name == "CONNECT_REQUEST" and len(self._cm_qps) < CM_QPS_MAX:
                qp = self.dev.create_qp(QpCaps())
                self._cm_qps.append(qp)
                try:
                    cm.accept(n.conn, qp, b"")
                except VerbsError as e:
                    self._cm_log.append({"event": "ACCEPT_FAILED", "detail": str(e)[:200]})
            del self._cm_log[:-CM_LOG_MAX]

    def fileno(self) -> int | None:
        return self.cm.fileno() if self.cm is not None else None
