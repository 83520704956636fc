"""Two processes on loopback perform every RC operation, over UDP and over TCP."""

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.transport.two_process import Requester, check_peer_report, exercise


@pytest.mark.parametrize("transport", ["roce-udp", "tcp"])
def test_every_rc_operation_between_two_processes(
    transport: str, tmp_path: Path, new_ip: Callable[[], str]
) -> None:
    r = Requester(transport, new_ip(), tmp_path, new_ip())
    try:
        expected = exercise(r)
    except BaseException:
        r.close(failed=True)
        raise
    recvs, last = r.close()
    check_peer_report(recvs, last, list(expected))
