"""The CRC-32 implementations: interchangeable, and the one picked is a preferred one installed."""

import contextlib
import importlib
import zlib
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rdmakit.wire as wire
from rdmakit.wire import icrc

IMPLS: dict[str, Callable[[bytes | bytearray | memoryview, int], int]] = {"zlib": zlib.crc32}
for _name, _mod in (("isal", "isal.isal_zlib"), ("zlib-ng", "zlib_ng.zlib_ng")):
    with contextlib.suppress(ImportError):
        IMPLS[_name] = importlib.import_module(_mod).crc32

#: Fastest first (benchmarks/bench_wire.py); CRC32_IMPL must be the first one installed.
PREFERENCE = ["zlib-ng", "isal", "zlib"]


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_the_standard_check_value(name: str) -> None:
    # CRC-32/ISO-HDLC check value (the Ethernet CRC on "123456789").
    assert IMPLS[name](b"123456789", 0) == 0xCBF43926


@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1), st.integers(0, 64))
def test_every_implementation_matches_zlib(data: bytes, seed: int, offset: int) -> None:
    want = zlib.crc32(data, seed)
    view = memoryview(data)[min(offset, len(data)) :]
    for fn in IMPLS.values():
        assert fn(data, seed) == want
        assert fn(view, seed) == zlib.crc32(view, seed)
        assert fn(bytearray(data), seed) == want


def test_seed_is_the_state_after_the_masked_lrh() -> None:
    assert icrc._SEED == zlib.crc32(b"\xff" * 8) == 0x2144DF1C
    assert icrc._SEED ^ 0xFFFFFFFF == 0xDEBB20E3  # rxe's initial crc (rxe_icrc.c)


def test_crc32_impl_is_the_preferred_installed_one() -> None:
    installed = [n for n in PREFERENCE if n in IMPLS]
    assert installed[0] == wire.CRC32_IMPL
    assert wire.crc32 is IMPLS[wire.CRC32_IMPL]
    assert wire.crc32 is icrc.crc32
