"""The conformance tester's link (rdmakit.transport.probe): GSO batches split with their headers,
a batch sent again, datagrams the raw socket missed, and the kernel's receive times."""

import os
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from rdmakit.transport.probe import Datagram, ProbeLink
from rdmakit.transport.udp import SOL_UDP, UDP_SEGMENT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the raw socket needs root or CAP_NET_RAW")


@pytest.fixture
def pair(new_ip: Callable[[], str]) -> Iterator[tuple[ProbeLink, socket.socket]]:
    link = ProbeLink(new_ip())
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.bind((new_ip(), 0))
    try:
        yield link, sender
    finally:
        sender.close()
        link.close()


def _batch(sender: socket.socket, link: ProbeLink, segs: list[bytes]) -> None:
    sender.setsockopt(SOL_UDP, UDP_SEGMENT, len(segs[0]))
    sender.sendto(b"".join(segs), (link.ip, link.port))


def _all(link: ProbeLink, n: int) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < n and (d := link.recv(2.0)) is not None:
        assert d.ip_header is not None, "a segment without its header"
        got.append(d.payload)
    return got


def test_a_gso_batch_sent_twice_is_split_both_times(pair: tuple[ProbeLink, socket.socket]) -> None:
    link, sender = pair
    segs = [bytes([i]) * 64 for i in range(3)]
    _batch(sender, link, segs)
    _batch(sender, link, segs)  # a retransmission: the same bytes again
    assert _all(link, 6) == segs + segs
    assert link.recv(0.2) is None


def test_stale_copies_before_a_batch_are_passed_over(pair: tuple[ProbeLink, socket.socket]) -> None:
    link, sender = pair
    link._pending.append(Datagram("127.0.0.1", 4791, b"stale" * 4, None, time.time()))  # a late copy
    segs = [bytes([7 + i]) * 32 for i in range(2)]
    _batch(sender, link, segs)
    assert _all(link, 2) == segs


def test_a_datagram_the_raw_socket_missed_still_arrives(pair: tuple[ProbeLink, socket.socket]) -> None:
    link, sender = pair
    sender.sendto(b"lost raw copy", (link.ip, link.port))
    time.sleep(0.1)
    assert link._raw is not None
    while True:  # what a full raw socket does: its copy is gone
        try:
            link._raw.recv(65536)
        except BlockingIOError:
            break
    d = link.recv(3.0)
    assert d is not None
    assert d.payload == b"lost raw copy"
    assert d.ip_header is None  # the tester solves its IPv4 ID instead
    assert link.recv(0.8) is None  # once


def test_each_datagram_has_the_kernel_receive_time(pair: tuple[ProbeLink, socket.socket]) -> None:
    link, sender = pair
    before = time.time()
    sender.sendto(b"x" * 40, (link.ip, link.port))
    time.sleep(0.2)
    d = link.recv(2.0)
    assert d is not None
    assert before <= d.stamp <= before + 0.2  # when it arrived, not when it was read
