"""The MTUs from the network (``rdmakit.transport.netmtu``): rxe's rule, loopback, the route."""

import pytest

from rdmakit.transport.device import SoftDevice
from rdmakit.transport.netmtu import ROCE_OVERHEAD, ib_mtu, interface_of, port_mtu, route_mtu, too_big_message


@pytest.mark.parametrize(
    ("link", "version", "want"),
    [
        (1500, 4, 1024), (1500, 6, 1024), (9000, 4, 4096), (9000, 6, 4096), (65536, 4, 4096),
        (2048 + 72, 4, 2048), (2048 + 71, 4, 1024), (2048 + 92, 6, 2048), (2048 + 91, 6, 1024),
        (1280, 6, 1024), (576, 4, 256), (68, 4, 256),
    ],
)  # fmt: skip
def test_ib_mtu_is_the_largest_that_fits(link: int, version: int, want: int) -> None:
    assert ib_mtu(link, version) == want
    assert want + ROCE_OVERHEAD[version] <= link or want == 256


def test_loopback_is_4096() -> None:
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("127.0.0.2") == "lo"  # held by lo's 127.0.0.1/8
    assert port_mtu("127.0.0.2") == 4096
    assert route_mtu("127.0.0.3") == 4096
    assert route_mtu("127.0.0.3", 1024) == 1024
    with SoftDevice("127.0.0.2", port=0) as dev:
        assert dev.max_mtu == 4096


def test_too_big_names_the_mtus_and_the_fix() -> None:
    msg = too_big_message("127.0.0.3", 4132, 4096)
    assert "path MTU 4096" in msg
    assert "127.0.0.3" in msg
    assert "-m" in msg
