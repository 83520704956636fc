"""Every flag of perftest 6.x, ``ibv_rc_pingpong`` and ``rping``, and what rdmakit does with each.

One table per tool, from its source: perftest's ``long_options`` and
``usage()`` in ``src/perftest_parameters.c`` (tag v4.5-0.20, perftest 6.10,
the last 6.x), rdma-core's ``libibverbs/examples/rc_pingpong.c`` and
``librdmacm/examples/rping.c``. A flag rdmakit implements is `Does.SAME`
(the program's own parser adds it); one it accepts without effect is
`Does.IGNORED`, and one it cannot honour is `Does.REFUSED`: both come with
the reason, which the program's help shows and, for a refused flag, its one
line of error (a usage error, status 2). ``docs/perftest.md`` prints these
tables (`markdown`), and a test checks that it does.
"""

import argparse
import enum
from collections.abc import Iterable
from dataclasses import dataclass

from rdmakit.cli.errors import EXIT_USAGE, CliError

__all__ = [
    "PERFTEST_FLAGS",
    "RC_PINGPONG_FLAGS",
    "RPING_FLAGS",
    "Does",
    "Flag",
    "add_unimplemented",
    "markdown",
    "refuse_given",
]


class Does(enum.Enum):
    SAME = "same"
    IGNORED = "accepted, no effect"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True, kw_only=True)
class Flag:
    short: str | None = None  # "-x"
    long: str | None = None  # "--gid-index"
    arg: str | None = None  # the value's name; None for a switch
    does: Does = Does.SAME
    #: What the original does with it (its usage line).
    what: str
    #: What rdmakit does, and why when it is not the same.
    why: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.short, self.long) if n)

    @property
    def dest(self) -> str:
        return "habit_" + self.names[-1].lstrip("-").replace("-", "_")


IGN, R = Does.IGNORED, Does.REFUSED
_RAW = "raw Ethernet tests only (raw_ethernet_bw/lat/fs_rate); rdmakit has no raw Ethernet QPs"
_GPU = "GPU memory: the soft engine registers host memory only"
_CRYPTO = "mlx5 AES-XTS crypto offload: a NIC feature the soft engine does not have"
_RATE = "rate limiting (perftest's SW, HW or packet-pacing limiter) is not implemented"
_DC = "DC transport (mlx5): rdmakit runs RC only"
_MCAST = "multicast is UD only; rdmakit runs RC"
_ODP = "the soft engine registers memory up front"
_ONE_PORT = "a soft device has one port"
_NO_RAW_FLAGS = (
    "force-link", "remote_mac", "local_mac", "remote_ip", "local_ip", "remote_port", "local_port",
    "tcp", "promiscuous", "sniffer", "raw_mcast", "raw_ipv6", "flows", "flows_burst", "reply_every",
    "vlan_en", "vlan_pcp",
)  # fmt: skip

