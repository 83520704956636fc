"""DOCA error codes and the one exception of the DOCA layer.

`DocaErrorCode` is `doca_error_t` (DOCA Core 3.1.1, ``doca_error.h``) with the
same names and values. Every failure in ``rdmakit.doca`` raises `DocaError`,
which carries the code and says whose fault it is (`Fault`): the caller broke
the API contract, the peer refused or broke the protocol, or the system (OS,
driver, device, resources) failed.

The helpers at the bottom translate failures from the layers below: an
`OSError` from a transport (`error_from_os`), the engine's `EngineError`
(`error_from_engine`) and a failed work completion from an engine or pyverbs
backend (`error_from_wc_status`).
"""

import errno
from enum import Enum, IntEnum

from rdmakit.engine.errors import EngineError
from rdmakit.engine.types import WcStatus

__all__ = [
    "DocaError",
    "DocaErrorCode",
    "Fault",
    "error_from_engine",
    "error_from_os",
    "error_from_wc_status",
]


class DocaErrorCode(IntEnum):
    """``doca_error_t`` (``doca_error.h``); values are the C enum's."""

    SUCCESS = 0  # DOCA_SUCCESS
    UNKNOWN = 1  # Unknown error
    NOT_PERMITTED = 2  # Operation not permitted
    IN_USE = 3  # Resource already in use
    NOT_SUPPORTED = 4  # Operation not supported
    AGAIN = 5  # Resource temporarily unavailable, try again
    INVALID_VALUE = 6  # Invalid input
    NO_MEMORY = 7  # Memory allocation failure
    INITIALIZATION = 8  # Resource initialization failure
    TIME_OUT = 9  # Timer expired waiting for resource
    SHUTDOWN = 10  # Shut down in process or completed
    CONNECTION_RESET = 11  # Connection reset by peer
    CONNECTION_ABORTED = 12  # Connection aborted
    CONNECTION_INPROGRESS = 13  # Connection in progress
    NOT_CONNECTED = 14  # Not connected
    NO_LOCK = 15  # Unable to acquire required lock
    NOT_FOUND = 16  # Resource not found
    IO_FAILED = 17  # Input/Output operation failed
    BAD_STATE = 18  # Bad state
    UNSUPPORTED_VERSION = 19  # Unsupported version
    OPERATING_SYSTEM = 20  # Operating system call failure
    DRIVER = 21  # DOCA driver call failure
    UNEXPECTED = 22  # An unexpected scenario was detected
    ALREADY_EXIST = 23  # Resource already exists
    FULL = 24  # No more space in resource
    EMPTY = 25  # No entry is available in resource
    IN_PROGRESS = 26  # Operation is in progress
    TOO_BIG = 27  # Requested operation too big to be contained
    AUTHENTICATION = 28  # Authentication failure
    BAD_CONFIG = 29  # Configuration is not valid
    SKIPPED = 30  # Result is valid, but some previous output data was dropped
    DEVICE_FATAL_ERROR = 31  # Device experienced a fatal error

    @property
    def doca_name(self) -> str:
        """The C identifier, e.g. ``DOCA_ERROR_BAD_STATE``."""
        if self is DocaErrorCode.SUCCESS:
            return "DOCA_SUCCESS"
        return f"DOCA_ERROR_{self.name}"


class Fault(Enum):
    """Who broke the contract (house style rule 6)."""

    CALLER = "caller"  # local misuse of the API: fix the calling code
    PEER = "peer"  # the remote side refused, or sent something invalid
    SYSTEM = "system"  # OS, driver, device or resources failed; nobody misused anything


_C, _P, _S = Fault.CALLER, Fault.PEER, Fault.SYSTEM

