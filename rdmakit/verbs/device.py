"""The verbs backend: a device, its memory registrations and RC QPs, through pyverbs.

With ``rdmakit.verbs.cm``, ``.srq`` and ``.pvcall``, the only modules that import pyverbs.
``rdmakit.doca.verbs_glue`` puts the DOCA backend protocols (``rdmakit.doca.backend``) over
it; every value that crosses it is one of the engine's verbs value types.
Attribute values are decided by the pure `rdmakit.verbs.attrs` and
`rdmakit.verbs.wr`; this module copies them into pyverbs objects.

Object model (pyverbs'): a `VerbsDevice` owns a ``Context`` and a ``PD``; its
`VerbsMR` s and `VerbsQP` s are its children and are closed before it. A
`VerbsQP` owns a completion channel, one CQ for both its queues and the
``QP``; the channel's file descriptor is `VerbsQP.fileno` (event-driven mode).
A QP made with ``srq=`` (`VerbsDevice.create_srq`) takes its receives from it.
"""

import errno
import fcntl
import logging
import os
import random
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from ipaddress import IPv6Address
from pathlib import Path
from typing import Any, NoReturn

from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ, CompChannel
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE as PvSGE
from pyverbs.wr import RecvWR as PvRecvWR
from pyverbs.wr import SendWR as PvSendWR

from rdmakit.engine.states import QpState
from rdmakit.engine.types import Access, Completion, QpCaps, RecvWR, SendWR, WrOpcode
from rdmakit.verbs.attrs import (
    ConnectOptions,
    ConnectParams,
    QpAttrMask,
    connect_params,
    export_descriptor,
    mr_access,
    mtu_enum,
    mtu_from_enum,
    parse_peer,
    qp_access,
    transition_mask,
)
from rdmakit.verbs.buffers import buffer_address
from rdmakit.verbs.errors import VerbsError
from rdmakit.verbs.info import VerbsCaps, VerbsDeviceInfo, caps_of, device_info
from rdmakit.verbs.mr import VerbsMR
from rdmakit.verbs.pvcall import call as _call
from rdmakit.verbs.pvcall import pv_sges
from rdmakit.verbs.pvcall import reraise as _raise
from rdmakit.verbs.srq import VerbsSRQ
from rdmakit.verbs.sysfs import SYSFS_ROOT, GidEntry, SysfsDevice, event_fds, find_device, select_gid
from rdmakit.verbs.wr import SEND_SIGNALED, SEND_SOLICITED, WrTracker, imm_to_verbs, needs_imm

__all__ = ["VerbsDevice", "VerbsMR", "VerbsQP", "describe"]

log = logging.getLogger("rdmakit.verbs")

#: ``IBV_QPT_RC``.
_QPT_RC = 2
_RDMA_OPS = frozenset({WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.RDMA_READ})
_ATOMIC_OPS = frozenset({WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD})
#: States in which each queue accepts work requests (IBTA §10.8.2.1, §10.8.2.2;
#: rxe also queues receives in INIT, before the peer is known).
_SEND_STATES = frozenset({QpState.RTS})
_RECV_STATES = frozenset({QpState.INIT, QpState.RTR, QpState.RTS})
_POLL_BATCH = 64
#: Serialises our own channel creation, so the fd that appears is the channel's.
_fd_lock = threading.Lock()


def _open_channel(ctx: Context) -> tuple[CompChannel, int | None]:
    """A completion channel and its file descriptor.

    pyverbs (rdma-core 44..59) does not expose ``ibv_comp_channel.fd``; it is
    the one ``[infinibandevent]`` descriptor that creating the channel adds.
    None if another thread made that ambiguous (then no event-driven mode).
    """
    with _fd_lock:
        try:
            before = event_fds()
        except OSError:
            before = None
        channel = _call("ibv_create_comp_channel", lambda: CompChannel(ctx))
        new = event_fds() - before if before is not None else set()
    if len(new) != 1:
        log.debug("cannot tell the completion channel's fd (candidates %s): no event-driven mode", new)
        return channel, None
    fd = new.pop()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    return channel, fd


