"""The DMA Copy control protocol, sans-IO: its messages, and who may say what when.

DOCA's DMA Copy application steers a copy with messages on a comm channel;
here they are JSON objects (:func:`encode`, :func:`decode`), each a frozen
dataclass. The conversation, for a file on the host (copied to the DPU) and
for one on the DPU (copied from it)::

    host -> DPU   direction {file_in_host, file_size, transport, connection, file_id}
    DPU  -> host  direction {...}   (the same file_in_host and transport)
    host -> DPU   export {addr, length, descriptor, sha256, connection} (+ the memory's fd)
                  the DPU copies with DMA jobs
    to the DPU:   DPU -> host status {ok: true}, once the copy has the host's sha256
    from the DPU: DPU -> host copied {sha256}; host -> DPU status {ok: true}, once
                  the host's copy has that sha256

Before the end either side may send progress {phase, done, total} (it
restarts the peer's timeout) or status {ok: false, error} (it failed; the
conversation ends).

:data:`TRANSITIONS` is the whole state machine, ``(sender, state, event) ->
state``, as h11's ``_state.py`` is for HTTP/1.1: a message it does not list
is a protocol error of its sender (:class:`RemoteProtocolError` from the
peer, :class:`LocalProtocolError` from this side). Nothing here touches a
socket, a clock or a file.
"""

import dataclasses
import enum
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from rdmakit.cli.errors import CliError


class Role(enum.Enum):
    """A side of the copy; its value is how messages name it."""

    HOST = "host"
    DPU = "DPU"

    @property
    def peer(self) -> "Role":
        return Role.DPU if self is Role.HOST else Role.HOST


# -- messages -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Direction:
    """Which side has the file (the host asks, the DPU answers), and how the copy travels."""

    kind: ClassVar[str] = "direction"
    file_in_host: bool
    file_size: int  # the sender's file; 0 on the side that has none
    transport: str  # "shm" or "rdma"
    connection: str | None  # the DPU's RDMA connection descriptor over rdma
    file_id: str  # the host's file (boot id, device, inode): one file named by both sides shows


@dataclass(frozen=True, slots=True, kw_only=True)
class Export:
    """The host's memory for the copy (its file, or the destination), exported to the DPU."""

    kind: ClassVar[str] = "export"
    addr: int
    length: int
    descriptor: str | None  # None for an empty file
    sha256: str  # the host's file; "" when the DPU has the file
    connection: str | None  # the host's RDMA connection descriptor over rdma


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """``done`` of ``total`` bytes of ``phase`` (hash, copy, verify)."""

    kind: ClassVar[str] = "progress"
    phase: str
    done: int
    total: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Copied:
    """The DPU copied its file to the host; its sha256."""

    kind: ClassVar[str] = "copied"
    sha256: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    """How the sender's part ended: ok, or failed and why."""

    kind: ClassVar[str] = "status"
    ok: bool
    error: str = ""


Message = Direction | Export | Progress | Copied | Status
_KINDS: dict[str, type[Message]] = {cls.kind: cls for cls in (Direction, Export, Progress, Copied, Status)}


def _wire_fields(cls: type[Message]) -> tuple[tuple[str, tuple[type, ...]], ...]:
    """Each field of `cls` and the JSON types it takes, in the order they are checked and sent."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        out.append((f.name, typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)))
    return tuple(out)


_FIELDS = {kind: _wire_fields(cls) for kind, cls in _KINDS.items()}


# -- errors ---------------------------------------------------------------------------------------


class RemoteProtocolError(CliError):
    """The peer broke the protocol (its message is told back to it)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"protocol error: {message}")


class PeerFailed(CliError):
    """The peer reported a failure: nothing to tell it back."""


class LocalProtocolError(Exception):
    """This side tried to send what the protocol does not allow now: a bug in the program."""


# -- codec ----------------------------------------------------------------------------------------


def encode(msg: Message) -> bytes:
    fields = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    return json.dumps({"type": msg.kind, **fields}, separators=(",", ":")).encode()


