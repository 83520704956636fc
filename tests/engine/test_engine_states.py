"""The modify-QP table (IBTA §10.3.1, §11.2.5.2) against an independent copy of Linux's RC masks."""

import random
from dataclasses import fields
from typing import Any

import pytest

from rdmakit.engine import (
    TRANSITIONS,
    Access,
    CompletionQueue,
    EngineError,
    ModifyAttrs,
    ProtectionDomain,
    QpAttrs,
    QpCaps,
    QpState,
    QueuePair,
)
from rdmakit.engine.attrs import ATTRS
from rdmakit.engine.states import ALL_ATTRS

S = QpState

#: Linux ``qp_state_table`` RC column (drivers/infiniband/core/verbs.c), written
#: out by hand with this API's names; AV is ``remote``; ALT_PATH and
#: PATH_MIG_STATE dropped (no APM on RoCE).
KERNEL_RC: dict[tuple[QpState, QpState], tuple[set[str], set[str]]] = {
    (S.RESET, S.RESET): (set(), set()),
    (S.RESET, S.INIT): ({"pkey_index", "port", "access"}, set()),
    (S.INIT, S.INIT): (set(), {"pkey_index", "port", "access"}),
    (S.INIT, S.RTR): (
        {"remote", "path_mtu", "dest_qpn", "rq_psn", "max_dest_rd_atomic", "min_rnr_timer"},
        {"access", "pkey_index"},
    ),
    (S.RTR, S.RTS): (
        {"timeout", "retry_cnt", "rnr_retry", "sq_psn", "max_rd_atomic"},
        {"cur_state", "access", "min_rnr_timer"},
    ),
    (S.RTS, S.RTS): (set(), {"cur_state", "access", "min_rnr_timer"}),
    (S.RTS, S.SQD): (set(), {"en_sqd_async_notify"}),
    (S.SQD, S.RTS): (set(), {"cur_state", "access", "min_rnr_timer"}),
    (S.SQD, S.SQD): (
        set(),
        {
            "port",
            "remote",
            "timeout",
            "retry_cnt",
            "rnr_retry",
            "max_rd_atomic",
            "max_dest_rd_atomic",
            "access",
            "pkey_index",
            "min_rnr_timer",
        },
    ),
    (S.SQE, S.RTS): (set(), set()),
    **{(s, S.RESET): (set(), set()) for s in (S.INIT, S.RTR, S.RTS, S.SQD, S.SQE, S.ERR)},
    **{(s, S.ERR): (set(), set()) for s in (S.INIT, S.RTR, S.RTS, S.SQD, S.SQE, S.ERR)},
}

VALUES: dict[str, Any] = {
    "port": 1, "pkey_index": 0, "access": Access.REMOTE_WRITE, "remote": ("10.0.0.2", 4791),
    "path_mtu": 1024, "dest_qpn": 0x1234, "rq_psn": 77, "max_dest_rd_atomic": 3, "min_rnr_timer": 12,
    "timeout": 14, "retry_cnt": 7, "rnr_retry": 7, "sq_psn": 99, "max_rd_atomic": 5,
    "en_sqd_async_notify": True,
}  # fmt: skip


#: Attributes the QP keeps in another form than given: outstanding RDMA READ/atomic depths
#: round up to a power of two (rxe_qp_from_attr()).
APPLIED: dict[str, Any] = {"max_dest_rd_atomic": 4, "max_rd_atomic": 8}


def new_qp(caps: QpCaps | None = None) -> QueuePair:
    rng = random.Random(0)
    return QueuePair(
        ProtectionDomain(rng), qpn=0x42, send_cq=CompletionQueue(16), recv_cq=CompletionQueue(16),
        caps=caps or QpCaps(), rng=rng,
    )  # fmt: skip


#: How to reach each state from RESET: (state, attrs) steps.
def reach(qp: QueuePair, target: QpState) -> None:
    path = {
        S.RESET: [],
        S.INIT: [S.INIT],
        S.RTR: [S.INIT, S.RTR],
        S.RTS: [S.INIT, S.RTR, S.RTS],
        S.SQD: [S.INIT, S.RTR, S.RTS, S.SQD],
        S.ERR: [S.ERR],
    }[target]
    for st in path:
        req = TRANSITIONS[(qp.state, st)].required
        qp.modify(st, **{k: VALUES[k] for k in req})
    assert qp.state is target


def test_table_matches_kernel_rc_column_with_documented_changes() -> None:
    expected = dict(KERNEL_RC)
    # Documented deviations: remote optional at INIT->RTR, RESET->ERR allowed.
    req, opt = expected[(S.INIT, S.RTR)]
    expected[(S.INIT, S.RTR)] = (req - {"remote"}, opt | {"remote"})
    expected[(S.RESET, S.ERR)] = (set(), set())
    got = {k: (set(t.required), set(t.optional)) for k, t in TRANSITIONS.items()}
    assert got == expected


