"""Build of the optional native data plane; everything else is in pyproject.toml.

``rdmakit.transport._fastpath`` is optional: without a C compiler (or on a
platform it does not build on) the package installs without it and runs the
same protocol in pure Python.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rdmakit.transport._fastpath",
            sources=["rdmakit/transport/_fastpath.c"],
            extra_compile_args=["-O2", "-std=gnu11", "-fno-strict-aliasing", "-Wall", "-Wextra"],
            optional=True,
        )
    ]
)
