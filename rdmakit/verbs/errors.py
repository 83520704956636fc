"""The verbs backend's one exception, and the translation of pyverbs' failures.

`VerbsError` carries a ``doca_error_t`` name (without ``DOCA_ERROR_``) and says
whose fault it is, like the DOCA layer's ``DocaError`` (which this layer may not
import: ``rdmakit.doca.verbs_glue`` turns one into the other).
"""

import errno
from typing import Literal

__all__ = ["ErrorCode", "FaultName", "VerbsError", "code_for_errno"]

#: ``doca_error_t`` names the verbs backend raises.
ErrorCode = Literal[
    "AGAIN",
    "BAD_STATE",
    "DRIVER",
    "FULL",
    "INVALID_VALUE",
    "IN_USE",
    "NOT_FOUND",
    "NOT_PERMITTED",
    "NOT_SUPPORTED",
    "NO_MEMORY",
    "OPERATING_SYSTEM",
]
#: Who broke the contract: the values of ``rdmakit.doca.Fault``.
FaultName = Literal["caller", "peer", "system"]


class VerbsError(Exception):
    """A verbs call failed with `code`; `fault` says whose fault it is.

    `errno` is the errno libibverbs reported, when there was one.
    """

    code: ErrorCode
    fault: FaultName
    errno: int | None

    def __init__(
        self, code: ErrorCode, message: str, fault: FaultName = "caller", err: int | None = None
    ) -> None:
        super().__init__(f"{message} [{code}, {fault}]")
        self.code = code
        self.message = message
        self.fault = fault
        self.errno = err


_ERRNO: dict[int, tuple[ErrorCode, FaultName]] = {
    errno.EINVAL: ("INVALID_VALUE", "caller"),
    errno.EPERM: ("NOT_PERMITTED", "caller"),
    errno.EACCES: ("NOT_PERMITTED", "caller"),
    errno.EFAULT: ("INVALID_VALUE", "caller"),  # memory the kernel could not pin
    errno.ENOMEM: ("NO_MEMORY", "system"),  # also a full work queue (ibv_post_send)
    errno.EAGAIN: ("AGAIN", "system"),
    errno.EBUSY: ("IN_USE", "caller"),
    errno.ENOENT: ("NOT_FOUND", "caller"),
    errno.ENODEV: ("NOT_FOUND", "system"),
    errno.ENXIO: ("NOT_FOUND", "system"),
    errno.EOPNOTSUPP: ("NOT_SUPPORTED", "system"),
    errno.ENOSYS: ("NOT_SUPPORTED", "system"),
}


def code_for_errno(err: int | None) -> tuple[ErrorCode, FaultName]:
    """The code and fault for an errno from libibverbs; unknown ones are the driver's."""
    return _ERRNO.get(err or 0, ("DRIVER", "system"))
