"""The comm channel's handshake, both sides, as steps that never block.

Connecting, the client sends a hello naming the protocol version, its
``max_msg_size`` and a fresh nonce; the server answers with its own and the
size both will use (the smaller). On ``tcp:`` both sides then prove that they
know the shared secret (``rdmakit.transport.comm_auth``: HMAC-SHA256 over
both hellos and the connection's addresses, the server first, so a client
never talks to an impostor), and every later message carries a MAC. On a Unix
socket the kernel has already told each side who the other is.

`ClientHandshake` and `ServerHandshake` advance by `step` as messages arrive:
the blocking `rdmakit.doca.comm_channel.CommChannel` loops over them with a
deadline, the ``doca_comch`` contexts (``rdmakit.doca.comch``) call them from
``progress``. Until a peer has proved itself it may send only a hello-sized
message (`PREAUTH_MAX`); anything else breaks the handshake with the peer's
fault.
"""

import hmac
import os
import secrets
import struct
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.transport.comm import MAX_MSG_LIMIT, MessageSocket, ServiceAddress, parse_service
from rdmakit.transport.comm_auth import (
    NONCE_SIZE,
    PROOF_SIZE,
    MessageMac,
    SecretError,
    load_secret,
    proof,
    session_keys,
)


class HandshakeChannel(Protocol):
    """What a handshake step uses of its channel (`rdmakit.doca.comm_channel.CommChannel`)."""

    def _send(self, msg: bytes | memoryview, fds: Sequence[int], timeout: float | None) -> None: ...

    def _recv_or_none(self, timeout: float | None, doing: str) -> tuple[bytes, list[int]] | None: ...


_C = TypeVar("_C", bound=HandshakeChannel)


__all__ = [
    "MAX_MSG_LIMIT",
    "PREAUTH_MAX",
    "ClientHandshake",
    "ServerHandshake",
    "check_max",
    "service_address",
    "service_secret",
]

HELLO = struct.Struct(f">12sHI{NONCE_SIZE}s")  # magic, version, max_msg_size, nonce
_MAGIC = b"RDMAKITCOMCH"
_VERSION = 2
#: The most a peer may send before it has proved itself.
PREAUTH_MAX = HELLO.size + PROOF_SIZE

_SECRET_CODES = {
    "missing": DocaErrorCode.NOT_FOUND,
    "unsafe": DocaErrorCode.NOT_PERMITTED,
    "malformed": DocaErrorCode.INVALID_VALUE,
}


def service_address(spec: str) -> ServiceAddress:
    """`spec` parsed (``rdmakit.transport.comm`` has the rules); INVALID_VALUE if malformed."""
    try:
        return parse_service(spec)
    except ValueError as exc:
        raise DocaError(DocaErrorCode.INVALID_VALUE, str(exc)) from None


def service_secret(
    address: ServiceAddress, secret: bytes | None, secret_file: str | os.PathLike[str] | None
) -> bytes | None:
    """The shared secret of a ``tcp:`` channel (None for a Unix socket, where the kernel vouches)."""
    if address.kind != "tcp":
        return None
    try:
        return load_secret(secret, secret_file)
    except SecretError as exc:
        raise DocaError(_SECRET_CODES[exc.kind], str(exc), Fault.CALLER) from None


def check_max(max_msg_size: int) -> None:
    """INVALID_VALUE unless a hello fits and the socket carries it."""
    if type(max_msg_size) is not int or not PREAUTH_MAX <= max_msg_size <= MAX_MSG_LIMIT:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE,
            f"max_msg_size {max_msg_size!r} is outside {PREAUTH_MAX}..{MAX_MSG_LIMIT}",
        )


def _parse_hello(data: bytes, who: str) -> tuple[int, bytes]:
    """(max_msg_size, rest after the hello) of a peer's hello message."""
    if len(data) < HELLO.size:
        raise DocaError(DocaErrorCode.UNSUPPORTED_VERSION, f"{who} does not speak the rdmakit comm channel")
    magic, version, size, _ = HELLO.unpack_from(data)
    if magic != _MAGIC:
        raise DocaError(DocaErrorCode.UNSUPPORTED_VERSION, f"{who} does not speak the rdmakit comm channel")
    if version != _VERSION:
        raise DocaError(DocaErrorCode.UNSUPPORTED_VERSION, f"{who} speaks comm channel version {version}")
    if not PREAUTH_MAX <= size <= MAX_MSG_LIMIT:
        raise DocaError(DocaErrorCode.INVALID_VALUE, f"{who} offered max_msg_size {size}", Fault.PEER)
    return int(size), data[HELLO.size :]


