"""DOCA Core 3.2: device discovery, opening and capability queries."""

import random
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv6Address

import pytest

from rdmakit.doca import (
    AccessFlag,
    Dev,
    DeviceCaps,
    DevInfo,
    DocaError,
    DocaErrorCode,
    Fault,
    JobType,
    LocalBackendDevice,
    Mmap,
    SyncEvent,
    devinfo_list,
    register_provider,
)


@pytest.fixture
def fake_nic(rng: random.Random) -> Iterator[DevInfo]:
    """A second device, found through a registered provider."""
    info = DevInfo(
        name="mlx5_7",
        kind="local",
        opener=lambda: LocalBackendDevice("mlx5_7", rng=rng),
        ip_addrs=(IPv4Address("192.0.2.7"), IPv6Address("2001:db8::7")),
        pci_addr="0000:3b:00.1",
        caps=DeviceCaps(max_buf_size=1 << 20, max_buf_list_len=8, job_types=frozenset({JobType.RDMA_WRITE})),
    )
    unregister = register_provider(lambda: [info])
    yield info
    unregister()


def test_local_device_is_always_listed() -> None:
    """DOCA Core 3.2: discovery lists the in-tree local device on any machine."""
    names = [info.name for info in devinfo_list()]
    assert "local0" in names


def test_registered_provider_is_listed(fake_nic: DevInfo) -> None:
    """DOCA Core 3.2: providers (the soft driver, the verbs backend) plug into discovery."""
    assert fake_nic in devinfo_list()


def test_provider_removal() -> None:
    """Unregistering a provider removes its devices from discovery."""
    info = DevInfo(name="gone0", kind="local", opener=lambda: LocalBackendDevice(rng=random.Random()))
    unregister = register_provider(lambda: [info])
    unregister()
    assert info not in devinfo_list()


def test_provider_registered_twice_is_already_exist() -> None:
    """The same provider cannot be registered twice."""

    def provider() -> list[DevInfo]:
        return []

    unregister = register_provider(provider)
    try:
        with pytest.raises(DocaError) as exc:
            register_provider(provider)
        assert exc.value.code is DocaErrorCode.ALREADY_EXIST
    finally:
        unregister()


@pytest.mark.parametrize(
    "spec",
    ["mlx5_7", "192.0.2.7", "::ffff:192.0.2.7", "2001:db8::7", "0000:3b:00.1", "3b:00.1", "0000:3B:00.1"],
)
def test_open_by_name_ip_or_pci(fake_nic: DevInfo, spec: str) -> None:
    """DOCA Core 3.2: a device is opened by name, IP address or PCI address (short or long form)."""
    with Dev.open(spec) as dev:
        assert dev.info is fake_nic
        assert dev.backend.name == "mlx5_7"


@pytest.mark.parametrize("spec", ["mlx5_8", "192.0.2.8", "0000:3b:00.2", "3b:00", "zz:00.1"])
def test_open_unknown_is_not_found(fake_nic: DevInfo, spec: str) -> None:
    """DOCA Core 3.2: opening a device nobody provides is NOT_FOUND."""
    with pytest.raises(DocaError) as exc:
        Dev.open(spec)
    assert exc.value.code is DocaErrorCode.NOT_FOUND


def test_capability_queries(fake_nic: DevInfo) -> None:
    """DOCA Core 3.2: max buffer size, max list length and job support are queried per device."""
    assert fake_nic.max_buf_size() == 1 << 20
    assert fake_nic.max_buf_list_len() == 8
    assert fake_nic.is_job_supported(JobType.RDMA_WRITE)
    assert not fake_nic.is_job_supported(JobType.DMA_MEMCPY)


def test_representors_are_not_supported(dev: Dev) -> None:
    """DOCA Core 3.2.1: representors need a DPU; asking is NOT_SUPPORTED, a system limit."""
    for call in (dev.rep_list, lambda: dev.open_rep(dev.info)):
        with pytest.raises(DocaError) as exc:
            call()
        assert exc.value.code is DocaErrorCode.NOT_SUPPORTED
        assert exc.value.fault is Fault.SYSTEM


def test_close_is_idempotent_and_final(dev: Dev) -> None:
    """Style rule 7: close twice is fine; a closed device's backend is BAD_STATE."""
    dev.close()
    dev.close()
    assert dev.closed
    with pytest.raises(DocaError) as exc:
        dev.backend  # noqa: B018
    assert exc.value.code is DocaErrorCode.BAD_STATE


def test_close_deregisters_memory_of_its_mmaps_first(dev: Dev, backend: LocalBackendDevice) -> None:
    """``doca_dev.h``, doca_dev_close: "DOCA_ERROR_IN_USE - failed to deallocate device resources":
    refused while an mmap uses it, naming the mmap; close_all drops the registrations first."""
    mmap = Mmap()
    mmap.set_memrange(bytearray(64))
    mmap.add_dev(dev)
    mmap.start()
    assert backend.num_registrations == 1
    with pytest.raises(DocaError) as refused:
        dev.close()
    assert refused.value.code is DocaErrorCode.IN_USE
    assert "Mmap" in str(refused.value)
    assert not dev.closed
    dev.close_all()
    assert backend.num_registrations == 0
    assert mmap.devs == ()
    with pytest.raises(DocaError) as exc:
        mmap.registration(dev)
    assert exc.value.code is DocaErrorCode.NOT_FOUND
    mmap.destroy()


def test_close_closes_contexts_first(dev: Dev) -> None:
    """doca_dev_close is IN_USE while a context uses the device, naming it; close_all closes it first."""
    event = SyncEvent()
    event.add_dev(dev)
    event.start()
    with pytest.raises(DocaError) as refused:
        dev.close()
    assert refused.value.code is DocaErrorCode.IN_USE
    assert "SyncEvent" in str(refused.value)
    assert not event.closed
    dev.close_all()
    assert event.closed


def test_closed_device_cannot_be_added(dev: Dev) -> None:
    """A closed device cannot join an mmap (BAD_STATE)."""
    dev.close()
    mmap = Mmap()
    mmap.set_permissions(AccessFlag.LOCAL_READ_WRITE)
    with pytest.raises(DocaError) as exc:
        mmap.add_dev(dev)
    assert exc.value.code is DocaErrorCode.BAD_STATE
