"""Without pyverbs or a device, verbs devices are absent from discovery, with the reason at debug level."""

import ctypes
import importlib.util
import logging
import subprocess
import sys
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

import pytest

from rdmakit.doca import DevInfo, DocaError, DocaErrorCode, Fault, devinfo_list, verbs_glue
from rdmakit.verbs import VerbsCaps, VerbsDeviceInfo, VerbsError, buffer_address, discovery, list_devices
from tests.verbs.fake_sysfs import RXE, make_device

_WATCH_IMPORTS = """
import importlib.machinery, sys

class Refuse:
    def create_module(self, spec):
        raise AssertionError(f"imported {spec.name}")

    def exec_module(self, module):
        raise AssertionError(f"imported {module.__name__}")

class Watch:
    # Locating pyverbs is fine (verbs_glue.install does); loading it is not.
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pyverbs":
            return importlib.machinery.ModuleSpec(name, Refuse())
        return None

sys.meta_path.insert(0, Watch())
import rdmakit.verbs, rdmakit.doca.verbs_glue, rdmakit.doca
assert rdmakit.doca.verbs_glue.install()
print("ok")
"""


def test_importing_rdmakit_verbs_does_not_try_pyverbs() -> None:
    """Only the first use of VerbsDevice (or discovery) imports pyverbs (an attempt fails here)."""
    res = subprocess.run([sys.executable, "-c", _WATCH_IMPORTS], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_no_pyverbs_means_no_devices_and_a_debug_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pyverbs", None)  # import pyverbs now raises ImportError
    monkeypatch.setitem(sys.modules, "pyverbs.device", None)
    with caplog.at_level(logging.DEBUG, logger="rdmakit.verbs"):
        assert list_devices() == []
    (rec,) = [r for r in caplog.records if r.name == "rdmakit.verbs"]
    assert rec.levelno == logging.DEBUG
    assert "python3-pyverbs" in rec.getMessage()


def test_no_device_means_no_devices_and_a_debug_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setattr(discovery, "pyverbs_missing", lambda: None)
    with caplog.at_level(logging.DEBUG, logger="rdmakit.verbs"):
        assert list_devices(tmp_path / "class") == []
    assert any("no RDMA driver" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


def test_an_unopenable_device_is_left_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    make_device(tmp_path, "rxe0", RXE, parent="ens2")
    monkeypatch.setattr(discovery, "pyverbs_missing", lambda: None)
    fake = type(sys)("rdmakit.verbs.device")

    def describe(*args: object) -> VerbsDeviceInfo:
        raise VerbsError("NOT_FOUND", "cannot open verbs device rxe0: No such device", "system")

    fake.describe = describe  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rdmakit.verbs.device", fake)
    with caplog.at_level(logging.DEBUG, logger="rdmakit.verbs"):
        assert list_devices(tmp_path / "class") == []
    assert any("rxe0 left out" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(importlib.util.find_spec("pyverbs") is not None, reason="pyverbs is installed here")
def test_glue_does_not_register_without_pyverbs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="rdmakit.verbs"):
        assert verbs_glue.install() is False
    assert all(i.kind != "verbs" for i in devinfo_list())
    assert any("not discoverable" in r.getMessage() for r in caplog.records)


def _info() -> VerbsDeviceInfo:
    return VerbsDeviceInfo(
        name="rxe0",
        port=1,
        gid_index=1,
        gid=IPv6Address("::ffff:10.77.0.2"),
        gids=(IPv6Address("fe80::5054:ff:fe77:2"), IPv6Address("::ffff:10.77.0.2")),
        ip_addrs=(IPv4Address("10.77.0.2"),),
        mtu=1024,
        caps=VerbsCaps(max_qp_wr=1 << 20, max_sge=32, max_buf_list_len=32),
        netdev="ens2",
    )


def test_devinfo_of_a_verbs_device() -> None:
    info: DevInfo = verbs_glue.verbs_devinfo(_info())
    assert (info.name, info.kind, info.mtu) == ("rxe0", "verbs", 1024)
    assert info.matches("rxe0")
    assert info.matches("10.77.0.2")
    assert info.matches("::ffff:10.77.0.2")
    assert not info.matches("10.77.0.1")
    assert info.caps.max_qp_wr == 1 << 20
    assert info.is_job_supported("rdma.atomic_fetch_add")
    assert not info.is_job_supported("dma.memcpy")


def test_glue_provider_lists_what_discovery_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verbs_glue, "list_devices", lambda: [_info()])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    installed_before = verbs_glue._unregister is not None  # rdmakit.doca may install it at import
    assert verbs_glue.install() is True
    try:
        assert verbs_glue.install() is True  # idempotent
        names = [(i.name, i.kind) for i in devinfo_list()]
        assert names.count(("rxe0", "verbs")) == 1
    finally:
        if not installed_before:
            verbs_glue.uninstall()
    if not installed_before:
        assert all(i.kind != "verbs" for i in devinfo_list())


@pytest.mark.parametrize(
    ("code", "fault", "doca", "doca_fault"),
    [
        ("INVALID_VALUE", "peer", DocaErrorCode.INVALID_VALUE, Fault.PEER),
        ("NOT_SUPPORTED", "caller", DocaErrorCode.NOT_SUPPORTED, Fault.CALLER),
        ("FULL", "caller", DocaErrorCode.FULL, Fault.CALLER),
        ("DRIVER", "system", DocaErrorCode.DRIVER, Fault.SYSTEM),
    ],
)
def test_verbs_errors_become_doca_errors(
    code: str, fault: str, doca: DocaErrorCode, doca_fault: Fault
) -> None:
    err = verbs_glue.to_doca_error(VerbsError(code, "what happened", fault))  # type: ignore[arg-type]
    assert isinstance(err, DocaError)
    assert (err.code, err.fault, err.message) == (doca, doca_fault, "what happened")


def test_buffer_address() -> None:
    buf = bytearray(64)
    base = ctypes.addressof((ctypes.c_char * 64).from_buffer(buf))
    view = memoryview(buf)
    assert buffer_address(view) == base
    assert buffer_address(view[16:]) == base + 16
    data = b"read-only"
    assert buffer_address(memoryview(data)) == ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    with pytest.raises(VerbsError) as exc:
        buffer_address(view[::2])
    assert exc.value.code == "INVALID_VALUE"
