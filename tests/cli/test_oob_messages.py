"""The out-of-band messages of ibv_rc_pingpong and perftest: both ways, strict parsing, hostile peers."""

import contextlib
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from ipaddress import IPv6Address

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmakit.cli.oob_messages import (
    KEY_MSG_LEN,
    PINGPONG_MSG_LEN,
    BwReport,
    OobFormatError,
    PerftestDest,
    PingpongDest,
    decode_mtu,
    decode_sys_int,
    decode_version,
    encode_mtu,
    encode_version,
    version_value,
)

GID = IPv6Address("::ffff:10.77.0.2")

PINGPONG_CASES = [
    (
        PingpongDest(lid=0, qpn=0x11, psn=0xABCDEF, gid=GID),
        b"0000:000011:abcdef:00000000000000000000ffff0a4d0002\0",
    ),
    (
        PingpongDest(lid=0xFFFF, qpn=0xFFFFFF, psn=0, gid=IPv6Address("fe80::1")),
        b"ffff:ffffff:000000:fe800000000000000000000000000001\0",
    ),
    (PingpongDest(lid=1, qpn=2, psn=3, gid=IPv6Address(0)), b"0001:000002:000003:" + b"0" * 32 + b"\0"),
]

KEY = (
    b"0000:0010:000011:abcdef:12345678:00007f0012345000:"
    b"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:02:00000000:\0"
)
PERFTEST_CASES = [
    (
        PerftestDest(
            lid=0, out_reads=16, qpn=0x11, psn=0xABCDEF, rkey=0x12345678, vaddr=0x7F0012345000, gid=GID
        ),
        KEY,
    ),
]


@pytest.mark.parametrize(("dest", "raw"), PINGPONG_CASES)
def test_pingpong_message_both_ways(dest: PingpongDest, raw: bytes) -> None:
    assert len(raw) == PINGPONG_MSG_LEN
    assert dest.encode() == raw
    assert PingpongDest.decode(raw) == dest


@pytest.mark.parametrize(("dest", "raw"), PERFTEST_CASES)
def test_key_message_both_ways(dest: PerftestDest, raw: bytes) -> None:
    assert len(raw) == KEY_MSG_LEN
    assert dest.encode() == raw
    assert PerftestDest.decode(raw) == dest


def test_uppercase_hex_is_read_as_sscanf_does() -> None:
    assert PingpongDest.decode(PINGPONG_CASES[0][1].upper()) == PINGPONG_CASES[0][0]
    assert PerftestDest.decode(KEY.upper()) == PERFTEST_CASES[0][0]


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        PINGPONG_CASES[0][1][:-1],  # short
        PINGPONG_CASES[0][1][:-1] + b"x",  # no NUL
        PINGPONG_CASES[0][1].replace(b":", b";", 1),
        PINGPONG_CASES[0][1].replace(b"a", b"g", 1),
        b" " + PINGPONG_CASES[0][1][1:],
        b"\0" * PINGPONG_MSG_LEN,
        PINGPONG_CASES[0][1] + b"\0",
    ],
)
def test_pingpong_garbage(raw: bytes) -> None:
    with pytest.raises(OobFormatError):
        PingpongDest.decode(raw)


@pytest.mark.parametrize(
    "raw",
    [
        KEY[:-1],
        KEY[:-1] + b"!",
        KEY.replace(b"ff:ff", b"fff:f"),
        KEY.replace(b":00000000:", b":0000000z:"),
        KEY.replace(b"0010", b"+010", 1),
        b"0" * KEY_MSG_LEN,
        KEY + b"\0",
    ],
)
def test_key_message_garbage(raw: bytes) -> None:
    with pytest.raises(OobFormatError):
        PerftestDest.decode(raw)


@pytest.mark.parametrize(
    ("raw", "text", "value"),
    [
        (b"6.06" + b"\0" * 12, "6.06", 6.06),
        (b"6.29" + b"\0" * 12, "6.29", 6.29),
        (b"5.70" + b"\0" * 12, "5.70", 5.70),
        (b"25.01.0-0.70" + b"\0" * 4, "25.01.0-0.70", 25.01),
    ],
)
def test_version(raw: bytes, text: str, value: float) -> None:
    assert decode_version(raw) == text
    assert version_value(text) == value


def test_announced_version() -> None:
    assert encode_version() == b"6.06" + b"\0" * 12


@pytest.mark.parametrize(
    "raw",
    [
        b"6.06" + b"x" * 12,
        b"6.06\0\0\0\0\0\0\0\0\0\0\0",
        b"\0" * 16,
        b"abc" + b"\0" * 13,
        b"6.06\0\0\0\0a" + b"\0" * 7,
    ],
)
def test_version_garbage(raw: bytes) -> None:
    with pytest.raises(OobFormatError):
        decode_version(raw)


def test_mtu_and_system_data() -> None:
    assert [encode_mtu(m) for m in (256, 512, 1024, 2048, 4096)] == [b"1\0", b"2\0", b"3\0", b"4\0", b"5\0"]
    assert decode_mtu(b"3\0") == 1024
    for bad in (b"0\0", b"6\0", b"3", b"33", b"\0\0", b"3\0\0"):
        with pytest.raises(OobFormatError):
            decode_mtu(bad)
    assert decode_sys_int(struct.pack(">i", 4096), "cycle buffer", 1 << 26) == 4096
    for bad in (struct.pack(">i", 0), struct.pack(">i", -1), struct.pack(">i", 1 << 27), b"\0\0\0"):
        with pytest.raises(OobFormatError):
            decode_sys_int(bad, "cycle buffer", 1 << 26)


