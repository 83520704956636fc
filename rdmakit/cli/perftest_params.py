"""perftest's parameters: its tests, flags, defaults and limits (``perftest_parameters.[ch]``, v4.5-0.17).

``parse`` applies perftest's ``force_dependecies``: the tx depth and a send
test's rx depth are capped at the iterations, CQ moderation is 1 for messages
over 8 KiB unless ``-Q`` is given and never above the tx depth; ``-D`` turns
the iterations into a count kept during the sample.
"""

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rdmakit.cli.errors import EXIT_USAGE, CliError
from rdmakit.cli.oob_messages import (
    ANNOUNCED_VERSION,
)
from rdmakit.cli.options import int_in
from rdmakit.cli.publishing import writable_target
from rdmakit.cli.tool_flags import PERFTEST_FLAGS, add_unimplemented, refuse_given

__all__ = ["PERFTESTS", "Params", "TestKind", "build_parser", "parse"]


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
#: perftest's ``DEFAULT_JSON_FILE_NAME``: where ``--out_json`` writes without ``--out_json_file``.
DEFAULT_JSON_FILE = "perftest_out.json"
#: A peer's cycle buffer and cache line are bounded: they size our allocation.
MAX_PEER_CYCLE_BUFFER = 1 << 26
MAX_PEER_CACHE_LINE = 4096


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
    #: ``-u``: the local ACK timeout code (4.096 µs × 2^code); None keeps the device's default.
    qp_timeout: int | None = None
    #: ``-R``: the test's QPs are connected by RDMA CM (and the exchange runs over it: ``-z``).
    rdma_cm: bool = False
    #: ``-z`` (or ``-R``): the out-of-band exchange is an RC connection made by RDMA CM, not TCP.
    comm_rdma_cm: bool = False
    sizes: list[int] = field(default_factory=list)
    #: ``-i``: the device's port (a verbs device's; a soft device has port 1 only).
    ib_port: int | None = None
    #: ``-L``: the hop limit (IPv4 TTL) of the test's packets.
    hop_limit: int = 255
    #: ``-N``: no peak bandwidth (reported as 0).
    no_peak: bool = False
    #: ``-H`` / ``-U``: print every latency sample, sorted / as measured.
    histogram: bool = False
    unsorted: bool = False
    #: ``--output``: print only this figure ("bandwidth", "message_rate" or "latency").
    output: str | None = None
    #: ``-w`` / ``-y``: fail when the average bandwidth (MB/s) / message rate (Mpps) is below.
    limit_bw: float | None = None
    limit_msgrate: float | None = None
    #: ``--latency_gap``: µs between a latency test's posts.
    latency_gap: int = 0
    #: ``--wait_destroy``: seconds to wait before the resources are destroyed.
    wait_destroy: int = 0
    #: ``-e``: sleep on completion events at once instead of polling first.
    events: bool = False
    #: ``--out_json`` (``--out_json_file``): the file each report is also written to, as JSON.
    out_json: str | None = None

    @property
    def client(self) -> bool:
        return self.server is not None


_int = int_in(-(1 << 63), (1 << 63) - 1)


def _limit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text}: a limit is a number >= 0")
    return value


def build_parser(name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=name,
        allow_abbrev=False,
        description=f"{name}: perftest's test on rdmakit (perftest 6.06 exchange)",
    )
    p.add_argument("server", nargs="?", help="the server's address (client); none: be the server")
    p.add_argument(
        "-p", "--port", type=_int, default=DEF_PORT, help="port of the exchange (TCP; rdma_cm: -R/-z)"
    )
    p.add_argument(
        "-d", "--ib-dev", dest="device",
        help="device: a soft device's address, or a verbs device (default: the first, as 'rdmakit devices')",
    )  # fmt: skip
    p.add_argument("-i", "--ib-port", dest="ib_port", type=_int, help="port of the device (1)")
    p.add_argument("-x", "--gid-index", type=_int, help="GID index (a soft device: rxe's, 1 is its address)")
    p.add_argument("-c", "--connection", default="RC", help="connection type: RC (the only one rdmakit runs)")
    p.add_argument("-L", "--hop_limit", type=_int, default=255, help="hop limit (TTL) 0-255 (255)")
    p.add_argument("-N", "--noPeak", dest="no_peak", action="store_true", help="no peak bandwidth (0)")
    p.add_argument("-H", "--report-histogrm", dest="histogram", action="store_true", help="print each sample")
    p.add_argument(
        "-U", "--report-unsorted", dest="unsorted", action="store_true", help="print every sample unsorted"
    )
    p.add_argument(
        "--output", choices=("bandwidth", "message_rate", "latency"), help="print only this figure"
    )
    p.add_argument("-w", "--limit_bw", type=_limit, help="exit 1 when the average bandwidth is below")
    p.add_argument("-y", "--limit_msgrate", type=_limit, help="exit 1 when the message rate is below")
    p.add_argument("--latency_gap", type=_int, default=0, help="µs between the posts of a latency test")
    p.add_argument("--wait_destroy", type=_int, default=0, help="seconds to wait before destroying")
    p.add_argument(
        "-e", "--events", action="store_true", help="sleep on CQ events (default: poll 200 µs first)"
    )
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
    p.add_argument(
        "-u", "--qp-timeout", dest="qp_timeout", type=_int, help="QP timeout, 4.096 µs * 2^timeout (0..31)"
    )
    p.add_argument(
        "-R", "--rdma_cm", dest="rdma_cm", action="store_true", help="connect the QPs with rdma_cm"
    )
    p.add_argument(
        "-z", "--comm_rdma_cm", dest="comm_rdma_cm", action="store_true",
        help="exchange data over an rdma_cm connection instead of TCP",
    )  # fmt: skip
    p.add_argument("--report_gbits", action="store_true", help="report Gb/sec instead of MB/sec")
    p.add_argument("--out_json", action="store_true", help="also write each report as JSON")
    p.add_argument(
        "--out_json_file", metavar="FILE", default=DEFAULT_JSON_FILE,
        help=f"the JSON report's file (used with --out_json; default {DEFAULT_JSON_FILE} here)",
    )  # fmt: skip
    p.add_argument("-V", "--version", action="version", version=f"Version: {ANNOUNCED_VERSION}")
    add_unimplemented(p, PERFTEST_FLAGS)
    return p


