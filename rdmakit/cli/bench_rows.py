"""The figures of ``rdmakit bench``: rows, their baselines, and the one table of targets.

A `Row` is the median of several runs of one measurement, with their spread,
the raw-socket baseline it is compared like for like with (``baseline``) and,
where a C tool measured the same thing, that tool's figure (``c_baseline``).
`TARGETS` is every target the bench checks, in one place; each divides a
row's median by its baseline, its C baseline, or another row's median.
"""

import dataclasses
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal

Against = Literal["baseline", "c_baseline"] | str


@dataclasses.dataclass(frozen=True)
class Target:
    """``value ÷ against`` must be ``≤ hi`` and ``≥ lo`` (either may be absent)."""

    against: Against
    lo: float | None = None
    hi: float | None = None
    why: str = ""
    #: How the report names what the ratio divides by (default: raw, C, or the row's key).
    label: str = ""

    @property
    def text(self) -> str:
        if self.lo is not None and self.hi is not None:
            bound = f"{self.lo:g}–{self.hi:g}"
        elif self.hi is not None:
            bound = f"≤ {self.hi:g}"
        else:
            bound = f"≥ {self.lo:g}"
        return f"{bound} vs {self.label or _against_label(self.against)}"

    def holds(self, ratio: float) -> bool:
        return (self.lo is None or ratio >= self.lo) and (self.hi is None or ratio <= self.hi)


def _against_label(against: str) -> str:
    if against == "baseline":
        return "raw"
    if against == "c_baseline":
        return "C"
    return against


#: Every target of ``rdmakit bench``, like for like (row key -> targets).
TARGETS: dict[str, tuple[Target, ...]] = {
    "rtt_write_poll": (
        Target("baseline", hi=1.5, why="polling WRITE round trip ÷ a UDP ping with the same spin policy"),
        Target("c_baseline", hi=1.0, why="polling WRITE round trip ÷ fi_pingpong -p tcp -e msg -S 8"),
    ),
    "rtt_read_poll": (
        Target("rtt_write_poll", lo=0.9, hi=1.1, why="READ within 10 % of WRITE", label="WRITE"),
    ),
    "rtt_fadd_poll": (
        Target("rtt_write_poll", lo=0.9, hi=1.1, why="FETCH_ADD within 10 % of WRITE", label="WRITE"),
    ),
    "rtt_cswap_poll": (
        Target("rtt_write_poll", lo=0.9, hi=1.1, why="CMP_SWP within 10 % of WRITE", label="WRITE"),
    ),
    "rtt_write_event": (Target("baseline", hi=1.3, why="event-driven round trip ÷ a blocking UDP ping"),),
    "udp_write": (Target("baseline", lo=0.9, why="WRITE 1 MiB ÷ raw GSO→GRO stream, same direction"),),
    "udp_read": (Target("baseline", lo=0.9, why="READ 1 MiB ÷ raw GSO→GRO stream, same direction"),),
    "tcp_write": (Target("c_baseline", lo=1.0, why="WRITE 1 MiB over TCP ÷ iperf3, one stream"),),
    "doca_job_rtt": (
        Target("baseline", hi=1.15, why="the DOCA job API's WRITE round trip ÷ the engine's", label="engine"),
    ),
    "doca_task_rtt": (
        Target(
            "baseline", hi=1.15, why="the DOCA task API's WRITE round trip ÷ the engine's", label="engine"
        ),
        Target("doca_job_rtt", hi=1.05, why="the task API costs no more than the job API", label="job API"),
    ),
}


@dataclasses.dataclass
class Check:
    target: Target
    ratio: float | None

    @property
    def passed(self) -> bool | None:
        """None: nothing to divide by (the baseline is missing)."""
        return None if self.ratio is None else self.target.holds(self.ratio)


