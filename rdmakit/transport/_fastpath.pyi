from collections.abc import Callable
from typing import Any

from typing_extensions import Buffer

from rdmakit.engine.armed import Disarmed, Handback
from rdmakit.wire.icrc import IcrcFlow
from rdmakit.wire.packet import Packet

CLMUL: int

def crc32(data: Buffer, value: int = 0, /) -> int: ...
def send_train(
    fd: int,
    addr: tuple[str, int],
    v6: bool,
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
    tail: Buffer = ...,
    /,
) -> tuple[int, int]: ...
def place_run(
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
    /,
) -> tuple[int, int]: ...
def icrc_one_pass(state: int, segment: Buffer, /) -> bool: ...
def recv_runs(
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
    /,
) -> tuple[int, int, int, int, int, int, tuple[int, int, int, tuple[str, int]] | None]: ...
def recv_raw(fd: int, buf: Buffer, /) -> tuple[int, int, tuple[str, int], int] | None: ...
def init_small(
    write_only: int,
    read_request: int,
    compare_swap: int,
    fetch_add: int,
    remote_write: int,
    remote_read: int,
    remote_atomic: int,
    max_msg: int,
    /,
) -> None: ...
def small_request(
    seg: Buffer,
    idx: int,
    states: dict[int, int],
    flow: IcrcFlow,
    qpn: int,
    ticket: tuple[int, int, int, bool, dict[int, tuple[int, int, int, memoryview]]],
    /,
) -> tuple[int, int, int, int, int, int, int] | int: ...
def init_small_response(ack: int, read_response_only: int, atomic_ack: int, /) -> None: ...
def small_response(
    seg: Buffer,
    idx: int,
    states: dict[int, int],
    flow: IcrcFlow,
    qpn: int,
    ticket: tuple[int, int, int, memoryview | None, int],
    /,
) -> tuple[int, int] | int: ...
def init_codec(
    packet: type, reth: type, aeth: type, atomic_eth: type, layouts: dict[int, tuple[Any, int, int]], /
) -> None: ...
def send_packet(
    fd: int, addr: tuple[str, int], v6: bool, pkt: Packet, states: dict[int, int], flow: IcrcFlow, /
) -> int: ...
def check_decode(seg: Buffer, idx: int, states: dict[int, int], flow: IcrcFlow, /) -> Packet | int: ...
def poll_armed(
    fd: int, buf: Buffer, armed: dict[int, Armed], active: dict[int, Any], strikes: int, max_reads: int, /
) -> tuple[int, tuple[int, int, tuple[str, int], int, int] | None]: ...

class Armed:
    """A responder's expected PSN and MSN, owned natively while armed (``_nativeqp.c``)."""

    def __init__(
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
    ) -> None: ...
    @staticmethod
    def init(write_first: int, write_middle: int, write_last: int, /) -> None: ...
    @staticmethod
    def init_read(request: int, first: int, middle: int, last: int, only: int, /) -> None: ...
    @property
    def pending(self) -> bool: ...
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
    def rx(self, seg: Buffer, idx: int, states: dict[int, int], flow: IcrcFlow, /) -> bool: ...
    def take_ack(self) -> Packet | None: ...
    def send_ack(
        self, fd: int, addr: tuple[str, int], v6: bool, states: dict[int, int], flow: IcrcFlow, /
    ) -> int: ...
    def disarm(self) -> Disarmed: ...
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
