"""Authentication of ``tcp:`` comm channels: the shared secret, the handshake proofs, message MACs.

A Unix-socket channel needs none of this: the kernel tells each end who the
other is (``SO_PEERCRED``). Over TCP anyone who can reach the port can
connect, so both ends prove that they know a shared secret, without sending
it, and every later message carries a MAC.

The handshake (the hellos themselves are ``rdmakit.doca.comm_channel``'s)::

    client -> server   hello_c                  (carries a fresh 32-byte nonce)
    server -> client   hello_s, proof_s         (its own nonce; the server proves first)
    client -> server   proof_c

    transcript = hello_c || hello_s || client address || server address
    proof_s    = HMAC-SHA256(secret, "rdmakit-comch/1 server" || transcript)
    proof_c    = HMAC-SHA256(secret, "rdmakit-comch/1 client" || transcript)

The role label makes a proof useless in the other direction (reflection);
the nonces make it useless in another connection (replay); the addresses
(each end's view of the TCP 4-tuple) make it useless to a relay that
connects to the server from its own address. The price: a NAT between the
two ends, which rewrites an address, fails the handshake.

After it each direction has its own key, derived from the secret and the
transcript, and every message is followed by
``HMAC-SHA256(key, seq || message)[:16]``, where ``seq`` counts that
direction's messages from 0 (never sent): a message altered, injected,
dropped, replayed or reordered by someone on the path fails the check. The
messages are not encrypted (the RDMA data plane they control is not either).

The secret, in this order (`load_secret`): the bytes given, a secret file,
``RDMAKIT_COMCH_SECRET`` (hex), or the user's default key file
``$XDG_CONFIG_HOME/rdmakit/comch.key`` (``~/.config/...``), created on first
use with 32 random bytes. Files hold the secret in hex and are read as
``rdmakit.transport.user_files`` reads a secret: as OpenSSH does for private
keys, a file that its group or others may read, or that another user owns,
is refused (`SecretError`), and so is a link or a file of procfs.
"""

import contextlib
import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Literal

from rdmakit.transport.user_files import Trust, UserFileError, read_user_file

__all__ = [
    "MIN_SECRET",
    "NONCE_SIZE",
    "PROOF_SIZE",
    "SECRET_ENV",
    "TAG_SIZE",
    "MessageMac",
    "SecretError",
    "default_key_path",
    "load_secret",
    "proof",
    "session_keys",
]

#: Environment variable holding the secret in hex.
SECRET_ENV = "RDMAKIT_COMCH_SECRET"
#: Fewest bytes a secret may have.
MIN_SECRET = 16
NONCE_SIZE = 32
PROOF_SIZE = 32
#: Bytes of MAC after every message once the handshake is done.
TAG_SIZE = 16
_DEFAULT_KEY_BYTES = 32
_MAX_KEY_FILE = 4096
_LABEL = b"rdmakit-comch/1 "


class SecretError(ValueError):
    """No usable secret: a file that is missing, unsafe or malformed, or a bad value."""

    def __init__(self, message: str, kind: Literal["missing", "unsafe", "malformed"]) -> None:
        super().__init__(message)
        self.kind = kind


# ---------------------------------------------------------------------------
# Proofs and keys: pure functions of the secret and the transcript


def proof(secret: bytes, role: str, transcript: bytes) -> bytes:
    """What `role` ("client" or "server") sends to prove it knows `secret`."""
    return hmac.digest(secret, _LABEL + role.encode() + b" " + transcript, hashlib.sha256)


def session_keys(secret: bytes, transcript: bytes) -> tuple[bytes, bytes]:
    """(client -> server key, server -> client key) of the connection."""
    return tuple(  # type: ignore[return-value]
        hmac.digest(secret, _LABEL + b"key " + direction + b" " + transcript, hashlib.sha256)
        for direction in (b"c2s", b"s2c")
    )


class MessageMac:
    """The MACs of one connection: a key and a sequence number per direction."""

    __slots__ = ("_recv_key", "_recv_seq", "_send_key", "_send_seq")

    def __init__(self, send_key: bytes, recv_key: bytes) -> None:
        self._send_key, self._recv_key = send_key, recv_key
        self._send_seq = self._recv_seq = 0

    def seal(self, data: bytes | memoryview) -> bytes:
        """The tag to send after `data` (the next in sequence)."""
        tag = self._tag(self._send_key, self._send_seq, data)
        self._send_seq += 1
        return tag

    def open(self, data: bytes | memoryview, tag: bytes | memoryview) -> bool:
        """Whether `tag` is the right one for `data` as the next message received."""
        ok = hmac.compare_digest(self._tag(self._recv_key, self._recv_seq, data), tag)
        self._recv_seq += 1
        return ok

    @staticmethod
    def _tag(key: bytes, seq: int, data: bytes | memoryview) -> bytes:
        mac = hmac.new(key, seq.to_bytes(8, "big"), hashlib.sha256)
        mac.update(data)
        return mac.digest()[:TAG_SIZE]


# ---------------------------------------------------------------------------
# Where the secret comes from


def default_key_path() -> Path:
    """``$XDG_CONFIG_HOME/rdmakit/comch.key``, or ``~/.config/rdmakit/comch.key``."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "rdmakit" / "comch.key"


def _parse_hex(text: bytes, where: str) -> bytes:
    try:
        value = bytes.fromhex(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise SecretError(f"{where}: expected the secret in hex", "malformed") from None
    if len(value) < MIN_SECRET:
        raise SecretError(
            f"{where}: the secret has {len(value)} bytes; at least {MIN_SECRET} are needed", "malformed"
        )
    return value


_SECRET_KINDS: dict[str, Literal["missing", "unsafe", "malformed"]] = {
    "missing": "missing",
    "unreadable": "missing",
    "unsafe": "unsafe",
    "too-large": "malformed",
}


def _read_secret_file(path: Path) -> bytes:
    """The secret in `path`: read as ``rdmakit.transport.user_files`` reads a secret (``Trust.SECRET``)."""
    try:
        data = read_user_file(path, "secret file", _MAX_KEY_FILE, Trust.SECRET).data
    except UserFileError as exc:
        raise SecretError(exc.message, _SECRET_KINDS[exc.kind]) from None
    return _parse_hex(data, f"secret file {path}")


def _create_default_key(path: Path) -> None:
    """Write a new random key to `path` (0600) unless one appeared meanwhile; never replaces one."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SecretError(
            f"cannot create {path.parent} for the default comm channel key: {exc.strerror}", "missing"
        ) from None
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, secrets.token_hex(_DEFAULT_KEY_BYTES).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # another process of ours was first: use its key
            os.link(tmp, path)
    except OSError as exc:
        raise SecretError(
            f"cannot create the default comm channel key {path}: {exc.strerror}", "missing"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def load_secret(secret: bytes | None = None, secret_file: str | os.PathLike[str] | None = None) -> bytes:
    """The secret of ``tcp:`` channels: `secret`, `secret_file`, the environment or the default key file."""
    if secret is not None:
        if len(secret) < MIN_SECRET:
            raise SecretError(
                f"the secret has {len(secret)} bytes; at least {MIN_SECRET} are needed", "malformed"
            )
        return bytes(secret)
    if secret_file is not None:
        return _read_secret_file(Path(secret_file))
    env = os.environ.get(SECRET_ENV)
    if env:
        return _parse_hex(env.encode(errors="replace"), SECRET_ENV)
    path = default_key_path()
    try:
        return _read_secret_file(path)
    except SecretError as exc:
        if exc.kind != "missing" or os.path.lexists(path):
            raise
    _create_default_key(path)
    return _read_secret_file(path)