# The fault a code implies when the raiser doesn't say otherwise.
_DEFAULT_FAULT: dict[DocaErrorCode, Fault] = {
    DocaErrorCode.UNKNOWN: _S,
    DocaErrorCode.NOT_PERMITTED: _C,
    DocaErrorCode.IN_USE: _C,
    DocaErrorCode.NOT_SUPPORTED: _S,
    DocaErrorCode.AGAIN: _S,
    DocaErrorCode.INVALID_VALUE: _C,
    DocaErrorCode.NO_MEMORY: _S,
    DocaErrorCode.INITIALIZATION: _S,
    DocaErrorCode.TIME_OUT: _S,
    DocaErrorCode.SHUTDOWN: _S,
    DocaErrorCode.CONNECTION_RESET: _P,
    DocaErrorCode.CONNECTION_ABORTED: _P,
    DocaErrorCode.CONNECTION_INPROGRESS: _C,
    DocaErrorCode.NOT_CONNECTED: _C,
    DocaErrorCode.NO_LOCK: _S,
    DocaErrorCode.NOT_FOUND: _C,
    DocaErrorCode.IO_FAILED: _S,
    DocaErrorCode.BAD_STATE: _C,
    DocaErrorCode.UNSUPPORTED_VERSION: _P,
    DocaErrorCode.OPERATING_SYSTEM: _S,
    DocaErrorCode.DRIVER: _S,
    DocaErrorCode.UNEXPECTED: _S,
    DocaErrorCode.ALREADY_EXIST: _C,
    DocaErrorCode.FULL: _C,
    DocaErrorCode.EMPTY: _C,
    DocaErrorCode.IN_PROGRESS: _C,
    DocaErrorCode.TOO_BIG: _C,
    DocaErrorCode.AUTHENTICATION: _P,
    DocaErrorCode.BAD_CONFIG: _C,
    DocaErrorCode.SKIPPED: _S,
    DocaErrorCode.DEVICE_FATAL_ERROR: _S,
}


class DocaError(Exception):
    """A DOCA call failed with `code`; `fault` says whose fault it is.

    ``DocaError(DocaErrorCode.BAD_STATE, "mmap is started")`` prints as
    ``DOCA_ERROR_BAD_STATE: mmap is started [caller]``.
    """

    code: DocaErrorCode
    message: str
    fault: Fault

    def __init__(self, code: DocaErrorCode, message: str, fault: Fault | None = None) -> None:
        code = DocaErrorCode(code)
        if code is DocaErrorCode.SUCCESS:
            raise ValueError("DOCA_SUCCESS is not an error")
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.fault = _DEFAULT_FAULT[code] if fault is None else fault

    @property
    def name(self) -> str:
        """The ``doca_error_t`` identifier, e.g. ``DOCA_ERROR_BAD_STATE``."""
        return self.code.doca_name

    def __str__(self) -> str:
        return f"{self.name}: {self.message} [{self.fault.value}]"

    def __repr__(self) -> str:
        return f"DocaError({self.code!s}, {self.message!r}, {self.fault!s})"

    def __reduce__(self) -> tuple[type["DocaError"], tuple[DocaErrorCode, str, Fault]]:
        return (type(self), (self.code, self.message, self.fault))


_ERRNO_CODE: dict[int, DocaErrorCode] = {
    errno.EPERM: DocaErrorCode.NOT_PERMITTED,
    errno.EACCES: DocaErrorCode.NOT_PERMITTED,
    errno.ENOENT: DocaErrorCode.NOT_FOUND,
    errno.ENODEV: DocaErrorCode.NOT_FOUND,
    errno.ENXIO: DocaErrorCode.NOT_FOUND,
    errno.EAGAIN: DocaErrorCode.AGAIN,
    errno.ENOMEM: DocaErrorCode.NO_MEMORY,
    errno.ENOBUFS: DocaErrorCode.NO_MEMORY,
    errno.EBUSY: DocaErrorCode.IN_USE,
    errno.EADDRINUSE: DocaErrorCode.IN_USE,
    errno.EEXIST: DocaErrorCode.ALREADY_EXIST,
    errno.EINVAL: DocaErrorCode.INVALID_VALUE,
    errno.E2BIG: DocaErrorCode.TOO_BIG,
    errno.EMSGSIZE: DocaErrorCode.TOO_BIG,
    errno.EOPNOTSUPP: DocaErrorCode.NOT_SUPPORTED,
    errno.ENOSYS: DocaErrorCode.NOT_SUPPORTED,
    errno.EAFNOSUPPORT: DocaErrorCode.NOT_SUPPORTED,
    errno.ETIMEDOUT: DocaErrorCode.TIME_OUT,
    errno.ECONNRESET: DocaErrorCode.CONNECTION_RESET,
    errno.EPIPE: DocaErrorCode.CONNECTION_RESET,
    errno.ECONNABORTED: DocaErrorCode.CONNECTION_ABORTED,
    errno.ECONNREFUSED: DocaErrorCode.CONNECTION_ABORTED,
    errno.EINPROGRESS: DocaErrorCode.CONNECTION_INPROGRESS,
    errno.EALREADY: DocaErrorCode.IN_PROGRESS,
    errno.ENOTCONN: DocaErrorCode.NOT_CONNECTED,
    errno.ESHUTDOWN: DocaErrorCode.SHUTDOWN,
    errno.EIO: DocaErrorCode.IO_FAILED,
}


