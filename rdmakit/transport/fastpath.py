"""The optional native data plane of the UDP soft device (``_fastpath.c``).

What it does, packet for packet, the pure-Python path does too; it only does
it without a Python object per packet: build the BTH and ICRC of a run of
MIDDLE packets and hand them to the kernel in GSO batches (``send_train``),
and check and place a run of received MIDDLE segments of a GRO batch
(``place_run``); and for the single packets of small operations, encode, add
the ICRC and send in one call (``send_packet``), and check the ICRC and decode
(``check_decode``), with ``rdmakit.wire.packet``'s tables. It is built with
the package when a C compiler is there (``setup.py``; the build goes on
without it otherwise). Set ``RDMAKIT_PURE_PYTHON=1`` to run without it;
``native`` is None then.

Its CRC-32 folds 256 bits at a time with VPCLMULQDQ where the CPU has it and
AVX2, else 128 bits with PCLMULQDQ, else uses tables (``native.CLMUL``: 2, 1,
0). ``RDMAKIT_NO_VPCLMUL=1`` (any value) keeps it to PCLMULQDQ and
``RDMAKIT_NO_CLMUL=1`` to the tables (read once, at import).
"""

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("RDMAKIT_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _fastpath
    except ImportError:
        return None
    from rdmakit.wire import AETH, CODEC_LAYOUTS, RETH, AtomicETH, Packet

    _fastpath.init_codec(Packet, RETH, AETH, AtomicETH, CODEC_LAYOUTS)
    return _fastpath


#: The native module, or None (not built, or switched off).
native: ModuleType | None = _load()


def describe() -> str:
    """One line for ``rdmakit devices -V`` and the benchmark header."""
    if native is None:
        why = "switched off" if os.environ.get("RDMAKIT_PURE_PYTHON", "") not in ("", "0") else "not built"
        return f"pure Python ({why})"
    crc = {2: "VPCLMULQDQ", 1: "PCLMULQDQ"}.get(int(native.CLMUL), "table")
    return f"native ({crc} CRC-32)"
