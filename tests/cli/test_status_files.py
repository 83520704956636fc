"""Status files seen from another machine: nothing there can be checked, so the descriptor is taken.

A folder both machines mount (NFS, a VM's share) shows one machine's status
file to the other; its lock, inode numbers and boot are the writer's
machine's. A reader on the same machine still treats another boot's file as
stale.
"""

import dataclasses
from pathlib import Path

import pytest

from rdmakit.cli.errors import CliError
from rdmakit.cli.status_files import Run, StatusFile, read_status, wait_for_descriptor


def _published(tmp_path: Path, run: Run) -> tuple[Path, StatusFile]:
    path = tmp_path / "peer.desc"
    status = StatusFile(path, run)
    status.published(path, b"descriptor", "the descriptor")
    return path, status


def test_another_machines_status_file_is_not_judged(tmp_path: Path) -> None:
    me = Run()
    path, status = _published(tmp_path, dataclasses.replace(Run(), host="elsewhere/0123", boot="other-boot"))
    try:
        assert read_status(path).host == "elsewhere/0123"
        pf, seen = wait_for_descriptor(path, 1.0, "the descriptor", me=me)
        assert pf.data == b"descriptor"
        assert seen.state == "absent"  # nothing to watch: its lock is not this machine's
    finally:
        status.close()


def test_this_machines_other_boot_is_stale(tmp_path: Path) -> None:
    me = Run()
    path, status = _published(tmp_path, dataclasses.replace(Run(), boot="an-earlier-boot"))
    try:
        with pytest.raises(CliError, match="before the last reboot"):
            wait_for_descriptor(path, 0.3, "the descriptor", me=me)
    finally:
        status.close()


def test_this_run_is_fresh(tmp_path: Path) -> None:
    me = Run()
    path, status = _published(tmp_path, me)
    try:
        pf, seen = wait_for_descriptor(path, 1.0, "the descriptor", me=me)
        assert pf.data == b"descriptor"
        assert seen.state == "running"
    finally:
        status.close()
