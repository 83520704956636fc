"""``rdmakit perftest NAME``: perftest's bandwidth and latency tests, wire-compatible with perftest.

ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw, ib_write_lat, ib_read_lat,
ib_send_lat and ib_atomic_lat, with perftest's flags, defaults, out-of-band
exchange over TCP (port 18515) and output, so an unmodified perftest can be
either peer and scripts that parse perftest's output parse this one. A server
is started without an address, a client with the server's.

rdmakit announces perftest version 6.06, the one Debian bookworm's perftest
4.5+0.17 announces (``ANNOUNCED_VERSION``), and prints that version's output
(``[MB/sec]`` headers; both it and later ``[MiB/sec]`` divide by 2^20). Each
test follows the sequence of out-of-band steps of its C ``main`` at tag
v4.5-0.17 (``write_bw.c``, ``read_bw.c``, ``send_bw.c``, ``atomic_bw.c``,
``write_lat.c``, ``read_lat.c``, ``send_lat.c``, ``atomic_lat.c``): version,
system data, MTU, then the key message, reused as a barrier, and for the
bandwidth tests the report exchange (``xchg_bw_reports``). Timing follows
``perftest_resources.c`` (``run_iter_bw``, ``run_iter_bw_server``,
``run_iter_lat``, ``run_iter_lat_send``, ``run_iter_lat_write``) and the
report arithmetic ``perftest_parameters.c`` (``print_report_bw``,
``print_report_lat``), with the monotonic clock in place of CPU cycles
(``-F`` is accepted and changes nothing). RTR/RTS attributes are
``ctx_modify_qp_to_rtr``/``_rts``'s where they reach the wire or the peer
(MTU, PSNs, ``max_rd_atomic`` from the peer's outstanding reads, RNR retry 7,
``min_rnr_timer`` 12); ``retry_cnt`` and the soft engine's timeout stay
rdmakit's (see ``rdmakit.cli.rc_pingpong``). Two differences: the peak
bandwidth is searched over windows starting at up to 64 evenly spaced posts
(perftest tries every post, quadratic in the iterations), and a requester
does not cycle its remote address within the cycle buffer (the peer cannot
tell).
"""

import argparse
import functools
import itertools
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rdmakit.cli.bench_qp import Memory, TestQp, open_device, pump
from rdmakit.cli.common import CliError, run
from rdmakit.cli.oob_messages import (
    ANNOUNCED_VERSION,
    KEY_MSG_LEN,
    MIN_PEER_VERSION,
    MTU_MSG_LEN,
    SYS_INT_LEN,
    VERSION_LEN,
    BwReport,
    OobFormatError,
    PerftestDest,
    decode_mtu,
    decode_sys_int,
    decode_version,
    encode_mtu,
    encode_sys_int,
    encode_version,
    version_value,
)
from rdmakit.doca.backend import BackendDevice
from rdmakit.engine.types import SGE, Completion, RecvWR, SendWR, WcOpcode, WrOpcode
from rdmakit.transport.oob import OobError, OobStream

__all__ = ["PERFTESTS", "main", "register"]


@dataclass(frozen=True, slots=True)
class TestKind:
    verb: str  # "send", "write", "read", "atomic" (perftest's VerbType)
    lat: bool


PERFTESTS = {
    "ib_write_bw": TestKind("write", False),
    "ib_read_bw": TestKind("read", False),
    "ib_send_bw": TestKind("send", False),
    "ib_atomic_bw": TestKind("atomic", False),
    "ib_write_lat": TestKind("write", True),
    "ib_read_lat": TestKind("read", True),
    "ib_send_lat": TestKind("send", True),
    "ib_atomic_lat": TestKind("atomic", True),
}
_VERB_TITLE = {"send": "Send", "write": "RDMA_Write", "read": "RDMA_Read", "atomic": "Atomic"}

