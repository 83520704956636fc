"""A REQ flood cannot fill the connection manager for others.

A REQ the application refuses used to stay in TIMEWAIT as long as the
REQ's own timeout fields asked (up to about 48 s with rdma_cm's settings),
so a few thousand REQs filled the 4,096 entries: a real client then got
REJ "no resources" and the device's own ``connect`` failed with FULL. Now a
refused REQ stays for our own ``timewait``, and one address holds at most
``max_timewait_per_peer`` TIMEWAIT and ``max_pending_per_peer`` pending
entries. Flooded from one address and from 64, the table stays small, and
a real client connects and moves data.
"""

import time
from collections.abc import Callable

from rdmakit.transport.cma import CmaEventKind
from rdmakit.wire import ROCE_UDP_PORT
from tests.security.round3.cm_peers import Side, connect, exchange, forged_req, mad_datagram

FLOOD = 4500  # more REQs than the CM has entries (4,096)
BATCH = 30  # REQs between two turns of the application (below the 64 pending in all)


def _flood(b: Side, senders: list[str], count: int) -> None:
    """`count` REQs with the longest timeouts a REQ can ask for; the application refuses each."""
    dst = (b.dev.ip, ROCE_UDP_PORT)
    for start in range(0, count, BATCH):
        now = time.monotonic()
        for i in range(start, min(start + BATCH, count)):
            ip = senders[i % len(senders)]
            req = forged_req(ip, b.dev.ip, 1 + i, qpn=1 + i, timeout_exponent=31, retries=15)
            b.dev.receive_datagram(mad_datagram(req, (ip, ROCE_UDP_PORT), dst), (ip, ROCE_UDP_PORT), now)
        b.pump()
        for ev in b.events:
            if ev.kind is CmaEventKind.CONNECT_REQUEST and ev.peer_ip in senders:
                b.cm.reject(ev.conn, time.monotonic())
        b.events.clear()


def test_a_req_flood_leaves_room_for_a_real_client(new_ip: Callable[[], str]) -> None:
    a, b, c = Side(new_ip(), 1), Side(new_ip(), 2, timeout_exponent=None), Side(new_ip(), 3)
    try:
        b.cm.listen(7174)
        c.cm.listen(7174)
        cm = b.cm.cm
        _flood(b, [new_ip()], FLOOD)
        qa, qb, _, _ = connect(a, b)  # a real client connects...
        exchange(a, b, qa, qb)
        assert len(cm._conns) <= 1 + cm.max_timewait_per_peer + cm.max_pending_per_peer
        senders = [new_ip() for _ in range(64)]
        _flood(b, senders, FLOOD)
        qb2, qc, _, _ = connect(b, c)  # ...and so does the flooded device itself
        exchange(b, c, qb2, qc)
        # At most each sender's TIMEWAIT share, besides the two real connections.
        assert len(cm._conns) <= len(senders) * cm.max_timewait_per_peer + 2 < cm.max_connections
    finally:
        for s in (a, b, c):
            s.close()
