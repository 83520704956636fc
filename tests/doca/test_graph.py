"""DOCA graph (doca_graph.h): nodes, dependencies, instances."""

from collections.abc import Callable, Iterator

import pytest

from rdmakit.doca import (
    CtxState,
    DocaError,
    DocaErrorCode,
    Event,
    Graph,
    GraphInstance,
    SyncEvent,
    SyncEventAddJob,
    SyncEventWaitGtJob,
    WorkQ,
)
from tests.doca.util import error_code


@pytest.fixture
def graph(workq: WorkQ) -> Iterator[Graph]:
    with Graph() as g:
        g.workq_add(workq)
        yield g


def _retrieve(workq: WorkQ) -> Event | None:
    for _ in range(10):
        done = workq.progress_retrieve()
        if done is not None:
            return done
    return None


def test_nodes_run_in_dependency_order(workq: WorkQ, graph: Graph) -> None:
    """doca_graph_add_dependency: a node runs after every node it depends on."""
    order: list[str] = []

    def node(name: str) -> Callable[[GraphInstance], None]:
        return lambda _: order.append(name)

    a, b, c, d = (graph.add_user_node(node(n)) for n in "abcd")
    graph.add_dependency(d, c)
    graph.add_dependency(c, b)
    graph.add_dependency(c, a)
    graph.add_dependency(b, a)
    graph.start()
    instance = graph.instantiate(user_data="run")
    instance.submit()
    done = _retrieve(workq)
    assert done is not None
    assert done.ok
    assert done.result is instance
    assert done.user_data == "run"
    assert order == ["d", "c", "b", "a"]


def test_instance_completes_when_all_nodes_do(workq: WorkQ, graph: Graph, event: SyncEvent) -> None:
    """doca_graph_instance_submit: the instance's event comes only after its last node."""
    wait = graph.add_job_node(event)
    bump = graph.add_job_node(event)
    after: list[int] = []
    tail = graph.add_user_node(lambda _: after.append(event.get()))
    graph.add_dependency(wait, bump)
    graph.add_dependency(bump, tail)
    graph.start()
    instance = graph.instantiate()
    instance.set_job(wait, SyncEventWaitGtJob(ctx=event, value=0))
    instance.set_job(bump, SyncEventAddJob(ctx=event, value=10))
    instance.submit()
    assert _retrieve(workq) is None
    assert instance.in_flight
    event.update_set(1)
    done = _retrieve(workq)
    assert done is not None
    assert done.ok
    assert after == [11]
    assert not instance.in_flight


def test_instance_can_run_again(workq: WorkQ, graph: Graph, event: SyncEvent) -> None:
    """doca_graph_instance_submit: a completed instance is submitted again; in flight it is IN_USE."""
    bump = graph.add_job_node(event)
    graph.start()
    instance = graph.instantiate()
    instance.set_job(bump, SyncEventAddJob(ctx=event, value=1))
    for expected in (1, 2):
        instance.submit()
        assert _retrieve(workq) is not None
        assert event.get() == expected
    wait = SyncEventWaitGtJob(ctx=event, value=5)
    other = Graph()
    other.workq_add(workq)
    node = other.add_job_node(event)
    other.start()
    pending = other.instantiate()
    pending.set_job(node, wait)
    pending.submit()
    assert error_code(pending.submit) is DocaErrorCode.IN_USE
    assert error_code(lambda: pending.set_job(node, wait)) is DocaErrorCode.IN_USE
    other.close()


def test_cycles_are_not_permitted(graph: Graph) -> None:
    """doca_graph_add_dependency: a dependency forming a cycle is NOT_PERMITTED."""
    a, b, c = (graph.add_user_node(lambda _: None) for _ in range(3))
    graph.add_dependency(a, b)
    graph.add_dependency(b, c)
    assert error_code(lambda: graph.add_dependency(c, a)) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: graph.add_dependency(a, a)) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: graph.add_dependency(a, b)) is DocaErrorCode.ALREADY_EXIST
    assert c.successors == ()


def test_foreign_nodes_are_invalid(graph: Graph) -> None:
    """A node of another graph cannot be wired into this one."""
    other = Graph()
    foreign = other.add_user_node(lambda _: None)
    mine = graph.add_user_node(lambda _: None)
    assert error_code(lambda: graph.add_dependency(mine, foreign)) is DocaErrorCode.INVALID_VALUE


def test_no_changes_after_start(graph: Graph) -> None:
    """doca_graph_add_dependency: a started graph is BAD_STATE to modify."""
    a = graph.add_user_node(lambda _: None)
    graph.start()
    assert error_code(lambda: graph.add_user_node(lambda _: None)) is DocaErrorCode.BAD_STATE
    assert error_code(lambda: graph.add_dependency(a, a)) is DocaErrorCode.BAD_STATE


