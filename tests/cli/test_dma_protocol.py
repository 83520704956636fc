"""The DMA Copy control protocol without sockets or processes: its codec and its transition table.

The error texts are the ones ``rdmakit dma-copy`` prints (after ``rdmakit
dma-copy: ``) when a peer says the wrong thing at that point.
"""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmakit.cli.dma_protocol import (
    TRANSITIONS,
    Conversation,
    Copied,
    Direction,
    Event,
    Export,
    LocalProtocolError,
    Message,
    PeerFailed,
    Progress,
    RemoteProtocolError,
    Role,
    State,
    Status,
    decode,
    encode,
    event_of,
)
from rdmakit.cli.errors import CliError

HOST, DPU = Role.HOST, Role.DPU

#: One message for each event.
SAMPLE: dict[Event, Message] = {
    Event.FILE_ON_HOST: Direction(
        file_in_host=True, file_size=5, transport="shm", connection=None, file_id="b:1:2"
    ),
    Event.FILE_ON_DPU: Direction(
        file_in_host=False, file_size=0, transport="shm", connection=None, file_id=""
    ),
    Event.EXPORT: Export(addr=4096, length=5, descriptor="{}", sha256="ab", connection=None),
    Event.PROGRESS: Progress(phase="copy", done=1, total=5),
    Event.COPIED: Copied(sha256="ab"),
    Event.OK: Status(ok=True),
    Event.FAILED: Status(ok=False, error="disk full"),
}

# -- codec: (message, bytes), both ways ------------------------------------------------------------

CODEC = [
    (
        SAMPLE[Event.FILE_ON_HOST],
        b'{"type":"direction","file_in_host":true,"file_size":5,"transport":"shm","connection":null,'
        b'"file_id":"b:1:2"}',
    ),
    (
        Direction(file_in_host=False, file_size=7, transport="rdma", connection="c", file_id=""),
        b'{"type":"direction","file_in_host":false,"file_size":7,"transport":"rdma","connection":"c",'
        b'"file_id":""}',
    ),
    (
        SAMPLE[Event.EXPORT],
        b'{"type":"export","addr":4096,"length":5,"descriptor":"{}","sha256":"ab","connection":null}',
    ),
    (SAMPLE[Event.PROGRESS], b'{"type":"progress","phase":"copy","done":1,"total":5}'),
    (SAMPLE[Event.COPIED], b'{"type":"copied","sha256":"ab"}'),
    (SAMPLE[Event.OK], b'{"type":"status","ok":true,"error":""}'),
    (SAMPLE[Event.FAILED], b'{"type":"status","ok":false,"error":"disk full"}'),
]


@pytest.mark.parametrize(("msg", "data"), CODEC, ids=lambda v: type(v).__name__)
def test_encode(msg: Message, data: bytes) -> None:
    assert encode(msg) == data


@pytest.mark.parametrize(("msg", "data"), CODEC, ids=lambda v: type(v).__name__)
def test_decode(msg: Message, data: bytes) -> None:
    assert decode(data, HOST) == msg


def test_decode_ignores_unknown_keys_and_an_ok_status_needs_no_error() -> None:
    assert decode(b'{"type":"copied","sha256":"ab","extra":[1]}', DPU) == Copied(sha256="ab")
    assert decode(b'{"type":"status","ok":true}', DPU) == Status(ok=True, error="")


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\xff{", "protocol error: the DPU sent a message that is not JSON"),
        (b"{", "protocol error: the DPU sent a message that is not JSON"),
        (b"[]", "protocol error: the DPU sent an unknown message"),
        (b'{"type":"hello"}', "protocol error: the DPU sent an unknown message"),
        (b'{"type":3}', "protocol error: the DPU sent an unknown message"),
        (b'{"sha256":"ab"}', "protocol error: the DPU sent an unknown message"),
        (b'{"type":"copied"}', "protocol error: bad copied message from the DPU (sha256)"),
        (b'{"type":"copied","sha256":1}', "protocol error: bad copied message from the DPU (sha256)"),
        (b'{"type":"status","error":"x"}', "protocol error: bad status message from the DPU (ok)"),
        (b'{"type":"status","ok":false}', "protocol error: bad status message from the DPU (error)"),
        (b'{"type":"status","ok":1,"error":""}', "protocol error: bad status message from the DPU (ok)"),
        (
            b'{"type":"progress","phase":"copy","done":true,"total":5}',
            "protocol error: bad progress message from the DPU (done)",
        ),
        (
            b'{"type":"export","addr":1,"length":5.0,"descriptor":null,"sha256":"","connection":null}',
            "protocol error: bad export message from the DPU (length)",
        ),
        (
            b'{"type":"direction","file_in_host":true,"file_size":5,"transport":"shm","file_id":""}',
            "protocol error: bad direction message from the DPU (connection)",
        ),
    ],
)
def test_decode_refuses(data: bytes, error: str) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        decode(data, DPU)
    assert str(exc.value) == error


