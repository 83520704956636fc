"""The RC extension layers for scapy, from their home in the conformance package."""

from rdmakit.conformance.scapy_layers import *  # noqa: F403
from rdmakit.conformance.scapy_layers import __all__  # noqa: F401