def test_start_checks(workq: WorkQ, event: SyncEvent) -> None:
    """doca_graph_start: an empty graph, a node context not RUNNING or elsewhere, no WorkQ: refused."""
    empty = Graph()
    empty.workq_add(workq)
    assert error_code(empty.start) is DocaErrorCode.BAD_STATE

    unattached = Graph()
    unattached.add_user_node(lambda _: None)
    assert error_code(unattached.start) is DocaErrorCode.NOT_CONNECTED

    idle = SyncEvent()
    idle.workq_add(workq)
    waiting_on_idle = Graph()
    waiting_on_idle.workq_add(workq)
    waiting_on_idle.add_job_node(idle)
    assert error_code(waiting_on_idle.start) is DocaErrorCode.BAD_STATE
    assert waiting_on_idle.state is CtxState.IDLE

    with WorkQ(1) as elsewhere:
        split = Graph()
        split.workq_add(elsewhere)
        split.add_job_node(event)
        assert error_code(split.start) is DocaErrorCode.INVALID_VALUE
        split.close()


def test_job_nodes_need_a_matching_job(workq: WorkQ, graph: Graph, event: SyncEvent) -> None:
    """doca_graph_instance_set_ctx_node_data: the job must be for the node's context, and set."""
    node = graph.add_job_node(event)
    user = graph.add_user_node(lambda _: None)
    graph.start()
    instance = graph.instantiate()
    with SyncEvent() as stranger:
        assert error_code(lambda: instance.set_job(node, SyncEventAddJob(ctx=stranger, value=1))) is (
            DocaErrorCode.INVALID_VALUE
        )
    assert error_code(lambda: instance.set_job(user, SyncEventAddJob(ctx=event, value=1))) is (
        DocaErrorCode.INVALID_VALUE
    )
    assert error_code(instance.submit) is DocaErrorCode.INVALID_VALUE  # no job set
    assert workq.inflight == 0


def test_failed_node_fails_the_instance_and_skips_the_rest(workq: WorkQ, graph: Graph) -> None:
    """A node's error fails the instance (IO_FAILED, that error); nodes after it don't run."""
    ran: list[str] = []

    def boom(_: GraphInstance) -> None:
        ran.append("boom")
        raise DocaError(DocaErrorCode.NOT_PERMITTED, "denied")

    first = graph.add_user_node(boom)
    second = graph.add_user_node(lambda _: ran.append("second"))
    independent = graph.add_user_node(lambda _: ran.append("independent"))
    graph.add_dependency(first, second)
    graph.add_dependency(independent, second)
    graph.start()
    graph.instantiate().submit()
    done = _retrieve(workq)
    assert done is not None
    assert done.status is DocaErrorCode.IO_FAILED
    assert done.error is not None
    assert done.error.code is DocaErrorCode.NOT_PERMITTED
    assert "second" not in ran


def test_user_node_exception_is_unexpected_with_cause(workq: WorkQ, graph: Graph) -> None:
    """A user node raising a non-DOCA exception fails with UNEXPECTED, the exception as the cause."""

    def broken(_: GraphInstance) -> None:
        raise IndexError("bug in the callback")

    graph.add_user_node(broken)
    graph.start()
    graph.instantiate().submit()
    done = _retrieve(workq)
    assert done is not None
    assert done.error is not None
    assert done.error.code is DocaErrorCode.UNEXPECTED
    assert isinstance(done.error.__cause__, IndexError)


def test_failed_job_node(workq: WorkQ, graph: Graph, event: SyncEvent) -> None:
    """A job node whose job fails (here: flushed as its context is destroyed) fails the instance."""
    wait = graph.add_job_node(event)
    graph.start()
    instance = graph.instantiate()
    instance.set_job(wait, SyncEventWaitGtJob(ctx=event, value=9))
    instance.submit()
    assert _retrieve(workq) is None
    event.close()
    done = _retrieve(workq)
    assert done is not None
    assert not done.ok
    assert done.error is not None
    assert done.error.code is DocaErrorCode.SHUTDOWN


def test_closing_the_graph_flushes_in_flight_instances(workq: WorkQ, graph: Graph, event: SyncEvent) -> None:
    """Style rule 7: closing a graph fails its in-flight instances (SHUTDOWN); their nodes stop there."""
    ran: list[str] = []
    wait = graph.add_job_node(event)
    after = graph.add_user_node(lambda _: ran.append("after"))
    graph.add_dependency(wait, after)
    graph.start()
    instance = graph.instantiate()
    instance.set_job(wait, SyncEventWaitGtJob(ctx=event, value=0))
    instance.submit()
    assert _retrieve(workq) is None
    graph.close()
    done = _retrieve(workq)
    assert done is not None
    assert done.error is not None
    assert done.error.code is DocaErrorCode.SHUTDOWN
    event.update_set(1)  # the wait node finishes after its instance was flushed
    assert _retrieve(workq) is None
    assert ran == []
    assert not instance.in_flight
