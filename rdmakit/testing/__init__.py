"""Test tools that ship with rdmakit, as ``trio.testing`` does with trio's.

* `rdmakit.testing.backend.check_backend_pair` checks a DOCA backend
  (``rdmakit.doca.backend``) against every promise the DOCA layer relies on.
* `rdmakit.testing.engine`: two connected engine QPs on a simulated network
  (`make_pair`), random workloads that check their own outcome (`Workload`),
  and `pump` for two QPs back to back.
* `rdmakit.testing.faults`: named fault profiles (loss, duplication,
  reordering, corruption) for that network.
* `rdmakit.testing.strategies`: hypothesis strategies for RC packets; needs
  hypothesis (``pip install 'rdmakit[testing]'``).
* `rdmakit.testing.netbed`: a routed bed of three network namespaces
  (A – R – B, IPv4 and IPv6, tbf on R) to run programs between two hosts;
  needs root. `rdmakit.testing.goodput` measures goodput across it against
  iperf3 (``python3 -m rdmakit.testing.goodput``).
* `rdmakit.testing.cm_side`: ``rdma_cm`` ends on soft devices pumped by hand
  (`CmSide`, `until`), for tests of the connection manager.

Each is imported on its own (``from rdmakit.testing.engine import make_pair``):
this package imports none of them, so a program that uses one pays for no other.
"""
