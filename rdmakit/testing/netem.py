"""The netem matrix: goodput and every RC operation on impaired paths, beside TCP and kernel rxe.

    python3 -m rdmakit.testing.netem [--paths P,...] [--runs R,...] [--checks C,...]
                                     [--seconds S] [--json-out FILE] [--capture DIR]
    python3 -m rdmakit.testing.netem --markdown FILE[,FILE...] [--update DOC ...]

Meant for the lab guest (``scripts/lab/netem-matrix.sh`` boots it and runs this):
its kernel has ``sch_netem``, ``sch_red`` and ``rdma_rxe``. A bed of three veth
paths (:mod:`rdmakit.testing.netembed`, MTU 1500) carries on every path of
``PATHS`` the same qdiscs at both ends of each link (netem, and for the ECN paths
a tbf bottleneck whose queue is RED), then, in the same run (``RUNS``):

- ``iperf3``: one TCP stream for ``--seconds``, ``IPERF3_RUNS`` times; the median of
  its receiver's figures (all of them are kept in ``Row.samples``);
- ``rk-rk``: ``rdmakit perftest ib_write_bw -D S`` between two namespaces;
- ``rk>rxe`` / ``rxe>rk``: rdmakit's client against perftest's server on kernel
  rxe, and perftest's client on rxe against rdmakit's server;
- ``rxe-rxe``: perftest between two kernel rxe devices (rxe's own figure);
- the same four with ``ib_read_bw`` (``rk-rk read`` ...);
- ``CHECKS``: every RC operation (SEND, SEND with immediate, WRITE, WRITE with
  immediate, READ, fetch-and-add, compare-and-swap) for sizes 0 .. 256 KiB in both
  directions, each byte checked (:mod:`rdmakit.testing.rcpeer`), between two
  rdmakit engines and between rdmakit and kernel rxe.

Beside each run it records how rxe's hardware counters moved and, on the paths
that mark CE, the CNPs on rdmakit's link and RED's marks and drops
(``Row.counters``). Every program runs under a deadline: one still running is
killed and reported as ``HUNG``; one that fails shows its last line. Goodput is
perftest's ``BW average`` and iperf3's receiver figure, both in MB/s (10^6
bytes); the ratios divide by iperf3's figure on the same path in the same run.
Exit status 1 if a run of rdmakit failed, an exchange failed or anything hung.
``--markdown`` prints the rows of ``--json-out`` files as the docs' tables
(:mod:`rdmakit.testing.netem_report`), ``--update`` writes them into documents.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rdmakit.transport.user_files import UserFileError, read_user_file

from .goodput import _BW_ROW, _MIB
from .netbed import HUNG, Done, Red
from .netem_report import HEADER, Row, failed, line, markdown, update
from .netembed import RXE, NetemBed, RedPath, unavailable
from .rcpeer import verify

__all__ = ["PATHS", "RUNS", "Row", "failed", "line", "main", "markdown"]


@dataclass(frozen=True, slots=True)
class Impairment:
    """What one path of the matrix is, its netem parameters (both ends of each link) and,
    for the ECN paths, the RED bottleneck after them (``RedPath``)."""

    what: str
    netem: tuple[str, ...]
    red: RedPath | None = None


#: The RED bottleneck of the ECN paths: 20 Mbit/s, CE (or a drop) from 20 KB queued, about
#: 40 % of the 50 KB bandwidth-delay product at 10 ms each way; at most 200 KB queued.
GUEST_RED = Red(min=20_000, max=60_000, limit=200_000, probability=0.1)
PATHS: dict[str, Impairment] = {
    "clean": Impairment("no impairment", ()),
    "delay1": Impairment("1 ms each way", ("delay", "1ms")),
    "delay10": Impairment("10 ms each way", ("delay", "10ms")),
    "delay50": Impairment("50 ms each way", ("delay", "50ms")),
    "loss0.1": Impairment("0.1 % loss, 10 ms", ("delay", "10ms", "loss", "0.1%")),
    "loss1": Impairment("1 % loss, 10 ms", ("delay", "10ms", "loss", "1%")),
    "loss5": Impairment("5 % loss, 10 ms", ("delay", "10ms", "loss", "5%")),
    "ecn1": Impairment("1 % CE marks (ECT) or loss (not ECT), 10 ms", ("delay", "10ms", "loss", "1%", "ecn")),
    "reorder": Impairment(
        "25 % sent at once, the rest 10 ms late", ("delay", "10ms", "reorder", "25%", "50%")
    ),
    "duplicate": Impairment("1 % duplicated, 10 ms", ("delay", "10ms", "duplicate", "1%")),
    "corrupt": Impairment("0.1 % with a flipped bit, 10 ms", ("delay", "10ms", "corrupt", "0.1%")),
    "rate": Impairment("20 Mbit/s, 10 ms", ("delay", "10ms", "rate", "20mbit")),
    "red-ecn": Impairment(
        "20 Mbit/s, RED marks CE, 10 ms", ("delay", "10ms"), RedPath("20mbit", "32kb", GUEST_RED, ecn=True)
    ),
    "red-drop": Impairment(
        "20 Mbit/s, the same RED drops, 10 ms",
        ("delay", "10ms"),
        RedPath("20mbit", "32kb", GUEST_RED, ecn=False),
    ),
}
#: The runs on every path: iperf3, then perftest's WRITE and READ bandwidth tests between
#: the four pairs (``Pair``).
RUNS = (
    "iperf3", "rk-rk", "rk>rxe", "rxe>rk", "rxe-rxe",
    "rk-rk read", "rk>rxe read", "rxe>rk read", "rxe-rxe read",
)  # fmt: skip
#: Runs that are rdmakit's: one of them failing fails the matrix (rxe ↔ rxe is the baseline).
OURS = tuple(r for r in RUNS if "rk" in r.replace("rxe", ""))
CHECKS = ("rk-rk", "rk-rxe")
#: iperf3 runs per path: TCP's figure on a lossy emulated path moves from one run to the next,
#: so the ratios divide by the median of a few short runs rather than by one.
IPERF3_RUNS = 3
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
#: A CNP on the wire (RoCEv2 Annex A17.9.3): to or from port 4791, BTH opcode 0x81.
CNP_FILTER = "udp port 4791 and udp[8] = 0x81"
#: ``tc -s qdisc``: a qdisc's drops, and what RED did.
_DROPPED = re.compile(r"dropped (\d+)")
_RED_STATS = re.compile(r"marked (\d+) early (\d+) pdrop (\d+)")


def _why(done: Done) -> str:
    if done.rc == HUNG:
        return "HUNG (killed at its deadline)"
    lines = (done.err.strip() or done.out.strip()).splitlines()
    return (lines[-1] if lines else f"status {done.rc}")[:200]


def _delta(after: dict[str, int], before: dict[str, int], prefix: str = "") -> dict[str, int]:
    return {prefix + k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


class Matrix:
    def __init__(
        self, bed: NetemBed, seconds: int, capture: Path | None = None, slack: int = SLACK_S
    ) -> None:
        self.bed, self.seconds, self.capture, self.slack = bed, seconds, capture, slack
        self._port = 18600
        self.path = ""
        self.rk = [sys.executable, "-m", "rdmakit", "perftest"]

    def port(self) -> int:
        self._port += 1
        return self._port

    def _ends(self, link: str) -> tuple[tuple[str | None, str], tuple[str | None, str]]:
        left, right = self.bed.links[link].left, self.bed.links[link].right
        return (left[0], left[2]), (right[0], right[2])

    def iperf3(self) -> tuple[list[float], str]:
        """``IPERF3_RUNS`` runs' MB/s; the runs that failed say why."""
        got: list[float] = []
        why: list[str] = []
        for _ in range(IPERF3_RUNS):
            mbs, note = self._iperf3()
            if mbs is None:
                why.append(note)
            else:
                got.append(mbs)
        return got, "; ".join(why)

    def _iperf3(self) -> tuple[float | None, str]:
        (a_ns, _a), (b_ns, b) = self._ends("soft")
        port = self.port()
        srv = (b_ns, ["iperf3", "-s", "-1", "-B", b, "-p", str(port)])
        cli = (a_ns, ["iperf3", "-J", "-t", str(self.seconds), "-c", b, "-p", str(port)])
        _s, c = self.bed.pair(srv, cli, port=port, timeout=self.seconds + self.slack)
        if c.rc != 0:
            return None, _why(c)
        report = json.loads(c.out)
        return float(report["end"]["sum_received"]["bits_per_second"]) / 8e6, ""

    def _rxe(self, test: str, dev: str) -> list[str]:
        gid = self.bed.gid_index(RXE[dev])
        return [test, "-d", RXE[dev], "-x", str(gid)]

    def perftest(self, run: str) -> tuple[float | None, str, dict[str, int]]:
        """``run``'s perftest pair (``RUNS``, ``-D``): MB/s, or None and why not; counters.

        perftest converts cycles to time with a clock rate it fits at start-up; in a
        TCG guest the fit sometimes fails ("Can't produce a report", ``inf``) after a
        transfer that completed: such a run is repeated, up to ``ATTEMPTS`` times.
        """
        for _ in range(ATTEMPTS - 1):
            mbs, why, counters = self._perftest(run)
            if mbs is not None or not CLOCK_FIT_FAILED.search(why):
                return mbs, why, counters
        return self._perftest(run)

    def _sides(self, run: str) -> tuple[tuple[str | None, list[str]], tuple[str | None, list[str]], str]:
        """``run``'s server and client, and the link it crosses."""
        pair, _, op = run.partition(" ")
        test = "ib_read_bw" if op == "read" else "ib_write_bw"
        port = self.port()
        dur = ["-p", str(port), "-D", str(self.seconds)]
        rk = [*self.rk, test]
        if pair == "rk-rk":
            (a_ns, a), (b_ns, b) = self._ends("soft")
            return (b_ns, [*rk, "-d", b, *dur]), (a_ns, [*rk, "-d", a, *dur, b]), "soft"
        if pair == "rk>rxe":
            (k_ns, k), (c_ns, c) = self._ends("kern")
            return (k_ns, [*self._rxe(test, "k0"), *dur]), (c_ns, [*rk, "-d", c, *dur, k]), "kern"
        if pair == "rxe>rk":
            (k_ns, _k), (c_ns, c) = self._ends("kern")
            return (c_ns, [*rk, "-d", c, *dur]), (k_ns, [*self._rxe(test, "k0"), *dur, c]), "kern"
        (j_ns, _j0), (_ns, j1) = self._ends("rxe")
        return (j_ns, [*self._rxe(test, "j1"), *dur]), (j_ns, [*self._rxe(test, "j0"), *dur, j1]), "rxe"

    def _perftest(self, run: str) -> tuple[float | None, str, dict[str, int]]:
        srv, cli, link = self._sides(run)
        port = int(srv[1][srv[1].index("-p") + 1])
        devices = {"kern": ("rxk0",), "rxe": ("rxj0", "rxj1")}.get(link, ())
        before = {d: self.bed.rxe_counters(d) for d in devices}
        watch = self._watch(link, run)
        server, client = self.bed.pair(srv, cli, port=port, timeout=self.seconds + self.slack)
        counters = self._unwatch(watch)
        for d in devices:
            counters |= _delta(self.bed.rxe_counters(d), before[d], f"{d}.")
        got = _BW_ROW.findall(client.out)
        if client.rc != 0 or server.rc != 0 or not got:
            return None, _why(client if client.rc != 0 or server.rc == 0 else server), counters
        return float(got[0]) * _MIB / 1e6, "", counters

    def _watch(self, link: str, run: str) -> "tuple[list[Any], dict[str, int]]":
        """What runs beside ``run``: a capture (``--capture``) and, on rdmakit's own link of a path
        that marks ECN, a count of CNPs and the qdiscs' counters from before it."""
        procs: list[Any] = []
        lft, rgt = self.bed.links[link].left, self.bed.links[link].right
        if self.capture is not None:
            ns, dev, _addr = rgt
            pcap = self.capture / f"{self.path}-{run.replace(' ', '-').replace('>', '2')}.pcap"
            procs.append(
                self.bed.popen(ns, ["tcpdump", "-i", dev, "-s", "128", "-w", str(pcap), "udp port 4791"])
            )
        before: dict[str, int] = {}
        if link == "soft" and _marks_ecn(self.path):
            procs.append(self.bed.popen(lft[0], ["tcpdump", "-i", lft[1], "-n", "-q", "-l", CNP_FILTER]))
            before = self._qdiscs(link)
        if procs:
            time.sleep(1.0)  # tcpdump opens its socket
        return procs, before

    def _unwatch(self, watch: "tuple[list[Any], dict[str, int]]") -> dict[str, int]:
        procs, before = watch
        found: dict[str, int] = {}
        for proc in procs:
            proc.send_signal(signal.SIGINT)
            done = self.bed.wait(proc, time.monotonic() + 30)
            if "-w" not in proc.args:
                found["cnps"] = sum(1 for line in done.out.splitlines() if "UDP" in line)
        if before or "cnps" in found:
            after = self._qdiscs("soft")
            found |= {k: after.get(k, 0) - before.get(k, 0) for k in after}
        return found

    def _qdiscs(self, link: str) -> dict[str, int]:
        """Both ends of ``link``: the root qdisc's drops, and RED's marks and drops."""
        got: dict[str, int] = {}
        for ns, dev, _addr in (self.bed.links[link].left, self.bed.links[link].right):
            text = self.bed.sh(["tc", "-s", "qdisc", "show", "dev", dev], ns)
            dropped = _DROPPED.search(text)
            got["dropped"] = got.get("dropped", 0) + (int(dropped.group(1)) if dropped else 0)
            red = _RED_STATS.search(text)
            if red is not None:
                for key, value in zip(("marked", "early", "pdrop"), red.groups(), strict=True):
                    got[key] = got.get(key, 0) + int(value)
        return got

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

    def row(
        self, name: str, workdir: Path, runs: tuple[str, ...] = RUNS, checks: tuple[str, ...] = CHECKS
    ) -> Row:
        path = PATHS[name]
        self.path = name
        self.bed.set_netem(path.netem, red=path.red)
        mbs: dict[str, float | None] = {}
        notes: dict[str, str] = {}
        counters: dict[str, dict[str, int]] = {}
        samples: dict[str, list[float]] = {}
        for run in runs:
            t0 = time.monotonic()
            if run == "iperf3":
                samples[run], notes[run] = self.iperf3()
                mbs[run] = statistics.median(samples[run]) if samples[run] else None
            else:
                mbs[run], notes[run], counters[run] = self.perftest(run)
            took = time.monotonic() - t0
            _progress(f"{name} {run}: {mbs[run]} MB/s {notes[run]} ({took:.0f} s) {counters.get(run, '')}")
        failures: dict[str, str] = {}
        secs: dict[str, float] = {}
        for which in checks:
            failures[which], secs[which] = self.check(which, workdir)
            _progress(f"{name} check {which}: {failures[which] or 'ok'} ({secs[which]:.0f} s)")
        hung = [k for k, v in {**notes, **failures}.items() if v.startswith("HUNG") or ": HUNG" in v]
        return Row(
            name, path.what, describe(path), mbs, notes, failures, secs, os.getloadavg()[0], hung,
            {k: v for k, v in counters.items() if v}, samples,
        )  # fmt: skip


