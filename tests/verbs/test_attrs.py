"""The verbs backend's pure decisions: transition masks, descriptors -> QP attributes, MR access."""

from collections.abc import Callable
from ipaddress import IPv6Address

import pytest

from rdmakit.engine.states import TRANSITIONS, QpState
from rdmakit.engine.types import Access
from rdmakit.transport.device import gid_of
from rdmakit.verbs import (
    ConnectOptions,
    QpAttrMask,
    VerbsError,
    connect_params,
    export_descriptor,
    gid_text,
    mr_access,
    mtu_enum,
    mtu_from_enum,
    parse_peer,
    path_mtu,
    qp_access,
    transition_mask,
)

S = QpState
M = QpAttrMask
RXE = IPv6Address("::ffff:10.77.0.2")


def _verbs_peer(**over: object) -> dict[str, object]:
    d = export_descriptor(gid=RXE, qpn=0x11, psn=0x123456, mtu=1024)
    d.update(over)
    return d


# -- ibv_modify_qp masks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frm", "to", "mask"),
    [
        # pyverbs qp.pyx _get_comp_mask (reference §4), each with IBV_QP_STATE.
        (S.RESET, S.INIT, M.STATE | M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS),
        (
            S.INIT, S.RTR,
            M.STATE | M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN | M.MAX_DEST_RD_ATOMIC | M.MIN_RNR_TIMER,
        ),
        (S.RTR, S.RTS, M.STATE | M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY | M.SQ_PSN | M.MAX_QP_RD_ATOMIC),
        (S.RTS, S.ERR, M.STATE),
        (S.RTS, S.RESET, M.STATE),
        (S.RESET, S.ERR, M.STATE),
    ],
)  # fmt: skip
def test_transition_masks(frm: QpState, to: QpState, mask: QpAttrMask) -> None:
    assert transition_mask(frm, to) == mask


def test_mask_values_are_libibverbs() -> None:
    """Spot values of enum ibv_qp_attr_mask (infiniband/verbs.h)."""
    assert (M.STATE, M.AV, M.PATH_MTU, M.SQ_PSN, M.MAX_DEST_RD_ATOMIC, M.DEST_QPN) == (
        1, 128, 256, 65536, 131072, 1 << 20,
    )  # fmt: skip


def test_masks_name_what_the_engine_table_requires() -> None:
    """The verbs masks and the engine's state table (IBTA §11.2.5.2) agree on required attributes."""
    names = {
        "port": M.PORT, "pkey_index": M.PKEY_INDEX, "access": M.ACCESS_FLAGS, "remote": M.AV,
        "path_mtu": M.PATH_MTU, "dest_qpn": M.DEST_QPN, "rq_psn": M.RQ_PSN,
        "max_dest_rd_atomic": M.MAX_DEST_RD_ATOMIC, "min_rnr_timer": M.MIN_RNR_TIMER,
        "timeout": M.TIMEOUT, "retry_cnt": M.RETRY_CNT, "rnr_retry": M.RNR_RETRY, "sq_psn": M.SQ_PSN,
        "max_rd_atomic": M.MAX_QP_RD_ATOMIC,
    }  # fmt: skip
    for frm, to in ((S.RESET, S.INIT), (S.INIT, S.RTR), (S.RTR, S.RTS)):
        t = TRANSITIONS[(frm, to)]
        engine = M(0)
        for name in t.required:
            engine |= names[name]
        # The engine carries the address vector as an optional opaque peer (sans-IO).
        verbs = transition_mask(frm, to) & ~M.STATE & ~(M.AV if (frm, to) == (S.INIT, S.RTR) else M(0))
        assert verbs == engine, (frm, to)


@pytest.mark.parametrize(("frm", "to"), [(S.RESET, S.RTR), (S.INIT, S.RTS), (S.RTS, S.INIT), (S.ERR, S.RTS)])
def test_other_transitions_are_bad_state(frm: QpState, to: QpState) -> None:
    with pytest.raises(VerbsError) as exc:
        transition_mask(frm, to)
    assert exc.value.code == "BAD_STATE"
    assert exc.value.fault == "caller"


# -- MTU ----------------------------------------------------------------------------------


def test_mtu_enum_round_trip() -> None:
    assert [mtu_enum(m) for m in (256, 512, 1024, 2048, 4096)] == [1, 2, 3, 4, 5]  # ibv_mtu
    assert [mtu_from_enum(e) for e in (1, 2, 3, 4, 5)] == [256, 512, 1024, 2048, 4096]
    with pytest.raises(VerbsError):
        mtu_enum(1500)


