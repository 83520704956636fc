"""``--out_json``: perftest's JSON report, the figures the table prints, in perftest's keys.

perftest 6.x writes ``{"test_info": ..., "results": ...}`` to
``--out_json_file`` (``perftest_out.json`` by default) at each report; the
file must be valid JSON and say what the printed line says.
"""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.cli.cli_util import finish, spawn, wait_listening
from tests.cli.perftest_output import parse_perftest
from tests.cli.test_perftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def _pair(new_ip: Callable[[], str], test: str, server_flags: list[str], client_flags: list[str]) -> str:
    port = str(free_port())
    server = spawn("perftest", test, "-d", new_ip(), "-p", port, *server_flags)
    wait_listening(int(port), server)
    client = spawn("perftest", test, "-d", new_ip(), "-p", port, *client_flags, "127.0.0.1")
    (c_rc, c_out, c_err), (s_rc, _s_out, s_err) = finish(client, 240), finish(server, 240)
    assert (c_rc, s_rc) == (0, 0), c_err + s_err
    return c_out


def test_bw_report_as_json(new_ip: Callable[[], str], tmp_path: Path) -> None:
    mine, theirs = tmp_path / "client.json", tmp_path / "server.json"
    flags = ["-s", "4096", "-n", "200", "--out_json"]
    out = _pair(
        new_ip, "ib_write_bw", [*flags, "--out_json_file", str(theirs)], [*flags, f"--out_json_file={mine}"]
    )
    _peak, bw_avg, msg_rate = parse_perftest(out)[1][0].values
    doc = json.loads(mine.read_text())
    assert doc["test_info"]["test"] == "RDMA_Write_BW_Test"
    assert doc["test_info"]["Connection_type"] == "RC"
    assert doc["test_info"]["TX_depth"] == 128
    res = doc["results"]
    assert (res["MsgSize"], res["n_iterations"]) == (4096, 200)
    assert res["BW_average"] == round(bw_avg, 2)
    assert res["MsgRate"] == round(msg_rate, 6)
    # The server prints the client's report, and writes it too.
    assert json.loads(theirs.read_text())["results"]["BW_average"] == res["BW_average"]
    assert oct(mine.stat().st_mode & 0o777) == oct(0o600)  # perftest's S_IRUSR | S_IWUSR


def test_lat_report_as_json_in_the_working_directory(new_ip: Callable[[], str], tmp_path: Path) -> None:
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "rdmakit", "perftest", "ib_read_lat", "-p", port, "-n", "50"]
    server = subprocess.Popen(
        [*base, "-d", new_ip()], cwd=tmp_path.parent, env=env, stdout=subprocess.DEVNULL, text=True
    )
    try:
        wait_listening(int(port), server)
        got = subprocess.run(
            [*base, "-d", new_ip(), "--out_json", "127.0.0.1"],
            check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    finally:
        server.wait(240)
    assert got.returncode == 0, got.stderr
    doc = json.loads((tmp_path / "perftest_out.json").read_text())
    assert doc["test_info"]["test"] == "RDMA_Read_Latency_Test"
    assert doc["test_info"]["Outstand_reads"] == 16
    res = doc["results"]
    assert res["n_iterations"] == 50
    assert res["t_min"] <= res["t_typical"] <= res["t_max"]
    typical = float(got.stdout.splitlines()[-2].split()[4])
    assert res["t_typical"] == round(typical, 2)


def test_output_latency_writes_the_average_alone(new_ip: Callable[[], str], tmp_path: Path) -> None:
    path = tmp_path / "avg.json"
    flags = ["-n", "30", "--output", "latency"]
    out = _pair(new_ip, "ib_write_lat", flags, [*flags, "--out_json", "--out_json_file", str(path)])
    doc = json.loads(path.read_text())
    assert list(doc["results"]) == ["avg_lat"]
    assert round(doc["results"]["avg_lat"], 6) == float(out.strip().splitlines()[-1])


def test_a_link_is_refused_never_followed(new_ip: Callable[[], str], tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "report.json"
    link.symlink_to(victim)
    rc, _out, err = finish(spawn("perftest", "ib_write_lat", "-d", new_ip(), "--out_json_file", str(link),
                                 "--out_json", "-n", "5", "127.0.0.1"))  # fmt: skip
    assert rc == 2
    assert "something other than a file" in err
    assert len(err.splitlines()) == 1
    assert victim.read_text() == "precious\n"


def test_a_directory_that_is_missing_is_one_line(new_ip: Callable[[], str], tmp_path: Path) -> None:
    rc, _out, err = finish(spawn("perftest", "ib_write_lat", "-d", new_ip(), "--out_json", "--out_json_file",
                                 str(tmp_path / "no" / "such.json"), "-n", "5", "127.0.0.1"))  # fmt: skip
    assert rc == 2
    assert "does not exist" in err
    assert len(err.splitlines()) == 1
