"""Two ends of ``rdma_cm`` on real soft devices, pumped by hand.

A `CmSide` is a soft RoCE-UDP device on a loopback address with its
`RdmaCm`; `pump` progresses it and keeps every CM event it sees, `take`
removes the first of a kind. `until` pumps sides until a condition holds,
bounded in time. Tests of the connection manager (and of attacks on it) use
these so that each test says only what it connects and checks.
"""

import random
import time
from collections.abc import Callable

from rdmakit.engine import CompletionQueue, QueuePair
from rdmakit.transport.cma import CmaEvent, CmaEventKind, RdmaCm
from rdmakit.transport.device import SoftDevice


class CmSide:
    """A soft device and its rdma_cm; `events` keeps what `pump` saw.

    `timeout_exponent` and `max_retries` shorten the CM's response timeout
    and retries (IBTA Vol. 1 §12.7.36: 4.096 µs × 2^exponent) so a test does
    not wait rdma_cm's seconds; ``None`` keeps rdma_cm's own, as the
    programs use them."""

    def __init__(
        self,
        ip: str,
        seed: int,
        *,
        timeout_exponent: int | None = 16,
        max_retries: int = 6,
        timewait: float = 0.2,
    ) -> None:
        self.dev = SoftDevice(ip, rng=random.Random(seed))
        rng = random.Random(seed + 100)
        if timeout_exponent is None:
            self.cm = RdmaCm(self.dev, rng=rng)
        else:
            self.cm = RdmaCm(
                self.dev,
                rng=rng,
                timeout_exponent=timeout_exponent,
                max_retries=max_retries,
                timewait=timewait,
            )
        self.cq = CompletionQueue(256)
        self.events: list[CmaEvent] = []

    def qp(self) -> QueuePair:
        return self.dev.create_qp(send_cq=self.cq, recv_cq=self.cq)

    def pump(self) -> None:
        now = time.monotonic()
        self.dev.progress(now)
        while (ev := self.cm.poll_event(now)) is not None:
            self.events.append(ev)

    def has(self, kind: CmaEventKind, n: int = 1) -> Callable[[], bool]:
        """A condition for `until`: at least `n` events of `kind` seen and not taken."""
        return lambda: sum(ev.kind is kind for ev in self.events) >= n

    def find(self, kind: CmaEventKind, conn: int | None = None) -> CmaEvent | None:
        """Remove and return the first event of `kind` (on connection `conn`, if given), if any."""
        for i, ev in enumerate(self.events):
            if ev.kind is kind and conn in (None, ev.conn):
                return self.events.pop(i)
        return None

    def take(self, kind: CmaEventKind, conn: int | None = None) -> CmaEvent:
        """`find`, where the event must be there."""
        ev = self.find(kind, conn)
        if ev is None:
            raise AssertionError(f"no {kind.name} in {self.events}")
        return ev

    def close(self) -> None:
        self.dev.close()


def until(sides: tuple[CmSide, ...], done: Callable[[], bool], limit: float = 20.0) -> None:
    """Pump `sides` until `done()` (bounded: fail past `limit` seconds)."""
    end = time.monotonic() + limit
    while not done():
        for s in sides:
            s.pump()
        if time.monotonic() > end:
            raise AssertionError(f"never happened; events: {[s.events for s in sides]}")
        time.sleep(0.0005)
