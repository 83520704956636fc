"""``rdmakit bench`` end to end, tiny: which rows, which baselines, which targets, the exit status.

Only the shape of the report is checked: times are never asserted in a test
(``--check``'s status is checked against the verdicts the same run wrote).
"""

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def bench(ips: tuple[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmakit", "bench", "--ip-a", ips[0], "--ip-b", ips[1], *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def rows_of(path: Path) -> dict[str, dict[str, Any]]:
    return {r["key"]: r for r in json.loads(path.read_text())}


def test_headline_rows_each_against_its_like(tmp_path: Path, new_ip: Callable[[], str]) -> None:
    out_file = tmp_path / "bench.json"
    small = ("--runs", "2", "--total", "4", "--pings", "30", "--no-c-baselines")
    out = bench((new_ip(), new_ip()), *small, "--check", "--json-out", str(out_file))
    rows = rows_of(out_file)
    assert list(rows) == [
        "tcp_raw", "tcp_write", "udp_raw_out", "udp_write", "udp_raw_in", "udp_read",
        "ping_poll", "rtt_write_poll", "rtt_read_poll", "rtt_fadd_poll", "rtt_cswap_poll",
        "ping_block", "rtt_write_event", "rtt_write_alt", "doca_job_rtt", "doca_task_rtt",
    ]  # fmt: skip
    for key, r in rows.items():
        assert r["runs"] == 2, key
        assert r["min"] <= r["value"] <= r["max"], key
        assert r["value"] > 0, key
        assert r["c_baseline"] is None, key  # --no-c-baselines
    # Like for like: each RDMA row is divided by the raw row that does the same thing.
    pairs = {
        "tcp_write": "tcp_raw",
        "udp_write": "udp_raw_out",
        "udp_read": "udp_raw_in",  # the same direction as READ's data
        "rtt_write_poll": "ping_poll",  # the same spin policy
        "rtt_read_poll": "ping_poll",
        "rtt_write_event": "ping_block",  # both event-driven
        # The engine's round trip, the same far side, its runs alternated with the DOCA rows'.
        "doca_job_rtt": "rtt_write_alt",
        "doca_task_rtt": "rtt_write_alt",
    }
    for key, base in pairs.items():
        assert rows[key]["baseline"] == rows[base]["value"], key
        assert rows[key]["baseline_name"] == rows[base]["name"], key
    for key in ("tcp_raw", "udp_raw_out", "udp_raw_in", "ping_poll", "ping_block", "rtt_write_alt"):
        assert rows[key]["baseline"] is None, key
        assert rows[key]["target"] is None, key
    assert rows["rtt_write_poll"]["target"] == "≤ 1.5 vs raw"
    assert rows["rtt_write_poll"]["ratio"] == rows["rtt_write_poll"]["value"] / rows["ping_poll"]["value"]
    assert [t["target"] for t in rows["rtt_write_poll"]["targets"]] == ["≤ 1.5 vs raw", "≤ 1 vs C"]
    assert rows["rtt_write_poll"]["targets"][1]["pass"] is None  # no C tool, no verdict
    for key in ("rtt_read_poll", "rtt_fadd_poll", "rtt_cswap_poll"):
        assert rows[key]["target"] == "0.9–1.1 vs WRITE"
        assert rows[key]["ratio"] == rows[key]["value"] / rows["rtt_write_poll"]["value"]
    assert rows["rtt_write_event"]["target"] == "≤ 1.3 vs raw"
    assert rows["udp_write"]["target"] == rows["udp_read"]["target"] == "≥ 0.9 vs raw"
    assert rows["tcp_write"]["target"] == "≥ 1 vs C"
    assert rows["doca_job_rtt"]["target"] == "≤ 1.15 vs engine"
    assert rows["doca_job_rtt"]["ratio"] == rows["doca_job_rtt"]["value"] / rows["rtt_write_alt"]["value"]
    assert [t["target"] for t in rows["doca_task_rtt"]["targets"]] == [
        "≤ 1.15 vs engine",
        "≤ 1.05 vs job API",
    ]
    assert rows["doca_task_rtt"]["ratio"] == rows["doca_task_rtt"]["value"] / rows["rtt_write_alt"]["value"]
    # --check fails exactly when a verdict of this run is a miss.
    missed = [k for k, r in rows.items() if any(t["pass"] is False for t in r["targets"])]
    assert out.returncode == (1 if missed else 0), out.stderr
    for key in missed:
        assert f"target missed: {rows[key]['name']}" in out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("rdmakit bench: 2 runs each (median, min–max), 4 MiB per throughput run")
    assert lines[1].startswith("UDP data plane: ")


def test_json_on_stdout_and_a_tiny_sweep(new_ip: Callable[[], str]) -> None:
    out = bench(
        (new_ip(), new_ip()),
        *("--runs", "1", "--total", "1", "--pings", "10", "--no-c-baselines"),
        *("--sweep", "--sweep-max", "8", "--json-out", "-"),
    )
    assert out.returncode == 0, out.stderr
    rows = {r["key"]: r for r in json.loads(out.stdout)}
    assert list(rows) == [f"{kind}:{size}" for size in (2, 4, 8) for kind in
                          ("sweep_raw_bw", "sweep_bw", "sweep_raw_rtt", "sweep_rtt")]  # fmt: skip
    for size in (2, 4, 8):
        assert rows[f"sweep_bw:{size}"]["baseline"] == rows[f"sweep_raw_bw:{size}"]["value"]
        assert rows[f"sweep_rtt:{size}"]["baseline"] == rows[f"sweep_raw_rtt:{size}"]["value"]
    assert "rdmakit bench: 1 runs" in out.stderr  # the table's lines go to stderr


def test_tiny_scale_run(new_ip: Callable[[], str]) -> None:
    out = bench(
        (new_ip(), new_ip()),
        *("--runs", "1", "--total", "1", "--pings", "10", "--no-c-baselines"),
        *("--scale", "--scale-qps", "1,4", "--json-out", "-"),
    )
    assert out.returncode == 0, out.stderr
    rows = {r["key"]: r for r in json.loads(out.stdout)}
    kinds = ("scale_setup", "scale_rss", "scale_rss_peer", "scale_bw", "scale_rtt")
    assert list(rows) == [f"{k}:{n}" for n in (1, 4) for k in kinds]
    for n in (1, 4):
        assert rows[f"scale_setup:{n}"]["unit"] == "QP/s"
        assert rows[f"scale_rss:{n}"]["unit"] == "KiB"
        for k in ("scale_setup", "scale_bw", "scale_rtt"):
            assert rows[f"{k}:{n}"]["value"] > 0
    assert rows["scale_rtt:4"]["name"] == "RDMA WRITE 8 B round trip, 3 QPs busy"


def test_bad_flags(new_ip: Callable[[], str]) -> None:
    ips = (new_ip(), new_ip())
    bad = bench(ips, "--runs", "x")
    assert bad.returncode == 2
    assert "--runs" in bad.stderr
    assert bench(ips, "--scale-qps", "0").returncode == 2
    assert bench(ips, "--sweep", "--scale").returncode == 2
    plot = bench(ips, "--plot", "x.png")
    assert plot.returncode != 0
    assert "--plot draws a sweep" in plot.stderr
