"""``rdmakit devices``: soft devices listed, verbs devices absent with a reason."""

import importlib.util
import json
import subprocess
import sys

import pytest


def rdmakit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmakit", *args], check=False, capture_output=True, text=True, timeout=60
    )


def test_json_lists_soft_devices_for_loopback() -> None:
    out = rdmakit("devices", "--json")
    assert out.returncode == 0
    rows = json.loads(out.stdout)
    by_name = {r["name"]: r for r in rows}
    udp, tcp = by_name["udp:127.0.0.1"], by_name["tcp:127.0.0.1"]
    assert udp["kind"] == "soft-udp"
    assert udp["gids"] == ["::ffff:127.0.0.1"]
    assert udp["mtu"] == 4096
    assert tcp["mtu"] == 1 << 20
    assert udp["max_message_size"] == 1 << 31
    assert "write-imm" in udp["jobs"]


def test_an_unlisted_loopback_address_resolves_and_a_foreign_one_does_not() -> None:
    out = rdmakit("devices", "tcp:127.9.9.9")
    assert out.returncode == 0
    assert "tcp:127.9.9.9" in out.stdout
    bad = rdmakit("devices", "10.200.1.1")
    assert bad.returncode == 1
    assert bad.stderr.strip() == "rdmakit devices: no device matches '10.200.1.1' (see 'rdmakit devices')"


@pytest.mark.skipif(importlib.util.find_spec("pyverbs") is not None, reason="pyverbs is installed here")
def test_without_pyverbs_the_reason_is_logged_at_debug_level() -> None:
    out = rdmakit("devices", "-l", "60")
    assert out.returncode == 0
    assert "no verbs devices: pyverbs is not importable" in out.stderr
    quiet = rdmakit("devices")
    assert "pyverbs" not in quiet.stderr