# perftest_parameters.h
DEF_PORT = 18515
DEF_SIZE_BW = 65536
DEF_SIZE_LAT = 2
DEF_SIZE_ATOMIC = 8
DEF_ITERS = 1000
DEF_ITERS_WB = 5000
DEF_TX_BW = 128
DEF_TX_LAT = 1
DEF_RX_SEND = 512
DEF_CQ_MOD = 100
MSG_SIZE_CQ_MOD_LIMIT = 8192
MIN_ITER, MAX_ITER = 5, 100_000_000
MAX_SIZE = 8 << 20  # the buffer of a run over all sizes (-a)
MAX_QP_NUM = 16384
MAX_OUT_READ = 16
#: The cycle buffer (a page) and cache line rdmakit announces (``check_sys_data``).
CYCLE_BUFFER = 4096
CACHE_LINE = 64
#: A peer's cycle buffer and cache line are bounded: they size our allocation.
MAX_PEER_CYCLE_BUFFER = 1 << 26
MAX_PEER_CACHE_LINE = 4096
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


def _timeout() -> float:
    """Seconds allowed for each out-of-band step (``RDMAKIT_OOB_TIMEOUT``, default 60)."""
    try:
        return max(float(os.environ.get("RDMAKIT_OOB_TIMEOUT", "60")), 0.1)
    except ValueError:
        return 60.0


#: A barrier that waits for the peer's whole run is allowed this many steps' time.
RUN_WAIT_FACTOR = 10


# -- parameters --------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Params:
    name: str
    kind: TestKind
    server: str | None
    port: int
    device: str | None
    gid_index: int | None
    size: int
    iters: int
    run_all: bool
    tx_depth: int
    rx_depth: int
    cq_mod: int
    mtu: int | None
    num_qps: int
    duplex: bool
    atomic_cas: bool
    gbits: bool
    out_reads: int
    duration: int | None = None
    sizes: list[int] = field(default_factory=list)

    @property
    def client(self) -> bool:
        return self.server is not None


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def build_parser(name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=name,
        allow_abbrev=False,
        description=f"{name}: perftest's test on rdmakit (perftest 6.06 exchange)",
    )
    p.add_argument("server", nargs="?", help="the server's address (client); none: be the server")
    p.add_argument("-p", "--port", type=_int, default=DEF_PORT, help="TCP port of the exchange (18515)")
    p.add_argument("-d", "--ib-dev", dest="device", help="device: a soft device's address, or a verbs device")
    p.add_argument("-x", "--gid-index", type=_int, help="GID index (verbs devices)")
    p.add_argument("-s", "--size", type=_int, help="message size")
    p.add_argument("-n", "--iters", type=_int, help="iterations")
    p.add_argument("-a", "--all", action="store_true", help="all sizes from 2 to 2^23")
    p.add_argument("-t", "--tx-depth", type=_int, help="send queue depth (bw: 128)")
    p.add_argument("-r", "--rx-depth", type=_int, help="receives posted (send tests: 512)")
    p.add_argument("-Q", "--cq-mod", type=_int, help="signal one send in this many (bw: 100)")
    p.add_argument("-m", "--mtu", type=_int, help="MTU (256..4096; default the port's)")
    p.add_argument("-q", "--qp", type=_int, default=1, help="number of QPs")
    p.add_argument("-b", "--bidirectional", action="store_true", help="both sides send (bw tests)")
    p.add_argument("-A", "--atomic_type", choices=("CMP_AND_SWAP", "FETCH_AND_ADD"), default="FETCH_AND_ADD")
    p.add_argument("-o", "--outs", type=_int, help="outstanding reads/atomics (read and atomic tests)")
    p.add_argument("-D", "--duration", type=_int, help="run for this many seconds instead of -n iterations")
    p.add_argument("-F", "--CPU-freq", dest="cpu_freq", action="store_true", help="accepted; no effect here")
    p.add_argument("--report_gbits", action="store_true", help="report Gb/sec instead of MB/sec")
    p.add_argument("-V", "--version", action="version", version=f"Version: {ANNOUNCED_VERSION}")
    return p


