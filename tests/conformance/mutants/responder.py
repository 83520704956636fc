"""Responder and memory-check bugs (IBTA Vol. 1 §9.7.5, §9.9.2, §9.7.5.2.4, §10.6.3)."""

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from rdmakit.engine import memory as memory_mod
from rdmakit.engine import responder as resp_mod
from rdmakit.engine.types import Access, WcOpcode, WcStatus
from rdmakit.wire import MIDDLE_OPCODES, RETH, Kind, NakCode, Opcode, Position, credit_code

from . import _MASK, _U64, QueuePair, Responder, mutant, patch

# -- the responder (IBTA §9.7.5, §9.9.2) ----------------------------------------------------


@mutant("no-atomic-replay", "responder", "resp.dup.fadd", "resp.dup.cas")
def _no_atomic_replay() -> None:
    """A duplicate atomic executes again instead of being answered from the cache."""
    orig = Responder._duplicate

    def dup(self: Any, pkt: Any, info: Any) -> None:
        if info.kind is Kind.ATOMIC:
            psn = self.psn
            self.psn = pkt.psn
            self.msn = (self.msn - 1) & _MASK
            self._atomic(pkt)
            self.psn = self.ack_psn = psn
            return
        orig(self, pkt, info)

    patch(Responder, "_duplicate", dup)


@mutant("nak-61-for-sequence", "responder", "resp.psn.gap_nak")
def _nak_61_for_sequence() -> None:
    """A PSN sequence error is NAKed as an invalid request (syndrome 0x61)."""
    orig = Responder.queue_nak

    def nak(self: Any, code: NakCode, psn: int) -> None:
        orig(self, NakCode.INVALID_REQUEST if code == NakCode.PSN_SEQUENCE_ERROR else code, psn)

    patch(Responder, "queue_nak", nak)


@mutant("no-rnr-nak", "responder", "resp.rnr.nak")
def _no_rnr_nak() -> None:
    """No receive posted: the request is dropped silently instead of RNR NAKed."""
    orig = Responder._queue

    def queue(self: Any, pkt: Any) -> None:
        if pkt.opcode is Opcode.ACKNOWLEDGE and pkt.aeth is not None and pkt.aeth.syndrome >> 5 == 1:
            return
        orig(self, pkt)

    patch(Responder, "_queue", queue)


@mutant("nak-every-gap-packet", "responder", "resp.psn.gap_once")
def _nak_every_gap() -> None:
    """Every out-of-sequence packet is NAKed, not only the first of a gap (no ``sent_psn_nak``)."""
    orig = Responder.on_request

    def on_request(self: Any, pkt: Any, info: Any) -> None:
        self.sent_psn_nak = False
        orig(self, pkt, info)

    patch(Responder, "on_request", on_request)


@mutant("duplicate-as-gap", "responder", "resp.dup.send", "resp.wrap.dup")
def _duplicate_as_gap() -> None:
    """A PSN behind the expected one is taken for a gap ahead (an unsigned PSN compare)."""
    orig = Responder.on_request

    def on_request(self: Any, pkt: Any, info: Any) -> None:
        if 0 < (self.psn - pkt.psn) & _MASK < 0x800000:
            self.queue_nak(NakCode.PSN_SEQUENCE_ERROR, self.psn)
            return
        orig(self, pkt, info)

    patch(Responder, "on_request", on_request)


@mutant("dup-read-from-start", "responder", "resp.dup.read_middle", "resp.dup.read_last")
def _dup_read_from_start() -> None:
    """A duplicate READ from the middle of an earlier READ is answered with the whole READ again."""
    orig = Responder._duplicate

    def dup(self: Any, pkt: Any, info: Any) -> None:
        if info.kind is Kind.READ_REQUEST:
            res = self.res.find(pkt.psn, Kind.READ_REQUEST)
            if res is not None and pkt.psn != res.first_psn:
                pkt = pkt._replace(psn=res.first_psn, reth=RETH(res.va, res.rkey, res.length))
        orig(self, pkt, info)

    patch(Responder, "_duplicate", dup)