@pytest.mark.parametrize(
    ("peer", "own", "path"),
    [(4096, 1024, 1024), (1024, 4096, 1024), (4096, 4096, 4096), (1500, 4096, 1024), (1 << 20, 2048, 2048)],
)
def test_path_mtu_is_the_largest_both_carry(peer: int, own: int, path: int) -> None:
    """Soft devices export 4096, rxe over a 1500-byte NIC 1024: both must use 1024."""
    assert path_mtu(peer, own) == path


def test_path_mtu_below_256_is_the_peers_fault() -> None:
    with pytest.raises(VerbsError) as exc:
        path_mtu(200, 1024)
    assert exc.value.fault == "peer"


# -- descriptors ---------------------------------------------------------------------------


def test_gid_text_is_the_soft_engines_form() -> None:
    for ip in ("10.77.0.2", "127.0.0.1", "fd00::1"):
        assert gid_text(IPv6Address(gid_of(ip))) == gid_of(ip)
    assert gid_text(RXE) == "0000:0000:0000:0000:0000:ffff:0a4d:0002"


def test_export_has_the_soft_backends_keys() -> None:
    d = export_descriptor(gid=RXE, qpn=17, psn=99, mtu=1024)
    assert d == {
        "transport": "verbs", "gid": "0000:0000:0000:0000:0000:ffff:0a4d:0002", "ip": "10.77.0.2",
        "port": 4791, "qpn": 17, "psn": 99, "mtu": 1024,
    }  # fmt: skip


def test_a_soft_engine_descriptor_is_accepted(new_ip: Callable[[], str]) -> None:
    """A verbs QP connects to the soft engine on UDP: the descriptor SoftBackendQP.export() writes."""
    from rdmakit.doca.soft import SoftBackendDevice
    from rdmakit.engine import QpCaps

    ip = new_ip()
    dev = SoftBackendDevice("roce-udp", ip)
    try:
        qp = dev.create_qp(QpCaps())
        desc = qp.export()
        peer = parse_peer(desc)
        assert peer.transport == "roce-udp"
        assert peer.gid == IPv6Address(f"::ffff:{ip}")
        assert (peer.qpn, peer.psn, peer.mtu) == (qp.qpn, desc["psn"], 4096)
    finally:
        dev.close()


def test_ip_alone_names_the_ipv4_mapped_gid() -> None:
    peer = parse_peer({"transport": "roce-udp", "ip": "10.77.0.1", "qpn": 5, "psn": 0, "mtu": 4096})
    assert peer.gid == IPv6Address("::ffff:10.77.0.1")
    assert peer.port == 4791


@pytest.mark.parametrize(
    ("over", "code", "fault"),
    [
        ({"transport": "tcp"}, "NOT_SUPPORTED", "caller"),
        ({"transport": None}, "NOT_SUPPORTED", "caller"),
        ({"port": 4792}, "NOT_SUPPORTED", "caller"),  # rxe sends to 4791 only
        ({"ip": "10.77.0.9"}, "INVALID_VALUE", "peer"),  # rxe would drop every packet (check_addr)
        ({"gid": "not-a-gid"}, "INVALID_VALUE", "peer"),
        ({"qpn": 1}, "INVALID_VALUE", "peer"),
        ({"qpn": 1 << 24}, "INVALID_VALUE", "peer"),
        ({"qpn": True}, "INVALID_VALUE", "peer"),
        ({"qpn": "17"}, "INVALID_VALUE", "peer"),
        ({"psn": -1}, "INVALID_VALUE", "peer"),
        ({"psn": 1 << 24}, "INVALID_VALUE", "peer"),
        ({"mtu": 128}, "INVALID_VALUE", "peer"),
        ({"mtu": None}, "INVALID_VALUE", "peer"),
    ],
)
def test_bad_descriptors(over: dict[str, object], code: str, fault: str) -> None:
    with pytest.raises(VerbsError) as exc:
        parse_peer(_verbs_peer(**over))
    assert (exc.value.code, exc.value.fault) == (code, fault)


def test_descriptor_without_an_address() -> None:
    d = _verbs_peer()
    del d["gid"], d["ip"]
    with pytest.raises(VerbsError) as exc:
        parse_peer(d)
    assert exc.value.fault == "peer"


def test_connect_params_pingpong_psns_and_route() -> None:
    """rq_psn is the peer's psn, sq_psn our own (ibv_rc_pingpong / the soft engine's connect_qp)."""
    soft = {"transport": "roce-udp", "gid": gid_of("10.77.0.1"), "ip": "10.77.0.1", "port": 4791,
            "qpn": 0xABCDE, "psn": 0x777, "mtu": 4096}  # fmt: skip
    p = connect_params(parse_peer(soft), own_psn=0x999, own_mtu=1024, port_num=1, sgid_index=1)
    assert (p.rq_psn, p.sq_psn, p.dest_qpn) == (0x777, 0x999, 0xABCDE)
    assert p.path_mtu == 1024
    assert p.dgid == "0000:0000:0000:0000:0000:ffff:0a4d:0001"
    assert (p.sgid_index, p.port_num, p.hop_limit) == (1, 1, 64)  # not pyverbs' default TTL of 1
    assert p.access == int(
        Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
    )
    assert (p.timeout, p.retry_cnt, p.rnr_retry, p.min_rnr_timer) == (14, 6, 7, 12)