REACHABLE = [S.RESET, S.INIT, S.RTR, S.RTS, S.SQD, S.ERR]


@pytest.mark.parametrize(("cur", "to"), [k for k in TRANSITIONS if k[0] in REACHABLE])
def test_each_transition_with_required_attrs(cur: QpState, to: QpState) -> None:
    qp = new_qp()
    reach(qp, cur)
    before = qp.attrs
    t = TRANSITIONS[(cur, to)]
    qp.modify(to, **{k: VALUES[k] for k in t.required})
    assert qp.state is to
    assert qp.attrs.state is to
    if to is S.RESET:
        assert qp.attrs == QpAttrs(state=S.RESET)  # RESET forgets every attribute
    elif cur is to:
        assert qp.attrs == before  # a modify to the same state with nothing given changes nothing
    else:
        for name in t.required:
            assert getattr(qp.attrs, name) == APPLIED.get(name, VALUES[name]), name


@pytest.mark.parametrize(("cur", "to"), [k for k in TRANSITIONS if k[0] in REACHABLE])
def test_each_transition_with_all_optional_attrs(cur: QpState, to: QpState) -> None:
    qp = new_qp()
    reach(qp, cur)
    t = TRANSITIONS[(cur, to)]
    attrs = {k: VALUES.get(k, cur) for k in t.required | t.optional}
    qp.modify(to, **attrs)
    assert qp.state is to
    if to is S.RESET:
        assert qp.attrs == QpAttrs(state=S.RESET)
    else:
        for name in t.required | t.optional - {"cur_state"}:
            assert getattr(qp.attrs, name) == APPLIED.get(name, VALUES[name]), name


@pytest.mark.parametrize(
    ("cur", "to"), [k for k in TRANSITIONS if k[0] in REACHABLE and TRANSITIONS[k].required]
)
def test_missing_required_attr_is_rejected_and_changes_nothing(cur: QpState, to: QpState) -> None:
    t = TRANSITIONS[(cur, to)]
    for missing in t.required:
        qp = new_qp()
        reach(qp, cur)
        before = qp.attrs
        with pytest.raises(EngineError) as e:
            qp.modify(to, **{k: VALUES[k] for k in t.required - {missing}})
        assert e.value.code == "INVALID_VALUE"
        assert missing in str(e.value)
        assert qp.attrs == before


@pytest.mark.parametrize(("cur", "to"), [k for k in TRANSITIONS if k[0] in REACHABLE])
def test_extra_attr_is_rejected(cur: QpState, to: QpState) -> None:
    t = TRANSITIONS[(cur, to)]
    extra = sorted(set(VALUES) - t.required - t.optional - {"cur_state"})
    assert extra
    qp = new_qp()
    reach(qp, cur)
    with pytest.raises(EngineError) as e:
        qp.modify(to, **{k: VALUES[k] for k in t.required}, **{extra[0]: VALUES[extra[0]]})
    assert e.value.code == "INVALID_VALUE"
    assert qp.state is cur


@pytest.mark.parametrize(
    ("cur", "to"), [(cur, to) for cur in REACHABLE for to in S if (cur, to) not in TRANSITIONS]
)
def test_unlisted_pairs_are_rejected(cur: QpState, to: QpState) -> None:
    qp = new_qp()
    reach(qp, cur)
    with pytest.raises(EngineError) as e:
        qp.modify(to, **{k: VALUES[k] for k in VALUES})
    assert e.value.code == "BAD_STATE"
    assert qp.state is cur


def test_any_state_goes_to_reset_and_err() -> None:
    for s in S:
        assert (s, S.RESET) in TRANSITIONS
        assert (s, S.ERR) in TRANSITIONS


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("path_mtu", 1000), ("path_mtu", 8192), ("path_mtu", 4), ("dest_qpn", 0), ("dest_qpn", 1 << 24),
        ("rq_psn", -1), ("rq_psn", 1 << 24), ("max_dest_rd_atomic", 129), ("min_rnr_timer", 32),
        ("path_mtu", True),
    ],
)  # fmt: skip
def test_bad_values_are_rejected(name: str, bad: object) -> None:
    qp = new_qp()
    reach(qp, S.INIT)
    attrs = {k: VALUES[k] for k in TRANSITIONS[(S.INIT, S.RTR)].required}
    attrs[name] = bad
    with pytest.raises(EngineError) as e:
        qp.modify(S.RTR, **attrs)
    assert e.value.code == "INVALID_VALUE"
    assert qp.state is S.INIT


