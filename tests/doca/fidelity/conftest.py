"""The DOCA fidelity tests: one module per DOCA header, each test naming the function and the sentence
of its documentation it checks.

They run on the soft engine over RoCE UDP and over TCP, and, where pyverbs and a RoCE v2 device are
present (the lab guest), on the verbs backend too (``verbs:<device>``, marked ``lab``).
"""

from collections.abc import Callable, Iterator

import pytest

from tests.doca.task_harness import Api, Duo
from tests.lab.verbs_env import DEVICES, NAME, marks

_TRANSPORTS = [
    pytest.param("udp", id="udp"),
    pytest.param("tcp", id="tcp"),
    pytest.param(f"verbs:{NAME}", id="verbs", marks=marks()),
]

#: The sides of a fidelity test: (api, transport) -> a Duo, not connected yet.
DuoFactory = Callable[[Api], Duo]


@pytest.fixture(params=_TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name.startswith("verbs:") and DEVICES:
        from rdmakit.doca.verbs_glue import install

        install()
    return name


@pytest.fixture
def make_duo(transport: str, new_ip: Callable[[], str]) -> Iterator[DuoFactory]:
    made: list[Duo] = []

    def make(api: Api = "task") -> Duo:
        d = Duo(api, transport, new_ip)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()
