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
price of not seeing the header.

:class:`IdentWindow` narrows that down and bounds the work. Linux numbers the
datagrams from one source to one destination with a counter
(``ip_idents_reserve()`` in net/ipv4/route.c, which rxe's ``prepare_ipv4_hdr()``
uses): each packet takes the next ID, and when the counter was idle it first
jumps by a random amount below the number of jiffies that passed (HZ is at most
1000). So a solved ID is believed only if it lies a little ahead of the last
one, and the next ID is tried before any solving.
"""

from functools import lru_cache

from .icrc import icrc_ipv4
from .packet import Payload

_ZERO4 = b"\0\0\0\0"
#: The longest BTH .. pad an IPv4 UDP datagram holds (65535 - 20 - 8 - ICRC).
_MAX_BODY = 65503
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
    return solve_ident_diff(len(body), icrc_ipv4(src, dst, sport, dport, body, ident=0, df=df) ^ received, df)


def solve_ident_diff(body_len: int, diff: int, df: bool = True) -> int | None:
    """The IPv4 Identification with ``icrc(id) ^ icrc(0) == diff`` for a ``body_len``-byte body, or None.

    ``diff`` is the received ICRC XOR the ICRC the packet would have with ID 0.
    The first call for a length computes its basis (17 CRCs of the packet's
    length); later calls for that length are 16 steps.
    """
    if not len(_BTH) <= body_len <= _MAX_BODY or not 0 <= diff <= 0xFFFFFFFF:
        return None
    if not diff:
        return 0
    ident = 0
    for pivot, vec, combo in _solver(body_len, df):
        if diff >> pivot & 1:
            diff ^= vec
            ident ^= combo
    return ident if diff == 0 else None


#: IDs past the last one believed without further ado: packets lost or sent
#: elsewhere with the same counter in between (IBTA has no say; a guess).
IDENT_WINDOW = 1024
#: How fast the window widens while the sender is quiet: the kernel's jump is
#: below the jiffies that passed, at most 1000 per second.
IDENT_IDLE_RATE = 1000.0
#: One ID the window does not cover is believed per this many seconds per sender:
#: the kernel's counter is shared by all its traffic to us, and jumps now and then.
JUMP_INTERVAL = 1.0
#: Solver runs per second one sender may cause, and the burst it may save up.
SOLVE_RATE = 1000.0
SOLVE_BURST = 32


class TokenBucket:
    """``rate`` runs a second, ``burst`` saved up at most: `take` says whether one may run now.

    Sans-IO: ``now`` (seconds) comes from the caller; time going backwards adds nothing.
    """

    __slots__ = ("_burst", "_rate", "_stamp", "_tokens")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._stamp = now

    def take(self, now: float) -> bool:
        """Whether one run is allowed now (its token is taken if so)."""
        tokens = self._tokens
        if now > self._stamp:
            tokens = min(self._burst, tokens + (now - self._stamp) * self._rate)
            self._stamp = now
        if tokens < 1.0:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1.0
        return True


class IdentWindow:
    """The IPv4 IDs one kernel sender uses towards us, and what solving for them may cost.

    Sans-IO: the receiver hands in ``now`` (seconds). The receiver first tries
    :meth:`next` (a plain ICRC check with that ID); only if that fails, and
    :meth:`may_solve` grants a run (a token bucket of ``SOLVE_RATE`` per second,
    ``SOLVE_BURST`` deep), does it solve, and it believes the ID only if
    :meth:`accept` does.

    A corrupted packet (a random ICRC) from a sender whose IDs are known is
    accepted with probability ``2^-16 * w / 2^16``, where ``w`` is
    ``IDENT_WINDOW`` plus ``IDENT_IDLE_RATE`` times the seconds since its last
    packet (2^-22 for a busy sender); before its first packet is known, 2^-16.
    An ID that jumped further (a long loss burst, another flow sharing the
    kernel's counter) is believed once per ``JUMP_INTERVAL``, so a corrupted
    packet gets through that way with probability at most 2^-16 per second
    and sender, however many arrive. A further jump within the interval is
    remembered, and the sender is followed again from the next packet that
    lies in the window after it: one packet is lost, and retransmitted.
    """

    __slots__ = ("_at", "_bucket", "_jumped", "_last", "_pending")

    def __init__(self, now: float) -> None:
        self._last: int | None = None
        self._at = now
        self._jumped = float("-inf")  # when a jump past the window was last believed
        self._pending: int | None = None
        self._bucket = TokenBucket(SOLVE_RATE, SOLVE_BURST, now)

    @property
    def last(self) -> int | None:
        """The last ID believed (None before the first)."""
        return self._last

    def next(self) -> int | None:
        """The ID the sender's next packet most likely carries (None before the first)."""
        last = self._last
        return None if last is None else (last + 1) & 0xFFFF

    def may_solve(self, now: float) -> bool:
        """Whether one solver run is allowed now (it is taken from the bucket if so)."""
        return self._bucket.take(now)

    def accept(self, ident: int, now: float) -> bool:
        """Whether a packet whose ICRC checks with ID ``ident`` is believed; it becomes the last if so."""
        ident &= 0xFFFF
        last = self._last
        if last is not None:
            width = IDENT_WINDOW + int(max(0.0, now - self._at) * IDENT_IDLE_RATE)
            if not 0 < (ident - last) & 0xFFFF <= width:
                pending = self._pending
                if pending is None or not 0 < (ident - pending) & 0xFFFF <= IDENT_WINDOW:
                    if now - self._jumped < JUMP_INTERVAL:
                        self._pending = ident
                        return False
                    self._jumped = now
        self._last = ident
        self._pending = None
        self._at = now
        return True
