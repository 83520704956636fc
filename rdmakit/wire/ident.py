"""Recover the IPv4 Identification a received RoCEv2 packet carried.

The ICRC covers the IPv4 Identification (IBTA Annex A17.3.3), but a UDP socket
does not show it. Packets from rdmakit peers carry 0 (DF set, unconnected
socket) or, when the sender used UDP GSO, the segment's index in its batch
(the kernel numbers GSO segments from the first one's ID). A Linux rxe peer
picks a hashed ID the receiver cannot know.

CRC-32 is affine over GF(2): for messages of equal length,
``crc(m ^ d) = crc(m) ^ L(d)`` with ``L`` linear and independent of ``m``. The
16 ID bits therefore move the ICRC within a subspace spanned by 16 vectors that
depend only on the packet's length. Solving ``L(id) = icrc_received ^ icrc(id=0)``
over that basis either finds the ID or proves that no ID explains the ICRC (a
corrupted packet). A random corruption passes with probability 2^-16, the
price of not seeing the header; count such packets as "verified by solving".
"""

from functools import lru_cache

from .icrc import icrc_ipv4
from .packet import Payload

_ZERO4 = b"\0\0\0\0"
_BTH = b"\0" * 12


@lru_cache(maxsize=64)
def _solver(body_len: int, df: bool) -> tuple[tuple[int, int, int], ...]:
    """Row-reduced basis for one packet length: (pivot bit, vector, ID combination)."""
    body = _BTH + b"\0" * (body_len - len(_BTH))
    base = icrc_ipv4(_ZERO4, _ZERO4, 0, 0, body, ident=0, df=df)
    rows: list[tuple[int, int, int]] = []
    for bit in range(16):
        vec = icrc_ipv4(_ZERO4, _ZERO4, 0, 0, body, ident=1 << bit, df=df) ^ base
        combo = 1 << bit
        for pivot, rvec, rcombo in rows:
            if vec >> pivot & 1:
                vec ^= rvec
                combo ^= rcombo
        if vec:
            pivot = vec.bit_length() - 1
            # Keep rows fully reduced so solving is one pass.
            rows = [(p, v ^ vec, c ^ combo) if v >> pivot & 1 else (p, v, c) for p, v, c in rows]
            rows.append((pivot, vec, combo))
    return tuple(rows)


def solve_ipv4_ident(
    src: bytes, dst: bytes, sport: int, dport: int, body: Payload, received: int, *, df: bool = True
) -> int | None:
    """The IPv4 Identification that makes ``received`` the packet's ICRC, or None.

    ``body`` is the UDP payload from the BTH to the end of the pad (no ICRC).
    """
    if len(body) < len(_BTH):
        return None
    diff = icrc_ipv4(src, dst, sport, dport, body, ident=0, df=df) ^ received
    if not diff:
        return 0
    ident = 0
    for pivot, vec, combo in _solver(len(body), df):
        if diff >> pivot & 1:
            diff ^= vec
            ident ^= combo
    return ident if diff == 0 else None
