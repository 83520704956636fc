"""The RC queue-pair engine, sans-IO (docs/architecture.md §2).

Packets and ``now`` in, packets, timer deadlines and completions out; no
sockets, no clock, no global randomness. Behaviour follows IBTA Vol. 1 ch. 9
and Linux ``rdma_rxe``, which it interoperates with.
"""

from .attrs import ModifyAttrs, QpAttrs
from .cq import CompletionQueue
from .errors import EngineError, ErrorCode
from .memory import MemoryRegion, ProtectionDomain
from .qp import QueuePair
from .srq import SharedReceiveQueue, SrqEvent, SrqEventKind
from .states import TRANSITIONS, QpState, Transition
from .stats import QpStats
from .timers import INFINITE_RETRY, RNR_TIMER_USEC, rnr_delay, transport_timeout
from .types import (
    SGE,
    Access,
    Completion,
    QpCaps,
    RecvWR,
    SendWR,
    WcOpcode,
    WcStatus,
    WrOpcode,
)

__all__ = [
    "INFINITE_RETRY", "RNR_TIMER_USEC", "SGE", "TRANSITIONS", "Access", "Completion",
    "CompletionQueue", "EngineError", "ErrorCode", "MemoryRegion", "ModifyAttrs", "ProtectionDomain",
    "QpAttrs", "QpCaps", "QpState", "QpStats", "QueuePair", "RecvWR", "SendWR", "SharedReceiveQueue",
    "SrqEvent", "SrqEventKind", "Transition", "WcOpcode",
    "WcStatus", "WrOpcode", "rnr_delay", "transport_timeout",
]  # fmt: skip
