"""``rdmakit dma-copy`` between machines: a ``tcp:`` comm channel, DMA jobs as RDMA READ/WRITE.

Two processes on loopback play the two machines: each opens a soft RDMA
device on its own 127.x address (``--device``), the comm channel is TCP, and
the host exports its file with ``export_rdma``.
"""

import hashlib
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.dma_copy_util import MIB, killed_mid_copy, one_line_error, random_file, start
from tests.processes import Done, finish

PORT = 47391  # with an address of its own per test, the port never collides


@pytest.fixture(autouse=True)
def shared_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Both sides (this user, this machine) share a default key made for the test on first use."""
    monkeypatch.delenv("RDMAKIT_COMCH_SECRET", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "rdmakit" / "comch.key"


@pytest.fixture
def addrs(new_ip: Callable[[], str]) -> tuple[str, str, str]:
    """The comm channel service, the host's RDMA device, the DPU's."""
    return f"tcp:{new_ip()}:{PORT}", new_ip(), new_ip()


@pytest.fixture
def sides(tmp_path: Path) -> tuple[Path, Path]:
    host, dpu = tmp_path / "host", tmp_path / "dpu"
    host.mkdir()
    dpu.mkdir()
    return host, dpu


def rdma_args(role: str, file: str, addrs: tuple[str, str, str], *extra: str) -> list[str]:
    service, host_dev, dpu_dev = addrs
    device = host_dev if role == "host" else dpu_dev
    return [
        "dma-copy", "--role", role, "-f", file, "--service", service, "--device", device, "--timeout", "60",
        *extra,
    ]  # fmt: skip


def run_pair(sides: tuple[Path, Path], addrs: tuple[str, str, str], file: str) -> tuple[Done, Done]:
    host_dir, dpu_dir = sides
    dpu = start(dpu_dir, *rdma_args("dpu", file, addrs))
    time.sleep(0.3)  # the host retries until the DPU listens; a head start keeps it short
    host = start(host_dir, *rdma_args("host", file, addrs))
    return finish(host), finish(dpu)


@pytest.mark.parametrize("size", [0, 1, MIB])
@pytest.mark.parametrize("direction", ["host-to-dpu", "dpu-to-host"])
def test_copy_over_rdma(
    sides: tuple[Path, Path], addrs: tuple[str, str, str], direction: str, size: int
) -> None:
    host_dir, dpu_dir = sides
    src_dir, dst_dir = (host_dir, dpu_dir) if direction == "host-to-dpu" else (dpu_dir, host_dir)
    digest = random_file(src_dir / "file.bin", size)
    host, dpu = run_pair(sides, addrs, "file.bin")
    assert (host.rc, dpu.rc) == (0, 0), (host.err, dpu.err)
    assert hashlib.sha256((dst_dir / "file.bin").read_bytes()).hexdigest() == digest
    arrow = "host -> DPU" if direction == "host-to-dpu" else "DPU -> host"
    for side in (host, dpu):
        assert side.out.strip() == f"dma-copy: {size} bytes {arrow}, sha256 {digest}"
        assert side.err == ""
    assert sorted(os.listdir(dst_dir)) == ["file.bin"]


def test_chained_chunks_smaller_than_the_file(sides: tuple[Path, Path], addrs: tuple[str, str, str]) -> None:
    """Many jobs in flight over one connection (more than the WorkQ depth), an odd size."""
    host_dir, dpu_dir = sides
    digest = random_file(host_dir / "odd.bin", 3 * MIB + 12345)
    host_dir_args = rdma_args("host", "odd.bin", addrs)
    dpu = start(dpu_dir, *rdma_args("dpu", "odd.bin", addrs, "--chunk-size", "40000"))
    host = finish(start(host_dir, *host_dir_args))
    done = finish(dpu)
    assert (host.rc, done.rc) == (0, 0), (host.err, done.err)
    assert hashlib.sha256((dpu_dir / "odd.bin").read_bytes()).hexdigest() == digest


def test_transports_must_agree(sides: tuple[Path, Path], addrs: tuple[str, str, str]) -> None:
    host_dir, dpu_dir = sides
    random_file(host_dir / "f.bin", 10)
    dpu = start(dpu_dir, *rdma_args("dpu", "f.bin", addrs))
    host = finish(start(host_dir, *rdma_args("host", "f.bin", addrs, "--transport", "shm")))
    error = one_line_error(host)
    assert "--transport shm shares memory on one machine" in error
    assert "the host failed: --transport shm shares memory" in one_line_error(finish(dpu))
    assert os.listdir(dpu_dir) == []


def test_transports_must_agree_on_one_machine(sides: tuple[Path, Path], addrs: tuple[str, str, str]) -> None:
    """Over a Unix-socket channel either transport works, but both sides must pick the same."""
    host_dir, dpu_dir = sides
    random_file(host_dir / "f.bin", 10)
    name = f"test-dma-rdma-{uuid.uuid4().hex[:12]}"
    dpu = start(dpu_dir, "dma-copy", "--role", "dpu", "-f", "f.bin", "--service", name, "--transport", "shm")
    host = finish(start(
        host_dir, "dma-copy", "--role", "host", "-f", "f.bin", "--service", name, "--transport", "rdma",
        "--device", addrs[1],
    ))  # fmt: skip
    assert "the host copies over rdma, this side over shm" in one_line_error(finish(dpu))
    assert "the DPU failed: the host copies over rdma" in one_line_error(host)
    assert os.listdir(dpu_dir) == []


@pytest.mark.parametrize("victim", ["dpu", "host"])
def test_peer_killed_mid_copy_over_rdma(
    sides: tuple[Path, Path], addrs: tuple[str, str, str], victim: str
) -> None:
    """As over shared memory: the survivor says so in one line and leaves no file."""
    killed_mid_copy(sides, lambda role, file, *extra: rdma_args(role, file, addrs, *extra), victim)
