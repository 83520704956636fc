"""Three veth paths under netem in one Linux host, with kernel rxe on two of them (root).

Meant for the lab guest, whose kernel has ``sch_netem`` and ``rdma_rxe``::

    soft   nm-a  ma 10.29.1.1 ───── mb 10.29.1.2  nm-b     rdmakit ↔ rdmakit
    kern   init  k0 10.29.2.1 ───── k1 10.29.2.2  nm-c     kernel rxe (on k0) ↔ rdmakit
    rxe    init  j0 10.29.3.1 ───── j1 10.29.3.2  init     kernel rxe (j0) ↔ kernel rxe (j1)

Linux 6.1's rxe opens its UDP socket in the initial namespace only, so both rxe
devices of the third path live there; policy routing sends what one address
sends to the other out of its own veth rather than through ``lo`` (the local
table is looked up for arrivals on j0/j1 only, a table per destination sends
out of the other end), and ``accept_local`` lets each end take packets from an
address of its own host. Each link has the MTU 1500 and, at both ends, the same
qdiscs (``set_netem``): every impairment applies in each direction.

A path acts on packets, as a wire does, not on socket buffers. netem takes a
TSO or GSO buffer as one packet (``netem_enqueue`` drops, delays and reorders
whole skbs; only ``corrupt`` segments first), so on a plain netem qdisc one
"1 % loss" takes 1 % of TCP's TSO buffers and of rdmakit's GSO batches, whose
size depends on how fast the emulated guest runs: iperf3's figure then swung
tenfold from run to run. Each end's root qdisc is therefore ``SEGMENTER``, a
tbf that segments every buffer larger than one packet (``tbf_segment``) at a
rate no path here reaches, with netem under it. The receiving ends of the
rdmakit ↔ rdmakit link (where iperf3 runs too) have GRO on (``veth`` then
receives through NAPI), so TCP and rdmakit both get back batches as from a NIC.
Namespaces carry the process id, so two beds never meet; ``close`` removes all.
"""

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .netbed import HUNG, BedError, Done, Red, red_args, run_in


@dataclass(frozen=True, slots=True)
class Link:
    """One veth path: its two ends (namespace or None for the initial one, device, address)."""

    name: str
    left: tuple[str | None, str, str]
    right: tuple[str | None, str, str]


@dataclass(frozen=True, slots=True)
class RedPath:
    """A bottleneck after the netem delay: tbf at ``rate`` (``burst``) whose queue is ``red``,
    marking CE on ECN-capable packets (``ecn``) or dropping them."""

    rate: str
    burst: str
    red: Red
    ecn: bool


#: rxe device names on the kern and rxe paths, by netdev.
RXE = {"k0": "rxk0", "j0": "rxj0", "j1": "rxj1"}
#: The root qdisc of every end: tbf at 10 Gbit/s with a burst of one packet (the MTU plus the
#: Ethernet header fits), which splits larger buffers into packets before netem and never
#: queues at the guest's rates (``tbf_enqueue``: a GSO skb above ``max_size`` is segmented).
SEGMENTER = ("tbf", "rate", "10gbit", "burst", "1600", "limit", "100000")
#: Routing tables of the rxe path (one per destination).
_TABLES = {"10.29.3.2": ("j0", "10.29.3.1", "2902"), "10.29.3.1": ("j1", "10.29.3.2", "2901")}
_SYSFS_IB = Path("/sys/class/infiniband")


