"""The virtual address of a Python buffer: what ``ibv_reg_mr`` registers.

Read through the buffer protocol (``PyObject_GetBuffer`` through ctypes), so it
works for read-only buffers too (``bytes``, ``mmap`` with ``ACCESS_READ``),
where ``ctypes.c_char.from_buffer`` refuses.
"""

import ctypes

from rdmakit.verbs.errors import VerbsError

__all__ = ["buffer_address"]


class _PyBuffer(ctypes.Structure):
    """``Py_buffer`` (part of the stable ABI since 3.11)."""

    _fields_ = (
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    )


_get_buffer = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int)(
    ("PyObject_GetBuffer", ctypes.pythonapi)
)
_release_buffer = ctypes.PYFUNCTYPE(None, ctypes.POINTER(_PyBuffer))(("PyBuffer_Release", ctypes.pythonapi))


def buffer_address(view: memoryview) -> int:
    """The address of `view`'s first byte; INVALID_VALUE unless it is C-contiguous."""
    if not view.c_contiguous:
        raise VerbsError("INVALID_VALUE", "memory to register must be C-contiguous")
    pybuf = _PyBuffer()
    _get_buffer(view, ctypes.byref(pybuf), 0)  # PyBUF_SIMPLE; raises on failure
    try:
        return int(pybuf.buf or 0)
    finally:
        _release_buffer(ctypes.byref(pybuf))
