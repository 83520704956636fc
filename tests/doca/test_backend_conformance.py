"""The backend conformance suite (rdmakit.testing.backend) on the soft backend, UDP and TCP.

The verbs backend runs the same suite in the lab (tests/lab/test_verbs_backend.py).
"""

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest

import rdmakit.doca
from rdmakit.doca import BackendDevice, SoftBackendDevice
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
#: The only getattr/hasattr calls rdmakit.doca may make, none on a backend object:
#: (module, first argument) — the stdlib mmap module's optional constant, a descriptor's own fields.
ALLOWED_PROBES = {("shm.py", "stdlib_mmap"), ("descriptor.py", "d")}


def _probes() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(DOCA.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
            ):
                found.add((path.name, ast.unparse(node.args[0])))
    return found


def test_no_backend_object_is_probed() -> None:
    """The DOCA layer uses the backend protocols' members; it never asks an object what it has,
    and no process-wide registry of contexts or made-up pump ids decides who progresses what."""
    assert _probes() <= ALLOWED_PROBES
    sources = "\n".join(p.read_text() for p in DOCA.glob("*.py"))
    for gone in ("is_dataclass", "_Resolver", "isinstance(backend", "WeakSet", "id(self) %"):
        assert gone not in sources, gone
