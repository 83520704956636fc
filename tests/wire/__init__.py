"""Tests of rdmakit.wire, the RoCEv2 codec (a package so its helpers import relatively)."""
