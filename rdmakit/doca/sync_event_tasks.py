"""DOCA Sync Event jobs and tasks (``doca_sync_event.h``).

The jobs are the work-queue requests of `SyncEvent`; the tasks are those of
DOCA 2.5+, configured per type with ``SyncEvent.task_<x>_set_conf(success_cb,
error_cb, num_tasks)`` (IDLE only) and allocated with
``SyncEvent.task_<x>_alloc_init(...)``:

============================  =====================================  ======================
task (``doca_sync_event_*``)  ``task_<x>_alloc_init`` arguments      runs as
============================  =====================================  ======================
`SyncEventTaskGet`            user_data                              `SyncEventGetJob`
`SyncEventTaskNotifySet`      set_val, user_data                     `SyncEventSetJob`
`SyncEventTaskNotifyAdd`      inc_val, user_data                     `SyncEventAddJob`
`SyncEventTaskWaitGt`         wait_val, mask, user_data              `SyncEventWaitGtJob`
============================  =====================================  ======================

DOCA's get and notify-add tasks write their result through a ``uint64_t *``
(``ret_val_ptr``, ``fetched_val_ptr``); a Python task keeps it instead:
`SyncEventTaskGet.get_ret_val` and `SyncEventTaskNotifyAdd.get_fetched_val`,
valid once the task completed successfully. DOCA leaves a wait-gt value
outside [0, 254], or a mask that is not whole bytes of ones, undefined; here
any 64-bit value and mask work as for `SyncEvent.wait_gt`.
"""

from dataclasses import dataclass

from rdmakit.doca.ctx import Ctx, Job
from rdmakit.doca.errors import DocaError, DocaErrorCode
from rdmakit.doca.tasks import Task, TaskCallback, set_task_conf

__all__ = [  # SyncEventTaskApi: a base of SyncEvent
    "U64_MAX",
    "SyncEventAddJob",
    "SyncEventGetJob",
    "SyncEventSetJob",
    "SyncEventTaskGet",
    "SyncEventTaskNotifyAdd",
    "SyncEventTaskNotifySet",
    "SyncEventTaskWaitGt",
    "SyncEventWaitEqJob",
    "SyncEventWaitGtJob",
]

U64_MAX = (1 << 64) - 1


def check_u64(name: str, value: int) -> None:
    if type(value) is not int or not 0 <= value <= U64_MAX:
        raise DocaError(DocaErrorCode.INVALID_VALUE, f"{name} {value!r} is not a 64-bit unsigned value")


# -- jobs ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncEventGetJob(Job):
    """Read the value; the event's ``result`` is it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncEventSetJob(Job):
    """Set the value to `value`."""

    value: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncEventAddJob(Job):
    """Add `value` (mod 2**64); the event's ``result`` is the value before."""

    value: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncEventWaitGtJob(Job):
    """Complete once ``current & mask > value``; ``result`` is the value seen."""

    value: int
    mask: int = U64_MAX


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncEventWaitEqJob(Job):
    """Complete once ``current & mask == value``; ``result`` is the value seen."""

    value: int
    mask: int = U64_MAX


# -- tasks -----------------------------------------------------------------------------------------


class _SyncEventTask(Task):
    __slots__ = ()

    def _value(self) -> int | None:
        return self._result if isinstance(self._result, int) else None


class SyncEventTaskGet(_SyncEventTask):
    """``doca_sync_event_task_get``: read the event's value."""

    __slots__ = ()
    doca_name = "doca_sync_event_task_get"

    def _make_job(self) -> Job:
        return SyncEventGetJob(ctx=self._ctx)

    def get_ret_val(self) -> int | None:
        """The value read (DOCA writes it to ``ret_val_ptr``); None until completed."""
        return self._value()


class SyncEventTaskNotifySet(_SyncEventTask):
    """``doca_sync_event_task_notify_set``: set the event's value."""

    __slots__ = ("_set_val",)
    doca_name = "doca_sync_event_task_notify_set"

    def __init__(self, ctx: Ctx[Job], set_val: int, user_data: object = None) -> None:
        check_u64("set_val", set_val)
        super().__init__(ctx, user_data)
        self._set_val = set_val

    def _make_job(self) -> Job:
        return SyncEventSetJob(ctx=self._ctx, value=self._set_val)

    def get_set_val(self) -> int:
        """``doca_sync_event_task_notify_set_get_set_val``."""
        return self._set_val

    def set_set_val(self, set_val: int) -> None:
        """``doca_sync_event_task_notify_set_set_set_val``."""
        check_u64("set_val", set_val)
        self._set_val = set_val
        self._changed()