def parse(name: str, argv: Sequence[str]) -> Params:
    kind = PERFTESTS[name]
    parser = build_parser(name)
    a = parser.parse_args(list(argv))
    refuse_given(a, PERFTEST_FLAGS)
    try:
        return _params(name, kind, a)
    except CliError as e:  # every check of a flag's value is a usage error
        raise CliError(str(e), EXIT_USAGE) from None


def _params(name: str, kind: TestKind, a: argparse.Namespace) -> Params:
    if a.connection.upper() != "RC":
        raise CliError(
            f"-c {a.connection}: rdmakit runs RC only (its engine is the RC transport of IBTA Vol. 1 §9; "
            "UC, UD, XRC, DC and SRD have none)"
        )
    if not 0 <= a.hop_limit <= 255:
        raise CliError(f"hop limit must be 0..255, not {a.hop_limit}")
    if a.output is not None and (a.output == "latency") != kind.lat:
        allowed = "latency" if kind.lat else "bandwidth, message_rate"
        raise CliError(f"Output verbosity level for {'LAT' if kind.lat else 'BW'} can be: {allowed}")
    if a.latency_gap < 0 or (a.latency_gap and not kind.lat):
        raise CliError("--latency_gap is a number of µs >= 0, for latency tests only")
    if (a.histogram or a.unsorted) and not kind.lat:
        raise CliError("-H/-U: Available only on Latency tests")
    if a.wait_destroy < 0:
        raise CliError(f"--wait_destroy must be >= 0 seconds, not {a.wait_destroy}")
    if a.ib_port is not None and not 1 <= a.ib_port <= 255:
        raise CliError(f"invalid port number {a.ib_port}")
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
    if a.qp_timeout is not None and not 0 <= a.qp_timeout <= 31:
        raise CliError(f"QP timeout must be 0..31, not {a.qp_timeout}")
    out_reads = 1
    if kind.verb in ("read", "atomic"):
        out_reads = a.outs if a.outs is not None else MAX_OUT_READ
        if not 1 <= out_reads <= MAX_OUT_READ:
            raise CliError(f"outstanding reads must be 1..{MAX_OUT_READ}, not {out_reads}")
    if a.out_json:
        writable_target(Path(a.out_json_file), "--out_json_file")
    run_all = bool(a.all) and kind.verb != "atomic"
    sizes = [1 << i for i in range(1, 24)] if run_all else [size]
    return Params(
        name=name, kind=kind, server=a.server, port=a.port, device=a.device, gid_index=a.gid_index,
        size=MAX_SIZE if run_all else size, iters=iters, run_all=run_all, tx_depth=tx_depth,
        rx_depth=rx_depth, cq_mod=cq_mod, mtu=a.mtu, num_qps=a.qp, duplex=a.bidirectional,
        atomic_cas=a.atomic_type == "CMP_AND_SWAP", gbits=a.report_gbits, out_reads=out_reads, sizes=sizes,
        duration=duration, qp_timeout=a.qp_timeout, rdma_cm=a.rdma_cm,
        comm_rdma_cm=a.rdma_cm or a.comm_rdma_cm, ib_port=a.ib_port, hop_limit=a.hop_limit,
        no_peak=a.no_peak, histogram=a.histogram, unsorted=a.unsorted, output=a.output,
        limit_bw=a.limit_bw, limit_msgrate=a.limit_msgrate, latency_gap=a.latency_gap,
        wait_destroy=a.wait_destroy, events=a.events, out_json=a.out_json_file if a.out_json else None,
    )  # fmt: skip
