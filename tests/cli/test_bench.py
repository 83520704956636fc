"""``rdmakit bench``: every figure measured against its same-run baseline.

Only the shape of the report is checked (which rows, which baselines, which
targets): times are never asserted in a test.
"""

import json
import subprocess
import sys


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmakit", "bench", "--ip-a", "127.0.5.2", "--ip-b", "127.0.5.3", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_json_report_has_every_figure_with_its_baseline_ratio() -> None:
    out = bench("--runs", "1", "--total", "8", "--pings", "50", "--json-out")
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert list(rows) == [
        "raw TCP stream, 1 MiB sendall/recv_into",
        "RDMA WRITE 1 MiB, TCP transport",
        "raw UDP GSO→GRO, 4112-byte datagrams",
        "RDMA WRITE 1 MiB, RoCEv2/UDP, MTU 4096",
        "RDMA READ 1 MiB, RoCEv2/UDP, MTU 4096",
        "raw UDP ping-pong, 8 bytes, round trip",
        "raw UDP ping-pong, busy-polling both ends",
        "RDMA WRITE 8 bytes, round trip (sync driver)",
        "  the same against the busy-polling ping",
        "RDMA READ 8 bytes, round trip",
        "ATOMIC FETCH_ADD 8 bytes, round trip",
        "ATOMIC CMP_SWP 8 bytes, round trip",
        "RDMA WRITE 8 bytes, round trip (event-driven)",
        "DOCA job API: RDMA WRITE 8 bytes, round trip",
        "DOCA task API: the same, against the job API",
    ]
    for name, r in rows.items():
        assert r["value"] > 0, name
        if name.startswith("raw "):
            assert r["baseline"] is None, name
            assert r["ratio"] is None, name
        else:
            assert r["ratio"] == r["value"] / r["baseline"], name
    tcp = rows["raw TCP stream, 1 MiB sendall/recv_into"]["value"]
    assert rows["RDMA WRITE 1 MiB, TCP transport"]["baseline"] == tcp
    assert rows["RDMA WRITE 1 MiB, TCP transport"]["target"] == "≥ 0.9"
    assert rows["RDMA WRITE 1 MiB, RoCEv2/UDP, MTU 4096"]["target"] == "≥ 0.5"
    assert rows["RDMA WRITE 8 bytes, round trip (sync driver)"]["target"] == "≤ 1.5"
    ping = rows["raw UDP ping-pong, 8 bytes, round trip"]["value"]
    polled = rows["raw UDP ping-pong, busy-polling both ends"]["value"]
    write = rows["RDMA WRITE 8 bytes, round trip (sync driver)"]
    assert write["baseline"] == ping
    assert rows["  the same against the busy-polling ping"]["baseline"] == polled
    assert rows["  the same against the busy-polling ping"]["value"] == write["value"]
    assert rows["RDMA WRITE 8 bytes, round trip (event-driven)"]["baseline"] == ping
    job_api = rows["DOCA job API: RDMA WRITE 8 bytes, round trip"]
    assert job_api["baseline"] == ping
    assert rows["DOCA task API: the same, against the job API"]["baseline"] == job_api["value"]


def test_table_names_the_data_plane_and_rejects_bad_flags() -> None:
    out = bench("--runs", "1", "--total", "4", "--pings", "20", "--spin-us", "0")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("rdmakit bench: 1 runs each (median), 4 MiB per throughput run")
    assert lines[1].startswith("UDP data plane: ")
    (write,) = [line for line in lines if line.startswith("RDMA WRITE 8 bytes, round trip (sync driver)")]
    assert write.endswith("≤ 1.5")
    bad = bench("--runs", "x")
    assert bad.returncode == 2
    assert "--runs" in bad.stderr
