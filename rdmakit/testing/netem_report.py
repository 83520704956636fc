"""The netem matrix's rows as text: a line per path while it runs, Markdown for the docs.

``python3 -m rdmakit.testing.netem --markdown FILE.json`` prints the tables;
``--update DOC ...`` rewrites, in each document, what stands between the
markers ``<!-- netem-matrix -->`` and ``<!-- /netem-matrix -->`` (every path,
WRITE and READ, and the ECN counters) and between ``<!-- netem-summary -->``
and ``<!-- /netem-summary -->`` (WRITE on the paths of ``SUMMARY``), so the
figures in the docs come from the runs' JSON and nowhere else. Rows of the same
path from several runs (several files) make one row of the tables: each figure is
the median of the runs', each ratio the median of the runs' ratios (each taken
in its own run), and the range of those ratios follows it.
"""

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from rdmakit.transport.user_files import read_user_file


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
    #: By run: how rxe's counters moved (``rxk0.sent_pkts`` ...) and, on paths that mark
    #: ECN, the CNPs on the wire and what the qdiscs of rdmakit's link did (``marked`` ...).
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    #: By run: every figure a run of several gave (iperf3's ``IPERF3_RUNS``), MB/s.
    samples: dict[str, list[float]] = field(default_factory=dict)

    def ratio(self, run: str) -> float | None:
        got, tcp = self.mbs.get(run), self.mbs.get("iperf3")
        return got / tcp if got is not None and tcp else None


#: The pairs of the tables, in column order, and their headings.
PAIRS = (
    ("rk-rk", "rdmakit ↔ rdmakit"),
    ("rk>rxe", "rdmakit → rxe"),
    ("rxe>rk", "rxe → rdmakit"),
    ("rxe-rxe", "rxe ↔ rxe"),
)
#: The README's rows: the target path, the delays and the losses.
SUMMARY = ("loss1", "clean", "delay1", "delay10", "delay50", "loss0.1", "loss5")
#: Counters of the ECN table, by heading.
ECN_COUNTERS = (
    ("marked", "CE marked"), ("early", "RED early drops"), ("pdrop", "RED queue full"),
    ("dropped", "netem's drops"), ("cnps", "CNPs"),
)  # fmt: skip


def _run(pair: str, op: str) -> str:
    return pair if op == "write" else f"{pair} read"


def _fig(r: Row, run: str, *, md: bool) -> str:
    if run not in r.mbs:
        return "–" if md else f"{'-':>13}"
    got, ratio = r.mbs[run], r.ratio(run)
    if got is None:
        return f"failed: {r.notes[run][:60]}" if md else f"{'failed':>13}"
    if md:
        return f"{got:.2f} ({ratio:.2f}×)" if ratio is not None else f"{got:.2f}"
    return f"{got:6.2f} ({ratio:4.2f}x)" if ratio is not None else f"{got:6.2f}       "


def _cell(runs: list[Row], run: str) -> str:
    """One run's figure over a path's runs: the median MB/s and the median ratio, with the
    ratios' range when there are several, and how many runs failed and why."""
    if len(runs) == 1:
        return _fig(runs[0], run, md=True)
    ran = [r for r in runs if run in r.mbs]
    if not ran:
        return "–"
    ok = [r for r in ran if r.mbs[run] is not None]
    bad = [r for r in ran if r.mbs[run] is None]
    text = ""
    if ok:
        text = f"{statistics.median(r.mbs[run] or 0.0 for r in ok):.2f}"
        ratios = [x for x in (r.ratio(run) for r in ok) if x is not None]
        if ratios:
            text += f" ({statistics.median(ratios):.2f}×"
            text += f"; {min(ratios):.2f}–{max(ratios):.2f}×)" if len(ratios) > 1 else ")"
    if bad:
        why = " / ".join(dict.fromkeys(r.notes[run][:60] for r in bad))
        text += f"{'; ' if text else ''}failed in {len(bad)} of {len(ran)}: {why}"
    return text


def _tcp(runs: list[Row]) -> str:
    """iperf3 over a path's runs: the median of the runs' medians, and the range of every run."""
    got = [x for x in (r.mbs.get("iperf3") for r in runs) if x is not None]
    if not got:
        return f"failed: {runs[0].notes.get('iperf3', '')[:60]}"
    each = [x for r in runs for x in r.samples.get("iperf3", [])] or got
    text = f"{statistics.median(got):.2f}"
    return text + (f" ({min(each):.2f}–{max(each):.2f})" if len(each) > 1 else "")


def _checked(runs: list[Row]) -> str:
    """The byte-checked exchanges over a path's runs: "all" with their seconds, or what failed."""
    done = []
    for c in dict.fromkeys(c for r in runs for c in r.checks):
        ran = [r for r in runs if c in r.checks]
        bad = [r.checks[c] for r in ran if r.checks[c]]
        if bad:
            done.append(f"FAILED in {len(bad)} of {len(ran)}: {bad[0][:80]}")
        else:
            done.append("all (" + ", ".join(f"{r.check_seconds[c]:.0f}" for r in ran) + " s)")
    return ", ".join(done) or "–"


