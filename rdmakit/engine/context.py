"""What the requester, completer and responder may ask of their queue pair.

They hold their QP as a ``QpContext``: the members below and nothing else.
``QueuePair`` satisfies it structurally, so the sub-machines never import
:mod:`.qp` (which imports them): the engine's import graph has no cycle.
"""

from typing import Protocol

from .memory import ProtectionDomain
from .stats import QpStats
from .types import Completion, WcStatus


class QpContext(Protocol):
    """The queue pair as its sub-machines see it."""

    @property
    def qpn(self) -> int: ...
    @property
    def dest_qpn(self) -> int: ...
    @property
    def access_bits(self) -> int:
        """The QP's ``access`` flags as a plain int (rxe ``check_qp_attr_access()``)."""
        ...

    @property
    def pd(self) -> ProtectionDomain: ...
    @property
    def stats(self) -> QpStats: ...
    def state_is_error(self) -> bool: ...
    def enter_error(self) -> None:
        """Move to ERR, flushing every outstanding work request (IBTA §10.3.1.8)."""

    def push_recv(self, wc: Completion) -> None:
        """Post a receive completion; a full CQ moves the QP to ERR."""

    def complete_send_head(self, status: WcStatus) -> None:
        """Complete the oldest send WQE with ``status`` (rxe ``do_complete()``)."""

    def fail_send(self, status: WcStatus) -> None:
        """The oldest send WQE fails with ``status``; the QP goes to ERR (rxe COMPST_ERROR)."""
