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
bandwidth tests the report exchange (``xchg_bw_reports``). RTR/RTS
attributes are ``ctx_modify_qp_to_rtr``/``_rts``'s where they reach the wire
or the peer (MTU, PSNs, ``max_rd_atomic`` from the peer's outstanding reads,
RNR retry 7, ``min_rnr_timer`` 12); ``retry_cnt`` and the soft engine's
timeout stay rdmakit's (see ``rdmakit.cli.rc_pingpong``).

This module is the exchange and each test's sequence of steps;
``perftest_params`` parses the flags, ``perftest_runs`` runs and reports.
"""

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv6Address

from rdmakit.cli.bench_qp import SOFT_GID_INDEX, SPIN, TestQp, oob_timeout, open_device
from rdmakit.cli.errors import CliError
from rdmakit.cli.lifecycle import run
from rdmakit.cli.oob_messages import (
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
from rdmakit.cli.perftest_cm import KEY_BIN_LEN, CmLink, CmQps, decode_dest, encode_dest
from rdmakit.cli.perftest_json import JsonReport, bw_results, lat_duration_results, lat_results, test_info
from rdmakit.cli.perftest_params import (
    CACHE_LINE,
    CYCLE_BUFFER,
    MAX_OUT_READ,
    MAX_PEER_CACHE_LINE,
    MAX_PEER_CYCLE_BUFFER,
    PERFTESTS,
    Params,
    parse,
)
from rdmakit.cli.perftest_runs import (
    RESULT_FMT,
    RESULT_FMT_G,
    RESULT_FMT_LAT,
    RESULT_FMT_LAT_DUR,
    RESULT_LINE,
    Resources,
    bw_line,
    bw_report,
    lat_duration_report,
    lat_report,
    out,
    post_receives,
    print_dest,
    print_test_info,
    run_bw,
    run_lat,
    spin_of,
)
from rdmakit.doca.backend import BackendDevice
from rdmakit.transport.netmtu import route_mtu
from rdmakit.transport.oob import OobError, OobStream

__all__ = ["PERFTESTS", "main", "register"]


#: A barrier that waits for the peer's whole run is allowed this many steps' time.
RUN_WAIT_FACTOR = 10
#: Seconds the exchange's wait serves the device before it looks at its socket again.
SERVICE_SLICE = 0.01


# -- the out-of-band exchange ------------------------------------------------------------------


class Exchange:
    """perftest's ``ctx_xchg_data``: fixed-size, the client writes first, the server reads first.

    Over TCP (`OobStream`) or, with ``-R``/``-z``, over an RDMA CM connection (`CmLink`), where
    the key message is binary and the end sends no ``"done"``."""

    def __init__(self, stream: OobStream | CmLink, client: bool) -> None:
        self.stream = stream
        self.client = client
        self.binary = isinstance(stream, CmLink)
        self.timeout = oob_timeout()
        self.qps: list[TestQp] = []
        #: Seconds the device is polled after the last work (`spin_of`: none with ``-e``).
        self.spin = SPIN

    def _service(self) -> None:
        """Progress the device (every QP of a run is on one), polling it while the peer's run keeps
        it busy and for `SPIN` seconds after, as `pump` does; at most `SERVICE_SLICE` seconds, so
        that the exchange's socket and deadline are looked at."""
        if not self.qps:
            return
        progress, clock = self.qps[0].dev.pump.progress, time.monotonic
        start = last = clock()
        while True:
            now = clock()
            if progress():
                last = now
            elif now - last >= self.spin or now - start >= SERVICE_SLICE:
                return

    def xchg(self, mine: bytes, n: int, what: str, timeout: float | None = None) -> bytes:
        t = self.timeout if timeout is None else timeout
        fd = (self.qps[0].dev.pump.fileno() or -1) if self.qps else -1
        service = self._service if self.qps else None
        if self.client:
            self.stream.send(mine)
            return self.stream.recv_exact(n, t, what, service, fd)
        got = self.stream.recv_exact(n, t, what, service, fd)
        self.stream.send(mine)
        return got

    def hand_shake(self, mine: PerftestDest, long_wait: bool = False) -> PerftestDest:
        t = self.timeout * RUN_WAIT_FACTOR if long_wait else self.timeout
        if self.binary:
            return decode_dest(self.xchg(encode_dest(mine), KEY_BIN_LEN, "the key message", t))
        return PerftestDest.decode(self.xchg(mine.encode(), KEY_MSG_LEN, "the key message", t))

    def close_connection(self, mine: PerftestDest, long_wait: bool = False) -> None:
        """``ctx_close_connection``: one more barrier, then ``"done"`` (nobody reads it) and close;
        over RDMA CM the barrier alone (the connections end after the test)."""
        self.hand_shake(mine, long_wait)
        if not self.binary:
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


