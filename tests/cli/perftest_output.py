"""A parser of perftest's and ibv_rc_pingpong's output, written from their formats.

perftest ``perftest_parameters.h``: ``RESULT_FMT``/``RESULT_FMT_G`` (the bw
header; ``[MB/sec]`` in 4.5, ``[MiB/sec]`` later) with ``REPORT_FMT`` lines,
``RESULT_FMT_LAT`` with ``REPORT_FMT_LAT`` lines; rdma-core ``rc_pingpong.c``:
the address lines and the two result lines. A row belongs to the header above it.
"""

import re
from dataclasses import dataclass

BW_HEADER = re.compile(
    r"^ #bytes\s+#iterations\s+BW peak\[(MB|MiB|Gb)/sec\]\s+"
    r"BW average\[(MB|MiB|Gb)/sec\]\s+MsgRate\[Mpps\]\s*$"
)
LAT_HEADER = re.compile(
    r"^ #bytes\s+#iterations\s+t_min\[usec\]\s+t_max\[usec\]\s+t_typical\[usec\]\s+t_avg\[usec\]\s+"
    r"t_stdev\[usec\]\s+99% percentile\[usec\]\s+99\.9% percentile\[usec\]\s*$"
)
LAT_DUR_HEADER = re.compile(r"^ #bytes\s+#iterations\s+t_avg\[usec\]\s+tps average\s*$")
NUM = r"([0-9]+(?:\.[0-9]+)?)"
BW_LINE = re.compile(rf"^ ([0-9]+)\s+([0-9]+)\s+{NUM}\s+{NUM}\s+{NUM}\s*$")
LAT_LINE = re.compile(r"^ ([0-9]+)\s+([0-9]+)" + rf"\s+{NUM}" * 7 + r"\s*$")
PP_BYTES = re.compile(r"^([0-9]+) bytes in ([0-9.]+) seconds = ([0-9.]+) Mbit/sec$")
PP_ITERS = re.compile(r"^([0-9]+) iters in ([0-9.]+) seconds = ([0-9.]+) usec/iter$")
PP_ADDR = re.compile(
    r"^  (local|remote) address: +LID 0x([0-9a-f]{4}), QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6}), GID (\S+)$"
)


@dataclass(frozen=True)
class Row:
    size: int
    iters: int
    values: tuple[float, ...]


LAT_DUR_LINE = re.compile(rf"^ ([0-9]+)\s+([0-9]+)\s+{NUM}\s+{NUM}\s*$")
LINES = {"bw": BW_LINE, "lat": LAT_LINE, "lat_dur": LAT_DUR_LINE}


def parse_perftest(out: str) -> tuple[str | None, list[Row]]:
    """('bw'|'lat'|'lat_dur'|None, result rows) from perftest-formatted output: rows follow their header."""
    kind: str | None = None
    rows: list[Row] = []
    for line in out.splitlines():
        if BW_HEADER.match(line):
            kind = "bw"
            continue
        if LAT_HEADER.match(line):
            kind = "lat"
            continue
        if LAT_DUR_HEADER.match(line):
            kind = "lat_dur"
            continue
        m = LINES[kind].match(line) if kind else None
        if m:
            rows.append(Row(int(m.group(1)), int(m.group(2)), tuple(float(g) for g in m.groups()[2:])))
    return kind, rows
