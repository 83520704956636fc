"""The RDMA connection descriptor, and descriptor files.

``Rdma.export()`` returns a connection descriptor: the bytes a peer passes to
its own ``Rdma.connect()`` (``doca_rdma_export`` / ``doca_rdma_connect``,
DOCA RDMA guide §4). DOCA's descriptor is an undocumented binary blob; this
one is rdmakit's, specified here and in ``docs/descriptors.md``.

Format ``rdmakit.connection/1``
-------------------------------

A UTF-8 JSON object of at most 4096 bytes. `ConnectionDescriptor.to_bytes`
writes it canonically (sorted keys, no spaces); any JSON layout of the same
object parses. Every field is required (``secret``: for ``"tcp"`` only), no
other field is allowed, and a key may not appear twice:

=============  ==========================================================================
field          value
=============  ==========================================================================
``format``     the string ``"rdmakit.connection/1"``
``transport``  ``"roce-udp"`` (RoCEv2, UDP port 4791), ``"tcp"`` (the same packets framed
               on TCP, rdmakit only) or ``"verbs"`` (an rdma-core QP, RoCEv2 on the wire)
``gid``        the exporting port's GID as IPv6 text; canonically the full form
               (``"0000:0000:0000:0000:0000:ffff:7f00:0002"``, IPv4-mapped for an IPv4
               address, IBTA Vol. 1 Annex A17.8); it must be ``ip``'s GID
``ip``         the IPv4 or IPv6 address the exporting side receives on: one unicast
               host (not unspecified, broadcast or multicast; IPv4 written as IPv4)
``port``       its UDP or TCP port, 1-65535 (4791 for RoCEv2)
``qpn``        its queue pair number, 2 to 2**24-1 (0 and 1 are special, IBTA §3.5.3)
``psn``        the PSN of the first request the exporting side will send, 0 to 2**24-1:
               the peer expects it (its ``rq_psn``), as ``ibv_rc_pingpong`` and perftest
               exchange PSNs
``mtu``        the largest path MTU the exporting side accepts, in bytes: one of 256, 512,
               1024, 2048, 4096 (the IB path MTUs); ``"tcp"`` also allows any power of two up
               to 2**20. The connection uses the smaller of both sides'.
``secret``     ``"tcp"`` only: 32 lowercase hex digits, a random 128-bit secret of this QP
               that a stream to it must present (``rdmakit.transport.tcp``); absent for
               the other transports. Added within version 1: a reader that predates it
               refuses a tcp descriptor (unknown field), as it could not connect to one
=============  ==========================================================================

Integers are JSON integers (not strings, floats or booleans). A descriptor
that is truncated, tampered with, of another format (e.g. an mmap descriptor,
``rdmakit.mmap/1``) or of another version raises
``DocaError(INVALID_VALUE)`` naming the offending field, with fault PEER:
the bytes came from the other side.

Descriptor files
----------------

DOCA's samples swap descriptors through files (``rdma_common.c``
``write_file``/``read_file``). `write_descriptor` writes one atomically and,
like the samples, refuses to replace an existing file unless told to;
`read_descriptor`, `read_connection_descriptor` and `read_mmap_descriptor`
read one back (by the rule of ``rdmakit.transport.user_files``: no link, no
procfs, the caller's or root's file) and name the file in every error.
"""

import json
import os
import tempfile
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address
from pathlib import Path
from typing import Literal, Self

from rdmakit.doca._addresses import address_problem, gid_mismatch
from rdmakit.doca._fields import DescriptorReader
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault, error_from_os
from rdmakit.doca.mmap import DESCRIPTOR_FORMAT as MMAP_FORMAT
from rdmakit.doca.mmap import MmapDescriptor
from rdmakit.transport.user_files import UserFileError, read_user_file

__all__ = [
    "CONNECTION_FORMAT",
    "MAX_DESCRIPTOR_SIZE",
    "ConnectionDescriptor",
    "Transport",
    "read_connection_descriptor",
    "read_descriptor",
    "read_mmap_descriptor",
    "write_descriptor",
]

CONNECTION_FORMAT = "rdmakit.connection/1"
#: Longest descriptor (either kind) accepted, in bytes.
MAX_DESCRIPTOR_SIZE = 4096

Transport = Literal["roce-udp", "tcp", "verbs"]
_TRANSPORTS: tuple[Transport, ...] = ("roce-udp", "tcp", "verbs")
_FIELDS = ("format", "transport", "gid", "ip", "port", "qpn", "psn", "mtu")
_IB_MTUS = frozenset({256, 512, 1024, 2048, 4096})  # the IB path MTUs (ibv_mtu)
_MAX_TCP_MTU = 1 << 20
_U24 = 1 << 24
#: The TCP transport's connection secret (``rdmakit.transport.tcp_limits.SECRET_LEN`` bytes), as hex.
_SECRET_HEX = frozenset("0123456789abcdef")
_SECRET_DIGITS = 32


_READER = DescriptorReader("connection descriptor", (), MAX_DESCRIPTOR_SIZE)
_bad = _READER.bad
_load_object = _READER.parse
_get_int = _READER.get_int
_get_str = _READER.get_str


