"""The engine's one exception: a local misuse of its API."""

from typing import Literal

#: DOCA ``doca_error_t`` names (without the ``DOCA_ERROR_`` prefix) for the
#: ways a caller can misuse a queue pair.
ErrorCode = Literal["BAD_STATE", "FULL", "IN_USE", "INVALID_VALUE"]


class EngineError(Exception):
    """The caller broke the engine's contract (never the peer's fault).

        ``code`` names the failure: ``BAD_STATE`` (the QP's state forbids the
        call), ``FULL`` (a work queue is full), ``IN_USE`` (an object still has
    users: an SRQ with QPs), ``INVALID_VALUE`` (a bad argument).
        A peer's protocol violations never raise: they become NAKs, drops and
        completions.
    """

    code: ErrorCode

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"local misuse ({code}): {message}")
        self.code = code
