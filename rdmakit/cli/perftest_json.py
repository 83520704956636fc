"""perftest's ``--out_json`` report: the test's description and its results, as one JSON object.

perftest 6.x writes ``{"test_info": {...}, "results": {...}}`` to
``--out_json_file`` (``perftest_out.json`` in the working directory by
default) each time it prints a report, so with ``-a`` the file holds the
last size's (``write_test_info_to_file``, ``write_bw_report_to_file``,
``write_report_lat_to_file`` and ``write_report_lat_duration_to_file`` in
perftest's ``perftest_parameters.c``). The keys and their values are
perftest's; the file is valid JSON (``json.load`` reads it) and is replaced
whole, so a reader never sees half of one.
"""

import json
from pathlib import Path
from typing import NamedTuple

from rdmakit.cli.errors import CliError
from rdmakit.cli.oob_messages import BwReport
from rdmakit.cli.perftest_params import Params
from rdmakit.cli.publishing import writable_target, write_atomic

_VERB = {"send": "Send", "write": "RDMA_Write", "read": "RDMA_Read", "atomic": "Atomic"}


class LatFigures(NamedTuple):
    """What ``print_report_lat`` prints, in µs (``t_typical`` is the median)."""

    size: int
    iters: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float
    t_stdev: float
    p99: float
    p999: float


class LatDurationFigures(NamedTuple):
    """What ``print_report_lat_duration`` prints: µs per iteration and transactions per second."""

    size: int
    iters: int
    t_avg: float
    tps: float


def test_info(p: Params, device: str, mtu: int, gid_index: int) -> dict[str, object]:
    """``write_test_info_to_file``: the description the report's header prints, in perftest's keys."""
    verb = p.kind.verb
    name = _VERB[verb] + "_"
    if verb == "atomic":
        name += ("CMP_AND_SWAP" if p.atomic_cas else "FETCH_AND_ADD") + "_"
    if p.kind.lat:
        name += "Latency_"
    else:
        name += ("Bidirectional_" if p.duplex else "") + "BW_"
    info: dict[str, object] = {
        "test": name + "Test",
        "Dual_port": "OFF",
        "Device": device,
        "Number_of_qps": p.num_qps,
        "Transport_type": "IB",
        "Connection_type": "RC",
        "Using_SRQ": "OFF",
        "PCIe_relax_order": "Unsupported",
        "ibv_wr_API": "OFF",
    }
    if p.client or p.duplex:
        info["TX_depth"] = p.tx_depth
    if verb == "send" and (not p.client or p.duplex):
        info["RX_depth"] = p.rx_depth
    if not p.kind.lat:
        info["CQ_Moderation"] = p.cq_mod
    info["Mtu"] = mtu
    info["Link_type"] = "Ethernet"
    info["GID_index"] = gid_index
    if verb in ("read", "atomic"):
        info["Outstand_reads"] = p.out_reads
    else:
        info["Max_inline_data"] = 0
    info["rdma_cm_QPs"] = "ON" if p.rdma_cm else "OFF"
    info["Use_ROCm_memory"] = "OFF"
    info["Use_MUSA_memory"] = "OFF"
    info["Data_ex_method"] = "rdma_cm" if p.comm_rdma_cm else "Ethernet"
    return info


def bw_results(p: Params, rep: BwReport, rem: BwReport | None) -> dict[str, object]:
    """``write_bw_report_to_file``: the figures of the line printed (both sides' sums when bidirectional)."""
    peak, avg, rate = rep.bw_peak, rep.bw_avg, rep.msg_rate
    if rem is not None:
        peak, avg, rate = peak + rem.bw_peak, avg + rem.bw_avg, rate + rem.msg_rate
    if p.output == "bandwidth":
        return {"bw_avg": avg}
    if p.output == "message_rate":
        return {"msgRate_avg": rate}
    digits = 6 if p.gbits and avg < 0.1 else 2  # REPORT_FMT_EXT_JSON's precision
    return {
        "MsgSize": rep.size,
        "n_iterations": rep.iters,
        "BW_peak": round(peak, digits),
        "BW_average": round(avg, digits),
        "MsgRate": round(rate, 6),
    }


def lat_results(p: Params, f: LatFigures) -> dict[str, object]:
    """``write_report_lat_to_file``."""
    if p.output == "latency":
        return {"avg_lat": f.t_avg}
    return {
        "MsgSize": f.size,
        "n_iterations": f.iters,
        "t_min": round(f.t_min, 2),
        "t_max": round(f.t_max, 2),
        "t_typical": round(f.t_typical, 2),
        "t_avg": round(f.t_avg, 2),
        "t_stdev": round(f.t_stdev, 2),
        "percentile_99": round(f.p99, 2),
        "percentile_99.9": round(f.p999, 2),
    }


def lat_duration_results(p: Params, f: LatDurationFigures) -> dict[str, object]:
    """``write_report_lat_duration_to_file``."""
    if p.output == "latency":
        return {"t_avg": f.t_avg}
    return {
        "MsgSize": f.size,
        "n_iterations": f.iters,
        "t_avg": round(f.t_avg, 2),
        "tps_average": round(f.tps, 2),
    }


class JsonReport:
    """Where ``--out_json`` writes: the file, and the test's description written with each report."""

    def __init__(self, path: str, info: dict[str, object]) -> None:
        self.path = Path(path)
        self.info = info
        writable_target(self.path, "--out_json_file")

    def write(self, results: dict[str, object]) -> None:
        """Replace the file with this report (perftest truncates it at each report)."""
        text = json.dumps({"test_info": self.info, "results": results}, indent=1)
        writable_target(self.path, "--out_json_file")
        try:
            write_atomic(self.path, (text + "\n").encode())
        except OSError as e:
            raise CliError(f"failed to open {self.path}: {e.strerror}") from None
