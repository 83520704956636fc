"""What a perftest test does once connected: its resources, its runs, its reports and its output.

The runs follow ``perftest_resources.c`` (``run_iter_bw``, ``run_iter_bw_server``,
``run_iter_bi``, ``run_iter_lat``, ``run_iter_lat_send``, ``run_iter_lat_write``)
and the reports ``perftest_parameters.c`` (``print_report_bw``,
``print_report_lat``, ``print_report_lat_duration``, ``ctx_print_test_info``),
at v4.5-0.17, with the monotonic clock in place of CPU cycles. The peak
bandwidth is searched over windows starting at up to 64 evenly spaced posts
(perftest tries every post, quadratic in the iterations), and a requester
does not cycle its remote address within the cycle buffer (the peer cannot
tell).
"""

import functools
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rdmakit.cli.bench_qp import SPIN, Memory, TestQp, oob_timeout, pump
from rdmakit.cli.errors import CliError
from rdmakit.cli.oob_messages import (
    BwReport,
    PerftestDest,
)
from rdmakit.cli.perftest_json import LatDurationFigures, LatFigures
from rdmakit.cli.perftest_params import Params
from rdmakit.doca.backend import BackendDevice
from rdmakit.engine.types import SGE, Completion, RecvWR, SendWR, WcOpcode, WrOpcode

__all__ = [
    "Resources",
    "bw_line",
    "bw_report",
    "lat_duration_report",
    "lat_report",
    "out",
    "run_bw",
    "run_lat",
]

_VERB_TITLE = {"send": "Send", "write": "RDMA_Write", "read": "RDMA_Read", "atomic": "Atomic"}
RESULT_LINE = "-" * 87
RESULT_FMT = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
RESULT_FMT_G = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
RESULT_FMT_LAT = (
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]"
    "   99% percentile[usec]   99.9% percentile[usec] "
)
REPORT_FMT = " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f"
REPORT_FMT_EXT = " %-7d    %d           %-7.6f            %-7.6f            %-7.6f"
REPORT_FMT_LAT = (
    " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f"
)
RESULT_FMT_LAT_DUR = " #bytes        #iterations       t_avg[usec]    tps average"
REPORT_FMT_LAT_DUR = " %-7d       %d            %-7.2f        %-7.2f"
LAT_MEASURE_TAIL = 2
PEAK_SAMPLES = 64


# -- output ------------------------------------------------------------------------------------


def _c_hex(value: int, width: int) -> str:
    """C's ``%#0Nx``: no 0x prefix for zero."""
    return f"{value:0{width}x}" if value == 0 else f"{value:#0{width}x}"


def print_test_info(p: Params, dev: BackendDevice, mtu: int, gid_index: int) -> None:
    title = _VERB_TITLE[p.kind.verb] + " "
    if p.kind.verb == "atomic":
        title += ("CMP_AND_SWAP" if p.atomic_cas else "FETCH_AND_ADD") + " "
    if p.duplex:
        title += "Bidirectional "
    title += "Latency " if p.kind.lat else "BW "
    lines = [
        RESULT_LINE,
        f"                    {title}Test",
        f" Dual-port       : OFF\t\tDevice         : {dev.name}",
        f" Number of qps   : {p.num_qps}\t\tTransport type : IB",
        " Connection type : RC\t\tUsing SRQ      : OFF",
        " PCIe relax order: Unsupported",
        " ibv_wr* API     : OFF",
    ]
    lines.append(f" TX depth        : {p.tx_depth}")
    if p.kind.verb == "send":
        lines.append(f" RX depth        : {p.rx_depth}")
    if not p.kind.lat:
        lines.append(f" CQ Moderation   : {p.cq_mod}")
    lines += [
        f" Mtu             : {mtu}[B]",
        " Link type       : Ethernet",
        f" GID index       : {gid_index}",
    ]
    if p.kind.verb in ("read", "atomic"):  # perftest prints one or the other
        lines.append(f" Outstand reads  : {p.out_reads}")
    else:
        lines.append(" Max inline data : 0[B]")
    lines += [
        f" rdma_cm QPs\t : {'ON' if p.rdma_cm else 'OFF'}",
        f" Data ex. method : {'rdma_cm' if p.comm_rdma_cm else 'Ethernet'}",
    ]
    if p.rdma_cm and not p.client:
        lines += [
            RESULT_LINE,
            " Waiting for client rdma_cm QP to connect",
            " Please run the same command with the IB/RoCE interface IP",
        ]
    lines.append(RESULT_LINE)
    out(p, "\n".join(lines))


