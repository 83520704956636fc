"""The optional native data plane of the UDP soft device (``_fastpath.c``).

What it does, packet for packet, the pure-Python path does too; it only does
it without a Python object per packet: build the BTH and ICRC of a run of
MIDDLE packets and hand them to the kernel in GSO batches (``send_train``),
and check and place a run of received MIDDLE segments of a GRO batch
(``place_run``); and for the single packets of small operations, encode, add
the ICRC and send in one call (``send_packet``), and check the ICRC and decode
(``check_decode``), with ``rdmakit.wire.packet``'s tables; read the socket
without a readiness check first (``recv_raw``); and for the engine, check and
execute a one-packet request (``small_request``) or check the one-packet
response that completes a send (``small_response``) against the ticket the
engine gives (``QueuePair.rx_small``, ``rx_small_resp``), whose rules stay the
engine's (``tests/engine/test_engine_small_native.py``). It is built with
the package when a C compiler is there (``setup.py``; the build goes on
without it otherwise). Set ``RDMAKIT_PURE_PYTHON=1`` to run without it;
``native`` is None then.

This module is the one place that chooses, at import: ``CODEC`` is the
:class:`~rdmakit.transport.codec.SegmentCodec` devices use (``NATIVE`` when
there is one, else ``PYTHON``, the reference in
:mod:`rdmakit.transport.codec_py`).

Its CRC-32 folds 256 bits at a time with VPCLMULQDQ where the CPU has it and
AVX2, else 128 bits with PCLMULQDQ, else uses tables (``native.CLMUL``: 2, 1,
0). ``RDMAKIT_NO_VPCLMUL=1`` (any value) keeps it to PCLMULQDQ and
``RDMAKIT_NO_CLMUL=1`` to the tables (read once, at import).
"""

from __future__ import annotations

import os
import socket
from types import ModuleType
from typing import TYPE_CHECKING

from rdmakit.wire import IcrcFlow, Packet

from .codec import (
    Arm,
    ArmReq,
    PollArmed,
    PostSend,
    PostSmall,
    RecvRaw,
    RecvRuns,
    SegmentCodec,
    SendAcks,
    SmallRequest,
    SmallResponse,
    WaitLoop,
)
from .codec_py import PythonCodec

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from 3.12


def _load() -> ModuleType | None:
    if os.environ.get("RDMAKIT_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _fastpath
    except ImportError:
        return None
    from rdmakit.engine import Access
    from rdmakit.engine.timers import MAX_MSG_SIZE
    from rdmakit.wire import AETH, CODEC_LAYOUTS, RETH, AtomicETH, Opcode, Packet

    _fastpath.init_codec(Packet, RETH, AETH, AtomicETH, CODEC_LAYOUTS)
    _fastpath.init_small(
        Opcode.RDMA_WRITE_ONLY, Opcode.RDMA_READ_REQUEST, Opcode.COMPARE_SWAP, Opcode.FETCH_ADD,
        Access.REMOTE_WRITE, Access.REMOTE_READ, Access.REMOTE_ATOMIC, MAX_MSG_SIZE,
    )  # fmt: skip
    _fastpath.init_small_response(
        Opcode.ACKNOWLEDGE, Opcode.RDMA_READ_RESPONSE_ONLY, Opcode.ATOMIC_ACKNOWLEDGE
    )
    _fastpath.Armed.init(Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE, Opcode.RDMA_WRITE_LAST)
    _fastpath.Armed.init_read(
        Opcode.RDMA_READ_REQUEST, Opcode.RDMA_READ_RESPONSE_FIRST, Opcode.RDMA_READ_RESPONSE_MIDDLE,
        Opcode.RDMA_READ_RESPONSE_LAST, Opcode.RDMA_READ_RESPONSE_ONLY,
    )  # fmt: skip
    return _fastpath


#: The native module, or None (not built, or switched off).
native: ModuleType | None = _load()


class NativeCodec:
    """The segment codec of ``_fastpath.c`` (the functions take the socket's descriptor)."""

    name = "native"

    def __init__(self, mod: ModuleType) -> None:
        self.mod = mod
        # No socket involved: the C functions themselves, without a Python frame.
        self.check_decode = mod.check_decode
        self.place_run = mod.place_run
        self.recv_runs: RecvRuns | None = mod.recv_runs
        self.recv_raw: RecvRaw | None = mod.recv_raw
        self.small_request: SmallRequest | None = mod.small_request
        self.small_response: SmallResponse | None = mod.small_response
        self.arm: Arm | None = mod.Armed
        self.poll_armed: PollArmed | None = mod.poll_armed
        self.send_acks: SendAcks | None = mod.send_acks
        self.arm_req: ArmReq | None = mod.ArmedReq
        self.post_small: PostSmall | None = mod.post_small
        self.wait_loop: WaitLoop | None = mod.wait_loop
        self.post_send: PostSend | None = mod.post_send

    def send_packet(
        self, sock: socket.socket, addr: tuple[str, int], pkt: Packet, states: dict[int, int], flow: IcrcFlow
    ) -> int:
        v6 = ":" in addr[0]  # an IPv6 address (the socket's family property costs an enum per packet)
        return int(self.mod.send_packet(sock.fileno(), addr, v6, pkt, states, flow))

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
        v6 = ":" in addr[0]
        fd = sock.fileno()
        args = (fd, addr, v6, gso, op, dqpn, psn, count, payload, mtu, ack_first, ack_every, states)
        sent, err = self.mod.send_train(*args) if tail is None else self.mod.send_train(*args, tail)
        return int(sent), int(err)


#: The pure-Python codec (always there: the reference, and ``bulk=False``'s).
PYTHON: SegmentCodec = PythonCodec()
#: The native codec, or None (not built, or switched off).
NATIVE: SegmentCodec | None = NativeCodec(native) if native is not None else None
#: The codec devices use.
CODEC: SegmentCodec = NATIVE if NATIVE is not None else PYTHON


def describe() -> str:
    """One line for ``rdmakit devices --verbose`` and the benchmark header."""
    if native is None:
        why = "switched off" if os.environ.get("RDMAKIT_PURE_PYTHON", "") not in ("", "0") else "not built"
        return f"pure Python ({why})"
    crc = {2: "VPCLMULQDQ", 1: "PCLMULQDQ"}.get(int(native.CLMUL), "table")
    return f"native ({crc} CRC-32)"
