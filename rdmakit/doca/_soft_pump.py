"""The soft device's pump as DOCA's progress engines run it, and the doorbell that keeps it honest.

``doca_pe_progress`` is cheap on a NIC when nothing happened: it polls
completion queues in memory. The soft device's `Driver` has more to look at
(its sockets, its timers, every QP with work), so a quiet pump does not run
it again until something may have changed:

- the driver's descriptor is readable: a datagram or segment arrived, or the
  timer it arms for the next deadline (a retransmission, the pacer, the CM's
  resend, a full socket's retry) fired;
- the device's `Bell` rang: a backend call that may give the engine work (a
  post, a connection, a state change, anything of the CM) took the device's
  lock through it since the last run;
- or `QUIET_RUNS` calls in a row were skipped: whatever changed without either
  sign (a QP driven through the engine directly) waits no longer than that.

A run that did something leaves the pump busy: the next call runs the driver
again. While quiet, a call costs one ``poll(0)`` of the driver's descriptor.
"""

import select
import threading
import weakref
from types import TracebackType

from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver

__all__ = ["QUIET_RUNS", "Bell", "SoftPump", "bell_of"]

#: Calls of a quiet pump that skip its driver before one runs it anyway.
QUIET_RUNS = 32


class Bell:
    """The device's lock, counting the entries of the backend calls that may give the engine work.

    ``with bell:`` takes the device's lock (`SoftDevice.lock`) as ``with
    dev.lock:`` would, and rings once.
    """

    __slots__ = ("__weakref__", "lock", "rung")

    def __init__(self, lock: "threading.RLock") -> None:
        self.lock = lock
        self.rung = 0

    def __enter__(self) -> None:
        self.lock.acquire()
        self.rung += 1

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.lock.release()


_bells: "weakref.WeakKeyDictionary[SoftDevice, Bell]" = weakref.WeakKeyDictionary()
_bells_lock = threading.Lock()


def bell_of(dev: SoftDevice) -> Bell:
    """The one `Bell` of `dev` (every handle of a shared device rings the same)."""
    with _bells_lock:
        bell = _bells.get(dev)
        if bell is None:
            bell = _bells[dev] = Bell(dev.lock)
        return bell


class _ThreadPoll(threading.local):
    """A poll object of the driver's descriptor, made in each thread that asks (``threading.local``
    runs ``__init__`` once per thread)."""

    def __init__(self, fd: int) -> None:
        self.poll = select.poll()
        self.poll.register(fd, select.POLLIN)


class SoftPump:
    """The device's `Driver`, run under the device's lock (any thread's progress engine may pump
    it), skipped while quiet as the module says."""

    def __init__(self, driver: Driver, bell: Bell) -> None:
        self.driver = driver
        self._bell = bell
        # One poll object per thread: the PEs of several threads may pump one device, and a
        # poll object refuses a second caller while one is inside it.
        self._ready = _ThreadPoll(driver.fileno())
        self._quiet = False
        self._seen = -1  # the bell's count at the last run
        self._skipped = 0

    def progress(self) -> bool:
        bell = self._bell
        quiet = self._quiet and bell.rung == self._seen and self._skipped < QUIET_RUNS
        if quiet and not self._ready.poll.poll(0):  # the descriptor, polled here: no call of ours
            self._skipped += 1
            return False
        lock = bell.lock  # ``with`` written out: it would make its exit method at every run
        lock.acquire()
        try:
            self._seen = bell.rung
            busy = self.driver.progress()
        finally:
            lock.release()
        self._quiet = not busy
        self._skipped = 0
        return busy

    def fileno(self) -> int:
        return self.driver.fileno()

    def close(self) -> None:
        with self._bell.lock:
            self.driver.close()
