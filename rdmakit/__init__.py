"""rdmakit: RDMA for Python, with NVIDIA DOCA's object model.

Layers, bottom up: :mod:`rdmakit.wire` (RoCEv2 codec), :mod:`rdmakit.engine`
(sans-IO RC queue pairs), :mod:`rdmakit.transport` (sockets, drivers, simulated
network), :mod:`rdmakit.verbs` (rdma-core through pyverbs), :mod:`rdmakit.doca`
(the DOCA object model) and :mod:`rdmakit.cli` (programs).
"""

__version__ = "0.1.0"