def print_dest(p: Params, side: str, d: PerftestDest) -> None:
    line = f" {side} address: LID {_c_hex(d.lid, 4)} QPN {_c_hex(d.qpn, 6)} PSN {_c_hex(d.psn, 6)}"
    if p.kind.verb == "read":
        line += f" OUT {_c_hex(d.out_reads, 4)}"
    if p.kind.verb in ("read", "write"):
        line += f" RKey {_c_hex(d.rkey, 8)} VAddr {_c_hex(d.vaddr, 16)}"
    gid = ":".join(f"{b:02d}" for b in d.gid.packed)
    out(p, f"{line}\n GID: {gid}")


def out(p: Params, text: str, *, result: bool = False) -> None:
    """Print `text`; with ``--output`` only a `result` (perftest's ``FULL_VERBOSITY`` checks)."""
    if p.output is None or result:
        print(text, flush=True)


def bw_line(p: Params, rep: BwReport, rem: BwReport | None = None) -> str:
    """``print_full_bw_report``'s line (with ``--output``, the one figure asked for)."""
    peak, avg, rate = rep.bw_peak, rep.bw_avg, rep.msg_rate
    if rem is not None:
        peak, avg, rate = peak + rem.bw_peak, avg + rem.bw_avg, rate + rem.msg_rate
    if p.output is not None:
        return f"{avg if p.output == 'bandwidth' else rate:f}"
    if p.gbits and avg < 0.1:
        return REPORT_FMT_EXT % (rep.size, rep.iters, peak, avg, rate)
    return REPORT_FMT % (rep.size, rep.iters, peak, avg, rate)


# -- resources ---------------------------------------------------------------------------------


class Resources:
    """QPs and one registered buffer laid out as perftest's: QP i sends from i, is written at nq + i."""

    def __init__(self, p: Params, dev: BackendDevice, cycle_buffer: int) -> None:
        self.p = p
        self.dev = dev
        self.buff = max(p.size, cycle_buffer)
        nq = p.num_qps
        self.mem = Memory(dev, 2 * nq * self.buff)
        recv_depth = p.rx_depth if p.kind.verb == "send" else 1
        self.qps: list[TestQp] = []
        try:
            for _ in range(nq):
                self.qps.append(TestQp(dev, send_depth=p.tx_depth, recv_depth=recv_depth))
        except BaseException:
            self.close()
            raise

    def local_addr(self, i: int) -> int:
        return self.mem.addr + i * self.buff

    def target_off(self, i: int) -> int:
        return (self.p.num_qps + i) * self.buff

    def dest(self, i: int) -> PerftestDest:
        q = self.qps[i]
        return PerftestDest(
            lid=0, out_reads=self.p.out_reads, qpn=q.qpn, psn=q.psn, rkey=self.mem.rkey,
            vaddr=self.mem.addr + self.target_off(i), gid=q.gid,
        )  # fmt: skip

    def close(self) -> None:
        for q in self.qps:
            q.close()
        self.qps.clear()
        self.mem.close()


# -- bandwidth ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Phases:
    """perftest's duration states (``catch_alarm``): a warm-up margin, the sample, a cool-down margin.

    The margin is a quarter of the duration (whole seconds, as ``duration / 4``
    in C); only what completes during the sample is counted and timed.
    """

    sample_start: float
    sample_end: float
    end: float

    @classmethod
    def begin(cls, now: float, duration: int) -> "Phases":
        margin = duration // 4
        return cls(now + margin, now + duration - margin, now + duration)

    def sampling(self, now: float) -> bool:
        return self.sample_start <= now < self.sample_end


@dataclass(slots=True)
class BwTiming:
    total: int = 0
    start: float = 0.0
    end: float = 0.0
    posted: list[float] = field(default_factory=list)
    completions: list[tuple[int, float]] = field(default_factory=list)  # (completed so far, time)
    phases: Phases | None = None

    def count(self, n: int, now: float, duration: int | None) -> None:
        """`n` more operations completed at `now` (in duration mode: only during the sample)."""
        if duration is None:
            self.total += n
            self.end = now
            self.completions.append((self.total, now))
        elif self.phases is not None and self.phases.sampling(now):
            self.total += n


