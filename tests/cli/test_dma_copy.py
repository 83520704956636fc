"""``rdmakit dma-copy``, the DOCA DMA Copy application, through the real CLI (two processes).

The host and the DPU each run in their own directory, as on two machines; they
meet on a comm channel service name unique to the test.
"""

import hashlib
import json
import os
import pty
import signal
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from rdmakit.cli.lifecycle import Unwind
from rdmakit.doca import DocaError, DocaErrorCode, SharedMemory
from tests.cli.dma_copy_util import MIB, killed_mid_copy, one_line_error, random_file, start, wait_for_line
from tests.processes import Done, finish


@pytest.fixture
def sides(tmp_path: Path) -> tuple[Path, Path]:
    host, dpu = tmp_path / "host", tmp_path / "dpu"
    host.mkdir()
    dpu.mkdir()
    return host, dpu


@pytest.fixture
def service() -> str:
    return f"test-dma-copy-{uuid.uuid4().hex[:12]}"


def copy_args(role: str, file: str, service: str, *extra: str) -> list[str]:
    pci = ["-p", "03:00.0"] if role == "host" else ["-p", "03:00.0", "-r", "b1:00.0"]
    return ["dma-copy", "--role", role, "-f", file, *pci, "--service", service, "--timeout", "60", *extra]


def run_pair(
    sides: tuple[Path, Path], service: str, file: str, *, dpu_first: bool = True, extra: Sequence[str] = ()
) -> tuple[Done, Done]:
    host_dir, dpu_dir = sides
    procs = {}
    for role in ("dpu", "host") if dpu_first else ("host", "dpu"):
        cwd = dpu_dir if role == "dpu" else host_dir
        procs[role] = start(cwd, *copy_args(role, file, service, *extra))
        time.sleep(0.3)  # a head start for the first one (the order must not matter either way)
    return finish(procs["host"]), finish(procs["dpu"])


# -- copies --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, MIB])
@pytest.mark.parametrize("direction", ["host-to-dpu", "dpu-to-host"])
def test_copy(sides: tuple[Path, Path], service: str, direction: str, size: int) -> None:
    host_dir, dpu_dir = sides
    src_dir, dst_dir = (host_dir, dpu_dir) if direction == "host-to-dpu" else (dpu_dir, host_dir)
    digest = random_file(src_dir / "file.bin", size)
    host, dpu = run_pair(sides, service, "file.bin", dpu_first=direction == "host-to-dpu")
    assert (host.rc, dpu.rc) == (0, 0), (host.err, dpu.err)
    assert (dst_dir / "file.bin").read_bytes() == (src_dir / "file.bin").read_bytes()
    assert hashlib.sha256((dst_dir / "file.bin").read_bytes()).hexdigest() == digest
    arrow = "host -> DPU" if direction == "host-to-dpu" else "DPU -> host"
    for side in (host, dpu):
        assert side.out.strip() == f"dma-copy: {size} bytes {arrow}, sha256 {digest}"
        assert side.err == ""
    assert sorted(os.listdir(dst_dir)) == ["file.bin"]  # nothing else left behind


def test_copy_100_mib(sides: tuple[Path, Path], service: str) -> None:
    """A file a hundred times the guide's 1 MB hardware limit, in 1 MiB DMA jobs."""
    host_dir, dpu_dir = sides
    digest = random_file(dpu_dir / "big.bin", 100 * MIB)
    host, dpu = run_pair(sides, service, "big.bin", dpu_first=False)
    assert (host.rc, dpu.rc) == (0, 0), (host.err, dpu.err)
    assert hashlib.sha256((host_dir / "big.bin").read_bytes()).hexdigest() == digest
    assert f"{100 * MIB} bytes DPU -> host" in host.out


def test_chunks_smaller_than_the_file_and_json_options(sides: tuple[Path, Path], service: str) -> None:
    """--json FILE holds the application's options (file, pci-addr, rep-pci, log-level) by long name."""
    host_dir, dpu_dir = sides
    digest = random_file(host_dir / "data.bin", 3 * MIB + 17)
    config = dpu_dir / "dma_copy_params.json"
    config.write_text(
        json.dumps({"file": "data.bin", "pci-addr": "03:00.0", "rep-pci": "b1:00.0", "log-level": 40})
    )
    dpu = start(
        dpu_dir,
        "dma-copy",
        "--role",
        "dpu",
        "--json",
        str(config),
        "--service",
        service,
        "--chunk-size",
        "65536",
    )
    host = start(host_dir, *copy_args("host", "data.bin", service))
    host_done, dpu_done = finish(host), finish(dpu)
    assert (host_done.rc, dpu_done.rc) == (0, 0), (host_done.err, dpu_done.err)
    assert hashlib.sha256((dpu_dir / "data.bin").read_bytes()).hexdigest() == digest


