"""One surface for every program: usage errors exit 2 with the subcommand's usage, messages in the
user's words, one prefix, one meaning per flag, and the tools' wrappers safe from a clone's folder."""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rdmakit.doca import AccessFlag, Dev, DocaError, Rdma
from tests.cli.cli_util import run_once

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "args",
    [
        ["perftest", "ib_write_bw", "-m", "100"],
        ["rc-pingpong", "-m", "100"],
        ["perftest", "ib_write_bw", "-q", "0"],
        ["rdma-receive", "-d", "127.0.0.2x", "--timeout", "1"],
        ["rping", "-c", "-a", "127.0.0.2", "-C", "x"],
        ["devices", "--bogus"],
        ["rping", "-s"],
        ["dma-copy", "--role", "host"],
        ["conformance"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    rc, _, _err = run_once(*args)
    assert rc == 2


@pytest.mark.parametrize("command", ["devices", "demo", "rping -s", "rc-pingpong", "capture", "conformance"])
def test_an_unknown_flag_prints_the_subcommands_usage(command: str) -> None:
    rc, _, err = run_once(*command.split(), "--bogus")
    command = command.split(maxsplit=1)[0]
    assert rc == 2
    assert err.startswith(f"usage: rdmakit {command} ")
    assert err.splitlines()[-1] == f"rdmakit {command}: error: unrecognized arguments: --bogus"


def test_messages_name_no_internals() -> None:
    _, _, err = run_once("rping", "-c", "-a", "127.0.0.2", "-C", "x")
    assert "invalid _count value" not in err
    assert "-C: not an integer: 'x'" in err


def test_a_device_typo_gets_no_pyverbs_advice() -> None:
    _, _, err = run_once("rdma-receive", "-d", "127.0.0.2x", "--timeout", "1")
    assert "no such device: '127.0.0.2x'" in err
    assert "pyverbs" not in err


@pytest.mark.parametrize("command", ["conformance", "conformance-target"])
def test_conformance_has_the_general_flags(command: str) -> None:
    rc, out, _ = run_once(command, "-h")
    assert rc == 0
    for flag in ("-l LEVEL, --log-level LEVEL", "-v, --version", "--json FILE"):
        assert flag in out
    assert "exit status: 0 success" in out
    assert out.split("\n\n")[1].strip()  # a description
    rc, out, _ = run_once(command, "-v")
    assert rc == 0
    assert out.startswith("rdmakit ")


def test_V_is_never_verbose() -> None:
    rc, out, _ = run_once("perftest", "ib_write_bw", "-V")
    assert (rc, out) == (0, "Version: 6.06")
    rc, _, _err = run_once("devices", "-V")
    assert rc == 2
    rc, out, _ = run_once("devices", "--verbose")
    assert rc == 0
    assert "UDP data plane: " in out


def test_dma_copy_host_says_its_d_is_a_path() -> None:
    _, out, _ = run_once("dma-copy-host", "-h")
    assert "-d is this path, not the device" in " ".join(out.split())


def test_gid_count_reads_as_a_count(new_ip: Callable[[], str]) -> None:
    dev = Dev.open(new_ip())
    try:
        r = Rdma()
        r.add_dev(dev)
        r.set_permissions(AccessFlag.LOCAL_READ_WRITE)
        with pytest.raises(DocaError) as e:
            r.set_gid_index(1)
        assert "its GIDs: 1" not in str(e.value)
        assert "it has 1, at index 0 to 0" in str(e.value)
        r.close()
    finally:
        dev.close()


@pytest.mark.parametrize("tool", ["ib_write_bw", "ib_read_lat", "ibv_rc_pingpong"])
def test_tools_run_from_a_directory_holding_a_clone(tool: str, tmp_path: Path) -> None:
    (tmp_path / "rdmakit").mkdir()  # a clone's folder: without -P it would shadow the package
    env = {**os.environ, "PYTHON": sys.executable}
    p = subprocess.run(
        [str(ROOT / "tools" / tool), "-h"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=env, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