@dataclasses.dataclass
class Row:
    key: str
    name: str
    unit: str
    samples: list[float]
    baseline: float | None = None
    baseline_name: str = ""
    c_baseline: float | None = None
    c_baseline_name: str = ""
    checks: list[Check] = dataclasses.field(default_factory=list)

    @property
    def value(self) -> float:
        return float(statistics.median(self.samples)) if self.samples else math.nan

    @property
    def spread(self) -> tuple[float, float]:
        return (min(self.samples), max(self.samples)) if self.samples else (math.nan, math.nan)

    @property
    def ratio(self) -> float | None:
        return _ratio(self.value, self.baseline)

    @property
    def c_ratio(self) -> float | None:
        return _ratio(self.value, self.c_baseline)

    @property
    def passed(self) -> bool | None:
        """True when every target with a figure to divide by holds; None without any."""
        verdicts = [c.passed for c in self.checks if c.passed is not None]
        return all(verdicts) if verdicts else None

    def as_json(self) -> dict[str, Any]:
        lo, hi = self.spread
        first = self.checks[0] if self.checks else None
        return {
            "key": self.key,
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "runs": len(self.samples),
            "min": lo,
            "max": hi,
            "baseline": self.baseline,
            "baseline_name": self.baseline_name or None,
            "c_baseline": self.c_baseline,
            "c_baseline_name": self.c_baseline_name or None,
            "target": first.target.text if first else None,
            "ratio": first.ratio if first else self.ratio,
            "pass": self.passed,
            "targets": [
                {"target": c.target.text, "against": c.target.against, "ratio": c.ratio, "pass": c.passed}
                for c in self.checks
            ],
        }


def _ratio(value: float, base: float | None) -> float | None:
    if base is None or not base or math.isnan(base) or math.isnan(value):
        return None
    return value / base


def apply_targets(row: Row, earlier: dict[str, Row], table: dict[str, tuple[Target, ...]] = TARGETS) -> None:
    """Fill ``row.checks`` from ``table``; a target against another row uses that row's median."""
    checks = []
    for t in table.get(row.key, ()):
        if t.against == "baseline":
            base = row.baseline
        elif t.against == "c_baseline":
            base = row.c_baseline
        else:
            other = earlier.get(t.against)
            base = other.value if other is not None else None
        checks.append(Check(t, _ratio(row.value, base)))
    row.checks = checks


def failures(rows: Sequence[Row]) -> list[str]:
    """One line per target a median misses (``--check``)."""
    out = []
    for r in rows:
        for c in r.checks:
            if c.passed is False:
                assert c.ratio is not None
                out.append(f"{r.name}: ratio {c.ratio:.2f}, target {c.target.text}")
    return out


def sample(fn: Callable[[], float], runs: int) -> list[float]:
    """``runs`` figures of ``fn`` (each a whole run: its own connection or stream)."""
    return [fn() for _ in range(runs)]


def _num(v: float | None, width: int) -> str:
    if v is None or math.isnan(v):
        return " " * width
    return f"{v:{width}.2f}" if abs(v) < 10 else f"{v:{width}.1f}"


HEADER = (
    f"{'test':<46} {'median':>9} {'unit':<5} {'min–max':>15} {'raw':>9} {'ratio':>6} "
    f"{'C tool':>9} {'ratio':>6}  target"
)


def format_row(r: Row) -> str:
    lo, hi = r.spread
    spread = f"{_num(lo, 1).strip()}–{_num(hi, 1).strip()}" if r.samples else ""
    marks = []
    for c in r.checks:
        verdict = "n/a" if c.passed is None else ("ok" if c.passed else "MISS")
        marks.append(f"{c.target.text} {verdict}")
    line = (
        f"{r.name:<46} {_num(r.value, 9)} {r.unit:<5} {spread:>15} {_num(r.baseline, 9)} {_num(r.ratio, 6)} "
        f"{_num(r.c_baseline, 9)} {_num(r.c_ratio, 6)}  {'; '.join(marks)}"
    )
    return line.rstrip()


class Report:
    """Rows as they are measured: targets applied, printed, kept for JSON."""

    def __init__(self, quiet: bool, targets: dict[str, tuple[Target, ...]] | None = None) -> None:
        self.quiet = quiet
        self.rows: dict[str, Row] = {}
        self.targets = TARGETS if targets is None else targets

    def say(self, text: str) -> None:
        """A line of the report (on stderr when stdout carries the JSON)."""
        print(text, file=sys.stderr if self.quiet else sys.stdout, flush=True)

    def add(self, row: Row) -> Row:
        apply_targets(row, self.rows, self.targets)
        self.rows[row.key] = row
        self.say(format_row(row))
        return row
