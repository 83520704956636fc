"""The DMA Copy conversation pumped over a comm channel: the protocol's messages in and out.

:class:`Link` sends and receives the messages of ``rdmakit.cli.dma_protocol``
on a `ComchEndpoint` (a ``doca_comch`` context), which decides nothing: the protocol's `Conversation`
says whether a message may be sent or received now. The link adds what takes
a clock: heartbeats (progress messages, so that the peer's timeout restarts),
the timeout itself, and, over RDMA, the host's device answering the DPU's
requests while the host waits for the DPU's next message.
"""

import hashlib
import logging
import sys
import time
from contextlib import suppress
from typing import TextIO, TypeVar

from rdmakit.cli.dma_comch import ComchEndpoint
from rdmakit.cli.dma_files import close_fds
from rdmakit.cli.dma_protocol import Conversation, LocalProtocolError, Message, Progress, Role, Status
from rdmakit.cli.errors import CliError
from rdmakit.doca import DocaError, DocaErrorCode, WorkQ
from rdmakit.transport.driver import wait_readable

log = logging.getLogger("rdmakit.dma")

HEARTBEAT = 0.25  # seconds between progress messages on the channel
_HASH_BLOCK = 16 << 20
_PROGRESS_MIN = 8 << 20  # files this large get a progress bar on a TTY
_POLL_CHANNEL = 0.05  # over RDMA the host waits on its device, looking at the channel this often

M = TypeVar("M", bound=Message)


class ProgressBar:
    """A one-line progress bar on a TTY, for large transfers; silent otherwise."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._label = label
        self._total = total
        self._enabled = total >= _PROGRESS_MIN and self._stream.isatty()
        self._shown = False
        self._last = 0.0

    def update(self, done: int, *, force: bool = False) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        frac = done / self._total if self._total else 1.0
        width = 30
        bar = "#" * int(frac * width)
        self._stream.write(
            f"\r{self._label} [{bar:<{width}}] {frac:4.0%} {done / 2**20:.1f}/{self._total / 2**20:.1f} MiB"
        )
        self._stream.flush()
        self._shown = True

    def done(self) -> None:
        if self._enabled:
            self.update(self._total, force=True)
            self._stream.write("\n")
            self._stream.flush()
            self._enabled = False

    def abandon(self) -> None:
        if self._shown and self._enabled:
            self._stream.write("\n")
            self._stream.flush()
        self._enabled = False


class Link:
    """This side's end of the DMA Copy conversation over a `ComchEndpoint`."""

    def __init__(self, chan: ComchEndpoint, role: Role, transport: str, timeout: float) -> None:
        self.chan = chan
        self.conversation = Conversation(role, transport)
        self.peer = role.peer.value
        self.timeout = timeout
        self._last_beat = 0.0
        # Over RDMA the host's device must answer the DPU's requests while the host waits here.
        self.rdma_wq: WorkQ | None = None

    def send(self, msg: Message, *, fds: tuple[int, ...] = ()) -> None:
        self.chan.send(self.conversation.send(msg), fds=fds, timeout=self.timeout)

    def settle(self, exc: CliError | DocaError) -> None:
        """This side failed with `exc`: tell the peer, or say plainly that the peer went away."""
        if isinstance(exc, DocaError) and exc.code in (
            DocaErrorCode.CONNECTION_RESET,
            DocaErrorCode.NOT_CONNECTED,
        ):
            raise CliError(f"the {self.peer} went away before the copy was complete ({exc.name})") from exc
        self.fail(str(exc))

    def fail(self, error: str) -> None:
        """Tell the peer this side failed; best effort (it may be gone)."""
        if self.conversation.ended:
            return
        with suppress(DocaError):
            self.send(Status(ok=False, error=error))

    def beat(self, phase: str, done: int, total: int) -> None:
        """A progress message, at most every `HEARTBEAT` seconds: the peer's timeout restarts."""
        now = time.monotonic()
        if now - self._last_beat >= HEARTBEAT or done == total:
            self._last_beat = now
            log.debug("%s: %d of %d bytes", phase, done, total)
            self.send(Progress(phase=phase, done=done, total=total))

    def digest(self, view: memoryview | None, phase: str) -> str:
        """The sha256 of `view` (None: empty), with a progress bar and heartbeats to the peer."""
        total = len(view) if view is not None else 0
        bar = ProgressBar("hashing" if phase == "hash" else "verifying", total)
        digest = hashlib.sha256()
        for offset in range(0, total, _HASH_BLOCK):
            assert view is not None
            block = view[offset : offset + _HASH_BLOCK]
            done = offset + len(block)
            digest.update(block)
            block.release()
            bar.update(done)
            self.beat(phase, done, total)
        bar.done()
        return digest.hexdigest()

    def check_peer(self) -> None:
        """Between chunks: CONNECTION_RESET if the peer went away, its failure if it reported one."""
        data = self.chan.try_recv()
        if data is not None:
            self.conversation.receive_data(data)

    def recv(self, kind: type[M], bar: ProgressBar | None = None) -> tuple[M, list[int]]:
        """The next message, a `kind`; progress restarts the timeout (copy progress drives `bar`)."""
        while True:
            data, fds = self._next() if self.rdma_wq is not None else self.chan.recv_fds(self.timeout)
            try:
                msg = self.conversation.receive_data(data, len(fds))
            except BaseException:
                close_fds(fds)
                raise
            if isinstance(msg, kind):
                return msg, fds
            close_fds(fds)
            if not isinstance(msg, Progress):
                raise LocalProtocolError(f"waiting for {kind.kind!r}, the protocol took {msg.kind!r}")
            log.debug("the %s: %s %d of %d bytes", self.peer, msg.phase, msg.done, msg.total)
            if bar is not None and msg.phase == "copy":
                bar.update(msg.done)

    def _next(self) -> tuple[bytes, list[int]]:
        """`ComchEndpoint.recv_fds`, pumping the RDMA device meanwhile (an event-driven WorkQ)."""
        wq = self.rdma_wq
        assert wq is not None
        deadline = time.monotonic() + self.timeout
        while (data := self.chan.try_recv()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DocaError(
                    DocaErrorCode.TIME_OUT,
                    f"comm channel {self.chan.service!r}: nothing from the {self.peer} "
                    f"after {self.timeout:g} s",
                )
            while wq.progress_retrieve() is not None:
                pass
            wq.arm()
            if wait_readable(wq.fileno(), min(left, _POLL_CHANNEL)):
                wq.clear()
        return data, []
