"""A lab guest for the tests that need one (scripts/lab-run.sh start / exec / stop).

Each module boots its own instance (own namespaces, own run folder), so modules
and xdist workers never share a guest. Skip reasons are those of docs/lab.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
LAB_DIR = Path(os.environ.get("RDMAKIT_LAB_DIR", REPO / "build" / "lab"))
IMAGE_FILES = ("rootfs.ext4", "vmlinuz", "initrd.img")
HOST_ADDR = "10.77.0.1"
GUEST_ADDR = "10.77.0.2"
#: Where the guest sees the run folder's share/ (docs/lab.md).
GUEST_SHARE = Path("/mnt/labrun")
BUILD_TIMEOUT_S = 900
BOOT_TIMEOUT_S = 420


def skip_reason() -> str | None:
    """Why the lab cannot run here, or None."""
    want = os.environ.get("RDMAKIT_LAB", "")
    if want == "0":
        return "RDMAKIT_LAB=0"
    if not sys.platform.startswith("linux"):
        return "the lab needs Linux"
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, tap device)"
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 missing: run scripts/install-lab-deps.sh"
    if not Path("/dev/net/tun").exists():
        return "/dev/net/tun missing"
    missing = [f for f in IMAGE_FILES if not (LAB_DIR / f).is_file()]
    if missing and want != "1":
        return (
            f"lab image not built ({LAB_DIR}: no {', '.join(missing)}): run scripts/lab-build-vm.sh, "
            "or set RDMAKIT_LAB=1 to build it from the test run"
        )
    if missing and shutil.which("mmdebstrap") is None:
        return "mmdebstrap missing (needed to build the lab image): run scripts/install-lab-deps.sh"
    return None


@dataclass(frozen=True, slots=True)
class LabGuest:
    """A running guest of instance `instance`."""

    instance: str

    @property
    def host_netns(self) -> str:
        return f"rdmakit-host-{self.instance}"

    @property
    def lab_netns(self) -> str:
        return f"rdmakit-lab-{self.instance}"

    @property
    def share(self) -> Path:
        """The host side of the guest's writable ``/mnt/labrun``."""
        return LAB_DIR / "run" / self.instance / "share"

    def _lab(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, RDMAKIT_LAB_INSTANCE=self.instance)
        return subprocess.run(
            [str(SCRIPTS / "lab-run.sh"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )

    @classmethod
    def boot(cls, instance: str) -> LabGuest:
        if os.environ.get("RDMAKIT_LAB") == "1":
            build = subprocess.run(
                [str(SCRIPTS / "lab-build-vm.sh")],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
            assert build.returncode == 0, f"lab-build-vm.sh failed:\n{build.stderr[-4000:]}"
        guest = cls(instance)
        started = guest._lab("start", timeout=BOOT_TIMEOUT_S)
        if started.returncode != 0:
            guest.stop()
            raise AssertionError(f"lab-run.sh start failed:\n{started.stderr[-4000:]}")
        return guest

    def ready(self) -> dict[str, str]:
        """The guest's report: KERNEL, NIC, RXE, GID_INDEX, GID, ..."""
        text = (self.share / "ready").read_text()
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def run(self, *cmd: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
        """CMD in the guest (cwd: the checkout); its status and output."""
        return self._lab("exec", "-q", "--timeout", str(timeout), "--", *cmd, timeout=timeout + 60)

    def start(self, *cmd: str, timeout: int = 300) -> int:
        """CMD in the guest in the background; its job ID."""
        res = self._lab("exec", "-q", "--bg", "--timeout", str(timeout), "--", *cmd, timeout=60)
        assert res.returncode == 0, res.stderr
        return int(res.stdout.strip())

    def wait(self, job: int, timeout: int = 300) -> subprocess.CompletedProcess[str]:
        """A background job's status and whole output."""
        return self._lab("wait", "-q", "--timeout", str(timeout), str(job), timeout=timeout + 60)

    def kill(self, job: int) -> None:
        self._lab("kill", str(job), timeout=60)

    def stop(self) -> None:
        self._lab("stop", timeout=120)

    def host_command(self, *cmd: str) -> list[str]:
        """CMD as run on the host side of the lab network (10.77.0.1)."""
        return ["ip", "netns", "exec", self.host_netns, *cmd]

    def tap_stats(self) -> dict[str, int]:
        """The guest NIC's tap device counters, seen from the lab namespace."""
        base = Path("/sys/class/net/lab0tap/statistics")
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.lab_netns,
                "sh",
                "-c",
                f"cd {base} && grep -H . tx_packets tx_dropped",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        return {k: int(v) for k, v in (line.split(":", 1) for line in out.split())}

    def set_tap_queue(self, packets: int) -> None:
        """Lengthen the tap's transmit queue (tun's ring and the qdisc; default 1000).

        Under TCG the guest drains its NIC far slower than the host side sends:
        a burst longer than the queue (the 4096 responses of a 4 MiB READ) is
        dropped at the tap, which RC then has to recover from.
        """
        subprocess.run(
            ["ip", "-n", self.lab_netns, "link", "set", "lab0tap", "txqueuelen", str(packets)],
            check=True,
            timeout=30,
        )


def lab_marks(timeout: int) -> list[pytest.MarkDecorator]:
    """A lab module's ``pytestmark``: the lab marker, its timeout, and the skip where the lab cannot run."""
    marks = [pytest.mark.lab, pytest.mark.timeout(timeout)]
    reason = skip_reason()
    if reason is not None:
        marks.append(pytest.mark.skip(reason=reason))
    return marks


@contextmanager
def booted(instance: str, tap_queue: int | None = None, *, rdma_cm: bool = False) -> Iterator[LabGuest]:
    """A guest of `instance` for the duration (a module fixture's body), stopped however it ends.

    `rdma_cm`: load the kernel's RDMA CM first. The kernel answers CM MADs on QP1 only once
    ``rdma_cm`` is loaded (librdmacm's first user loads it; a distribution's rdma-load-modules
    does at boot).
    """
    g = LabGuest.boot(instance)
    try:
        if tap_queue is not None:
            g.set_tap_queue(tap_queue)
        if rdma_cm:
            loaded = g.run("modprobe", "rdma_ucm", timeout=120)
            assert loaded.returncode == 0, loaded.stdout + loaded.stderr
        yield g
    finally:
        g.stop()