def _transcript(hello_c: bytes, hello_s: bytes, sock: MessageSocket, *, client: bool) -> bytes:
    """Both hellos and the connection's addresses, as both ends see them (client's first)."""
    local, peer = sock.endpoints
    client_end, server_end = (local, peer) if client else (peer, local)
    ends = f"{client_end[0]} {client_end[1]} {server_end[0]} {server_end[1]}".encode()
    return hello_c + hello_s + ends


class ClientHandshake(Generic[_C]):
    """The client's side: `begin` sends the hello, `step` takes the server's answer."""

    def __init__(
        self,
        channel: _C,
        sock: MessageSocket,
        service: str,
        max_msg_size: int,
        key: bytes | None,
    ) -> None:
        self.channel = channel
        self._sock = sock
        self._service = service
        self._max = max_msg_size
        self._key = key
        self._hello = HELLO.pack(_MAGIC, _VERSION, max_msg_size, secrets.token_bytes(NONCE_SIZE))
        sock.max_msg_size = PREAUTH_MAX

    def begin(self, timeout: float | None) -> None:
        self.channel._send(self._hello, (), timeout)

    def step(self, timeout: float | None = 0.0) -> bool:
        """Take the server's hello if it came; True once the channel is ready. DocaError if it failed."""
        got = self.channel._recv_or_none(timeout, "before its hello")
        if got is None:
            return False
        data, fds = got
        for fd in fds:
            os.close(fd)
        service = self._service
        size, rest = _parse_hello(data, f"server of {service!r}")
        key = self._key
        if key is not None:
            transcript = _transcript(self._hello, data[: HELLO.size], self._sock, client=True)
            if not hmac.compare_digest(rest, proof(key, "server", transcript)):
                raise DocaError(
                    DocaErrorCode.AUTHENTICATION,
                    f"the server of {service!r} did not prove that it knows the comm channel secret: "
                    "it is not the service meant, or it has another secret",
                    Fault.PEER,
                )
            self.channel._send(proof(key, "client", transcript), (), timeout)
            c2s, s2c = session_keys(key, transcript)
            self._sock.start_mac(MessageMac(send_key=c2s, recv_key=s2c))
        elif rest:
            raise DocaError(
                DocaErrorCode.UNSUPPORTED_VERSION, f"server of {service!r} sent a malformed hello"
            )
        self._sock.max_msg_size = min(self._max, size)
        return True


class ServerHandshake(Generic[_C]):
    """The server's side of one connection's handshake, advanced by `step` as messages arrive."""

    def __init__(
        self,
        channel: _C,
        sock: MessageSocket,
        service: str,
        max_msg_size: int,
        key: bytes | None,
        deadline: float,
    ) -> None:
        self.channel = channel
        self.sock = sock
        self.deadline = deadline
        self._service = service
        self._max = max_msg_size
        self._key = key
        self._expect: bytes | None = None  # the client's proof, once the hellos are exchanged
        self._macs: MessageMac | None = None
        self._size = 0
        sock.max_msg_size = PREAUTH_MAX
        self.peer = sock.peer

    def fileno(self) -> int:
        return self.sock.fileno()

    def step(self, now: float) -> bool:
        """Take what the client sent; True once it is in. DocaError when it failed the handshake."""
        got = self.channel._recv_or_none(0.0, "during the handshake")
        if got is None:
            return False
        data, fds = got
        for fd in fds:
            os.close(fd)
        if self._expect is None:
            return self._hello(data, max(0.0, self.deadline - now))
        if not hmac.compare_digest(data, self._expect):
            raise DocaError(
                DocaErrorCode.AUTHENTICATION,
                f"the client did not prove that it knows the comm channel secret of {self._service!r}",
                Fault.PEER,
            )
        assert self._macs is not None
        self.sock.start_mac(self._macs)
        return self._admit()

    def _hello(self, hello_c: bytes, left: float) -> bool:
        size, rest = _parse_hello(hello_c, f"client of {self._service!r}")
        if rest:
            raise DocaError(DocaErrorCode.UNSUPPORTED_VERSION, "the client sent a malformed hello")
        self._size = min(self._max, size)
        hello_s = HELLO.pack(_MAGIC, _VERSION, self._size, secrets.token_bytes(NONCE_SIZE))
        key = self._key
        if key is None:
            self.channel._send(hello_s, (), left)
            return self._admit()
        transcript = _transcript(hello_c, hello_s, self.sock, client=False)
        self._expect = proof(key, "client", transcript)
        c2s, s2c = session_keys(key, transcript)
        self._macs = MessageMac(send_key=s2c, recv_key=c2s)
        self.channel._send(hello_s + proof(key, "server", transcript), (), left)
        return False

    def _admit(self) -> bool:
        self.sock.max_msg_size = self._size
        return True
