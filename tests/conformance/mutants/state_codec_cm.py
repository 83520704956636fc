"""QP state machine, codec and connection manager bugs (IBTA Vol. 1 §10.3, §9.2, Annex A17, ch. 12)."""

import socket
from typing import Any

from rdmakit.engine import cm as cm_mod
from rdmakit.engine.states import QpState
from rdmakit.transport import codec_py
from rdmakit.transport import gsi as gsi_mod
from rdmakit.wire import IcrcFlow
from rdmakit.wire import decode as _decode
from rdmakit.wire.cm import CmAttr, RejReason
from rdmakit.wire.ud import GSI_QKEY, decode_ud_send

from . import _MASK, QueuePair, Responder, mutant, patch

# -- the QP state machine (IBTA §10.3) -------------------------------------------------------


@mutant("error-state-still-answers", "qp", "resp.err.silent", "resp.err.no_dup_reply")
def _error_still_answers() -> None:
    """A QP in ERR still receives and answers requests."""
    orig = QueuePair._set_state

    def set_state(self: Any, st: Any) -> None:
        orig(self, st)
        if st is QpState.ERR:
            self._rx = True

    patch(QueuePair, "_set_state", set_state)


@mutant("rq-psn-off-by-one", "qp", "resp.send.only", "resp.write.only")
def _rq_psn_off() -> None:
    """Modify to RTR sets the expected PSN to rq_psn + 1."""
    orig = Responder.configure

    def configure(self: Any, *, rq_psn: int) -> None:
        orig(self, rq_psn=(rq_psn + 1) & _MASK)

    patch(Responder, "configure", configure)


@mutant("min-rnr-timer-not-applied", "qp", "resp.rnr.nak", "resp.rnr.timer_code")
def _min_rnr_not_applied() -> None:
    """Modify to RTR does not apply min_rnr_timer: RNR NAKs carry timer code 0."""
    orig = QueuePair.modify

    def modify(self: Any, *args: Any, **kw: Any) -> None:
        orig(self, *args, **kw)
        self.resp.min_rnr_timer = 0

    patch(QueuePair, "modify", modify)


@mutant("path-mtu-not-applied", "qp", "resp.send.multi", "resp.write.multi")
def _mtu_not_applied() -> None:
    """Modify to RTR does not apply path_mtu to the responder: it checks lengths against 1024."""
    orig = QueuePair.modify

    def modify(self: Any, *args: Any, **kw: Any) -> None:
        orig(self, *args, **kw)
        self.resp.mtu = 1024

    patch(QueuePair, "modify", modify)


@mutant("err-flush-forgets-receives", "qp", "resp.err.access_flush", "resp.err.invalid_flush")
def _flush_forgets_receives() -> None:
    """Entering ERR drops the receive queue without completing its WQEs with WR_FLUSH_ERR."""
    orig = Responder.flush

    def flush(self: Any) -> list[int]:
        orig(self)
        return []

    patch(Responder, "flush", flush)


# -- the codec (IBTA §9.2, Annex A17.3.3) -----------------------------------------------------


@mutant("icrc-not-checked", "codec", "resp.hdr.bad_icrc")
def _icrc_not_checked() -> None:
    """A request with a bad ICRC is decoded and executed."""
    orig = codec_py.PythonCodec.check_decode

    def check_decode(self: Any, seg: Any, idx: int, states: Any, flow: Any) -> Any:
        r = orig(self, seg, idx, states, flow)
        if r == 0:
            view = memoryview(seg).cast("B")
            return _decode(view[: len(view) - 4])
        return r

    patch(codec_py.PythonCodec, "check_decode", check_decode)


@mutant("icrc-v6-hop-limit-covered", "codec", "req.ip6.header", "resp.ip6.header", "resp.ip6.masked_fields",
        ipv6=True)  # fmt: skip
def _icrc_v6_hop_limit() -> None:
    """The IPv6 pseudo-header keeps the hop limit the sender puts there (64) instead of ones.

    Two such stacks on one link still agree, and IPv4 is untouched: only a router, or an
    independent ICRC over IPv6 (the tester's scapy oracle), tells.
    """
    from rdmakit.wire import icrc as icrc_mod

    pack = icrc_mod._V6_MASKED.pack

    def ipv6(cls: Any, src: bytes, dst: bytes, sport: int, dport: int, *, next_header: int = 17) -> Any:
        def header(n: int, k: int) -> bytes:
            return pack(0x6FFFFFFF, 8 + n, next_header, 64, src, dst, sport, dport, 8 + n, 0xFFFF)

        return cls._checked(header, True)

    patch(IcrcFlow, "ipv6", classmethod(ipv6))


@mutant("tver-not-checked", "codec", "resp.hdr.tver")
def _tver_not_checked() -> None:
    """A packet with TVer other than 0 is decoded as if it were 0."""
    orig = _decode

    def decode(data: Any) -> Any:
        b = bytearray(data)
        if len(b) > 1:
            b[1] &= 0xF0
        return orig(b)

    patch(codec_py, "decode", decode)


