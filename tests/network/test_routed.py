"""The tools between two hosts across a router, as a user runs them: no ``-m``, defaults.

Three namespaces A – R – B (``rdmakit.testing.netbed``): at MTU 1500, through
a hop that segments GSO batches (tbf on R), over IPv6, and at MTU 9000. Each
path runs perftest's bw and latency tests (server on B, client on A, and the
roles swapped), rc-pingpong, rping with its data validated, and a DOCA sample
pair with descriptor files. Nothing may stall (``HUNG``), and a path whose MTU
shrinks on the way fails at once with the fix. Needs root (skipped otherwise).
"""

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmakit.testing.netbed import HUNG, SEGMENTING, BedSpec, Done, NetBed, unavailable

WHY_NOT = unavailable()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")]

RDMAKIT = [sys.executable, "-m", "rdmakit"]
#: (bed, IP version, the MTU the tools must report)
PATHS = {
    "mtu1500": (BedSpec(), 4, 1024),
    "segmenting": (BedSpec(shaping=SEGMENTING), 4, 1024),
    "ipv6": (BedSpec(shaping=SEGMENTING), 6, 1024),
    "mtu9000": (BedSpec(mtu_a=9000, mtu_b=9000), 4, 4096),
}
BW_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", re.M)
LAT_ROW = re.compile(r"^\s*2\s+(\d+)\s+[\d.]+", re.M)


@pytest.fixture(scope="module", params=list(PATHS))
def path(request: pytest.FixtureRequest) -> Iterator[tuple[NetBed, int, int]]:
    spec, version, mtu = PATHS[request.param]
    with NetBed(spec) as bed:
        yield bed, version, mtu


def _ok(done: Done, what: str) -> str:
    assert done.rc != HUNG, f"{what} stalled: {done.err[-2000:]}"
    assert done.rc == 0, f"{what} failed ({done.rc}): {done.err[-2000:]}"
    return done.out


def test_devices_show_the_interface_mtu(path: tuple[NetBed, int, int]) -> None:
    bed, v, mtu = path
    rows = json.loads(bed.sh([*RDMAKIT, "devices", "--json"], "a"))
    by_name = {r["name"]: r for r in rows}
    assert by_name[f"udp:{bed.addr('a', v)}"]["mtu"] == mtu
    assert by_name["udp:127.0.0.1"]["mtu"] == 4096  # loopback's 65536


@pytest.mark.parametrize("test", ["ib_write_bw", "ib_read_bw", "ib_send_bw"])
def test_perftest_bw(path: tuple[NetBed, int, int], test: str) -> None:
    bed, v, mtu = path
    server, client = bed.pair(
        ("b", [*RDMAKIT, "perftest", test, "-d", bed.addr("b", v)]),
        ("a", [*RDMAKIT, "perftest", test, "-d", bed.addr("a", v), bed.addr("b", v)]),
    )
    for done, who in ((client, "client"), (server, "server")):
        out = _ok(done, f"{test} {who}")
        rows = BW_ROW.findall(out)
        assert len(rows) == 1, out
        assert int(rows[0][0]) == 65536
        assert float(rows[0][3]) > 0
    assert f"Mtu             : {mtu}[B]" in client.out


def test_perftest_lat_both_roles(path: tuple[NetBed, int, int]) -> None:
    bed, v, mtu = path
    for srv, cli in (("b", "a"), ("a", "b")):
        server, client = bed.pair(
            (srv, [*RDMAKIT, "perftest", "ib_write_lat", "-d", bed.addr(srv, v)]),  # type: ignore[arg-type]
            (cli, [*RDMAKIT, "perftest", "ib_write_lat", "-d", bed.addr(cli, v), bed.addr(srv, v)]),  # type: ignore[arg-type]
        )
        for done in (client, server):
            out = _ok(done, f"ib_write_lat, server on {srv}")
            assert LAT_ROW.findall(out) == ["1000"], out
        assert f"Mtu             : {mtu}[B]" in client.out


def test_rc_pingpong(path: tuple[NetBed, int, int]) -> None:
    bed, v, _ = path
    server, client = bed.pair(
        ("b", [*RDMAKIT, "rc-pingpong", "-d", bed.addr("b", v)]),
        ("a", [*RDMAKIT, "rc-pingpong", "-d", bed.addr("a", v), bed.addr("b", v)]),
    )
    for done in (client, server):
        out = _ok(done, "rc-pingpong")
        assert "8192000 bytes in" in out, out  # 4096 bytes x 1000 iterations, both ways
        assert "1000 iters in" in out, out


def test_rping_validates_its_data(path: tuple[NetBed, int, int]) -> None:
    bed, v, _ = path
    b = bed.addr("b", v)
    server, client = bed.pair(
        ("b", [*RDMAKIT, "rping", "-s", "-a", b, "-V", "-S", "6000"]),
        ("a", [*RDMAKIT, "rping", "-c", "-a", b, "-V", "-S", "6000", "-C", "20"]),
        delay=0.8,
    )
    _ok(client, "rping client")
    _ok(server, "rping server")
    assert "client DISCONNECT EVENT..." in client.err


def test_doca_sample_pair(path: tuple[NetBed, int, int], tmp_path: Path) -> None:
    bed, v, _ = path
    text = " ".join(["written by RDMA across a router"] * 200)  # several MTUs of it
    files = {k: str(tmp_path / f"{k}.json") for k in ("req", "resp", "mmap")}
    common = ["-m", files["mmap"], "--timeout", "60"]
    responder = ["rdma-write-responder", "-d", bed.addr("b", v), "-ld", files["resp"], "-re", files["req"]]
    requester = ["rdma-write-requester", "-w", text, "-d", bed.addr("a", v), "-ld", files["req"]]
    server, client = bed.pair(
        ("b", [*RDMAKIT, *responder, *common]),
        ("a", [*RDMAKIT, *requester, "-re", files["resp"], *common]),
        delay=0.3,
    )
    assert _ok(client, "rdma-write-requester").strip() == f"Written to the responder: {text}"
    assert _ok(server, "rdma-write-responder").strip() == f"Remote write: {text}"


def test_a_path_mtu_below_both_ends_fails_at_once_then_the_route_knows() -> None:
    """A and B on 9000-byte links, R's link towards B at 1500: both ends offer 4096, which
    R cannot forward. The first run learns the path MTU (ICMP "fragmentation needed")
    and fails at once, naming the MTU, the route and the fix; the next run with the same
    defaults takes the route's MTU and passes."""
    with NetBed(BedSpec(mtu_a=9000, mtu_b=9000, mtu_rb=1500)) as bed:
        argv = [*RDMAKIT, "perftest", "ib_write_bw", "-n", "200"]
        srv, cli = ("b", [*argv, "-d", bed.addr("b")]), ("a", [*argv, "-d", bed.addr("a"), bed.addr("b")])
        server, client = bed.pair(srv, cli, timeout=60)  # type: ignore[arg-type]
        assert client.rc not in (0, HUNG), client
        assert "does not fit" in client.err, client.err
        assert "1500-byte IP packets" in client.err, client.err
        assert "-m 1024" in client.err, client.err
        assert server.rc != HUNG
        server, client = bed.pair(srv, cli)  # type: ignore[arg-type]
        _ok(client, "ib_write_bw after path-MTU discovery")
        assert "Mtu             : 1024[B]" in client.out
