"""A comch server and its clients on one progress engine, and what their callbacks saw."""

import time
from collections.abc import Callable
from typing import Any

from rdmakit.doca import (
    PE,
    ComchClient,
    ComchConnection,
    ComchEventConnectionStatusChanged,
    ComchEventMsgRecv,
    ComchServer,
    ComchTaskSend,
    CtxState,
    Dev,
    local_devinfo,
)

WAIT = 20.0  # seconds a condition may take on a loaded machine


class Side:
    """What one context's callbacks recorded: messages, connection events, send completions."""

    def __init__(self) -> None:
        self.msgs: list[tuple[bytes, int, ComchConnection]] = []
        self.connects: list[ComchConnection] = []
        self.disconnects: list[tuple[ComchConnection, str]] = []
        self.sent: list[ComchTaskSend] = []
        self.failed: list[ComchTaskSend] = []
        self.in_progress: list[bool] = []  # for each callback: was the engine progressing?

    def on_msg(self, event: ComchEventMsgRecv, data: bytes, msg_len: int, conn: ComchConnection) -> None:
        self.msgs.append((data, msg_len, conn))

    def on_sent(self, task: ComchTaskSend, task_ud: object, ctx_ud: object) -> None:
        self.sent.append(task)
        task.free()

    def on_send_error(self, task: ComchTaskSend, task_ud: object, ctx_ud: object) -> None:
        self.failed.append(task)
        task.free()

    def on_connect(self, event: ComchEventConnectionStatusChanged, conn: ComchConnection, ok: int) -> None:
        self.connects.append(conn)

    def on_disconnect(self, event: ComchEventConnectionStatusChanged, conn: ComchConnection, ok: int) -> None:
        self.disconnects.append((conn, event.reason))


class Comch:
    """A server on `service` and clients made with `client()`, all on `pe` with one local device."""

    def __init__(self, service: str, *, tasks: int = 8, **server_kw: Any) -> None:
        self.pe = PE()
        self.dev = Dev.open(local_devinfo("comch0"), pe=self.pe)
        self.server = ComchServer(self.dev, service, **server_kw)
        self.s = Side()
        self.clients: list[tuple[ComchClient, Side]] = []
        self._tasks = tasks
        self.configure(self.server, self.s)
        self.server.event_connection_status_changed_register(self.s.on_connect, self.s.on_disconnect)

    def configure(self, ctx: ComchServer | ComchClient, side: Side) -> None:
        self.pe.connect_ctx(ctx)
        ctx.task_send_set_conf(side.on_sent, side.on_send_error, self._tasks)
        ctx.event_msg_recv_register(side.on_msg)

    def client(self, start: bool = True, **kw: Any) -> tuple[ComchClient, Side]:
        c = ComchClient(self.dev, kw.pop("name", None) or self.server.address, **kw)
        side = Side()
        self.configure(c, side)
        self.clients.append((c, side))
        if start:
            c.start()
        return c, side

    def progress(self) -> bool:
        return self.pe.progress()

    def until(self, cond: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"never: {what}")
            if not self.pe.progress():
                time.sleep(0.001)

    def connected(self) -> tuple[ComchClient, Side, ComchConnection]:
        """A started server and a new client, both RUNNING; the server's connection to it."""
        if self.server.state is CtxState.IDLE:
            self.server.start()
        c, side = self.client()
        before = len(self.s.connects)
        self.until(lambda: c.state is CtxState.RUNNING and len(self.s.connects) > before, "connected")
        return c, side, self.s.connects[-1]

    def close(self) -> None:
        for c, _ in self.clients:
            c.close()
        self.server.close()
        self.dev.close()
        self.pe.close()
