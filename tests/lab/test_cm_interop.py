"""rdmakit's connection manager against the kernel's (``ib_cm``/``rdma_cm`` on rxe) and librdmacm's tools.

The guest runs rdma-core's unmodified ``rdma_server`` and ``rdma_client``
(librdmacm's examples: connect by address, one 16-byte SEND each way,
disconnect) on rxe0; the host runs ``cm_host.py``, rdmakit's ``rdma_cm`` on
its soft device at 10.77.0.1. Each pairing must complete on both sides:
the CM MADs, the QP transitions they drive and the data that crosses the
connection. Connecting to a port where nothing listens must be refused by
the kernel with REJ reason 8 (invalid service ID).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.labvm import GUEST_ADDR, HOST_ADDR, REPO, LabGuest, booted, lab_marks

HOST = Path(__file__).with_name("cm_host.py")
INSTANCE = "cm-" + os.environ.get("PYTEST_XDIST_WORKER", "main")

pytestmark = lab_marks(900)


@pytest.fixture(scope="module")
def guest() -> Iterator[LabGuest]:
    with booted(INSTANCE, tap_queue=4096, rdma_cm=True) as g:
        yield g


def _host(guest: LabGuest, *args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = guest.host_command(sys.executable, str(HOST), HOST_ADDR, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)


def _report(host: subprocess.CompletedProcess[str], c: subprocess.CompletedProcess[str]) -> str:
    return (
        f"--- host (rc {host.returncode})\n{host.stdout}\n{host.stderr[-3000:]}\n"
        f"--- guest (rc {c.returncode})\n{c.stdout}\n{c.stderr}"
    )


def test_connecting_where_nothing_listens_is_rej_8(guest: LabGuest) -> None:
    host = _host(guest, "refused", GUEST_ADDR, "7999")
    assert host.returncode == 0, host.stdout + host.stderr
    assert '"reason": 8' in host.stdout


def test_rdmakit_client_against_rdma_server(guest: LabGuest) -> None:
    job = guest.start("rdma_server", "-p", "7471", timeout=200)
    time.sleep(3)  # rdma_server binds and listens (TCG is slow)
    host = _host(guest, "client", GUEST_ADDR, "7471")
    if host.returncode != 0:
        guest.kill(job)
    c = guest.wait(job, timeout=200)
    assert host.returncode == 0, _report(host, c)
    assert c.returncode == 0, _report(host, c)
    assert "end 0" in c.stdout + c.stderr, _report(host, c)


def _host_server(
    guest: LabGuest, cmd: list[str], *client: str
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """A host-side server (`cmd`), then the guest's `client` against it: both results, the host's first."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    host = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        time.sleep(1.5)
        c = guest.run(*client, timeout=200)
        out, err = host.communicate(timeout=200)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    h = subprocess.CompletedProcess(cmd, host.returncode, out, err)
    assert c.returncode == 0, _report(h, c)
    assert h.returncode == 0, _report(h, c)
    return h, c


def test_rdma_client_against_rdmakit_server(guest: LabGuest) -> None:
    cmd = guest.host_command(sys.executable, str(HOST), HOST_ADDR, "server", "7471")
    h, c = _host_server(guest, cmd, "rdma_client", "-s", HOST_ADDR, "-p", "7471")
    assert "end 0" in c.stdout + c.stderr, _report(h, c)


def _rdmakit(guest: LabGuest, *args: str) -> list[str]:
    return guest.host_command(sys.executable, "-m", "rdmakit", *args)


def _pings(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize("size", ["64", "3000"])
def test_rdmakit_rping_client_against_rping_server(guest: LabGuest, size: str) -> None:
    """rping -s on rxe; rdmakit rping -c -v -V -C 10: the same ten pings on both sides."""
    job = guest.start("rping", "-s", "-a", GUEST_ADDR, "-v", "-S", size, timeout=200)
    time.sleep(3)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = _rdmakit(
        guest, "rping", "-c", "-a", GUEST_ADDR, "-I", HOST_ADDR, "-v", "-V", "-C", "10", "-S", size
    )
    host = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env, check=False)
    if host.returncode != 0:
        guest.kill(job)
    c = guest.wait(job, timeout=200)
    assert host.returncode == 0, _report(host, c)
    assert c.returncode == 0, _report(host, c)
    ours, theirs = _pings(host.stdout, "ping data: "), _pings(c.stdout, "server ping data: ")
    assert len(ours) == 10, _report(host, c)
    assert [line.removeprefix("server ") for line in theirs] == ours, _report(host, c)
    assert ours[0].startswith("ping data: rdma-ping-0: ABCDEFG"), ours


def test_rping_client_against_rdmakit_rping_server(guest: LabGuest) -> None:
    """rdmakit rping -s; rping -c -v -V -C 10 on rxe: it validates every pong."""
    cmd = _rdmakit(guest, "rping", "-s", "-a", HOST_ADDR, "-v")
    h, c = _host_server(guest, cmd, "rping", "-c", "-a", HOST_ADDR, "-v", "-V", "-C", "10")
    theirs, ours = _pings(c.stdout, "ping data: "), _pings(h.stdout, "server ping data: ")
    assert len(theirs) == 10, _report(h, c)
    assert [line.removeprefix("server ") for line in ours] == theirs, _report(h, c)
