#!/usr/bin/env python3
"""Regenerate the figures README.md quotes from the programs that make them.

- ``demo``: the table of ``rdmakit demo`` (the block that starts ``rdmakit
  demo:`` and ends ``all operations verified``), about 10 s;
- ``sweep``: ``rdmakit bench --sweep --runs 3 --plot docs/bench-sweep.png``
  (about 90 s on two quiet cores), and the sentence between the markers
  ``<!-- sweep-figures -->`` and ``<!-- /sweep-figures -->`` from its rows.

Usage: ``python3 scripts/readme-figures.py [demo] [sweep]`` (default: both),
from the repository root, with rdmakit importable. ``--check`` rewrites
nothing and exits 1 when the README's demo table has another shape (another
header, operations or sizes) than the demo prints today; CI runs that.
"""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DEMO_BLOCK = re.compile(r"```\n(rdmakit demo: .*?\nall operations verified)\n```", re.S)
SWEEP_MARKS = re.compile(r"(<!-- sweep-figures -->\n)(.*?)(\n<!-- /sweep-figures -->)", re.S)
SMALL = 4096


def rdmakit(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "rdmakit", *args], check=True, capture_output=True, text=True
    ).stdout


def shape(table: str) -> list[str]:
    """A demo table without its figures: the header, the legend, and each row's operation and size."""
    out = []
    for line in table.splitlines():
        m = re.match(r"(.{22})\s*([0-9]+ (?:B|KiB|MiB))\s+[0-9]+\s+(ok|FAILED)", line)
        out.append(f"{m.group(1).strip()} {m.group(2)} {m.group(3)}" if m else line)
    return out


def demo(check: bool) -> bool:
    text = README.read_text()
    found = DEMO_BLOCK.search(text)
    if found is None:
        sys.exit("README.md has no demo table block")
    table = rdmakit("demo").rstrip("\n")
    if check:
        return shape(found.group(1)) == shape(table)
    README.write_text(text[: found.start(1)] + table + text[found.end(1) :])
    return True


def sweep() -> None:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        rdmakit("bench", "--sweep", "--runs", "3", "--plot", str(ROOT / "docs/bench-sweep.png"), "--json-out",
                f.name)  # fmt: skip
        rows = {r["key"]: r for r in json.loads(Path(f.name).read_text())}

    def at(kind: str, size: int, field: str = "value") -> float | None:
        r = rows.get(f"{kind}:{size}")
        return None if r is None or r[field] is None else float(r[field])

    sizes = sorted(int(k.split(":")[1]) for k in rows if k.startswith("sweep_rtt:"))
    small = [s for s in sizes if s <= SMALL]

    def span(kind: str, field: str = "value") -> str:
        vals = [v for s in small if (v := at(kind, s, field)) is not None]
        return f"{min(vals):.0f}–{max(vals):.0f}" if vals else "—"

    big = sizes[-1]
    rtt_big, ping_big = at("sweep_rtt", big), at("sweep_raw_rtt", big)
    bw_big, raw_big = at("sweep_bw", big), at("sweep_raw_bw", big)
    fi = (
        f" and {span('sweep_rtt', 'c_baseline')} µs for fi_pingpong"
        if at("sweep_rtt", 2, "c_baseline")
        else ""
    )
    sentence = (
        f"In that sweep the WRITE round trip is {span('sweep_rtt')} µs up to 4 KiB, against "
        f"{span('sweep_raw_rtt')} µs for a raw ping of the same size{fi}; at {big >> 20} MiB, WRITE "
        f"moves {bw_big or 0:.0f} MB/s against the raw stream's {raw_big or 0:.0f}, with a round trip of "
        f"{rtt_big or 0:.0f} µs against the raw ping's {ping_big or 0:.0f}."
    )
    text = README.read_text()
    m = SWEEP_MARKS.search(text)
    if m is None:
        sys.exit("README.md has no <!-- sweep-figures --> markers")
    README.write_text(text[: m.start(2)] + sentence + text[m.end(2) :])


def main(argv: list[str]) -> int:
    check = "--check" in argv
    what = [a for a in argv if a != "--check"] or ["demo", "sweep"]
    if check:
        ok = demo(check=True)
        print(
            "README demo table: " + ("as the demo prints it" if ok else "differs from what the demo prints")
        )
        return 0 if ok else 1
    if "demo" in what:
        demo(check=False)
    if "sweep" in what:
        sweep()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
