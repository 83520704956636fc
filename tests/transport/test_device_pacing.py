"""A QP that its rate holds back (DCQCN, the congestion window's pacer) sets a deadline the
device must wake for: a pump that blocks on the device's descriptor sleeps until the
deadline ``progress`` last saw (``deadline_hint``)."""

from collections.abc import Callable

from rdmakit.engine import SGE, Access, CompletionQueue, SendWR, WrOpcode
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


def test_a_paced_qp_s_deadline_reaches_the_device(new_ip: Callable[[], str]) -> None:
    size = 1 << 20
    with SoftDevice(new_ip(), port=0) as a, SoftDevice(new_ip(), port=0) as b:
        cqa, cqb = CompletionQueue(16), CompletionQueue(16)
        qa = a.create_qp(send_cq=cqa, recv_cq=cqa)
        qb = b.create_qp(send_cq=cqb, recv_cq=cqb)
        ma, mb = bytearray(size), bytearray(size)
        mra = a.pd.register(ma, 0x1000, ALL)
        mrb = b.pd.register(mb, 0x9000, ALL)
        connect_qp(a, qa, 10, local_endpoint(b, qb, 20))
        connect_qp(b, qb, 20, local_endpoint(a, qa, 10))
        qa.cnp_received(1.0)  # DCQCN: nothing sent yet, so its least rate (10 Mbit/s)
        wr = SendWR(
            wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(mra.addr, size, mra.lkey),),
            remote_addr=mrb.addr, rkey=mrb.rkey,
        )  # fmt: skip
        qa.post_send(wr)
        assert a.progress(1.0)  # the first burst leaves
        sent = qa.stats.packets_out
        assert 0 < sent < size // 1024
        a.progress(1.0)  # nothing more may leave now: the QP is paced
        assert qa.stats.packets_out == sent
        paced_until = qa.get_timer()
        assert paced_until is not None
        assert 1.0 < paced_until < 1.1  # the pacer's deadline, long before the retransmit timer's
        assert a.deadline_hint() == paced_until
