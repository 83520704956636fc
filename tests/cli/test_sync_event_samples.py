"""DOCA's sync_event sample pair through the real CLI: a host process and a "DPU" process share one event."""

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.processes import finish

HOST_LINES = [
    "Connecting to DPU",
    "Connection to DPU has been established",
    "Sending exported DOCA Sync Event to DPU",
    "Exported DOCA Sync Event has been sent to DPU successfully",
    "Signaling sync event for DPU",
    "Waiting for sync event to be signaled from DPU",
    "Done",
]
DPU_LINES = [
    "Listening to host",
    "Received blob from host",
    "Waiting for sync event to be signaled from host",
    "Signaling sync event for host",
    "Done",
]


def rdmakit(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rdmakit", *args], cwd=cwd, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.fixture
def service() -> str:
    return f"test-sync-event-{uuid.uuid4().hex[:12]}"


def _dpu(tmp: Path, service: str, *extra: str) -> subprocess.Popen[str]:
    return rdmakit(tmp, "sync-event-dpu", "-d", "03:00.0", "-r", "b1:00.0", "--service", service, *extra)


def _host(tmp: Path, service: str, *extra: str) -> subprocess.Popen[str]:
    return rdmakit(tmp, "sync-event-host", "-d", "b1:00.0", "--service", service, *extra)


@pytest.mark.parametrize(
    "mode", [[], ["--atomic"], ["--async"], ["--async", "--atomic", "--async_num_tasks", "4"]]
)
def test_the_pair_signals_each_other(tmp_path: Path, service: str, mode: list[str]) -> None:
    """The host signals 1 and waits for more than 1; the DPU waits for more than 0 and answers, on one
    counter in two processes: neither finishes unless the other's update reached it."""
    dpu = _dpu(tmp_path, service, "--timeout", "30", *mode)
    host = _host(tmp_path, service, "--timeout", "30", *mode)
    h_rc, h_out, h_err = finish(host)
    d_rc, d_out, d_err = finish(dpu)
    assert (h_rc, h_err) == (0, ""), h_err
    assert (d_rc, d_err) == (0, ""), d_err
    assert h_out.splitlines() == HOST_LINES
    assert d_out.splitlines() == DPU_LINES


_SILENT_DPU = """
import sys
from rdmakit.cli.dma_comch import ComchEndpoint
from rdmakit.doca import Dev, local_devinfo
with Dev.open(local_devinfo("silent0")) as dev, ComchEndpoint.accept(
    dev, sys.argv[1], timeout=30, secret_file=None
) as chan:
    blob, fds = chan.recv_fds(30)
    print("got", len(blob), len(fds), flush=True)
"""


def test_a_dpu_that_never_answers_is_noticed(tmp_path: Path, service: str) -> None:
    """A DPU process that takes the export and leaves without signalling: the host stops with one line,
    not at its timeout."""
    dpu = subprocess.Popen(
        [sys.executable, "-c", _SILENT_DPU, service],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    host = _host(tmp_path, service, "--timeout", "60")
    d = finish(dpu)
    assert d.out.strip() == "got 24 1", d.err
    rc, _, err = finish(host)
    assert rc == 1
    assert err.strip() == "rdmakit sync-event-host: the DPU went away before it signaled the sync event"


def test_no_host_times_out(tmp_path: Path, service: str) -> None:
    rc, _, err = finish(_dpu(tmp_path, service, "--timeout", "0.3"))
    assert rc == 3
    assert "DOCA_ERROR_TIME_OUT" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sync-event-host"], "-d/--pci-addr is required"),
        (["sync-event-dpu", "-d", "03:00.0"], "-r/--rep-pci is required on the DPU"),
        (["sync-event-host", "-d", "3:0.0"], "-d/--pci-addr: '3:0.0' is not a PCI address"),
        (["sync-event-host", "-d", "03:00.0", "--async_num_tasks", "-1"], "Please specify num async tasks"),
        (["sync-event-host", "-d", "03:00.0", "--service", "tcp:127.0.0.1:1"], "--service must be a NAME"),
    ],
)
def test_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    rc, _, err = finish(rdmakit(tmp_path, *args, "--timeout", "1"))
    assert rc in (1, 2)
    assert len(err.strip().splitlines()) == 1
    assert message in err