def parse(name: str, argv: Sequence[str]) -> Params:
    kind = PERFTESTS[name]
    parser = build_parser(name)
    a = parser.parse_args(list(argv))
    duration = a.duration
    if duration is not None:
        if duration < 1:
            raise CliError(f"duration must be at least 1 second, not {duration}")
        if a.all:
            raise CliError("Duration mode does not work with running all sizes (-a)")
        if a.iters is not None:
            raise CliError("Duration mode (-D) and iterations (-n) cannot be combined")
    if kind.verb == "atomic":
        if a.size not in (None, DEF_SIZE_ATOMIC):
            raise CliError("Message size cannot be changed for Atomic tests")
        size = DEF_SIZE_ATOMIC
    elif a.size is not None:
        size = a.size
    else:
        size = DEF_SIZE_LAT if kind.lat else DEF_SIZE_BW
    if not 1 <= size <= MAX_SIZE:
        raise CliError(f"message size {size} is outside 1..{MAX_SIZE}")
    iters = (
        a.iters
        if a.iters is not None
        else (DEF_ITERS_WB if (kind.verb == "write" and not kind.lat) else DEF_ITERS)
    )
    if not MIN_ITER <= iters <= MAX_ITER:
        raise CliError(f"iterations must be {MIN_ITER}..{MAX_ITER}, not {iters}")
    if duration is not None:
        iters = MAX_ITER  # the run ends with the clock; iterations are counted

    tx_depth = a.tx_depth if a.tx_depth is not None else (DEF_TX_LAT if kind.lat else DEF_TX_BW)
    if not 1 <= tx_depth <= 15000:
        raise CliError(f"tx depth must be 1..15000, not {tx_depth}")
    tx_depth = min(tx_depth, iters)
    rx_depth = a.rx_depth if a.rx_depth is not None else (DEF_RX_SEND if kind.verb == "send" else 1)
    if not 1 <= rx_depth <= 16384:
        raise CliError(f"rx depth must be 1..16384, not {rx_depth}")
    if kind.verb == "send":
        rx_depth = min(rx_depth, iters)
    if a.cq_mod is not None and not 1 <= a.cq_mod <= 1024:
        raise CliError(f"CQ moderation must be 1..1024, not {a.cq_mod}")
    cq_mod = a.cq_mod if a.cq_mod is not None else DEF_CQ_MOD
    # force_dependecies(): large messages are signalled one by one unless asked otherwise.
    if size > MSG_SIZE_CQ_MOD_LIMIT and not a.all and a.cq_mod is None:
        cq_mod = 1
    cq_mod = min(cq_mod, tx_depth)
    if a.mtu is not None and a.mtu not in (256, 512, 1024, 2048, 4096):
        raise CliError(f"invalid MTU {a.mtu} (256, 512, 1024, 2048 or 4096)")
    if not 1 <= a.qp <= MAX_QP_NUM:
        raise CliError(f"number of QPs must be 1..{MAX_QP_NUM}, not {a.qp}")
    if a.bidirectional and kind.lat:
        raise CliError("Bidirectional mode not supported in latency tests")
    if a.gid_index is not None and not 0 <= a.gid_index <= 64:
        raise CliError(f"GID index must be 0..64, not {a.gid_index}")
    if not 1 <= a.port <= 65535:
        raise CliError(f"invalid port {a.port}")
    out_reads = 1
    if kind.verb in ("read", "atomic"):
        out_reads = a.outs if a.outs is not None else MAX_OUT_READ
        if not 1 <= out_reads <= MAX_OUT_READ:
            raise CliError(f"outstanding reads must be 1..{MAX_OUT_READ}, not {out_reads}")
    run_all = bool(a.all) and kind.verb != "atomic"
    sizes = [1 << i for i in range(1, 24)] if run_all else [size]
    return Params(
        name=name, kind=kind, server=a.server, port=a.port, device=a.device, gid_index=a.gid_index,
        size=MAX_SIZE if run_all else size, iters=iters, run_all=run_all, tx_depth=tx_depth,
        rx_depth=rx_depth, cq_mod=cq_mod, mtu=a.mtu, num_qps=a.qp, duplex=a.bidirectional,
        atomic_cas=a.atomic_type == "CMP_AND_SWAP", gbits=a.report_gbits, out_reads=out_reads, sizes=sizes,
        duration=duration,
    )  # fmt: skip


