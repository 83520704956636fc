"""One side of an RDMA program on the DOCA 2.5+ task API (``doca_pe``, ``doca_rdma_task_*``).

As the DOCA 2.9 RDMA samples (``rdma_common.c``) do: the context is connected
to a progress engine (``doca_pe_connect_ctx``), every task type it uses is
configured with its success and error callbacks before start
(``doca_rdma_task_<x>_set_conf``), tasks are allocated, submitted and
completed in ``doca_pe_progress``; waiting is on the engine's notification
handle with a deadline. The device, inventory and memory maps are `Session`'s.
"""

import time
from collections.abc import Iterable
from typing import TypeVar

from rdmakit.cli.errors import CliError
from rdmakit.cli.session import WATCH_PERIOD, Session, job_failed
from rdmakit.doca import DocaErrorCode, Task
from rdmakit.transport.driver import wait_readable

T = TypeVar("T", bound=Task)


class TaskSession(Session):
    """A `Session` whose `Rdma` context runs tasks on its device's progress engine."""

    def __init__(self, device: str, *, permissions: int, gid_index: int = 0, num_tasks: int = 16) -> None:
        super().__init__(device, permissions=permissions, gid_index=gid_index)
        self.rdma.workq_rm(self.wq)  # the task API has no work queue
        self.wq.close()
        self.pe = self.dev.pe
        self.pe.connect_ctx(self.rdma)
        self.done: list[Task] = []
        r = self.rdma
        # Every RDMA task type the samples use (``doca_rdma_task_<x>_set_conf``).
        for set_conf in (
            r.task_receive_set_conf, r.task_send_set_conf, r.task_send_imm_set_conf,
            r.task_read_set_conf, r.task_write_set_conf, r.task_write_imm_set_conf,
            r.task_atomic_cmp_swp_set_conf, r.task_atomic_fetch_add_set_conf,
        ):  # fmt: skip
            set_conf(self._completed, self._failed, num_tasks)

    def __enter__(self) -> "TaskSession":
        return self

    # The callbacks of every task type (rdma_*_sample.c: *_completed_callback, *_error_callback).
    def _completed(self, task: Task, task_user_data: object, ctx_user_data: object) -> None:
        self.done.append(task)

    def _failed(self, task: Task, task_user_data: object, ctx_user_data: object) -> None:
        self.done.append(task)

    def pump(self) -> None:
        self.pe.progress()

    def wait_tasks(self, tasks: Iterable[Task], timeout: float, what: str) -> None:
        """Progress until every task's callback ran, or CliError after ``timeout`` seconds."""
        want = list(tasks)
        deadline = time.monotonic() + timeout

        def finished() -> bool:
            return all(any(t is d for d in self.done) for t in want)

        while not finished():
            if self.pe.progress():
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise CliError(f"timed out after {timeout:g} s waiting for {what}", status=3)
            if self.watch is not None:
                try:
                    self.watch()
                except CliError:
                    while self.pe.progress():
                        pass
                    if not finished():
                        raise
                    break
            self.pe.request_notification()
            if wait_readable(self.pe.fileno(), min(left, WATCH_PERIOD)):
                self.pe.clear_notification()
        self.done = [d for d in self.done if not any(t is d for t in want)]

    def run_task(self, task: T, timeout: float, what: str) -> T:
        """Submit ``task`` and wait for its callback; a failed task is a CliError naming ``what``."""
        task.submit()
        self.wait_tasks([task], timeout, what)
        if task.get_status() is not DocaErrorCode.SUCCESS:
            error = task.error
            task.free()
            raise job_failed(what, error)
        return task