def describe(path: Impairment) -> str:
    """The qdiscs of ``path`` as tc's words: netem's, and the RED bottleneck's after it."""
    text = " ".join(path.netem) or "(none)"
    red = path.red
    if red is not None:
        text += f"; tbf rate {red.rate}, RED {red.red.min // 1000}-{red.red.max // 1000} KB"
        text += " ecn" if red.ecn else " (drops)"
    return text


def _marks_ecn(name: str) -> bool:
    path = PATHS[name]
    return path.red is not None or "ecn" in path.netem


def _progress(text: str) -> None:
    print(f"netem: {text}", file=sys.stderr, flush=True)


def _lines(out: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for text in out.splitlines():
        if text.startswith("{"):
            try:
                found.append(json.loads(text))
            except ValueError:
                continue
    return found


def _split(text: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(n for n in text.split(",") if n)
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown {what} {bad[0]!r} (of: {', '.join(known)})")
    return names


def _load(path: str) -> list[Row]:
    text = read_user_file(path, "the matrix's JSON", 1 << 20).data
    try:
        return [Row(**r) for r in json.loads(text)]
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path} is not a --json-out file: {e}") from e


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m rdmakit.testing.netem", description=__doc__.split("\n")[0])
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of: {', '.join(PATHS)}")
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of: {', '.join(RUNS)}")
    p.add_argument(
        "--checks", default=",".join(CHECKS), help="the byte-checked exchanges (rk-rk,rk-rxe; none: '')"
    )
    p.add_argument("--seconds", type=int, default=5, help="iperf3 -t and perftest -D (5)")
    p.add_argument(
        "--slack", type=int, default=SLACK_S, help=f"seconds a run may take beyond --seconds ({SLACK_S})"
    )
    p.add_argument("--json-out", help="write the rows as JSON to this file")
    p.add_argument(
        "--capture", metavar="DIR", help="write each perftest run's RoCEv2 packets (tcpdump) to DIR"
    )
    p.add_argument(
        "--markdown", metavar="JSON[,JSON...]", help="print --json-out files' rows as Markdown, and exit"
    )
    p.add_argument("--update", metavar="DOC", nargs="+", help="with --markdown: rewrite DOC's netem blocks")
    a = p.parse_args(argv)
    if a.markdown:
        try:
            rows = [row for name in a.markdown.split(",") if name for row in _load(name)]
            for doc in a.update or ():
                if not update(Path(doc), rows):
                    raise ValueError(f"{doc} has no <!-- netem-matrix --> or <!-- netem-summary --> block")
        except (UserFileError, OSError, ValueError) as e:
            print(f"netem: {getattr(e, 'message', e)}", file=sys.stderr)
            return 1
        if not a.update:
            print(markdown(rows))
        return 0
    try:
        names = _split(a.paths, tuple(PATHS), "path")
        runs = _split(a.runs, RUNS, "run")
        checks = _split(a.checks, CHECKS, "check")
    except ValueError as e:
        p.error(str(e))
    if not names or not 1 <= a.seconds <= 120 or not 30 <= a.slack <= 3600 or a.update:
        p.error("give a path; --seconds is 1..120, --slack 30..3600; --update goes with --markdown")
    missing = [t for t in ("iperf3", "ib_write_bw", "tc", "rdma", "tcpdump") if shutil.which(t) is None]
    why = f"{', '.join(missing)} not installed" if missing else unavailable()
    if why is not None:
        print(f"netem: {why}", file=sys.stderr)
        return 1
    rows = []
    print(HEADER, flush=True)
    capture = Path(a.capture) if a.capture else None
    if capture is not None:
        capture.mkdir(parents=True, exist_ok=True)
    with NetemBed() as bed, tempfile.TemporaryDirectory(prefix="rdmakit-netem-") as work:
        matrix = Matrix(bed, a.seconds, capture, a.slack)
        for name in names:
            rows.append(matrix.row(name, Path(work), runs, checks))
            print(line(rows[-1]), flush=True)
            if a.json_out:
                with open(a.json_out, "w") as f:
                    json.dump([asdict(r) for r in rows], f, indent=1)
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