# -- errors: one line each, no partial file ------------------------------------------------------------


def test_file_on_neither_side(sides: tuple[Path, Path], service: str) -> None:
    host, dpu = run_pair(sides, service, "missing.bin")
    assert one_line_error(dpu) == "rdmakit dma-copy: missing.bin exists on neither the host nor the DPU"
    assert one_line_error(host) == (
        "rdmakit dma-copy: the DPU failed: missing.bin exists on neither the host nor the DPU"
    )
    assert os.listdir(sides[0]) == os.listdir(sides[1]) == []


def test_file_on_both_sides(sides: tuple[Path, Path], service: str) -> None:
    for side in sides:
        random_file(side / "f.bin", 10)
    host, dpu = run_pair(sides, service, "f.bin")
    assert "exists on both the host and the DPU" in one_line_error(dpu)
    assert "exists on both the host and the DPU" in one_line_error(host)


def test_destination_not_writable(sides: tuple[Path, Path], service: str) -> None:
    host_dir, dpu_dir = sides
    (host_dir / "no-such-dir").mkdir()
    random_file(host_dir / "no-such-dir" / "f.bin", 10)
    host, dpu = run_pair(sides, service, "no-such-dir/f.bin")  # the DPU has no such directory
    assert (
        one_line_error(dpu) == "rdmakit dma-copy: cannot write no-such-dir/f.bin: No such file or directory"
    )
    assert one_line_error(host) == (
        "rdmakit dma-copy: the DPU failed: cannot write no-such-dir/f.bin: No such file or directory"
    )
    assert os.listdir(dpu_dir) == []


@pytest.mark.parametrize("failing", ["host", "dpu"])
def test_a_side_with_a_bad_file_tells_the_waiting_peer(
    sides: tuple[Path, Path], service: str, failing: str
) -> None:
    """-f a directory: that side fails before it connects or listens, and the peer, already
    waiting, hears why at once instead of waiting out its timeout."""
    host_dir, dpu_dir = sides
    bad_dir, peer_dir = (host_dir, dpu_dir) if failing == "host" else (dpu_dir, host_dir)
    (bad_dir / "adir").mkdir()
    peer_role = "dpu" if failing == "host" else "host"
    peer = start(peer_dir, *copy_args(peer_role, "adir", service)[:-2], "--timeout", "100")
    time.sleep(0.5)  # the peer is waiting (the DPU listens, the host retries)
    bad = finish(start(bad_dir, *copy_args(failing, "adir", service)))
    assert one_line_error(bad) == "rdmakit dma-copy: adir is a directory"
    name = "host" if failing == "host" else "DPU"
    assert one_line_error(finish(peer)) == f"rdmakit dma-copy: the {name} failed: adir is a directory"
    assert os.listdir(peer_dir) == []


@pytest.mark.parametrize(
    ("name", "want"), [("link.bin", "is a symbolic link"), ("/proc/self/status", "is on procfs")]
)
def test_a_source_through_a_link_or_on_procfs_is_refused(
    sides: tuple[Path, Path], service: str, name: str, want: str
) -> None:
    """In a folder another user may write, a link there would choose what this side sends."""
    (sides[1] / "real.bin").write_bytes(b"x" * 100)
    (sides[1] / "link.bin").symlink_to(sides[1] / "real.bin")
    done = finish(start(sides[1], *copy_args("dpu", name, service)[:-2], "--timeout", "1"))
    assert one_line_error(done).startswith(f"rdmakit dma-copy: the file to copy {name} {want}")
    assert finish(start(sides[1], *copy_args("dpu", "real.bin", service)[:-2], "--timeout", "1")).rc == 3


def test_an_unwritable_destination_fails_before_connecting(sides: tuple[Path, Path], service: str) -> None:
    done = finish(start(sides[0], *copy_args("host", "no-such-dir/f.bin", service)[:-2], "--timeout", "1"))
    assert (
        one_line_error(done) == "rdmakit dma-copy: cannot write no-such-dir/f.bin: No such file or directory"
    )