PERFTEST_FLAGS: tuple[Flag, ...] = (
    Flag(short="-p", long="--port", arg="PORT", what="listen on/connect to port (18515)"),
    Flag(short="-d", long="--ib-dev", arg="DEV", what="use IB device DEV (default first device found)",
         why="a soft device's address or a verbs device; without -d the first device of `rdmakit devices` "
             "that speaks RoCE (a verbs device, else the first soft UDP device)"),
    Flag(short="-i", long="--ib-port", arg="PORT", what="port of the device (1)",
         why="a soft device has one port, 1"),
    Flag(short="-m", long="--mtu", arg="MTU", what="MTU 256-4096 (default the port's)"),
    Flag(short="-s", long="--size", arg="SIZE", what="message size"),
    Flag(short="-n", long="--iters", arg="N", what="number of exchanges"),
    Flag(short="-t", long="--tx-depth", arg="N", what="size of the tx queue"),
    Flag(short="-u", long="--qp-timeout", arg="N", what="QP timeout, 4.096 µs × 2^N"),
    Flag(short="-S", long="--sl", arg="SL", does=IGN, what="service level",
         why="RoCE carries no SL (a NIC maps it to a VLAN priority); the soft engine sends no VLAN tag"),
    Flag(short="-x", long="--gid-index", arg="N", what="GID index",
         why="on a soft device, rxe's table: 1 is the address (IPv4-mapped for IPv4); 0, rxe's "
             "link-local IPv6 GID, is refused with the reason"),
    Flag(short="-a", long="--all", what="all sizes from 2 to 2^23"),
    Flag(short="-F", long="--CPU-freq", does=IGN, what="no warning about cpufreq",
         why="rdmakit times with the monotonic clock, so there is no warning to silence"),
    Flag(short="-c", long="--connection", arg="TYPE", what="connection type RC/XRC/UC/UD/DC/SRD",
         why="RC runs; UC, UD, XRC, DC and SRD are refused with the reason (the engine is RC only)"),
    Flag(short="-q", long="--qp", arg="N", what="number of QPs"),
    Flag(short="-e", long="--events", what="sleep on CQ events (default poll)",
         why="without -e rdmakit polls 200 µs after the last event (as `rdmakit bench`), then sleeps"),
    Flag(short="-X", long="--vector", arg="N", does=IGN, what="completion vector for events",
         why="a soft device has one completion channel"),
    Flag(short="-I", long="--inline_size", arg="SIZE", does=IGN, what="max size of inline data",
         why="inline saves a NIC a DMA read; the soft engine copies every payload at transmit anyway"),
    Flag(short="-o", long="--outs", arg="N", what="outstanding reads/atomics"),
    Flag(short="-g", long="--mcg", does=R, what="multicast group", why=_MCAST),
    Flag(short="-z", long="--comm_rdma_cm", what="exchange data over rdma_cm"),
    Flag(short="-R", long="--rdma_cm", what="connect the QPs with rdma_cm"),
    Flag(short="-T", long="--tos", arg="TOS", does=IGN, what="type of service of rdma_cm QPs (with -R)",
         why="the soft engine sends DSCP 0 on every QP"),
    Flag(short="-L", long="--hop_limit", arg="N", what="hop limit (TTL) 0-255"),
    Flag(short="-h", long="--help", what="help"),
    Flag(short="-M", long="--MGID", arg="GID", does=R, what="multicast group GID", why=_MCAST),
    Flag(short="-r", long="--rx-depth", arg="N", what="receive queue size"),
    Flag(short="-b", long="--bidirectional", what="bidirectional bandwidth"),
    Flag(short="-Q", long="--cq-mod", arg="N", what="a completion every N sends"),
    Flag(short="-N", long="--noPeak", what="no peak bandwidth (printed as 0)"),
    Flag(short="-V", long="--version", what="version"),
    Flag(short="-C", long="--report-cycles", does=R, what="report CPU cycles instead of µs",
         why="rdmakit times with the monotonic clock and has no cycle counts to report"),
    Flag(short="-H", long="--report-histogrm", what="print every latency sample (latency tests)"),
    Flag(short="-U", long="--report-unsorted", what="print every sample unsorted (implies -H)"),
    Flag(short="-A", long="--atomic_type", arg="TYPE", what="CMP_AND_SWAP or FETCH_AND_ADD"),
    Flag(short="-O", long="--dualport", does=R, what="dual-port mode", why=_ONE_PORT),
    Flag(short="-l", long="--post_list", arg="N", does=IGN, what="post a list of N send WQEs at once",
         why="the soft engine takes one WR per post; N posts put the same packets on the wire"),
    Flag(short="-D", long="--duration", arg="SECONDS", what="run for this many seconds"),
    Flag(short="-f", long="--margin", arg="SECONDS", does=IGN, what="margin of a duration run (2 s)",
         why="rdmakit's -D warms up and cools down for a quarter of the duration each"),
    Flag(short="-B", long="--source_mac", arg="MAC", does=R, what="source MAC", why=_RAW),
    Flag(short="-E", long="--dest_mac", arg="MAC", does=R, what="destination MAC", why=_RAW),
    Flag(short="-J", long="--dest_ip", arg="IP", does=R, what="destination IP", why=_RAW),
    Flag(short="-j", long="--source_ip", arg="IP", does=R, what="source IP", why=_RAW),
    Flag(short="-K", long="--dest_port", arg="PORT", does=R, what="destination UDP port", why=_RAW),
    Flag(short="-k", long="--source_port", arg="PORT", does=R, what="source UDP port", why=_RAW),
    Flag(short="-Y", long="--ethertype", arg="TYPE", does=R, what="ethertype", why=_RAW),
    Flag(short="-w", long="--limit_bw", arg="MBPS", what="fail when the average bandwidth is below"),
    Flag(short="-y", long="--limit_msgrate", arg="MPPS", what="fail when the message rate is below"),
    Flag(short="-Z", long="--server", does=R, what="raw Ethernet server", why=_RAW),
    Flag(short="-P", long="--client", does=R, what="raw Ethernet client", why=_RAW),
    Flag(short="-v", long="--mac_fwd", does=R, what="MAC forwarding", why=_RAW),
    Flag(short="-G", long="--use_rss", does=R, what="RSS", why=_RAW),
    Flag(short="-W", long="--report-counters", arg="LIST", does=R, what="report sysfs counter changes",
         why="a soft device has no sysfs counters (its own are in its statistics)"),
    *(Flag(long=f"--{n}", arg=None if n.endswith(("tcp", "promiscuous", "sniffer", "mcast", "ipv6", "_en"))
           else "VALUE", does=R, what="raw Ethernet", why=_RAW) for n in _NO_RAW_FLAGS),
    Flag(long="--run_infinitely", does=R, what="run forever, a report every -D seconds",
         why="rdmakit runs one sample: run it in a loop (-D N)"),
    Flag(long="--report_gbits", what="Gb/sec instead of MB/sec"),
    Flag(long="--use-srq", does=R, what="shared receive queue", why="the soft engine has no SRQ"),
    Flag(long="--report-both", does=R, what="RX and TX separately (bidirectional)",
         why="rdmakit prints the combined bidirectional report only"),
    Flag(long="--reversed", does=R, what="the server sends to the client",
         why="not implemented: swap the two commands' roles instead"),
    Flag(long="--pkey_index", arg="N", does=IGN, what="P_Key index",
         why="RoCE uses the default P_Key 0xffff (index 0), the only one the soft device has"),
    Flag(long="--burst_size", arg="N", does=R, what="rate limiter burst", why=_RATE),
    Flag(long="--typical_pkt_size", arg="N", does=R, what="rate limiter packet size", why=_RATE),
    Flag(long="--rate_limit", arg="RATE", does=R, what="maximum send rate", why=_RATE),
    Flag(long="--rate_limit_type", arg="TYPE", does=R, what="HW, SW or PP limiter", why=_RATE),
    Flag(long="--rate_units", arg="UNITS", does=R, what="rate limit units", why=_RATE),
    Flag(long="--output", arg="WHAT", what="print only bandwidth, message_rate or latency"),
    Flag(long="--cpu_util", does=R, what="CPU utilisation (duration mode)",
         why="not measured: run the tool under time(1)"),
    Flag(long="--out_json", what="save the report as JSON"),
    Flag(long="--out_json_file", arg="FILE", what="the JSON report's file (perftest_out.json)"),
    Flag(long="--latency_gap", arg="USEC", what="delay between the posts of a latency test"),
    Flag(long="--flow_label", arg="N", does=IGN, what="IPv6 flow label",
         why="the soft engine's datagrams carry the kernel's flow label"),
    Flag(long="--retry_count", arg="N", does=IGN, what="rdma_cm retry count (-R)",
         why="the soft connection manager keeps its own REQ retries"),
    Flag(long="--dont_xchg_versions", does=R, what="skip the version and MTU exchange",
         why="rdmakit's exchange is 6.06's, which always exchanges them"),
    Flag(long="--payload_file_path", arg="FILE", does=R, what="payload pattern from a file",
         why="not implemented"),
    Flag(long="--use_cuda", arg="ID", does=R, what="CUDA memory", why=_GPU),
    Flag(long="--use_cuda_bus_id", arg="ID", does=R, what="CUDA memory by PCIe address", why=_GPU),
    Flag(long="--use_cuda_dmabuf", does=R, what="CUDA DMA-BUF", why=_GPU),
    Flag(long="--use_rocm", arg="ID", does=R, what="ROCm memory", why=_GPU),
    Flag(long="--mmap", arg="FILE", does=R, what="an mmap'd file as the buffer", why="not implemented"),
    Flag(long="--mmap-offset", arg="N", does=R, what="offset in the --mmap file", why="not implemented"),
    Flag(long="--ipv6", does=IGN, what="use an IPv6 GID",
         why="the GID's family is the -d address's: give an IPv6 address for IPv6"),
    Flag(long="--report-per-port", does=R, what="per-port reports (dual port)", why=_ONE_PORT),
    Flag(long="--odp", does=R, what="on-demand paging", why=_ODP),
    Flag(long="--use_hugepages", does=IGN, what="hugepage buffers",
         why="the buffer is a page-aligned mapping; its page size changes nothing the engine does"),
    Flag(long="--use_old_post_send", does=IGN, what="ibv_post_send instead of ibv_wr_*",
         why="the soft engine has one post path"),
    Flag(long="--mr_per_qp", does=IGN, what="a memory region per QP",
         why="the QPs use one registered buffer, laid out as perftest's"),
    Flag(long="--dlid", arg="LID", does=R, what="destination LID", why="RoCE has no LIDs"),
    Flag(long="--tclass", arg="N", does=IGN, what="GRH traffic class",
         why="the soft engine sends DSCP 0 on every QP"),
    Flag(long="--wait_destroy", arg="SECONDS", what="wait before destroying the resources"),
    Flag(long="--perform_warm_up", does=IGN, what="warm-up iterations (bw tests)",
         why="the soft engine has no NIC caches to warm"),
    Flag(long="--recv_post_list", arg="N", does=IGN, what="post a list of N receive WQEs",
         why="the soft engine takes one WR per post; the same receives are posted"),
    Flag(long="--aes_xts", does=R, what="AES-XTS", why=_CRYPTO),
    Flag(long="--encrypt_on_tx", does=R, what="encrypt on transmit", why=_CRYPTO),
    Flag(long="--sig_before", does=R, what="signature before crypto", why=_CRYPTO),
    Flag(long="--aes_block_size", arg="N", does=R, what="AES block size", why=_CRYPTO),
    Flag(long="--kek_path", arg="FILE", does=R, what="key-encryption key", why=_CRYPTO),
    Flag(long="--credentials_path", arg="FILE", does=R, what="crypto credentials", why=_CRYPTO),
    Flag(long="--data_enc_keys_number", arg="N", does=R, what="data encryption keys", why=_CRYPTO),
    Flag(long="--data_enc_key_app_path", arg="FILE", does=R, what="data encryption key app", why=_CRYPTO),
    Flag(long="--log_dci_streams", arg="N", does=R, what="DCI streams", why=_DC),
    Flag(long="--log_active_dci_streams", arg="N", does=R, what="active DCI streams", why=_DC),
    Flag(long="--disable_pcie_relaxed", does=IGN, what="no PCIe relaxed ordering",
         why="no PCIe: the header says 'Unsupported' already"),
    Flag(long="--use_ooo", does=R, what="out-of-order data placement",
         why="the soft engine places in order (IBTA §9.7.5.1: it NAKs a PSN gap)"),
)  # fmt: skip