@mutant("dup-read-closes-message", "responder", "resp.dup.read_in_write")
def _dup_read_closes_message() -> None:
    """Replaying a duplicate READ resets the open message's state, so its LAST is refused."""
    orig = Responder._duplicate

    def dup(self: Any, pkt: Any, info: Any) -> None:
        orig(self, pkt, info)
        if info.kind is Kind.READ_REQUEST:
            self.in_msg = None

    patch(Responder, "_duplicate", dup)


@mutant("dup-first-restarts-message", "responder", "resp.dup.first_inside")
def _dup_first_restarts() -> None:
    """A duplicate FIRST inside its open message closes that message, so its LAST is refused."""
    orig = Responder._duplicate

    def dup(self: Any, pkt: Any, info: Any) -> None:
        orig(self, pkt, info)
        if info.position is Position.FIRST:
            self.in_msg = None

    patch(Responder, "_duplicate", dup)


@mutant("gap-aborts-message", "responder", "resp.gap.write_middle", "resp.gap.send_middle")
def _gap_aborts_message() -> None:
    """A PSN gap inside a message forgets the message, so the resent MIDDLE is refused."""
    orig = Responder.on_request

    def on_request(self: Any, pkt: Any, info: Any) -> None:
        if 0 < (pkt.psn - self.psn) & _MASK < 0x800000:
            self.in_msg = None
        orig(self, pkt, info)

    patch(Responder, "on_request", on_request)


@mutant("dup-write-executes", "responder", "resp.dup.write_not_again")
def _dup_write_executes() -> None:
    """A duplicate WRITE ONLY is placed again before it is acknowledged."""
    orig = Responder._duplicate

    def dup(self: Any, pkt: Any, info: Any) -> None:
        reth = pkt.reth
        if info.kind is Kind.WRITE and reth is not None and reth.dma_len == len(pkt.payload):
            view = self.qp.pd.remote_slice(reth.rkey, reth.va, reth.dma_len, Access.REMOTE_WRITE)
            if view is not None:
                view[:] = pkt.payload
        orig(self, pkt, info)

    patch(Responder, "_duplicate", dup)


@mutant("no-error-state", "responder", "resp.err.invalid_flush", "resp.err.access_flush", "resp.err.silent")
def _no_error_state() -> None:
    """A Class C error NAKs but leaves the QP in RTS (no Error state, no flush)."""

    def fatal(self: Any, psn: int, code: NakCode, status: WcStatus) -> None:
        self.queue_nak(code, psn)

    patch(Responder, "_fatal", fatal)


@mutant("read-msn-on-completion", "responder", "resp.read.only", "resp.msn.progress")
def _read_msn_late() -> None:
    """A READ does not count as a message when it executes (C9-148): its response carries the old MSN."""
    orig = Responder.read_executed

    def read_executed(self: Any, *args: Any) -> None:
        orig(self, *args)
        self.msn = (self.msn - 1) & _MASK
        self.out[-1].msn = self.msn

    patch(Responder, "read_executed", read_executed)


@mutant("nak-msn-zero", "responder", "resp.nak.msn_seq", "resp.nak.msn_access")
def _nak_msn_zero() -> None:
    """NAKs carry MSN 0 instead of the messages completed."""
    orig = Responder.queue_nak

    def nak(self: Any, code: NakCode, psn: int) -> None:
        msn, self.msn = self.msn, 0
        orig(self, code, psn)
        self.msn = msn

    patch(Responder, "queue_nak", nak)


@mutant("ackreq-ignored-before-last", "responder", "resp.ackreq.first_middle")
def _ackreq_last_only() -> None:
    """AckReq is honoured on a LAST or ONLY packet only."""
    orig = Responder._send_write

    def send_write(self: Any, pkt: Any, info: Any, kind: Any, pos: Any) -> None:
        if pos is Position.FIRST or pos is Position.MIDDLE:
            pkt = pkt._replace(ackreq=False)
        orig(self, pkt, info, kind, pos)

    patch(Responder, "_send_write", send_write)


