"""The machinery of ``rdmakit bench`` without a bench run: targets, rows, JSON, parsers, baselines.

Times are never asserted: the raw baselines are run for their byte counts
and their protocol, the parsers on outputs recorded from the real tools.
"""

import itertools
import json
import math
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from rdmakit.cli import bench_sweep
from rdmakit.cli.bench_measure import MiB, depth_for, roce_segment
from rdmakit.cli.bench_rows import TARGETS, Check, Report, Row, Target, apply_targets, failures, format_row
from rdmakit.cli.bench_scale import DEFAULT_QPS, qp_counts
from rdmakit.cli.bench_tools import CTools, parse_fi_pingpong, parse_iperf3, parse_sockperf
from rdmakit.transport import baseline
from rdmakit.transport.udp import UdpLink

SAMPLES = Path(__file__).parent / "bench_samples"


def sample_text(name: str) -> str:
    return (SAMPLES / name).read_text(errors="replace")


# -- the targets table -------------------------------------------------------------------


def test_every_target_is_in_the_one_table_like_for_like() -> None:
    got = {(k, t.against, t.lo, t.hi) for k, ts in TARGETS.items() for t in ts}
    assert got == {
        ("rtt_write_poll", "baseline", None, 1.5),
        ("rtt_write_poll", "c_baseline", None, 1.0),
        ("rtt_read_poll", "rtt_write_poll", 0.9, 1.1),
        ("rtt_fadd_poll", "rtt_write_poll", 0.9, 1.1),
        ("rtt_cswap_poll", "rtt_write_poll", 0.9, 1.1),
        ("rtt_write_event", "baseline", None, 1.3),
        ("udp_write", "baseline", 0.9, None),
        ("udp_read", "baseline", 0.9, None),
        ("tcp_write", "c_baseline", 1.0, None),
        ("doca_job_rtt", "baseline", None, 1.15),
        ("doca_task_rtt", "baseline", None, 1.15),
        ("doca_task_rtt", "doca_job_rtt", None, 1.05),
    }
    for ts in TARGETS.values():
        for t in ts:
            assert t.why


def test_targets_divide_by_the_baseline_the_c_tool_or_another_row() -> None:
    write = Row("rtt_write_poll", "WRITE", "µs", [10.0, 12.0, 11.0], baseline=8.0, c_baseline=12.0)
    apply_targets(write, {})
    assert write.value == 11.0
    assert write.spread == (10.0, 12.0)
    assert [c.ratio for c in write.checks] == [11.0 / 8.0, 11.0 / 12.0]
    assert [c.passed for c in write.checks] == [True, True]
    assert write.passed is True

    read = Row("rtt_read_poll", "READ", "µs", [13.0], baseline=8.0)
    apply_targets(read, {"rtt_write_poll": write})
    assert read.checks[0].ratio == 13.0 / 11.0
    assert read.checks[0].passed is False  # more than 10 % over WRITE
    fast = Row("rtt_fadd_poll", "FADD", "µs", [9.0])
    apply_targets(fast, {"rtt_write_poll": write})
    assert fast.checks[0].passed is False  # within 10 % means either way

    # No C tool: that target has no verdict, the others still count.
    alone = Row("rtt_write_poll", "WRITE", "µs", [20.0], baseline=8.0)
    apply_targets(alone, {})
    assert [c.passed for c in alone.checks] == [False, None]
    assert alone.passed is False
    assert failures([write, read, fast, alone]) == [
        "READ: ratio 1.18, target 0.9–1.1 vs WRITE",
        "FADD: ratio 0.82, target 0.9–1.1 vs WRITE",
        "WRITE: ratio 2.50, target ≤ 1.5 vs raw",
    ]
    nothing = Row("tcp_write", "TCP", "MB/s", [5.0])
    apply_targets(nothing, {})
    assert nothing.passed is None
    assert failures([nothing]) == []


def test_target_bounds() -> None:
    assert Target("baseline", hi=1.5).holds(1.5)
    assert not Target("baseline", hi=1.5).holds(1.51)
    assert Target("baseline", lo=0.9).holds(0.9)
    assert not Target("baseline", lo=0.9, hi=1.1).holds(1.2)
    assert Target("baseline", lo=0.9, hi=1.1).text == "0.9–1.1 vs raw"
    assert Target("c_baseline", lo=1.0).text == "≥ 1 vs C"
    assert Check(Target("baseline", hi=1.0), None).passed is None