@mutant("pad-not-stripped", "codec", "resp.pad.stripped")
def _pad_not_stripped() -> None:
    """The pad bytes PadCnt counts are delivered as data."""
    orig = _decode

    def decode(data: Any) -> Any:
        pkt = orig(data)
        pad = (data[1] >> 4) & 3
        if pad and pkt.payload is not None:
            n = len(data)
            pkt = pkt._replace(payload=bytes(data[n - pad - len(pkt.payload) : n]))
        return pkt

    patch(codec_py, "decode", decode)


@mutant("pad-bytes-not-zero", "codec", "req.send.pad")
def _pad_not_zero() -> None:
    """The pad bytes of a request are sent as 0xA5, not 0."""
    patch(codec_py, "_PADS", (b"", b"\xa5", b"\xa5\xa5", b"\xa5\xa5\xa5"))


@mutant("reserved-bit-set", "codec", "req.hdr.reserved")
def _reserved_bit_set() -> None:
    """The BTH's Resv7 field goes out as 1 instead of 0."""
    orig = codec_py.headers

    def headers(pkt: Any) -> tuple[bytes, bytes]:
        hdr, masked = orig(pkt)
        h, m = bytearray(hdr), bytearray(masked)
        h[8] |= 1
        m[8] |= 1
        return bytes(h), bytes(m)

    patch(codec_py, "headers", headers)


# -- the connection manager and QP1 (IBTA ch. 12, §10.2.5) -------------------------------------


@mutant("cm-no-rej-for-unknown-service", "cm", "cm.req.no_listener")
def _cm_silent_refusal() -> None:
    """A REQ for a service nobody listens to is dropped instead of REJected (reason 8)."""
    orig = cm_mod.CmEndpoint._reply

    def reply(self: Any, peer: Any, mad: Any) -> None:
        if mad.attr is CmAttr.REJ and mad["reason"] == RejReason.INVALID_SERVICE_ID:
            return
        orig(self, peer, mad)

    patch(cm_mod.CmEndpoint, "_reply", reply)


@mutant("cm-unknown-dreq-ignored", "cm", "cm.dreq.unknown")
def _cm_unknown_dreq() -> None:
    """A DREQ for no known connection is dropped instead of answered with a DREP."""
    orig = cm_mod.CmEndpoint.receive

    def receive(self: Any, peer: Any, mad: Any, now: float) -> None:
        if mad.attr is CmAttr.DREQ and mad["remote_comm_id"] not in self._conns:
            return
        orig(self, peer, mad, now)

    patch(cm_mod.CmEndpoint, "receive", receive)


@mutant("cm-duplicate-req-is-new", "cm", "cm.req.duplicate")
def _cm_dup_req() -> None:
    """A repeated REQ is taken for a new connection request (no lookup by the peer's comm ID)."""
    orig = cm_mod.CmEndpoint._on_req

    def on_req(self: Any, peer: Any, req: Any, now: float) -> None:
        self._by_remote.pop((peer, req["local_comm_id"]), None)
        self._by_qp.pop((req["local_ca_guid"], req["local_qpn"]), None)
        orig(self, peer, req, now)

    patch(cm_mod.CmEndpoint, "_on_req", on_req)


@mutant("cm-stale-req-accepted", "cm", "cm.req.stale")
def _cm_stale_accepted() -> None:
    """A REQ naming a QP that already has a connection is accepted instead of REJected (stale)."""
    orig = cm_mod.CmEndpoint._refusal

    def refusal(self: Any, peer: Any, req: Any) -> Any:
        saved, self._by_qp = self._by_qp, {}
        try:
            return orig(self, peer, req)
        finally:
            self._by_qp = saved

    patch(cm_mod.CmEndpoint, "_refusal", refusal)


@mutant("qp1-qkey-unchecked", "cm", "cm.ud.bad_qkey")
def _qp1_qkey() -> None:
    """QP1 takes a MAD whatever its Q_Key."""

    def decode(body: Any) -> Any:
        return decode_ud_send(body)._replace(qkey=GSI_QKEY)

    patch(gsi_mod, "decode_ud_send", decode)


@mutant("sport-alternates", "codec", "req.udp.sport")
def _sport_alternates() -> None:
    """Every other packet of a QP leaves from another UDP source port (a socket per send path)."""
    orig = codec_py.PythonCodec.send_packet
    alt: dict[str, socket.socket] = {}
    sent = [0]

    def send_packet(self: Any, sock: socket.socket, addr: Any, pkt: Any, states: Any, flow: Any) -> int:
        sent[0] += 1
        ip = sock.getsockname()[0]
        if sent[0] % 2 or sock.family != socket.AF_INET:
            return orig(self, sock, addr, pkt, states, flow)
        other = alt.get(ip)
        if other is None:
            other = alt[ip] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            other.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO: DF, ID 0
            other.bind((ip, 0))
        sport = other.getsockname()[1]
        icrc = IcrcFlow.ipv4(socket.inet_aton(ip), socket.inet_aton(addr[0]), sport, addr[1])
        return orig(self, other, addr, pkt, {}, icrc)

    patch(codec_py.PythonCodec, "send_packet", send_packet)
