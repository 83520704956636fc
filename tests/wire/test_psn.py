"""24-bit PSN arithmetic (IBTA Vol. 1 §9.7.1), checked against rxe's psn_compare."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmakit.testing.strategies import U24
from rdmakit.wire import PSN_BITS, PSN_HALF, PSN_MASK, psn_add, psn_diff

DISTANCE = st.integers(-PSN_HALF, PSN_HALF - 1)


def rxe_psn_compare(a: int, b: int) -> int:
    """rxe_verbs.h: ``(s32)((a - b) << 8)``, done in u32 arithmetic as C does."""
    v = ((a - b) << 8) & 0xFFFF_FFFF
    return v - (1 << 32) if v & 0x8000_0000 else v


def test_constants() -> None:
    assert (PSN_BITS, PSN_MASK, PSN_HALF) == (24, 0xFFFFFF, 0x800000)


@pytest.mark.parametrize(
    ("a", "b", "d"),
    [
        (0, 0, 0),
        (1, 0, 1),
        (0, 1, -1),
        (0, 0xFFFFFF, 1),  # wraps forward
        (0xFFFFFF, 0, -1),
        (0x7FFFFF, 0, 0x7FFFFF),  # the farthest "after"
        (0x800000, 0, -0x800000),  # exactly half-way counts as "before", as in rxe
        (0, 0x800000, -0x800000),
        (5, 0xFFFFFA, 11),
    ],
)
def test_psn_diff_examples(a: int, b: int, d: int) -> None:
    assert psn_diff(a, b) == d


@given(U24, U24)
def test_psn_diff_has_the_sign_and_value_of_rxe_psn_compare(a: int, b: int) -> None:
    rxe = rxe_psn_compare(a, b)
    d = psn_diff(a, b)
    assert (d > 0) == (rxe > 0)
    assert (d < 0) == (rxe < 0)
    assert d == rxe >> 8  # arithmetic shift: the exact signed distance
    assert -PSN_HALF <= d < PSN_HALF


@given(U24, DISTANCE)
def test_psn_add_then_diff(a: int, n: int) -> None:
    b = psn_add(a, n)
    assert 0 <= b <= PSN_MASK
    assert psn_diff(b, a) == n
    assert psn_add(b, -n) == a


@given(U24, U24)
def test_psn_diff_is_antisymmetric_except_half_way(a: int, b: int) -> None:
    if psn_diff(a, b) == -PSN_HALF:
        assert psn_diff(b, a) == -PSN_HALF
    else:
        assert psn_diff(b, a) == -psn_diff(a, b)


@given(U24, st.integers(0, 3 * (1 << PSN_BITS)))
def test_psn_add_wraps_modulo_2_24(a: int, n: int) -> None:
    assert psn_add(a, n) == (a + n) % (1 << PSN_BITS)


def test_psn_add_wraps_at_the_top() -> None:
    assert psn_add(0xFFFFFF, 1) == 0
    assert psn_add(0xFFFFFE, 3) == 1
    assert psn_add(0, -1) == 0xFFFFFF