@pytest.mark.parametrize(
    ("name", "bad"), [("timeout", 32), ("retry_cnt", 8), ("rnr_retry", -1), ("sq_psn", 1 << 24)]
)
def test_bad_rts_values_are_rejected(name: str, bad: int) -> None:
    qp = new_qp()
    reach(qp, S.RTR)
    attrs = {k: VALUES[k] for k in TRANSITIONS[(S.RTR, S.RTS)].required}
    attrs[name] = bad
    with pytest.raises(EngineError):
        qp.modify(S.RTS, **attrs)
    assert qp.state is S.RTR


def test_large_mtu_only_with_the_cap() -> None:
    qp = new_qp(QpCaps(large_mtu=True))
    reach(qp, S.INIT)
    attrs = {k: VALUES[k] for k in TRANSITIONS[(S.INIT, S.RTR)].required}
    with pytest.raises(EngineError):
        qp.modify(S.RTR, **{**attrs, "path_mtu": 3 << 10})
    qp.modify(S.RTR, **{**attrs, "path_mtu": 1 << 20})
    assert qp.attrs.path_mtu == 1 << 20


def test_rd_atomic_rounds_up_to_a_power_of_two() -> None:
    qp = new_qp()
    reach(qp, S.RTS)
    assert qp.attrs.max_dest_rd_atomic == 4  # 3 -> 4 (rxe_qp_from_attr)
    assert qp.attrs.max_rd_atomic == 8  # 5 -> 8


def test_cur_state_must_match() -> None:
    qp = new_qp()
    reach(qp, S.RTS)
    with pytest.raises(EngineError):
        qp.modify(S.RTS, cur_state=S.RTR)
    qp.modify(S.RTS, cur_state=S.RTS, min_rnr_timer=3)
    assert qp.attrs.min_rnr_timer == 3


def test_not_a_state() -> None:
    qp = new_qp()
    with pytest.raises(EngineError) as e:
        qp.modify(99)  # type: ignore[arg-type]
    assert e.value.code == "INVALID_VALUE"


def test_reset_forgets_attributes() -> None:
    qp = new_qp()
    reach(qp, S.RTS)
    qp.modify(S.RESET)
    assert qp.attrs.dest_qpn is None
    assert qp.dest_qpn == 0
    reach(qp, S.RTS)
    assert qp.attrs.sq_psn == 99


def test_the_attribute_table_names_every_field_the_transitions_know() -> None:
    names = {f.name for f in fields(ModifyAttrs)}
    assert names == ALL_ATTRS == set(ATTRS)
    assert set(VALUES) | {"cur_state"} == names


@pytest.mark.parametrize(("cur", "to"), [k for k in TRANSITIONS if k[0] in REACHABLE])
def test_modify_attrs_object_equals_the_keywords(cur: QpState, to: QpState) -> None:
    t = TRANSITIONS[(cur, to)]
    attrs = {k: VALUES.get(k, cur) for k in t.required | t.optional}
    by_kw, by_obj = new_qp(), new_qp()
    reach(by_kw, cur)
    reach(by_obj, cur)
    by_kw.modify(to, **attrs)
    by_obj.modify(to, ModifyAttrs(**attrs))
    assert by_obj.state is to
    assert by_obj.attrs == by_kw.attrs
    assert ModifyAttrs(**attrs).given() == tuple(f.name for f in fields(ModifyAttrs) if f.name in attrs)


def test_modify_takes_attrs_or_keywords_not_both() -> None:
    qp = new_qp()
    with pytest.raises(EngineError) as e:
        qp.modify(S.INIT, ModifyAttrs(port=1, pkey_index=0), access=Access.REMOTE_WRITE)
    assert e.value.code == "INVALID_VALUE"
    assert qp.state is S.RESET


def test_modify_applies_each_attribute_where_it_belongs() -> None:
    qp = new_qp()
    reach(qp, S.RTS)
    assert qp.dest_qpn == VALUES["dest_qpn"]
    assert qp.access_bits == int(VALUES["access"])
    assert qp.req.mtu == qp.resp.mtu == VALUES["path_mtu"]
    assert qp.resp.psn == qp.resp.ack_psn == VALUES["rq_psn"]
    assert qp.req.req_psn == qp.req.comp_psn == qp.req.sent_hwm == VALUES["sq_psn"]
    assert len(qp.resp.res.ring) == 4
    assert qp.req.max_rd_atomic == 8
    assert qp.resp.min_rnr_timer == VALUES["min_rnr_timer"]
    assert qp.req.timeout == pytest.approx(4.096e-6 * (1 << VALUES["timeout"]))
    assert qp.req.retry_cnt == qp.req.retry_left == VALUES["retry_cnt"]
    assert qp.req.rnr_retry == qp.req.rnr_left == VALUES["rnr_retry"]
