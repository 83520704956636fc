"""Drivers: what pumps soft devices with a real clock.

:class:`Driver` is synchronous and never blocks in ``progress()``: the DOCA
polling API calls it from ``progress_retrieve``. For event-driven mode it exposes
one file descriptor (an epoll set holding every device's sockets and a timerfd
armed at the engines' next deadline) that turns readable when ``progress()`` has
work to do; it can be waited on with ``select``, ``epoll`` or
``trio.lowlevel.wait_readable``.

:class:`TrioDriver` runs the same pump as a trio task: it waits for readability
once, then drains without awaiting per packet.
"""

import contextlib
import ctypes
import math
import os
import select
import time
from collections.abc import Callable

import trio

from . import fastpath
from .codec import WaitLoop
from .device import SoftDevice
from .roce_udp import MAX_RX_BATCHES

#: ``wait_loop``'s reason: QPs wait in a visited list for their deadlines to be noted.
LOOP_FLUSH = 4

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


class TimerFd:
    """A Linux timerfd on CLOCK_MONOTONIC (the clock of ``time.monotonic``)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._settime = libc.timerfd_settime
        fd = int(libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC))
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd = fd
        self.armed_at: float | None = None

    def fileno(self) -> int:
        return self.fd

    def arm(self, deadline: float | None) -> None:
        """Fire at the monotonic time ``deadline`` (None disarms)."""
        if deadline == self.armed_at:
            return
        spec = _Itimerspec()
        if deadline is not None:
            d = max(deadline, 1e-9)
            spec.it_value.tv_sec = int(d)
            spec.it_value.tv_nsec = max(1, int((d - int(d)) * 1e9))
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self.armed_at = deadline

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Driver:
    """Pumps a set of soft devices from the real monotonic clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, native: bool | None = None) -> None:
        self.clock = clock
        if native is None:
            native = "RDMAKIT_NO_NATIVE_WAIT" not in os.environ  # (any value) the Python wait, for A/B runs
        #: The native wait (``_nativeloop.c``): only on the clock it reads (CLOCK_MONOTONIC).
        self._loop = fastpath.CODEC.wait_loop if native and clock is time.monotonic else None
        self.devices: list[SoftDevice] = []
        self._ep = select.epoll()
        self._timer = TimerFd()
        self._ep.register(self._timer.fileno(), select.EPOLLIN)
        self.closed = False

    def add(self, dev: SoftDevice) -> None:
        if dev not in self.devices:
            self.devices.append(dev)
            self._ep.register(dev.fileno(), select.EPOLLIN)
            dev.post_with(self.clock)  # a post's one SEND or WRITE leaves in its post_send

    def remove(self, dev: SoftDevice) -> None:
        if dev in self.devices:
            self.devices.remove(dev)
            dev.post_with(None)
            with contextlib.suppress(OSError, ValueError):
                self._ep.unregister(dev.fileno())

    def fileno(self) -> int:
        """Readable when ``progress()`` has something to do (after :meth:`arm`)."""
        return self._ep.fileno()

    def progress(self) -> bool:
        """Run every device once, without blocking. True if anything happened.

        One ``epoll_wait(0)`` on the driver's set says which devices have
        input and whether the timer fired; devices without input skip their
        sockets.
        """
        events = self._ep.poll(0)
        now = self.clock()
        timer = self._timer
        fds: set[int] | tuple[()] = {fd for fd, _ in events} if events else ()
        if timer.fd in fds:
            timer.clear()
        busy = False
        for dev in self.devices:
            if dev.progress(now, dev.fileno() in fds):
                busy = True
        # Keep fileno() honest for event-driven callers: readable by the next
        # deadline. Re-arming costs a system call, so an earlier arming that
        # is still ahead stays (it only causes one early wake-up).
        best = None
        for dev in self.devices:
            t = dev.deadline_hint()
            if t is not None and (best is None or t < best):
                best = t
            if dev.wants_write():
                t = now + 0.0002  # socket full: look again very soon
                best = t if best is None else min(best, t)
        armed = timer.armed_at
        if best is not None and (armed is None or armed <= now or best < armed):
            timer.arm(best)
        return busy

    def next_deadline(self) -> float | None:
        best: float | None = None
        for dev in self.devices:
            t = dev.next_deadline()
            if t is not None and (best is None or t < best):
                best = t
            if dev.wants_write():
                t = self.clock() + 0.0002  # socket full: look again very soon
                best = t if best is None else min(best, t)
        return best

    def arm(self) -> None:
        """Make ``fileno()`` turn readable at the next engine deadline as well.

        ``progress()`` does this too; call it after posting work without progress.
        """
        self._timer.arm(self.next_deadline())

    def wait(self, timeout: float | None = None) -> None:
        """Block until a device has input, a deadline passes, or ``timeout`` runs out."""
        # The next deadline bounds the epoll timeout directly: re-arming the
        # timerfd for every wait would cost a system call per round trip.
        deadline = self.next_deadline()
        if deadline is not None:
            left = max(deadline - self.clock(), 0.0)
            timeout = left if timeout is None else min(timeout, left)
        self._ep.poll(-1 if timeout is None else max(timeout, 0.0))

    def run_until(self, done: Callable[[], bool], timeout: float, spin: float = 0.0) -> bool:
        """Pump until ``done()`` or ``timeout`` seconds pass; returns ``done()``.

        When nothing is happening, keep polling for ``spin`` seconds before
        blocking in :meth:`wait` (a busy poll answers sooner; blocking leaves
        the CPU to the peer when cores are scarce).
        """
        clock = self.clock
        end = clock() + timeout
        idle_since: float | None = None
        while not done():
            if self.progress():
                idle_since = None
                continue
            if done():
                return True
            now = clock()
            left = end - now
            if left <= 0:
                return done()
            if self._loop is not None and self._wait_native(self._loop, done, now + spin, end):
                idle_since = None
                continue
            if spin > 0:
                if idle_since is None:
                    idle_since = now
                if now - idle_since < spin:
                    # Nothing moved: until a socket or the timer (armed by progress() for the
                    # next deadline) is readable, progress() would find nothing either, so the
                    # busy poll is one epoll_wait(0) per turn, not a pass over every device.
                    stop, poll = idle_since + spin, self._ep.poll
                    while not poll(0) and not done() and clock() < stop:
                        pass
                    continue
                idle_since = None
            self.wait(left)
        return True

    def _wait_native(self, loop: WaitLoop, done: Callable[[], bool], spin_end: float, end: float) -> bool:
        """``run_until``'s idle wait in one native call (``_nativeloop.c``): spin until ``spin_end``,
        then block until a datagram, the next deadline or ``end``, taking what the armed paths take
        without returning per datagram. What it leaves (a read only Python takes, completers' logs,
        ACKs to batch, the QPs it visited) is this pass's, finished here as ``progress`` would.
        False: a device's Python pass has work, so the wait is not handed over."""
        devs = self.devices
        ports = []
        for dev in devs:
            p = dev.loop_port()
            if p is None:
                return False
            ports.append(p)
        best = math.inf
        for dev in devs:
            t = dev.deadline_hint()
            if t is not None and t < best:
                best = t
        solved = [dev.counters.icrc_solved for dev in devs]
        reason, index, counts, raw, err = loop(
            self._ep.fileno(), ports, done, spin_end, end, best, MAX_RX_BATCHES
        )
        now = self.clock()
        for i, dev in enumerate(devs):
            port = dev.udp_port
            assert port is not None
            taken, sent = counts[i]
            port.loop_taken(taken, sent, solved[i])
            if i == index:
                port.loop_handback(ports[i][6], raw, err, now)
                dev.progress(now, None if raw is not None else False, True)
            elif taken or sent or reason == LOOP_FLUSH:
                dev.progress(now, False, True)
        return True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._ep.close()
        self._timer.close()

    def __enter__(self) -> "Driver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TrioDriver:
    """The pump as a trio task, for async applications.

    ``async with TrioDriver(driver) as td:`` starts it; ``await td.wait_for(pred)``
    returns once ``pred()`` holds after a round of progress.
    """

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._wait_scope: trio.CancelScope | None = None

    async def __aenter__(self) -> "TrioDriver":
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self._nursery.start_soon(self._run)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        await self._nursery_cm.__aexit__(None, None, None)

    def kick(self) -> None:
        """Something was posted: run the pump now rather than at the next packet or deadline."""
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    def _wake(self) -> None:
        ev, self._changed = self._changed, trio.Event()
        ev.set()

    async def _run(self) -> None:
        d = self.driver
        fd = d.fileno()
        while True:
            busy = d.progress()
            self._wake()
            if busy:
                await trio.lowlevel.checkpoint()
                continue
            d.arm()  # the epoll set includes the timerfd: deadlines wake us too
            with trio.CancelScope() as scope:
                self._wait_scope = scope
                await trio.lowlevel.wait_readable(fd)
            self._wait_scope = None

    async def wait_for(self, pred: Callable[[], bool]) -> None:
        while not pred():
            await self._changed.wait()


def wait_readable(fd: int, timeout: float | None) -> bool:
    """Block until ``fd`` is readable or ``timeout`` seconds pass; True if readable."""
    with select.epoll(1) as ep:
        ep.register(fd, select.EPOLLIN)
        return bool(ep.poll(-1 if timeout is None else max(timeout, 0.0)))