def test_json_row_schema() -> None:
    rows: dict[str, Row] = {}
    raw = Row("udp_raw_in", "raw B→A", "MB/s", [100.0, 120.0, 110.0])
    read = Row("udp_read", "READ", "MB/s", [95.0, 99.0, 80.0], baseline=raw.value, baseline_name=raw.name)
    for r in (raw, read):
        apply_targets(r, rows)
        rows[r.key] = r
    doc = json.loads(json.dumps([r.as_json() for r in rows.values()]))
    keys = {"key", "name", "value", "unit", "runs", "min", "max", "baseline", "baseline_name",
            "c_baseline", "c_baseline_name", "target", "ratio", "pass", "targets"}  # fmt: skip
    assert all(set(d) == keys for d in doc)
    assert doc[0]["baseline"] is None
    assert doc[0]["target"] is None
    assert doc[0]["pass"] is None
    r = doc[1]
    assert (r["value"], r["min"], r["max"], r["runs"]) == (95.0, 80.0, 99.0, 3)
    assert r["baseline"] == 110.0
    assert r["baseline_name"] == "raw B→A"
    assert r["target"] == "≥ 0.9 vs raw"
    assert r["ratio"] == 95.0 / 110.0
    assert r["pass"] is False
    assert r["targets"] == [{"target": "≥ 0.9 vs raw", "against": "baseline", "ratio": 95.0 / 110.0,
                             "pass": False}]  # fmt: skip


def test_report_prints_each_row_with_spread_and_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    rep = Report(quiet=False)
    rep.add(Row("ping_poll", "raw ping", "µs", [8.0, 9.0]))
    rep.add(Row("rtt_write_poll", "WRITE rtt", "µs", [10.0, 11.0, 12.0], baseline=8.5))
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("WRITE rtt")
    assert "10.0–12.0" in out[1]
    assert out[1].endswith("≤ 1.5 vs raw ok; ≤ 1 vs C n/a")
    assert math.isnan(Row("x", "x", "µs", []).value)
    assert format_row(Row("x", "empty", "µs", [])).startswith("empty")


# -- the C tools' outputs ----------------------------------------------------------------


def test_parse_iperf3_json() -> None:
    v = parse_iperf3(sample_text("iperf3_client.json"))
    doc = json.loads(sample_text("iperf3_client.json"))
    assert v == doc["end"]["sum_received"]["bits_per_second"] / 8
    assert parse_iperf3(sample_text("iperf3_refused.json")) is None
    assert parse_iperf3("iperf3: error - unable to connect") is None
    assert parse_iperf3("[]") is None


def test_parse_sockperf_round_trip_and_one_way() -> None:
    assert parse_sockperf(sample_text("sockperf_pingpong_full_rtt.txt")) == 19.546  # the median line
    assert parse_sockperf(sample_text("sockperf_pingpong_latency.txt")) == 2 * 8.310  # one-way, doubled
    assert parse_sockperf("sockperf: ====> avg-rtt=21.5 (std-dev=4)\n") == 21.5
    assert parse_sockperf("sockperf: server exited") is None


def test_parse_fi_pingpong_rows() -> None:
    assert parse_fi_pingpong(sample_text("fi_pingpong_tcp_msg_S8.txt"), 8) == 2 * 1867.71
    table = sample_text("fi_pingpong_tcp_msg_all.txt")
    assert parse_fi_pingpong(table, 8) == 2 * 252.13
    assert parse_fi_pingpong(table, 1024) == 2 * 212.87  # "1k"
    assert parse_fi_pingpong(table, 1536) == 2 * 1801.46  # "1.5k"
    assert parse_fi_pingpong(table, 3) == 2 * 404.43
    assert parse_fi_pingpong(table, 1 << 30) is None
    assert parse_fi_pingpong("ctrl/read(): Connection reset by peer\n", 8) is None


def test_a_missing_tool_says_so_once_and_gives_no_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    said: list[str] = []
    tools = CTools("127.0.5.2", "127.0.5.3", said.append)
    assert tools.iperf3(MiB, MiB) is None
    assert tools.iperf3(MiB, MiB) is None
    assert tools.sockperf(8) is None
    assert tools.fi_pingpong(8, 10) is None
    assert said == [
        "iperf3 is not installed: no C baseline from it (scripts/install-bench-deps.sh)",
        "sockperf is not installed: no C baseline from it (scripts/install-bench-deps.sh)",
        "fi_pingpong is not installed: no C baseline from it (scripts/install-bench-deps.sh)",
    ]
    off = CTools("127.0.5.2", "127.0.5.3", said.append, enabled=False)
    assert off.iperf3(MiB, MiB) is None
    assert len(said) == 3


def test_installed_tools_run_on_the_two_addresses(new_ip: Callable[[], str]) -> None:
    said: list[str] = []
    tools = CTools(new_ip(), new_ip(), said.append)
    ran = 0
    if tools.have("iperf3"):
        v = tools.iperf3(4 * MiB, MiB)
        assert v is not None, said
        assert v > 0
        ran += 1
    if tools.have("sockperf"):
        v = tools.sockperf(8)
        assert v is not None, said
        assert v > 0
        ran += 1
    if tools.have("fi_pingpong"):
        v = tools.fi_pingpong(8, 20)
        assert v is not None, said
        assert v > 0
        ran += 1
    if not ran:
        pytest.skip("no C tool installed (scripts/install-bench-deps.sh)")


# -- sizes, segments, scale flags --------------------------------------------------------


