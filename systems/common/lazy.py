"""Lazy re-exports for a system's package (PEP 562 style), pure.

``systems/<name>/__init__.py`` holds the system's ``Params`` and ``SPEC``, and importing it loads
only what they need (pydantic, ``systems.common.params``/``spec``): the registry reads a spec without
loading the engine (numpy, scipy, solvers, torch). The names the package re-exports from its
submodules load on first use instead::

    lazy_exports(__name__, {
        ".sharding": ("Plan", "best_greedy"),
        ".replay": ("FIELDS", "replay"),
    })

``from mlsys_flows.systems.<name> import Plan`` and ``<name>.Plan`` then import ``.sharding`` the
first time. A submodule's own name stays the submodule (``from ...recshard import lookup``) unless it
is exported: ``replay`` above stays the function, also once ``.replay`` is imported, as it was when
the package imported it eagerly. Only the package's own submodules can be named (a relative name),
so the import contracts still see every import between packages.
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType


class _LazyPackage(ModuleType):
    """A package whose ``__lazy_exports__`` (name -> relative submodule) load on first access."""

    __lazy_exports__: dict[str, str]

    def __getattr__(self, name: str):
        module = self.__dict__.get("__lazy_exports__", {}).get(name)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, self.__name__), name)
        ModuleType.__setattr__(self, name, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(self.__dict__) | set(self.__dict__.get("__lazy_exports__", {})))

    def __setattr__(self, name: str, value) -> None:
        # the import system binds a submodule to its package once it is loaded; an export of the same
        # name (the function ``replay`` of ``.replay``) keeps that name, as an eager import left it
        exports = self.__dict__.get("__lazy_exports__", {})
        if name in exports and isinstance(value, ModuleType) and value.__name__ == f"{self.__name__}.{name}":
            value = getattr(importlib.import_module(exports[name], self.__name__), name)
        ModuleType.__setattr__(self, name, value)


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]) -> None:
    """Make each name of ``exports[".submodule"]`` an attribute of ``package`` (the calling package's
    ``__name__``) that imports that submodule when first asked for."""
    where: dict[str, str] = {}
    for module, names in exports.items():
        if not module.startswith(".") or module.startswith(".."):
            raise ValueError(f"{package}: lazy exports come from the package's own submodules (got {module!r})")
        for name in names:
            if name in where:
                raise ValueError(f"{package}: {name!r} is exported from {where[name]!r} and {module!r}")
            where[name] = module
    pkg = sys.modules[package]
    pkg.__lazy_exports__ = where
    pkg.__class__ = _LazyPackage