def test_connect_params_agree_with_the_soft_engine(new_ip: Callable[[], str]) -> None:
    """Both ends of a soft <-> verbs connection expect the PSN the other sends first."""
    from rdmakit.doca.soft import SoftBackendDevice
    from rdmakit.engine import QpCaps

    dev = SoftBackendDevice("roce-udp", new_ip())
    try:
        soft = dev.create_qp(QpCaps())
        verbs_desc = export_descriptor(gid=IPv6Address(f"::ffff:{new_ip()}"), qpn=0x42, psn=0x1234, mtu=1024)
        soft.connect(verbs_desc)
        soft_desc = soft.export()
        p = connect_params(parse_peer(soft_desc), own_psn=0x1234, own_mtu=1024, port_num=1, sgid_index=1)
        attrs = soft.engine_qp.attrs
        assert attrs.rq_psn == 0x1234 == p.sq_psn  # the soft QP expects what verbs sends first
        assert attrs.sq_psn == p.rq_psn == soft_desc["psn"]  # and sends what verbs expects
        assert attrs.path_mtu == p.path_mtu == 1024
        assert attrs.dest_qpn == 0x42
        assert p.dest_qpn == soft.qpn
    finally:
        dev.close()


def test_connect_params_cap_rd_atomic_and_check_ranges() -> None:
    peer = parse_peer(_verbs_peer())
    p = connect_params(
        peer, own_psn=0, own_mtu=1024, port_num=1, sgid_index=0,
        options=ConnectOptions(max_rd_atomic=64, max_dest_rd_atomic=0),
        max_rd_atomic=16, max_dest_rd_atomic=16,
    )  # fmt: skip
    assert (p.max_rd_atomic, p.max_dest_rd_atomic) == (16, 1)
    for bad in (ConnectOptions(retry_cnt=8), ConnectOptions(timeout=32), ConnectOptions(access=0x10)):
        with pytest.raises(VerbsError) as exc:
            connect_params(peer, own_psn=0, own_mtu=1024, port_num=1, sgid_index=0, options=bad)
        assert exc.value.code == "INVALID_VALUE"
    with pytest.raises(VerbsError):
        connect_params(peer, own_psn=1 << 24, own_mtu=1024, port_num=1, sgid_index=0)


# -- MR access ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("access", "readonly", "ok"),
    [
        (Access.NONE, True, True),
        (Access.REMOTE_READ, True, True),  # read-only memory may be read remotely
        (Access.LOCAL_WRITE, True, False),
        (Access.LOCAL_WRITE | Access.REMOTE_WRITE, True, False),
        (Access.REMOTE_WRITE, False, False),  # IBTA §10.6.3.1: needs LOCAL_WRITE
        (Access.REMOTE_ATOMIC, False, False),
        (Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC, False, True),
        (Access(0x10), False, False),  # not an rdmakit access flag (IBV_ACCESS_MW_BIND)
    ],
)
def test_mr_access(access: Access, readonly: bool, ok: bool) -> None:
    if ok:
        assert mr_access(access, readonly=readonly) == access
    else:
        with pytest.raises(VerbsError) as exc:
            mr_access(access, readonly=readonly)
        assert (exc.value.code, exc.value.fault) == ("INVALID_VALUE", "caller")


def test_qp_access_needs_no_local_write() -> None:
    """A responder QP allowing remote writes only is valid (ibv_modify_qp's qp_access_flags)."""
    remote = Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
    assert qp_access(remote) == remote
    p = connect_params(
        parse_peer(_verbs_peer()), own_psn=0, own_mtu=1024, port_num=1, sgid_index=1,
        options=ConnectOptions(access=int(Access.REMOTE_WRITE)),
    )  # fmt: skip
    assert p.access == Access.REMOTE_WRITE
    with pytest.raises(VerbsError):
        qp_access(0x20)


def test_mr_access_values_are_ibv_access_flags() -> None:
    """IBV_ACCESS_LOCAL_WRITE 1, REMOTE_WRITE 2, REMOTE_READ 4, REMOTE_ATOMIC 8 pass through unchanged."""
    for bit in (1, 2 | 1, 4, 8 | 1):
        assert int(mr_access(bit, readonly=False)) == bit