# -- the out-of-band exchange ------------------------------------------------------------------


class Exchange:
    """perftest's ``ctx_xchg_data``: fixed-size, the client writes first, the server reads first."""

    def __init__(self, stream: OobStream, client: bool) -> None:
        self.stream = stream
        self.client = client
        self.timeout = _timeout()
        self.qps: list[TestQp] = []

    def _service(self) -> None:
        for q in self.qps:
            q.qp.progress()

    def xchg(self, mine: bytes, n: int, what: str, timeout: float | None = None) -> bytes:
        t = self.timeout if timeout is None else timeout
        fd = self.qps[0].qp.fileno() if self.qps else -1
        service = self._service if self.qps else None
        if self.client:
            self.stream.send(mine)
            return self.stream.recv_exact(n, t, what, service, fd)
        got = self.stream.recv_exact(n, t, what, service, fd)
        self.stream.send(mine)
        return got

    def hand_shake(self, mine: PerftestDest, long_wait: bool = False) -> PerftestDest:
        t = self.timeout * RUN_WAIT_FACTOR if long_wait else self.timeout
        return PerftestDest.decode(self.xchg(mine.encode(), KEY_MSG_LEN, "the key message", t))

    def close_connection(self, mine: PerftestDest, long_wait: bool = False) -> None:
        """``ctx_close_connection``: one more barrier, then ``"done"`` (nobody reads it) and close."""
        self.hand_shake(mine, long_wait)
        self.stream.send(b"done\0")
        self.stream.close()

    def reports(self, mine: BwReport) -> BwReport:
        """``xchg_bw_reports``: five fields, each its own exchange."""
        parts = [self.xchg(raw, 8, "the report", self.timeout) for raw in mine.parts()]
        return BwReport.from_parts(parts)

    def send_report(self, mine: BwReport) -> None:
        """The same exchange where the peer's report is not used: a perftest server sends an
        uninitialised one (``my_bw_rep`` of a one-sided test's server), so it is not checked."""
        for raw in mine.parts():
            self.xchg(raw, 8, "the report", self.timeout)


@dataclass(slots=True, kw_only=True)
class Negotiated:
    peer_version: str
    cycle_buffer: int
    cache_line: int
    mtu_enum_peer: int  # bytes


def negotiate(ex: Exchange, own_mtu: int) -> Negotiated:
    """Steps 1-3: versions, system data, MTU (``exchange_versions``, ``check_sys_data``, ``check_mtu``)."""
    peer = decode_version(ex.xchg(encode_version(), VERSION_LEN, "the perftest version"))
    if version_value(peer) < MIN_PEER_VERSION:
        raise CliError(f"the peer runs perftest {peer}; versions older than 5.70 are not supported")
    cycle = decode_sys_int(
        ex.xchg(encode_sys_int(CYCLE_BUFFER), SYS_INT_LEN, "the cycle buffer size"),
        "cycle buffer size", MAX_PEER_CYCLE_BUFFER,
    )  # fmt: skip
    line = decode_sys_int(
        ex.xchg(encode_sys_int(CACHE_LINE), SYS_INT_LEN, "the cache line size"),
        "cache line size",
        MAX_PEER_CACHE_LINE,
    )
    peer_mtu = decode_mtu(ex.xchg(encode_mtu(own_mtu), MTU_MSG_LEN, "the MTU"))
    return Negotiated(
        peer_version=peer,
        cycle_buffer=max(cycle, CYCLE_BUFFER),
        cache_line=max(line, CACHE_LINE),
        mtu_enum_peer=peer_mtu,
    )


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
    if p.kind.verb in ("read", "atomic"):
        lines.append(f" Outstand reads  : {p.out_reads}")
    lines += [" Max inline data : 0[B]", " rdma_cm QPs\t : OFF", " Data ex. method : Ethernet", RESULT_LINE]
    _out("\n".join(lines))