def test_decode_refuses_nesting_deeper_than_the_parser() -> None:
    """A peer's 100,000 nested arrays are a protocol error, not a RecursionError traceback."""
    with pytest.raises(RemoteProtocolError) as exc:
        decode(b"[" * 100_000 + b"]" * 100_000, DPU)
    assert str(exc.value) == "protocol error: the DPU sent a message that is not JSON"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    ["type", "file_in_host", "file_size", "transport", "connection", "file_id", "addr", "length",
     "descriptor", "sha256", "phase", "done", "total", "ok", "error"]
)  # fmt: skip
KINDS = st.sampled_from(["direction", "export", "progress", "copied", "status"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.binary(max_size=64)
    | st.dictionaries(FIELDS, JSON | KINDS, max_size=8).map(lambda d: json.dumps(d).encode())
)
def test_decode_gives_a_message_or_the_protocol_error(data: bytes) -> None:
    try:
        msg = decode(data, HOST)
    except RemoteProtocolError as exc:
        error = str(exc)
    else:
        assert decode(encode(msg), HOST) == msg
        return
    assert error.startswith("protocol error: ")


# -- the transition table --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sender", "state", "event"), sorted(TRANSITIONS, key=str), ids=lambda v: getattr(v, "name", str(v))
)
def test_every_legal_transition(sender: Role, state: State, event: Event) -> None:
    msg = SAMPLE[event]
    assert event_of(msg) is event
    nxt = TRANSITIONS[sender, state, event]
    speaking = Conversation(sender, "shm", state)
    assert speaking.send(msg) == encode(msg)
    assert speaking.state is nxt
    hearing = Conversation(sender.peer, "shm", state)
    if event is Event.FAILED:
        with pytest.raises(PeerFailed) as exc:
            hearing.receive_data(encode(msg))
        assert str(exc.value) == f"the {sender.value} failed: disk full"
    else:
        assert hearing.receive_data(encode(msg)) == msg
    assert hearing.state is nxt


#: What a side that waits for its peer's message reports for anything else (progress and a
#: failure are always heard): (receiver, state) -> the error, for a message of type {got}.
WAITING = {
    (HOST, State.ASKED_TO_DPU): "protocol error: expected 'direction' from the DPU, got {got!r}",
    (HOST, State.ASKED_FROM_DPU): "protocol error: expected 'direction' from the DPU, got {got!r}",
    (HOST, State.COPYING_TO_DPU): "protocol error: expected 'status' from the DPU, got {got!r}",
    (HOST, State.COPYING_FROM_DPU): "protocol error: expected 'copied' from the DPU, got {got!r}",
    (DPU, State.START): "protocol error: expected 'direction' from the host, got {got!r}",
    (DPU, State.ANSWERED_TO_DPU): "protocol error: expected 'export' from the host, got {got!r}",
    (DPU, State.ANSWERED_FROM_DPU): "protocol error: expected 'export' from the host, got {got!r}",
    (DPU, State.COPYING_TO_DPU): "protocol error: the host sent {got!r} during the copy",
    (DPU, State.COPYING_FROM_DPU): "protocol error: the host sent {got!r} during the copy",
    (DPU, State.COPIED): "protocol error: expected 'status' from the host, got {got!r}",
}
#: The DPU answers with the host's file_in_host.
DISAGREES = {
    (State.ASKED_TO_DPU, Event.FILE_ON_DPU),
    (State.ASKED_FROM_DPU, Event.FILE_ON_HOST),
}
#: Every (sender, state, event) the table does not list.
ILLEGAL = [
    (sender, state, event)
    for sender in Role
    for state in State
    for event in Event
    if (sender, state, event) not in TRANSITIONS
]


