"""The IB Communication Manager (IBTA Vol. 1 ch. 12) of one device's GSI, sans-IO.

A `CmEndpoint` holds every connection the device's QP1 sets up or tears
down. It never reads a clock or touches a socket (the shape of
``QueuePair``): it is driven by the user's calls (`listen`, `connect`,
`accept`, `reject`, `send_rtu`, `disconnect`), by `receive` for each CM MAD
that reached QP1 and by `handle_timer` at `get_timer`; it answers with MADs
to send (`poll_transmit`: (peer, `CmMad`) pairs, ``peer`` being whatever
opaque address the transport gave `receive`) and with `CmEvent` s
(`next_event`). Queue pairs are the user's: the events say when to move them.

The connection states and what each accepts are the table `ACCEPTS`
(IBTA §12.9, Figures 138-140):

- active: ``connect`` sends a REQ (REQ_SENT); the REP is reported
  (REP_RECEIVED, state REP_RCVD); the user moves its QP to RTR and RTS and
  calls ``send_rtu`` (ESTABLISHED);
- passive: a REQ for a listened service ID is reported (REQ_RECEIVED,
  REQ_RCVD); the user moves its QP to RTR and RTS and calls ``accept``,
  which sends the REP (REP_SENT); the RTU completes it (ESTABLISHED);
- either side: ``disconnect`` sends a DREQ (DREQ_SENT); the DREP, or a DREQ
  from the peer (answered by a DREP), reports DISCONNECTED and enters
  TIMEWAIT, which ends after `timewait` seconds.

Timeouts: a REQ, REP or DREQ not answered within the response timeout
(4.096 µs × 2^exponent, IBTA §12.7.24, stretched by an MRA's service timeout)
is sent again, up to `max_retries` times; then the connection fails (TIMEOUT,
with a REJ to the peer for a REQ or REP) or, for a DREQ, goes to TIMEWAIT.

Duplicates are answered, not reprocessed: a repeated REQ gets an MRA while
the user decides, the REP again once sent, or a REJ "stale connection" once
in TIMEWAIT; a repeated REP gets the RTU again; a repeated DREQ the DREP.
A REQ from a peer QP (CA GUID, QPN) that already has a live connection is
rejected as stale; one for a service nobody listens to gets REJ "invalid
service ID" (8, the ``rdma_cm`` "no listener"), one naming QP 0 or 1 REJ
"unsupported request" (5). Everything from the network
is hostile: a MAD for an unknown communication ID, from another address
than the connection's peer, or not expected in the connection's state is
dropped and counted in `stats`, never raised. A REJ, DREQ or DREP must
name both communication IDs once the peer's is known (Linux ``cm.c``
``cm_acquire_id``; a REJ of our REQ, sent before the peer had an ID, names
ours alone, or carries the REQ's transaction ID).

No address steers the table for others: pending passive connections are
bounded (`max_pending` in all, `max_pending_per_peer` from one address: REJ
"no resources" past either), a REQ the user refused stays in TIMEWAIT for
`timewait` only (our limit, whatever the REQ's timeout fields say), and one
address holds at most `max_timewait_per_peer` connections in TIMEWAIT (its
oldest leaves early). Communication IDs come from the endpoint's `rng`, so
they cannot be guessed when it is a system random source.
"""

import random
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from rdmakit.wire.cm import CmAttr, CmMad, RejReason

from .cm_states import ACCEPTS, CmConnParams, CmEvent, CmEventKind, CmState, response_timeout
from .cm_states import Conn as _Conn
from .errors import EngineError

__all__ = ["CmConnParams", "CmEndpoint", "CmEvent", "CmEventKind", "CmState", "response_timeout"]

#: QP0 (SMI) and QP1 (GSI) are no connected QP's number (IBTA Vol. 1 §3.5.1): a REQ naming one is refused.
_SPECIAL_QPNS = (0, 1)
#: A passive connection the user has not answered yet.
_WAITING = (CmState.REQ_RCVD, CmState.MRA_REQ_SENT)