def grouped(rows: list[Row]) -> list[list[Row]]:
    """``rows`` by path, in the order each path first appears."""
    by_path: dict[str, list[Row]] = {}
    for r in rows:
        by_path.setdefault(r.path, []).append(r)
    return list(by_path.values())


HEADER = f"{'path':<10} {'op':<5} {'iperf3':>7} " + " ".join(f"{p:>13}" for p, _ in PAIRS) + "  bytes checked"


def line(r: Row) -> str:
    """The path's lines: MB/s and, after each RDMA figure, its ratio to iperf3."""
    tcp = r.mbs.get("iperf3")
    out = []
    for op in ("write", "read"):
        if not any(_run(p, op) in r.mbs for p, _ in PAIRS):
            continue
        tcp_text = f"{tcp:7.2f}" if tcp is not None else f"{'-':>7}"
        figs = " ".join(_fig(r, _run(p, op), md=False) for p, _ in PAIRS)
        out.append(f"{r.path:<10} {op:<5} {tcp_text} {figs}")
    checks = ", ".join(
        f"{c} {'ok' if not v else 'FAILED'} ({r.check_seconds[c]:.0f} s)" for c, v in r.checks.items()
    )
    out[:1] = [(out[0] if out else r.path) + f"  {checks}  load {r.load:.1f}"]
    for key, note in {**r.notes, **r.checks}.items():
        if note:
            out.append(f"{'':<10} {key}: {note}")
    for key, moved in r.counters.items():
        out.append(f"{'':<10} {key}: " + " ".join(f"{k}={v}" for k, v in sorted(moved.items())))
    return "\n".join(out)


def _table(groups: list[list[Row]], op: str, *, checks: bool) -> str:
    head = "| path | qdiscs, each way | runs | iperf3 TCP | " + " | ".join(h for _, h in PAIRS) + " |"
    rule = "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in PAIRS) + " |"
    if checks:
        head += " every RC operation, bytes checked: rdmakit ↔ rdmakit, rdmakit ↔ rxe |"
        rule += " --- |"
    out = [head, rule]
    for runs in groups:
        r = runs[0]
        cells = [
            r.path,
            f"`{r.netem}`",
            str(len(runs)),
            _tcp(runs),
            *(_cell(runs, _run(p, op)) for p, _ in PAIRS),
        ]
        if checks:
            cells.append(_checked(runs))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def markdown(rows: list[Row]) -> str:
    """Every row: the WRITE table (with the byte checks), the READ table and the ECN counters."""
    out = [
        "`ib_write_bw` (MB/s, the median of the runs; in brackets the median of each run's ratio to",
        "iperf3 TCP on the same path in the same run, and their range; iperf3's figure is the median,",
        "in brackets the range of its runs):",
        "",
        _table(grouped(rows), "write", checks=True),
    ]
    if any(_run(p, "read") in r.mbs for r in rows for p, _ in PAIRS):
        out += ["", "`ib_read_bw`:", "", _table(grouped(rows), "read", checks=False)]
    ecn = [(r, run, c) for r in rows for run, c in r.counters.items() if "cnps" in c]
    if ecn:
        out += ["", "On the paths that mark CE, rdmakit ↔ rdmakit's link during each run:", ""]
        out += ["| path | run | MB/s | " + " | ".join(h for _, h in ECN_COUNTERS) + " |"]
        out += ["| --- | --- | ---: | " + " | ".join("---:" for _ in ECN_COUNTERS) + " |"]
        for r, run, c in ecn:
            mbs = r.mbs.get(run)
            figs = " | ".join(str(c.get(k, 0)) for k, _ in ECN_COUNTERS)
            out.append(f"| {r.path} | {run} | {'failed' if mbs is None else f'{mbs:.2f}'} | {figs} |")
    return "\n".join(out)


def summary(rows: list[Row]) -> str:
    """WRITE on the README's paths (``SUMMARY``), in that order."""
    by_name = {runs[0].path: runs for runs in grouped(rows)}
    return _table([by_name[n] for n in SUMMARY if n in by_name], "write", checks=False)


_BLOCK = "<!-- {0} -->\n(.*?)<!-- /{0} -->"


def update(doc: Path, rows: list[Row]) -> bool:
    """Rewrite ``doc``'s ``netem-matrix`` and ``netem-summary`` blocks; False if it has neither."""
    text = read_user_file(str(doc), "the document", 1 << 22).data.decode()
    found = False
    for name, body in (("netem-matrix", markdown(rows)), ("netem-summary", summary(rows))):
        block = re.compile(_BLOCK.format(name), re.S)
        if block.search(text):
            found = True
            text = block.sub(lambda _m: f"<!-- {name} -->\n{body}\n<!-- /{name} -->", text)  # noqa: B023
    if found:
        doc.write_text(text)
    return found


def failed(rows: list[Row]) -> bool:
    """A run of rdmakit failed, an exchange lost or changed a byte, or anything hung."""
    return any(
        r.hung
        or any(v is None for k, v in r.mbs.items() if "rk" in k.replace("rxe", ""))
        or any(r.checks.values())
        for r in rows
    )
