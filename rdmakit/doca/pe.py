"""The progress engine (DOCA 2.5+ ``doca_pe.h``): what makes contexts and devices advance.

A `ProgressEngine` owns two things, and nothing else holds them:

- the contexts connected to it (``doca_pe_connect_ctx``): `progress` advances
  each of them, and `num_inflight_tasks` counts their jobs in flight
  (``doca_pe_get_num_inflight_tasks``);
- the pumps of the devices opened under it (`rdmakit.doca.backend.Pump`: the
  soft driver of a soft device, the completion channels of a verbs device):
  `progress` runs each once, before the contexts, so the contexts find what
  their devices did.

``progress()`` (``doca_pe_progress``) never blocks and returns whether
anything happened. Event-driven mode is the loop of ``doca_pe.h``: progress
until it returns False, `request_notification`, wait for the notification
handle (`fileno`, ``doca_pe_get_notification_handle``) to be readable,
`clear_notification`, repeat. The handle is an epoll set of the pumps'
descriptors, the contexts' own descriptors and an eventfd that `notify`
writes once a notification was requested, so it works with ``select``,
``selectors`` and ``trio.lowlevel.wait_readable``.

Tasks (DOCA 2.5+, ``rdmakit.doca.tasks``): `connect_ctx` connects a context
to the engine for the task API (``doca_pe_connect_ctx``); a context is
connected to one engine, directly or through its WorkQ. A task's completion
is queued on the engine of its context (`defer`) and its callback runs in a
later ``progress`` only, never inside ``submit`` or ``stop`` and never from
another thread; ``progress`` runs the callbacks queued when it began, after
the pumps and the contexts, and counts them as progress.

`PE` is another name of `ProgressEngine`, as DOCA calls it.

A `WorkQ` progresses the engine it was created with; without one it uses the
engine of the creating thread (`thread_engine`), as does `Dev.open`. One
engine per thread is the default: a connection whose two ends live in one
thread (a loopback pair) must be progressed by one engine, whichever of its
work queues the caller drives, and, as in DOCA, contexts are not
thread-safe, so a thread is the unit that drives them. Explicit engines
(`ProgressEngine()`, passed to `WorkQ` and `Dev.open`) keep unrelated work
apart. A device serves contexts on any engine: each engine with one of its
contexts runs its pump too (``rdmakit.doca.device``), and `wake` lets
another thread's pump wake this engine's waiter.
"""

import contextlib
import os
import select
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Protocol, Self

from rdmakit.doca.backend import Pump
from rdmakit.doca.errors import DocaError, DocaErrorCode

__all__ = ["PE", "PeContext", "ProgressEngine", "thread_engine"]


