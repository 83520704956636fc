"""The segment codec of the RoCE-UDP port: one interface, two implementations.

What the port asks of a codec, and nothing else:

- ``send_packet``: encode a ``Packet``, add its ICRC (IPv4 ID 0: one datagram)
  and send it in one call;
- ``check_decode``: check a received segment's header as ``decode`` does,
  then its ICRC (GSO segment ``idx``: IPv4 ID ``idx``, or any other ID below
  ``SEGMENT_IDS``: a batch the network split or GRO merged part of), and decode it;
- ``send_train``: send a run of MIDDLE packets (a ``Train``) in GSO batches;
- ``place_run``: check a run of received MIDDLE segments of a GRO batch and
  copy their payloads into the target memory.

:class:`~rdmakit.transport.codec_py.PythonCodec` is the reference;
``_fastpath.c`` does the same without a Python object per packet, and adds
``recv_runs`` (read the socket while what arrives continues a run),
``recv_raw`` (one read, without a readiness check first), ``small_request``
(check and execute a one-packet request for the engine) and ``small_response``
(check the one-packet response that completes a send). Which one a device
uses is chosen once, in :mod:`rdmakit.transport.fastpath`. The ICRC
of an ``n``-byte segment with index ``idx`` (BTH to ICRC) continues from
``states[n | idx << 16]``, or ``flow.state(n, idx)`` where that is missing
(RoCEv2 Annex A17.3.3). A segment whose ICRC differs from the one with ID
``idx`` by ``flow.id_shifts(n)[d]`` carried ID ``idx ^ d`` and is accepted
(:meth:`~rdmakit.wire.IcrcFlow.id_shift`: a corrupted segment passes with
probability 2^-26).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rdmakit.engine.armed import Disarmed, Handback
from rdmakit.engine.armed_req import NativeRequester
from rdmakit.wire import IcrcFlow, Packet

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from 3.12

#: ``recv_runs``' answer: (placed, last AckReq index or -1, reads, datagrams, GRO
#: batches, errno, the read the run did not take whole: (nbytes, seg, k, source), reads marked CE).
RecvRunsResult = tuple[int, int, int, int, int, int, tuple[int, int, int, tuple[str, int]] | None, int]


class RecvRuns(Protocol):
    def __call__(
        self,
        fd: int,
        buf: Buffer,
        v6: bool,
        src: tuple[str, int],
        states: Buffer,
        op: int,
        qpn: int,
        psn: int,
        mtu: int,
        dst: Buffer,
        dst_off: int,
        max_count: int,
        max_reads: int,
        shifts: Buffer = ...,
        /,
    ) -> RecvRunsResult: ...


class RecvRaw(Protocol):
    def __call__(self, fd: int, buf: Buffer, /) -> tuple[int, int, tuple[str, int], int, int] | None: ...


#: What ``QueuePair.rx_small`` says a one-packet request must match.
SmallTicket = tuple[int, int, int, bool, dict[int, tuple[int, int, int, memoryview]]]
#: ``small_request``'s answer when it executed the request: ``QueuePair.rx_small_done``'s arguments.
SmallDone = tuple[int, int, int, int, int, int, int]


class SmallRequest(Protocol):
    def __call__(
        self, seg: Buffer, idx: int, states: dict[int, int], flow: IcrcFlow, qpn: int, ticket: SmallTicket, /
    ) -> SmallDone | int: ...


#: What ``QueuePair.rx_small_resp`` says a one-packet response must match.
SmallRespTicket = tuple[int, int, int, memoryview | None, int]


class SmallResponse(Protocol):
    def __call__(
        self,
        seg: Buffer,
        idx: int,
        states: dict[int, int],
        flow: IcrcFlow,
        qpn: int,
        ticket: SmallRespTicket,
        /,
    ) -> tuple[int, int] | int: ...


class ArmedOwner(Protocol):
    """A responder armed natively (``_fastpath.Armed``; ``rdmakit.engine.armed``)."""

    @property
    def pending(self) -> bool: ...
    def rx(self, seg: Buffer, idx: int, states: dict[int, int], flow: IcrcFlow, /) -> bool: ...
    def take_ack(self) -> Packet | None: ...
    def send_ack(
        self, fd: int, addr: tuple[str, int], v6: bool, states: dict[int, int], flow: IcrcFlow, /
    ) -> int: ...
    def disarm(self) -> Disarmed: ...
    @property
    def replying(self) -> bool: ...
    def allow_reads(
        self, new_read: Callable[[int, int, int, int, int], None], new_atomic: Callable[[int, int], None], /
    ) -> None: ...
    def take_reply(self) -> list[Packet]: ...
    def send_reply(
        self, fd: int, addr: tuple[str, int], v6: bool, states: dict[int, int], flow: IcrcFlow, /
    ) -> tuple[int, int]: ...
    def handback(self) -> Handback: ...
    def bind(
        self,
        src: tuple[str, int],
        v6: bool,
        states: dict[int, int],
        flow: IcrcFlow,
        rxflow: object,
        qp: object,
        ids: object = None,
        counters: object = None,
        /,
    ) -> None: ...


class ArmedReqOwner(NativeRequester, Protocol):
    """A requester's native completer (``_fastpath.ArmedReq``; ``rdmakit.engine.armed_req``)."""

    def bind(
        self, src: tuple[str, int], v6: bool, states: dict[int, int], flow: IcrcFlow, rxflow: object, /
    ) -> None: ...