@mutant("credits-count-the-used-wqe", "responder", "resp.ack.credits")
def _credits_overcount() -> None:
    """ACKs advertise end-to-end credits counted before the SEND took its receive WQE."""

    def credit_syndrome(self: Any) -> int:
        return credit_code(len(self.rq) + 1)

    patch(Responder, "credit_syndrome", credit_syndrome)


@mutant("write-imm-loses-imm", "responder", "resp.write.imm")
def _write_imm_loses_imm() -> None:
    """The receive completion of a WRITE with immediate has no immediate."""
    orig = QueuePair.push_recv

    def push_recv(self: Any, wc: Any) -> None:
        if wc.opcode is WcOpcode.RECV_RDMA_WITH_IMM:
            wc = dataclasses.replace(wc, imm_data=None)
        orig(self, wc)

    patch(QueuePair, "push_recv", push_recv)


@mutant("rd-resources-never-freed", "responder", "resp.rd_atomic.over_limit")
def _rd_resources_kept() -> None:
    """Responder resources are never recycled: READs past max_dest_rd_atomic are refused."""
    orig = Responder._read

    def read(self: Any, pkt: Any) -> None:
        if self.res.ring and all(r is not None for r in self.res.ring):
            raise resp_mod._Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
        orig(self, pkt)

    patch(Responder, "_read", read)


@mutant("accept-bad-middle", "responder", "resp.len.middle_short")
def _accept_bad_middle() -> None:
    """A MIDDLE request of the wrong length is accepted (cut or padded to the MTU)."""
    orig = QueuePair.receive

    def receive(self: Any, pkt: Any, now: float) -> None:
        if pkt.opcode in MIDDLE_OPCODES and pkt.opcode is not Opcode.RDMA_READ_RESPONSE_MIDDLE:
            mtu = self.resp.mtu
            n = len(pkt.payload)
            if n != mtu:
                pkt = pkt._replace(payload=bytes(pkt.payload[:mtu]) + bytes(max(mtu - n, 0)))
        orig(self, pkt, now)

    patch(QueuePair, "receive", receive)


@mutant("rnr-before-length-check", "responder", "resp.rnr.write_imm")
def _rnr_places_first() -> None:
    """A WRITE with immediate is placed before the receive WQE is looked for, then RNR NAKed."""
    orig = Responder._send_write

    def send_write(self: Any, pkt: Any, info: Any, kind: Any, pos: Any) -> None:
        reth = pkt.reth
        if kind is Kind.WRITE and not self.rq and reth is not None and reth.dma_len == len(pkt.payload):
            view = self.qp.pd.remote_slice(reth.rkey, reth.va, reth.dma_len, Access.REMOTE_WRITE)
            if view is not None:
                view[:] = pkt.payload
        orig(self, pkt, info, kind, pos)

    patch(Responder, "_send_write", send_write)


# -- memory checks (IBTA §9.7.5.2.4, §10.6.3) ---------------------------------------------------


def _remote_slice(check: Callable[[int, int, int, int], bool]) -> None:
    """Replace the R_Key range check with ``check(addr, size, va, length)``; access bits kept."""

    def remote_slice(self: Any, rkey: int, va: int, length: int, access: int) -> Any:
        entry = self.remote_table.get(rkey)
        if entry is None:
            return None
        addr, size, bits, view = entry
        if not bits & access or not check(addr, size, va, length):
            return None
        off = (va - addr) & _U64
        got = view[off : off + length]
        return got if len(got) == length else memoryview(bytearray(length))  # the bytes "past the end"

    patch(memory_mod.ProtectionDomain, "remote_slice", remote_slice)


@mutant("range-end-off-by-one", "memory", "resp.bounds.write_past_end", "resp.bounds.read_past_end")
def _range_off_by_one() -> None:
    """The range check lets the last byte of a request lie one past the region (<= end + 1)."""
    _remote_slice(lambda addr, size, va, n: addr <= va and va + n <= addr + size + 1)


