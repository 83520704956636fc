"""Keys, QPNs and PSNs a peer cannot predict (docs/security.md, "Keys").

The attack: a peer collects the R_Keys of a soft device's memory maps (every
``rdmakit.mmap/1`` descriptor carries one), recovers the generator's state and
predicts the R_Key of the next registration, which would give it the memory
before it was ever shared. Against a Mersenne Twister the prediction is exact
(shown on a seeded ``random.Random``, so the attack code itself is proven);
against the OS CSPRNG it must fail.

The verbs backend draws only its QPs' initial PSNs (the kernel assigns R_Keys
and QPNs); without pyverbs, the module is loaded over a stand-in pyverbs and
the PSN of a QP it creates is traced to ``random.SystemRandom``.
"""

import importlib.util
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import pytest

from rdmakit.doca import AccessFlag, Dev, Mmap
from rdmakit.engine import Access, ProtectionDomain, QpCaps
from tests.security.mt19937 import MIN_ALTERNATE, predict_after_alternate
from tests.verbs.fake_sysfs import RXE, make_device

#: Registrations the attacker watches: comfortably more than the minimum.
OBSERVED = MIN_ALTERNATE + 16


def _exported_rkey(dev: Dev, memory: bytearray) -> int:
    """What a peer learns from one exported memory map: its R_Key."""
    mmap = Mmap()
    mmap.set_memrange(memory)
    mmap.set_permissions(AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE)
    mmap.add_dev(dev)
    mmap.start()
    desc = json.loads(mmap.export_rdma(dev))
    rkey = desc["rkey"]
    assert isinstance(rkey, int)
    return rkey


def test_the_attack_predicts_a_mersenne_twister_from_rkeys_alone() -> None:
    """Control: the same attack on a PD keyed by ``random.Random`` predicts its next R_Key exactly."""
    pd = ProtectionDomain(random.Random(20261123))
    memory = bytearray(64)
    rkeys = [pd.register(memory, 0x1000, Access.LOCAL_WRITE).rkey for _ in range(OBSERVED)]
    _lkey, rkey = predict_after_alternate(rkeys, 2)
    assert pd.register(memory, 0x1000, Access.LOCAL_WRITE).rkey == rkey


def test_a_soft_device_rkey_cannot_be_predicted(new_ip: Callable[[], str]) -> None:
    """A peer that saw some 950 exported R_Keys of a soft device still cannot name the next one."""
    dev = Dev.open(new_ip())
    try:
        memory = [bytearray(64) for _ in range(OBSERVED + 1)]
        seen = [_exported_rkey(dev, m) for m in memory[:-1]]
        _lkey, predicted = predict_after_alternate(seen, 2)
        actual = _exported_rkey(dev, memory[-1])
        assert actual != predicted, "the next R_Key was predicted from the earlier ones"
    finally:
        dev.close_all()  # the ~950 mmaps the attack made go with it


# -- the verbs backend's PSNs -----------------------------------------------------------------


class _PyverbsError(Exception):
    pass


class _PyverbsRDMAError(_PyverbsError):
    pass


_PYVERBS_NAMES = {
    "pyverbs.addr": ("GID", "AHAttr", "GlobalRoute"),
    "pyverbs.cq": ("CQ", "CompChannel"),
    "pyverbs.device": ("Context",),
    "pyverbs.mr": ("MR",),
    "pyverbs.pd": ("PD",),
    "pyverbs.qp": ("QP", "QPAttr", "QPCap", "QPInitAttr"),
    "pyverbs.srq": ("SRQ", "SrqAttr", "SrqInitAttr"),
    "pyverbs.wr": ("SGE", "RecvWR", "SendWR"),
}


@pytest.fixture
def verbs_device_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``rdmakit/verbs/device.py`` loaded over a stand-in pyverbs whose objects accept anything."""
    package = ModuleType("pyverbs")
    monkeypatch.setitem(sys.modules, "pyverbs", package)
    for name, attrs in _PYVERBS_NAMES.items():
        module = ModuleType(name)
        for attr in attrs:
            setattr(module, attr, mock.MagicMock(name=f"{name}.{attr}"))
        monkeypatch.setitem(sys.modules, name, module)
    errors = ModuleType("pyverbs.pyverbs_error")
    errors.PyverbsError = _PyverbsError  # type: ignore[attr-defined]
    errors.PyverbsRDMAError = _PyverbsRDMAError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyverbs.pyverbs_error", errors)
    import rdmakit.verbs

    path = Path(rdmakit.verbs.__file__).with_name("device.py")
    spec = importlib.util.spec_from_file_location("rdmakit.verbs._device_under_test", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_verbs_psns_come_from_the_os_csprng(
    verbs_device_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A VerbsDevice opened without a seed draws its QPs' initial PSNs from ``random.SystemRandom``."""
    make_device(tmp_path, "rxe0", RXE, parent="ens2")
    marker = 0x5A5A5A
    asked: list[int] = []

    def system_getrandbits(self: random.SystemRandom, k: int) -> int:
        asked.append(k)
        return marker & ((1 << k) - 1)

    monkeypatch.setattr(random.SystemRandom, "getrandbits", system_getrandbits)
    dev = verbs_device_module.VerbsDevice("rxe0", sysfs_root=tmp_path / "class")
    qp = dev.create_qp(QpCaps())
    assert qp._psn == marker
    assert 24 in asked


def test_verbs_psns_still_replay_from_an_injected_seed(verbs_device_module: Any, tmp_path: Path) -> None:
    """An injected ``random.Random`` still decides the PSNs (the lab tests replay from a seed)."""
    make_device(tmp_path, "rxe0", RXE, parent="ens2")
    psns = []
    for _ in range(2):
        dev = verbs_device_module.VerbsDevice("rxe0", sysfs_root=tmp_path / "class", rng=random.Random(9))
        psns.append(dev.create_qp(QpCaps())._psn)
    assert psns[0] == psns[1] == random.Random(9).getrandbits(24)
