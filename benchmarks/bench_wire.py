"""Micro-benchmarks of the RoCEv2 codec's hot paths (a script, not a test).

    python benchmarks/bench_wire.py [--quick]

Prints nanoseconds per call for ``encode_headers``, ``encode``, ``decode`` and
the ICRC of a packet with a 4096-byte payload, the ICRC rows once per CRC-32
implementation installed (``zlib``, ``isal``, ``zlib-ng``), with the ratio to
``zlib.crc32`` measured in the same run. Each figure is the best of several
rounds, and the rounds of the rows being compared are interleaved, so that a
noisy machine slows all of them alike. The ICRC rows swap
``rdmakit.wire.icrc.crc32`` for the duration of the row, so every
implementation runs through the same code. The last lines say whether
``rdmakit.wire.CRC32_IMPL`` is the fastest implementation here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import platform
import sys
import timeit
import zlib
from collections.abc import Callable
from functools import partial
from typing import Any

import rdmakit.wire as w
from rdmakit.wire import icrc as icrc_mod

SRC4, DST4 = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
SRC6, DST6 = bytes(range(16)), bytes(range(16, 32))
SPORT = 0xC123
PAYLOAD = bytes(range(256)) * 16  # 4096 bytes
SEED = 0x2144DF1C

PACKETS: dict[str, w.Packet] = {
    "RDMA_WRITE_FIRST (RETH) 4 KiB": w.Packet(
        w.Opcode.RDMA_WRITE_FIRST, 0x1234, 77, reth=w.RETH(0x7F00_0000_1000, 0xABCD, 1 << 20), payload=PAYLOAD
    ),
    "SEND_MIDDLE 4 KiB": w.Packet(w.Opcode.SEND_MIDDLE, 0x1234, 78, payload=memoryview(PAYLOAD)),
    "SEND_ONLY_WITH_IMMEDIATE 13 B": w.Packet(
        w.Opcode.SEND_ONLY_WITH_IMMEDIATE, 0x1234, 79, imm=7, payload=b"x" * 13
    ),
    "ACKNOWLEDGE": w.Packet(w.Opcode.ACKNOWLEDGE, 0x1234, 80, aeth=w.AETH(w.ack_syndrome(), 3)),
    "COMPARE_SWAP": w.Packet(w.Opcode.COMPARE_SWAP, 0x1234, 81, atomic_eth=w.AtomicETH(0x1000, 9, 1, 2)),
}


def crc_impls() -> dict[str, Callable[..., int]]:
    """Every CRC-32 implementation importable here, zlib first."""
    found: dict[str, Callable[..., int]] = {"zlib": zlib.crc32}
    for name, module in (("isal", "isal.isal_zlib"), ("zlib-ng", "zlib_ng.zlib_ng")):
        with contextlib.suppress(ImportError):
            found[name] = importlib.import_module(module).crc32
    return found


def measure(rows: dict[str, tuple[Callable[[], Any], Callable[[], None]]], rounds: int) -> dict[str, float]:
    """Best ns per call of each row; rows run interleaved, ``setup`` before each of a row's rounds."""
    timers = {k: (timeit.Timer(stmt), setup) for k, (stmt, setup) in rows.items()}
    numbers = {}
    for k, (t, setup) in timers.items():
        setup()
        numbers[k] = max(1, t.autorange()[0] // 4)
    best = dict.fromkeys(rows, float("inf"))
    for _ in range(rounds):
        for k, (t, setup) in timers.items():
            setup()
            best[k] = min(best[k], t.timeit(numbers[k]) / numbers[k] * 1e9)
    return best


def nothing() -> None:
    pass


def print_rows(title: str, best: dict[str, float], ratio_to: dict[str, str] | None = None) -> None:
    print(title)
    for k, ns in best.items():
        extra = ""
        if ratio_to and k in ratio_to:
            extra = f"  x{best[ratio_to[k]] / ns:.2f} vs zlib"
        print(f"  {k:<58} {ns:>9.0f} ns{extra}")


def bench_codec(rounds: int) -> None:
    rows: dict[str, tuple[Callable[[], Any], Callable[[], None]]] = {}
    for name, pkt in PACKETS.items():
        rows[f"encode_headers  {name}"] = (partial(w.encode_headers, pkt), nothing)
    for name, pkt in PACKETS.items():
        rows[f"encode          {name}"] = (partial(w.encode, pkt), nothing)
    for name, pkt in PACKETS.items():
        data = w.encode(pkt)
        rows[f"decode          {name}"] = (partial(w.decode, data), nothing)
    rows["parse_syndrome"] = (lambda: w.parse_syndrome(0x61), nothing)
    rows["psn_diff"] = (lambda: w.psn_diff(3, 0xFFFFFE), nothing)
    print_rows("codec", measure(rows, rounds))


def bench_crc(rounds: int, impls: dict[str, Callable[..., int]]) -> dict[str, float]:
    """crc32 alone, per size and implementation; returns the 4 KiB figures."""
    rows: dict[str, tuple[Callable[[], Any], Callable[[], None]]] = {}
    ratio: dict[str, str] = {}
    for size in (16, 64, 1024, 4096, 65536):
        data = PAYLOAD * 16
        buf = data[:size]
        for name, fn in impls.items():
            key = f"crc32 {size:>6} B  [{name}]"
            rows[key] = (partial(fn, buf, SEED), nothing)
            ratio[key] = f"crc32 {size:>6} B  [zlib]"
    best = measure(rows, rounds)
    print_rows("CRC-32 alone", best, ratio)
    return {name: best[f"crc32   4096 B  [{name}]"] for name in impls}


def bench_icrc(rounds: int, impls: dict[str, Callable[..., int]]) -> dict[str, float]:
    """ICRC rows per implementation; returns icrc_ipv4(hdrs, payload) per implementation."""
    pkt = PACKETS["RDMA_WRITE_FIRST (RETH) 4 KiB"]
    hdrs, body, payload = w.encode_headers(pkt), w.encode(pkt), pkt.payload
    ack = w.encode(PACKETS["ACKNOWLEDGE"])
    ip4 = _ipv4_packet(body)
    flow4 = w.IcrcFlow.ipv4(SRC4, DST4, SPORT, 4791)
    rows: dict[str, tuple[Callable[[], Any], Callable[[], None]]] = {}
    ratio: dict[str, str] = {}
    for name, fn in impls.items():

        def use(f: Callable[..., int] = fn) -> None:
            icrc_mod.crc32 = f

        cases: dict[str, Callable[[], Any]] = {
            "icrc_ipv4(hdrs, payload)": lambda: w.icrc_ipv4(SRC4, DST4, SPORT, 4791, hdrs, payload),
            "IcrcFlow.icrc(hdrs, payload)": lambda: flow4.icrc(hdrs, payload),
            "icrc_ipv4(whole packet)": lambda: w.icrc_ipv4(SRC4, DST4, SPORT, 4791, body),
            "icrc_ipv6(hdrs, payload)": lambda: w.icrc_ipv6(SRC6, DST6, SPORT, 4791, hdrs, payload),
            "icrc_of_ip_packet(IPv4 datagram)": lambda: w.icrc_of_ip_packet(ip4),
            "icrc_ipv4(ACKNOWLEDGE)": lambda: w.icrc_ipv4(SRC4, DST4, SPORT, 4791, ack),
            "IcrcFlow.icrc(ACKNOWLEDGE)": lambda: flow4.icrc(ack),
        }
        for case, stmt in cases.items():
            key = f"{case:<34} [{name}]"
            rows[key] = (stmt, use)
            ratio[key] = f"{case:<34} [zlib]"
    saved = icrc_mod.crc32
    try:
        best = measure(rows, rounds)
    finally:
        icrc_mod.crc32 = saved
    order = sorted(best, key=lambda k: (k.split("[")[0], list(impls).index(k.split("[")[1][:-1])))
    print_rows("ICRC, RDMA_WRITE_FIRST with a 4096-byte payload (and a 16-byte ACKNOWLEDGE)",
               {k: best[k] for k in order}, ratio)  # fmt: skip
    return {name: best[f"{'icrc_ipv4(hdrs, payload)':<34} [{name}]"] for name in impls}


def _ipv4_packet(body: bytes) -> bytes:
    n = 20 + 8 + len(body) + 4
    ip = bytes([0x45, 0, n >> 8, n & 0xFF, 0, 0, 0x40, 0, 64, 17, 0, 0]) + SRC4 + DST4
    udp = SPORT.to_bytes(2, "big") + (4791).to_bytes(2, "big") + (n - 20).to_bytes(2, "big") + b"\0\0"
    return ip + udp + body


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    args = ap.parse_args()
    rounds = 3 if args.quick else 15
    impls = crc_impls()
    print(f"Python {platform.python_version()} {platform.machine()} ({sys.implementation.name}), "
          f"zlib {zlib.ZLIB_RUNTIME_VERSION}, CRC-32 implementations: {', '.join(impls)}; "
          f"rdmakit.wire.CRC32_IMPL = {w.CRC32_IMPL!r}")  # fmt: skip
    bench_codec(rounds)
    crc4k = bench_crc(rounds, impls)
    icrc4k = bench_icrc(rounds, impls)
    for label, figures in (("crc32 of 4 KiB", crc4k), ("icrc_ipv4 of a 4 KiB packet", icrc4k)):
        fastest = min(figures, key=figures.__getitem__)
        verdict = "yes" if fastest == w.CRC32_IMPL else f"NO, {fastest} is ({figures[fastest]:.0f} ns)"
        print(f"CRC32_IMPL ({w.CRC32_IMPL}) is the fastest for {label}: {verdict}")


if __name__ == "__main__":
    main()