class PeContext(Protocol):
    """What an engine needs of a connected context (`rdmakit.doca.Ctx` is one)."""

    @property
    def num_inflight(self) -> int: ...

    def _progress(self) -> bool: ...

    def _pe_connected(self, pe: "ProgressEngine") -> None:
        """`connect_ctx` connected it for tasks; raise to refuse (e.g. IN_USE elsewhere)."""

    def _pe_disconnected(self, pe: "ProgressEngine") -> None: ...


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class ProgressEngine:
    """A DOCA progress engine (``doca_pe``); see the module docstring."""

    def __init__(self) -> None:
        """``doca_pe_create``."""
        self._ctxs: list[PeContext] = []
        # What progress runs, as tuples remade on each change: a pass needs no copy of its own.
        self._run_pumps: tuple[Pump, ...] = ()
        self._run_ctxs: tuple[PeContext, ...] = ()
        self._deferred: deque[Callable[[], None]] = deque()  # task callbacks for the next progress
        # A pump -> (our duplicate of its descriptor or -1, how many devices use it).
        self._pumps: dict[Pump, tuple[int, int]] = {}
        self._watched: dict[int, int] = {}  # a context's descriptor -> our duplicate
        self._epoll = select.epoll()
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._efd, select.EPOLLIN)
        self._armed = False
        self._in_progress = False
        # Duplicates are ours to close, also when the engine is dropped without close().
        self._owned: list[int] = [self._efd]
        self._finalizer = weakref.finalize(self, _close_fds, self._owned)

    # -- contexts -----------------------------------------------------------------------------

    def connect_ctx(self, ctx: PeContext) -> None:
        """Progress `ctx` from now on and run its tasks (``doca_pe_connect_ctx``).

        NOT_PERMITTED if it is connected to an engine, this one or another, or
        attached to a WorkQ ("DOCA_ERROR_NOT_PERMITTED - context is already
        connected to a progress engine"); BAD_STATE unless it is IDLE
        ("DOCA_ERROR_BAD_STATE - context is not idle").
        """
        self._check_open()
        if any(c is ctx for c in self._ctxs):
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED, f"{ctx!r} is already connected to this progress engine"
            )
        ctx._pe_connected(self)
        self._ctxs.append(ctx)
        self._run_ctxs = tuple(self._ctxs)

    def _connect(self, ctx: PeContext) -> None:
        """For WorkQs: progress `ctx`, whose jobs the WorkQ runs."""
        self._check_open()
        if any(c is ctx for c in self._ctxs):
            raise DocaError(DocaErrorCode.ALREADY_EXIST, f"{ctx!r} is already connected to this engine")
        self._ctxs.append(ctx)
        self._run_ctxs = tuple(self._ctxs)

    def disconnect_ctx(self, ctx: PeContext) -> None:
        """Stop progressing `ctx`; a no-op if it is not connected."""
        if any(c is ctx for c in self._ctxs):
            self._ctxs = [c for c in self._ctxs if c is not ctx]
            self._run_ctxs = tuple(self._ctxs)
            ctx._pe_disconnected(self)

    @property
    def ctxs(self) -> tuple[PeContext, ...]:
        return tuple(self._ctxs)

    @property
    def num_inflight_tasks(self) -> int:
        """Jobs and tasks in flight on the connected contexts (``doca_pe_get_num_inflight_tasks``).

        A completed task counts until its callback ran.
        """
        return sum(c.num_inflight for c in self._ctxs)

    def get_num_inflight_tasks(self) -> int:
        return self.num_inflight_tasks

    def defer(self, callback: Callable[[], None]) -> None:
        """For tasks: run `callback` in the next `progress` (and wake an armed waiter)."""
        self._deferred.append(callback)
        if self._armed:
            self.notify()

    # -- pumps and descriptors ----------------------------------------------------------------

    def add_pump(self, pump: Pump) -> None:
        """Run `pump` in every `progress` (a device opened under this engine); counted."""
        self._check_open()
        got = self._pumps.get(pump)
        if got is not None:
            self._pumps[pump] = (got[0], got[1] + 1)
            return
        fd = pump.fileno()
        dup = -1 if fd is None else self._register(fd)
        self._pumps[pump] = (dup, 1)
        self._run_pumps = tuple(self._pumps)

    def remove_pump(self, pump: Pump) -> None:
        """Undo one `add_pump`; the pump is no longer run once every device using it left."""
        got = self._pumps.get(pump)
        if got is None:
            return
        dup, count = got
        if count > 1:
            self._pumps[pump] = (dup, count - 1)
            return
        del self._pumps[pump]
        self._run_pumps = tuple(self._pumps)
        self._unregister(dup)

    @property
    def pumps(self) -> tuple[Pump, ...]:
        return tuple(self._pumps)

    def watch(self, fd: int) -> None:
        """Make the notification handle readable when `fd` is (a context's own descriptor)."""
        self._check_open()
        if fd in self._watched:
            raise DocaError(DocaErrorCode.ALREADY_EXIST, f"descriptor {fd} is already watched")
        self._watched[fd] = self._register(fd)

    def unwatch(self, fd: int) -> None:
        """Undo `watch`; a no-op for a descriptor that is not watched."""
        dup = self._watched.pop(fd, None)
        if dup is not None:
            self._unregister(dup)

    def _register(self, fd: int) -> int:
        # Our own duplicate: its number cannot be reused under us while registered.
        dup = os.dup(fd)
        self._owned.append(dup)
        self._epoll.register(dup, select.EPOLLIN)
        return dup

    def _unregister(self, dup: int) -> None:
        if dup < 0:
            return
        if not self._epoll.closed:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(dup)
        self._owned.remove(dup)
        os.close(dup)

    # -- progress ------------------------------------------------------------------------------

    def progress(self) -> bool:
        """Run every pump once, then advance every context; True if anything happened.

        ``doca_pe_progress``; it never blocks.
        """
        if self._in_progress:
            # doca_pe.h: "Inside this callback the user shouldn't call doca_pe_progress()".
            raise DocaError(DocaErrorCode.BAD_STATE, "progress was called from inside a progress callback")
        self._in_progress = True
        try:
            pumps, ctxs = self._run_pumps, self._run_ctxs
            if len(pumps) == 1 and len(ctxs) == 1:
                # One device and one context, the common case, without a loop: its iterator would
                # be the one object a turn makes.
                busy = pumps[0].progress()
                if ctxs[0]._progress():
                    busy = True
            else:
                busy = False
                for pump in pumps:
                    if pump.progress():
                        busy = True
                for ctx in ctxs:
                    if ctx._progress():
                        busy = True
            deferred = self._deferred
            if deferred:
                # The callbacks queued so far; those they cause wait for the next call.
                n = len(deferred)
                while n:  # no range object: an operation's callback allocates nothing here
                    deferred.popleft()()
                    n -= 1
                busy = True
            return busy
        finally:
            self._in_progress = False

    @property
    def in_progress(self) -> bool:
        """Whether `progress` is running: callbacks and state changes happen only then."""
        return self._in_progress

    # -- notification --------------------------------------------------------------------------

    def fileno(self) -> int:
        """The notification handle (``doca_pe_get_notification_handle``)."""
        self._check_open()
        return self._epoll.fileno()

    @property
    def notification_handle(self) -> int:
        return self.fileno()

    def request_notification(self) -> None:
        """Arm: the next `notify` makes the handle readable (``doca_pe_request_notification``).

        The pumps' and contexts' descriptors make it readable whenever they are,
        and task completions queued for the next `progress` (a stop's flush)
        make it readable at once.
        """
        self._check_open()
        self._armed = True
        if self._deferred:
            self.notify()

    def clear_notification(self) -> None:
        """Reset the handle after it fired (``doca_pe_clear_notification``)."""
        self._check_open()
        self._armed = False
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._efd)

    def notify(self) -> None:
        """For contexts: something completed outside any descriptor; wake an armed waiter."""
        if self._armed and not self.closed:
            self._armed = False
            os.eventfd_write(self._efd, 1)

    def wake(self) -> None:
        """From another thread: work may be waiting; make the handle readable, armed or not.

        A device shared by several engines is pumped by whichever progresses
        first; the others' waiters are woken so that they collect what it did
        (a spurious wake-up at worst, never a lost one).
        """
        if not self.closed:
            os.eventfd_write(self._efd, 1)

    # -- lifetime ------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._epoll.closed

    def _check_open(self) -> None:
        if self._epoll.closed:
            raise DocaError(DocaErrorCode.BAD_STATE, "the progress engine is destroyed")

    def close(self) -> None:
        """``doca_pe_destroy``: release the handle; idempotent.

        IN_USE while contexts are connected ("Progress engine can be destroyed
        only after all connected contexts has been destroyed"), naming them.
        `close_all` forgets them instead (teardown).
        """
        if self._epoll.closed:
            return
        if self._ctxs:
            names = ", ".join(repr(c) for c in self._ctxs[:4])
            more = f" and {len(self._ctxs) - 4} more" if len(self._ctxs) > 4 else ""
            raise DocaError(
                DocaErrorCode.IN_USE,
                f"{len(self._ctxs)} context(s) are still connected: {names}{more}; destroy them first",
            )
        self.close_all()

    def close_all(self) -> None:
        """Forget the connected contexts and the pumps, release the handle. Idempotent."""
        if self._epoll.closed:
            return
        for ctx in list(self._ctxs):
            self.disconnect_ctx(ctx)
        self._deferred.clear()
        self._pumps.clear()
        self._run_pumps = ()
        self._watched.clear()
        self._epoll.close()
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is not None:
            self.close_all()  # an exception on the way out: do not mask it with IN_USE
        else:
            self.close()

    def __repr__(self) -> str:
        state = "destroyed" if self.closed else f"ctxs={len(self._ctxs)} pumps={len(self._pumps)}"
        return f"<ProgressEngine {state}>"


class _PerThread(threading.local):
    engine: ProgressEngine | None = None  # each thread sees its own, None until first use


_per_thread = _PerThread()


def thread_engine() -> ProgressEngine:
    """The calling thread's implicit engine (created on first use, dropped with the thread)."""
    pe = _per_thread.engine
    if pe is None or pe.closed:
        pe = _per_thread.engine = ProgressEngine()
    return pe


#: DOCA's name of the progress engine (``struct doca_pe``).
PE = ProgressEngine
