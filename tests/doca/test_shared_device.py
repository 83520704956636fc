"""A soft device shared by several progress engines: its pump and its queue pairs take one lock.

The engine under a soft device is not thread-safe, so a device that engines
of several threads pump (``rdmakit.doca.device``) serialises its pump, its
queue pairs' work requests and completions and its memory registration on
the device's lock. While another thread holds it, a progress engine's pump
and a context's submission wait; once it is released, both go on.
"""

import threading
from collections.abc import Callable

from rdmakit.doca import PE, Dev, SoftBackendDevice
from rdmakit.engine.types import Access, QpCaps, SendWR, WrOpcode


def _blocked(call: Callable[[], object]) -> tuple[threading.Thread, threading.Event]:
    """`call` on a thread of its own; the event is set once it returned."""
    returned = threading.Event()

    def run() -> None:
        call()
        returned.set()

    t = threading.Thread(target=run)
    t.start()
    return t, returned


def test_the_pump_and_a_post_wait_for_the_device_lock(new_ip: Callable[[], str]) -> None:
    with PE() as pe, Dev.open(f"udp:{new_ip()}", pe=pe) as dev:
        backend = dev.backend
        assert isinstance(backend, SoftBackendDevice)
        qp = backend.create_qp(QpCaps(max_send_wr=4, max_recv_wr=4))
        qp.init(Access.NONE)
        qp.to_error()  # a send on a QP in ERR completes flushed: no peer needed
        lock = backend.soft.lock
        with lock:
            pumping, pumped = _blocked(pe.progress)
            posting, posted = _blocked(lambda: qp.post_send(SendWR(wr_id=7, opcode=WrOpcode.SEND)))
            # A wait that only a held lock explains: it can end early only if the lock is not taken.
            assert not pumped.wait(0.3)
            assert not posted.wait(0.01)
        pumping.join(60)
        posting.join(60)
        assert pumped.is_set()
        assert posted.is_set()
        assert [(c.wr_id, c.status.name) for c in qp.poll(4)] == [(7, "WR_FLUSH_ERR")]
        qp.close()
