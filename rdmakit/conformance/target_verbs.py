"""The target agent on a verbs device (kernel rxe, or any RoCE NIC), through ``rdmakit.verbs``.

The device's kernel or firmware runs the transport; the agent only creates,
modifies and destroys QPs with the attributes each case names
(``rdmakit.verbs.qp_modify``), registers memory, posts work requests and polls
the one completion queue of each QP, sorting what it finds into the send and
receive completions the tester asks for.
"""

from ipaddress import IPv6Address, ip_address
from typing import Any

from rdmakit.engine import Access, QpCaps, QpState, WcOpcode
from rdmakit.verbs import VerbsDevice, VerbsError
from rdmakit.verbs.device import VerbsQP
from rdmakit.verbs.qp_modify import modify_qp

from .target import Region, Remote, Target, _Qp

__all__ = ["VerbsTarget"]

_RECV = (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM)


class VerbsTarget(Target):
    """The agent's requests carried out by ``ibv_*`` calls on `dev`."""

    kind = "verbs"

    def __init__(self, dev: VerbsDevice) -> None:
        super().__init__()
        self.dev = dev
        self.device_errors = (*Target.device_errors, VerbsError)

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

    def _dev_register(self, length: int, access: Access, mid: int) -> Region:
        buf = bytearray(length)
        mr = self.dev.register(buf, access)
        return Region(mr.addr, length, mr.lkey, mr.rkey, memoryview(buf), (mr, buf))

    def _dev_deregister(self, region: Region) -> None:
        self.dev.deregister(region.handle[0])

    def _dev_poll(self, q: _Qp, n: int) -> None:
        for wc in q.qp.poll(2 * n):
            (q.recv if wc.opcode in _RECV else q.send).append(wc)
