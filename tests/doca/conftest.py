"""Fixtures for the DOCA layer: seeded local devices, started memory maps, two-sided RDMA pairs."""

import os
import random
from collections.abc import Callable, Iterator

import pytest

from rdmakit.doca import AccessFlag, Dev, LocalBackendDevice, Mmap, SyncEvent, WorkQ, local_devinfo
from tests.doca.rdma_harness import PAIR_CONFIGS, Mode, Pair, PairFactory, TransportName
from tests.doca.util import MmapFactory


@pytest.fixture
def seed() -> int:
    """The seed of this test's random source; printed so a failure replays."""
    value = int(os.environ.get("RDMAKIT_SEED", random.SystemRandom().randrange(1 << 32)))
    print(f"RDMAKIT_SEED={value}")
    return value


@pytest.fixture
def rng(seed: int) -> random.Random:
    return random.Random(seed)


@pytest.fixture
def dev(rng: random.Random) -> Iterator[Dev]:
    opened = Dev.open(local_devinfo("local0", rng=rng))
    yield opened
    opened.close_all()  # teardown: whatever a test left open goes with it


@pytest.fixture
def backend(dev: Dev) -> LocalBackendDevice:
    assert isinstance(dev.backend, LocalBackendDevice)
    return dev.backend


@pytest.fixture
def make_mmap(dev: Dev) -> Iterator[MmapFactory]:
    """``make_mmap(size_or_buffer, access=LOCAL_READ_WRITE)``: a started mmap on `dev`."""
    made: list[Mmap] = []

    def make(memory: int | object = 4096, access: int = AccessFlag.LOCAL_READ_WRITE) -> Mmap:
        mmap = Mmap()
        mmap.set_permissions(access)
        mmap.set_memrange(bytearray(memory) if isinstance(memory, int) else memory)  # type: ignore[arg-type]
        mmap.add_dev(dev)
        mmap.start()
        made.append(mmap)
        return mmap

    yield make
    for mmap in made:
        if mmap.num_bufs == 0:
            mmap.destroy()


@pytest.fixture
def workq() -> Iterator[WorkQ]:
    """A polling WorkQ of depth 8."""
    with WorkQ(8) as wq:
        yield wq


@pytest.fixture
def event(workq: WorkQ) -> Iterator[SyncEvent]:
    """A started SyncEvent on ``workq``."""
    with SyncEvent() as ev:
        ev.workq_add(workq)
        ev.start()
        yield ev


@pytest.fixture(params=PAIR_CONFIGS)
def pair_cfg(request: pytest.FixtureRequest) -> tuple[TransportName, Mode]:
    """(transport, mode): every RDMA rule runs over UDP and TCP, polling and event-driven."""
    cfg: tuple[TransportName, Mode] = request.param
    return cfg


@pytest.fixture
def make_pair(pair_cfg: tuple[TransportName, Mode], new_ip: Callable[[], str]) -> Iterator[PairFactory]:
    """``make_pair(perms_a=..., perms_b=..., ...)`` -> a `Pair` in the test's configuration, closed after."""
    made: list[Pair] = []
    transport, mode = pair_cfg

    def make(**kwargs: object) -> Pair:
        pair = Pair(transport, mode, new_ip, **kwargs)  # type: ignore[arg-type]
        made.append(pair)
        return pair

    yield make
    for pair in made:
        pair.close()
