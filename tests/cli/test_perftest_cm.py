"""``rdmakit perftest -R`` / ``-z``: the exchange and the QPs over RDMA CM, between two rdmakit processes.

The server listens with ``rdma_cm`` on its soft device's address and the
exchange's port; the client connects to that address (no TCP anywhere).
The key message's binary layout is checked against ctypes' layout of
perftest's ``struct pingpong_dest`` (the C compiler's padding rules), and a
hostile peer's wrongly sized message ends the server with one line.
"""

import ctypes
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from ipaddress import IPv6Address

import pytest

from rdmakit.cli import bench_qp
from rdmakit.cli.bench_qp import open_device
from rdmakit.cli.errors import CliError
from rdmakit.cli.oob_messages import OobFormatError, PerftestDest
from rdmakit.cli.perftest_cm import KEY_BIN_LEN, CmLink, CmQps, connect_retrying, decode_dest, encode_dest
from rdmakit.engine import SGE, CompletionQueue, SendWR, WrOpcode
from rdmakit.engine.types import Access
from rdmakit.transport.cma import CmaEventKind, RdmaCm
from rdmakit.transport.device import SoftDevice
from tests.cli.perftest_output import parse_perftest
from tests.cli.test_perftest import expected_size, finish, free_port, rdmakit


class Gid(ctypes.BigEndianStructure):
    _fields_ = [("raw", ctypes.c_uint8 * 16)]


class PingpongDest(ctypes.BigEndianStructure):
    """perftest_resources.h, as ``rdma_write_keys`` sends it (HAVE_ENDIAN: big-endian fields)."""

    _fields_ = [
        ("lid", ctypes.c_int),
        ("out_reads", ctypes.c_int),
        ("qpn", ctypes.c_int),
        ("psn", ctypes.c_int),
        ("rkey", ctypes.c_uint),
        ("vaddr", ctypes.c_ulonglong),
        ("gid", Gid),
        ("srqn", ctypes.c_uint),
        ("gid_index", ctypes.c_int),
    ]


def test_key_layout_is_perftests() -> None:
    assert ctypes.sizeof(PingpongDest) == KEY_BIN_LEN
    d = PerftestDest(
        lid=0, out_reads=16, qpn=0x12345, psn=0xABCDE, rkey=0xDEADBEEF, vaddr=0x7F0012345000,
        gid=IPv6Address("::ffff:10.77.0.1"), srqn=0,
    )  # fmt: skip
    c = PingpongDest.from_buffer_copy(encode_dest(d, gid_index=1))
    fields = (c.lid, c.out_reads, c.qpn, c.psn, c.rkey, c.vaddr)
    assert fields == (0, 16, 0x12345, 0xABCDE, 0xDEADBEEF, d.vaddr)
    assert bytes(c.gid.raw) == d.gid.packed
    assert c.gid_index == 1
    assert decode_dest(bytes(c)) == d
    c.qpn = 1 << 24  # a QPN has 24 bits
    with pytest.raises(OobFormatError, match="QPN"):
        decode_dest(bytes(c))
    with pytest.raises(OobFormatError, match="55 bytes"):
        decode_dest(bytes(c)[:55])


def run_cm_pair(
    new_ip: Callable[[], str], test: str, flags: list[str]
) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    port = str(free_port())
    server_ip, client_ip = new_ip(), new_ip()
    server = rdmakit("perftest", test, "-d", server_ip, "-p", port, *flags)
    client = rdmakit("perftest", test, "-d", client_ip, "-p", port, *flags, server_ip)
    c = finish(client)
    s = finish(server)
    return s, c


TESTS = [f"ib_{verb}_{kind}" for kind in ("bw", "lat") for verb in ("write", "read", "send", "atomic")]
CASES = [(t, ["-R", "-n", "20"]) for t in TESTS] + [
    ("ib_write_bw", ["-R", "-n", "10", "-q", "3"]),
    ("ib_send_bw", ["-R", "-n", "10", "-q", "2", "-s", "5000"]),
    ("ib_read_bw", ["-R", "-n", "10", "-b"]),
    ("ib_write_bw", ["-z", "-n", "10"]),
    ("ib_send_lat", ["-z", "-n", "10", "-s", "3000"]),
]


@pytest.mark.parametrize(("test", "flags"), CASES, ids=[f"{t}{''.join(f)}" for t, f in CASES])
def test_perftest_over_rdma_cm(new_ip: Callable[[], str], test: str, flags: list[str]) -> None:
    (s_rc, s_out, s_err), (c_rc, c_out, c_err) = run_cm_pair(new_ip, test, flags)
    assert c_rc == 0, c_err
    assert s_rc == 0, s_err
    for out in (s_out, c_out):
        assert f" rdma_cm QPs\t : {'ON' if '-R' in flags else 'OFF'}" in out
        assert " Data ex. method : rdma_cm" in out
    if "-R" in flags:
        assert "Waiting for client rdma_cm QP to connect" in s_out
    kind, c_rows = parse_perftest(c_out)
    assert kind == ("bw" if test.endswith("_bw") else "lat")
    nq = int(flags[flags.index("-q") + 1]) if "-q" in flags else 1
    iters = int(flags[flags.index("-n") + 1]) * (nq if kind == "bw" else 1)
    assert [(r.size, r.iters) for r in c_rows] == [(expected_size(test, flags), iters)]
    assert c_rows[0].values[1 if kind == "bw" else 0] > 0
    # The key messages crossed the RDMA CM exchange: each side prints the other's QPs.
    local = re.findall(r" local address: LID \S+ QPN (0x[0-9a-f]+)", c_out)
    remote = re.findall(r" remote address: LID \S+ QPN (0x[0-9a-f]+)", s_out)
    assert len(local) == nq
    assert local == remote


