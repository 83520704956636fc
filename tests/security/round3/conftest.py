"""The two CM peers the QP1 and forged-REJ tests share: device 2 listens on port 7174."""

from collections.abc import Callable, Iterator

import pytest

from tests.security.round3.cm_peers import Side


@pytest.fixture
def sides(new_ip: Callable[[], str]) -> Iterator[tuple[Side, Side]]:
    a, b = Side(new_ip(), 1), Side(new_ip(), 2)
    b.cm.listen(7174)
    try:
        yield a, b
    finally:
        a.close()
        b.close()
