"""DOCA Core 3.1.1: doca_error_t and the DocaError exception."""

import errno
import pickle

import pytest

from rdmakit.doca import (
    DocaError,
    DocaErrorCode,
    Fault,
    error_from_engine,
    error_from_os,
    error_from_wc_status,
)
from rdmakit.engine.errors import EngineError

# doca_error.h, verbatim names and values.
DOCA_ERROR_H = [
    ("DOCA_SUCCESS", 0),
    ("DOCA_ERROR_UNKNOWN", 1),
    ("DOCA_ERROR_NOT_PERMITTED", 2),
    ("DOCA_ERROR_IN_USE", 3),
    ("DOCA_ERROR_NOT_SUPPORTED", 4),
    ("DOCA_ERROR_AGAIN", 5),
    ("DOCA_ERROR_INVALID_VALUE", 6),
    ("DOCA_ERROR_NO_MEMORY", 7),
    ("DOCA_ERROR_INITIALIZATION", 8),
    ("DOCA_ERROR_TIME_OUT", 9),
    ("DOCA_ERROR_SHUTDOWN", 10),
    ("DOCA_ERROR_CONNECTION_RESET", 11),
    ("DOCA_ERROR_CONNECTION_ABORTED", 12),
    ("DOCA_ERROR_CONNECTION_INPROGRESS", 13),
    ("DOCA_ERROR_NOT_CONNECTED", 14),
    ("DOCA_ERROR_NO_LOCK", 15),
    ("DOCA_ERROR_NOT_FOUND", 16),
    ("DOCA_ERROR_IO_FAILED", 17),
    ("DOCA_ERROR_BAD_STATE", 18),
    ("DOCA_ERROR_UNSUPPORTED_VERSION", 19),
    ("DOCA_ERROR_OPERATING_SYSTEM", 20),
    ("DOCA_ERROR_DRIVER", 21),
    ("DOCA_ERROR_UNEXPECTED", 22),
    ("DOCA_ERROR_ALREADY_EXIST", 23),
    ("DOCA_ERROR_FULL", 24),
    ("DOCA_ERROR_EMPTY", 25),
    ("DOCA_ERROR_IN_PROGRESS", 26),
    ("DOCA_ERROR_TOO_BIG", 27),
    ("DOCA_ERROR_AUTHENTICATION", 28),
    ("DOCA_ERROR_BAD_CONFIG", 29),
    ("DOCA_ERROR_SKIPPED", 30),
    ("DOCA_ERROR_DEVICE_FATAL_ERROR", 31),
]


def test_codes_match_doca_error_h() -> None:
    """DOCA Core 3.1.1: every doca_error_t name has its C value, and nothing else exists."""
    assert [(code.doca_name, code.value) for code in DocaErrorCode] == DOCA_ERROR_H


def test_error_carries_code_name_message_and_fault() -> None:
    """DOCA Core 3.1.1: an error names its doca_error_t code and says whose fault it is."""
    err = DocaError(DocaErrorCode.BAD_STATE, "mmap is started")
    assert err.code is DocaErrorCode.BAD_STATE
    assert err.name == "DOCA_ERROR_BAD_STATE"
    assert err.message == "mmap is started"
    assert err.fault is Fault.CALLER
    assert str(err) == "DOCA_ERROR_BAD_STATE: mmap is started [caller]"


def test_int_code_is_normalised() -> None:
    """A raw doca_error_t integer becomes the enum member."""
    assert DocaError(18, "x").code is DocaErrorCode.BAD_STATE  # type: ignore[arg-type]


def test_success_is_not_an_error() -> None:
    """DOCA_SUCCESS cannot be raised."""
    with pytest.raises(ValueError, match="DOCA_SUCCESS"):
        DocaError(DocaErrorCode.SUCCESS, "fine")


