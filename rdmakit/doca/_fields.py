"""Strict reading of rdmakit's JSON descriptors (connection, mmap, DPU export).

A descriptor comes from a peer, so anything wrong with it is the peer's fault:
every failure is ``DocaError(INVALID_VALUE, fault=PEER)`` whose message names
the descriptor kind and the field. Accepted: one UTF-8 JSON object of at most
``max_size`` bytes, exactly the expected keys, no duplicate keys, no NaN or
Infinity, integers that are JSON integers (not floats, not booleans).
"""

import json
from enum import IntFlag
from typing import TypeVar

from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault

F = TypeVar("F", bound=IntFlag)


class DescriptorReader:
    def __init__(self, kind: str, fields: tuple[str, ...], max_size: int) -> None:
        self.kind = kind
        self.fields = fields
        self.max_size = max_size

    def bad(self, field: str, why: str) -> DocaError:
        return DocaError(DocaErrorCode.INVALID_VALUE, f"{self.kind} field {field!r}: {why}", Fault.PEER)

    def _pairs(self, pairs: list[tuple[str, object]]) -> dict[str, object]:
        obj: dict[str, object] = {}
        for key, value in pairs:
            if key in obj:
                raise self.bad(key, "appears twice")
            obj[key] = value
        return obj

    def _constant(self, name: str) -> object:
        raise self.bad("descriptor", f"{name} is not JSON")

    def parse(self, data: object) -> dict[str, object]:
        """Bytes -> a JSON object (no check of its keys)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise self.bad("descriptor", f"expected bytes, got {type(data).__name__}")
        raw = bytes(data)
        if len(raw) > self.max_size:
            raise self.bad("descriptor", f"{len(raw)} bytes is longer than {self.max_size}")
        if not raw.strip():
            raise self.bad("descriptor", "empty")
        try:
            obj = json.loads(
                raw.decode("utf-8"), object_pairs_hook=self._pairs, parse_constant=self._constant
            )
        except UnicodeDecodeError as exc:
            raise self.bad("descriptor", "not UTF-8") from exc
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            raise self.bad("descriptor", f"not JSON, or truncated ({exc})") from exc
        if not isinstance(obj, dict):
            raise self.bad("descriptor", f"expected a JSON object, got {type(obj).__name__}")
        return obj

    def load(self, data: object) -> dict[str, object]:
        """Bytes -> a JSON object with exactly the expected keys."""
        obj = self.parse(data)
        for key in self.fields:
            if key not in obj:
                raise self.bad(key, "missing")
        for key in obj:
            if key not in self.fields:
                raise self.bad(key, "unknown field")
        return obj

    def get_int(self, obj: dict[str, object], key: str, lo: int, hi: int) -> int:
        """An integer in [lo, hi] (both inclusive)."""
        value = obj[key]
        if type(value) is not int:
            raise self.bad(key, f"expected an integer, got {type(value).__name__}")
        if not lo <= value <= hi:
            raise self.bad(key, f"{value} is outside [{lo}, {hi}]")
        return value

    def get_str(self, obj: dict[str, object], key: str, max_len: int | None = None) -> str:
        value = obj[key]
        if type(value) is not str:
            raise self.bad(key, f"expected a string, got {type(value).__name__}")
        if max_len is not None and not 0 < len(value) <= max_len:
            raise self.bad(key, f"expected 1 to {max_len} characters, got {len(value)}")
        return value

    def flags(self, obj: dict[str, object], key: str, flag_type: type[F]) -> F:
        """A list of ``flag_type`` member names (non-zero ones), each at most once."""
        names = obj[key]
        if type(names) is not list:
            raise self.bad(key, f"expected a list of flag names, got {type(names).__name__}")
        value = flag_type(0)
        for name in names:
            if type(name) is not str or name not in flag_type.__members__ or not flag_type[name]:
                raise self.bad(key, f"{name!r} is not an access flag")
            if flag_type[name] in value:
                raise self.bad(key, f"{name} appears twice")
            value |= flag_type[name]
        return value
