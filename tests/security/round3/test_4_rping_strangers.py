"""A stranger's REQ neither ends nor takes over an ``rping -s`` run.

The server acts only on its own connection's events. A REQ from an address
where nobody answers (it will never send the RTU) does not keep the real
client out, and a REQ that arrives during a run gets REJ "consumer reject"
(28) at once instead of being left to time out, whose UNREACHABLE used to
end the server. The run goes on and every ping is validated (``-V``).
"""

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rdmakit.testing.cm_side import until
from rdmakit.transport.cma import CmaEventKind
from rdmakit.wire import ROCE_UDP_PORT
from rdmakit.wire.cm import CmAttr
from tests.cli.cli_util import finish, spawn, wait_until
from tests.security.round3.cm_peers import Side, Stranger, forged_req, mad_datagram

PINGS = 500
REJ_CONSUMER = 28


def test_strangers_requests_neither_end_nor_steal_a_run(new_ip: Callable[[], str], tmp_path: Path) -> None:
    server_ip, client_ip = new_ip(), new_ip()
    port = "7310"
    server = spawn("rping", "-s", "-a", server_ip, "-p", port)
    stray = Stranger(new_ip(), ROCE_UDP_PORT)
    intruder = Side(new_ip(), 5)
    out = tmp_path / "client.out"
    client = None
    try:
        # First a REQ whose sender never completes the handshake: the server accepts it (REP),
        # and no RTU ever comes. Until the server listens, its REJ "no listener" comes back.
        dst = (server_ip, ROCE_UDP_PORT)
        for comm_id in range(1, 200):
            req = forged_req(stray.addr[0], server_ip, comm_id, port=int(port))
            stray.send([mad_datagram(req, stray.addr, dst)], dst)
            reply = stray.recv_mad(1.0)
            if reply is not None and reply.attr is CmAttr.REP:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the server never answered a REQ with a REP")
        with out.open("w") as f:
            args = ("-c", "-a", server_ip, "-I", client_ip, "-p", port, "-C", str(PINGS), "-V", "-v")
            client = subprocess.Popen(
                [sys.executable, "-m", "rdmakit", "rping", *args], stdout=f, stderr=subprocess.PIPE, text=True
            )
            wait_until(lambda: out.read_text().count("\n") >= 5 or client.poll() is not None, 60, "pings")
            assert client.poll() is None, (client.communicate(), out.read_text()[-300:])
            # During the run, a real device asks for a connection of its own: refused at once.
            qp = intruder.qp()
            conn = intruder.cm.connect(server_ip, int(port), qp, time.monotonic())
            until((intruder,), lambda: any(e.conn == conn for e in intruder.events), 30)
            (ev,) = intruder.events
            assert (ev.kind, ev.reason) == (CmaEventKind.REJECTED, REJ_CONSUMER)
            assert server.poll() is None
            _, err = client.communicate(timeout=180)
            rc = client.returncode
        s_rc, _, s_err = finish(server, timeout=60)
    finally:
        for p in (server, client):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
        stray.close()
        intruder.close()
    assert (rc, s_rc) == (0, 0), (err, s_err)
    pings = out.read_text().splitlines()
    assert len(pings) == PINGS
    assert all(line.startswith(f"ping data: rdma-ping-{i}: ") for i, line in enumerate(pings))