def _check_format(fmt: str) -> None:
    if fmt == CONNECTION_FORMAT:
        return
    name, _, version = fmt.partition("/")
    if fmt == MMAP_FORMAT:
        raise _bad("format", f"{fmt!r} is a memory-map descriptor (Mmap.export_rdma), not a connection")
    if name == "rdmakit.connection":
        raise _bad(
            "format", f"version {version!r} is not supported; this rdmakit reads {CONNECTION_FORMAT!r}"
        )
    raise _bad("format", f"{fmt[:64]!r} is not {CONNECTION_FORMAT!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionDescriptor:
    """One side of an RC connection, as ``Rdma.export`` describes it (format ``rdmakit.connection/1``)."""

    transport: Transport
    gid: IPv6Address
    ip: IPv4Address | IPv6Address
    port: int
    qpn: int
    psn: int
    mtu: int
    #: ``"tcp"`` only: the QP's connection secret, hex; None for the other transports.
    secret: str | None = None

    def __post_init__(self) -> None:
        # Built in-process (from a backend's export): the same rules as parsing.
        _validate(self)

    def to_bytes(self) -> bytes:
        """The canonical JSON encoding."""
        obj = {
            "format": CONNECTION_FORMAT,
            "transport": self.transport,
            "gid": self.gid.exploded,
            "ip": str(self.ip),
            "port": self.port,
            "qpn": self.qpn,
            "psn": self.psn,
            "mtu": self.mtu,
        }
        if self.secret is not None:
            obj["secret"] = self.secret
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: object) -> Self:
        """Parse and validate; anything malformed raises INVALID_VALUE naming the field."""
        obj = _load_object(data)
        if "format" not in obj:
            raise _bad("format", "missing")
        _check_format(_get_str(obj, "format"))  # first: a foreign descriptor says what it is
        for key in _FIELDS:
            if key not in obj:
                raise _bad(key, "missing")
        for key in obj:
            if key not in _FIELDS and key != "secret":
                raise _bad(key[:64], "unknown field")
        transport = _get_str(obj, "transport")
        if transport not in _TRANSPORTS:
            raise _bad("transport", f"{transport[:64]!r} is not one of {', '.join(_TRANSPORTS)}")
        secret: str | None = None
        if transport == "tcp":
            if "secret" not in obj:
                raise _bad("secret", "missing (a tcp descriptor carries its connection secret)")
            secret = _get_str(obj, "secret")
        elif "secret" in obj:
            raise _bad("secret", f"only a tcp descriptor has one, not {transport!r}")
        gid_text = _get_str(obj, "gid")
        try:
            gid = IPv6Address(gid_text)
        except ValueError as exc:
            raise _bad("gid", f"{gid_text[:64]!r} is not a GID (IPv6 text)") from exc
        ip_text = _get_str(obj, "ip")
        try:
            ip = ip_address(ip_text)
        except ValueError as exc:
            raise _bad("ip", f"{ip_text[:64]!r} is not an IP address") from exc
        return cls(
            transport=transport,
            gid=gid,
            ip=ip,
            port=_get_int(obj, "port", 1, 0xFFFF),
            qpn=_get_int(obj, "qpn", 2, _U24 - 1),
            psn=_get_int(obj, "psn", 0, _U24 - 1),
            mtu=_get_int(obj, "mtu", 256, _MAX_TCP_MTU),
            secret=secret,
        )

    @classmethod
    def from_backend(cls, info: dict[str, object]) -> Self:
        """From a `BackendQP.export` dict (``transport, gid, ip, port, qpn, psn, mtu``)."""
        try:
            return cls.from_bytes(json.dumps({"format": CONNECTION_FORMAT, **info}).encode())
        except DocaError as exc:
            # Our own backend produced it: a bug below us, not the peer's fault.
            raise DocaError(DocaErrorCode.UNEXPECTED, f"backend export: {exc.message}", Fault.SYSTEM) from exc

    def to_backend(self) -> dict[str, object]:
        """The dict `BackendQP.connect` takes."""
        return {
            "transport": self.transport,
            "gid": self.gid.exploded,
            "ip": str(self.ip),
            "port": self.port,
            "qpn": self.qpn,
            "psn": self.psn,
            "mtu": self.mtu,
            **({} if self.secret is None else {"secret": self.secret}),
        }


