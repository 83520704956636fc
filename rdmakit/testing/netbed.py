"""A routed test bed of three network namespaces: A – R – B (needs root and ``ip netns``).

A and B are two hosts, each with one veth link to the router R, which
forwards IPv4 and IPv6 between them::

    A  10.28.1.2/24  fd28:1::2/64  ─ra──ar─  R  ─rb──br─  B  10.28.2.2/24  fd28:2::2/64

Every link has the MTU of its side (1500 by default, as Ethernet). R's two
egress interfaces may carry a tbf qdisc (``Shaping``): a rate limit with a
deep or a shallow buffer (``limit``), or a rate far above the path's with a
``burst`` below a GSO batch, which makes R segment the batches as a NIC's
segmentation does (tbf segments a GSO packet longer than its burst). This
kernel may lack ``sch_netem``; tbf is all the bed uses.

Names are prefixed (``net-`` and the process id) so beds of parallel runs do
not meet; ``close`` kills what still runs in them and deletes them.

    with NetBed(BedSpec(shaping=SEGMENTING)) as bed:
        server = bed.popen("b", [sys.executable, "-m", "rdmakit", ...])
"""

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

Side = Literal["a", "r", "b"]

#: Addresses of A and B, by IP version (R is .1 / ::1 on each link).
ADDRS: dict[int, dict[str, str]] = {
    4: {"a": "10.28.1.2", "b": "10.28.2.2", "ra": "10.28.1.1", "rb": "10.28.2.1"},
    6: {"a": "fd28:1::2", "b": "fd28:2::2", "ra": "fd28:1::1", "rb": "fd28:2::1"},
}
_PREFIX = {4: 24, 6: 64}
_counter = itertools.count()


@dataclass(frozen=True, slots=True, kw_only=True)
class Red:
    """RED marking ECN (``tc qdisc ... red ... ecn``) as tbf's child: CE from ``min`` bytes
    queued, with ``probability`` at ``max``; drops past ``limit`` (or past ``max`` for
    packets that are not ECN-capable). DCQCN's switch (Zhu et al. 2015, §5) is RED on ECN."""

    min: int
    max: int
    limit: int
    probability: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Shaping:
    """A tbf qdisc on R's egress (``tc qdisc add ... tbf rate R burst B limit L``), with a RED
    child that marks ECN when ``red`` is given."""

    rate: str
    burst: str
    limit: str
    red: Red | None = None


#: R segments GSO batches (burst below 64 KiB) without throttling them.
SEGMENTING = Shaping(rate="20gbit", burst="16kb", limit="4mb")
#: A 1 Gbit/s bottleneck with a deep buffer (4 MB) and a burst above a GSO batch (R
#: forwards batches whole); the same where R segments them (burst 64 KB, below a batch
#: with its headers); and a shallow buffer (64 KB), where R must segment.
GBIT_DEEP = Shaping(rate="1gbit", burst="256kb", limit="4mb")
GBIT_DEEP_SEGMENTING = Shaping(rate="1gbit", burst="64kb", limit="4mb")
GBIT_SHALLOW = Shaping(rate="1gbit", burst="64kb", limit="64kb")
#: The shallow bottleneck marking CE (RED, ECN) from 16 KB queued, at most 64 KB queued.
ECN_RED = Red(min=16_000, max=48_000, limit=64_000, probability=0.1)
GBIT_ECN = Shaping(rate="1gbit", burst="64kb", limit="64kb", red=ECN_RED)


@dataclass(frozen=True, slots=True, kw_only=True)
class BedSpec:
    """The links' MTUs (A's, B's, and R's side towards B when it differs) and R's shaping."""

    mtu_a: int = 1500
    mtu_b: int = 1500
    #: R's MTU towards B when lower than B's: a bottleneck only path-MTU discovery finds.
    mtu_rb: int | None = None
    shaping: Shaping | None = None


