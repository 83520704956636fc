"""DOCA Graph (``doca_graph.h``): jobs and callbacks run in dependency order.

Build a `Graph` in IDLE from nodes (`Graph.add_job_node` for a context's job,
`Graph.add_user_node` for a Python callback) and dependencies
(`Graph.add_dependency`; one that would close a cycle is NOT_PERMITTED),
attach it to a WorkQ and start it. Every job node's context must be RUNNING on
the same WorkQ. Then `Graph.instantiate` gives a `GraphInstance`; set the job
of each job node (`GraphInstance.set_job`) and `GraphInstance.submit` it.

An instance runs a node once all the nodes it depends on are done. It is one
job of the graph's WorkQ: its `Event` (result: the instance) arrives when
every node is done. If a node fails, no further node starts; the instance
waits for the nodes already running, then completes with status IO_FAILED
and the first node's error. An instance can be submitted again once its event
was delivered. Sub-graph nodes are not supported.
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rdmakit.doca.ctx import Ctx, CtxState, Event, Job
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault

__all__ = ["Graph", "GraphInstance", "GraphJob", "GraphNode", "UserCallback"]

UserCallback = Callable[["GraphInstance"], None]


class GraphNode:
    """A node of one graph: a context's job slot or a user callback."""

    __slots__ = ("_callback", "_ctx", "_graph", "_index", "_num_deps", "_successors")

    def __init__(
        self, graph: "Graph", index: int, ctx: Ctx[Any] | None, callback: UserCallback | None
    ) -> None:
        self._graph = graph
        self._index = index
        self._ctx = ctx
        self._callback = callback
        self._successors: list[GraphNode] = []
        self._num_deps = 0

    @property
    def graph(self) -> "Graph":
        return self._graph

    @property
    def index(self) -> int:
        return self._index

    @property
    def ctx(self) -> Ctx[Any] | None:
        """The context whose job this node runs; None for a user node."""
        return self._ctx

    @property
    def successors(self) -> tuple["GraphNode", ...]:
        return tuple(self._successors)

    def __repr__(self) -> str:
        kind = f"job on {self._ctx!r}" if self._ctx is not None else "user"
        return f"<GraphNode {self._index} {kind}>"


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphJob(Job):
    """The WorkQ job standing for one run of `instance`."""

    instance: "GraphInstance"


class Graph(Ctx[GraphJob]):
    """A DOCA graph (``doca_graph``); it is a context of its WorkQ."""

    def __init__(self) -> None:
        super().__init__()
        self._nodes: list[GraphNode] = []

    @property
    def nodes(self) -> tuple[GraphNode, ...]:
        return tuple(self._nodes)

    def add_job_node(self, ctx: Ctx[Any]) -> GraphNode:
        """A node running a job of `ctx`, set per instance (``doca_graph_node_create_from_ctx``)."""
        self._require_idle("add_job_node")
        if ctx is self:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "a graph cannot be a node of itself")
        node = GraphNode(self, len(self._nodes), ctx, None)
        self._nodes.append(node)
        return node

    def add_user_node(self, callback: UserCallback) -> GraphNode:
        """A node calling ``callback(instance)`` (``doca_graph_node_create_from_user``).

        A `DocaError` it raises fails the node with that error; any other
        exception fails it with UNEXPECTED (the exception is the ``__cause__``).
        """
        self._require_idle("add_user_node")
        node = GraphNode(self, len(self._nodes), None, callback)
        self._nodes.append(node)
        return node

    def _check_node(self, node: GraphNode) -> None:
        if node._graph is not self:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{node!r} belongs to another graph")

    def add_dependency(self, from_node: GraphNode, to_node: GraphNode) -> None:
        """`to_node` runs after `from_node` is done (``doca_graph_add_dependency``)."""
        self._require_idle("add_dependency")
        self._check_node(from_node)
        self._check_node(to_node)
        if to_node in from_node._successors:
            raise DocaError(DocaErrorCode.ALREADY_EXIST, "the dependency already exists")
        if self._reaches(to_node, from_node):
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                f"node {from_node.index} -> node {to_node.index} would form a cycle",
            )
        from_node._successors.append(to_node)
        to_node._num_deps += 1

    @staticmethod
    def _reaches(start: GraphNode, goal: GraphNode) -> bool:
        seen = {id(start)}
        todo = [start]
        while todo:
            node = todo.pop()
            if node is goal:
                return True
            for succ in node._successors:
                if id(succ) not in seen:
                    seen.add(id(succ))
                    todo.append(succ)
        return False

    def _start(self) -> bool:
        if not self._nodes:
            raise DocaError(DocaErrorCode.BAD_STATE, "graph has no nodes")
        if self._workq is None:
            raise DocaError(DocaErrorCode.NOT_CONNECTED, "graph is not attached to a WorkQ")
        for node in self._nodes:
            ctx = node._ctx
            if ctx is None:
                continue
            if ctx.state is not CtxState.RUNNING:
                raise DocaError(DocaErrorCode.BAD_STATE, f"node {node.index}: {ctx!r} is not RUNNING")
            if ctx.workq is not self._workq:
                raise DocaError(
                    DocaErrorCode.INVALID_VALUE,
                    f"node {node.index}: {ctx!r} is not attached to the graph's WorkQ",
                )
        return True

    def instantiate(self, *, user_data: object = None) -> "GraphInstance":
        """A new instance of the started graph (``doca_graph_instance_create``)."""
        self._check_not_closed()
        if self._state is not CtxState.RUNNING:
            raise DocaError(DocaErrorCode.BAD_STATE, f"graph is {self._state.name}, not RUNNING")
        return GraphInstance(self, user_data)

    def _submit(self, job: GraphJob) -> None:
        job.instance._run()

    def _cancel(self) -> None:
        for job, _ in self._pending.values():
            job.instance._running = False


