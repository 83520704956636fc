"""``conformance-target`` survives what a stranger sends its connection manager.

A REQ naming QP 0 used to reach ``accept``, whose ``EngineError`` nothing
caught: one unauthenticated datagram ended the agent. Now the CM refuses a
REQ naming QP 0 or 1 (REJ "unsupported request"), the agent catches engine
errors per event, a listen port out of range is refused, and a session's
listens end with it. The agent then still passes a tester's case.
"""

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rdmakit.conformance.control import TargetError
from rdmakit.testing.cm_side import until
from rdmakit.transport.cma import CmaEventKind
from rdmakit.wire import ROCE_UDP_PORT
from rdmakit.wire.cm import CmAttr, RejReason
from tests.conformance.agents import against, agent, results, write_secret
from tests.security.round3.cm_peers import Side, Stranger, control_session, forged_req, mad_datagram

PORT = 7400


def test_hostile_requests_and_a_finished_session_leave_the_agent_serving(
    tmp_path: Path, new_ip: Callable[[], str]
) -> None:
    secret = write_secret(tmp_path / "secret")
    dut = new_ip()
    stray = Stranger(new_ip(), ROCE_UDP_PORT)
    peer = Side(new_ip(), 9)
    try:
        with agent(dut, secret) as a:
            t = control_session(a.control, secret)
            t.call("cm_listen", port=PORT)
            dst = (dut, ROCE_UDP_PORT)
            for comm_id, qpn in ((11, 0), (12, 1)):
                req = forged_req(stray.addr[0], dut, comm_id, port=PORT, qpn=qpn)
                stray.send([mad_datagram(req, stray.addr, dst)], dst)
                rej = stray.recv_mad(10.0)
                assert rej is not None
                assert (rej.attr, rej["reason"], rej["remote_comm_id"]) == (
                    CmAttr.REJ, RejReason.UNSUPPORTED_REQ, comm_id
                )  # fmt: skip
            assert t.call("info")["kind"] == "soft"  # the agent is alive
            with pytest.raises(TargetError, match="port must be"):
                t.call("cm_listen", port=0x10000)
            qp = peer.qp()
            conn = peer.cm.connect(dut, PORT, qp, time.monotonic())  # a real peer is accepted
            until((peer,), lambda: any(e.conn == conn for e in peer.events))
            assert [e.kind for e in peer.events] == [CmaEventKind.ESTABLISHED]
            t.call("bye")
            t.close()
            # The session is over: its listen with it.
            req = forged_req(stray.addr[0], dut, 13, port=PORT, qpn=0x55)
            for _ in range(50):
                stray.send([mad_datagram(req, stray.addr, dst)], dst)
                rej = stray.recv_mad(1.0)
                if rej is not None and rej.attr is CmAttr.REJ:
                    break
            assert rej is not None
            assert (rej.attr, rej["reason"]) == (CmAttr.REJ, RejReason.INVALID_SERVICE_ID)
            good = against(a, new_ip(), "-k", "resp.send.only", "--json-out", "-")
            assert good.returncode == 0, good.stderr
            assert results(json.loads(good.stdout)) == {"resp.send.only": "PASS"}
    finally:
        stray.close()
        peer.close()
