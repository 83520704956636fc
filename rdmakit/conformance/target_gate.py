"""The agent's door: control connections in their handshake, side by side, each with its own deadline.

Anyone can connect to the agent's port. A connection that never sends its
hello (or its proof) holds nothing but its own slot until its deadline
(``control.HANDSHAKE_SECONDS`` from its accept): the handshakes of other
connections go on beside it, so idle sockets without the secret cannot
keep a tester out. At most `MAX_HANDSHAKES` wait at once; a new connection
past that closes the oldest waiting one, which has had the longest chance.
"""

from collections.abc import Callable
from dataclasses import dataclass

from rdmakit.transport.comm import Listener, MessageSocket

from . import control
from .control import ControlError

__all__ = ["MAX_HANDSHAKES", "Gate"]

MAX_HANDSHAKES = 16


@dataclass(slots=True)
class _Waiting:
    sock: MessageSocket
    deadline: float
    transcript: bytes | None = None  # set once the tester's hello was answered


class Gate:
    """Handshakes in progress on `listener`; `step` returns a tester that passed one."""

    def __init__(
        self, listener: Listener, secret: bytes, say: Callable[[str], None],
        seconds: float = control.HANDSHAKE_SECONDS,
    ) -> None:  # fmt: skip
        self.listener, self.secret, self.say = listener, secret, say
        self.seconds = seconds  # each handshake's bound from its accept
        self.waiting: list[_Waiting] = []

    def fds(self) -> list[int]:
        return [self.listener.fileno(), *(w.sock.fileno() for w in self.waiting)]

    def wait(self, now: float) -> float | None:
        """Seconds until the next handshake deadline (None: none waits)."""
        return max(0.0, min(w.deadline for w in self.waiting) - now) if self.waiting else None

    def step(self, readable: set[int], now: float) -> MessageSocket | None:
        """Accept what knocked, advance the handshakes that have bytes, drop the late ones."""
        if self.listener.fileno() in readable and (sock := self.listener.accept(0)) is not None:
            if len(self.waiting) >= MAX_HANDSHAKES:
                self._drop(self.waiting[0], f"{MAX_HANDSHAKES} handshakes wait; the oldest is closed")
            self.waiting.append(_Waiting(sock, now + self.seconds))
        for w in list(self.waiting):
            if w.sock.fileno() in readable:
                try:
                    if self._advance(w):
                        self.waiting.remove(w)
                        return w.sock
                except (ControlError, OSError) as e:
                    self._drop(w, str(e))
                    continue
            if now > w.deadline:
                self._drop(w, f"no handshake within {self.seconds:g} s")
        return None

    def _advance(self, w: _Waiting) -> bool:
        """Handle what `w` sent; True once its proof checked."""
        while (got := w.sock.recv(0)) is not None:
            if w.transcript is None:
                w.transcript = control.server_hello(w.sock, self.secret, got[0])
            else:
                control.server_finish(w.sock, self.secret, w.transcript, got[0])
                return True
        return False

    def _drop(self, w: _Waiting, why: str) -> None:
        self.say(f"refused a control connection from {w.sock.peer}: {why}")
        w.sock.close()
        self.waiting.remove(w)

    def close(self) -> None:
        for w in list(self.waiting):
            w.sock.close()
        self.waiting.clear()