def unavailable() -> str | None:
    """Why the bed cannot be built here (None: it can): root, ``ip`` and ``tc`` are needed."""
    if os.geteuid() != 0:
        return "the routed namespace bed needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the routed namespace bed needs {tool!r} (iproute2)"
    probe = f"net-probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def red_unavailable() -> str | None:
    """Why R cannot mark ECN with RED here (None: it can): the bed, and ``sch_red``."""
    why = unavailable()
    if why is not None:
        return why
    probe = f"net-red{os.getpid()}"
    subprocess.run(["ip", "netns", "add", probe], capture_output=True, check=False)
    try:
        run = ["ip", "netns", "exec", probe]
        subprocess.run([*run, "ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"], check=False)
        red = [*run, "tc", "qdisc", "add", "dev", "v0", "root", *red_args(ECN_RED)]
        done = subprocess.run(red, capture_output=True, text=True, check=False)
        if done.returncode:
            return f"this kernel has no RED qdisc (sch_red): {done.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def red_args(red: Red, rate: str = "1gbit", *, ecn: bool = True) -> list[str]:
    """tc's words for ``red`` (its burst as tc-red(8) advises: (2 min + max) / (3 avpkt));
    without ``ecn`` RED drops where it would mark."""
    burst = max((2 * red.min + red.max) // 3300, 2)
    return [
        "red", "limit", str(red.limit), "min", str(red.min), "max", str(red.max), "avpkt", "1100",
        "burst", str(burst), "probability", str(red.probability), "bandwidth", rate,
        *(["ecn"] if ecn else []),
    ]  # fmt: skip


#: The status ``pair`` reports for a program it had to kill.
HUNG = -999


class Done(NamedTuple):
    """How a program ended: its exit status (``HUNG``: killed) and what it printed."""

    rc: int
    out: str
    err: str


class BedError(RuntimeError):
    """A command that builds the bed failed."""


def run_in(argv: Sequence[str], ns: str | None = None, *, check: bool = True, timeout: float = 30) -> str:
    """Run a command (in network namespace ``ns``); its output, or BedError when ``check`` and it failed."""
    full = list(argv) if ns is None else ["ip", "netns", "exec", ns, *argv]
    done = subprocess.run(full, capture_output=True, text=True, check=False, timeout=timeout)
    if check and done.returncode:
        raise BedError(f"{' '.join(full)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


class NetBed:
    """Three namespaces joined by veth links, R forwarding; see the module docstring."""

    def __init__(self, spec: BedSpec | None = None) -> None:
        self.spec = spec or BedSpec()
        tag = f"net-{os.getpid()}-{next(_counter)}"
        self.ns: dict[Side, str] = {"a": f"{tag}-a", "r": f"{tag}-r", "b": f"{tag}-b"}
        self._made: list[str] = []
        self._procs: list[subprocess.Popen[str]] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "NetBed":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- building -----------------------------------------------------------------------
    def _ip(self, *args: str) -> None:
        self.sh(["ip", *args])

    def sh(self, argv: Sequence[str], side: Side | None = None) -> str:
        """Run a command (in ``side``'s namespace); its output, or BedError."""
        return run_in(argv, None if side is None else self.ns[side])

    def _build(self) -> None:
        s = self.spec
        for side, ns in self.ns.items():
            self._ip("netns", "add", ns)
            self._made.append(ns)
            # Link-local addresses usable at once (no duplicate address detection on a fresh veth).
            self.sh(
                ["sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"],
                side,
            )
        a, r, b = self.ns["a"], self.ns["r"], self.ns["b"]
        self._ip("link", "add", "name", "ra", "netns", a, "type", "veth", "peer", "name", "ar", "netns", r)
        self._ip("link", "add", "name", "br", "netns", b, "type", "veth", "peer", "name", "rb", "netns", r)
        rb = s.mtu_rb or s.mtu_b
        links: list[tuple[Side, str, int]] = [
            ("a", "ra", s.mtu_a),
            ("r", "ar", s.mtu_a),
            ("r", "rb", rb),
            ("b", "br", s.mtu_b),
        ]
        for side, dev, mtu in links:
            self.sh(["ip", "link", "set", "dev", dev, "mtu", str(mtu), "up"], side)
        for side in self.ns:
            self.sh(["ip", "link", "set", "dev", "lo", "up"], side)
        for v, addrs in ADDRS.items():
            plen = _PREFIX[v]
            nodad = ["nodad"] if v == 6 else []
            for side, dev, key in (("a", "ra", "a"), ("r", "ar", "ra"), ("r", "rb", "rb"), ("b", "br", "b")):
                self.sh(["ip", f"-{v}", "addr", "add", f"{addrs[key]}/{plen}", "dev", dev, *nodad], side)
            self.sh(["ip", f"-{v}", "route", "add", "default", "via", addrs["ra"]], "a")
            self.sh(["ip", f"-{v}", "route", "add", "default", "via", addrs["rb"]], "b")
        self.sh(["sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"], "r")
        if s.shaping is not None:
            sh = s.shaping
            for dev in ("ar", "rb"):
                tbf = ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf"]
                self.sh([*tbf, "rate", sh.rate, "burst", sh.burst, "limit", sh.limit], "r")
                if sh.red is not None:
                    red = [
                        "tc",
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "parent",
                        "1:1",
                        "handle",
                        "10:",
                        *red_args(sh.red),
                    ]
                    self.sh(red, "r")

    # -- using ----------------------------------------------------------------------------
    @staticmethod
    def addr(side: Literal["a", "b"], version: int = 4) -> str:
        """The address of host ``side`` (IPv4 or IPv6)."""
        return ADDRS[version][side]

    def popen(self, side: Side, argv: Sequence[str]) -> "subprocess.Popen[str]":
        """Start ``argv`` in ``side``'s namespace (in a session of its own), its output piped."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns[side], *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def pair(
        self,
        server: tuple[Side, Sequence[str]],
        client: tuple[Side, Sequence[str]],
        *,
        delay: float = 0.5,
        timeout: float = 120.0,
    ) -> "tuple[Done, Done]":
        """Start ``server``, then after ``delay`` seconds ``client``; how each ended (server first).

        A program still running ``timeout`` seconds later is killed and reported
        with status ``HUNG`` (the stall the bed is there to catch).
        """
        s = self.popen(*server)
        time.sleep(delay)
        c = self.popen(*client)
        deadline = time.monotonic() + timeout
        client_done = self._wait(c, deadline)
        return self._wait(s, deadline + 10.0), client_done

    def _wait(self, proc: "subprocess.Popen[str]", deadline: float) -> "Done":
        try:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return Done(HUNG, out, err)
        return Done(proc.returncode, out, err)

    def qdisc_stats(self) -> str:
        """R's qdiscs with their counters (``tc -s qdisc``): what was sent, dropped, segmented."""
        return self.sh(["tc", "-s", "qdisc", "show"], "r")

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: it and what it started
                proc.communicate()
        self._procs.clear()
        for ns in reversed(self._made):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)  # started in our namespace, so ours
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        self._made.clear()
