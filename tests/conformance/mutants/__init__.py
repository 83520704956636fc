"""Deliberate engine bugs, for the suite's own test: each one must make some case FAIL.

Each bug is one a RoCE stack has really had or could plausibly have: an
off-by-one in a retry count or a range check, a field taken from the wrong
place, a state not left or not entered. ``MUTATIONS`` maps its name to the
function that plants it (in this process only), the part of the stack it
lives in and the cases that must catch it: one of them at least must FAIL
(a timer bug may hide from one bound on a busy machine, not from both), and
only these run, to keep the check fast. ``python -m tests.conformance.mutations``
plants one and runs a target agent with it.

The mutant agent runs the pure-Python data plane (``RDMAKIT_PURE_PYTHON=1``):
the native one would bypass the Python code a mutation changes.

No mutant here is equivalent: each is caught, and the test fails if one is not.
"""

from collections.abc import Callable
from dataclasses import dataclass

from rdmakit.engine import qp as qp_mod
from rdmakit.engine import requester as req_mod
from rdmakit.engine import responder as resp_mod

_MASK = 0xFFFFFF
_U64 = (1 << 64) - 1
Responder = resp_mod.Responder
Requester = req_mod.Requester
QueuePair = qp_mod.QueuePair


@dataclass(frozen=True)
class Mutant:
    plant: Callable[[], None]
    area: str  # responder | requester | completer | qp | memory | codec | cm
    catch: tuple[str, ...]  # cases to run; one at least must FAIL
    #: Only a run over IPv6 can catch it (``tests/conformance/test_ipv6.py``): it runs there.
    ipv6: bool = False


MUTATIONS: dict[str, Mutant] = {}


def mutant(
    name: str, area: str, *catch: str, ipv6: bool = False
) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def register(fn: Callable[[], None]) -> Callable[[], None]:
        assert name not in MUTATIONS, name
        MUTATIONS[name] = Mutant(fn, area, catch, ipv6)
        return fn

    return register


def patch(owner: object, name: str, value: object) -> None:
    """Replace ``owner.name`` (a method, function or constant) in this process."""
    assert hasattr(owner, name), (owner, name)
    setattr(owner, name, value)


def apply(name: str) -> None:
    m = MUTATIONS.get(name)
    if m is None:
        raise ValueError(f"unknown mutation {name[:40]!r}; known: {', '.join(MUTATIONS)}")
    m.plant()


from . import requester, responder, state_codec_cm  # noqa: E402  (they register with `mutant`)

__all__ = ["MUTATIONS", "Mutant", "apply", "requester", "responder", "state_codec_cm"]
