"""The codec's one exception."""


class WireError(ValueError):
    """Bytes that are not a valid RoCEv2 RC packet (the peer's fault).

    The decoder raises this and nothing else, whatever the input.
    """
