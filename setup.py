"""Build of the optional native data plane; everything else is in pyproject.toml.

``rdmakit.transport._fastpath`` is optional: without a C compiler (or on a
platform it does not build on) the package installs without it, says so, and
runs the same protocol in pure Python (``rdmakit --version`` tells which).
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

FASTPATH = "rdmakit.transport._fastpath"


class BuildExt(build_ext):
    """build_ext that says when the optional native data plane did not build."""

    def run(self) -> None:
        super().run()
        if not os.path.exists(self.get_ext_fullpath(FASTPATH)):
            print(
                "rdmakit: the native UDP data plane (rdmakit/transport/_fastpath.c) did not build; "
                "the pure-Python path will be used (slower). Install a C compiler and reinstall to build it.",
                file=sys.stderr,
            )


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            FASTPATH,
            sources=["rdmakit/transport/_fastpath.c"],
            depends=[
                "rdmakit/transport/_nativeqp.c",
                "rdmakit/transport/_nativeqp_ack.c",
                "rdmakit/transport/_nativepoll.c",
                "rdmakit/transport/_nativereq.c",
                "rdmakit/transport/_nativeread.c",
                "rdmakit/transport/_nativepost.c",
                "rdmakit/transport/_nativeloop.c",
                "rdmakit/transport/_nativepostsend.c",
            ],
            extra_compile_args=["-O2", "-std=gnu11", "-fno-strict-aliasing", "-Wall", "-Wextra"],
            optional=True,
        )
    ],
)