RC_PINGPONG_FLAGS: tuple[Flag, ...] = (
    Flag(short="-p", long="--port", arg="PORT", what="listen on/connect to port (18515)"),
    Flag(short="-d", long="--ib-dev", arg="DEV", what="use IB device DEV (default first device found)",
         why="as perftest's -d"),
    Flag(short="-i", long="--ib-port", arg="PORT", what="port of the device (1)"),
    Flag(short="-s", long="--size", arg="SIZE", what="message size (4096)"),
    Flag(short="-m", long="--mtu", arg="MTU", what="path MTU (1024)"),
    Flag(short="-r", long="--rx-depth", arg="N", what="receives to post at a time (500)"),
    Flag(short="-n", long="--iters", arg="N", what="number of exchanges (1000)"),
    Flag(short="-l", long="--sl", arg="SL", does=IGN, what="service level",
         why="RoCE carries no SL; the soft engine sends no VLAN tag"),
    Flag(short="-e", long="--events", what="sleep on CQ events (default poll)",
         why="without -e rdmakit polls 200 µs after the last event, then sleeps"),
    Flag(short="-g", long="--gid-idx", arg="N", what="local port GID index", why="as perftest's -x"),
    Flag(short="-o", long="--odp", does=R, what="on-demand paging", why=_ODP),
    Flag(short="-O", long="--iodp", does=R, what="implicit on-demand paging",
         why=_ODP),
    Flag(short="-P", long="--prefetch", does=R, what="prefetch an ODP MR (with -o)",
         why=_ODP),
    Flag(short="-t", long="--ts", does=R, what="completion timestamps",
         why="the soft engine's completions carry no timestamp"),
    Flag(short="-c", long="--chk", what="validate the received buffer"),
    Flag(short="-j", long="--dm", does=R, what="device memory", why="a soft device has no device memory"),
    Flag(short="-N", long="--new_send", does=IGN, what="the ibv_wr_* post API",
         why="the soft engine has one post path; the packets are the same"),
    Flag(short="-U", long="--allow-cc-unprotected", does=IGN, what="unprotected memory on CoCo guests",
         why="rdmakit allocates ordinary memory"),
)  # fmt: skip

