"""A RoCEv2 RC conformance suite: a packet-level tester for any RoCE implementation.

The tester plays either RC role against a device under test (DUT). As
requester it sends hand-built requests and checks the DUT's responses; as
responder it answers the DUT's requests, correctly or wrongly on purpose, and
checks how the DUT's requester reacts. A target agent beside the DUT
(``rdmakit conformance-target``) sets each case up over an authenticated
control channel.

Packets are built and dissected with scapy (``scapy.contrib.roce`` plus
:mod:`.scapy_layers`), never with ``rdmakit.wire``, so the suite does not
share the code it tests. scapy is the optional ``conformance`` extra
(``pip install 'rdmakit[conformance]'``).
"""


def need_scapy() -> None:
    """Raise ImportError, saying what to install, if scapy is missing (listing cases does not need it)."""
    try:
        import scapy.contrib.roce  # noqa: F401
    except ModuleNotFoundError:
        msg = "the conformance suite needs scapy>=2.6: pip install 'rdmakit[conformance]'"
        raise ImportError(msg) from None