# -- the tests ---------------------------------------------------------------------------------


def main(name: str, argv: Sequence[str]) -> int:
    p = parse(name, argv)
    dev = open_device(p.device, p.gid_index, p.ib_port)
    try:
        status = _run(p, dev)
        time.sleep(p.wait_destroy)  # --wait_destroy: before the resources go
        return status
    except (OobError, OobFormatError) as e:
        raise CliError(str(e), status=3 if getattr(e, "timeout", False) else 1) from e
    finally:
        dev.close()


def _run(p: Params, dev: BackendDevice) -> int:
    own_mtu = min(p.mtu or dev.mtu, dev.mtu, 4096)
    if not p.client:
        out(
            p,
            "\n************************************\n"
            "* Waiting for client to connect... *\n"
            "************************************",
        )
    stream: OobStream | CmLink
    if p.comm_rdma_cm:
        stream = CmLink(dev, p.port, oob_timeout())
        if p.client:
            assert p.server is not None
            stream.connect(p.server)
        else:
            stream.accept(stream.timeout * RUN_WAIT_FACTOR)  # waiting for the client
    elif p.client:
        assert p.server is not None
        stream = OobStream.connect(p.server, p.port, oob_timeout(), wait=False)
    else:
        stream = OobStream.accept(p.port, oob_timeout() * RUN_WAIT_FACTOR)
    with stream:
        if dev.kind == "soft-udp" and isinstance(stream, OobStream):
            # Both ends fold in the route to the other (its MTU, as path-MTU discovery knows
            # it), then take the smaller offer: one path MTU for both.
            own_mtu = route_mtu(stream.peer_ip, own_mtu)
        ex = Exchange(stream, p.client)
        ex.spin = spin_of(p)
        neg = negotiate(ex, own_mtu)
        mtu = min(own_mtu, neg.mtu_enum_peer)
        res = Resources(p, dev, neg.cycle_buffer)
        ex.qps = res.qps
        try:
            if not p.rdma_cm:
                return _test(p, ex, res, mtu)
            assert isinstance(stream, CmLink)  # -R implies -z
            cm_qps = _connect_cm(p, ex, stream, res)
            status = _test(p, ex, res, mtu)
            cm_qps.close(p.client)
            return status
        finally:
            res.close()


def _connect_cm(p: Params, ex: Exchange, link: CmLink, res: Resources) -> CmQps:
    """``create_rdma_cm_connection``: a barrier, a connection per QP, a barrier. The barriers carry
    perftest's still-empty ``my_dest``."""
    empty = PerftestDest(lid=0, out_reads=0, qpn=0, psn=0, rkey=0, vaddr=0, gid=IPv6Address(0))
    ex.hand_shake(empty)
    for q in res.qps:
        _attributes(p, q, p.out_reads)
    cm_qps = CmQps(link, res.qps)
    if p.client:
        assert p.server is not None
        cm_qps.connect(p.server)
    else:
        cm_qps.accept()
    ex.hand_shake(empty)
    return cm_qps


def _attributes(p: Params, q: TestQp, peer_out_reads: int) -> None:
    q.set_options(
        min_rnr_timer=12, rnr_retry=7, max_dest_rd_atomic=p.out_reads,
        max_rd_atomic=max(1, min(peer_out_reads, MAX_OUT_READ)),
        hop_limit=p.hop_limit,
    )  # fmt: skip
    if p.qp_timeout is not None:
        q.set_options(timeout=p.qp_timeout)


def _connect(p: Params, res: Resources, rem: list[PerftestDest], mtu: int) -> None:
    if p.rdma_cm:
        return  # the QPs were connected by RDMA CM
    for q, r in zip(res.qps, rem, strict=True):
        _attributes(p, q, r.out_reads)
        q.connect(gid=r.gid, qpn=r.qpn, psn=r.psn, mtu=mtu)


def _test(p: Params, ex: Exchange, res: Resources, mtu: int) -> int:
    verb, nq = p.kind.verb, p.num_qps
    mine = [res.dest(i) for i in range(nq)]
    gid_index = p.gid_index if p.gid_index is not None else res.dev.gid_index
    if p.gid_index is None and res.dev.kind == "soft-udp":
        gid_index = SOFT_GID_INDEX  # its one GID, where rxe lists it
    print_test_info(p, res.dev, mtu, gid_index)
    sink = None if p.out_json is None else JsonReport(p.out_json, test_info(p, res.dev.name, mtu, gid_index))
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
        return _lat(p, ex, res, mine, rem, sink)
    return _bw(p, ex, res, mine, rem, sink)


