"""Predicting Python's ``random.Random`` (MT19937) from outputs a peer can see.

Python draws ``getrandbits(32)`` as one tempered MT19937 output word. Untempering
is exact, and the generator is linear: state word ``x[t]`` follows from
``x[t-624]`` (its top bit), ``x[t-623]`` (its low 31 bits) and ``x[t-227]``
(Matsumoto and Nishimura, "Mersenne Twister", ACM TOMACS 8(1), 1998). 624
consecutive outputs give the whole state.

A soft device draws an L_Key and then an R_Key for every registration, so a peer
that sees only R_Keys (in ``rdmakit.mmap/1`` descriptors) sees every other word.
That is enough: for an even ``t``, ``x[t-227]`` and ``x[t-623]`` are seen words
and the unseen ``x[t-624]`` contributes only bit 30, so the top bit of every
unseen word is known from its seen neighbours; one period later the unseen words
are known whole, and from 624 consecutive words on everything that follows is.
"""

from collections.abc import Sequence

_N = 624
_M = 397
_MATRIX_A = 0x9908B0DF
_UPPER = 0x80000000
_LOWER = 0x7FFFFFFF
_MASK = 0xFFFFFFFF


def temper(x: int) -> int:
    y = x ^ (x >> 11)
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    return (y ^ (y >> 18)) & _MASK


def untemper(y: int) -> int:
    """The state word behind one 32-bit output (inverse of `temper`)."""
    y ^= y >> 18
    y ^= (y << 15) & 0xEFC60000
    x = y
    for _ in range(4):  # y ^= (y << 7) & C, undone 7 bits at a time
        x = y ^ ((x << 7) & 0x9D2C5680)
    y = x & _MASK
    x = y
    for _ in range(2):  # y ^= y >> 11, undone 11 bits at a time
        x = y ^ (x >> 11)
    return x & _MASK


def _next_word(x_624: int, x_623: int, x_227: int) -> int:
    """``x[t]`` from ``x[t-624]``, ``x[t-623]`` and ``x[t-227]`` (t - 624 + M = t - 227)."""
    y = (x_624 & _UPPER) | (x_623 & _LOWER)
    return x_227 ^ (y >> 1) ^ (_MATRIX_A if y & 1 else 0)


#: Alternate outputs needed before `predict_after_alternate` can predict.
MIN_ALTERNATE = 936


def predict_after_alternate(odd: Sequence[int], count: int) -> list[int]:
    """The `count` outputs that follow, given only the odd ones of a run of outputs.

    ``odd[k]`` is output ``2k + 1`` of a run of ``2 * len(odd)`` consecutive
    outputs whose even ones (0, 2, …) were drawn but not seen.
    """
    n = 2 * len(odd)
    if len(odd) < MIN_ALTERNATE:
        raise ValueError(f"needs at least {MIN_ALTERNATE} alternate outputs, got {len(odd)}")
    x: dict[int, int] = {2 * k + 1: untemper(v) for k, v in enumerate(odd)}
    top: dict[int, int] = {}  # top bits of unseen (even) words
    for t in range(_N, n, 2):
        # Bit 31 of x[t] is bit 31 of x[t-227], flipped when MATRIX_A was added (x[t-623] odd).
        top[t] = (x[t - 227] ^ (_MATRIX_A if x[t - 623] & 1 else 0)) & _UPPER
    for t in range(2 * _N, n, 2):
        x[t] = _next_word(top[t - _N], x[t - _N + 1], x[t - _N + _M])
    assert all(t in x for t in range(n - _N, n)), "not 624 consecutive words"
    for t in range(n, n + count):
        x[t] = _next_word(x[t - _N], x[t - _N + 1], x[t - _N + _M])
    return [temper(x[t]) for t in range(n, n + count)]