def error_from_os(exc: OSError, message: str) -> DocaError:
    """Translate an `OSError` from a system call into a `DocaError`.

    Unlisted errnos become ``OPERATING_SYSTEM``. The fault is SYSTEM except for
    connection errors, which are the peer's. Raise it ``from exc``.
    """
    code = _ERRNO_CODE.get(exc.errno or 0, DocaErrorCode.OPERATING_SYSTEM)
    fault = Fault.PEER if _DEFAULT_FAULT[code] is Fault.PEER else Fault.SYSTEM
    detail = exc.strerror or type(exc).__name__
    return DocaError(code, f"{message}: {detail}", fault)


_W = WcStatus
# A failed work completion -> the code and fault reported inside the job's
# event. DOCA does not publish this table; this is rdmakit's.
_WC_STATUS: dict[WcStatus, tuple[DocaErrorCode, Fault]] = {
    _W.LOC_LEN_ERR: (DocaErrorCode.TOO_BIG, _C),
    _W.LOC_QP_OP_ERR: (DocaErrorCode.INVALID_VALUE, _C),
    _W.LOC_PROT_ERR: (DocaErrorCode.NOT_PERMITTED, _C),
    _W.WR_FLUSH_ERR: (DocaErrorCode.SHUTDOWN, _S),  # the QP is in the error state
    _W.BAD_RESP_ERR: (DocaErrorCode.UNEXPECTED, _P),
    _W.LOC_ACCESS_ERR: (DocaErrorCode.NOT_PERMITTED, _C),
    _W.REM_INV_REQ_ERR: (DocaErrorCode.INVALID_VALUE, _P),
    _W.REM_ACCESS_ERR: (DocaErrorCode.NOT_PERMITTED, _P),
    _W.REM_OP_ERR: (DocaErrorCode.IO_FAILED, _P),
    _W.RETRY_EXC_ERR: (DocaErrorCode.TIME_OUT, _P),
    _W.RNR_RETRY_EXC_ERR: (DocaErrorCode.TIME_OUT, _P),
    _W.REM_INV_RD_REQ_ERR: (DocaErrorCode.INVALID_VALUE, _P),
    _W.REM_ABORT_ERR: (DocaErrorCode.CONNECTION_ABORTED, _P),
    _W.FATAL_ERR: (DocaErrorCode.DEVICE_FATAL_ERROR, _S),
    _W.RESP_TIMEOUT_ERR: (DocaErrorCode.TIME_OUT, _P),
}


def error_from_wc_status(status: int, message: str) -> DocaError:
    """Translate a failed work completion (``ibv_wc_status``, IBTA Vol. 1 §11.4.2.1) into a `DocaError`.

    Unlisted statuses (``GENERAL_ERR`` and the RD/MW ones RC never produces)
    become ``DRIVER``.
    """
    if status == WcStatus.SUCCESS:
        raise ValueError("IBV_WC_SUCCESS is not an error")
    code, fault = _WC_STATUS.get(status, (DocaErrorCode.DRIVER, _S))  # type: ignore[call-overload]
    name = WcStatus(status).name if status in WcStatus._value2member_map_ else str(status)
    return DocaError(code, f"{message} (ibv_wc_status {name})", fault)


def error_from_engine(exc: EngineError) -> DocaError:
    """Translate the engine's `EngineError` (always a local misuse) into a `DocaError`."""
    return DocaError(DocaErrorCode[exc.code], str(exc), Fault.CALLER)