@pytest.mark.parametrize(
    ("code", "fault"),
    [
        (DocaErrorCode.INVALID_VALUE, Fault.CALLER),
        (DocaErrorCode.BAD_STATE, Fault.CALLER),
        (DocaErrorCode.CONNECTION_RESET, Fault.PEER),
        (DocaErrorCode.AUTHENTICATION, Fault.PEER),
        (DocaErrorCode.DRIVER, Fault.SYSTEM),
        (DocaErrorCode.NO_MEMORY, Fault.SYSTEM),
    ],
)
def test_default_fault_follows_code(code: DocaErrorCode, fault: Fault) -> None:
    """Style rule 6: without an explicit fault, the code decides it."""
    assert DocaError(code, "m").fault is fault


def test_explicit_fault_overrides_default() -> None:
    """A raiser that knows better (a peer's bad descriptor) names the peer."""
    assert DocaError(DocaErrorCode.INVALID_VALUE, "m", Fault.PEER).fault is Fault.PEER


def test_pickle_round_trip() -> None:
    """Errors cross process boundaries intact."""
    err = DocaError(DocaErrorCode.IN_USE, "busy", Fault.SYSTEM)
    back = pickle.loads(pickle.dumps(err))
    assert (back.code, back.message, back.fault) == (err.code, err.message, err.fault)


@pytest.mark.parametrize(
    ("errno_value", "code", "fault"),
    [
        (errno.ENOMEM, DocaErrorCode.NO_MEMORY, Fault.SYSTEM),
        (errno.EAGAIN, DocaErrorCode.AGAIN, Fault.SYSTEM),
        (errno.ECONNRESET, DocaErrorCode.CONNECTION_RESET, Fault.PEER),
        (errno.ECONNREFUSED, DocaErrorCode.CONNECTION_ABORTED, Fault.PEER),
        (errno.EADDRINUSE, DocaErrorCode.IN_USE, Fault.SYSTEM),
        (errno.ETIMEDOUT, DocaErrorCode.TIME_OUT, Fault.SYSTEM),
        (errno.ELOOP, DocaErrorCode.OPERATING_SYSTEM, Fault.SYSTEM),
    ],
)
def test_error_from_os(errno_value: int, code: DocaErrorCode, fault: Fault) -> None:
    """OS failures below the DOCA layer map onto doca_error_t, never onto the caller."""
    err = error_from_os(OSError(errno_value, "boom"), "sendmsg")
    assert (err.code, err.fault) == (code, fault)
    assert err.message == "sendmsg: boom"


@pytest.mark.parametrize(
    ("status", "code", "fault"),
    [
        (10, DocaErrorCode.NOT_PERMITTED, Fault.PEER),  # REM_ACCESS_ERR
        (4, DocaErrorCode.NOT_PERMITTED, Fault.CALLER),  # LOC_PROT_ERR
        (12, DocaErrorCode.TIME_OUT, Fault.PEER),  # RETRY_EXC_ERR
        (5, DocaErrorCode.SHUTDOWN, Fault.SYSTEM),  # WR_FLUSH_ERR
        (21, DocaErrorCode.DRIVER, Fault.SYSTEM),  # GENERAL_ERR
        (99, DocaErrorCode.DRIVER, Fault.SYSTEM),  # unknown to verbs.h
    ],
)
def test_error_from_wc_status(status: int, code: DocaErrorCode, fault: Fault) -> None:
    """A failed verbs completion becomes the error inside the job's event."""
    err = error_from_wc_status(status, "write")
    assert (err.code, err.fault) == (code, fault)
    assert "ibv_wc_status" in err.message


def test_error_from_engine_is_the_callers() -> None:
    """The engine raises only for local misuse; its code names a doca_error_t."""
    err = error_from_engine(EngineError("FULL", "send queue is full"))
    assert (err.code, err.fault) == (DocaErrorCode.FULL, Fault.CALLER)


def test_wc_success_is_not_an_error() -> None:
    """IBV_WC_SUCCESS has no error."""
    with pytest.raises(ValueError, match="SUCCESS"):
        error_from_wc_status(0, "write")