def test_one_directory_for_both_sides(tmp_path: Path, service: str) -> None:
    """On one machine in one directory the sides need files of their own; the same one is named as such."""
    digest = random_file(tmp_path / "data.bin", 1000)
    dpu = start(tmp_path, *copy_args("dpu", "data.bin", service))
    host = finish(start(tmp_path, *copy_args("host", "data.bin", service)))
    error = one_line_error(finish(dpu))
    assert "the host's file and the DPU's data.bin are the same file" in error
    assert "the DPU failed: the host's file and the DPU's data.bin are the same file" in one_line_error(host)
    dpu = start(tmp_path, *copy_args("dpu", "copy.bin", service))  # as docs/dma.md and --help say
    host = finish(start(tmp_path, *copy_args("host", "data.bin", service)))
    assert (host.rc, finish(dpu).rc) == (0, 0), host.err
    assert hashlib.sha256((tmp_path / "copy.bin").read_bytes()).hexdigest() == digest


def test_ctrl_c_on_the_dpu_side_is_an_interrupt(sides: tuple[Path, Path], service: str) -> None:
    """Clean-up after Ctrl-C (memory still mapped by a frame of the traceback) never hides the interrupt."""
    host_dir, dpu_dir = sides
    random_file(dpu_dir / "f.bin", 8 * MIB)
    slow = ("--chunk-size", "65536", "--pause", "0.01")
    dpu = start(dpu_dir, *copy_args("dpu", "f.bin", service, "-l", "60", *slow))
    host = start(host_dir, *copy_args("host", "f.bin", service))
    wait_for_line(dpu, "copy: ")
    dpu.send_signal(signal.SIGINT)
    done = finish(dpu)
    assert done.rc == 130
    assert done.err.strip().splitlines()[-1] == "rdmakit: interrupted"
    assert "DOCA_ERROR" not in done.err
    assert "went away" in one_line_error(finish(host))
    assert os.listdir(host_dir) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--role", "host"], "-f/--file is required"),
        (["-f", "x"], "--role host|dpu is required"),
        (["--role", "host", "-f", "x", "-p", "3:0.0"], "-p/--pci-addr: '3:0.0' is not a PCI address"),
        (["--role", "dpu", "-f", "x", "-r", "zz:00.0"], "-r/--rep-pci: 'zz:00.0' is not a PCI address"),
        (["--role", "host", "-f", "x", "--service", "bad name"], "DOCA_ERROR_INVALID_VALUE"),
    ],
)
def test_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    done = finish(start(tmp_path, "dma-copy", "--timeout", "1", *args))
    assert message in one_line_error(done)


def test_no_peer_times_out(tmp_path: Path, service: str) -> None:
    random_file(tmp_path / "f.bin", 10)
    done = finish(
        start(tmp_path, "dma-copy", "--role", "host", "-f", "f.bin", "--service", service, "--timeout", "0.3")
    )
    assert done.rc == 3
    assert "DOCA_ERROR_TIME_OUT" in one_line_error(done)


@pytest.mark.parametrize("victim", ["dpu", "host"])
def test_peer_killed_mid_copy(sides: tuple[Path, Path], service: str, victim: str) -> None:
    killed_mid_copy(sides, lambda role, file, *extra: copy_args(role, file, service, *extra), victim)


# -- the progress bar ----------------------------------------------------------------------------------


def test_progress_bar_on_a_tty(sides: tuple[Path, Path], service: str) -> None:
    host_dir, dpu_dir = sides
    random_file(host_dir / "f.bin", 16 * MIB)
    master, slave = pty.openpty()
    try:
        dpu = start(dpu_dir, *copy_args("dpu", "f.bin", service), stderr=slave)
        os.close(slave)
        slave = -1
        host = start(host_dir, *copy_args("host", "f.bin", service))
        shown = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the DPU closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        assert finish(dpu).rc == 0
        assert finish(host).rc == 0
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    text = shown.decode()
    assert "\rcopying [" in text
    assert "100% 16.0/16.0 MiB" in text
    assert "\rverifying [" in text


def _hold_a_view_and_raise(exc: BaseException | None) -> None:
    with Unwind() as stack:
        memory = stack.enter_context(SharedMemory(4096))
        view = memory.buf[:10]  # held by this frame, as a traceback holds it after Ctrl-C
        assert len(view) == 10
        if exc is not None:
            raise exc


def test_clean_up_errors_never_hide_an_interrupt() -> None:
    with pytest.raises(KeyboardInterrupt):
        _hold_a_view_and_raise(KeyboardInterrupt())
    with pytest.raises(DocaError) as exc:  # without a cause, the clean-up error is the error
        _hold_a_view_and_raise(None)
    assert exc.value.code is DocaErrorCode.IN_USE
