"""The codec's one exception, and who is to blame for it."""


class WireError(ValueError):
    """Bytes that are not a valid RoCEv2 RC packet (the peer's fault).

    The decoder raises this and nothing else, whatever the input. It is also the
    base class of :class:`LocalWireError`, so ``except WireError`` catches
    every error the codec raises.
    """


class LocalWireError(WireError):
    """A value this side asked the codec to put on the wire is invalid (the caller's fault).

    Raised by the encoders: a header the opcode does not carry or one it lacks,
    a field out of its range (24-bit QPN, PSN and MSN, 16-bit P_Key, ...), a
    frame length out of bounds.
    """
