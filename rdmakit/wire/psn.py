"""24-bit packet sequence number arithmetic (IBTA Vol. 1 §9.7.1)."""

PSN_BITS = 24
PSN_MASK = (1 << PSN_BITS) - 1
#: Half the PSN space: a PSN more than this far ahead is "behind" (IBTA §9.7.1.1).
PSN_HALF = 1 << (PSN_BITS - 1)


def psn_add(psn: int, n: int) -> int:
    """``psn + n`` modulo 2^24."""
    return (psn + n) & PSN_MASK


def psn_diff(a: int, b: int) -> int:
    """Signed distance ``a - b`` in [-2^23, 2^23), like rxe's ``psn_compare``.

    Positive when ``a`` is after ``b`` in sequence order.
    """
    d = (a - b) & PSN_MASK
    return d - (1 << PSN_BITS) if d >= PSN_HALF else d
