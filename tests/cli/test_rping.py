"""``rdmakit rping`` on loopback: rping's ping loop over an rdma_cm connection (the lab runs it vs rping)."""

import select
import signal
import struct
import subprocess
import time
from collections.abc import Callable

import pytest

from rdmakit.engine import SGE, Access, CompletionQueue, SendWR, WcStatus, WrOpcode
from rdmakit.transport.cma import CmaEventKind, RdmaCm
from rdmakit.transport.device import SoftDevice
from tests.cli.cli_util import finish, run_once, spawn


def test_client_and_server_ping_and_validate(new_ip: Callable[[], str]) -> None:
    server_ip, client_ip = new_ip(), new_ip()
    server = spawn("rping", "-s", "-a", server_ip, "-v", "-p", "7300")
    try:
        time.sleep(0.8)
        client = ("rping", "-c", "-a", server_ip, "-I", client_ip, "-p", "7300", "-v", "-V", "-C", "5")
        rc, out, err = run_once(*client, timeout=120)
        s_rc, s_out, s_err = finish(server, timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert (rc, s_rc) == (0, 0), (out, err, s_out, s_err)
    pings = out.splitlines()
    assert len(pings) == 5
    head = "rdma-ping-0: "
    assert pings[0] == "ping data: " + head + "".join(chr(c) for c in range(65, 65 + 64 - 1 - len(head)))
    assert pings[1].startswith("ping data: rdma-ping-1: BCD")
    assert [line.removeprefix("server ") for line in s_out.splitlines()] == pings
    assert "client DISCONNECT EVENT..." in err
    assert "server DISCONNECT EVENT..." in s_err


def test_nobody_listening_is_one_line(new_ip: Callable[[], str]) -> None:
    """A device whose CM listens on no port: the client gets REJ reason 8 and says so in one line."""
    server_ip, client_ip = new_ip(), new_ip()
    with SoftDevice(server_ip) as dev:
        cm = RdmaCm(dev)
        client = spawn("rping", "-c", "-a", server_ip, "-I", client_ip, "-p", "7301", "-C", "1")
        end = time.monotonic() + 30
        while client.poll() is None and time.monotonic() < end:
            now = time.monotonic()
            dev.progress(now)
            cm.poll_event(now)
            time.sleep(0.001)
        rc, _, err = finish(client)
    assert rc == 1
    assert err == "rdmakit rping: cma event REJECTED, error 8: no listener (invalid service ID)"


def test_flags_are_checked() -> None:
    rc, _, err = run_once("rping", "-c", "-a", "127.0.0.1", "-S", "5")
    assert rc == 2
    assert "Invalid size 5" in err
    rc, _, err = run_once("rping", "-s")
    assert rc == 2
    assert err == "rdmakit rping: rping -s needs -a ADDR: the soft device's address to listen on"


def test_a_client_advertising_too_much_is_refused(new_ip: Callable[[], str]) -> None:
    """A hostile client names a buffer larger than the server's -S: one clear line, exit 1."""
    server_ip, client_ip = new_ip(), new_ip()
    server = spawn("rping", "-s", "-a", server_ip, "-p", "7302", "-S", "64")
    time.sleep(0.8)
    dev = SoftDevice(client_ip)
    try:
        cm = RdmaCm(dev, mtu=1024)
        cq = CompletionQueue(16)
        qp = dev.create_qp(send_cq=cq, recv_cq=cq)
        cm.connect(server_ip, 7302, qp, time.monotonic())
        info = bytearray(struct.pack(">QII", 0x1000, 0x1234, 1 << 20))  # 1 MiB: more than -S 64
        mr = dev.pd.register(info, 0x5000, Access.LOCAL_WRITE)
        end = time.monotonic() + 20
        sent = False
        while server.poll() is None and time.monotonic() < end:
            now = time.monotonic()
            dev.progress(now)
            ev = cm.poll_event(now)
            if ev is not None and ev.kind is CmaEventKind.ESTABLISHED and not sent:
                qp.post_send(SendWR(wr_id=1, opcode=WrOpcode.SEND, sg_list=(SGE(0x5000, 16, mr.lkey),)))
                sent = True
            for wc in cq.poll(4):
                assert wc.status is WcStatus.SUCCESS
            time.sleep(0.001)
        rc, _, err = finish(server)
    finally:
        dev.close()
    assert rc == 1
    assert (
        err.splitlines()[-1]
        == "rdmakit rping: the client advertised 1048576 bytes to read; this server's -S is 64"
    )


def _first_ping(client: subprocess.Popen[str]) -> str:
    """The client's first ``ping data:`` line (bounded: the test fails if none comes)."""
    assert client.stdout is not None
    ready, _, _ = select.select([client.stdout], [], [], 60)
    assert ready, "the client printed no ping"
    return client.stdout.readline()


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_server_disconnects_its_client(new_ip: Callable[[], str], signo: int) -> None:
    """A server stopped by a signal sends its DREQ on the way out, as the kernel does for rping:
    the client, pinging forever, ends with rping's own lines and status 0 instead of retrying."""
    server_ip, client_ip = new_ip(), new_ip()
    port = str(7303 + (signo == signal.SIGINT))
    server = spawn("rping", "-s", "-a", server_ip, "-p", port)
    client = None
    try:
        time.sleep(0.8)
        client = spawn("rping", "-c", "-a", server_ip, "-I", client_ip, "-p", port, "-v", "-C", "0")
        assert _first_ping(client).startswith("ping data: rdma-ping-0: ")
        server.send_signal(signo)
        stopped = time.monotonic()
        rc, _, err = finish(client, timeout=60)  # without the DREQ it would retry forever (retry_cnt 7)
        print(f"the client ended {time.monotonic() - stopped:.2f} s after the server's {signo!r}")
        s_rc, _, s_err = finish(server)
    finally:
        for p in (server, client):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    assert rc == 0, err
    lines = err.splitlines()
    assert lines[0] == "client DISCONNECT EVENT...", err
    assert lines[1] in ("wait for RDMA_WRITE_ADV state 10", "wait for RDMA_WRITE_COMPLETE state 10"), err
    assert s_rc == 128 + signo, s_err
