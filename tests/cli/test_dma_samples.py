"""The DOCA DMA samples through the real CLI: local copy, and the host/DPU pair."""

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.processes import finish


def rdmakit(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rdmakit", *args], cwd=cwd, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.fixture
def service() -> str:
    return f"test-dma-sample-{uuid.uuid4().hex[:12]}"


# -- DMA Local Copy -------------------------------------------------------------------------------


def test_local_copy_default_text(tmp_path: Path) -> None:
    rc, out, err = finish(rdmakit(tmp_path, "dma-local-copy", "-p", "03:00.0"))
    assert (rc, err) == (0, "")
    assert out == "Memory content: This is a sample piece of text\n"


@pytest.mark.parametrize("api", ["job", "task"])
@pytest.mark.parametrize(("src", "dst"), [(1, 1), (3, 5), (16, 2)])
def test_local_copy_through_buffer_lists(tmp_path: Path, src: int, dst: int, api: str) -> None:
    """The source split into `src` chained bufs is gathered, the destination list of `dst` filled in order.

    With ``--api task`` the copy is a ``doca_dma_task_memcpy`` on a progress engine, as DOCA 2.9's
    ``dma_local_copy`` sample runs it; the output is the job API's, byte for byte."""
    text = "gathered from one list and scattered over another"
    rc, out, err = finish(
        rdmakit(
            tmp_path, "dma-local-copy", "-t", text, "--num-src-buf", str(src), "--num-dst-buf", str(dst),
            "--api", api,
        )
    )  # fmt: skip
    assert (rc, err) == (0, "")
    assert out == f"Memory content: {text}\n"


def test_local_copy_task_api_refuses_what_the_job_api_refuses(tmp_path: Path) -> None:
    rc, _, err = finish(rdmakit(tmp_path, "dma-local-copy", "--num-src-buf", "17", "--api", "task"))
    assert rc == 1
    assert err == "rdmakit dma-local-copy: 17 bufs in a list: local0 takes at most 16\n"


def test_local_copy_list_longer_than_the_device_takes(tmp_path: Path) -> None:
    rc, _, err = finish(rdmakit(tmp_path, "dma-local-copy", "--num-src-buf", "17"))
    assert rc == 1
    assert err == "rdmakit dma-local-copy: 17 bufs in a list: local0 takes at most 16\n"


# -- DMA Copy Host / DPU ---------------------------------------------------------------------------


def sample_args(tmp_path: Path, service: str) -> list[str]:
    return [
        "-d", str(tmp_path / "export_desc.txt"), "-b", str(tmp_path / "buffer_info.txt"),
        "--service", service, "--timeout", "60",
    ]  # fmt: skip


@pytest.mark.parametrize(("dpu_first", "api"), [(False, "job"), (True, "job"), (False, "task")])
def test_host_and_dpu_samples(tmp_path: Path, service: str, dpu_first: bool, api: str) -> None:
    """The host exports its text; the DPU copies it through the two files; the host exits by itself.

    With ``--api task`` the DPU copies with a ``doca_dma_task_memcpy`` on a progress engine, as
    DOCA 2.9's ``dma_copy_dpu_sample.c`` does.
    """
    text = "This text crossed from host to DPU"
    files = sample_args(tmp_path, service)
    host_cmd = ("dma-copy-host", "-p", "b1:00.0", "-t", text, *files)
    dpu_cmd = (
        "dma-copy-dpu",
        "-p",
        "03:00.0",
        "--num-src-buf",
        "2",
        "--num-dst-buf",
        "3",
        "--api",
        api,
        *files,
    )
    first, second = (dpu_cmd, host_cmd) if dpu_first else (host_cmd, dpu_cmd)
    procs = [rdmakit(tmp_path, *first)]
    time.sleep(0.3)
    procs.append(rdmakit(tmp_path, *second))
    results = dict(zip((first[0], second[0]), (finish(p) for p in procs), strict=True))
    host_rc, host_out, host_err = results["dma-copy-host"]
    dpu_rc, dpu_out, dpu_err = results["dma-copy-dpu"]
    assert (host_rc, host_err) == (0, ""), (host_err, dpu_err)
    assert (dpu_rc, dpu_err) == (0, "")
    assert dpu_out == f"Memory content: {text}\n"
    assert host_out.endswith("DPU copy done; exiting\n")
    # The files described memory that no longer exists: the host removed them.
    assert not (tmp_path / "export_desc.txt").exists()
    assert not (tmp_path / "buffer_info.txt").exists()


def test_descriptor_files_follow_the_samples_format(tmp_path: Path, service: str) -> None:
    """export_desc.txt holds the descriptor, buffer_info.txt the address and length, one per line."""
    host = rdmakit(tmp_path, "dma-copy-host", "-t", "abc", *sample_args(tmp_path, service))
    assert host.stdout is not None
    line = host.stdout.readline()  # printed once both files are written
    assert line.startswith("Exported 4 bytes at 0x")
    descriptor = json.loads((tmp_path / "export_desc.txt").read_text())
    addr, length = (tmp_path / "buffer_info.txt").read_text().split()
    assert descriptor["format"] == "rdmakit.mmap-dpu/2"
    assert (int(addr), int(length)) == (descriptor["addr"], 4)
    assert descriptor["access"] == ["LOCAL_READ_WRITE", "PCI_READ_ONLY"]
    dpu = rdmakit(tmp_path, "dma-copy-dpu", *sample_args(tmp_path, service))
    assert finish(dpu)[1] == "Memory content: abc\n"
    assert finish(host)[0] == 0


def test_dpu_sample_without_host_times_out(tmp_path: Path, service: str) -> None:
    args = [*sample_args(tmp_path, service)[:-1], "0.3"]
    rc, _, err = finish(rdmakit(tmp_path, "dma-copy-dpu", *args))
    assert rc == 3
    assert err.startswith("rdmakit dma-copy-dpu: timed out after 0.3 s waiting for the export descriptor")
    assert err.count("\n") == 1


def test_dpu_sample_with_a_dead_hosts_files(tmp_path: Path, service: str) -> None:
    """Descriptor files left by a host that was killed name memory that is gone: one line, NOT_FOUND.

    The pages would come from the host sample itself, over the comm channel, and it does not answer.
    """
    host = rdmakit(tmp_path, "dma-copy-host", *sample_args(tmp_path, service))
    assert host.stdout is not None
    host.stdout.readline()
    host.kill()
    host.communicate()
    assert (tmp_path / "export_desc.txt").exists()  # killed outright: nobody removed them
    rc, _, err = finish(rdmakit(tmp_path, "dma-copy-dpu", *sample_args(tmp_path, service)))
    assert rc == 1
    assert err.startswith(
        "rdmakit dma-copy-dpu: DOCA_ERROR_NOT_FOUND: the exported memory is gone: the host sample that wrote"
    )
    assert err.count("\n") == 1


def test_dpu_sample_failure_reaches_the_host(tmp_path: Path, service: str) -> None:
    """A DPU sample that fails still tells the waiting host, which exits with the reason."""
    host = rdmakit(tmp_path, "dma-copy-host", *sample_args(tmp_path, service))
    assert host.stdout is not None
    host.stdout.readline()
    (tmp_path / "buffer_info.txt").write_text("not numbers\n")
    rc, _, err = finish(rdmakit(tmp_path, "dma-copy-dpu", *sample_args(tmp_path, service)))
    assert rc == 1
    assert "expected the buffer address and length" in err
    host_rc, _, host_err = finish(host)
    assert host_rc == 1
    assert host_err.startswith("rdmakit dma-copy-host: the DPU sample failed: ")


def test_samples_refuse_a_tcp_service(tmp_path: Path) -> None:
    """Shared memory crosses only as a descriptor over a Unix socket: a tcp: service cannot carry it."""
    for program in ("dma-copy-host", "dma-copy-dpu"):
        rc, _, err = finish(rdmakit(tmp_path, program, *sample_args(tmp_path, "tcp:127.0.0.1:9")))
        assert rc == 1
        assert err.startswith(f"rdmakit {program}: the DMA Copy samples share memory on one machine")
        assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGHUP])
def test_host_sample_removes_its_files_on_a_signal(tmp_path: Path, service: str, signo: int) -> None:
    """Closing the terminal or a SIGTERM leaves no export descriptor for the next DPU sample to find."""
    host = rdmakit(tmp_path, "dma-copy-host", *sample_args(tmp_path, service))
    desc, info = tmp_path / "export_desc.txt", tmp_path / "buffer_info.txt"
    for _ in range(600):
        if desc.exists() and info.exists():
            break
        time.sleep(0.05)
    assert desc.exists(), "the host sample did not publish its descriptor"
    assert info.exists(), "the host sample did not publish its buffer information"
    host.send_signal(signo)
    status, _, err = finish(host)
    assert status == 128 + signo, err
    assert not desc.exists()
    assert not info.exists()
