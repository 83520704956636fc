"""The control channel between the tester and the target agent: mutual HMAC, then MACed JSON.

Anyone who can reach the agent's port can connect, and the agent drives a
device, so nothing is believed before the handshake, which is the comm
channel's (:mod:`rdmakit.transport.comm_auth`) with this protocol's own hellos::

    tester -> agent   hello_c = MAGIC_C || nonce_c          (exactly 52 bytes)
    agent  -> tester  hello_s = MAGIC_S || nonce_s, proof_s
    tester -> agent   proof_c

    transcript = hello_c || hello_s || tester ip, port || agent ip, port
    proof_x    = HMAC-SHA256(secret, "rdmakit-comch/1 " role " " transcript)

Both ends then MAC every message with per-direction keys and sequence
numbers (``MessageMac``): nothing can be altered, injected, replayed or
reordered. Before the handshake the agent reads at most one hello of the
exact size, and the whole handshake must end within `HANDSHAKE_SECONDS`, or
the bound each end is given (a tester reaching a slow agent, an agent on an
emulated machine); the agent runs several side by side, ``target_gate``. Any
mismatch closes the connection.
After it, each message is one JSON object of at most `MAX_MSG` bytes.
"""

import hmac
import json
import secrets
import time
from typing import Any

from rdmakit.transport.comm import MessageSocket
from rdmakit.transport.comm_auth import NONCE_SIZE, PROOF_SIZE, MessageMac, proof, session_keys

MAGIC_C = b"rdmakit-conformance/1 c"
MAGIC_S = b"rdmakit-conformance/1 s"
HELLO_SIZE = len(MAGIC_C) + NONCE_SIZE
#: Largest message either side sends or accepts (JSON), and the longest hex blob in one.
MAX_MSG = 1 << 16
HANDSHAKE_SECONDS = 5.0


class ControlError(Exception):
    """The channel failed: a bad proof, a malformed or oversized message, a peer that went away."""


def _transcript(hello_c: bytes, hello_s: bytes, sock: MessageSocket, *, client: bool) -> bytes:
    local, peer = sock.endpoints
    c, s = (local, peer) if client else (peer, local)
    return hello_c + hello_s + f"{c[0]} {c[1]} {s[0]} {s[1]}".encode()


def _recv_exact(sock: MessageSocket, size: int, deadline: float, what: str, timeout: float) -> bytes:
    got = sock.recv(max(deadline - time.monotonic(), 0.0))
    if got is None:
        raise ControlError(f"no {what} within {timeout:g} s")
    data = got[0]
    if len(data) != size:
        raise ControlError(f"{what} of {len(data)} bytes, {size} expected")
    return data


def client_handshake(sock: MessageSocket, secret: bytes, timeout: float = HANDSHAKE_SECONDS) -> None:
    """Prove ourselves to the agent and check its proof, within `timeout` seconds; MACs from then on."""
    deadline = time.monotonic() + timeout
    hello_c = MAGIC_C + secrets.token_bytes(NONCE_SIZE)
    sock.send(hello_c, timeout=timeout)
    reply = _recv_exact(sock, HELLO_SIZE + PROOF_SIZE, deadline, "agent hello", timeout)
    hello_s, proof_s = reply[:HELLO_SIZE], reply[HELLO_SIZE:]
    if not hello_s.startswith(MAGIC_S):
        raise ControlError("the peer is not a conformance target agent")
    transcript = _transcript(hello_c, hello_s, sock, client=True)
    if not hmac.compare_digest(proof_s, proof(secret, "server", transcript)):
        raise ControlError("the agent does not know the shared secret")
    sock.send(proof(secret, "client", transcript), timeout=max(deadline - time.monotonic(), 0.0))
    c2s, s2c = session_keys(secret, transcript)
    sock.start_mac(MessageMac(c2s, s2c))


def server_hello(sock: MessageSocket, secret: bytes, hello_c: bytes) -> bytes:
    """The agent's half of the handshake, once the tester's hello came: it proves itself over a
    fresh nonce. Returns the transcript `server_finish` checks the tester's proof against."""
    if len(hello_c) != HELLO_SIZE or not hello_c.startswith(MAGIC_C):
        raise ControlError("not a conformance tester hello")
    hello_s = MAGIC_S + secrets.token_bytes(NONCE_SIZE)
    transcript = _transcript(hello_c, hello_s, sock, client=False)
    sock.send(hello_s + proof(secret, "server", transcript), timeout=HANDSHAKE_SECONDS)
    return transcript


def server_finish(sock: MessageSocket, secret: bytes, transcript: bytes, proof_c: bytes) -> None:
    """Check the tester's proof; MACs from then on."""
    if len(proof_c) != PROOF_SIZE or not hmac.compare_digest(proof_c, proof(secret, "client", transcript)):
        raise ControlError("the tester does not know the shared secret")
    c2s, s2c = session_keys(secret, transcript)
    sock.start_mac(MessageMac(s2c, c2s))


def encode(msg: dict[str, Any]) -> bytes:
    data = json.dumps(msg, separators=(",", ":")).encode()
    if len(data) > MAX_MSG:
        raise ControlError(f"message of {len(data)} bytes; at most {MAX_MSG}")
    return data


def decode(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_MSG:
        raise ControlError(f"message of {len(data)} bytes; at most {MAX_MSG}")
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError):
        raise ControlError("a message is not JSON") from None
    if not isinstance(msg, dict):
        raise ControlError("a message is not a JSON object")
    return msg


class TargetClient:
    """The tester's end: one request, one reply."""

    def __init__(self, sock: MessageSocket) -> None:
        self.sock = sock

    def call(self, op: str, timeout: float = 30.0, **args: Any) -> dict[str, Any]:
        self.sock.send(encode({"op": op, **args}), timeout=timeout)
        got = self.sock.recv(timeout)
        if got is None:
            raise ControlError(f"the agent did not answer {op!r} within {timeout:g} s")
        reply = decode(got[0])
        if "error" in reply:
            raise TargetError(str(reply["error"]))
        return reply

    def close(self) -> None:
        self.sock.close()


class TargetError(Exception):
    """The agent refused or failed a request (its message)."""