def run_bw(
    res: Resources, size: int, rem: list[PerftestDest], *, send: bool, recv: bool, recv_start: float
) -> BwTiming:
    """``run_iter_bw`` (requester), ``run_iter_bw_server`` (receiver) or both (``run_iter_bi``)."""
    p = res.p
    nq, iters, tx, cq_mod = p.num_qps, p.iters, p.tx_depth, p.cq_mod
    verb = p.kind.verb
    t = BwTiming()
    posted = [0] * nq
    done = [0] * nq if send else [iters] * nq
    rposted = [min(p.rx_depth, iters) if recv and verb == "send" else 0] * nq
    rdone = [0] * nq if (recv and verb == "send") else [iters] * nq
    wrs: list[tuple[SendWR, Callable[[int], SendWR]]] = []
    for i in range(nq):
        sge = (SGE(res.local_addr(i), size, res.mem.lkey),)
        r = rem[i]
        if verb == "send":
            base = SendWR(wr_id=0, opcode=WrOpcode.SEND, sg_list=sge, signaled=False)
        elif verb in ("write", "read"):
            op = WrOpcode.RDMA_WRITE if verb == "write" else WrOpcode.RDMA_READ
            base = SendWR(wr_id=0, opcode=op, sg_list=sge, remote_addr=r.vaddr, rkey=r.rkey, signaled=False)
        elif p.atomic_cas:
            base = SendWR(
                wr_id=0, opcode=WrOpcode.ATOMIC_CMP_AND_SWP, sg_list=sge, remote_addr=r.vaddr, rkey=r.rkey,
                compare_add=0, swap=1, signaled=False,
            )  # fmt: skip
        else:
            base = SendWR(
                wr_id=0, opcode=WrOpcode.ATOMIC_FETCH_AND_ADD, sg_list=sge, remote_addr=r.vaddr, rkey=r.rkey,
                compare_add=1, signaled=False,
            )  # fmt: skip
        wrs.append((base, functools.partial(_signaled, base)))
    recv_wrs = [
        RecvWR(wr_id=i, sg_list=(SGE(res.mem.addr + res.target_off(i), size, res.mem.lkey),))
        for i in range(nq)
    ]
    now = time.perf_counter

    duration = p.duration

    def post_more() -> bool:
        if not send:
            return False
        did = False
        for i in range(nq):
            q = res.qps[i]
            base, signaled = wrs[i]
            while posted[i] < iters and posted[i] - done[i] < tx:
                if t.phases is not None and now() >= t.phases.end:
                    return did
                k = posted[i] + 1
                wr = signaled(k) if (k % cq_mod == 0 or k == iters) else base
                if not t.posted:
                    t.start = now()
                    if duration is not None:
                        t.phases = Phases.begin(t.start, duration)
                if duration is None:
                    t.posted.append(now())
                else:
                    t.posted = [t.start]
                q.post_send(wr)
                posted[i] = k
                did = True
        return did

    def on_wc(i: int, wc: Completion) -> None:
        at = now()
        if wc.opcode in (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM):
            rdone[i] += 1
            if rposted[i] < iters:
                res.qps[i].post_recv(recv_wrs[i])
                rposted[i] += 1
            if not send:
                if t.phases is None and duration is not None:
                    t.phases = Phases.begin(at, duration)  # set_on_first_rx_packet()
                t.count(1, at, duration)
            return
        k = wc.wr_id >> 16
        t.count(k - done[i], at, duration)
        done[i] = k

    def finished() -> bool:
        if duration is not None:
            return t.phases is not None and now() >= t.phases.end
        return all(d >= iters for d in done) and all(r >= iters for r in rdone)

    if not send:
        t.start = recv_start
    pump(res.qps, on_wc, finished, oob_timeout(), f"{p.name}", idle=post_more, spin=spin_of(p))
    if t.phases is not None:
        t.start, t.end = t.phases.sample_start, t.phases.sample_end
    elif not send:
        t.total = iters * nq
    return t


def _signaled(base: SendWR, k: int) -> SendWR:
    return SendWR(
        wr_id=k << 16, opcode=base.opcode, sg_list=base.sg_list, remote_addr=base.remote_addr, rkey=base.rkey,
        compare_add=base.compare_add, swap=base.swap, signaled=True,
    )  # fmt: skip


