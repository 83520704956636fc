"""The host side of tests/lab/test_cm_interop.py: rdmakit's rdma_cm on a soft device.

Usage:
    cm_host.py ADDR client PEER PORT     connect, SEND 16 bytes, receive 16, disconnect (rdma_client's dance)
    cm_host.py ADDR server PORT          listen, accept, receive 16 bytes, SEND 16, until the peer disconnects
    cm_host.py ADDR refused PEER PORT    connect where nothing listens: expect REJ reason 8

Prints ``EVENT {json}`` for each connection event and ``RESULT {json}`` last; exits 0 when the
dance completed, 1 otherwise (with the reason on stderr).
"""

import json
import sys
import time
from collections.abc import Callable

from rdmakit.engine import SGE, Access, CompletionQueue, RecvWR, SendWR, WcStatus, WrOpcode
from rdmakit.transport.cma import CmaEvent, CmaEventKind, RdmaCm
from rdmakit.transport.device import SoftDevice

MSG = 16
LIMIT = 120.0


def _log(ev: CmaEvent) -> None:
    info = {"kind": ev.kind.name, "peer": ev.peer_ip, "reason": ev.reason, "port": ev.listen_port}
    print("EVENT " + json.dumps(info), flush=True)


def main(argv: list[str]) -> int:
    addr, mode, *rest = argv
    dev = SoftDevice(addr)
    cm = RdmaCm(dev, mtu=1024, timeout_exponent=18, max_retries=8)  # rxe's MTU behind a 1500-byte link
    cq = CompletionQueue(16)
    send_buf, recv_buf = bytearray(b"rdmakit says hi"[:MSG].ljust(MSG, b"\0")), bytearray(MSG)
    smr = dev.pd.register(send_buf, 0x1000, Access.LOCAL_WRITE)
    rmr = dev.pd.register(recv_buf, 0x2000, Access.LOCAL_WRITE)
    end = time.monotonic() + LIMIT
    events: list[CmaEvent] = []
    done: list[WcStatus] = []

    def pump_until(pred: Callable[[], bool], within: float | None = None) -> bool:
        stop = end if within is None else min(end, time.monotonic() + within)
        while not pred():
            now = time.monotonic()
            if now > stop:
                return False
            dev.progress(now)
            while (ev := cm.poll_event(now)) is not None:
                _log(ev)
                events.append(ev)
            done.extend(wc.status for wc in cq.poll(4))
            time.sleep(0.0002)
        return True

    def kinds() -> list[CmaEventKind]:
        return [e.kind for e in events]

    def fail(why: str) -> int:
        print(f"cm_host: {why}; events {[k.name for k in kinds()]}", file=sys.stderr)
        return 1

    try:
        if mode == "refused":
            peer, port = rest[0], int(rest[1])
            qp = dev.create_qp(send_cq=cq, recv_cq=cq)
            cm.connect(peer, port, qp, time.monotonic())
            if not pump_until(lambda: any(k is not CmaEventKind.CONNECT_REQUEST for k in kinds())):
                return fail("no answer")
            ev = events[-1]
            print("RESULT " + json.dumps({"kind": ev.kind.name, "reason": ev.reason}), flush=True)
            return 0 if ev.kind is CmaEventKind.REJECTED and ev.reason == 8 else fail("not REJ reason 8")
        if mode == "client":
            peer, port = rest[0], int(rest[1])
            qp = dev.create_qp(send_cq=cq, recv_cq=cq)
            handle = cm.connect(peer, port, qp, time.monotonic())
            qp.post_recv(RecvWR(wr_id=1, sg_list=(SGE(0x2000, MSG, rmr.lkey),)))
            if not pump_until(lambda: bool(events)) or events[-1].kind is not CmaEventKind.ESTABLISHED:
                return fail("not established")
            qp.post_send(SendWR(wr_id=2, opcode=WrOpcode.SEND, sg_list=(SGE(0x1000, MSG, smr.lkey),)))
            if not pump_until(lambda: len(done) >= 2):
                return fail("the messages did not cross")
            if done != [WcStatus.SUCCESS] * 2:
                return fail(f"completions {done}")
            # rdma_server disconnects after its send completes; otherwise we do.
            if not pump_until(lambda: CmaEventKind.DISCONNECTED in kinds(), within=20):
                cm.disconnect(handle, time.monotonic())
                if not pump_until(lambda: CmaEventKind.DISCONNECTED in kinds()):
                    return fail("no DREP")
        elif mode == "server":
            port = int(rest[0])
            cm.listen(port)
            if not pump_until(lambda: bool(events)) or events[-1].kind is not CmaEventKind.CONNECT_REQUEST:
                return fail("no connection request")
            qp = dev.create_qp(send_cq=cq, recv_cq=cq)
            cm.accept(events[-1].conn, qp, time.monotonic())
            qp.post_recv(RecvWR(wr_id=1, sg_list=(SGE(0x2000, MSG, rmr.lkey),)))
            if not pump_until(lambda: len(done) >= 1):
                return fail("nothing received")
            qp.post_send(SendWR(wr_id=2, opcode=WrOpcode.SEND, sg_list=(SGE(0x1000, MSG, smr.lkey),)))
            if not pump_until(lambda: len(done) >= 2):
                return fail(f"completions {done}")
            # rdma_client disconnects once its receive completes: a DREQ that overtakes the ACK
            # of our SEND flushes it, and that SEND did arrive (the client's output shows it).
            flushed = done[1] is WcStatus.WR_FLUSH_ERR and CmaEventKind.DISCONNECTED in kinds()
            if done[0] is not WcStatus.SUCCESS or (done[1] is not WcStatus.SUCCESS and not flushed):
                return fail(f"completions {done}")
            if not pump_until(lambda: CmaEventKind.DISCONNECTED in kinds()):
                return fail("the client never disconnected")
        else:
            return fail(f"unknown mode {mode!r}")
        gsi = dev.gsi.counters.as_dict() if dev.gsi is not None else {}
        result = {"events": [k.name for k in kinds()], "received": recv_buf.hex(), "gsi": gsi}
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    finally:
        counters = dev.counters.as_dict()
        if dev.gsi is not None:
            counters.update({f"gsi_{k}": v for k, v in dev.gsi.counters.as_dict().items()})
        print("COUNTERS " + json.dumps(counters), file=sys.stderr, flush=True)
        dev.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
