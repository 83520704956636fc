"""The pieces of ``doca_comch.h`` (DOCA 2.5+) that a server and a client share.

- `ComchConnection` (``doca_comch_connection``): one connected peer, with its
  user data, its counters (``doca_comch_connection_update_info``,
  ``doca_comch_connection_get_counter``) and the context it belongs to
  (``doca_comch_server_get_server_ctx``, ``doca_comch_client_get_client_ctx``).
- `ComchTaskSend` (``doca_comch_task_send``): a message to one connection,
  completing through its context's progress engine like every task.
- `ComchEventMsgRecv` and `ComchEventConnectionStatusChanged`: the ``event``
  argument of the receive and connection callbacks.

rdmakit additions, for one machine: a send task may carry file descriptors
(``fds``, over a Unix-socket channel only), and the receive event holds those
that came with a message (`ComchEventMsgRecv.take_fds`; not taken, they are
closed after the callback). DOCA's comch carries bytes only.
"""

import contextlib
import os
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from rdmakit.doca.comm_channel import CommChannel
from rdmakit.doca.ctx import Ctx, Job
from rdmakit.doca.errors import DocaError, DocaErrorCode
from rdmakit.doca.tasks import Task

__all__ = [
    "ComchConnection",
    "ComchCounter",
    "ComchEventConnectionStatusChanged",
    "ComchEventMsgRecv",
    "ComchSendJob",
    "ComchTaskSend",
]


class ComchCounter(IntEnum):
    """``enum doca_comch_counter``."""

    SENT_MESSAGES = 1  # total messages sent over a given comch_connection from local side
    SENT_BYTES = 2  # total bytes sent over a given comch_connection from local side
    RECV_MESSAGES = 3  # total messages received on local side over a given comch_connection
    RECV_BYTES = 4  # total bytes received on local side over a given comch_connection


class ComchConnection:
    """A connected peer of a comch server or client (``doca_comch_connection``)."""

    def __init__(self, ctx: Ctx[Any], channel: CommChannel, peer: str, role: str) -> None:
        self._ctx = ctx
        self._role = role  # "server" or "client": which kind of context `ctx` is
        self.channel = channel
        self.peer = peer  # who it is: IP:PORT, or a local process's pid and user
        self._max = channel.max_msg_size  # agreed in the handshake
        self._fd_passing = channel.fd_passing
        self.fd = channel.fileno()  # for the engine's notification handle, until it ends
        self.user_data: object = None
        self.error: DocaError | None = None  # why it ended, once it did
        self._counts = [0, 0, 0, 0]  # live: sent msgs, sent bytes, recv msgs, recv bytes
        self._info = [0, 0, 0, 0]  # as of the last update_info

    @property
    def connected(self) -> bool:
        return self.error is None and self.channel.connected

    @property
    def max_msg_size(self) -> int:
        """The largest message either side sends on this connection (the smaller of both settings)."""
        return self._max

    @property
    def fd_passing(self) -> bool:
        """rdmakit: whether messages may carry file descriptors (a Unix-socket channel)."""
        return self._fd_passing

    @property
    def local_ip(self) -> str | None:
        """rdmakit: the address this end of a ``tcp:`` channel uses (None over a Unix socket)."""
        return self.channel.local_ip

    def set_user_data(self, user_data: object) -> None:
        """``doca_comch_connection_set_user_data``."""
        self.user_data = user_data

    def get_user_data(self) -> object:
        """``doca_comch_connection_get_user_data``."""
        return self.user_data

    def get_server_ctx(self) -> Ctx[Any] | None:
        """``doca_comch_server_get_server_ctx`` (a `ComchServer`): "NULL if the connection is related
        to a client context"."""
        return self._ctx if self._role == "server" else None

    def get_client_ctx(self) -> Ctx[Any] | None:
        """``doca_comch_client_get_client_ctx`` (a `ComchClient`): "NULL if the connection is related
        to a server context"."""
        return self._ctx if self._role == "client" else None

    def update_info(self) -> None:
        """``doca_comch_connection_update_info``: CONNECTION_ABORTED "if the connection failed"."""
        if self.error is not None:
            raise DocaError(
                DocaErrorCode.CONNECTION_ABORTED,
                f"the connection with {self.peer} ended: {self.error.message}",
            )
        self._info = list(self._counts)

    def get_counter(self, counter: ComchCounter) -> int:
        """``doca_comch_connection_get_counter``: as of the last `update_info`."""
        if not isinstance(counter, ComchCounter):
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{counter!r} is not a doca_comch_counter")
        return self._info[counter - 1]

    def _count(self, first: int, size: int) -> None:
        self._counts[first] += 1
        self._counts[first + 1] += size

    def __repr__(self) -> str:
        state = "connected" if self.connected else "gone"
        return f"<ComchConnection {self.peer} {state}>"


@dataclass(frozen=True, slots=True, kw_only=True)
class ComchSendJob(Job):
    """A message for `connection`; the job under a `ComchTaskSend`."""

    connection: ComchConnection
    msg: bytes
    fds: tuple[int, ...] = ()


class ComchTaskSend(Task):
    """``doca_comch_task_send``: one message to a connected peer."""

    __slots__ = ("_connection", "_fds", "_msg")
    doca_name = "doca_comch_task_send"

    def __init__(
        self,
        ctx: Ctx[Any],
        connection: ComchConnection,
        msg: bytes | bytearray | memoryview,
        user_data: object = None,
        fds: tuple[int, ...] = (),
    ) -> None:
        # doca_comch_*_task_send_alloc_init: "DOCA_ERROR_INVALID_VALUE - in case of invalid input".
        if not isinstance(connection, ComchConnection) or connection._ctx is not ctx:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{connection!r} is not a connection of {ctx!r}")
        size = len(msg)
        limit = connection.max_msg_size
        if not 0 < size <= limit:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"a message of {size} bytes; 1 to {limit} allowed")
        if fds and not connection._fd_passing:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED, "file descriptors travel only over a Unix-socket channel"
            )
        super().__init__(ctx, user_data)
        self._connection = connection
        self._msg = bytes(msg)
        self._fds = tuple(fds)

    def _make_job(self) -> Job:
        return ComchSendJob(ctx=self._ctx, connection=self._connection, msg=self._msg, fds=self._fds)

    def get_connection(self) -> ComchConnection:
        return self._connection

    def get_msg(self) -> bytes:
        return self._msg


class ComchEventMsgRecv:
    """``struct doca_comch_event_msg_recv``: a message arrived (the callback's ``event``)."""

    __slots__ = ("_fds",)

    def __init__(self, fds: list[int]) -> None:
        self._fds = fds

    def take_fds(self) -> list[int]:
        """rdmakit: the descriptors that came with the message, now the caller's to close."""
        fds, self._fds = self._fds, []
        return fds

    def _close(self) -> None:
        for fd in self.take_fds():
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True, slots=True, kw_only=True)
class ComchEventConnectionStatusChanged:
    """``struct doca_comch_event_connection_status_changed`` (the callback's ``event``)."""

    connected: bool  # a connect event, or a disconnect event
    reason: str = ""  # rdmakit: why a connection ended