class CmEndpoint:
    """The CM agent of one GSI: every connection, by local communication ID."""

    def __init__(
        self,
        *,
        rng: random.Random,
        ca_guid: int,
        timeout_exponent: int = 20,
        max_retries: int = 15,
        timewait: float = 1.0,
        max_pending: int = 64,
        max_connections: int = 4096,
        max_pending_per_peer: int = 8,
        max_timewait_per_peer: int = 32,
    ) -> None:
        self.rng = rng
        self.ca_guid = ca_guid
        self.timeout_exponent = timeout_exponent
        self.max_retries = max_retries
        self.timewait = timewait
        self.max_pending = max_pending
        self.max_connections = max_connections
        self.max_pending_per_peer = max_pending_per_peer
        self.max_timewait_per_peer = max_timewait_per_peer
        self._listening: set[int] = set()
        self._conns: dict[int, _Conn] = {}
        self._by_remote: dict[tuple[Hashable, int], int] = {}  # (peer, remote comm ID) -> local ID
        self._by_qp: dict[tuple[int, int], int] = {}  # (remote CA GUID, remote QPN) -> local ID
        self._by_peer: dict[Hashable, dict[int, None]] = {}  # peer -> its local IDs, oldest first
        self._out: deque[tuple[Hashable, CmMad]] = deque()
        self._events: deque[CmEvent] = deque()
        self.stats: dict[str, int] = {}

    # -- bookkeeping ------------------------------------------------------------------------------

    def _count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def _new_id(self) -> int:
        while True:
            cid = self.rng.getrandbits(32)
            if cid and cid not in self._conns:
                return cid

    def _timeout(self) -> float:
        return response_timeout(self.timeout_exponent)

    def _mra_timeout(self) -> int:
        """The service timeout our MRAs ask for: four response timeouts."""
        return min(self.timeout_exponent + 2, 31)

    def _longest_span(self) -> float:
        """How long a peer configured as this endpoint keeps repeating a message, MRAs included."""
        return (self._timeout() + response_timeout(self._mra_timeout())) * (self.max_retries + 1)

    def _send(self, conn: _Conn, mad: CmMad, now: float | None) -> None:
        """Send `mad`; with `now`, it waits for an answer and is retransmitted."""
        conn.last = mad
        self._out.append((conn.peer, mad))
        if now is not None:
            conn.retries = 0
            conn.deadline = now + self._timeout()

    def _reply(self, peer: Hashable, mad: CmMad) -> None:
        self._out.append((peer, mad))

    def _event(
        self, kind: CmEventKind, conn: _Conn, mad: CmMad | None = None, reason: int | None = None
    ) -> None:
        self._events.append(CmEvent(kind, conn.local_id, conn.peer, mad, reason))

    def _add(self, conn: _Conn) -> None:
        self._conns[conn.local_id] = conn
        self._by_peer.setdefault(conn.peer, {})[conn.local_id] = None

    def _of_peer(self, peer: Hashable, *states: CmState) -> list[_Conn]:
        """The connections with `peer` in `states`, oldest first."""
        ids = self._by_peer.get(peer, {})
        return [c for i in ids if (c := self._conns[i]).state in states]

    def _close(self, conn: _Conn) -> None:
        conn.state = CmState.CLOSED
        conn.deadline = None
        if self._conns.pop(conn.local_id, None) is not None:
            ids = self._by_peer[conn.peer]
            del ids[conn.local_id]
            if not ids:
                del self._by_peer[conn.peer]
        if self._by_remote.get((conn.peer, conn.remote_id)) == conn.local_id:
            del self._by_remote[(conn.peer, conn.remote_id)]
        if self._by_qp.get((conn.remote_guid, conn.remote_qpn)) == conn.local_id:
            del self._by_qp[(conn.remote_guid, conn.remote_qpn)]

    def _enter_timewait(self, conn: _Conn, now: float) -> None:
        waiting = self._of_peer(conn.peer, CmState.TIMEWAIT)
        for old in waiting[: max(0, len(waiting) + 1 - self.max_timewait_per_peer)]:
            self._count("timewait_per_peer_full")
            self._close(old)  # one address cannot keep the table full: its oldest leave early
        conn.state = CmState.TIMEWAIT
        conn.deadline = now + self.timewait

    @staticmethod
    def _rej(tid: int, local_id: int, remote_id: int, reason: int, msg: int) -> CmMad:
        return CmMad(
            CmAttr.REJ,
            tid,
            {
                "local_comm_id": local_id,
                "remote_comm_id": remote_id,
                "message_rejected": msg,
                "reason": reason,
            },
        )

    def state(self, comm_id: int) -> CmState:
        conn = self._conns.get(comm_id)
        return conn.state if conn is not None else CmState.CLOSED

    def _user_conn(self, comm_id: int, *states: CmState) -> _Conn:
        conn = self._conns.get(comm_id)
        if conn is None or conn.state not in states:
            have = conn.state.name if conn is not None else "no connection"
            raise EngineError(
                "BAD_STATE", f"communication ID {comm_id:#x}: {have}, not {'/'.join(s.name for s in states)}"
            )
        return conn

    # -- user calls ---------------------------------------------------------------------------------

    def listen(self, service_id: int) -> None:
        self._listening.add(service_id)

    def unlisten(self, service_id: int) -> None:
        self._listening.discard(service_id)

    def connect(self, peer: Hashable, service_id: int, params: CmConnParams, now: float) -> int:
        """Send a REQ; returns the connection's local communication ID (REQ_SENT)."""
        if len(self._conns) >= self.max_connections:
            raise EngineError("FULL", f"{self.max_connections} connections already")
        conn = _Conn(
            self._new_id(), peer, True, CmState.REQ_SENT, self.rng.getrandbits(64), service_id=service_id
        )
        self._add(conn)
        t = self.timeout_exponent
        values = {
            "local_comm_id": conn.local_id,
            "service_id": service_id,
            "local_ca_guid": self.ca_guid,
            "local_qpn": params.qpn,
            "responder_resources": params.responder_resources,
            "initiator_depth": params.initiator_depth,
            "remote_cm_response_timeout": t,
            "starting_psn": params.starting_psn,
            "local_cm_response_timeout": t,
            "retry_count": params.retry_count,
            "pkey": params.pkey,
            "path_mtu": params.path_mtu,
            "rnr_retry_count": params.rnr_retry_count,
            "max_cm_retries": min(self.max_retries, 15),
            "primary_local_lid": 0xFFFF,
            "primary_remote_lid": 0xFFFF,
            "primary_local_gid": params.local_gid,
            "primary_remote_gid": params.remote_gid,
            "primary_flow_label": params.flow_label,
            "primary_traffic_class": params.traffic_class,
            "primary_hop_limit": params.hop_limit,
            "primary_local_ack_timeout": params.local_ack_timeout,
        }
        self._send(conn, CmMad(CmAttr.REQ, conn.tid, values, params.private_data), now)
        return conn.local_id

    def accept(self, comm_id: int, params: CmConnParams, now: float) -> None:
        """Answer a REQ with a REP (REP_SENT); the RTU will make it ESTABLISHED."""
        conn = self._user_conn(comm_id, CmState.REQ_RCVD, CmState.MRA_REQ_SENT)
        values = {
            "local_comm_id": conn.local_id,
            "remote_comm_id": conn.remote_id,
            "local_qpn": params.qpn,
            "starting_psn": params.starting_psn,
            "responder_resources": params.responder_resources,
            "initiator_depth": params.initiator_depth,
            "target_ack_delay": 15,
            "rnr_retry_count": params.rnr_retry_count,
            "local_ca_guid": self.ca_guid,
        }
        conn.state = CmState.REP_SENT
        self._send(conn, CmMad(CmAttr.REP, conn.tid, values, params.private_data), now)

    def reject(
        self, comm_id: int, now: float, *, reason: int = RejReason.CONSUMER_DEFINED, private_data: bytes = b""
    ) -> None:
        """Refuse a REQ (passive) or a REP (active) with a REJ; the connection is gone."""
        conn = self._user_conn(comm_id, CmState.REQ_RCVD, CmState.MRA_REQ_SENT, CmState.REP_RCVD)
        msg = 1 if conn.state is CmState.REP_RCVD else 0
        rej = self._rej(conn.tid, conn.local_id, conn.remote_id, int(reason), msg)
        rej = CmMad(rej.attr, rej.tid, rej.values, private_data)
        self._send(conn, rej, None)
        # Kept through TIMEWAIT only to answer a repeated REQ or REP with the same REJ; the
        # peer's QP is free for a new connection at once.
        if self._by_qp.get((conn.remote_guid, conn.remote_qpn)) == conn.local_id:
            del self._by_qp[(conn.remote_guid, conn.remote_qpn)]
        conn.remote_qpn = -1
        self._enter_timewait(conn, now)
        if conn.active:  # a peer configured as we are repeats its REP this long
            conn.deadline = now + max(self.timewait, self._longest_span())

    def send_rtu(self, comm_id: int, now: float, *, private_data: bytes = b"") -> None:
        """Active side, once its QP is in RTS: send the RTU (ESTABLISHED)."""
        conn = self._user_conn(comm_id, CmState.REP_RCVD)
        ids = {"local_comm_id": conn.local_id, "remote_comm_id": conn.remote_id}
        conn.state = CmState.ESTABLISHED
        self._send(conn, CmMad(CmAttr.RTU, conn.tid, ids, private_data), None)
        conn.deadline = None
        self._event(CmEventKind.ESTABLISHED, conn)

    def establish(self, comm_id: int) -> None:
        """Passive side: the QP received data before the RTU (``IB_EVENT_COMM_EST``): connected."""
        conn = self._user_conn(comm_id, CmState.REP_SENT)
        conn.state = CmState.ESTABLISHED
        conn.deadline = None
        self._event(CmEventKind.ESTABLISHED, conn)

    def disconnect(self, comm_id: int, now: float, *, private_data: bytes = b"") -> None:
        """Send a DREQ (DREQ_SENT); the DREP, or running out of retries, ends in TIMEWAIT."""
        conn = self._user_conn(comm_id, CmState.ESTABLISHED, CmState.REP_SENT)
        values = {
            "local_comm_id": conn.local_id,
            "remote_comm_id": conn.remote_id,
            "remote_qpn": conn.remote_qpn,
        }
        conn.state = CmState.DREQ_SENT
        self._send(conn, CmMad(CmAttr.DREQ, self.rng.getrandbits(64), values, private_data), now)

    def disconnect_all(self, now: float) -> list[int]:
        """Send a DREQ on every established connection; their handles. The kernel does this for
        a process that exits: closing its rdma_cm file destroys its IDs (``ucma.c``), and
        ``cm_destroy_id()`` sends a DREQ for an established one (``cm.c``)."""
        live = [c.local_id for c in self._conns.values() if c.state is CmState.ESTABLISHED]
        for comm_id in live:
            self.disconnect(comm_id, now)
        return live

    def destroy(self, comm_id: int) -> None:
        """Forget a connection at once (no message)."""
        conn = self._conns.get(comm_id)
        if conn is not None:
            self._close(conn)

    # -- output ---------------------------------------------------------------------------------------

    @property
    def has_output(self) -> bool:
        """Whether `poll_transmit` has MADs to give (cheap: the pump asks at every turn)."""
        return bool(self._out)

    def poll_transmit(self) -> list[tuple[Hashable, CmMad]]:
        out = list(self._out)
        self._out.clear()
        return out

    def next_event(self) -> CmEvent | None:
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        if not self._conns:
            return None
        deadlines = [c.deadline for c in self._conns.values() if c.deadline is not None]
        return min(deadlines) if deadlines else None

    def handle_timer(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if conn.deadline is None or conn.deadline > now:
                continue
            if conn.state is CmState.TIMEWAIT:
                self._close(conn)
            elif conn.retries < self.max_retries and conn.last is not None:
                conn.retries += 1
                conn.deadline = now + self._timeout()
                self._out.append((conn.peer, conn.last))
                self._count("retransmits")
            elif conn.state is CmState.DREQ_SENT:
                self._enter_timewait(conn, now)
                self._event(CmEventKind.DISCONNECTED, conn)
            else:  # REQ_SENT or REP_SENT gives up; REQ_RCVD was never answered: tell the peer
                rej = self._rej(conn.tid, conn.local_id, conn.remote_id, RejReason.TIMEOUT, 2)
                self._reply(conn.peer, rej)
                self._event(CmEventKind.TIMEOUT, conn, reason=RejReason.TIMEOUT)
                self._close(conn)

    # -- input --------------------------------------------------------------------------------------

    def receive(self, peer: Hashable, mad: CmMad, now: float) -> None:
        """One CM MAD from `peer` (the transport's address of its sender); never raises."""
        if mad.attr is CmAttr.REQ:
            self._on_req(peer, mad, now)
            return
        if mad.attr not in (CmAttr.REP, CmAttr.RTU, CmAttr.MRA, CmAttr.REJ, CmAttr.DREQ, CmAttr.DREP):
            self._count("unsupported")
            return
        conn = self._conns.get(mad["remote_comm_id"])
        if conn is None and mad.attr is CmAttr.REJ and mad["remote_comm_id"] == 0:
            conn = self._by_tid(peer, mad.tid)  # a REJ of our REQ before the peer had an ID for it
        if conn is None:
            if mad.attr is CmAttr.DREQ:  # IBTA §12.9.8.7: a DREQ for nothing still gets its DREP
                self._reply(peer, self._drep(mad))
            self._count("unknown_comm_id")
            return
        if conn.peer != peer:
            self._count("wrong_peer")
            return
        if conn.remote_id and mad["local_comm_id"] != conn.remote_id:
            self._count("wrong_remote_comm_id")
            return
        handler = ACCEPTS.get((conn.state, mad.attr))
        if handler is None:
            self._count(f"unexpected_{mad.attr.name}_in_{conn.state.name}")
            return
        method: Callable[[_Conn, CmMad, float], None] = getattr(self, handler)
        method(conn, mad, now)

    def _by_tid(self, peer: Hashable, tid: int) -> _Conn | None:
        for conn in self._conns.values():
            if conn.active and conn.peer == peer and conn.tid == tid and conn.state is CmState.REQ_SENT:
                return conn
        return None

    @staticmethod
    def _drep(dreq: CmMad) -> CmMad:
        ids = {"local_comm_id": dreq["remote_comm_id"], "remote_comm_id": dreq["local_comm_id"]}
        return CmMad(CmAttr.DREP, dreq.tid, ids)

    def _on_req(self, peer: Hashable, req: CmMad, now: float) -> None:
        remote_id = req["local_comm_id"]
        known = self._by_remote.get((peer, remote_id))
        if known is not None:
            self._dup_req(self._conns[known], req)
            return
        reply = self._refusal(peer, req)
        if reply is not None:
            self._count(f"rej_{RejReason(reply['reason']).name.lower()}")
            self._reply(peer, reply)
            return
        conn = _Conn(
            self._new_id(), peer, False, CmState.REQ_RCVD, req.tid, remote_id=remote_id,
            remote_qpn=req["local_qpn"], remote_guid=req["local_ca_guid"], service_id=req["service_id"],
        )  # fmt: skip
        # The user has until the requester gives up (its timeout × retries, at most ours) to answer.
        tries = req["max_cm_retries"] + 1
        theirs = response_timeout(req["remote_cm_response_timeout"]) * tries
        conn.deadline = now + max(min(theirs, self._timeout() * (self.max_retries + 1)), self._timeout())
        self._add(conn)
        self._by_remote[(peer, remote_id)] = conn.local_id
        self._by_qp[(conn.remote_guid, conn.remote_qpn)] = conn.local_id
        self._event(CmEventKind.REQ_RECEIVED, conn, req)

    def _refusal(self, peer: Hashable, req: CmMad) -> CmMad | None:
        """The REJ a new REQ gets, or None to take it."""
        remote_id = req["local_comm_id"]
        if req["transport_type"] != 0:
            reason = RejReason.INVALID_TRANSPORT_TYPE
        elif req["service_id"] not in self._listening:
            reason = RejReason.INVALID_SERVICE_ID
        elif req["local_qpn"] in _SPECIAL_QPNS:
            reason = RejReason.UNSUPPORTED_REQ
        elif (req["local_ca_guid"], req["local_qpn"]) in self._by_qp:
            reason = RejReason.STALE_CONN
        elif (
            len(self._conns) >= self.max_connections
            or self._pending() >= self.max_pending
            or len(self._of_peer(peer, *_WAITING)) >= self.max_pending_per_peer
        ):
            reason = RejReason.NO_RESOURCES
        else:
            return None
        return self._rej(req.tid, 0, remote_id, reason, 0)

    def _pending(self) -> int:
        return sum(1 for c in self._conns.values() if c.state in _WAITING)

    def _dup_req(self, conn: _Conn, req: CmMad) -> None:
        self._count("duplicate_REQ")
        if conn.state in (CmState.REQ_RCVD, CmState.MRA_REQ_SENT):  # still deciding: ask for patience
            conn.state = CmState.MRA_REQ_SENT
            mra = {
                "local_comm_id": conn.local_id,
                "remote_comm_id": conn.remote_id,
                "message_mraed": 0,
                "service_timeout": self._mra_timeout(),
            }
            self._reply(conn.peer, CmMad(CmAttr.MRA, conn.tid, mra))
        elif conn.state is CmState.REP_SENT and conn.last is not None:
            self._reply(conn.peer, conn.last)
        elif conn.state is CmState.TIMEWAIT:
            if conn.last is not None and conn.last.attr is CmAttr.REJ:  # we refused it: say so again
                self._reply(conn.peer, conn.last)
            else:
                self._reply(
                    conn.peer, self._rej(req.tid, conn.local_id, conn.remote_id, RejReason.STALE_CONN, 0)
                )

    def _on_rep(self, conn: _Conn, rep: CmMad, now: float) -> None:
        key = (rep["local_ca_guid"], rep["local_qpn"])
        if key in self._by_qp:
            rej = self._rej(conn.tid, conn.local_id, rep["local_comm_id"], RejReason.STALE_CONN, 1)
            self._reply(conn.peer, rej)
            self._event(CmEventKind.REJECTED, conn, rep, RejReason.STALE_CONN)
            self._close(conn)
            return
        conn.remote_id = rep["local_comm_id"]
        conn.remote_qpn, conn.remote_guid = rep["local_qpn"], rep["local_ca_guid"]
        self._by_remote[(conn.peer, conn.remote_id)] = conn.local_id
        self._by_qp[key] = conn.local_id
        conn.state = CmState.REP_RCVD
        conn.deadline = None
        self._event(CmEventKind.REP_RECEIVED, conn, rep)

    def _on_mra(self, conn: _Conn, mra: CmMad, now: float) -> None:
        expected = 0 if conn.state is CmState.REQ_SENT else 1
        if mra["message_mraed"] != expected:
            self._count("mra_for_another_message")
            return
        conn.deadline = now + self._timeout() + response_timeout(mra["service_timeout"])

    def _on_rej(self, conn: _Conn, rej: CmMad, now: float) -> None:
        self._event(CmEventKind.REJECTED, conn, rej, rej["reason"])
        self._close(conn)

    def _on_rtu(self, conn: _Conn, rtu: CmMad, now: float) -> None:
        conn.state = CmState.ESTABLISHED
        conn.deadline = None
        self._event(CmEventKind.ESTABLISHED, conn, rtu)

    def _on_dreq(self, conn: _Conn, dreq: CmMad, now: float) -> None:
        if conn.state is CmState.REP_SENT:  # the peer is connected: its RTU was lost
            self._event(CmEventKind.ESTABLISHED, conn)
        drep = self._drep(dreq)
        conn.last = drep
        self._reply(conn.peer, drep)
        self._enter_timewait(conn, now)
        self._event(CmEventKind.DISCONNECTED, conn, dreq)

    def _answer_dreq(self, conn: _Conn, dreq: CmMad, now: float) -> None:
        self._count("duplicate_DREQ")
        self._reply(conn.peer, self._drep(dreq))

    def _on_drep(self, conn: _Conn, drep: CmMad, now: float) -> None:
        self._enter_timewait(conn, now)
        self._event(CmEventKind.DISCONNECTED, conn, drep)

    def _resend(self, conn: _Conn, mad: CmMad, now: float) -> None:
        if conn.last is not None:
            self._count(f"duplicate_{mad.attr.name}")
            self._reply(conn.peer, conn.last)

    def _resend_rej(self, conn: _Conn, mad: CmMad, now: float) -> None:
        if conn.last is not None and conn.last.attr is CmAttr.REJ:
            self._resend(conn, mad, now)
        else:
            self._ignore(conn, mad, now)

    def _ignore(self, conn: _Conn, mad: CmMad, now: float) -> None:
        self._count(f"duplicate_{mad.attr.name}")

    def __repr__(self) -> str:
        states: dict[str, Any] = {}
        for c in self._conns.values():
            states[c.state.name] = states.get(c.state.name, 0) + 1
        return f"<CmEndpoint {states} listening={sorted(self._listening)}>"