class SendAcks(Protocol):
    def __call__(
        self, fd: int, addr: tuple[str, int], v6: bool, gso: bool, states: dict[int, int], flow: IcrcFlow,
        owners: list[ArmedOwner], /,
    ) -> tuple[int, int, int]: ...  # fmt: skip


class PollArmed(Protocol):
    def __call__(
        self,
        fd: int,
        buf: Buffer,
        armed: dict[int, ArmedOwner],
        active: dict[int, Any],
        strikes: int,
        max_reads: int,
        reqs: dict[int, ArmedReqOwner] = ...,
        now: float = ...,
        touched: list[Any] = ...,
        /,
    ) -> tuple[int, tuple[int, int, tuple[str, int], int, int] | None]: ...


#: A port's part in ``WaitLoop``: (fd, buf, armed, active, strikes, reqs, touched, routes, visited).
LoopPort = tuple[
    int, "Buffer", dict[int, "ArmedOwner"], dict[int, Any], int, dict[int, "ArmedReqOwner"], list[Any],
    dict[int, tuple[tuple[str, int], bool, dict[int, int], IcrcFlow]], list[Any],
]  # fmt: skip


#: ``WaitLoop``'s answer: (reason, port index, [(taken, ACKs sent)] per port, raw, errno).
LoopResult = tuple[int, int, list[tuple[int, int]], tuple[int, int, tuple[str, int], int, int] | None, int]


class WaitLoop(Protocol):
    def __call__(
        self, epfd: int, ports: list[LoopPort], done: Callable[[], bool], spin_end: float, end: float,
        deadline: float, max_reads: int, /,
    ) -> LoopResult: ...  # fmt: skip


class Arm(Protocol):
    def __call__(
        self,
        qpn: int,
        dqpn: int,
        psn: int,
        msn: int,
        mtu: int,
        access: int,
        rtable: dict[int, tuple[int, int, int, memoryview]],
        syndrome: int,
        pd: object,
        stats: object,
        held: tuple[int, int, int] | None,
        msg: tuple[int, int, int, int, int, int] | None,
        /,
    ) -> ArmedOwner: ...


class ArmReq(Protocol):
    def __call__(
        self, qp: object, req: object, cq: object, completion: object, success: object, qpn: int, /
    ) -> ArmedReqOwner: ...


class PostSmall(Protocol):
    def __call__(
        self,
        fd: int,
        addr: tuple[str, int] | None,
        v6: bool,
        states: dict[int, int],
        flow: IcrcFlow,
        qp: object,
        now: float,
        overhead: int,
        /,
    ) -> int | bytes | None: ...


class PostSend(Protocol):
    def __call__(self, qp: object, wr: object, ctx: list[Any], /) -> object: ...


