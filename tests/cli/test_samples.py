"""The DOCA RDMA sample pairs through the real CLI: two processes, descriptor files."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.sample_pairs import TIMEOUT, finish, pair, rdmakit

TRANSPORTS = pytest.mark.parametrize("transport", ["udp", "tcp"])
IPS = Callable[[], str]


@TRANSPORTS
def test_write_pair(transport: str, tmp_path: Path, new_ip: IPS) -> None:
    r, s = pair(
        tmp_path,
        (new_ip(), new_ip()),
        transport,
        ["rdma-write-requester", "-w", "written by RDMA"],
        ["rdma-write-responder"],
    )
    assert r == (0, "Written to the responder: written by RDMA", "")
    assert s == (0, "Remote write: written by RDMA", "")


@TRANSPORTS
def test_read_pair(transport: str, tmp_path: Path, new_ip: IPS) -> None:
    r, s = pair(
        tmp_path,
        (new_ip(), new_ip()),
        transport,
        ["rdma-read-requester"],
        ["rdma-read-responder", "-r", "read me, please"],
    )
    assert r == (0, "Read from the responder: read me, please", "")
    assert s == (0, "The requester read 15 bytes: read me, please", "")


@TRANSPORTS
def test_write_immediate_pair(transport: str, tmp_path: Path, new_ip: IPS) -> None:
    r, s = pair(
        tmp_path,
        (new_ip(), new_ip()),
        transport,
        ["rdma-write-immediate-requester", "--immediate", "0xC0FFEE"],
        ["rdma-write-immediate-responder"],
    )
    assert r[0] == 0, r
    assert s == (0, "Remote write with immediate 0x00c0ffee: Hi DOCA RDMA!", "")


@TRANSPORTS
def test_send_receive_pair(transport: str, tmp_path: Path, new_ip: IPS) -> None:
    r, s = pair(tmp_path, (new_ip(), new_ip()), transport, ["rdma-send", "-s", "über RoCE"], ["rdma-receive"])
    assert r == (0, "Sent: über RoCE", "")
    assert s == (0, "Received: über RoCE", "")


@TRANSPORTS
def test_send_receive_immediate_pair(transport: str, tmp_path: Path, new_ip: IPS) -> None:
    r, s = pair(
        tmp_path,
        (new_ip(), new_ip()),
        transport,
        ["rdma-send-immediate", "-s", "with imm", "--immediate", "7"],
        ["rdma-receive-immediate"],
    )
    assert r == (0, "Sent with immediate 0x00000007: with imm", "")
    assert s == (0, "Received with immediate 0x00000007: with imm", "")


@TRANSPORTS
def test_atomic_pairs(transport: str, tmp_path: Path, new_ip: IPS) -> None:
    r, s = pair(
        tmp_path,
        (new_ip(), new_ip()),
        transport,
        ["rdma-atomic-requester", "--op", "faa", "--add", "5"],
        ["rdma-atomic-responder", "--initial", "100"],
    )
    assert r == (0, "Fetch-and-add: original value 100, added 5", "")
    assert s == (0, "Atomic faa: value was 100, is now 105", "")
    r, s = pair(
        tmp_path,
        (new_ip(), new_ip()),
        transport,
        ["rdma-atomic-requester", "--op", "cas", "--compare", "9", "--swap", "1"],
        ["rdma-atomic-responder", "--initial", "100"],
    )
    assert r == (0, "Compare-and-swap: original value 100, not swapped", "")
    assert s == (0, "Atomic cas: value was 100, is now 100", "")


def test_json_file_supplies_the_flags(tmp_path: Path, new_ip: IPS) -> None:
    """DOCA's --json FILE: the same keys as the long flags."""
    ips = (new_ip(), new_ip())
    cfg = tmp_path / "send.json"
    cfg.write_text(
        json.dumps(
            {
                "device": ips[1],
                "local-descriptor-path": str(tmp_path / "req.json"),
                "remote-descriptor-path": str(tmp_path / "resp.json"),
                "send-string": "from a json file",
                "timeout": 20,
            }
        )
    )
    resp = rdmakit(
        "rdma-receive",
        "-d",
        ips[0],
        "-ld",
        str(tmp_path / "resp.json"),
        "-re",
        str(tmp_path / "req.json"),
        "--timeout",
        TIMEOUT,
    )
    req = rdmakit("rdma-send", "--json", str(cfg))
    assert finish(req) == (0, "Sent: from a json file", "")
    assert finish(resp) == (0, "Received: from a json file", "")


