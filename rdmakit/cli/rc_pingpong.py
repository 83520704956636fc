"""``rdmakit rc-pingpong``: rdma-core's ``ibv_rc_pingpong``, wire-compatible with it.

Follows ``libibverbs/examples/rc_pingpong.c``: TCP port 18515; the client
writes its 52-byte ``LID:QPN:PSN:GID`` message, reads the server's and writes
``done``; the server reads the client's, moves its QP to RTR and RTS, then
replies and reads ``done``. Then ``-n`` round trips of ``-s``-byte SENDs:
the client sends first, and each side sends again once its previous send
and a receive have both completed; receives are refilled to ``-r`` when one
or none is left. RTR/RTS attributes are the example's (``pp_connect_ctx``):
``max_dest_rd_atomic``/``max_rd_atomic`` 1, ``min_rnr_timer`` 12,
``rnr_retry`` 7, hop limit 1. Two local attributes stay rdmakit's, as they
never reach the wire: ``retry_cnt`` 6 rather than 7 (rxe and the soft engine
never exhaust 7, and a vanished peer must end the run with RETRY_EXC_ERR),
and on a soft device the engine's own retransmission timeout, which allows
for a Python pump (verbs devices use the example's 14).

One difference: without ``-g`` the example sends an all-zero GID, which RoCE
cannot route; rdmakit sends the device's default RoCEv2 GID instead (a soft
device's only one, a verbs device's IPv4-mapped RoCEv2 GID).
"""

import argparse
import mmap
import sys
import time
from collections.abc import Sequence

from rdmakit.cli.bench_qp import SPIN, Memory, TestQp, oob_timeout, open_device, pump
from rdmakit.cli.errors import EXIT_USAGE, CliError
from rdmakit.cli.lifecycle import run
from rdmakit.cli.oob_messages import DONE, PINGPONG_MSG_LEN, OobFormatError, PingpongDest
from rdmakit.cli.options import int_in
from rdmakit.cli.tool_flags import RC_PINGPONG_FLAGS, add_unimplemented, refuse_given
from rdmakit.doca._addresses import gid_text
from rdmakit.doca.backend import BackendDevice
from rdmakit.engine.types import SGE, Completion, RecvWR, SendWR, WcOpcode, WrOpcode
from rdmakit.transport.oob import OobError, OobStream

__all__ = ["main", "register"]

DEF_PORT = 18515
#: The page size ``-c`` marks and checks one byte of (``sysconf(_SC_PAGESIZE)``).
PAGE = mmap.PAGESIZE
RECV_WRID = 1
SEND_WRID = 2


_int = int_in(-(1 << 63), (1 << 63) - 1)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rc-pingpong",
        allow_abbrev=False,
        description="ibv_rc_pingpong on rdmakit (the same exchange and flags)",
    )
    add_flags(p)
    return p


def add_flags(p: argparse.ArgumentParser) -> None:
    """ibv_rc_pingpong's flags (its ``-l`` is the service level, as in the original)."""
    p.add_argument("server", nargs="?", help="the server's address (client); none: be the server")
    p.add_argument("-p", "--port", type=_int, default=DEF_PORT, help="listen on/connect to this port (18515)")
    p.add_argument(
        "-d", "--ib-dev", dest="device",
        help="device: a soft device's address, or a verbs device (default: the first, as 'rdmakit devices')",
    )  # fmt: skip
    p.add_argument("-i", "--ib-port", type=_int, default=1, help="port of the device (1)")
    p.add_argument("-s", "--size", type=_int, default=4096, help="message size (4096)")
    p.add_argument("-m", "--mtu", type=_int, default=1024, help="path MTU (1024)")
    p.add_argument("-r", "--rx-depth", type=_int, default=500, help="receives to post at a time (500)")
    p.add_argument("-n", "--iters", type=_int, default=1000, help="number of exchanges (1000)")
    p.add_argument("-g", "--gid-idx", type=_int, help="local port GID index (a soft device: rxe's, 1)")
    p.add_argument("-c", "--chk", action="store_true", help="validate the received buffer")
    p.add_argument("-e", "--events", action="store_true", help="sleep on CQ events (default: poll first)")
    add_unimplemented(p, RC_PINGPONG_FLAGS)


def _print_dest(side: str, d: PingpongDest) -> None:
    pad = "  " if side == "local" else " "
    print(
        f"  {side} address:{pad}LID 0x{d.lid:04x}, QPN 0x{d.qpn:06x}, PSN 0x{d.psn:06x}, "
        f"GID {gid_text(d.gid)}",
        flush=True,
    )


def main(argv: Sequence[str]) -> int:
    return run_args(build_parser().parse_args(list(argv)))