def _bw(
    p: Params,
    ex: Exchange,
    res: Resources,
    mine: list[PerftestDest],
    rem: list[PerftestDest],
    sink: JsonReport | None,
) -> int:
    verb = p.kind.verb
    failed: list[str] = []
    header = RESULT_FMT_G if p.gbits else RESULT_FMT
    out(p, f"{RESULT_LINE}\n{header}")
    if verb != "send":
        if not p.client and not p.duplex:
            # The server of a one-sided test waits for the client's run, then prints the client's report.
            ex.hand_shake(mine[0], long_wait=True)
            theirs = ex.reports(
                BwReport(size=p.sizes[-1], iters=p.iters * p.num_qps, bw_peak=0, bw_avg=0, msg_rate=0)
            )
            report(p, theirs, None, failed, sink)
            ex.close_connection(mine[0])
            out(p, RESULT_LINE)
            return limits_status(failed)
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
                report(p, last, theirs, failed, sink)
            else:
                report(p, last, None, failed, sink)
        out(p, RESULT_LINE)
        assert last is not None
        if not p.duplex:
            ex.hand_shake(mine[0], long_wait=True)
            ex.send_report(last)
        ex.close_connection(mine[0])
        return limits_status(failed)
    # send_bw
    for size in p.sizes:
        sends = p.client or p.duplex
        receives = not p.client or p.duplex
        if receives:
            post_receives(res, size)
        ex.hand_shake(mine[0], long_wait=True)
        t = run_bw(res, size, rem, send=sends, recv=receives, recv_start=time.perf_counter())
        mine_report = bw_report(p, size, t, peak=sends)
        if p.duplex:
            theirs = ex.reports(mine_report)
            report(p, mine_report, theirs, failed, sink)
        else:
            report(p, mine_report, None, failed, sink)
        if p.run_all:
            ex.hand_shake(mine[0], long_wait=True)
    out(p, RESULT_LINE)
    ex.close_connection(mine[0], long_wait=True)
    return limits_status(failed)


def report(
    p: Params, rep: BwReport, rem: BwReport | None, failed: list[str], sink: JsonReport | None
) -> None:
    """Print a bw report line (and write it to ``--out_json``'s file) and note which ``-w``/``-y``
    limit it misses (``print_full_bw_report``)."""
    if sink is not None:
        sink.write(bw_results(p, rep, rem))
    out(p, bw_line(p, rep, rem), result=True)
    avg = rep.bw_avg + (rem.bw_avg if rem else 0.0)
    rate = rep.msg_rate + (rem.msg_rate if rem else 0.0)
    if p.limit_bw is not None and avg < p.limit_bw:
        failed.append("BW result is below bw limit")
    if p.limit_msgrate is not None and rate < p.limit_msgrate:
        failed.append("Msg rate is below msg_rate limit")


def limits_status(failed: list[str]) -> int:
    """perftest's ``FAILURE`` (1, with its message) when a report missed a ``-w``/``-y`` limit."""
    if failed:
        raise CliError(failed[0])
    return 0


def _lat(
    p: Params,
    ex: Exchange,
    res: Resources,
    mine: list[PerftestDest],
    rem: list[PerftestDest],
    sink: JsonReport | None,
) -> int:
    verb = p.kind.verb
    if verb in ("read", "atomic") and not p.client:
        # Only the client posts reads and atomics: the server waits for it to close.
        ex.close_connection(mine[0], long_wait=True)
        out(p, RESULT_LINE)
        return 0
    out(p, f"{RESULT_LINE}\n{RESULT_FMT_LAT if p.duration is None else RESULT_FMT_LAT_DUR}")
    for size in p.sizes:
        if verb == "send":
            post_receives(res, size)
            ex.hand_shake(mine[0], long_wait=True)
        run = run_lat(res, size, rem[0], server=not p.client)
        if p.duration is None:
            text, figures = lat_report(p, size, run.posted)
            if sink is not None:
                sink.write(lat_results(p, figures))
        else:
            text, dur_figures = lat_duration_report(p, size, run)
            if sink is not None:
                sink.write(lat_duration_results(p, dur_figures))
        out(p, text, result=True)
    out(p, RESULT_LINE)
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
