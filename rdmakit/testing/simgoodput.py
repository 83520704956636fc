"""Goodput on the seeded SimNet, congestion control on and off (virtual time, no root).

    python3 -m rdmakit.testing.simgoodput [--count N] [--seed S]

Each row streams ``count`` messages of 64 KiB one way, as ``ib_write_bw`` and
``ib_read_bw`` do with their defaults between two hosts: 128 work requests
posted at once, 16 READs outstanding, MTU 1024 and the window the routed
bed's QPs get at that MTU (512 PSNs, ``transport.connect.WINDOW_MTU``). The
profiles are the 1 Gbit/s ones of :mod:`rdmakit.testing.faults`. A figure is
MB/s (10^6) of virtual time, and the fraction of the link's 125 MB/s.
"""

import argparse
import random
import sys
from dataclasses import dataclass

from rdmakit.engine import QpCaps, WrOpcode

from .engine import fill, make_pair, send_wr
from .faults import (
    BOTTLENECK_DEEP,
    BOTTLENECK_SHALLOW,
    GIGABIT,
    GIGABIT_LOSS,
    GIGABIT_REORDER,
    Faults,
)

MSG = 64 * 1024
#: name -> (what it is, the profile)
PROFILES: dict[str, tuple[str, Faults]] = {
    "deep": ("1 Gbit/s, deep queue", BOTTLENECK_DEEP),
    "shallow": ("1 Gbit/s, 64 KB queue", BOTTLENECK_SHALLOW),
    "loss1": ("1 Gbit/s, 1 % loss", GIGABIT_LOSS),
    "reorder": ("1 Gbit/s, heavy reordering", GIGABIT_REORDER),
}
OPS = {"WRITE": WrOpcode.RDMA_WRITE, "READ": WrOpcode.RDMA_READ}


@dataclass(frozen=True, slots=True)
class Stream:
    ok: bool
    seconds: float
    count: int
    retries: int
    retransmits: int  # go-back-N's and the tail-loss probes'
    timeouts: int
    dropped: int  # packets the network lost or its queue dropped
    digest: str
    random_losses: int = 0  # NAK-sequence errors judged random (``QpStats.random_losses``)
    srtt: float | None = None  # the requester's smoothed round trip at the end, seconds

    @property
    def mbs(self) -> float:
        return self.count * MSG / self.seconds / 1e6

    @property
    def of_link(self) -> float:
        return self.count * MSG / self.seconds / GIGABIT


def stream(
    faults: Faults,
    op: WrOpcode,
    cc: bool,
    *,
    count: int = 256,
    seed: int = 28,
    window: int = 512,
    depth: int = 128,
    outs: int = 16,
) -> Stream:
    """``count`` 64 KiB WRITEs or READs from a to b, ``depth`` posted at a time (see the module)."""
    caps = QpCaps(max_unacked_psns=window, congestion_control=cc)
    p = make_pair(seed, faults, caps=caps, mem_size=16 * MSG, mtu=1024, max_rd_atomic=outs, timeout=14)
    a, b = p.a, p.b
    fill(b.mem if op is WrOpcode.RDMA_READ else a.mem, random.Random(seed))
    posted = 0

    def post() -> None:
        nonlocal posted
        while posted < count and posted - len(a.sent) < depth:
            off = posted % 16 * MSG
            wr = send_wr(posted, op, (a.sge(off, MSG),), remote_addr=b.mr.addr + off, rkey=b.mr.rkey)
            a.qp.post_send(wr)
            posted += 1

    def done() -> bool:
        p.drain()
        post()
        return len(a.sent) >= count

    post()
    ok = p.net.run(until=done, max_time=120.0)
    ok = ok and all(c.status.name == "SUCCESS" for c in a.sent) and a.mem == b.mem
    st, net = a.qp.stats, p.net.stats
    return Stream(
        ok,
        p.net.now,
        count,
        st.retries,
        st.retransmits + st.probes,
        st.timeouts,
        net["lost"] + net["queue_full"],
        p.net.trace_digest(),
        st.random_losses,
        a.qp.req.rtt.smoothed,
    )


def main(argv: list[str] | None = None) -> int:
    what = __doc__.split("\n")[0]
    p = argparse.ArgumentParser(prog="python3 -m rdmakit.testing.simgoodput", description=what)
    p.add_argument("--count", type=int, default=256, help="64 KiB messages per run (256)")
    p.add_argument("--seed", type=int, default=28)
    a = p.parse_args(argv)
    if not 1 <= a.count <= 100_000:
        p.error("--count is 1..100000")
    cols = "MB/s | of link | resent | timeouts"
    print(f"| profile | op | on: {cols} | off: {cols} |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for what, faults in PROFILES.values():
        for name, op in OPS.items():
            on, off = (stream(faults, op, cc, count=a.count, seed=a.seed) for cc in (True, False))
            bad = "" if on.ok and off.ok else " (a run failed)"
            print(
                f"| {what} | {name} | {on.mbs:.1f} | {on.of_link:.2f} | {on.retransmits} | {on.timeouts} "
                f"| {off.mbs:.1f} | {off.of_link:.2f} | {off.retransmits} | {off.timeouts} |{bad}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
