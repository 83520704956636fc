"""The verbs backend's connection manager (librdmacm on the guest's rxe0) in the lab.

The guest loads ``rdma_ucm``; ``tests/lab/test_verbs_cm.py`` runs there
(rdmakit's user-managed-QP flow against itself and against librdmacm's
``rdma_server``/``rdma_client``). Then the DOCA RDMA samples connect by
address (``-cm``) between the guest's verbs backend and the host's soft
engine (10.77.0.1), in both roles: the guest listens and the host connects,
then the other way round; the sent string must arrive.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from tests.lab.labvm import GUEST_ADDR, GUEST_SHARE, HOST_ADDR, REPO, LabGuest, booted, lab_marks

INSTANCE = "verbs-cm-" + os.environ.get("PYTEST_XDIST_WORKER", "main")
#: The guest's Python with the image's precompiled bytecode (see test_interop.py).
GUEST_PYTHON = ("env", "-u", "PYTHONPYCACHEPREFIX", "python3")
TIMEOUT = 300

pytestmark = lab_marks(1800)


@pytest.fixture(scope="module")
def guest() -> Iterator[LabGuest]:
    with booted(INSTANCE, tap_queue=4096, rdma_cm=True) as g:
        yield g


def test_verbs_cm_on_rxe(guest: LabGuest) -> None:
    """tests/lab/test_verbs_cm.py in the guest: every case runs and passes."""
    res = guest.run(
        *GUEST_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
        "-p", "no:trio", "-W", "ignore::pytest.PytestConfigWarning", "tests/lab/test_verbs_cm.py",
        timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    summary = res.stdout.strip().splitlines()[-1]
    assert " passed" in summary, res.stdout[-2000:]
    assert "skipped" not in summary, res.stdout[-2000:]


def _host(guest: LabGuest, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = guest.host_command(sys.executable, "-m", "rdmakit", *args)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(p: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=TIMEOUT + 60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return p.returncode, out.strip(), err


def _both_ok(guest: LabGuest, host: subprocess.Popen[str], job: int) -> tuple[str, str, str]:
    """Both sides' output once each exited 0 (the host's, the guest's, and a report of both)."""
    rc, out, err = _finish(host)
    if rc != 0:
        guest.kill(job)
    g = guest.wait(job, timeout=TIMEOUT + 60)
    report = (
        f"--- host (rc {rc})\n{out}\n{err[-3000:]}\n"
        f"--- guest (rc {g.returncode})\n{g.stdout}\n{g.stderr[-3000:]}"
    )
    assert (rc, g.returncode) == (0, 0), report
    return out, g.stdout.strip(), report


@pytest.mark.parametrize("api", ["job", "task"])
@pytest.mark.parametrize("guest_listens", [True, False], ids=["guest-listens", "host-listens"])
def test_doca_send_pair_connects_by_address(guest: LabGuest, api: str, guest_listens: bool) -> None:
    """rdma-receive listens (-cm), rdma-send connects (-sa) and sends; verbs rxe0 ↔ the soft engine.

    With ``-cm`` the send pair exchanges no descriptor file: everything goes
    through the two connection managers and the connection they set up.
    """
    tag = f"{api}-{'g' if guest_listens else 'h'}"
    port = str(7480 + (2 if guest_listens else 0) + (api == "task"))
    text = f"by address, {tag}"
    common = ["-cm", "--port", port, "--api", api, "--timeout", str(TIMEOUT)]
    g_files = ["-ld", str(GUEST_SHARE / f"{tag}-g.json"), "-re", str(GUEST_SHARE / f"{tag}-h.json")]
    h_files = ["-ld", str(guest.share / f"{tag}-h.json"), "-re", str(guest.share / f"{tag}-g.json")]
    guest_rdmakit = (*GUEST_PYTHON, "-m", "rdmakit")
    if guest_listens:
        job = guest.start(*guest_rdmakit, "rdma-receive", "-d", "rxe0", *g_files, *common, timeout=TIMEOUT)
        time.sleep(3)  # a sender that comes too early is refused (REJ 8) and tries again
        host = _host(guest, "rdma-send", "-d", HOST_ADDR, "-sa", GUEST_ADDR, "-sat", "ipv4", "-s", text,
                     *h_files, *common)  # fmt: skip
    else:
        host = _host(guest, "rdma-receive", "-d", HOST_ADDR, *h_files, *common)
        time.sleep(2)
        job = guest.start(*guest_rdmakit, "rdma-send", "-d", "rxe0", "-sa", HOST_ADDR, "-sat", "ipv4",
                          "-s", text, *g_files, *common, timeout=TIMEOUT)  # fmt: skip
    out, guest_out, report = _both_ok(guest, host, job)
    receiver, sender = (guest_out, out) if guest_listens else (out, guest_out)
    assert receiver.splitlines()[-1] == f"Received: {text}", report
    assert sender.splitlines()[-1] == f"Sent: {text}", report


@pytest.mark.parametrize("guest_listens", [True, False], ids=["guest-listens", "host-listens"])
def test_doca_write_pair_connects_by_address(guest: LabGuest, guest_listens: bool) -> None:
    """rdma-write-responder listens (-cm), rdma-write-requester connects (-sa) and WRITEs.

    The memory descriptor still goes by file, through the share both machines
    mount: each side's status file there is the other machine's, which a
    reader cannot check (its lock, inodes and boot are not the reader's), so
    the descriptor is taken as it is.
    """
    tag = f"write-{'g' if guest_listens else 'h'}"
    port = str(7490 + guest_listens)
    text = f"written by address, {tag}"
    common = ["-cm", "--port", port, "--timeout", str(TIMEOUT)]

    def files(share: Path | PurePosixPath, me: str, peer: str) -> list[str]:
        return ["-ld", str(share / f"{tag}-{me}.json"), "-re", str(share / f"{tag}-{peer}.json"),
                "-m", str(share / f"{tag}-mmap.json")]  # fmt: skip

    guest_rdmakit = (*GUEST_PYTHON, "-m", "rdmakit")
    if guest_listens:
        job = guest.start(*guest_rdmakit, "rdma-write-responder", "-d", "rxe0",
                          *files(GUEST_SHARE, "g", "h"), *common, timeout=TIMEOUT)  # fmt: skip
        time.sleep(3)
        host = _host(guest, "rdma-write-requester", "-d", HOST_ADDR, "-sa", GUEST_ADDR, "-sat", "ipv4",
                     "-w", text, *files(guest.share, "h", "g"), *common)  # fmt: skip
    else:
        host = _host(guest, "rdma-write-responder", "-d", HOST_ADDR, *files(guest.share, "h", "g"), *common)
        time.sleep(2)
        job = guest.start(*guest_rdmakit, "rdma-write-requester", "-d", "rxe0", "-sa", HOST_ADDR,
                          "-sat", "ipv4", "-w", text, *files(GUEST_SHARE, "g", "h"), *common,
                          timeout=TIMEOUT)  # fmt: skip
    out, guest_out, report = _both_ok(guest, host, job)
    responder, requester = (guest_out, out) if guest_listens else (out, guest_out)
    assert responder.splitlines()[-1] == f"Remote write: {text}", report
    assert requester.splitlines()[-1] == f"Written to the responder: {text}", report
