"""External C baselines of ``rdmakit bench``: iperf3, sockperf and libfabric's fi_pingpong.

Each runs its server and client on the bench's two loopback addresses and is
parsed from its own output (iperf3's JSON, sockperf's percentile lines,
fi_pingpong's table). Debian packages them as ``iperf3``, ``sockperf`` and
``libfabric-bin`` (``scripts/install-bench-deps.sh``). A tool that is not
installed, or whose run fails, gives no figure (None) and one line saying why.

- ``iperf3`` reports bits per second of the whole transfer (``-n`` bytes,
  ``-l`` bytes per write): ``end.sum_received.bits_per_second``.
- ``sockperf ping-pong --full-rtt`` reports round trips in µs; the median is
  its ``percentile 50.000`` line. Its smallest message is 14 bytes.
- ``fi_pingpong`` prints ``usec/xfer``: one transfer is one direction of a
  ping-pong (the time of all iterations over twice their number), so a round
  trip is twice that.
"""

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence

from rdmakit.transport.baseline import free_port

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FLOAT = r"([0-9]+(?:\.[0-9]+)?)"
#: sockperf's minimum message size.
SOCKPERF_MIN = 14


def parse_iperf3(text: str) -> float | None:
    """Bytes per second received, from ``iperf3 -J`` output (None if it reports an error)."""
    import json

    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("error"):
        return None
    end = doc.get("end") or {}
    for key in ("sum_received", "sum", "sum_sent"):
        bps = (end.get(key) or {}).get("bits_per_second")
        if isinstance(bps, int | float) and bps > 0:
            return float(bps) / 8
    return None


def parse_sockperf(text: str) -> float | None:
    """Median round trip in µs from ``sockperf ping-pong`` (one-way figures are doubled)."""
    text = _ANSI.sub("", text)
    full = "avg-rtt" in text or "Round trip is" in text
    m = re.search(r"percentile 50\.0+\s*=\s*" + _FLOAT, text)
    if m is None:
        m = re.search(r"avg-(?:rtt|lat(?:ency)?)\s*=\s*" + _FLOAT, text)
    if m is None:
        return None
    v = float(m.group(1))
    return v if full else 2 * v


def parse_fi_pingpong(text: str, size: int | None = None) -> float | None:
    """Round trip in µs (twice ``usec/xfer``) of the row for ``size`` bytes (or the first row)."""
    header: list[str] | None = None
    for line in text.splitlines():
        cols = line.split()
        if "usec/xfer" in cols:
            header = cols
            continue
        if header is None or len(cols) != len(header):
            continue
        row = dict(zip(header, cols, strict=True))
        try:
            nbytes = _count(row["bytes"])
            usec = float(row["usec/xfer"])
        except (KeyError, ValueError):
            continue
        if size is None or nbytes == size:
            return 2 * usec
    return None


def _count(text: str) -> int:
    """fabtests' counts: ``8``, ``1k``, ``4m``, ``=1k`` (powers of 1024 for sizes)."""
    text = text.lstrip("=")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:].lower(), 1)
    return int(float(text.rstrip("kKmMgG")) * mult)


#: Seconds a client keeps retrying while its server starts.
SERVER_START = 5.0


def _pair(
    server: Sequence[str], client: Sequence[str], timeout: float, parse: Callable[[str], float | None]
) -> tuple[float | None, str]:
    """Run ``server`` in the background and ``client`` to the end: the figure ``parse`` finds in
    the client's output, or None and why not. The client is retried while the server starts up
    (a client that found no server may still exit 0: iperf3 -J does)."""
    srv = subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        give_up = time.monotonic() + SERVER_START
        while True:
            try:
                out = subprocess.run(client, capture_output=True, text=True, timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                return None, f"no result within {timeout:g} s"
            v = parse(out.stdout)
            if v is not None:
                return v, ""
            why = _why(out.stdout, out.stderr, out.returncode)
            if srv.poll() is not None or time.monotonic() > give_up:
                return None, why
            time.sleep(0.25)
    finally:
        if srv.poll() is None:
            srv.kill()
        srv.wait()


def _why(stdout: str, stderr: str, status: int) -> str:
    """The reason a client gave (iperf3's JSON ``error``, else its last line)."""
    m = re.search(r'"error":\s*"([^"]*)"', stdout)
    if m:
        return m.group(1)[:200]
    lines = (stderr or stdout).strip().splitlines()
    return lines[-1][:200] if lines else f"exit status {status}, no figure in its output"


class CTools:
    """The C tools found on this machine, each run on addresses ``a`` (client) and ``b`` (server)."""

    def __init__(self, a: str, b: str, say: Callable[[str], None], enabled: bool = True) -> None:
        self.a, self.b, self.say = a, b, say
        self.enabled = enabled
        self.told: set[str] = set()

    def have(self, tool: str) -> bool:
        if not self.enabled:
            return False
        if shutil.which(tool) is not None:
            return True
        if tool not in self.told:
            self.told.add(tool)
            self.say(f"{tool} is not installed: no C baseline from it (scripts/install-bench-deps.sh)")
        return False

    def _failed(self, what: str, why: str) -> None:
        self.say(f"{what} did not run to the end ({why}): no C baseline from it")

    def iperf3(self, total: int, chunk: int, timeout: float = 120.0) -> float | None:
        """Bytes per second of one TCP stream of ``total`` bytes, ``chunk`` bytes per write."""
        if not self.have("iperf3"):
            return None
        port = free_port(self.b)
        v, why = _pair(
            ["iperf3", "-s", "-1", "-B", self.b, "-p", str(port)],
            ["iperf3", "-c", self.b, "-B", self.a, "-p", str(port), "-n", str(total), "-l", str(chunk), "-J"],
            timeout,
            parse_iperf3,
        )
        if v is None:
            self._failed("iperf3", why)
        return v

    def sockperf(self, size: int, secs: int = 1, timeout: float = 60.0) -> float | None:
        """Median round trip in seconds of a blocking UDP ping-pong (``size`` bytes, at least 14)."""
        if not self.have("sockperf"):
            return None
        port = free_port(self.b)
        client = ["sockperf", "ping-pong", "-i", self.b, "-p", str(port), "--client_ip", self.a]
        client += ["-m", str(max(size, SOCKPERF_MIN)), "-t", str(max(1, secs)), "--full-rtt"]
        v, why = _pair(["sockperf", "server", "-i", self.b, "-p", str(port)], client, timeout, parse_sockperf)
        if v is None:
            self._failed("sockperf", why)
            return None
        return v * 1e-6

    def fi_pingpong(self, size: int, iterations: int, timeout: float = 120.0) -> float | None:
        """Round trip in seconds of ``fi_pingpong -p tcp -e msg -S size`` (the server listens on
        every address; the client connects to ``b``)."""
        if not self.have("fi_pingpong"):
            return None
        port = str(free_port(self.b))
        common = ["-p", "tcp", "-e", "msg", "-S", str(size), "-I", str(iterations)]
        server = ["fi_pingpong", *common, "-B", port]
        client = ["fi_pingpong", *common, "-P", port, self.b]
        v, why = _pair(server, client, timeout, lambda text: parse_fi_pingpong(text, size))
        if v is None:
            self._failed("fi_pingpong", why)
            return None
        return v * 1e-6
