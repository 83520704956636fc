"""Idle control connections cannot lock a tester out of ``conformance-target``.

The agent used to run one handshake at a time, five seconds each: a few
sockets that never send a hello kept the real tester waiting until its own
handshake timed out. Now the handshakes run side by side, each with its own
deadline, and past ``target_gate.MAX_HANDSHAKES`` waiting the oldest is closed.
"""

import json
import socket
from collections.abc import Callable
from pathlib import Path

from tests.conformance.agents import against, agent, results, write_secret


def _idle(host: str, port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect((host, port))
        out.append(s)
    return out


def test_idle_sockets_do_not_keep_the_tester_out(tmp_path: Path, new_ip: Callable[[], str]) -> None:
    secret = write_secret(tmp_path / "secret")
    idle: list[socket.socket] = []
    try:
        with agent(new_ip(), secret) as a:
            host, port = a.control.removeprefix("tcp:").rsplit(":", 1)
            for n in (3, 40):  # a few, then more than may wait at once (the oldest are closed)
                idle += _idle(host, int(port), n)
                good = against(a, new_ip(), "-k", "resp.send.only", "--json-out", "-")
                assert good.returncode == 0, good.stderr
                assert results(json.loads(good.stdout)) == {"resp.send.only": "PASS"}
            assert idle[3].recv(1) == b""  # the oldest of the 40 made room for newer ones
    finally:
        for s in idle:
            s.close()