@pytest.mark.parametrize(("sender", "state", "event"), ILLEGAL, ids=lambda v: v.name)
def test_an_illegal_message_is_the_peers_protocol_error(sender: Role, state: State, event: Event) -> None:
    msg = SAMPLE[event]
    receiver = sender.peer
    conv = Conversation(receiver, "shm", state)
    with pytest.raises(RemoteProtocolError) as exc:
        conv.receive_data(encode(msg))
    assert conv.state is state
    if receiver is HOST and (state, event) in DISAGREES:
        assert str(exc.value) == "protocol error: the DPU disagrees about where the file is"
    elif (receiver, state) in WAITING:
        assert str(exc.value) == WAITING[receiver, state].format(got=msg.kind)
    else:  # the program never reads then: its own turn, or the end
        assert str(exc.value).startswith(f"protocol error: the {sender.value} sent {msg.kind!r} ")


@pytest.mark.parametrize(("sender", "state", "event"), ILLEGAL, ids=lambda v: v.name)
def test_an_illegal_send_is_this_sides_error(sender: Role, state: State, event: Event) -> None:
    conv = Conversation(sender, "shm", state)
    with pytest.raises(LocalProtocolError):
        conv.send(SAMPLE[event])
    assert conv.state is state


def test_file_descriptors_come_only_with_an_export() -> None:
    conv = Conversation(HOST, "shm", State.ASKED_TO_DPU)
    with pytest.raises(RemoteProtocolError) as exc:
        conv.receive_data(encode(SAMPLE[Event.FILE_ON_HOST]), fds=1)
    assert str(exc.value) == "protocol error: the DPU sent file descriptors with 'direction'"
    conv = Conversation(DPU, "shm", State.ANSWERED_TO_DPU)
    conv.receive_data(encode(SAMPLE[Event.EXPORT]), fds=1)
    assert conv.state is State.COPYING_TO_DPU


@pytest.mark.parametrize(("receiver", "state"), [(HOST, State.ASKED_TO_DPU), (DPU, State.START)])
def test_both_sides_use_one_transport(receiver: Role, state: State) -> None:
    conv = Conversation(receiver, "shm", state)
    theirs = Direction(file_in_host=True, file_size=5, transport="rdma", connection="c", file_id="")
    with pytest.raises(CliError) as exc:
        conv.receive(theirs)
    assert not isinstance(exc.value, RemoteProtocolError)
    assert str(exc.value) == (
        f"the {receiver.peer.value} copies over rdma, this side over shm: give both the same --transport"
    )
    assert conv.state is state


def test_the_transport_is_checked_before_where_the_file_is() -> None:
    conv = Conversation(HOST, "shm", State.ASKED_TO_DPU)
    theirs = Direction(file_in_host=False, file_size=0, transport="rdma", connection="c", file_id="")
    with pytest.raises(CliError, match="give both the same --transport"):
        conv.receive(theirs)


@pytest.mark.parametrize("host_has", [True, False], ids=["to-dpu", "from-dpu"])
def test_a_whole_conversation(host_has: bool) -> None:
    host, dpu = Conversation(HOST, "shm"), Conversation(DPU, "shm")

    def say(speaker: Conversation, hearer: Conversation, msg: Message) -> None:
        assert hearer.receive_data(speaker.send(msg)) == msg
        assert speaker.state is hearer.state

    direction = SAMPLE[Event.FILE_ON_HOST if host_has else Event.FILE_ON_DPU]
    say(host, dpu, direction)
    say(dpu, host, direction)
    say(host, dpu, Progress(phase="hash", done=5, total=5))
    say(host, dpu, SAMPLE[Event.EXPORT])
    say(dpu, host, Progress(phase="copy", done=5, total=5))
    if host_has:
        say(dpu, host, Status(ok=True))
    else:
        say(dpu, host, Copied(sha256="ab"))
        say(host, dpu, Progress(phase="verify", done=5, total=5))
        say(host, dpu, Status(ok=True))
    assert host.state is State.DONE
    assert dpu.state is State.DONE
