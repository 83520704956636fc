"""The backend conformance suite (rdmakit.testing.backend) on the soft backend, UDP and TCP.

The verbs backend runs the same suite in the lab (tests/lab/test_verbs_backend.py).
"""

import ast
import random
from collections.abc import Callable, Iterator
from ipaddress import IPv6Address
from pathlib import Path
from typing import Literal

import pytest

import rdmakit.doca
from rdmakit.doca import (
    AccessFlag,
    BackendDevice,
    Dev,
    DevInfo,
    LocalBackendDevice,
    Mmap,
    MmapDescriptor,
    SoftBackendDevice,
)
from rdmakit.testing.backend import check_backend_pair


@pytest.mark.parametrize("transport", ["roce-udp", "tcp"])
def test_soft_backend_keeps_the_protocols_promises(
    transport: Literal["roce-udp", "tcp"], new_ip: Callable[[], str]
) -> None:
    def make() -> tuple[BackendDevice, BackendDevice]:
        return SoftBackendDevice(transport, new_ip()), SoftBackendDevice(transport, new_ip())

    check_backend_pair(make)


def test_the_suite_can_fail(new_ip: Callable[[], str]) -> None:
    """A backend whose local_view ignores the write permission is caught."""

    class Leaky(SoftBackendDevice):
        def local_view(self, lkey: int, addr: int, length: int, *, write: bool) -> memoryview | None:
            return super().local_view(lkey, addr, length, write=False)

    def make() -> tuple[BackendDevice, BackendDevice]:
        return Leaky("roce-udp", new_ip()), Leaky("roce-udp", new_ip())

    with pytest.raises(AssertionError, match="a write without LOCAL_WRITE"):
        check_backend_pair(make)


# -- capabilities are declared, not discovered --------------------------------------------------

DOCA = Path(rdmakit.doca.__file__).parent
CLI = DOCA.parent / "cli"
#: The only getattr/hasattr calls rdmakit.doca and rdmakit.cli may make, none on a backend object:
#: (module, first argument) — the stdlib mmap module's optional constant, a descriptor's own fields,
#: argparse namespaces, the exceptions of the out-of-band exchange, a wire message's own fields, the
#: demo's job results, a DMA Copy message's own fields and a bench row's own fields.
ALLOWED_PROBES = {
    ("doca/shm.py", "stdlib_mmap"),
    ("doca/descriptor.py", "d"),
    ("cli/options.py", "args"),
    ("cli/lifecycle.py", "args"),
    ("cli/main.py", "args"),
    ("cli/tool_flags.py", "args"),  # an argparse Namespace: a refused flag given
    ("cli/samples_cli.py", "args"),
    ("cli/perftest.py", "e"),
    ("cli/rc_pingpong.py", "e"),
    ("cli/oob_messages.py", "self"),
    ("cli/demo.py", "got"),
    ("cli/demo.py", "j"),
    ("cli/dma_protocol.py", "msg"),
    ("cli/bench_sweep.py", "r"),
}
#: Names of backend objects and their classes, which no isinstance() above the backends may mention.
BACKEND_NAMES = ("Backend", "backend", "SoftDevice", "VerbsDevice", "VerbsQP", ".verbs", ".soft")


def _calls(name: str) -> Iterator[tuple[str, ast.Call]]:
    for path in sorted([*DOCA.glob("*.py"), *CLI.glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                yield f"{path.parent.name}/{path.name}", node


def test_no_backend_object_is_probed() -> None:
    """The DOCA layer and the CLI use the backend protocols' members; they never ask an object what it
    has or what it is, and no process-wide registry of contexts or made-up pump ids decides who
    progresses what."""
    probes = {(where, ast.unparse(c.args[0])) for fn in ("getattr", "hasattr") for where, c in _calls(fn)}
    assert probes <= ALLOWED_PROBES
    for where, call in _calls("isinstance"):
        text = ast.unparse(call)
        assert not any(name in text for name in BACKEND_NAMES), f"{where}: {text}"
    sources = "\n".join(p.read_text() for p in [*DOCA.glob("*.py"), *CLI.glob("*.py")])
    for gone in ("is_dataclass", "_Resolver", "WeakSet", "id(self) %"):
        assert gone not in sources, gone


# -- the GID a device exports -----------------------------------------------------------------------


class _RocePort(LocalBackendDevice):
    """A device whose GID table starts with a link-local entry, as a RoCE port's does (index 0)."""

    @property
    def gid_index(self) -> int:
        return 1

    @property
    def gid(self) -> IPv6Address:
        return self.gids[1]


def test_mmap_descriptor_names_the_gid_queue_pairs_use() -> None:
    """export_rdma carries BackendDevice.gid, not gids[0] (link-local on a RoCE port)."""
    gids = (IPv6Address("fe80::5054:ff:fe77:2"), IPv6Address("::ffff:10.77.0.2"))
    info = DevInfo(
        name="roce0", kind="local", opener=lambda: _RocePort("roce0", rng=random.Random(5), gids=gids)
    )
    with Dev.open(info) as dev:
        mmap = Mmap()
        mmap.set_permissions(AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ)
        mmap.set_memrange(bytearray(64))
        mmap.add_dev(dev)
        mmap.start()
        desc = MmapDescriptor.from_bytes(mmap.export_rdma(dev))
        mmap.stop()
        mmap.destroy()
    assert desc.gid == IPv6Address("::ffff:10.77.0.2")
