"""Named fault profiles for the simulated network (`rdmakit.transport.simnet.SimNet`).

Each profile is a frozen `Faults`: per-packet probabilities of loss,
duplication, reordering (an extra delay of up to ``reorder_delay``) and a
flipped bit (which the receiver's ICRC check must catch, IBTA Vol. 1 §7.8),
plus delays. Pass one to `rdmakit.testing.engine.make_pair` or to `SimNet`;
derive variants with `dataclasses.replace`.

`PROFILES` names the ones a hostile-network sweep runs through, one fault at
a time and then all at once. The ``BOTTLENECK_*`` profiles are one 1 Gbit/s
link with a queue: deep, shallow (64 KB, tail drop) or marking ECN as DCQCN
sets a switch (Kmin 5 KB, Kmax 200 KB, Pmax 1 %, Zhu et al. 2015, §5); ``WAN``
is a 100 ms round trip.
"""

from rdmakit.transport.simnet import Faults

__all__ = [
    "ALL_AT_ONCE",
    "BOTTLENECK_DEEP",
    "BOTTLENECK_ECN",
    "BOTTLENECK_SHALLOW",
    "CLEAN",
    "CORRUPT",
    "DUPLICATE",
    "DUPLICATE_REORDER",
    "GIGABIT",
    "GIGABIT_LOSS",
    "GIGABIT_REORDER",
    "HEAVY_LOSS",
    "LIGHT_LOSS",
    "LONG_REORDER",
    "MIXED",
    "PROFILES",
    "REORDER",
    "WAN",
    "Faults",
]

#: No faults: only the fixed one-way delay.
CLEAN = Faults()
#: 1 % of packets lost.
LIGHT_LOSS = Faults(loss=0.01)
#: 10 % of packets lost.
HEAVY_LOSS = Faults(loss=0.10)
#: 5 % of packets delivered twice.
DUPLICATE = Faults(duplicate=0.05)
#: 10 % of packets held back by up to ``reorder_delay``.
REORDER = Faults(reorder=0.10)
#: One bit flipped in 5 % of packets.
CORRUPT = Faults(corrupt=0.05)
#: Duplicates arriving out of order: the responder's duplicate detection with no losses to hide it.
DUPLICATE_REORDER = Faults(duplicate=0.1, reorder=0.3)
#: Half the packets held back six times longer than by default, with some loss.
LONG_REORDER = Faults(loss=0.05, reorder=0.5, reorder_delay=300e-6)
#: Some of every fault at once, with jitter: a network a test can still finish on quickly.
MIXED = Faults(loss=0.05, duplicate=0.05, reorder=0.2, corrupt=0.02, jitter=5e-6)
#: Every fault at once, at rates far above any real network's.
ALL_AT_ONCE = Faults(loss=0.2, duplicate=0.1, reorder=0.3, corrupt=0.05, jitter=20e-6)

#: A 1 Gbit/s link, in bytes per second.
GIGABIT = 125e6
#: A 1 Gbit/s bottleneck with an unbounded queue, 50 µs each way.
BOTTLENECK_DEEP = Faults(rate=GIGABIT, delay=50e-6)
#: The same with a 64 KB queue that drops what does not fit (a shallow switch buffer, tbf's limit).
BOTTLENECK_SHALLOW = Faults(rate=GIGABIT, queue_limit=64 * 1024, delay=50e-6)
#: A 1 Gbit/s bottleneck that marks CE on its queue (DCQCN's switch settings) before its 256 KB fill.
BOTTLENECK_ECN = Faults(
    rate=GIGABIT, queue_limit=256 * 1024, ecn_kmin=5 * 1024, ecn_kmax=200 * 1024, ecn_pmax=0.01, delay=50e-6
)
#: A 100 ms round trip (no reordering: a WAN path keeps a flow's packets in order).
WAN = Faults(delay=50e-3)
#: A 1 Gbit/s link (deep queue) losing 1 % of packets at random.
GIGABIT_LOSS = Faults(rate=GIGABIT, loss=0.01, delay=50e-6)
#: A 1 Gbit/s link (deep queue) that holds 10 % of packets back by up to 100 µs, past the
#: dozen that follow them (paths over parallel links, as netem's ``reorder``).
GIGABIT_REORDER = Faults(rate=GIGABIT, reorder=0.1, reorder_delay=100e-6, delay=50e-6)

#: The sweep's profiles by name: each fault alone, then all of them at once.
PROFILES: dict[str, Faults] = {
    "clean": CLEAN,
    "loss1": LIGHT_LOSS,
    "loss10": HEAVY_LOSS,
    "dup5": DUPLICATE,
    "reorder10": REORDER,
    "corrupt": CORRUPT,
    "all_at_once": ALL_AT_ONCE,
}