def bw_report(p: Params, size: int, t: BwTiming, *, peak: bool) -> BwReport:
    """``print_report_bw``: average over the run, peak over the fastest window."""
    factor = 125_000_000 if p.gbits else 0x100000
    elapsed = max(t.end - t.start, 1e-9)
    n = t.total
    avg = size * n / elapsed / factor
    rate = n / elapsed / 1e6
    bw_peak = 0.0
    if peak and not p.no_peak and p.duration is None and t.posted and t.completions:
        best = elapsed / n
        step = max(1, len(t.posted) // PEAK_SAMPLES)
        for i in range(0, len(t.posted), step):
            tp = t.posted[i]
            for j, tc in t.completions:
                if j - 1 >= i:
                    best = min(best, (tc - tp) / (j - i))
        bw_peak = size / max(best, 1e-12) / factor
    return BwReport(size=size, iters=n, bw_peak=bw_peak, bw_avg=avg, msg_rate=rate)


def post_receives(res: Resources, size: int) -> None:
    """``ctx_set_recv_wqes``: the receives of a send test, posted before the barrier that starts it."""
    p = res.p
    for i, q in enumerate(res.qps):
        wr = RecvWR(wr_id=i, sg_list=(SGE(res.mem.addr + res.target_off(i), size, res.mem.lkey),))
        for _ in range(min(p.rx_depth, p.iters)):
            q.post_recv(wr)


# -- latency -----------------------------------------------------------------------------------


def lat_figures(p: Params, size: int, posted: list[float]) -> tuple[LatFigures, list[float], list[float]]:
    """``print_report_lat``'s figures: deltas between consecutive posts, halved for round trips
    (the figures, the samples as measured, and sorted)."""
    rtt = 1 if p.kind.verb in ("read", "atomic") else 2
    samples = [(b - a) * 1e6 / rtt for a, b in itertools.pairwise(posted)]
    delta = sorted(samples)
    m = len(delta) - LAT_MEASURE_TAIL
    if m < 1:
        raise CliError("too few iterations for a latency report")
    median = (delta[m // 2] + delta[m // 2 - 1]) / 2 if (m - 1) % 2 else delta[m // 2]
    avg = sum(delta[:m]) / m
    # perftest squares the integer part of each deviation.
    stdev = math.sqrt(sum(int(avg - d) ** 2 for d in delta[:m]) / m)
    i99, i999 = math.ceil(m * 0.99), math.ceil(m * 0.999)
    figures = LatFigures(size, p.iters, delta[0], delta[m], median, avg, stdev, delta[i99], delta[i999])
    return figures, samples, delta


def lat_report(p: Params, size: int, posted: list[float]) -> tuple[str, LatFigures]:
    """``print_report_lat``: with ``-U`` and ``-H`` each sample first (unsorted, then sorted less the
    tail), with ``--output`` the average alone; and the figures (for ``--out_json``)."""
    f, samples, delta = lat_figures(p, size, posted)
    m = len(delta) - LAT_MEASURE_TAIL
    head = ""
    if p.unsorted:
        head += "#, usec\n" + "".join(f"{i + 1}, {d:g}\n" for i, d in enumerate(samples))
    if p.histogram:
        head += "#, usec\n" + "".join(f"{i + 1}, {d:g}\n" for i, d in enumerate(delta[:m]))
    if head and p.output is None:
        head += f"{RESULT_LINE}\n{RESULT_FMT_LAT}\n"
    if p.output is not None:
        return f"{head}{f.t_avg:f}", f
    return head + REPORT_FMT_LAT % f, f


@dataclass(slots=True)
class LatRun:
    posted: list[float] = field(default_factory=list)
    counted: int = 0  # duration mode: sends completed during the sample
    phases: Phases | None = None


def lat_duration_report(p: Params, size: int, run: LatRun) -> tuple[str, LatDurationFigures]:
    """``print_report_lat_duration``: time per iteration in the sample (halved for round trips), rate."""
    assert run.phases is not None
    rtt = 1 if p.kind.verb in ("read", "atomic") else 2
    seconds = run.phases.sample_end - run.phases.sample_start
    n = max(run.counted, 1)
    f = LatDurationFigures(size, run.counted, seconds * 1e6 / rtt / n, run.counted / seconds)
    if p.output is not None:
        return f"{f.t_avg:f}", f
    return REPORT_FMT_LAT_DUR % f, f


def run_lat(res: Resources, size: int, rem: PerftestDest, *, server: bool) -> LatRun:
    """``run_iter_lat_write`` / ``run_iter_lat_send`` / ``run_iter_lat``: one QP, one message at a time."""
    p = res.p
    q = res.qps[0]
    verb = p.kind.verb
    iters = p.iters
    run = LatRun()
    posted = run.posted
    state = {"send_done": 0, "recv_done": 0}
    if p.duration is not None:
        run.phases = Phases.begin(time.perf_counter(), p.duration)
    phases = run.phases
    sge = (SGE(res.local_addr(0), size, res.mem.lkey),)
    if verb == "write":
        wr = SendWR(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg_list=sge, remote_addr=rem.vaddr, rkey=rem.rkey)
    elif verb == "send":
        wr = SendWR(wr_id=1, opcode=WrOpcode.SEND, sg_list=sge)
    elif verb == "read":
        wr = SendWR(wr_id=1, opcode=WrOpcode.RDMA_READ, sg_list=sge, remote_addr=rem.vaddr, rkey=rem.rkey)
    elif p.atomic_cas:
        wr = SendWR(
            wr_id=1,
            opcode=WrOpcode.ATOMIC_CMP_AND_SWP,
            sg_list=sge,
            remote_addr=rem.vaddr,
            rkey=rem.rkey,
            swap=1,
        )
    else:
        wr = SendWR(
            wr_id=1,
            opcode=WrOpcode.ATOMIC_FETCH_AND_ADD,
            sg_list=sge,
            remote_addr=rem.vaddr,
            rkey=rem.rkey,
            compare_add=1,
        )
    recv_wr = RecvWR(wr_id=2, sg_list=(SGE(res.mem.addr + res.target_off(0), size, res.mem.lkey),))
    rposted = min(p.rx_depth, iters) if verb == "send" else 0
    view = res.mem.view
    post_byte = size - 1
    poll_byte = res.target_off(0) + size - 1

    def on_wc(_i: int, wc: Completion) -> None:
        nonlocal rposted
        if wc.opcode in (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM):
            state["recv_done"] += 1
            if rposted < iters:
                q.post_recv(recv_wr)
                rposted += 1
        else:
            state["send_done"] += 1
            if phases is not None and phases.sampling(time.perf_counter()):
                run.counted += 1

    def over() -> bool:
        return phases is not None and time.perf_counter() >= phases.end

    timeout = oob_timeout()
    spin = spin_of(p)
    gap = p.latency_gap * 1e-6

    def wait(cond: Callable[[], bool], what: str) -> None:
        pump(res.qps, on_wc, lambda: cond() or over(), timeout, f"{p.name}: {what}", spin=spin)

    scnt = rcnt = 0
    # write_lat: the server writes first; send_lat: the client sends first (perftest_resources.c).
    first_waits = (verb == "write" and not server) or (verb == "send" and server)
    two_way = verb in ("write", "send")
    while (scnt < iters or (two_way and rcnt < iters)) and not over():
        if two_way and rcnt < iters and (scnt >= 1 or first_waits):
            rcnt += 1
            if verb == "write":
                want = rcnt & 0xFF
                wait(functools.partial(_byte_is, view, poll_byte, want), "waiting for the peer's write")
            else:
                wait(functools.partial(_reached, state, "recv_done", rcnt), "waiting for the peer's send")
        if scnt < iters and not over():
            if gap and posted:
                while time.perf_counter() - posted[-1] < gap:
                    pass  # perftest spins on the cycle counter for --latency_gap
            if verb == "write":
                view[post_byte] = (scnt + 1) & 0xFF
            if phases is None:
                posted.append(time.perf_counter())
            q.post_send(wr)
            scnt += 1
            wait(functools.partial(_reached, state, "send_done", scnt), "waiting for a completion")
    return run


def spin_of(p: Params) -> float:
    """Seconds a pump polls before it sleeps: `SPIN`, as `rdmakit bench`'s ends; none with ``-e``."""
    return 0.0 if p.events else SPIN


def _byte_is(view: memoryview, offset: int, value: int) -> bool:
    return view[offset] == value


def _reached(state: dict[str, int], key: str, value: int) -> bool:
    return state[key] >= value