def unavailable() -> str | None:
    """Why the bed cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, rxe devices)"
    for mod in ("sch_netem", "rdma_rxe", "veth"):
        done = subprocess.run(["modprobe", mod], capture_output=True, text=True, check=False)
        if done.returncode:
            return f"modprobe {mod}: {done.stderr.strip() or done.returncode}"
    return None


class NetemBed:
    """The three paths; ``set_netem`` changes the impairment of all six ends at once."""

    def __init__(self, mtu: int = 1500) -> None:
        tag = f"nm{os.getpid()}"
        self.ns = {"a": f"{tag}a", "b": f"{tag}b", "c": f"{tag}c"}
        self.links = {
            "soft": Link("soft", (self.ns["a"], "ma", "10.29.1.1"), (self.ns["b"], "mb", "10.29.1.2")),
            "kern": Link("kern", (None, "k0", "10.29.2.1"), (self.ns["c"], "k1", "10.29.2.2")),
            "rxe": Link("rxe", (None, "j0", "10.29.3.1"), (None, "j1", "10.29.3.2")),
        }
        self._made_ns: list[str] = []
        self._made_links: list[str] = []
        self._made_rxe: list[str] = []
        self._rules = False
        self._procs: list[subprocess.Popen[str]] = []
        try:
            self._build(mtu)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "NetemBed":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def sh(argv: Sequence[str], ns: str | None = None, *, check: bool = True) -> str:
        return run_in(argv, ns, check=check, timeout=60)

    def _build(self, mtu: int) -> None:
        for name in self.ns.values():
            self.sh(["ip", "netns", "add", name])
            self._made_ns.append(name)
            self.sh(["ip", "link", "set", "dev", "lo", "up"], name)
        for link in self.links.values():
            (lns, ldev, laddr), (rns, rdev, raddr) = link.left, link.right
            self.sh(["ip", "link", "add", "name", ldev, "type", "veth", "peer", "name", rdev])
            self._made_links.append(ldev)
            plen = "32" if link.name == "rxe" else "24"
            for ns, dev, addr in ((lns, ldev, laddr), (rns, rdev, raddr)):
                if ns is not None:
                    self.sh(["ip", "link", "set", "dev", dev, "netns", ns])
                self.sh(["ip", "addr", "add", f"{addr}/{plen}", "dev", dev], ns)
                self.sh(["ip", "link", "set", "dev", dev, "mtu", str(mtu), "up"], ns)
        for ns, dev, _addr in (self.links["soft"].left, self.links["soft"].right):
            self.sh(["ethtool", "-K", dev, "gro", "on"], ns)
        self._route_rxe_path()
        for dev, name in RXE.items():
            self.sh(["rdma", "link", "add", name, "type", "rxe", "netdev", dev])
            self._made_rxe.append(name)
        for name in RXE.values():
            self._wait_gid(name)

    def _route_rxe_path(self) -> None:
        for key in ("all", "j0", "j1"):
            conf = f"net.ipv4.conf.{key}"
            self.sh(["sysctl", "-qw", f"{conf}.rp_filter=0", f"{conf}.accept_local=1"])
        self._rules = True
        self._unroute_rxe_path()  # what a killed bed left behind
        self._rules = True
        self.sh(["ip", "rule", "add", "pref", "1000", "lookup", "local"])
        self.sh(["ip", "rule", "del", "pref", "0", "lookup", "local"])
        for dev in ("j0", "j1"):
            self.sh(["ip", "rule", "add", "pref", "10", "iif", dev, "lookup", "local"])
        for dst, (dev, src, table) in _TABLES.items():
            self.sh(["ip", "route", "add", dst, "dev", dev, "src", src, "table", table])
            self.sh(["ip", "rule", "add", "pref", "20", "to", dst, "lookup", table])

    def _unroute_rxe_path(self) -> None:
        if not self._rules:
            return
        if "0:\tfrom all lookup local" not in self.sh(["ip", "rule", "show"], check=False).splitlines():
            self.sh(["ip", "rule", "add", "pref", "0", "lookup", "local"], check=False)
        self.sh(["ip", "rule", "del", "pref", "1000", "lookup", "local"], check=False)
        for dev in ("j0", "j1"):
            self.sh(["ip", "rule", "del", "pref", "10", "iif", dev, "lookup", "local"], check=False)
        for dst, (_dev, _src, table) in _TABLES.items():
            self.sh(["ip", "rule", "del", "pref", "20", "to", dst, "lookup", table], check=False)
            self.sh(["ip", "route", "flush", "table", table], check=False)
        self._rules = False

    def _wait_gid(self, name: str, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while True:
            index = self.gid_index(name)
            if index is not None:
                return index
            if time.monotonic() > deadline:
                raise BedError(f"{name} has no IPv4-mapped RoCE v2 GID after {timeout:.0f} s")
            time.sleep(0.2)

    @staticmethod
    def gid_index(name: str) -> int | None:
        """The index of ``name``'s RoCE v2 GID that carries its IPv4 address (::ffff:a.b.c.d)."""
        port = _SYSFS_IB / name / "ports" / "1"
        with contextlib.suppress(OSError):
            for gid in sorted((port / "gids").iterdir(), key=lambda p: int(p.name)):
                value = gid.read_text().strip()
                if not value.startswith("0000:0000:0000:0000:0000:ffff:"):
                    continue
                with contextlib.suppress(OSError):
                    if (port / "gid_attrs" / "types" / gid.name).read_text().strip() == "RoCE v2":
                        return int(gid.name)
        return None

    def set_netem(self, params: Sequence[str], limit: int = 10000, red: "RedPath | None" = None) -> None:
        """The same ``netem`` qdisc (``limit`` packets) at both ends of every path, under the
        ``SEGMENTER``; with ``red``, a tbf rate limit after it whose queue is RED (marking CE, or
        dropping without ECN), as a router's egress to a slower link holds its queue."""
        for link in self.links.values():
            for ns, dev, _addr in (link.left, link.right):
                self.sh(["tc", "qdisc", "del", "dev", dev, "root"], ns, check=False)
                tc = ["tc", "qdisc", "add", "dev", dev]
                self.sh([*tc, "root", "handle", "1:", *SEGMENTER], ns)
                self.sh([*tc, "parent", "1:1", "handle", "10:", "netem", "limit", str(limit), *params], ns)
                if red is not None:
                    tbf = ["tbf", "rate", red.rate, "burst", red.burst, "limit", str(red.red.limit)]
                    self.sh([*tc, "parent", "10:1", "handle", "2:", *tbf], ns)
                    self.sh(
                        [*tc, "parent", "2:1", "handle", "3:", *red_args(red.red, red.rate, ecn=red.ecn)], ns
                    )

    def qdisc_stats(self, link: str) -> str:
        """The ``tc -s qdisc`` lines of ``link``'s left end (sent, dropped, ...)."""
        ns, dev, _addr = self.links[link].left
        return self.sh(["tc", "-s", "qdisc", "show", "dev", dev], ns)

    @staticmethod
    def rxe_counters(name: str) -> dict[str, int]:
        """rxe device ``name``'s hardware counters (rxe_hw_counters.c: ``sent_pkts``,
        ``rcvd_seq_err``, ``completer_retry_err``, ``duplicate_request`` ...)."""
        found: dict[str, int] = {}
        with contextlib.suppress(OSError):
            for f in (_SYSFS_IB / name / "ports" / "1" / "hw_counters").iterdir():
                with contextlib.suppress(OSError, ValueError):
                    found[f.name] = int(f.read_text().strip())
        return found

    # -- running programs -------------------------------------------------------------------
    def popen(self, ns: str | None, argv: Sequence[str]) -> "subprocess.Popen[str]":
        """Start ``argv`` (in ``ns``; None: this namespace) in a session of its own, output piped."""
        full = list(argv) if ns is None else ["ip", "netns", "exec", ns, *argv]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
        proc = subprocess.Popen(
            full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
        )
        self._procs.append(proc)
        return proc

    def listening(self, ns: str | None, port: int) -> bool:
        out = self.sh(["ss", "-Hltn", f"sport = :{port}"], ns, check=False)
        return bool(out.strip())

    def pair(
        self,
        server: tuple[str | None, Sequence[str]],
        client: tuple[str | None, Sequence[str]],
        *,
        port: int,
        timeout: float,
    ) -> "tuple[Done, Done]":
        """Start ``server``, once it listens on TCP ``port`` ``client``; how each ended (server first).

        The server has ``timeout`` seconds to listen, the client as long from its
        start to end: one still running then is killed and reported with status
        ``HUNG`` (no run may stall).
        """
        deadline = time.monotonic() + timeout
        s = self.popen(*server)
        while not self.listening(server[0], port) and s.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if s.poll() is not None or not self.listening(server[0], port):
            server_done = self.wait(s, deadline)
            return server_done, Done(server_done.rc, "", "the server never listened")
        c = self.popen(*client)
        deadline = time.monotonic() + timeout
        client_done = self.wait(c, deadline)
        return self.wait(s, max(deadline, time.monotonic() + 10.0)), client_done

    @staticmethod
    def wait(proc: "subprocess.Popen[str]", deadline: float) -> Done:
        try:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return Done(HUNG, out, err)
        return Done(proc.returncode, out, err)

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: it and what it started
                proc.communicate()
        self._procs.clear()
        for name in reversed(self._made_rxe):
            self.sh(["rdma", "link", "delete", name], check=False)
        self._made_rxe.clear()
        self._unroute_rxe_path()
        for dev in reversed(self._made_links):
            self.sh(["ip", "link", "del", "dev", dev], check=False)  # a veth in a namespace goes with it
        self._made_links.clear()
        for ns in reversed(self._made_ns):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)  # started in our namespace, so ours
            self.sh(["ip", "netns", "del", ns], check=False)
        self._made_ns.clear()