def _info(ctx: Context, dev: SysfsDevice, port: int, entry: GidEntry) -> VerbsDeviceInfo:
    port_attr = _call(f"ibv_query_port({dev.name}, {port})", lambda: ctx.query_port(port))
    caps = caps_of(_call("ibv_query_device", ctx.query_device))
    return device_info(dev, port, entry, mtu=mtu_from_enum(int(port_attr.active_mtu)), caps=caps)


def _open_context(name: str) -> Context:
    with _fd_lock:  # a context opens an [infinibandevent] fd too (its async events)
        return _call(f"cannot open verbs device {name}", lambda: Context(name=name))


def describe(dev: SysfsDevice, port: int, entry: GidEntry) -> VerbsDeviceInfo:
    """`dev`'s discovery record: opens it briefly for the port MTU and device limits."""
    ctx = _open_context(dev.name)
    try:
        return _info(ctx, dev, port, entry)
    finally:
        ctx.close()


class VerbsDevice:
    """An open verbs device (``ibv_context`` + ``ibv_pd``); ``VerbsBackendDevice`` adapts it for DOCA.

    `name` None opens the first usable device (`rdmakit.verbs.list_devices`
    order). `port` and `gid_index` default to the first active port and its
    RoCE v2 IPv4-mapped GID (`rdmakit.verbs.sysfs.select_gid`). The kernel
    assigns R_Keys and QPNs; the initial PSNs of its QPs come from `rng`,
    by default the OS CSPRNG (``random.SystemRandom``): a peer that could
    predict them could inject packets into the connection.
    """

    kind = "verbs"

    def __init__(
        self,
        name: str | None = None,
        *,
        port: int | None = None,
        gid_index: int | None = None,
        rng: random.Random | None = None,
        sysfs_root: Path = SYSFS_ROOT,
    ) -> None:
        sysdev = find_device(name, sysfs_root)
        port_info, entry = select_gid(sysdev, port, gid_index)
        self._port_info = port_info
        self._ctx: Context | None = _open_context(sysdev.name)
        try:
            self.info = _info(self._ctx, sysdev, port_info.num, entry)
            self._pd: PD | None = _call("ibv_alloc_pd", lambda: PD(self._ctx))
            # pyverbs refuses a work request without an SGE; a zero-length message
            # gets one zero-length SGE in this 1-byte region instead.
            self._zero_buf = bytearray(1)
            view = memoryview(self._zero_buf)
            self.zero_mr = self._register(view, buffer_address(view), Access.LOCAL_WRITE)
        except BaseException:
            self._ctx.close()
            self._ctx = None
            raise
        self.rng = rng if rng is not None else random.SystemRandom()
        self._mrs: list[VerbsMR] = []
        self._qps: list[VerbsQP] = []
        log.debug("opened %s port %d gid[%d] %s", self.name, self.port, self.gid_index, self.gid)

    # -- identity ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.info.name

    @property
    def port(self) -> int:
        return self.info.port

    @property
    def gid_index(self) -> int:
        return self.info.gid_index

    @property
    def gid(self) -> IPv6Address:
        return self.info.gid

    @property
    def gids(self) -> Sequence[IPv6Address]:
        """The port's populated GID table, index order (`gid` is the one QPs use)."""
        return self.info.gids

    def gid_at(self, index: int) -> IPv6Address | None:
        """The RoCE v2 GID at table index `index`: one an RC QP over UDP can use, else None."""
        entry = self._port_info.gid_entry(index)
        return entry.gid if entry is not None and entry.roce_v2 else None

    @property
    def mtu(self) -> int:
        """The port's active MTU in bytes (``ibv_port_attr.active_mtu``)."""
        return self.info.mtu

    @property
    def caps(self) -> VerbsCaps:
        return self.info.caps

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def _check_open(self) -> tuple[Context, PD]:
        if self._ctx is None or self._pd is None:
            raise VerbsError("BAD_STATE", f"verbs device {self.info.name} is closed")
        return self._ctx, self._pd

    # -- memory -----------------------------------------------------------------------
    def _register(self, view: memoryview, addr: int, access: Access) -> VerbsMR:
        _, pd = self._check_open()
        mr = _call(
            f"ibv_reg_mr({addr:#x}, {len(view)}, {access!r})",
            lambda: MR(pd, len(view), int(access), address=addr),
        )
        return VerbsMR(
            addr=int(mr.buf),
            lkey=int(mr.lkey),
            rkey=int(mr.rkey),
            view=view,
            access=access,
            release=lambda: _call("ibv_dereg_mr", mr.close),
        )

    def register_memory(self, buffer: memoryview, addr: int, access: Access) -> VerbsMR:
        """``ibv_reg_mr`` of `buffer`, which must be at virtual address `addr`.

        A verbs MR's virtual address is where the memory is (``ibv_reg_mr``,
        not ``ibv_reg_mr_iova``), so `addr` must be ``buffer_address(buffer)``:
        ``rdmakit.doca.Mmap`` passes exactly that. Access is checked by
        `rdmakit.verbs.attrs.mr_access` against the buffer's own read-only flag.
        """
        view = memoryview(buffer).cast("B") if buffer.format != "B" or buffer.ndim != 1 else buffer
        flags = mr_access(access, readonly=view.readonly)
        real = buffer_address(view)
        if addr != real:
            raise VerbsError(
                "INVALID_VALUE",
                f"a verbs MR lives at its buffer's address {real:#x}, not {addr:#x}",
            )
        if not len(view):
            raise VerbsError("INVALID_VALUE", "cannot register an empty buffer")
        mr = self._register(view, addr, flags)
        self._mrs.append(mr)
        return mr

    def register(self, buffer: memoryview | bytearray | bytes, access: Access) -> VerbsMR:
        """`register_memory` at the buffer's own address."""
        view = memoryview(buffer)
        return self.register_memory(view, buffer_address(view), access)

    def deregister(self, registration: object) -> None:
        """``ibv_dereg_mr``; idempotent, and a no-op for registrations of other devices."""
        if isinstance(registration, VerbsMR) and registration in self._mrs:
            self._mrs.remove(registration)
            registration.close()

    def local_view(self, lkey: int, addr: int, length: int, *, write: bool) -> memoryview | None:
        """The bytes of the MR with `lkey` (`VerbsMR.view`); None on a local protection error."""
        mr = next((m for m in self._mrs if m.lkey == lkey), None)
        return None if mr is None else mr.view(addr, length, write=write)

    # -- queue pairs ------------------------------------------------------------------
    def create_srq(self, max_wr: int, max_sge: int) -> VerbsSRQ:
        """A shared receive queue of the device's PD (``rdmakit.verbs.srq``)."""
        _, pd = self._check_open()
        return VerbsSRQ(pd, self, max_wr, max_sge)

    def create_qp(self, caps: QpCaps, gid_index: int | None = None, srq: VerbsSRQ | None = None) -> "VerbsQP":
        """An RC QP in RESET with its own CQ and channel, using the RoCE v2 GID at `gid_index`;
        with `srq`, its receives come from the SRQ (``ibv_qp_init_attr.srq``)."""
        self._check_open()
        if gid_index is None:
            gid_index = self.gid_index
        gid = self.gid_at(gid_index)
        if gid is None:
            raise VerbsError(
                "NOT_FOUND", f"{self.name} port {self.port} has no RoCE v2 GID at index {gid_index}"
            )
        qp = VerbsQP(self, caps, gid_index=gid_index, gid=gid, srq=srq)
        self._qps.append(qp)
        return qp

    def _forget(self, qp: "VerbsQP") -> None:
        if qp in self._qps:
            self._qps.remove(qp)

    def close(self) -> None:
        """Close QPs and MRs, then the PD and the context; idempotent."""
        if self._ctx is None:
            return
        try:
            for qp in list(self._qps):
                qp.close()
            for mr in [*self._mrs, self.zero_mr]:
                mr.close()
            self._mrs.clear()
            if self._pd is not None:
                _call("ibv_dealloc_pd", self._pd.close)
        finally:
            ctx, self._ctx, self._pd = self._ctx, None, None
            _call("ibv_close_device", ctx.close)

    def __enter__(self) -> "VerbsDevice":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"port {self.port} gid[{self.gid_index}] {self.gid}"
        return f"<VerbsDevice {self.info.name} {state}>"


