"""A REJ, DREQ or DREP must name both communication IDs of a connection.

Linux ``cm.c`` finds the connection a REJ is for by both IDs
(``cm_acquire_rejected_id``, ``cm_acquire_id``); only a REJ of a REQ, sent
before the passive side had an ID, names ours alone. A forged REJ that
knows our 32-bit ID but not the peer's, from the peer's own address, no
longer ends a connection: the forger must guess 64 bits, not 32.
"""

import time

from rdmakit.engine.cm import CmState
from rdmakit.wire import ROCE_UDP_PORT
from rdmakit.wire.cm import CmAttr, CmMad, RejReason
from tests.security.round3.cm_peers import Side, connect, exchange, mad_datagram


def test_messages_that_know_only_our_id_do_not_end_a_connection(sides: tuple[Side, Side]) -> None:
    a, b = sides
    qa, qb, ha, hb = connect(a, b)
    b.events.clear()
    spoofed, dst = (a.dev.ip, ROCE_UDP_PORT), (b.dev.ip, ROCE_UDP_PORT)
    for wrong in (ha ^ 1, ha ^ 0x8000_0000, 0):
        ids = {"local_comm_id": wrong, "remote_comm_id": hb}
        for mad in (
            CmMad(CmAttr.REJ, 1, {**ids, "reason": RejReason.CONSUMER_DEFINED, "message_rejected": 2}),
            CmMad(CmAttr.DREQ, 2, {**ids, "remote_qpn": qb.qpn}),
            CmMad(CmAttr.DREP, 3, ids),
        ):
            b.dev.receive_datagram(mad_datagram(mad, spoofed, dst), spoofed, time.monotonic())
    b.pump()
    assert b.cm.cm.state(hb) is CmState.ESTABLISHED
    assert [e.kind for e in b.events] == []
    assert b.cm.cm.stats["wrong_remote_comm_id"] == 9
    exchange(a, b, qa, qb)  # the connection still carries data
    exchange(b, a, qb, qa, base=0x80_0000)