def print_dest(p: Params, side: str, d: PerftestDest) -> None:
    line = f" {side} address: LID {_c_hex(d.lid, 4)} QPN {_c_hex(d.qpn, 6)} PSN {_c_hex(d.psn, 6)}"
    if p.kind.verb == "read":
        line += f" OUT {_c_hex(d.out_reads, 4)}"
    if p.kind.verb in ("read", "write"):
        line += f" RKey {_c_hex(d.rkey, 8)} VAddr {_c_hex(d.vaddr, 16)}"
    gid = ":".join(f"{b:02d}" for b in d.gid.packed)
    _out(f"{line}\n GID: {gid}")


def _out(text: str) -> None:
    print(text, flush=True)


def bw_line(p: Params, rep: BwReport, rem: BwReport | None = None) -> str:
    peak, avg, rate = rep.bw_peak, rep.bw_avg, rep.msg_rate
    if rem is not None:
        peak, avg, rate = peak + rem.bw_peak, avg + rem.bw_avg, rate + rem.msg_rate
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
        elif verb == "write":
            base = SendWR(
                wr_id=0,
                opcode=WrOpcode.RDMA_WRITE,
                sg_list=sge,
                remote_addr=r.vaddr,
                rkey=r.rkey,
                signaled=False,
            )
        elif verb == "read":
            base = SendWR(
                wr_id=0,
                opcode=WrOpcode.RDMA_READ,
                sg_list=sge,
                remote_addr=r.vaddr,
                rkey=r.rkey,
                signaled=False,
            )
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
    pump(res.qps, on_wc, finished, _timeout(), f"{p.name}", idle=post_more)
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
    if peak and p.duration is None and t.posted and t.completions:
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


