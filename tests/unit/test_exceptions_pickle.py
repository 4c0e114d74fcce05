"""Every exception the project defines derives from MlsysError and survives pickle (issue 42 item 3).

Dask pickles a task's exception to the caller; an exception whose ``__init__`` takes other arguments
than its message (``GraphError(field, problem)``) failed to unpickle there, so the user saw a TypeError
instead of the error. The classes are found, not listed: every module of the package (the mapped
layers mlsys_flows.systems/.tasks/.flows/.blocks included) is imported and every exception class whose
``__module__`` is the project's is checked. A module that fails to import only for a missing optional
dependency (not a module of the project) is skipped and named in ``SKIPPED``.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import io
import pickle
import pkgutil
from pathlib import Path

import pytest

import mlsys_flows
from mlsys_flows.errors import MlsysError


def _mapped_layers() -> tuple[str, ...]:
    """setup.py's LAYERS (systems, tasks, flows, blocks), read as .ci/lint_imports.py reads them."""
    spec = importlib.util.spec_from_file_location("lint_imports", Path(__file__).resolve().parents[2] / ".ci" / "lint_imports.py")
    lint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lint)
    return lint.mapped_layers()


SKIPPED: dict[str, str] = {}  # module -> the missing optional dependency


def _modules() -> list[str]:
    """mlsys_flows and every module under it. The mapped layers (setup.py's LAYERS) are not folders
    of mlsys_flows/, so walking mlsys_flows.__path__ does not reach them: each is walked from its own path."""
    names = [mlsys_flows.__name__]
    for path, prefix in [(mlsys_flows.__path__, "mlsys_flows.")] + [
            (importlib.import_module(f"mlsys_flows.{layer}").__path__, f"mlsys_flows.{layer}.") for layer in _mapped_layers()]:
        names += [info.name for info in pkgutil.walk_packages(path, prefix=prefix, onerror=lambda name: None)]
    return list(dict.fromkeys(names))


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("mlsys_flows"):
                SKIPPED[name] = exc.name  # e.g. the Airflow provider without Airflow
                continue
            raise
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__.startswith("mlsys_flows")):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


CLASSES = _exception_classes()

# Classes whose required arguments cannot be plain strings (the message is built from them).
ARGS: dict[str, tuple] = {
    "mlsys_flows.platform.ranks.RanksFailed": ("launch-1", {0: "tcp://127.0.0.1:1"}, {}),
}


def _instance(cls: type[BaseException]) -> BaseException:
    key = f"{cls.__module__}.{cls.__qualname__}"
    if key in ARGS:
        return cls(*ARGS[key])
    try:
        params = inspect.signature(cls).parameters.values()
    except ValueError:  # no __init__ of its own: the builtin's (*args)
        return cls("a message")
    required = [p for p in params if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not required and not any(p.kind is p.VAR_POSITIONAL for p in params):
        return cls()
    return cls(*(f"{p.name}-value" for p in required)) if required else cls("a message")


def _roundtrip(exc: BaseException) -> BaseException:
    """pickle.loads(pickle.dumps(exc)) as in a Dask worker, by the class's own reduce. An empty dispatch
    table: importing the Airflow provider above runs tblib's pickling_support.install(), whose copyreg
    reducers for every exception class of this process would hide a class that does not pickle."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf)
    pickler.dispatch_table = {}
    pickler.dump(exc)
    return pickle.loads(buf.getvalue())


def test_the_project_defines_exceptions():
    names = {c.__qualname__ for c in CLASSES}
    assert {"MlsysError", "GraphError", "ParamsError", "RunError"} <= names, names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_exception_derives_from_mlsys_error_and_pickles(cls):
    assert issubclass(cls, MlsysError), f"{cls.__module__}.{cls.__qualname__} does not derive from MlsysError"
    exc = _instance(cls)
    back = _roundtrip(exc)
    assert type(back) is cls
    assert str(back) == str(exc)
    assert back.args == exc.args
    assert back.__dict__ == exc.__dict__


def test_graph_error_keeps_its_fields_across_pickle():
    from mlsys_flows.systems.placement.sources import GraphError

    exc = GraphError("memory_per_accelerator", "nothing fits")
    back = _roundtrip(exc)
    assert isinstance(back, ValueError)
    assert (back.field, back.problem, str(back)) == ("memory_per_accelerator", "nothing fits",
                                                   "memory_per_accelerator: nothing fits")


def test_modules_not_imported_lack_only_an_optional_dependency():
    """Says which modules were not checked (shown by ``pytest -rs``): their optional dependency is not
    installed here (the Airflow provider without apache-airflow-task-sdk, ...)."""
    if SKIPPED:
        pytest.skip("not imported, optional dependency missing: "
                    + ", ".join(f"{m} ({dep})" for m, dep in sorted(SKIPPED.items())))
