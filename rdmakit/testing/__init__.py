"""Test tools that ship with rdmakit, as ``trio.testing`` does: conformance suites for its protocols.

`rdmakit.testing.backend.check_backend_pair` checks a DOCA backend
(``rdmakit.doca.backend``) against every promise the DOCA layer relies on.
"""