class SyncEventTaskNotifyAdd(_SyncEventTask):
    """``doca_sync_event_task_notify_add``: add to the event's value, atomically."""

    __slots__ = ("_inc_val",)
    doca_name = "doca_sync_event_task_notify_add"

    def __init__(self, ctx: Ctx[Job], inc_val: int, user_data: object = None) -> None:
        check_u64("inc_val", inc_val)
        super().__init__(ctx, user_data)
        self._inc_val = inc_val

    def _make_job(self) -> Job:
        return SyncEventAddJob(ctx=self._ctx, value=self._inc_val)

    def get_inc_val(self) -> int:
        """``doca_sync_event_task_notify_add_get_inc_val``."""
        return self._inc_val

    def set_inc_val(self, inc_val: int) -> None:
        """``doca_sync_event_task_notify_add_set_inc_val``."""
        check_u64("inc_val", inc_val)
        self._inc_val = inc_val
        self._changed()

    def get_fetched_val(self) -> int | None:
        """The value before the add (DOCA writes it to ``fetched_val_ptr``); None until completed."""
        return self._value()


class SyncEventTaskWaitGt(_SyncEventTask):
    """``doca_sync_event_task_wait_gt``: complete once ``value & mask > wait_val``."""

    __slots__ = ("_mask", "_wait_val")
    doca_name = "doca_sync_event_task_wait_gt"

    def __init__(self, ctx: Ctx[Job], wait_val: int, mask: int, user_data: object = None) -> None:
        check_u64("wait_val", wait_val)
        check_u64("mask", mask)
        super().__init__(ctx, user_data)
        self._wait_val, self._mask = wait_val, mask

    def _make_job(self) -> Job:
        return SyncEventWaitGtJob(ctx=self._ctx, value=self._wait_val, mask=self._mask)

    def get_wait_val(self) -> int:
        """``doca_sync_event_task_wait_gt_get_wait_val``."""
        return self._wait_val

    def set_wait_val(self, wait_val: int) -> None:
        """``doca_sync_event_task_wait_gt_set_wait_val``."""
        check_u64("wait_val", wait_val)
        self._wait_val = wait_val
        self._changed()

    def get_mask(self) -> int:
        """``doca_sync_event_task_wait_gt_get_mask``."""
        return self._mask

    def set_mask(self, mask: int) -> None:
        """``doca_sync_event_task_wait_gt_set_mask``."""
        check_u64("mask", mask)
        self._mask = mask
        self._changed()

    def get_ret_val(self) -> int | None:
        """The value that satisfied the wait; None until completed."""
        return self._value()


class SyncEventTaskApi(Ctx[Job]):
    """The task half of `SyncEvent`."""

    def task_get_set_conf(
        self,
        success_cb: TaskCallback[SyncEventTaskGet],
        error_cb: TaskCallback[SyncEventTaskGet],
        num_tasks: int,
    ) -> None:
        """``doca_sync_event_task_get_set_conf``: callbacks and pool size, IDLE only."""
        set_task_conf(self, SyncEventTaskGet, success_cb, error_cb, num_tasks)

    def task_get_alloc_init(self, user_data: object = None) -> SyncEventTaskGet:
        """``doca_sync_event_task_get_alloc_init``; NO_MEMORY when the pool is exhausted."""
        return SyncEventTaskGet(self, user_data)

    def task_notify_set_set_conf(
        self,
        success_cb: TaskCallback[SyncEventTaskNotifySet],
        error_cb: TaskCallback[SyncEventTaskNotifySet],
        num_tasks: int,
    ) -> None:
        """``doca_sync_event_task_notify_set_set_conf``."""
        set_task_conf(self, SyncEventTaskNotifySet, success_cb, error_cb, num_tasks)

    def task_notify_set_alloc_init(self, set_val: int, user_data: object = None) -> SyncEventTaskNotifySet:
        """``doca_sync_event_task_notify_set_alloc_init``."""
        return SyncEventTaskNotifySet(self, set_val, user_data)

    def task_notify_add_set_conf(
        self,
        success_cb: TaskCallback[SyncEventTaskNotifyAdd],
        error_cb: TaskCallback[SyncEventTaskNotifyAdd],
        num_tasks: int,
    ) -> None:
        """``doca_sync_event_task_notify_add_set_conf``."""
        set_task_conf(self, SyncEventTaskNotifyAdd, success_cb, error_cb, num_tasks)

    def task_notify_add_alloc_init(self, inc_val: int, user_data: object = None) -> SyncEventTaskNotifyAdd:
        """``doca_sync_event_task_notify_add_alloc_init``."""
        return SyncEventTaskNotifyAdd(self, inc_val, user_data)

    def task_wait_gt_set_conf(
        self,
        success_cb: TaskCallback[SyncEventTaskWaitGt],
        error_cb: TaskCallback[SyncEventTaskWaitGt],
        num_tasks: int,
    ) -> None:
        """``doca_sync_event_task_wait_gt_set_conf``."""
        set_task_conf(self, SyncEventTaskWaitGt, success_cb, error_cb, num_tasks)

    def task_wait_gt_alloc_init(
        self, wait_val: int, mask: int = U64_MAX, user_data: object = None
    ) -> SyncEventTaskWaitGt:
        """``doca_sync_event_task_wait_gt_alloc_init``."""
        return SyncEventTaskWaitGt(self, wait_val, mask, user_data)