def _validate(d: ConnectionDescriptor) -> None:
    if d.transport not in _TRANSPORTS:
        raise _bad("transport", f"{d.transport!r} is not one of {', '.join(_TRANSPORTS)}")
    if not isinstance(d.gid, IPv6Address):
        raise _bad("gid", f"expected an IPv6Address, got {type(d.gid).__name__}")
    if not isinstance(d.ip, IPv4Address | IPv6Address):
        raise _bad("ip", f"expected an IP address, got {type(d.ip).__name__}")
    # One unicast peer, and the GID its packets carry (rdmakit.doca._addresses).
    problem = address_problem(d.ip)
    if problem is not None:
        raise _bad("ip", f"{d.ip} {problem}")
    mismatch = gid_mismatch(d.gid, d.ip)
    if mismatch is not None:
        raise _bad("gid", mismatch)
    for name, lo, hi in (("port", 1, 0xFFFF), ("qpn", 2, _U24 - 1), ("psn", 0, _U24 - 1)):
        value = getattr(d, name)
        if type(value) is not int or not lo <= value <= hi:
            raise _bad(name, f"{value!r} is outside [{lo}, {hi}]")
    mtu = d.mtu
    if type(mtu) is not int:
        raise _bad("mtu", f"expected an integer, got {type(mtu).__name__}")
    if d.transport == "tcp":
        if not (256 <= mtu <= _MAX_TCP_MTU and mtu & (mtu - 1) == 0):
            raise _bad("mtu", f"{mtu} is not a power of two in [256, {_MAX_TCP_MTU}]")
    elif mtu not in _IB_MTUS:
        raise _bad("mtu", f"{mtu} is not an IB MTU (256, 512, 1024, 2048, 4096)")
    secret = d.secret
    if d.transport != "tcp":
        if secret is not None:
            raise _bad("secret", f"only a tcp descriptor has one, not {d.transport!r}")
    elif not (isinstance(secret, str) and len(secret) == _SECRET_DIGITS and set(secret) <= _SECRET_HEX):
        raise _bad("secret", f"expected {_SECRET_DIGITS} lowercase hex digits")


# ---------------------------------------------------------------------------
# Files


def _in_file(path: Path, kind: str, exc: DocaError) -> DocaError:
    return DocaError(exc.code, f"{kind} file {str(path)!r}: {exc.message}", exc.fault)


_FILE_ERRORS = {
    "missing": (DocaErrorCode.NOT_FOUND, Fault.CALLER),
    "unsafe": (DocaErrorCode.NOT_PERMITTED, Fault.CALLER),
    "too-large": (DocaErrorCode.INVALID_VALUE, Fault.PEER),
}


def _read_raw(path: str | os.PathLike[str], kind: str) -> tuple[Path, bytes]:
    """The bytes of a descriptor file, read by the rule of ``rdmakit.transport.user_files``.

    Only the caller's files, or root's where only root could have placed
    them, are taken; never through a link, never from procfs or sysfs.
    """
    p = Path(path)
    try:
        return p, read_user_file(p, f"{kind} file", MAX_DESCRIPTOR_SIZE).data
    except UserFileError as exc:
        if exc.kind == "unreadable":
            cause = OSError(exc.errno, os.strerror(exc.errno or 0))
            raise error_from_os(cause, f"cannot read {kind} file {str(p)!r}") from None
        code, fault = _FILE_ERRORS[exc.kind]
        raise DocaError(code, exc.message, fault) from None


def read_connection_descriptor(path: str | os.PathLike[str]) -> ConnectionDescriptor:
    """Read and validate a connection descriptor file; errors name the file and the field."""
    p, raw = _read_raw(path, "connection descriptor")
    try:
        return ConnectionDescriptor.from_bytes(raw)
    except DocaError as exc:
        raise _in_file(p, "connection descriptor", exc) from exc


def read_mmap_descriptor(path: str | os.PathLike[str]) -> MmapDescriptor:
    """Read and validate an mmap descriptor file (``Mmap.export_rdma`` output)."""
    p, raw = _read_raw(path, "mmap descriptor")
    try:
        return MmapDescriptor.from_bytes(raw)
    except DocaError as exc:
        raise _in_file(p, "mmap descriptor", exc) from exc


def read_descriptor(path: str | os.PathLike[str]) -> bytes:
    """Read a connection or mmap descriptor file, validate it and return its bytes.

    The bytes are ready for ``Rdma.connect`` or ``Mmap.create_from_export``;
    which kind the file holds is told by its ``format`` field.
    """
    p, raw = _read_raw(path, "descriptor")
    try:
        obj = _load_object(raw)
        fmt = obj.get("format")
        if fmt == MMAP_FORMAT:
            MmapDescriptor.from_bytes(raw)
        else:
            ConnectionDescriptor.from_bytes(raw)
    except DocaError as exc:
        raise _in_file(p, "descriptor", exc) from exc
    return raw


def write_descriptor(path: str | os.PathLike[str], data: bytes, *, overwrite: bool = False) -> None:
    """Write descriptor bytes to `path` atomically (a reader never sees half a descriptor).

    An existing file is ALREADY_EXIST unless `overwrite` (DOCA's samples
    refuse to overwrite too).
    """
    p = Path(path)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(data))
        if overwrite:
            os.replace(tmp, p)
        else:
            os.link(tmp, p)  # fails if `p` exists, and never replaces it
    except FileExistsError as exc:
        raise DocaError(
            DocaErrorCode.ALREADY_EXIST, f"descriptor file {str(p)!r} already exists", Fault.CALLER
        ) from exc
    except OSError as exc:
        raise error_from_os(exc, f"cannot write descriptor file {str(p)!r}") from exc
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
