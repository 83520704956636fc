"""The netem matrix: goodput and every RC operation on impaired paths, beside TCP and kernel rxe.

    python3 -m rdmakit.testing.netem [--paths P,...] [--seconds S] [--json-out FILE]

Meant for the lab guest (``scripts/lab/netem-matrix.sh`` boots it and runs this):
its kernel has ``sch_netem`` and ``rdma_rxe``. A bed of three veth paths
(:mod:`rdmakit.testing.netembed`, MTU 1500) carries on every path of ``PATHS``
the same netem qdisc at both ends of each link, then, in the same run:

- ``iperf3``: one TCP stream for ``--seconds`` (its receiver's figure);
- ``rk-rk``: ``rdmakit perftest ib_write_bw -D S`` between two namespaces;
- ``rk>rxe`` / ``rxe>rk``: rdmakit's client writing to perftest's ``ib_write_bw``
  server on kernel rxe, and perftest's client on rxe writing to rdmakit's server;
- ``rxe-rxe``: perftest's ``ib_write_bw`` between two kernel rxe devices;
- ``bytes``: every RC operation (SEND, SEND with immediate, WRITE, WRITE with
  immediate, READ, fetch-and-add, compare-and-swap) for sizes 0 .. 256 KiB in both
  directions, each byte checked (:mod:`rdmakit.testing.rcpeer`), between two
  rdmakit engines and between rdmakit and kernel rxe.

Every program runs under a deadline: one still running is killed and reported as
``HUNG``; one that fails shows its last line. Goodput is perftest's ``BW
average`` and iperf3's receiver figure, both in MB/s (10^6 bytes); the ratios
divide by iperf3's figure on the same path in the same run. Exit status 1 if a
run of rdmakit failed or anything hung.
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rdmakit.transport.user_files import UserFileError, read_user_file

from .goodput import _BW_ROW, _MIB
from .netbed import HUNG, Done
from .netembed import RXE, NetemBed, unavailable
from .rcpeer import verify

#: name -> (what the path is, netem parameters applied at both ends of each link).
PATHS: dict[str, tuple[str, tuple[str, ...]]] = {
    "clean": ("no impairment", ()),
    "delay1": ("1 ms each way", ("delay", "1ms")),
    "delay10": ("10 ms each way", ("delay", "10ms")),
    "delay50": ("50 ms each way", ("delay", "50ms")),
    "loss0.1": ("0.1 % loss, 10 ms", ("delay", "10ms", "loss", "0.1%")),
    "loss1": ("1 % loss, 10 ms", ("delay", "10ms", "loss", "1%")),
    "loss5": ("5 % loss, 10 ms", ("delay", "10ms", "loss", "5%")),
    "ecn1": ("1 % CE marks (ECT) or loss (not ECT), 10 ms", ("delay", "10ms", "loss", "1%", "ecn")),
    "reorder": ("25 % sent at once, the rest 10 ms late", ("delay", "10ms", "reorder", "25%", "50%")),
    "duplicate": ("1 % duplicated, 10 ms", ("delay", "10ms", "duplicate", "1%")),
    "corrupt": ("0.1 % with a flipped bit, 10 ms", ("delay", "10ms", "corrupt", "0.1%")),
    "rate": ("20 Mbit/s, 10 ms", ("delay", "10ms", "rate", "20mbit")),
}
RUNS = ("iperf3", "rk-rk", "rk>rxe", "rxe>rk", "rxe-rxe")
CHECKS = ("rk-rk", "rk-rxe")
#: Message sizes of the byte-checked exchange (rcpeer): one packet, several, and 256 KiB,
#: so that a lossy path under TCG still ends in minutes.
CHECK_SIZES = (0, 1, 1025, 65537, 1 << 18)
#: Seconds a program may take beyond its own duration (TCG start-up of Python is slow).
SLACK_S = 240
#: The local ACK timeout of rxe's QP in the byte-checked exchange, 4.096 µs × 2^18 = 1.07 s:
#: its peer, rdmakit in the same TCG guest, answers far slower than on real hardware, and
#: rxe's default (2^14, 67 ms) is below a 50 ms path's round trip.
RXE_QP_TIMEOUT = 18
CHECK_TIMEOUT_S = 420
ATTEMPTS = 3
CLOCK_FIT_FAILED = re.compile(r"Can't produce a report|\b-?(inf|nan)\b")


@dataclass(frozen=True, slots=True)
class Row:
    path: str
    what: str
    netem: str
    #: MB/s (10^6 bytes) by run (``RUNS``); None: the run failed (``notes``).
    mbs: dict[str, float | None]
    notes: dict[str, str]
    #: By exchange (``CHECKS``): "" when every byte checked, else what failed.
    checks: dict[str, str]
    check_seconds: dict[str, float]
    #: The guest's 1-minute load average after the path.
    load: float
    hung: list[str] = field(default_factory=list)

    def ratio(self, run: str) -> float | None:
        got, tcp = self.mbs.get(run), self.mbs.get("iperf3")
        return got / tcp if got is not None and tcp else None


def _why(done: Done) -> str:
    if done.rc == HUNG:
        return "HUNG (killed at its deadline)"
    lines = (done.err.strip() or done.out.strip()).splitlines()
    return (lines[-1] if lines else f"status {done.rc}")[:200]


class Matrix:
    def __init__(self, bed: NetemBed, seconds: int) -> None:
        self.bed, self.seconds = bed, seconds
        self._port = 18600
        self.rk = [sys.executable, "-m", "rdmakit", "perftest", "ib_write_bw"]

    def port(self) -> int:
        self._port += 1
        return self._port

    def _ends(self, link: str) -> tuple[tuple[str | None, str], tuple[str | None, str]]:
        left, right = self.bed.links[link].left, self.bed.links[link].right
        return (left[0], left[2]), (right[0], right[2])

    def iperf3(self) -> tuple[float | None, str]:
        (a_ns, _a), (b_ns, b) = self._ends("soft")
        port = self.port()
        srv = (b_ns, ["iperf3", "-s", "-1", "-B", b, "-p", str(port)])
        cli = (a_ns, ["iperf3", "-J", "-t", str(self.seconds), "-c", b, "-p", str(port)])
        _s, c = self.bed.pair(srv, cli, port=port, timeout=self.seconds + SLACK_S)
        if c.rc != 0:
            return None, _why(c)
        report = json.loads(c.out)
        return float(report["end"]["sum_received"]["bits_per_second"]) / 8e6, ""

    def _rxe(self, dev: str) -> list[str]:
        gid = self.bed.gid_index(RXE[dev])
        return ["ib_write_bw", "-d", RXE[dev], "-x", str(gid)]

    def perftest(self, run: str) -> tuple[float | None, str]:
        """``run``'s ``ib_write_bw -D`` pair (``RUNS``): MB/s, or None and why not.

        perftest converts cycles to time with a clock rate it fits at start-up; in a
        TCG guest the fit sometimes fails ("Can't produce a report", ``inf``) after a
        transfer that completed: such a run is repeated, up to ``ATTEMPTS`` times.
        """
        for _ in range(ATTEMPTS - 1):
            mbs, why = self._perftest(run)
            if mbs is not None or not CLOCK_FIT_FAILED.search(why):
                return mbs, why
        return self._perftest(run)

    def _perftest(self, run: str) -> tuple[float | None, str]:
        port = self.port()
        dur = ["-p", str(port), "-D", str(self.seconds)]
        if run == "rk-rk":
            (a_ns, a), (b_ns, b) = self._ends("soft")
            srv, cli = (b_ns, [*self.rk, "-d", b, *dur]), (a_ns, [*self.rk, "-d", a, *dur, b])
        elif run == "rk>rxe":
            (k_ns, k), (c_ns, c) = self._ends("kern")
            srv, cli = (k_ns, [*self._rxe("k0"), *dur]), (c_ns, [*self.rk, "-d", c, *dur, k])
        elif run == "rxe>rk":
            (k_ns, _k), (c_ns, c) = self._ends("kern")
            srv, cli = (c_ns, [*self.rk, "-d", c, *dur]), (k_ns, [*self._rxe("k0"), *dur, c])
        else:
            (j_ns, _j0), (_ns, j1) = self._ends("rxe")
            srv, cli = (j_ns, [*self._rxe("j1"), *dur]), (j_ns, [*self._rxe("j0"), *dur, j1])
        server, client = self.bed.pair(srv, cli, port=port, timeout=self.seconds + SLACK_S)
        got = _BW_ROW.findall(client.out)
        if client.rc != 0 or server.rc != 0 or not got:
            return None, _why(client if client.rc != 0 or server.rc == 0 else server)
        return float(got[0]) * _MIB / 1e6, ""

    def check(self, which: str, workdir: Path) -> tuple[str, float]:
        """Every RC operation both ways with its bytes checked: "" or what failed; seconds."""
        shared = Path(tempfile.mkdtemp(prefix=f"{which}-", dir=workdir))
        peer = [sys.executable, "-m", "rdmakit.testing.rcpeer", "--dir", str(shared), "--timeout"]
        peer += [str(CHECK_TIMEOUT_S - 30), "--sizes", ",".join(map(str, CHECK_SIZES))]
        if which == "rk-rk":
            (a_ns, a), (b_ns, b) = self._ends("soft")
            host = (a_ns, [*peer, "--side", "host", "--ip", a])
            guest = (b_ns, [*peer, "--side", "guest", "--backend", "soft", "--ip", b])
        else:
            (k_ns, _k), (c_ns, c) = self._ends("kern")
            host = (c_ns, [*peer, "--side", "host", "--ip", c])
            rxe = ["--device", RXE["k0"], "--qp-timeout", str(RXE_QP_TIMEOUT)]
            guest = (k_ns, [*peer, "--side", "guest", *rxe])
        t0 = time.monotonic()
        procs = [self.bed.popen(*host), self.bed.popen(*guest)]
        deadline = t0 + CHECK_TIMEOUT_S
        # A side that failed ends the exchange: its peer would only wait for it.
        while time.monotonic() < deadline and not all(p.poll() == 0 for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                deadline = time.monotonic() + 5
                break
            time.sleep(0.2)
        h, g = self.bed.wait(procs[0], deadline), self.bed.wait(procs[1], deadline)
        seconds = time.monotonic() - t0
        ended: list[tuple[str, Done]] = sorted([("host", h), ("guest", g)], key=lambda e: e[1].rc == HUNG)
        for name, done in ended:
            if done.rc != 0:
                errors = [x["error"] for x in _lines(done.out) if x.get("event") == "error"]
                return f"{name}: {errors[-1][:200] if errors else _why(done)}", seconds
        hp = {x["phase"]: x for x in _lines(h.out) if x.get("event") == "phase"}
        gp = {x["phase"]: x for x in _lines(g.out) if x.get("event") == "phase"}
        problems = verify(hp["host-requests"], gp["host-requests"])
        problems += verify(gp["guest-requests"], hp["guest-requests"])
        return "; ".join(problems)[:300], seconds

    def row(self, name: str, workdir: Path) -> Row:
        what, params = PATHS[name]
        self.bed.set_netem(params)
        mbs: dict[str, float | None] = {}
        notes: dict[str, str] = {}
        for run in RUNS:
            t0 = time.monotonic()
            mbs[run], notes[run] = self.iperf3() if run == "iperf3" else self.perftest(run)
            _progress(f"{name} {run}: {mbs[run]} MB/s {notes[run]} ({time.monotonic() - t0:.0f} s)")
        checks: dict[str, str] = {}
        secs: dict[str, float] = {}
        for which in CHECKS:
            checks[which], secs[which] = self.check(which, workdir)
            _progress(f"{name} check {which}: {checks[which] or 'ok'} ({secs[which]:.0f} s)")
        hung = [k for k, v in {**notes, **checks}.items() if v.startswith("HUNG") or ": HUNG" in v]
        netem = " ".join(params) or "(none)"
        return Row(name, what, netem, mbs, notes, checks, secs, os.getloadavg()[0], hung)


def _progress(text: str) -> None:
    print(f"netem: {text}", file=sys.stderr, flush=True)


def _lines(out: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


HEADER = (
    f"{'path':<10} {'netem (each way)':<34} {'iperf3':>7} {'rk-rk':>13} {'rk>rxe':>13} {'rxe>rk':>13} "
    f"{'rxe-rxe':>13}  bytes checked (rk-rk, rk-rxe)"
)


def line(r: Row) -> str:
    """One row of the table: MB/s and, after each RDMA figure, its ratio to iperf3."""

    def fig(run: str) -> str:
        got, ratio = r.mbs.get(run), r.ratio(run)
        if got is None:
            return f"{'failed':>13}"
        return f"{got:6.2f} ({ratio:4.2f}x)" if ratio is not None else f"{got:6.2f}       "

    tcp = r.mbs.get("iperf3")
    checks = ", ".join("ok" if not r.checks[c] else "FAILED" for c in CHECKS)
    secs = "/".join(f"{r.check_seconds[c]:.0f}" for c in CHECKS)
    out = f"{r.path:<10} {r.netem[:34]:<34} {tcp if tcp is not None else float('nan'):7.2f} "
    out += " ".join(fig(run) for run in RUNS[1:]) + f"  {checks} ({secs} s)  load {r.load:.1f}"
    for key, note in {**r.notes, **r.checks}.items():
        if note:
            out += f"\n{'':<10} {key}: {note}"
    return out


def markdown(rows: list[Row]) -> str:
    """The rows as a Markdown table (MB/s, and each RDMA figure's ratio to iperf3)."""

    def fig(r: Row, run: str) -> str:
        got, ratio = r.mbs.get(run), r.ratio(run)
        if got is None:
            return f"failed: {r.notes[run][:60]}"
        return f"{got:.2f} ({ratio:.2f}×)" if ratio is not None else f"{got:.2f}"

    out = [
        "| path | netem, each way | iperf3 TCP | rdmakit ↔ rdmakit | rdmakit → rxe | rxe → rdmakit "
        "| rxe ↔ rxe | bytes checked: rdmakit ↔ rdmakit, rdmakit ↔ rxe |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        tcp = r.mbs.get("iperf3")
        checks = ", ".join(
            f"all ({r.check_seconds[c]:.0f} s)" if not r.checks[c] else f"FAILED: {r.checks[c][:80]}"
            for c in CHECKS
        )
        figs = " | ".join(fig(r, run) for run in RUNS[1:])
        tcp_text = f"{tcp:.2f}" if tcp is not None else f"failed: {r.notes['iperf3'][:60]}"
        out.append(f"| {r.path} | `{r.netem}` | {tcp_text} | {figs} | {checks} |")
    return "\n".join(out)


def failed(rows: list[Row]) -> bool:
    """A run of rdmakit failed, an exchange lost or changed a byte, or anything hung."""
    ours = ("rk-rk", "rk>rxe", "rxe>rk")
    return any(r.hung or any(r.mbs[k] is None for k in ours) or any(r.checks.values()) for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m rdmakit.testing.netem", description=__doc__.split("\n")[0])
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of: {', '.join(PATHS)}")
    p.add_argument("--seconds", type=int, default=5, help="iperf3 -t and perftest -D (5)")
    p.add_argument("--json-out", help="write the rows as JSON to this file")
    p.add_argument("--markdown", metavar="JSON", help="print a --json-out file as Markdown, and exit")
    a = p.parse_args(argv)
    if a.markdown:
        try:
            text = read_user_file(a.markdown, "the matrix's JSON", 1 << 20).data
            rows = [Row(**r) for r in json.loads(text)]
        except UserFileError as e:
            print(f"netem: {e.message}", file=sys.stderr)
            return 1
        except (ValueError, TypeError) as e:
            print(f"netem: {a.markdown} is not a --json-out file: {e}", file=sys.stderr)
            return 1
        print(markdown(rows))
        return 0
    names = [n for n in a.paths.split(",") if n]
    bad = [n for n in names if n not in PATHS]
    if bad or not names or not 1 <= a.seconds <= 120:
        p.error(f"unknown path {bad[0]!r}" if bad else "give a path; --seconds is 1..120")
    missing = [t for t in ("iperf3", "ib_write_bw", "tc", "rdma") if shutil.which(t) is None]
    why = f"{', '.join(missing)} not installed" if missing else unavailable()
    if why is not None:
        print(f"netem: {why}", file=sys.stderr)
        return 1
    rows = []
    print(HEADER, flush=True)
    with NetemBed() as bed, tempfile.TemporaryDirectory(prefix="rdmakit-netem-") as work:
        matrix = Matrix(bed, a.seconds)
        for name in names:
            rows.append(matrix.row(name, Path(work)))
            print(line(rows[-1]), flush=True)
            if a.json_out:
                with open(a.json_out, "w") as f:
                    json.dump([asdict(r) for r in rows], f, indent=1)
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