def test_report_both_ways() -> None:
    rep = BwReport(size=65536, iters=5000, bw_peak=25.5, bw_avg=20.25, msg_rate=0.000324)
    parts = rep.parts()
    assert parts[0] == (65536).to_bytes(8, "big")
    assert parts[1] == (5000).to_bytes(8, "big")
    assert parts[3] == struct.pack(">d", 20.25)
    assert BwReport.from_parts(parts) == rep
    for bad in (
        [*parts[:4], struct.pack(">d", float("nan"))],
        [(0).to_bytes(8, "big"), *parts[1:]],
        [*parts[:2], struct.pack(">d", -1.0), *parts[3:]],
        parts[:4],
        [*parts[:4], b"\0" * 7],
    ):
        with pytest.raises(OobFormatError):
            BwReport.from_parts(bad)


@given(st.binary(min_size=PINGPONG_MSG_LEN, max_size=PINGPONG_MSG_LEN))
def test_pingpong_fuzz(raw: bytes) -> None:
    try:
        dest = PingpongDest.decode(raw)
    except OobFormatError:
        return
    assert PingpongDest.decode(dest.encode()) == dest


@given(st.binary(min_size=KEY_MSG_LEN, max_size=KEY_MSG_LEN), st.binary(max_size=20))
def test_key_and_version_fuzz(raw: bytes, version: bytes) -> None:
    try:
        dest = PerftestDest.decode(raw)
    except OobFormatError:
        pass
    else:
        assert PerftestDest.decode(dest.encode()) == dest
    with contextlib.suppress(OobFormatError):
        decode_version(version)


# -- hostile peers: a fake server speaking (part of) the exchange -----------------------------------


def fake_server(script: list[tuple[int, bytes]]) -> tuple[int, threading.Thread]:
    """Accept one connection on a free port and play `script`: read N bytes, then write the bytes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(60)
    port = listener.getsockname()[1]

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(60)
                for n, reply in script:
                    got = b""
                    while len(got) < n:
                        chunk = conn.recv(n - len(got))
                        if not chunk:
                            return
                        got += chunk
                    if reply:
                        conn.sendall(reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return port, t


GOOD_START = [
    (16, b"6.06" + b"\0" * 12),
    (4, struct.pack(">i", 4096)),
    (4, struct.pack(">i", 64)),
    (2, b"3\0"),
]


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ([(16, b"\xff" * 16)], "perftest version is not"),
        ([(16, b"5.60" + b"\0" * 12)], "older than 5.70"),
        ([(16, b"6.06")], "closed the connection while sending the perftest version after 4 of 16 bytes"),
        ([*GOOD_START[:1], (4, struct.pack(">i", -5))], "cycle buffer size -5 is out of range"),
        ([*GOOD_START[:3], (2, b"9\0")], "MTU message is not an IB MTU enum"),
        ([*GOOD_START, (KEY_MSG_LEN, KEY.replace(b":", b"-", 3))], "key message is not in KEY_PRINT_FMT_GID"),
        ([*GOOD_START, (KEY_MSG_LEN, KEY.replace(b"ff:ff:0a:4d", b"00:00:0a:4d"))], "GID families differ"),
    ],
    ids=["garbage-version", "old-version", "short-version", "bad-cycle", "bad-mtu", "bad-key", "v6-gid"],
)
def test_perftest_client_against_hostile_server(
    new_ip: Callable[[], str], script: list[tuple[int, bytes]], error: str
) -> None:
    port, t = fake_server(script)
    p = subprocess.run(
        [sys.executable, "-m", "rdmakit", "perftest", "ib_write_bw", "-d", new_ip(), "-p", str(port),
         "-n", "5", "127.0.0.1"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    t.join(timeout=60)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("rdmakit perftest: ")
    assert error in lines[0]


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"0000:000011:abcdef:zz000000000000000000ffff0a4d0002\0", "is not LID:QPN:PSN:GID"),
        (b"0000:000011:abcdef:" + b"0" * 32 + b"\0", "the peer sent no GID"),
    ],
)
def test_rc_pingpong_client_against_hostile_server(
    new_ip: Callable[[], str], reply: bytes, error: str
) -> None:
    port, t = fake_server([(PINGPONG_MSG_LEN, reply), (5, b"")])
    p = subprocess.run(
        [sys.executable, "-m", "rdmakit", "rc-pingpong", "-d", new_ip(), "-p", str(port), "127.0.0.1"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    t.join(timeout=60)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert error in lines[0]


def test_perftest_server_against_garbage_client(new_ip: Callable[[], str]) -> None:
    """A server that receives 16 bytes of garbage says so and exits, without waiting for more."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "rdmakit", "perftest", "ib_send_lat", "-d", new_ip(), "-p", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for _ in range(600):
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=1)
                break
            except OSError:
                threading.Event().wait(0.05)
        else:
            pytest.fail("the server never listened")
        with conn:
            conn.sendall(b"GET / HTTP/1.1\r\n")
            _, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode != 0
    assert len(err.strip().splitlines()) == 1, err
    assert "perftest version is not" in err
