"""Run ``rdmakit conformance`` and target agents (plain or mutated) as separate processes."""

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Agent:
    control: str  # tcp:HOST:PORT
    dut_ip: str
    secret_file: Path


def _in(netns: str | None) -> list[str]:
    """The prefix that runs a command in network namespace `netns` (none: here)."""
    return [] if netns is None else ["ip", "netns", "exec", netns]


def conformance(
    *args: str, timeout: float = 600, netns: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_in(netns), sys.executable, "-m", "rdmakit", "conformance", *args],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


def write_secret(path: Path) -> Path:
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path


@contextmanager
def agent(
    dut_ip: str, secret_file: Path, mutation: str | None = None, once: bool = False, netns: str | None = None
) -> Iterator[Agent]:
    """A target agent on a soft device at `dut_ip`, in its own process (with `mutation` applied),
    in network namespace `netns` if given."""
    args = ["-d", f"soft-udp:{dut_ip}", "--listen", "tcp:127.0.0.1:0", "--secret-file", str(secret_file)]
    if once:
        args.append("--once")
    if mutation is None:
        cmd = [*_in(netns), sys.executable, "-m", "rdmakit", "conformance-target", *args]
    else:
        cmd = [*_in(netns), sys.executable, "-m", "tests.conformance.mutations", mutation, *args]
    # A mutant changes Python code the native data plane would bypass.
    env = dict(os.environ, RDMAKIT_PURE_PYTHON="1") if mutation is not None else None
    with spawned(cmd, dut_ip, secret_file, env) as a:
        yield a


@contextmanager
def spawned(
    cmd: list[str], dut_ip: str, secret_file: Path, env: dict[str, str] | None = None
) -> Iterator[Agent]:
    """Any agent command (the minimal agent, an altered one) that prints its ready line on
    stdout, in its own process, stopped and reaped on exit."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "the agent exited"
        ready = json.loads(line)
        yield Agent(ready["control"], dut_ip, secret_file)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def against(
    a: Agent, tester_ip: str, *args: str, netns: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The suite against agent `a`, as a tester at `tester_ip` (in network namespace `netns`)."""
    return conformance(
        "--target", a.control, "--dut-ip", a.dut_ip, "--tester-ip", tester_ip,
        "--secret-file", str(a.secret_file), *args, netns=netns,
    )  # fmt: skip


@contextmanager
def ipv6_namespace(*addresses: str) -> Iterator[str]:
    """A network namespace of its own, ``v6conf-<pid>-<n>``, whose loopback carries `addresses`
    (IPv6, no duplicate address detection); deleted on exit. Needs root."""
    name = f"v6conf-{os.getpid()}-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, capture_output=True,
                       timeout=30)  # fmt: skip
        for a in addresses:
            subprocess.run(["ip", "-n", name, "addr", "add", f"{a}/128", "dev", "lo", "nodad"], check=True,
                           capture_output=True, timeout=30)  # fmt: skip
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=30)


def results(doc: dict[str, Any]) -> dict[str, str]:
    return {r["id"]: r["result"] for r in doc["results"]}