class GraphInstance:
    """One executable copy of a graph, with a job per job node (``doca_graph_instance``)."""

    def __init__(self, graph: Graph, user_data: object) -> None:
        self._graph = graph
        self._job = GraphJob(ctx=graph, instance=self, user_data=user_data)
        self._jobs: dict[GraphNode, Job] = {}
        self._running = False
        # per run:
        self._deps: dict[GraphNode, int] = {}
        self._ready: deque[GraphNode] = deque()
        self._by_job: dict[int, GraphNode] = {}
        self._error: DocaError | None = None
        self._pumping = False

    @property
    def graph(self) -> Graph:
        return self._graph

    @property
    def in_flight(self) -> bool:
        return self._running

    def set_job(self, node: GraphNode, job: Job) -> None:
        """The job `node` runs in this instance (``doca_graph_instance_set_ctx_node_data``)."""
        if self._running:
            raise DocaError(DocaErrorCode.IN_USE, "instance is in flight")
        self._graph._check_node(node)
        if node._ctx is None:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{node!r} is a user node")
        if job.ctx is not node._ctx:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"job is for {job.ctx!r}, node runs {node._ctx!r}")
        self._jobs[node] = job

    def submit(self) -> None:
        """Run the instance on the graph's WorkQ (``doca_graph_instance_submit``)."""
        workq = self._graph.workq
        if workq is None:
            raise DocaError(DocaErrorCode.NOT_CONNECTED, "graph is not attached to a WorkQ")
        workq.submit(self._job)

    def _run(self) -> None:
        nodes = self._graph._nodes
        for node in nodes:
            if node._ctx is not None and node not in self._jobs:
                raise DocaError(DocaErrorCode.INVALID_VALUE, f"node {node.index} has no job set")
        self._deps = {node: node._num_deps for node in nodes}
        self._ready = deque(node for node in nodes if not node._num_deps)
        self._by_job.clear()
        self._error = None
        self._running = True
        self._pump()

    def _node_done(self, node: GraphNode) -> None:
        for succ in node._successors:
            self._deps[succ] -= 1
            if not self._deps[succ]:
                self._ready.append(succ)

    def _fail(self, error: DocaError) -> None:
        if self._error is None:
            self._error = error

    def _launch(self, node: GraphNode) -> None:
        if node._callback is not None:
            try:
                node._callback(self)
            except DocaError as exc:
                self._fail(exc)
            except Exception as exc:
                err = DocaError(
                    DocaErrorCode.UNEXPECTED, f"user node {node.index} raised {exc!r}", Fault.CALLER
                )
                err.__cause__ = exc
                self._fail(err)
            self._node_done(node)
            return
        assert node._ctx is not None
        job = self._jobs[node]
        self._by_job[id(job)] = node
        try:
            node._ctx._dispatch(job, self)
        except DocaError as exc:
            del self._by_job[id(job)]
            self._fail(exc)
            self._node_done(node)

    def _pump(self) -> None:
        if self._pumping:
            return  # a node completed while being launched; the running loop continues
        self._pumping = True
        try:
            while self._ready:
                node = self._ready.popleft()
                if self._running and self._error is None:
                    self._launch(node)
                else:
                    self._node_done(node)  # skipped: a node failed or the run was flushed
        finally:
            self._pumping = False
        if self._running and not self._by_job and not self._ready:
            self._running = False
            if self._graph._in_flight(self._job):
                self._graph._complete(self._job, result=self, error=self._error)

    def _deliver(self, event: Event) -> None:
        node = self._by_job.pop(id(event.job), None)
        if node is None:
            return  # a run that was flushed
        if not event.ok:
            self._fail(
                event.error or DocaError(DocaErrorCode.IO_FAILED, f"node {node.index} failed", Fault.SYSTEM)
            )
        self._node_done(node)
        self._pump()

    def __repr__(self) -> str:
        return f"<GraphInstance of {len(self._graph._nodes)} nodes running={self._running}>"