def lat_report(p: Params, size: int, posted: list[float]) -> str:
    """``print_report_lat``: deltas between consecutive posts, halved for round trips."""
    rtt = 1 if p.kind.verb in ("read", "atomic") else 2
    delta = sorted((b - a) * 1e6 / rtt for a, b in itertools.pairwise(posted))
    m = len(delta) - LAT_MEASURE_TAIL
    if m < 1:
        raise CliError("too few iterations for a latency report")
    median = (delta[m // 2] + delta[m // 2 - 1]) / 2 if (m - 1) % 2 else delta[m // 2]
    avg = sum(delta[:m]) / m
    # perftest squares the integer part of each deviation.
    stdev = math.sqrt(sum(int(avg - d) ** 2 for d in delta[:m]) / m)
    i99, i999 = math.ceil(m * 0.99), math.ceil(m * 0.999)
    return REPORT_FMT_LAT % (size, p.iters, delta[0], delta[m], median, avg, stdev, delta[i99], delta[i999])


@dataclass(slots=True)
class LatRun:
    posted: list[float] = field(default_factory=list)
    counted: int = 0  # duration mode: sends completed during the sample
    phases: Phases | None = None


def lat_duration_report(p: Params, size: int, run: LatRun) -> str:
    """``print_report_lat_duration``: time per iteration in the sample (halved for round trips), rate."""
    assert run.phases is not None
    rtt = 1 if p.kind.verb in ("read", "atomic") else 2
    seconds = run.phases.sample_end - run.phases.sample_start
    n = max(run.counted, 1)
    return REPORT_FMT_LAT_DUR % (size, run.counted, seconds * 1e6 / rtt / n, run.counted / seconds)


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

    def wait(cond: Callable[[], bool], what: str) -> None:
        pump(res.qps, on_wc, lambda: cond() or over(), _timeout(), f"{p.name}: {what}")

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
            if verb == "write":
                view[post_byte] = (scnt + 1) & 0xFF
            if phases is None:
                posted.append(time.perf_counter())
            q.post_send(wr)
            scnt += 1
            wait(functools.partial(_reached, state, "send_done", scnt), "waiting for a completion")
    return run


def _byte_is(view: memoryview, offset: int, value: int) -> bool:
    return view[offset] == value


def _reached(state: dict[str, int], key: str, value: int) -> bool:
    return state[key] >= value


# -- the tests ---------------------------------------------------------------------------------


def main(name: str, argv: Sequence[str]) -> int:
    p = parse(name, argv)
    dev = open_device(p.device, p.gid_index)
    try:
        return _run(p, dev)
    except (OobError, OobFormatError) as e:
        raise CliError(str(e), status=3 if getattr(e, "timeout", False) else 1) from e
    finally:
        dev.close()


def _run(p: Params, dev: BackendDevice) -> int:
    own_mtu = min(p.mtu or dev.mtu, dev.mtu, 4096)
    if p.client:
        assert p.server is not None
        stream = OobStream.connect(p.server, p.port, _timeout())
    else:
        _out(
            "\n************************************\n"
            "* Waiting for client to connect... *\n"
            "************************************"
        )
        stream = OobStream.accept(p.port, _timeout() * RUN_WAIT_FACTOR)
    with stream:
        ex = Exchange(stream, p.client)
        neg = negotiate(ex, own_mtu)
        mtu = min(own_mtu, neg.mtu_enum_peer)
        res = Resources(p, dev, neg.cycle_buffer)
        ex.qps = res.qps
        try:
            return _test(p, ex, res, mtu)
        finally:
            res.close()


def _connect(p: Params, res: Resources, rem: list[PerftestDest], mtu: int) -> None:
    for q, r in zip(res.qps, rem, strict=True):
        q.set_options(
            min_rnr_timer=12, rnr_retry=7, max_dest_rd_atomic=p.out_reads,
            max_rd_atomic=max(1, min(r.out_reads, MAX_OUT_READ)),
            hop_limit=255,
        )  # fmt: skip
        q.connect(gid=r.gid, qpn=r.qpn, psn=r.psn, mtu=mtu)


def _test(p: Params, ex: Exchange, res: Resources, mtu: int) -> int:
    verb, nq = p.kind.verb, p.num_qps
    mine = [res.dest(i) for i in range(nq)]
    gid_index = p.gid_index if p.gid_index is not None else _gid_index(res)
    print_test_info(p, res.dev, mtu, gid_index)
    lat_prefix = p.kind.lat and verb != "send"
    if lat_prefix:  # write_lat, read_lat, atomic_lat: one barrier before the keys
        ex.hand_shake(mine[0])
    rem = [ex.hand_shake(mine[i]) for i in range(nq)]
    _connect(p, res, rem, mtu)
    if verb == "send":  # send_bw, send_lat: the barrier after RTR comes before the printing
        ex.hand_shake(mine[0])
    for d in mine:
        print_dest(p, "local", d)
    for i in range(nq):
        print_dest(p, "remote", ex.hand_shake(mine[i]))
    if verb != "send":
        ex.hand_shake(mine[0])
    if p.kind.lat:
        return _lat(p, ex, res, mine, rem)
    return _bw(p, ex, res, mine, rem)


def _gid_index(res: Resources) -> int:
    idx = getattr(res.dev, "gid_index", 0)
    return int(idx) if isinstance(idx, int) else 0


def _bw(p: Params, ex: Exchange, res: Resources, mine: list[PerftestDest], rem: list[PerftestDest]) -> int:
    verb = p.kind.verb
    header = RESULT_FMT_G if p.gbits else RESULT_FMT
    _out(f"{RESULT_LINE}\n{header}")
    if verb != "send":
        if not p.client and not p.duplex:
            # The server of a one-sided test waits for the client's run, then prints the client's report.
            ex.hand_shake(mine[0], long_wait=True)
            theirs = ex.reports(
                BwReport(size=p.sizes[-1], iters=p.iters * p.num_qps, bw_peak=0, bw_avg=0, msg_rate=0)
            )
            _out(bw_line(p, theirs))
            ex.close_connection(mine[0])
            _out(RESULT_LINE)
            return 0
        last: BwReport | None = None
        for size in p.sizes:
            if p.duplex:
                ex.hand_shake(mine[0], long_wait=True)
            t = run_bw(res, size, rem, send=True, recv=False, recv_start=0.0)
            if p.duplex and p.run_all and verb != "atomic":
                ex.hand_shake(mine[0], long_wait=True)
            last = bw_report(p, size, t, peak=True)
            if p.duplex:
                theirs = ex.reports(last)
                _out(bw_line(p, last, theirs))
            else:
                _out(bw_line(p, last))
        _out(RESULT_LINE)
        assert last is not None
        if not p.duplex:
            ex.hand_shake(mine[0], long_wait=True)
            ex.send_report(last)
        ex.close_connection(mine[0])
        return 0
    # send_bw
    for size in p.sizes:
        sends = p.client or p.duplex
        receives = not p.client or p.duplex
        if receives:
            post_receives(res, size)
        ex.hand_shake(mine[0], long_wait=True)
        t = run_bw(res, size, rem, send=sends, recv=receives, recv_start=time.perf_counter())
        report = bw_report(p, size, t, peak=sends)
        if p.duplex:
            theirs = ex.reports(report)
            _out(bw_line(p, report, theirs))
        else:
            _out(bw_line(p, report))
        if p.run_all:
            ex.hand_shake(mine[0], long_wait=True)
    _out(RESULT_LINE)
    ex.close_connection(mine[0], long_wait=True)
    return 0


def _lat(p: Params, ex: Exchange, res: Resources, mine: list[PerftestDest], rem: list[PerftestDest]) -> int:
    verb = p.kind.verb
    if verb in ("read", "atomic") and not p.client:
        # Only the client posts reads and atomics: the server waits for it to close.
        ex.close_connection(mine[0], long_wait=True)
        _out(RESULT_LINE)
        return 0
    _out(f"{RESULT_LINE}\n{RESULT_FMT_LAT if p.duration is None else RESULT_FMT_LAT_DUR}")
    for size in p.sizes:
        if verb == "send":
            post_receives(res, size)
            ex.hand_shake(mine[0], long_wait=True)
        run = run_lat(res, size, rem[0], server=not p.client)
        _out(lat_report(p, size, run.posted) if p.duration is None else lat_duration_report(p, size, run))
    _out(RESULT_LINE)
    if verb != "write":  # write_lat ends without a closing barrier
        ex.close_connection(mine[0], long_wait=True)
    return 0


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "perftest",
        help="perftest's ib_*_bw / ib_*_lat tests, wire-compatible with perftest",
        description="Run a perftest test (ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw, ib_write_lat, "
        "ib_read_lat, ib_send_lat, ib_atomic_lat) with perftest's flags; "
        "'rdmakit perftest NAME -h' lists them.",
        add_help=True,
    )
    p.add_argument("test", choices=sorted(PERFTESTS), metavar="NAME", help=", ".join(sorted(PERFTESTS)))
    p.add_argument("args", nargs=argparse.REMAINDER, help="perftest's flags and the server's address")
    p.set_defaults(handler=run(p, lambda a: main(a.test, a.args)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1], sys.argv[2:]))