class VerbsQP:
    """An RC queue pair (``ibv_qp``) with one CQ for both queues; ``VerbsBackendQP`` adapts it.

    Lifecycle: created in RESET; `init` (optional) moves it to INIT so receives
    can be posted before the peer is known; `connect` brings it to RTS from
    the peer's `export` output. `progress` collects completion events and
    completions without blocking; `poll` returns them. In event-driven mode
    wait for `fileno` to be readable, then `progress` and `poll`: `progress`
    re-arms the CQ (``ibv_req_notify_cq``) before it drains it, so a completion
    that arrives later always makes `fileno` readable.
    """

    def __init__(
        self,
        dev: VerbsDevice,
        caps: QpCaps,
        *,
        gid_index: int | None = None,
        gid: IPv6Address | None = None,
        srq: VerbsSRQ | None = None,
    ) -> None:
        ctx, pd = dev._check_open()
        self._srq = srq
        self._dev = dev
        self._sgid_index = dev.gid_index if gid_index is None else gid_index
        self._gid = dev.gid if gid is None else gid
        recv_wr = caps.max_recv_wr if srq is None else srq.max_wr
        depth = min(caps.max_send_wr + recv_wr, dev.caps.max_cqe)
        self._channel, self._fd = _open_channel(ctx)
        try:
            self._cq = _call("ibv_create_cq", lambda: CQ(ctx, depth, None, self._channel, 0))
            _call("ibv_req_notify_cq", self._cq.req_notify)
            cap = QPCap(
                max_send_wr=caps.max_send_wr,
                max_recv_wr=caps.max_recv_wr,
                max_send_sge=caps.max_send_sge,
                max_recv_sge=caps.max_recv_sge,
            )
            init = QPInitAttr(
                qp_type=_QPT_RC, scq=self._cq, rcq=self._cq, srq=None if srq is None else srq.pv, cap=cap,
                sq_sig_all=0,
            )  # fmt: skip
            self._qp: QP = _call("ibv_create_qp", lambda: QP(pd, init))
        except BaseException:
            self._channel.close()
            raise
        self._psn = dev.rng.getrandbits(24)
        self.options = ConnectOptions()
        self._tracker = self._new_tracker()
        self._pending: deque[Completion] = deque()
        self._closed = False

    def _new_tracker(self) -> WrTracker:
        return WrTracker() if self._srq is None else WrTracker(shared=self._srq.tracker)

    # -- identity and state -----------------------------------------------------------
    @property
    def qpn(self) -> int:
        return int(self._qp.qp_num)

    @property
    def gid_index(self) -> int:
        """The source GID index of the address vector (``ibv_global_route.sgid_index``)."""
        return self._sgid_index

    @property
    def psn(self) -> int:
        """The PSN of this side's first request (exported as ``psn``)."""
        return self._psn

    @property
    def state(self) -> QpState:
        """The QP's current state (``ibv_query_qp``: it may have moved to ERR on its own)."""
        if self._closed:
            return QpState.ERR
        attr, _ = _call("ibv_query_qp", lambda: self._qp.query(int(QpAttrMask.STATE)))
        return QpState(int(attr.qp_state))

    def export(self) -> dict[str, object]:
        """Connection info for the peer: transport ``"verbs"``, gid, ip, port, qpn, psn, mtu."""
        return export_descriptor(gid=self._gid, qpn=self.qpn, psn=self._psn, mtu=self._dev.mtu)

    # -- transitions --------------------------------------------------------------------
    def _modify(self, to: QpState, fill: Callable[[Any], None]) -> None:
        frm = self.state
        mask = transition_mask(frm, to)
        attr = QPAttr(qp_state=int(to), cur_qp_state=int(frm))
        fill(attr)
        _call(f"ibv_modify_qp {frm.name} -> {to.name}", lambda: self._qp.modify(attr, int(mask)))

    def init(self) -> None:
        """RESET -> INIT, so receives can be posted before the peer is known."""
        if self.state is QpState.RESET:
            o = self.options

            def fill(a: Any) -> None:
                a.pkey_index = o.pkey_index
                a.port_num = self._dev.port
                a.qp_access_flags = int(qp_access(o.access))

            self._modify(QpState.INIT, fill)

    def connect_params(self, remote: Mapping[str, object]) -> ConnectParams:
        """The attributes `connect` would set for `remote` (checks the descriptor)."""
        caps = self._dev.caps
        return connect_params(
            parse_peer(remote),
            own_psn=self._psn,
            own_mtu=self._dev.mtu,
            port_num=self._dev.port,
            sgid_index=self._sgid_index,
            options=self.options,
            max_rd_atomic=caps.max_qp_init_rd_atom,
            max_dest_rd_atomic=caps.max_qp_rd_atom,
        )

    def connect(self, remote: Mapping[str, object]) -> None:
        """RESET or INIT -> RTR -> RTS towards the peer `remote` describes (its `export`)."""
        p = self.connect_params(remote)
        self.init()
        if (state := self.state) is not QpState.INIT:
            raise VerbsError("BAD_STATE", f"connect needs a QP in RESET or INIT, not {state.name}")

        def rtr(a: Any) -> None:
            a.path_mtu = mtu_enum(p.path_mtu)
            a.dest_qp_num = p.dest_qpn
            a.rq_psn = p.rq_psn
            a.max_dest_rd_atomic = p.max_dest_rd_atomic
            a.min_rnr_timer = p.min_rnr_timer
            route = GlobalRoute(
                dgid=GID(p.dgid),
                sgid_index=p.sgid_index,
                hop_limit=p.hop_limit,
                traffic_class=p.traffic_class,
            )
            a.ah_attr = AHAttr(port_num=p.port_num, is_global=1, gr=route)

        def rts(a: Any) -> None:
            a.timeout = p.timeout
            a.retry_cnt = p.retry_cnt
            a.rnr_retry = p.rnr_retry
            a.sq_psn = p.sq_psn
            a.max_rd_atomic = p.max_rd_atomic

        self._modify(QpState.RTR, rtr)
        self._modify(QpState.RTS, rts)
        log.debug("%s QP %#x -> RTS with peer QP %#x at %s", self._dev.name, self.qpn, p.dest_qpn, p.dgid)

    def modify_with(self, attr: Any, mask: int, what: str) -> None:
        """``ibv_modify_qp`` with a filled pyverbs ``QPAttr`` and the mask naming its fields."""
        _call(f"ibv_modify_qp ({what})", lambda: self._qp.modify(attr, mask))

    def to_error(self) -> None:
        """To ERR (IBTA §10.3.1): the device flushes outstanding work (§11.6.2); no-op in RESET/ERR."""
        if self.state not in (QpState.RESET, QpState.ERR):
            self._modify(QpState.ERR, lambda a: None)

    def reset(self) -> None:
        """Back to RESET with a fresh PSN; posted work requests are dropped without completions."""
        self._modify(QpState.RESET, lambda a: None)
        self._drain_cq()
        self._pending.clear()
        self._tracker = self._new_tracker()
        self._psn = self._dev.rng.getrandbits(24)

    # -- work requests ------------------------------------------------------------------
    def _sges(self, sg_list: Sequence[tuple[int, int, int]]) -> list[PvSGE]:
        return pv_sges(self._dev, sg_list)

    def _post_failed(self, exc: PyverbsError, what: str, allowed: frozenset[QpState]) -> NoReturn:
        err = getattr(exc, "error_code", None)
        if isinstance(exc, PyverbsRDMAError) and isinstance(err, int):
            if abs(err) == errno.ENOMEM:
                _raise(exc, f"{what}: work queue full", "FULL")
            if abs(err) == errno.EINVAL and (state := self.state) not in allowed:
                _raise(exc, f"{what} in state {state.name}", "BAD_STATE")
        _raise(exc, what)

    def post_send(self, wr: SendWR) -> None:
        """``ibv_post_send`` of one work request (the engine's `SendWR`)."""
        self._check_open()
        sges = self._sges(wr.sg_list)
        iid = self._tracker.post_send(wr)
        try:
            pv = PvSendWR(
                wr_id=iid,
                opcode=int(wr.opcode),
                num_sge=len(sges),
                sg=sges,
                send_flags=(SEND_SIGNALED if wr.signaled else 0) | (SEND_SOLICITED if wr.solicited else 0),
            )
            if needs_imm(wr.opcode):
                pv.imm_data = imm_to_verbs(wr.imm_data or 0)
            if wr.opcode in _RDMA_OPS:
                pv.set_wr_rdma(wr.rkey, wr.remote_addr)
            elif wr.opcode in _ATOMIC_OPS:
                pv.set_wr_atomic(wr.rkey, wr.remote_addr, wr.compare_add, wr.swap)
            self._qp.post_send(pv)
        except PyverbsError as e:
            self._tracker.unpost(iid)
            self._post_failed(e, f"ibv_post_send {wr.opcode.name}", _SEND_STATES)

    def post_recv(self, wr: RecvWR) -> None:
        """``ibv_post_recv`` of one work request; INVALID_VALUE on a QP of an SRQ (post there)."""
        self._check_open()
        if self._srq is not None:
            raise VerbsError("INVALID_VALUE", "the QP takes its receives from an SRQ: post them there")
        sges = self._sges(wr.sg_list)
        iid = self._tracker.post_recv(wr.wr_id)
        try:
            self._qp.post_recv(PvRecvWR(wr_id=iid, num_sge=len(sges), sg=sges))
        except PyverbsError as e:
            self._tracker.unpost(iid)
            self._post_failed(e, "ibv_post_recv", _RECV_STATES)

    # -- completions ------------------------------------------------------------------
    def _poll_cq(self, limit: int) -> list[Completion]:
        out: list[Completion] = []
        while len(out) < limit:
            n, wcs = _call("ibv_poll_cq", lambda: self._cq.poll(min(_POLL_BATCH, limit - len(out))))
            out.extend(self._tracker.completion_of(wc) for wc in wcs)
            if n < _POLL_BATCH:
                break
        return out

    def _drain_cq(self) -> None:
        while self._poll_cq(1 << 16):
            pass

    def poll(self, max_entries: int) -> Sequence[Completion]:
        """Up to `max_entries` completions, oldest first; never blocks (``ibv_poll_cq``)."""
        self._check_open()
        out: list[Completion] = []
        while self._pending and len(out) < max_entries:
            out.append(self._pending.popleft())
        if len(out) < max_entries:
            out.extend(self._poll_cq(max_entries - len(out)))
        return out

    def progress(self) -> bool:
        """Consume completion events, re-arm the CQ, collect completions; True if any."""
        self._check_open()
        events = 0
        if self._fd is not None:
            while True:
                try:
                    self._channel.get_cq_event(self._cq)
                except PyverbsRDMAError as e:
                    if getattr(e, "error_code", None) in (errno.EAGAIN, -errno.EAGAIN):
                        break
                    _raise(e, "ibv_get_cq_event")
                events += 1
            if events:
                self._cq.ack_events(events)
                _call("ibv_req_notify_cq", self._cq.req_notify)
        got = self._poll_cq(1 << 16)
        self._pending.extend(got)
        return bool(events or got)

    def fileno(self) -> int:
        """The completion channel's descriptor: readable when completions may be there."""
        if self._fd is None:
            raise VerbsError("NOT_SUPPORTED", "this QP's completion channel fd is unknown", "system")
        return self._fd

    def _check_open(self) -> None:
        if self._closed:
            raise VerbsError("BAD_STATE", "the QP is closed")

    def close(self) -> None:
        """Destroy the QP, its CQ and its channel; idempotent. Outstanding work is dropped."""
        if self._closed:
            return
        self._closed = True
        self._dev._forget(self)
        try:
            _call("ibv_destroy_qp", self._qp.close)
            _call("ibv_destroy_cq", self._cq.close)
        finally:
            _call("ibv_destroy_comp_channel", self._channel.close)

    def __repr__(self) -> str:
        return f"<VerbsQP {self._dev.info.name} qpn={self.qpn:#x}>"
