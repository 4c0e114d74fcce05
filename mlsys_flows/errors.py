"""The project's exception base, :class:`MlsysError`. Pure: imports nothing of the project.

Why: Dask pickles a task's exception and unpickles it in the caller. The default pickling of an
exception rebuilds it as ``cls(*self.args)``, which fails for a class whose ``__init__`` takes other
arguments than its message (``GraphError(field, problem)`` calls ``super().__init__(f"{field}: {problem}")``):
the user got ``TypeError: __init__() missing 1 required positional argument`` instead of the error.
``MlsysError`` rebuilds an instance without calling ``__init__``: same type, ``args`` (so ``str()``)
and ``__dict__`` (the fields: ``field``, ``problem``, ...). Every project exception derives from it,
next to the builtin it extends (``class GraphError(MlsysError, ValueError)``), so ``except ValueError``
still catches it; tests/unit/test_exceptions_pickle.py checks every class.
"""
from __future__ import annotations

__all__ = ["MlsysError"]

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python (copyreg._HEAPTYPE)


class MlsysError(Exception):
    """Base of every exception the project defines; instances survive ``pickle`` (a process boundary)."""

    def __reduce__(self):
        return _rebuild, (type(self), self.args, dict(self.__dict__))


def _rebuild(cls: type[BaseException], args: tuple, state: dict) -> BaseException:
    """``cls``'s instance with ``args`` and ``state`` (its ``__dict__``), without running ``cls.__init__``."""
    builtin = cls  # the builtin exception that lays out the instance (TimeoutError for FpgaError+TimeoutError)
    while builtin.__flags__ & _HEAPTYPE:
        builtin = builtin.__base__
    obj = builtin.__new__(cls, *args)
    obj.args = args  # OSError subclasses (TimeoutError) with their own __init__ leave args to __init__
    obj.__dict__.update(state)
    return obj
