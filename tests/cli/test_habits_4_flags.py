"""perftest, rc-pingpong and rping take what their users type: the C tools' habits.

No ``-d`` takes the first device; ``-x 1``/``-g 1`` (rxe's IPv4-mapped GID)
selects a soft device's address; a client with no server fails at once; every
flag of the originals is taken, accepted without effect, or refused in one
line saying why (status 2); docs/perftest.md shows the tables the parsers use.
"""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rdmakit.cli.bench_qp import first_device
from rdmakit.cli.tool_flags import PERFTEST_FLAGS, RC_PINGPONG_FLAGS, RPING_FLAGS, Does, markdown
from tests.cli.cli_util import finish, spawn, wait_listening
from tests.cli.perftest_output import PP_ITERS, parse_perftest
from tests.cli.test_perftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_x_1_is_a_soft_devices_address_as_on_rxe(new_ip: Callable[[], str]) -> None:
    port = str(free_port())
    server = spawn("perftest", "ib_write_lat", "-d", new_ip(), "-x", "1", "-p", port, "-n", "20")
    wait_listening(int(port), server)
    client = spawn("perftest", "ib_write_lat", "-d", new_ip(), "-x", "1", "-p", port, "-n", "20", "127.0.0.1")
    (c_rc, c_out, c_err), (s_rc, _s_out, s_err) = finish(client, 240), finish(server, 240)
    assert (c_rc, s_rc) == (0, 0), c_err + s_err
    assert " GID index       : 1" in c_out
    assert parse_perftest(c_out)[1][0].iters == 20


def test_g_1_for_rc_pingpong(new_ip: Callable[[], str]) -> None:
    port = str(free_port())
    server = spawn("rc-pingpong", "-d", new_ip(), "-g", "1", "-p", port, "-n", "5")
    wait_listening(int(port), server)
    client = spawn("rc-pingpong", "-d", new_ip(), "-g", "1", "-p", port, "-n", "5", "-c", "127.0.0.1")
    (c_rc, c_out, c_err), (s_rc, s_out, s_err) = finish(client, 240), finish(server, 240)
    assert (c_rc, s_rc) == (0, 0), c_err + s_err
    assert PP_ITERS.match(c_out.splitlines()[3])
    assert "invalid data" not in s_out  # -c: the server checked the pages the client marked


def test_x_0_says_why(new_ip: Callable[[], str]) -> None:
    rc, _, err = finish(spawn("perftest", "ib_write_lat", "-d", new_ip(), "-x", "0"))
    assert rc == 2
    assert "link-local IPv6 GID" in err
    assert "-x/-g 1" in err
    assert len(err.splitlines()) == 1


def test_without_d_the_first_device(new_ip: Callable[[], str]) -> None:
    first = first_device()
    assert first.kind in ("verbs", "soft-udp")
    # The client opens the first device, then finds no server; if another program holds the first
    # device's address, it says that instead. Either way it did not ask for -d.
    port = str(free_port())
    rc, _, err = finish(spawn("rc-pingpong", "-p", port, "127.0.0.1"), 120)
    assert rc != 0
    assert "Couldn't connect to 127.0.0.1" in err or "is held by" in err, err
    assert "no device given" not in err


@pytest.mark.parametrize("command", [["perftest", "ib_write_bw"], ["rc-pingpong"]])
def test_a_client_with_no_server_fails_at_once(new_ip: Callable[[], str], command: list[str]) -> None:
    port = str(free_port())
    env = {**os.environ, "RDMAKIT_OOB_TIMEOUT": "30"}
    p = subprocess.run(
        [sys.executable, "-m", "rdmakit", *command, "-d", new_ip(), "-p", port, "127.0.0.1"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert p.returncode == 1
    assert f"Couldn't connect to 127.0.0.1:{port}: Connection refused" in p.stderr
    assert "within" not in p.stderr  # not a timeout: it did not wait


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["perftest", "ib_write_bw", "-c", "UD"], "RC only"),
        (["perftest", "ib_write_bw", "-c", "UC"], "RC only"),
        (["perftest", "ib_write_lat", "-C"], "no cycle counts"),
        (["perftest", "ib_write_bw", "--run_infinitely"], "one sample"),
        (["perftest", "ib_write_bw", "--rate_limit", "5"], "rate limiting"),
        (["perftest", "ib_write_bw", "-H"], "Latency tests"),
        (["rc-pingpong", "-j"], "device memory"),
        (["rping", "-s", "-a", "127.0.0.1", "-P"], "one connection"),
    ],
)
def test_refused_flags_say_why(args: list[str], why: str) -> None:
    rc, _, err = finish(spawn(*args))
    assert rc == 2
    assert why in err
    assert len(err.splitlines()) == 1


def test_accepted_flags_run(new_ip: Callable[[], str]) -> None:
    """-I, -l, -U, -N, -T, -e, --output: accepted; -U prints every sample, --output the figure only."""
    port = str(free_port())
    flags = ["-n", "20", "-I", "64", "-l", "4", "-e", "-T", "3", "-U", "--output", "latency", "-p", port]
    server = spawn("perftest", "ib_write_lat", "-d", new_ip(), *flags)
    wait_listening(int(port), server)
    client = spawn("perftest", "ib_write_lat", "-d", new_ip(), *flags, "127.0.0.1")
    (c_rc, c_out, c_err), (s_rc, _s, s_err) = finish(client, 240), finish(server, 240)
    assert (c_rc, s_rc) == (0, 0), c_err + s_err
    lines = c_out.splitlines()
    assert lines[0] == "#, usec"
    assert [int(line.split(",")[0]) for line in lines[1:20]] == list(range(1, 20))
    assert float(lines[-1]) > 0  # --output latency: the average alone
    assert "GID" not in c_out  # nothing else is printed


def test_docs_show_every_flag_table() -> None:
    doc = (ROOT / "docs" / "perftest.md").read_text()
    for table in (PERFTEST_FLAGS, RC_PINGPONG_FLAGS, RPING_FLAGS):
        assert markdown(table) in doc
    names = {n for f in PERFTEST_FLAGS for n in f.names}
    for flag in ("-x", "-d", "-c", "-I", "-l", "-C", "-H", "-U", "-N", "-T", "--run_infinitely", "--output",
                 "--rate_limit"):  # fmt: skip
        assert flag in names
    assert {f.does for f in PERFTEST_FLAGS} == set(Does)
