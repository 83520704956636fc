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
use with 32 random bytes. Files hold the secret in hex. As OpenSSH does for
private keys, a file that its group or others may read, or that another
user owns, is refused (`SecretError`).
"""

import contextlib
import hashlib
import hmac
import os
import pwd
import secrets
import stat
from pathlib import Path
from typing import Literal

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
    "user_name",
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


def user_name(uid: int) -> str:
    """``uid N (name)``, for messages about who owns or holds something."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


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


def _read_secret_file(path: Path) -> bytes:
    """The secret in `path`, which must be a regular file only its owner (this user) can read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SecretError(f"secret file {path} does not exist", "missing") from None
    except OSError as exc:
        raise SecretError(f"cannot read secret file {path}: {exc.strerror}", "missing") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretError(f"secret file {path} is not a regular file", "unsafe")
        if st.st_uid != os.geteuid():
            raise SecretError(
                f"secret file {path} is owned by {user_name(st.st_uid)}, not by this user "
                f"({user_name(os.geteuid())})",
                "unsafe",
            )
        if st.st_mode & 0o077:
            raise SecretError(
                f"permissions {stat.S_IMODE(st.st_mode):04o} for secret file {path} (owner "
                f"{user_name(st.st_uid)}) are too open: it must not be accessible by others (chmod 600)",
                "unsafe",
            )
        data = os.read(fd, _MAX_KEY_FILE + 1)
    except OSError as exc:
        raise SecretError(f"cannot read secret file {path}: {exc.strerror}", "missing") from None
    finally:
        os.close(fd)
    if len(data) > _MAX_KEY_FILE:
        raise SecretError(f"secret file {path} is larger than {_MAX_KEY_FILE} bytes", "malformed")
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
