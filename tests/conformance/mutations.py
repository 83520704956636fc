"""Deliberate engine bugs, for the suite's own test: each one must make some case FAIL.

Run as ``python -m tests.conformance.mutations NAME AGENT-ARGS...``: applies
the mutation (a wrapper around one engine method, in this process only), then
runs ``rdmakit conformance-target AGENT-ARGS``. The suite then drives that
agent like any other, through ``--target``. They show that the suite notices
what it claims to check.
"""

import sys
from collections.abc import Callable
from typing import Any

from rdmakit.engine import completer as completer_mod
from rdmakit.engine import qp as qp_mod
from rdmakit.engine import requester as req_mod
from rdmakit.engine import responder as resp_mod
from rdmakit.wire import MIDDLE_OPCODES, Kind, NakCode, Opcode


def _no_atomic_replay() -> None:
    """A duplicate atomic executes again instead of being answered from the cache."""
    orig = resp_mod.Responder._duplicate

    def dup(self: Any, pkt: Any, info: Any) -> None:
        if info.kind is Kind.ATOMIC:
            psn = self.psn
            self.psn = pkt.psn
            self.msn = (self.msn - 1) & 0xFFFFFF
            self._atomic(pkt)
            self.psn = self.ack_psn = psn
            return
        orig(self, pkt, info)

    resp_mod.Responder._duplicate = dup  # type: ignore[method-assign]


def _nak_61_for_sequence() -> None:
    """A PSN sequence error is NAKed as an invalid request (syndrome 0x61)."""
    orig = resp_mod.Responder.queue_nak

    def nak(self: Any, code: NakCode, psn: int) -> None:
        orig(self, NakCode.INVALID_REQUEST if code == NakCode.PSN_SEQUENCE_ERROR else code, psn)

    resp_mod.Responder.queue_nak = nak  # type: ignore[method-assign]


def _no_rnr_nak() -> None:
    """No receive posted: the request is dropped silently instead of RNR NAKed."""
    orig = resp_mod.Responder._queue

    def queue(self: Any, pkt: Any) -> None:
        if pkt.opcode is Opcode.ACKNOWLEDGE and pkt.aeth is not None and pkt.aeth.syndrome >> 5 == 1:
            return
        orig(self, pkt)

    resp_mod.Responder._queue = queue  # type: ignore[method-assign]


def _ignore_rnr_retry() -> None:
    """rnr_retry never runs out: every RNR NAK is waited out and retried."""
    orig = req_mod.Requester.rnr_nak

    def rnr(self: Any, now: float, code: int) -> None:
        self.rnr_left = 7
        orig(self, now, code)

    req_mod.Requester.rnr_nak = rnr  # type: ignore[method-assign]


def _no_implied_nak() -> None:
    """An ACK past an outstanding READ or atomic is ignored instead of starting a retry."""
    orig = completer_mod.on_response

    def on_response(qp: Any, req: Any, pkt: Any, info: Any, now: float) -> None:
        sq = req.sq
        if sq and pkt.opcode is Opcode.ACKNOWLEDGE and sq[0].kind != req_mod.SEND_WRITE:
            d = (pkt.psn - sq[0].last_psn) & 0xFFFFFF
            if 0 < d < 0x800000:
                return
        orig(qp, req, pkt, info, now)

    qp_mod.on_response = on_response  # type: ignore[attr-defined]  # where QueuePair calls it


def _accept_bad_middle() -> None:
    """A MIDDLE request of the wrong length is accepted (cut or padded to the MTU)."""
    orig = qp_mod.QueuePair.receive

    def receive(self: Any, pkt: Any, now: float) -> None:
        if pkt.opcode in MIDDLE_OPCODES and pkt.opcode is not Opcode.RDMA_READ_RESPONSE_MIDDLE:
            mtu = self.resp.mtu
            n = len(pkt.payload)
            if n != mtu:
                pkt = pkt._replace(payload=bytes(pkt.payload[:mtu]) + bytes(max(mtu - n, 0)))
        orig(self, pkt, now)

    qp_mod.QueuePair.receive = receive  # type: ignore[method-assign]


MUTATIONS: dict[str, Callable[[], None]] = {
    "no-atomic-replay": _no_atomic_replay,
    "nak-61-for-sequence": _nak_61_for_sequence,
    "no-rnr-nak": _no_rnr_nak,
    "ignore-rnr-retry": _ignore_rnr_retry,
    "no-implied-nak": _no_implied_nak,
    "accept-bad-middle": _accept_bad_middle,
}


def apply(name: str) -> None:
    fn = MUTATIONS.get(name)
    if fn is None:
        raise ValueError(f"unknown mutation {name[:40]!r}; known: {', '.join(MUTATIONS)}")
    fn()


if __name__ == "__main__":
    apply(sys.argv[1])
    from rdmakit.cli.main import main

    sys.exit(main(["conformance-target", *sys.argv[2:]]))
