"""``perftest -R`` binds its exchange to the client that connects, and its test QPs to that client.

The server used to take the first REQ for its exchange: one REQ from an
address where nothing listens took the slot, and the real client got "no
listener". Now each request is accepted with a QP of its own and the first
that becomes ESTABLISHED (its sender received our REP and answered) is the
exchange's. The test QPs' requests used to be checked by IP address alone;
now the requester's CA GUID must be the exchange client's too.
"""

import threading
import time
from collections.abc import Callable

from rdmakit.cli import bench_qp
from rdmakit.cli.bench_qp import open_device
from rdmakit.cli.perftest_cm import CmLink, CmQps
from rdmakit.doca.soft_cm import SoftBackendCm
from rdmakit.wire import ROCE_UDP_PORT
from rdmakit.wire.cm import CmAttr
from tests.cli.perftest_output import parse_perftest
from tests.cli.test_perftest import finish, free_port, rdmakit
from tests.security.round3.cm_peers import Stranger, forged_req, mad_datagram


def test_a_stray_request_does_not_take_the_exchange(new_ip: Callable[[], str]) -> None:
    server_ip, client_ip, port = new_ip(), new_ip(), free_port()
    stray = Stranger(new_ip(), ROCE_UDP_PORT)
    server = rdmakit("perftest", "ib_write_bw", "-R", "-n", "20", "-d", server_ip, "-p", str(port))
    try:
        dst = (server_ip, ROCE_UDP_PORT)
        for comm_id in range(1, 300):  # until the server listens and answers with a REP
            stray.send(
                [mad_datagram(forged_req(stray.addr[0], server_ip, comm_id, port=port), stray.addr, dst)], dst
            )
            reply = stray.recv_mad(1.0)
            if reply is not None and reply.attr is CmAttr.REP:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the server never accepted a request")
        client = rdmakit(
            "perftest", "ib_write_bw", "-R", "-n", "20", "-d", client_ip, "-p", str(port), server_ip
        )
        c_rc, c_out, c_err = finish(client)
        s_rc, _, s_err = finish(server)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
        stray.close()
    assert (c_rc, s_rc) == (0, 0), (c_err, s_err)
    _, rows = parse_perftest(c_out)
    assert [r.iters for r in rows] == [20]


def test_a_test_qp_request_from_the_clients_address_but_another_cm_is_refused(
    new_ip: Callable[[], str],
) -> None:
    a_ip, b_ip = new_ip(), new_ip()
    port = free_port()
    devs = [open_device(ip, None) for ip in (a_ip, b_ip)]
    forger = Stranger(b_ip)  # the client's address, another port: another connection manager
    try:
        server, client = (CmLink(d, port, 20.0) for d in devs)
        server_qps = CmQps(server, [bench_qp.TestQp(devs[0], send_depth=1, recv_depth=1)])
        done = threading.Event()
        failed: list[BaseException] = []

        def serve() -> None:
            try:
                server.accept(20.0)
                server_qps.accept()
                server.wait(done.is_set, "the client")
            except BaseException as e:  # reported by the main thread
                failed.append(e)

        t = threading.Thread(target=serve)
        t.start()
        client.connect(a_ip)
        cm = server.cm
        assert isinstance(cm, SoftBackendCm)
        # The exchange is up once the server listens again, for the test's QPs.
        client.wait(lambda: server.conn is not None and port in cm.cma._ports, "the server's second listen")
        req = forged_req(b_ip, a_ip, 0x4242, port=port, guid=0xBAD)
        # Queued on the server's socket before the client's own request, so decided first.
        forger.send([mad_datagram(req, forger.addr, (a_ip, ROCE_UDP_PORT))], (a_ip, ROCE_UDP_PORT))
        CmQps(client, [bench_qp.TestQp(devs[1], send_depth=1, recv_depth=1)]).connect(a_ip)
        done.set()
        t.join()
        assert failed == []
        assert len(server_qps.conns) == 1
    finally:
        done.set()
        forger.close()
        for d in devs:
            d.close()