class SegmentCodec(Protocol):
    """The codec operations of the RoCE-UDP port (module docstring)."""

    #: ``"python"`` or ``"native"``.
    name: str
    #: Reads the socket while what arrives continues a run (native only); None: not offered.
    recv_runs: RecvRuns | None
    #: One non-blocking read of the socket into ``buf`` (native only; None: not offered):
    #: ``(nbytes, GRO segment size, source, errno, ECN field)``, None when the socket is empty.
    #: It takes ``UdpLink.recv_raw``'s place and needs no readiness check first.
    recv_raw: RecvRaw | None
    #: Checks a segment against ``QueuePair.rx_small``'s ticket and, if it is such a
    #: request, executes it (native only; None: not offered): ``rx_small_done``'s
    #: arguments, or -1 having done nothing (the generic path takes the packet).
    small_request: SmallRequest | None
    #: Checks a segment against ``QueuePair.rx_small_resp``'s ticket and, if it is that
    #: response, places its data (native only; None: not offered): ``(opcode, PSN)`` for
    #: ``rx_small_resp_done``, or -1 having done nothing.
    small_response: SmallResponse | None
    #: Takes a responder's steady state from ``QueuePair.arm_ticket`` (native only; None:
    #: not offered): the owner then executes in-order WRITE ONLY requests and holds their ACK.
    arm: Arm | None
    #: The device poll for armed responders (native only; None: not offered): reads the
    #: socket, executes each datagram an armed responder bound to its source takes, and
    #: hands back the first other read as ``recv_raw`` would: ``(taken, raw)``.
    poll_armed: PollArmed | None
    #: Sends the ACKs several armed responders hold, to one peer, in GSO batches (native
    #: only; None: not offered): ``(sent, sends, errno)``; what a full socket refused stays held.
    send_acks: SendAcks | None
    #: Makes a QP's native owner of its common ACKs from ``QueuePair.arm_req_ticket``
    #: (native only; None: not offered): it retires in-order ACKs of SEND/WRITE WQEs.
    arm_req: ArmReq | None
    #: Sends a QP's one fresh SEND or WRITE of at most an MTU in the call that posted it
    #: (native only; None: not offered; ``_nativepost.c``): None having done nothing, else
    #: ``tx_small``'s effect and sendmsg's errno, or the datagram when ``fd`` < 0 or the
    #: socket would block.
    post_small: PostSmall | None
    #: The device poll loop (native only; None: not offered; ``_nativeloop.c``): ``Driver.run_until``'s
    #: idle wait, spin then block, taking what the armed paths take without a return per datagram:
    #: ``(reason, port index, [(taken, ACKs sent)] per port, raw, errno)``.
    wait_loop: WaitLoop | None

    #: ``QueuePair.post_send`` in one native call for the requests native posting takes
    #: (native only; None: not offered; ``_nativepostsend.c``): None having done nothing,
    #: else the work request queued, checked, sent and counted as ``post_send``, its doorbell
    #: and ``post_small`` would have: True, or sendmsg's errno or the datagram for the
    #: context's ``after``.
    post_send: PostSend | None

    def send_packet(
        self, sock: socket.socket, addr: tuple[str, int], pkt: Packet, states: dict[int, int], flow: IcrcFlow
    ) -> int:
        """0: sent; > 0: the errno of the send; -1: not sent, ``encode_headers`` says why."""
        ...

    def check_decode(self, seg: Buffer, idx: int, states: dict[int, int], flow: IcrcFlow) -> Packet | int:
        """The decoded packet; 1: its header is refused (no ICRC computed); 0: its ICRC does not check."""
        ...

    def send_train(
        self,
        sock: socket.socket,
        addr: tuple[str, int],
        gso: bool,
        op: int,
        dqpn: int,
        psn: int,
        count: int,
        payload: Buffer,
        mtu: int,
        ack_first: int,
        ack_every: int,
        states: Buffer,
        tail: Buffer | None = None,
    ) -> tuple[int, int]:
        """Packet ``i`` carries PSN ``psn + i`` and payload bytes ``[i*mtu, (i+1)*mtu)``;
        AckReq from ``ack_first`` (-1: never) every ``ack_every``. They leave in GSO
        batches of ``min(64, 65507 // size)`` (one per send without GSO), segment
        ``k`` of a batch with ICRC state ``states[k]``. ``tail``: one more datagram of
        the same size, its ICRC that of segment ``count % per``, sent as the last
        batch's last segment (GSO, and that batch not full: else ValueError) and
        counted. Returns how many packets the kernel took and the errno that stopped
        it (0: none)."""
        ...

    def place_run(
        self,
        buf: Buffer,
        nbytes: int,
        seg: int,
        k0: int,
        states: Buffer,
        op: int,
        qpn: int,
        psn: int,
        mtu: int,
        dst: Buffer,
        dst_off: int,
        max_count: int,
        shifts: Buffer = ...,
    ) -> tuple[int, int]:
        """From segment ``k0`` of ``buf[:nbytes]`` (segments of ``seg`` bytes), accept
        segments while each is a MIDDLE of opcode ``op`` with TVer 0, no pad, a valid
        P_Key, destination ``qpn``, PSN ``psn + i``, exactly BTH + ``mtu`` + ICRC bytes
        and an ICRC that checks from ``states[k]`` (or differs from that by one of
        ``shifts[1:]``, ``IcrcFlow.id_shifts``: another IPv4 ID); copy each payload to
        ``dst[dst_off + i*mtu]``. At most ``max_count``. Returns how many were accepted
        and the index of the last accepted one that asked for an ACK (-1: none)."""
        ...