# -- failures: one line, non-zero status, no traceback -----------------------------------------


def run_once(*args: str) -> tuple[int, str, str]:
    return finish(rdmakit(*args))


def test_missing_descriptor_times_out(tmp_path: Path, new_ip: IPS) -> None:
    rc, _out, err = run_once(
        "rdma-send",
        "-d",
        new_ip(),
        "-ld",
        str(tmp_path / "l.json"),
        "-re",
        str(tmp_path / "never.json"),
        "--timeout",
        "0.5",
    )
    assert rc == 3
    assert err == (
        f"rdmakit rdma-send: timed out after 0.5 s waiting for the peer's connection descriptor "
        f"({tmp_path / 'never.json'})"
    )
    assert not (tmp_path / "l.json").exists()


@pytest.mark.parametrize(
    ("content", "field"),
    [
        (b'{"format": "rdmakit.connection/1", "transport": "roce-udp"', "descriptor"),
        (b"\x00\x01binary", "descriptor"),
        (b'{"format": "rdmakit.connection/9"}', "format"),
        (b'{"format": "rdmakit.mmap/1", "addr": 1}', "format"),
        (
            json.dumps(
                {
                    "format": "rdmakit.connection/1",
                    "transport": "roce-udp",
                    "gid": "::ffff:127.0.0.9",
                    "ip": "127.0.0.9",
                    "port": 4791,
                    "qpn": -4,
                    "psn": 1,
                    "mtu": 4096,
                }
            ).encode(),
            "qpn",
        ),
    ],
)
def test_garbage_descriptor_is_one_line_naming_file_and_field(
    content: bytes, field: str, tmp_path: Path, new_ip: IPS
) -> None:
    bad = tmp_path / "peer.json"
    bad.write_bytes(content)
    rc, _out, err = run_once(
        "rdma-send", "-d", new_ip(), "-ld", str(tmp_path / "l.json"), "-re", str(bad), "--timeout", "2"
    )
    assert rc == 1
    assert len(err.splitlines()) == 1, err
    assert str(bad) in err
    assert f"'{field}'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("device", ["10.250.1.1", "mlx5_42", "tcp:nowhere"])
def test_a_device_that_does_not_exist(device: str) -> None:
    rc, _out, err = run_once("rdma-receive", "-d", device, "--timeout", "1")
    assert rc == 2
    assert err.startswith(f"rdmakit rdma-receive: no such device: {device!r} (see 'rdmakit devices')")
    assert len(err.splitlines()) == 1


def test_a_verbs_device_without_pyverbs_names_the_install_script() -> None:
    from rdmakit.verbs import pyverbs_missing

    if pyverbs_missing() is None:
        pytest.skip("pyverbs is installed here")
    rc, _out, err = run_once("rdma-receive", "-d", "rxe0", "--timeout", "1")
    assert rc == 2
    assert "pyverbs" in err
    assert "scripts/install-verbs-deps.sh" in err


def test_a_write_to_memory_not_exported_for_writing(tmp_path: Path, new_ip: IPS) -> None:
    """RDMA guide §5.1.4: a write needs RDMA_WRITE at the responder; the read responder grants only READ."""
    r, s = pair(tmp_path, (new_ip(), new_ip()), "udp", ["rdma-write-requester"], ["rdma-read-responder"])
    assert r[0] == 1
    assert r[2].startswith("rdmakit rdma-write-requester: the RDMA write failed: ")
    assert "RDMA_WRITE" in r[2]
    assert len(r[2].splitlines()) == 1
    assert s[0] == 1
    assert "Traceback" not in s[2]
    assert len(s[2].splitlines()) == 1