def run_args(a: argparse.Namespace) -> int:
    refuse_given(a, RC_PINGPONG_FLAGS)
    if a.mtu not in (256, 512, 1024, 2048, 4096):
        raise CliError(f"invalid MTU {a.mtu}", EXIT_USAGE)
    if not 1 <= a.size <= 1 << 30 or not 1 <= a.iters <= 1 << 31 or not 1 <= a.rx_depth <= 16384:
        raise CliError(
            "size, iterations and rx depth must be positive (size up to 1 GiB, rx depth up to 16384)",
            EXIT_USAGE,
        )
    if not 1 <= a.port <= 65535:
        raise CliError(f"invalid port {a.port}", EXIT_USAGE)
    dev = open_device(a.device, a.gid_idx, a.ib_port)
    try:
        return _run(a, dev)
    except (OobError, OobFormatError) as e:
        raise CliError(str(e), status=3 if getattr(e, "timeout", False) else 1) from e
    finally:
        dev.close()


def _run(a: argparse.Namespace, dev: BackendDevice) -> int:
    size, iters, rx_depth = a.size, a.iters, a.rx_depth
    mem = Memory(dev, size)
    mem.view[:size] = b"\x7b" * size  # pp_init_ctx
    if a.chk and a.server is not None:
        for i in range(0, size, PAGE):
            mem.view[i] = 0  # i / page_size % sizeof(char)
    tq = TestQp(dev, send_depth=1, recv_depth=rx_depth)
    try:
        tq.set_options(max_dest_rd_atomic=1, max_rd_atomic=1, min_rnr_timer=12, rnr_retry=7, hop_limit=1)
        recv_wr = RecvWR(wr_id=RECV_WRID, sg_list=(SGE(mem.addr, size, mem.lkey),))
        send_wr = SendWR(wr_id=SEND_WRID, opcode=WrOpcode.SEND, sg_list=(SGE(mem.addr, size, mem.lkey),))
        for _ in range(rx_depth):
            tq.post_recv(recv_wr)
        routs = rx_depth
        mine = PingpongDest(lid=0, qpn=tq.qpn, psn=tq.psn, gid=tq.gid)
        _print_dest("local", mine)
        t = oob_timeout()
        service_fd = tq.dev.pump.fileno() or -1
        if a.server is not None:
            with OobStream.connect(a.server, a.port, t, wait=False) as s:
                s.send(mine.encode())
                rem = PingpongDest.decode(s.recv_exact(PINGPONG_MSG_LEN, t, "the server's address"))
                s.send(DONE)
        else:
            with OobStream.accept(a.port, t * 10) as s:
                rem = PingpongDest.decode(s.recv_exact(PINGPONG_MSG_LEN, t, "the client's address"))
                tq.connect(gid=rem.gid, qpn=rem.qpn, psn=rem.psn, mtu=a.mtu)
                s.send(mine.encode())
                got = s.recv_exact(len(DONE), t, '"done"', tq.dev.pump.progress, service_fd)
                if got != DONE:
                    raise CliError(f'the client sent {got!r} where rc_pingpong sends "done"')
        _print_dest("remote", rem)
        if a.server is not None:
            tq.connect(gid=rem.gid, qpn=rem.qpn, psn=rem.psn, mtu=a.mtu)

        state = {"scnt": 0, "rcnt": 0, "pending": RECV_WRID}
        if a.server is not None:
            tq.post_send(send_wr)
            state["pending"] |= SEND_WRID

        def on_wc(_i: int, wc: Completion) -> None:
            nonlocal routs
            if wc.opcode in (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM):
                routs -= 1
                if routs <= 1:
                    for _ in range(rx_depth - routs):
                        tq.post_recv(recv_wr)
                    routs = rx_depth
                state["rcnt"] += 1
            elif wc.wr_id == SEND_WRID:
                state["scnt"] += 1
            else:
                raise CliError(f"Completion for unknown wr_id {wc.wr_id}")
            state["pending"] &= ~(
                RECV_WRID if wc.opcode in (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM) else SEND_WRID
            )
            if state["scnt"] < iters and not state["pending"]:
                tq.post_send(send_wr)
                state["pending"] = RECV_WRID | SEND_WRID

        start = time.perf_counter()
        done = lambda: state["rcnt"] >= iters and state["scnt"] >= iters  # noqa: E731
        pump([tq], on_wc, done, t, "the ping-pong", spin=0.0 if a.events else SPIN)
        usec = (time.perf_counter() - start) * 1e6
        nbytes = size * iters * 2
        print(f"{nbytes} bytes in {usec / 1e6:.2f} seconds = {nbytes * 8.0 / usec:.2f} Mbit/sec", flush=True)
        print(f"{iters} iters in {usec / 1e6:.2f} seconds = {usec / iters:.2f} usec/iter", flush=True)
        if a.chk and a.server is None:
            for i in range(0, size, PAGE):
                if mem.view[i] != 0:
                    print(f"invalid data in page {i // PAGE}", flush=True)
        return 0
    finally:
        tq.close()
        mem.close()


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "rc-pingpong",
        help="ibv_rc_pingpong: SEND ping-pong over an RC QP, wire-compatible with rdma-core's",
        description="ibv_rc_pingpong with its flags (-p -d -i -g -s -m -r -n -l -e -c; the others are "
        "accepted or refused with the reason); 'rdmakit rc-pingpong -h' lists them.",
        allow_abbrev=False,
    )
    add_flags(p)
    p.set_defaults(handler=run(p, run_args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