def test_client_to_a_port_nobody_listens_on(new_ip: Callable[[], str]) -> None:
    """The peer's CM answers REJ "no listener": the client retries while it does, then ends with one line."""
    server_ip, port = new_ip(), free_port()
    server = rdmakit("perftest", "ib_write_bw", "-R", "-d", server_ip, "-p", str(port))
    try:
        time.sleep(1.0)  # its CM is up, listening on `port` alone
        env = {"RDMAKIT_OOB_TIMEOUT": "1.5"}
        other = str(port + 1)
        client = rdmakit("perftest", "ib_write_bw", "-R", "-d", new_ip(), "-p", other, server_ip, env=env)
        rc, _, err = finish(client)
    finally:
        server.kill()
        server.communicate()
    assert rc != 0
    assert len(err.strip().splitlines()) == 1, err
    assert "no listener" in err


def test_client_to_an_address_without_rdma(new_ip: Callable[[], str]) -> None:
    """Nothing answers the REQ: one line once the connection times out."""
    env = {"RDMAKIT_OOB_TIMEOUT": "1.5"}
    port = str(free_port())
    client = rdmakit("perftest", "ib_write_bw", "-R", "-d", new_ip(), "-p", port, new_ip(), env=env)
    rc, _, err = finish(client)
    assert rc != 0
    assert len(err.strip().splitlines()) == 1, err
    assert "UNREACHABLE" in err


def test_hostile_message_size(new_ip: Callable[[], str]) -> None:
    """A peer whose first message is not the 16-byte version ends the server with one line."""
    port = free_port()
    server_ip, peer_ip = new_ip(), new_ip()
    env = {"RDMAKIT_OOB_TIMEOUT": "20"}
    server = rdmakit("perftest", "ib_write_bw", "-R", "-d", server_ip, "-p", str(port), env=env)
    dev = SoftDevice(peer_ip)
    try:
        cm = RdmaCm(dev)
        cq = CompletionQueue(8)
        qp = dev.create_qp(send_cq=cq, recv_cq=cq)
        buf = bytearray(64)
        mr = dev.pd.register(buf, 0x1000, Access.LOCAL_WRITE)
        end = time.monotonic() + 30
        established = False
        while not established and time.monotonic() < end and server.poll() is None:
            conn = cm.connect(server_ip, port, qp, time.monotonic())
            while time.monotonic() < end:
                dev.progress(time.monotonic())
                ev = cm.poll_event(time.monotonic())
                if ev is None:
                    time.sleep(0.001)
                    continue
                assert ev.conn == conn
                established = ev.kind is CmaEventKind.ESTABLISHED
                break
            if not established:
                time.sleep(0.1)  # the server is not listening yet
        assert established
        qp.post_send(SendWR(wr_id=1, opcode=WrOpcode.SEND, sg_list=(SGE(0x1000, 3, mr.lkey),)))
        while server.poll() is None and time.monotonic() < end:
            dev.progress(time.monotonic())
            cm.poll_event(time.monotonic())
            time.sleep(0.001)
    finally:
        dev.close()
    rc, _, err = finish(server)
    assert rc != 0
    assert len(err.strip().splitlines()) == 1, err
    assert "a message of 3 bytes, expected 16" in err


@pytest.mark.skipif(sys.platform != "linux", reason="loopback addresses beyond 127.0.0.1 are Linux's")
def test_no_tcp_listener_with_rdma_cm(new_ip: Callable[[], str]) -> None:
    """-R's server listens on no TCP port: the exchange is RDMA CM's."""
    port = free_port()
    server = rdmakit("perftest", "ib_write_bw", "-R", "-d", new_ip(), "-p", str(port))
    try:
        time.sleep(1.0)
        ss = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=False)
        if ss.returncode != 0:
            pytest.skip("no ss here")
        assert ss.stdout.strip() == ""
    finally:
        server.kill()
        server.communicate()


def test_test_qps_are_connected_by_the_exchanges_peer_only(new_ip: Callable[[], str]) -> None:
    """While the server accepts the test's QPs, a request from any other address is rejected."""
    a_ip, b_ip, c_ip = new_ip(), new_ip(), new_ip()
    port = free_port()
    devs = [open_device(ip, None) for ip in (a_ip, b_ip, c_ip)]
    try:
        server, client, intruder = (CmLink(d, port, 20.0) for d in devs)
        server_qps = CmQps(server, [bench_qp.TestQp(devs[0], send_depth=1, recv_depth=1)])
        client_done = threading.Event()
        failed: list[BaseException] = []

        def serve(accept: Callable[[], None]) -> threading.Thread:
            def run() -> None:
                try:
                    accept()
                    server.wait(client_done.is_set, "the client")  # the REP leaves with the pump
                except BaseException as e:  # reported by the main thread
                    failed.append(e)

            t = threading.Thread(target=run)
            t.start()
            return t

        t = serve(lambda: server.accept(20.0))
        client.connect(a_ip)
        client.wait(lambda: server.conn is not None, "the server's accept")  # it waits for our RTU
        client_done.set()
        t.join()
        client_done.clear()
        t = serve(server_qps.accept)
        stranger = bench_qp.TestQp(devs[2], send_depth=1, recv_depth=1)
        with pytest.raises(CliError, match="REJECTED: the peer rejected the connection"):
            connect_retrying(intruder, stranger, a_ip, "the intruder")
        CmQps(client, [bench_qp.TestQp(devs[1], send_depth=1, recv_depth=1)]).connect(a_ip)
        client_done.set()
        t.join()
        assert failed == []
        assert len(server_qps.conns) == 1
    finally:
        for d in devs:
            d.close()