def test_sweep_sizes_are_perftest_a() -> None:
    s = bench_sweep.sizes()
    assert s[0] == 2
    assert s[-1] == 8 * MiB
    assert len(s) == 23
    assert all(b == 2 * a for a, b in itertools.pairwise(s))
    assert bench_sweep.sizes(64) == [2, 4, 8, 16, 32, 64]
    assert bench_sweep.human(2) == "2 B"
    assert bench_sweep.human(4096) == "4 KiB"
    assert bench_sweep.human(8 * MiB) == "8 MiB"


def test_roce_segments_and_depths() -> None:
    assert roce_segment(MiB) == 4112  # BTH + 4096 + ICRC
    assert roce_segment(8) == 40  # BTH + RETH + 8 + ICRC
    assert depth_for(MiB) == 4
    assert depth_for(2) == 128


def test_scale_qp_counts() -> None:
    assert DEFAULT_QPS == (1, 16, 256, 1024)
    assert qp_counts("1,4") == (1, 4)
    for bad in ("", "0", "1,x", "5000"):
        with pytest.raises(Exception, match="QP counts"):
            qp_counts(bad)


def test_plot_draws_the_sweep(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = []
    for size in (2, 4, 8):
        rows += [
            Row(f"sweep_raw_bw:{size}", "raw", "MB/s", [size * 2.0]),
            Row(f"sweep_bw:{size}", "w", "MB/s", [float(size)]),
            Row(f"sweep_raw_rtt:{size}", "p", "µs", [10.0]),
            Row(f"sweep_rtt:{size}", "r", "µs", [20.0], c_baseline=30.0),
        ]
    assert bench_sweep.series(rows, "sweep_rtt", "c_baseline") == [(2, 30.0), (4, 30.0), (8, 30.0)]
    out = tmp_path / "sweep.png"
    bench_sweep.plot(rows, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the raw baselines: bytes and protocol, never times ----------------------------------


def test_udp_stream_with_flow_control_both_directions(new_ip: Callable[[], str]) -> None:
    seg, total = 4112, 300 * 4112
    a, b = new_ip(), new_ip()
    sink = UdpLink(a, 0)
    src = UdpLink(b, 0)
    got: list[tuple[int, float]] = []
    t = threading.Thread(target=lambda: got.append(baseline.udp_stream_recv(sink, None, total, 8 * seg, 0.0)))
    t.start()
    secs = baseline.udp_stream_send(src, (a, sink.port), seg, total, 32 * seg, 0.0)
    t.join()
    assert secs > 0
    assert got[0][0] == total
    # The other direction: the receiver asks, the source serves.
    served: list[float] = []
    t = threading.Thread(target=lambda: served.append(baseline.udp_stream_serve(src, seg, 16 * seg, 0.0)))
    t.start()
    n, secs = baseline.udp_stream_recv(sink, (b, src.port), total, 4 * seg, 0.0)
    t.join()
    assert n == total
    assert secs > 0
    assert served
    sink.close()
    src.close()


@pytest.mark.parametrize(("size", "spin"), [(8, 0.0), (8, 50e-6), (20000, 0.0)])
def test_udp_ping_size_out_8_back(size: int, spin: float, new_ip: Callable[[], str]) -> None:
    a, b = new_ip(), new_ip()
    echo = baseline.UdpEcho(a)
    t = threading.Thread(target=echo.serve, args=(20, size, spin))
    t.start()
    rtts = baseline.udp_ping(b, (a, echo.port), 20, size, spin)
    t.join()
    assert len(rtts) == 20
    assert all(r > 0 for r in rtts)


def test_tcp_stream_reads_in_place_after_a_warm_up(new_ip: Callable[[], str]) -> None:
    a, b = new_ip(), new_ip()
    sink = baseline.TcpSink(a)
    got: list[tuple[int, float]] = []
    t = threading.Thread(target=lambda: got.append(sink.serve(MiB)))
    t.start()
    secs = baseline.tcp_source(b, a, sink.port, MiB, 5 * MiB + 3, 2 * MiB)
    t.join()
    assert secs > 0
    assert got[0][0] == 5 * MiB + 3


def test_tcp_streams_of_the_bench_size_finish(new_ip: Callable[[], str]) -> None:
    """Reads waiting at the SO_RCVLOWAT mark once stalled for good here (Linux clamps the window
    to the mark when it grows the buffer for it); ten 16 MiB streams after 8 MiB warm-ups all end."""
    for _ in range(10):
        a, b = new_ip(), new_ip()
        sink = baseline.TcpSink(a)
        got: list[tuple[int, float]] = []
        t = threading.Thread(target=_serve_into, args=(sink, got), daemon=True)
        t.start()
        baseline.tcp_source(b, a, sink.port, MiB, 16 * MiB, 8 * MiB)
        t.join(60)
        assert got
        assert got[0][0] == 16 * MiB


def _serve_into(sink: baseline.TcpSink, got: list[tuple[int, float]]) -> None:
    got.append(sink.serve(MiB))


def test_a_lost_datagram_is_an_error_not_a_hang(new_ip: Callable[[], str]) -> None:
    link = UdpLink(new_ip(), 0)
    with pytest.raises(baseline.BaselineError, match="lost"):
        baseline.recv_spin(link.sock, bytearray(64), 0.001, timeout=0.05)
    link.close()