RPING_FLAGS: tuple[Flag, ...] = (
    Flag(short="-s", what="server side"),
    Flag(short="-c", what="client side"),
    Flag(short="-a", arg="ADDR", what="address (the server's, or to listen on)"),
    Flag(short="-I", arg="ADDR", what="source address for the client"),
    Flag(short="-p", arg="PORT", what="port (7174)"),
    Flag(short="-C", arg="COUNT", what="ping count times"),
    Flag(short="-S", arg="SIZE", what="ping data size"),
    Flag(short="-v", what="display ping data"),
    Flag(short="-V", what="validate ping data"),
    Flag(short="-d", what="debug printfs"),
    Flag(short="-P", does=R, what="persistent server: several connections",
         why="the server serves one connection, then exits"),
    Flag(short="-q", does=IGN, what="a self-created, self-modified QP (not rdma_create_qp)",
         why="the soft connection manager drives rdmakit's own QP either way"),
    Flag(short="-t", arg="TOS", does=R, what="in getopt's string but not handled: rping refuses it too",
         why="rping's own usage error"),
)  # fmt: skip


def add_unimplemented(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> None:
    """Add the table's IGNORED and REFUSED flags to `parser` (the SAME ones are the program's own)."""
    for f in flags:
        if f.does is Does.SAME:
            continue
        tag = "accepted, no effect" if f.does is Does.IGNORED else "refused"
        kw: dict[str, object] = {"dest": f.dest, "help": f"{f.what} ({tag}: {f.why})"}
        if f.arg is None:
            kw["action"] = "store_true"
        else:
            kw["metavar"] = f.arg
        parser.add_argument(*f.names, **kw)  # type: ignore[arg-type]


def refuse_given(args: argparse.Namespace, flags: Iterable[Flag]) -> None:
    """A usage error naming the first REFUSED flag given, and why rdmakit refuses it."""
    for f in flags:
        if f.does is Does.REFUSED and getattr(args, f.dest, None) not in (None, False):
            raise CliError(f"{'/'.join(f.names)}: {f.why}", EXIT_USAGE)


def markdown(flags: Iterable[Flag]) -> str:
    """The table ``docs/perftest.md`` shows: flag, what the original does, what rdmakit does."""
    rows = ["| flag | the original | rdmakit |", "|---|---|---|"]
    for f in flags:
        name = ", ".join(f"`{n}`" for n in f.names) + (f" {f.arg}" if f.arg else "")
        does = f.does.value + (f": {f.why}" if f.why else "")
        rows.append(f"| {name} | {f.what} | {does} |")
    return "\n".join(rows)