@mutant("range-no-lower-bound", "memory", "resp.bounds.write_below_start", "resp.bounds.atomic_below_start")
def _range_no_lower() -> None:
    """The range check tests only the end of the request, not that it starts inside the region."""
    _remote_slice(lambda addr, size, va, n: va + n <= addr + size)


@mutant("range-wraps-64", "memory", "resp.bounds.write_va_wrap", "resp.bounds.read_va_wrap")
def _range_wraps() -> None:
    """The range check adds VA and length in 64 bits: a request wrapping 2^64 passes."""
    _remote_slice(lambda addr, size, va, n: addr <= va and (va + n) & _U64 <= addr + size)


@mutant("access-bits-ignored", "memory", "resp.key.no_remote_write", "resp.key.no_remote_read")
def _access_ignored() -> None:
    """An R_Key's access rights are not checked, only its range."""
    orig = memory_mod.ProtectionDomain.remote_slice

    def remote_slice(self: Any, rkey: int, va: int, length: int, access: int) -> Any:
        return orig(self, rkey, va, length, 0xFF)

    patch(memory_mod.ProtectionDomain, "remote_slice", remote_slice)


@mutant("zero-length-checks-rkey", "memory", "resp.zero.write")
def _zero_checks_rkey() -> None:
    """A zero-length WRITE still has its R_Key checked (R_Key 0 gets a remote access error)."""
    orig = Responder._send_write

    def send_write(self: Any, pkt: Any, info: Any, kind: Any, pos: Any) -> None:
        reth = pkt.reth
        if reth is not None and reth.dma_len == 0 and reth.rkey not in self.qp.pd.remote_table:
            raise resp_mod._Fatal(NakCode.REMOTE_ACCESS_ERROR, WcStatus.REM_ACCESS_ERR)
        orig(self, pkt, info, kind, pos)

    patch(Responder, "_send_write", send_write)


@mutant("atomic-aligned-down", "memory", "resp.atomic.unaligned")
def _atomic_aligned_down() -> None:
    """An unaligned atomic is executed on the u64 below it instead of being refused."""
    orig = Responder._atomic

    def atomic(self: Any, pkt: Any) -> None:
        ae = pkt.atomic_eth
        if ae is not None and ae.va & 7:
            pkt = pkt._replace(atomic_eth=ae._replace(va=ae.va & ~7))
        orig(self, pkt)

    patch(Responder, "_atomic", atomic)


@mutant("cas-always-swaps", "memory", "resp.atomic.cas_miss")
def _cas_always_swaps() -> None:
    """COMPARE & SWAP swaps whether or not the compare value matches."""
    orig = Responder._atomic

    def atomic(self: Any, pkt: Any) -> None:
        ae = pkt.atomic_eth
        if pkt.opcode is Opcode.COMPARE_SWAP and ae is not None:
            view = self.qp.pd.remote_slice(ae.rkey, ae.va, 8, Access.REMOTE_ATOMIC)
            if view is not None and not ae.va & 7:
                pkt = pkt._replace(atomic_eth=ae._replace(compare=int.from_bytes(view, sys.byteorder)))
        orig(self, pkt)

    patch(Responder, "_atomic", atomic)


@mutant("fetch-add-saturates", "memory", "resp.atomic.fadd")
def _fadd_saturates() -> None:
    """FETCH & ADD saturates at 2^64 - 1 instead of wrapping."""
    orig = Responder._atomic

    def atomic(self: Any, pkt: Any) -> None:
        ae = pkt.atomic_eth
        if pkt.opcode is Opcode.FETCH_ADD and ae is not None:
            view = self.qp.pd.remote_slice(ae.rkey, ae.va, 8, Access.REMOTE_ATOMIC)
            if view is not None and not ae.va & 7:
                cur = int.from_bytes(view, sys.byteorder)
                pkt = pkt._replace(atomic_eth=ae._replace(swap_add=min(ae.swap_add, _U64 - cur)))
        orig(self, pkt)

    patch(Responder, "_atomic", atomic)
