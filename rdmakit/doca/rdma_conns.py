"""The connections of a DOCA RDMA context (DOCA 2.7+ ``doca_rdma_connection``, ``doca_rdma.h``).

An `Rdma` context that connects by address holds up to
``max_num_connections`` connections (``doca_rdma_set_max_num_connections``,
1 by default, at most `Rdma.cap_get_max_num_connections`). Each
`RdmaConnection` owns one RC queue pair: the one the context created at
``start`` for the first connection, a new one for each further connection,
made when the request is accepted or the connect is issued. Every queue
pair of a context completes through the context, so jobs and tasks of all
its connections come back through the same WorkQ or progress engine.

=============================================  ==================================================
DOCA                                           here
=============================================  ==================================================
``doca_rdma_set_max_num_connections``          `Rdma.set_max_num_connections` (IDLE)
``doca_rdma_get_max_num_connections``          `Rdma.get_max_num_connections`
``doca_rdma_connection_get_id``                `RdmaConnection.get_id`
``doca_rdma_connection_{get,set}_user_data``   `RdmaConnection.get_user_data` / ``set_user_data``
``doca_rdma_connection_accept/reject``         `RdmaConnection.accept` / `RdmaConnection.reject`
``doca_rdma_connection_disconnect``            `RdmaConnection.disconnect`
``doca_rdma_task_<x>_set_rdma_connection``     ``set_rdma_connection`` of each RDMA task
``task_<x>_alloc_init``'s connection           ``rdma_connection=``; a job's ``connection=``
=============================================  ==================================================

A connection's id is the lowest one no other open connection of its
context has (0 for a context's only connection). Its state is
``requested`` (a request waits for `accept` or `reject`), ``connecting``,
``established`` or ``closed``; a closed connection keeps its `error`.
"""

from typing import Any, Protocol

from rdmakit.doca.backend import BackendQP
from rdmakit.doca.ctx import Ctx
from rdmakit.doca.errors import DocaError, DocaErrorCode

__all__ = ["MAX_NUM_CONNECTIONS", "RdmaConnection"]

#: The most connections one `Rdma` context may hold (``doca_rdma_cap_get_max_num_connections``).
MAX_NUM_CONNECTIONS = 1024


class _Owner(Protocol):
    """What a connection asks of its context (`rdmakit.doca.rdma_cm.RdmaCmApi`)."""

    def _cm_accept(self, conn: "RdmaConnection", private_data: bytes) -> None: ...
    def _cm_reject(self, conn: "RdmaConnection", private_data: bytes) -> None: ...
    def _cm_disconnect(self, conn: "RdmaConnection") -> None: ...


class RdmaConnection:
    """``doca_rdma_connection``: one connection of an `Rdma` context, with its own RC queue pair."""

    __slots__ = (
        "_ctx",
        "_error",
        "_handle",
        "_id",
        "_owner",
        "_qp",
        "_state",
        "_user_data",
        "peer",
        "private_data",
    )

    def __init__(
        self,
        owner: _Owner,
        ctx: Ctx[Any],
        handle: int,
        conn_id: int,
        peer: tuple[str, int],
        private_data: bytes,
    ) -> None:
        self._owner, self._ctx = owner, ctx  # one object: the context, seen as both
        self._handle = handle
        self._id = conn_id
        self.peer = peer  # the peer's address and port
        self.private_data = private_data  # what the peer's REQ (or REP) carried for the user
        self._user_data: object = None
        self._state = "requested"  # requested, connecting, established, closed
        self._qp: BackendQP | None = None
        self._error: DocaError | None = None

    @property
    def rdma(self) -> Ctx[Any]:
        """The `Rdma` context the connection belongs to."""
        return self._ctx

    @property
    def state(self) -> str:
        """``requested``, ``connecting``, ``established`` or ``closed``."""
        return self._state

    @property
    def id(self) -> int:
        return self._id

    def get_id(self) -> int:
        """``doca_rdma_connection_get_id``: unique among the context's open connections."""
        return self._id

    @property
    def qpn(self) -> int | None:
        """The number of the connection's queue pair; None before `accept`."""
        return None if self._qp is None else self._qp.qpn

    @property
    def error(self) -> DocaError | None:
        """Why the connection failed, was disconnected or went to ERROR, if it did."""
        return self._error

    @property
    def is_open(self) -> bool:
        return self._state != "closed"

    def get_user_data(self) -> object:
        return self._user_data

    def set_user_data(self, user_data: object) -> None:
        self._user_data = user_data

    def accept(self, private_data: bytes = b"") -> None:
        """Accept a requested connection (``doca_rdma_connection_accept``): the REP leaves.

        The connection gets its queue pair here.
        """
        if self._state != "requested":
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"accept: the connection is {self._state}, not requested"
            )
        self._owner._cm_accept(self, bytes(private_data))
        self._state = "connecting"

    def reject(self, private_data: bytes = b"") -> None:
        """Refuse a requested connection (``doca_rdma_connection_reject``): REJ, consumer defined."""
        if self._state != "requested":
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"reject: the connection is {self._state}, not requested"
            )
        self._state = "closed"
        self._owner._cm_reject(self, bytes(private_data))

    def disconnect(self) -> None:
        """``doca_rdma_connection_disconnect``: DREQ; the disconnect callback follows in progress.

        Only this connection's outstanding jobs and tasks are flushed.
        """
        if self._state in ("connecting", "established"):
            self._owner._cm_disconnect(self)

    def __repr__(self) -> str:
        qpn = "" if self._qp is None else f" qpn={self._qp.qpn:#x}"
        return f"<RdmaConnection {self._id} {self._state} peer={self.peer[0]}:{self.peer[1]}{qpn}>"
