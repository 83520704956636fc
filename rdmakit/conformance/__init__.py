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

try:
    import scapy.contrib.roce  # noqa: F401
except ModuleNotFoundError:  # pragma: no cover - depends on the installation
    raise ImportError("rdmakit.conformance needs scapy>=2.6: pip install 'rdmakit[conformance]'") from None