def decode(data: bytes, sender: Role) -> Message:
    """The message in `data`; RemoteProtocolError when it is not one (unknown keys are ignored)."""
    try:
        raw: object = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        raise RemoteProtocolError(f"the {sender.value} sent a message that is not JSON") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str) or raw["type"] not in _KINDS:
        raise RemoteProtocolError(f"the {sender.value} sent an unknown message")
    kind: str = raw["type"]
    values: dict[str, Any] = {}
    for key, allowed in _FIELDS[kind]:
        if key == "error" and raw.get("ok", True):
            continue  # a status that is ok needs no error
        if key not in raw or type(raw[key]) not in allowed:
            raise RemoteProtocolError(f"bad {kind} message from the {sender.value} ({key})")
        values[key] = raw[key]
    return _KINDS[kind](**values)


# -- the state machine ----------------------------------------------------------------------------


class State(enum.Enum):
    """Where the conversation is; ``TO_DPU``: the host has the file, ``FROM_DPU``: the DPU has it."""

    START = enum.auto()  # the host asks
    ASKED_TO_DPU = enum.auto()  # the DPU answers
    ASKED_FROM_DPU = enum.auto()
    ANSWERED_TO_DPU = enum.auto()  # the host hashes its file and exports it
    ANSWERED_FROM_DPU = enum.auto()  # the host exports its destination
    COPYING_TO_DPU = enum.auto()  # the DPU copies and verifies, then says status
    COPYING_FROM_DPU = enum.auto()  # the DPU copies and hashes, then says copied
    COPIED = enum.auto()  # the host verifies, then says status
    DONE = enum.auto()
    FAILED = enum.auto()


class Event(enum.Enum):
    """What a message means to the state machine (:func:`event_of`)."""

    FILE_ON_HOST = enum.auto()  # direction, file_in_host
    FILE_ON_DPU = enum.auto()  # direction, not file_in_host
    EXPORT = enum.auto()
    PROGRESS = enum.auto()
    COPIED = enum.auto()
    OK = enum.auto()  # status, ok
    FAILED = enum.auto()  # status, not ok


def event_of(msg: Message) -> Event:
    match msg:
        case Direction():
            return Event.FILE_ON_HOST if msg.file_in_host else Event.FILE_ON_DPU
        case Export():
            return Event.EXPORT
        case Progress():
            return Event.PROGRESS
        case Copied():
            return Event.COPIED
        case Status():
            return Event.OK if msg.ok else Event.FAILED


ENDS = frozenset({State.DONE, State.FAILED})
#: Who speaks next in each state before the end (the other side only sends progress, or fails).
TURN = {
    State.START: Role.HOST,
    State.ASKED_TO_DPU: Role.DPU,
    State.ASKED_FROM_DPU: Role.DPU,
    State.ANSWERED_TO_DPU: Role.HOST,
    State.ANSWERED_FROM_DPU: Role.HOST,
    State.COPYING_TO_DPU: Role.DPU,
    State.COPYING_FROM_DPU: Role.DPU,
    State.COPIED: Role.HOST,
}
#: ``(sender, state, event) -> next state``: every message the protocol allows.
TRANSITIONS: dict[tuple[Role, State, Event], State] = {
    (Role.HOST, State.START, Event.FILE_ON_HOST): State.ASKED_TO_DPU,
    (Role.HOST, State.START, Event.FILE_ON_DPU): State.ASKED_FROM_DPU,
    (Role.DPU, State.ASKED_TO_DPU, Event.FILE_ON_HOST): State.ANSWERED_TO_DPU,
    (Role.DPU, State.ASKED_FROM_DPU, Event.FILE_ON_DPU): State.ANSWERED_FROM_DPU,
    (Role.HOST, State.ANSWERED_TO_DPU, Event.EXPORT): State.COPYING_TO_DPU,
    (Role.HOST, State.ANSWERED_FROM_DPU, Event.EXPORT): State.COPYING_FROM_DPU,
    (Role.DPU, State.COPYING_TO_DPU, Event.OK): State.DONE,
    (Role.DPU, State.COPYING_FROM_DPU, Event.COPIED): State.COPIED,
    (Role.HOST, State.COPIED, Event.OK): State.DONE,
    # Either side, before the end: progress keeps the state; a failure ends the conversation.
    **{(role, state, Event.PROGRESS): state for role in Role for state in TURN},
    **{(role, state, Event.FAILED): State.FAILED for role in Role for state in TURN},
}
_KIND_OF = {
    Event.FILE_ON_HOST: Direction.kind,
    Event.FILE_ON_DPU: Direction.kind,
    Event.EXPORT: Export.kind,
    Event.PROGRESS: Progress.kind,
    Event.COPIED: Copied.kind,
    Event.OK: Status.kind,
    Event.FAILED: Status.kind,
}
#: The message type a side waits for from the peer whose turn it is, in each state before the end.
_EXPECTED = {
    state: _KIND_OF[event] for (_, state, event) in TRANSITIONS if event not in (Event.PROGRESS, Event.FAILED)
}
#: A message from the side whose turn it is not: what the other side is doing meanwhile.
_MEANWHILE = {
    State.START: "before the host's request",
    State.ASKED_TO_DPU: "before the DPU's answer",
    State.ASKED_FROM_DPU: "before the DPU's answer",
    State.ANSWERED_TO_DPU: "before the host's export",
    State.ANSWERED_FROM_DPU: "before the host's export",
    State.COPYING_TO_DPU: "during the copy",
    State.COPYING_FROM_DPU: "during the copy",
    State.COPIED: "while the host verifies",
}


class Conversation:
    """One side's view of a DMA Copy conversation: `send` what it says, `receive` what its peer says.

    `transport` is this side's (shm or rdma): a peer's direction naming
    another is refused, as a usage error on both sides.
    """

    def __init__(self, role: Role, transport: str, state: State = State.START) -> None:
        self.role = role
        self.peer = role.peer
        self.transport = transport
        self.state = state

    @property
    def ended(self) -> bool:
        return self.state in ENDS

    def send(self, msg: Message) -> bytes:
        """`msg` as bytes for the channel; LocalProtocolError if this side may not say it now."""
        nxt = TRANSITIONS.get((self.role, self.state, event_of(msg)))
        if nxt is None:
            raise LocalProtocolError(f"the {self.role.value} may not send {msg.kind!r} in {self.state.name}")
        self.state = nxt
        return encode(msg)

    def receive_data(self, data: bytes, fds: int = 0) -> Message:
        """`receive` the message in `data`, which came with `fds` file descriptors."""
        msg = decode(data, self.peer)
        self.receive(msg, fds)
        return msg

    def receive(self, msg: Message, fds: int = 0) -> None:
        """Take `msg` from the peer: PeerFailed when it failed, RemoteProtocolError when it may not say it."""
        peer = self.peer.value
        event = event_of(msg)
        nxt = TRANSITIONS.get((self.peer, self.state, event))
        if event is Event.FAILED and nxt is not None:
            self.state = nxt
            assert isinstance(msg, Status)
            raise PeerFailed(f"the {peer} failed: {msg.error}")
        if event is Event.PROGRESS and nxt is not None:
            return
        if self.ended:
            raise RemoteProtocolError(f"the {peer} sent {msg.kind!r} after the copy ended")
        if TURN[self.state] is not self.peer:
            raise RemoteProtocolError(f"the {peer} sent {msg.kind!r} {_MEANWHILE[self.state]}")
        want = _EXPECTED[self.state]
        if msg.kind != want:
            raise RemoteProtocolError(f"expected {want!r} from the {peer}, got {msg.kind!r}")
        if fds and not isinstance(msg, Export):
            raise RemoteProtocolError(f"the {peer} sent file descriptors with {want!r}")
        if isinstance(msg, Direction) and msg.transport != self.transport:
            raise CliError(
                f"the {peer} copies over {msg.transport}, this side over {self.transport}: "
                "give both the same --transport"
            )
        if nxt is None:  # a direction whose file_in_host is not the host's
            raise RemoteProtocolError(f"the {peer} disagrees about where the file is")
        self.state = nxt
