"""Describe the machine a run happened on (pure: no prefect/dask imports)."""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from .runreport import Environment

_PACKAGES = ("mlsys-flows", "prefect", "dask", "distributed", "torch", "numpy", "pyarrow", "highspy")


def _device() -> str:
    """The CUDA GPUs this process can use, else the CPU's model. A process that imported torch asks
    torch; one that did not (a flow process: its tasks run on Dask workers) reads the driver's list
    rather than import torch, which took 1.2 s of every run's fixed cost (issue 42 item 4)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
        except Exception:  # a broken driver: report the CPU
            pass
    elif gpus := nvidia_gpus():
        return f"cuda: {gpus[0]} x{len(gpus)}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {cpu}"


def nvidia_gpus(root: Path = Path("/proc/driver/nvidia/gpus")) -> list[str]:
    """Model names of the NVIDIA GPUs the driver lists (none without the driver), as many as
    ``CUDA_VISIBLE_DEVICES`` lets this process see."""
    models = []
    try:
        boards = sorted(root.iterdir())
    except OSError:
        return []
    for board in boards:
        try:
            lines = (board / "information").read_text().splitlines()
        except OSError:
            continue
        models += [line.split(":", 1)[1].strip() for line in lines if line.startswith("Model:")][:1]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        models = [] if not ids or ids[0] == "-1" else models[:len(ids)]
    return models


def _git(*args: str) -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _layer_dir(layer: str) -> Path:
    """Source folder of ``mlsys_flows.<layer>``, found without importing it."""
    spec = importlib.util.find_spec(f"mlsys_flows.{layer}" if layer else "mlsys_flows")
    return Path(next(iter(spec.submodule_search_locations)))


def _hash(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for label, path in sorted(files):
        h.update(label.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _tree(layer: str, sub: str = "") -> list[tuple[str, Path]]:
    root = _layer_dir(layer)
    base = root / sub if sub else root
    return [(f"{layer}/{p.relative_to(root)}", p) for p in sorted(base.rglob("*.py")) if "__pycache__" not in p.parts]


_SHARED_IMPORT = re.compile(r"mlsys_flows\.systems\.(\w+)|from \.\.(\w+)")
_SHARED_TASKS = re.compile(r"mlsys_flows\.tasks\.(\w+)")


def system_files(name: str) -> list[tuple[str, Path]]:
    """The system's own code: its package, the family packages it imports (not ``common``, which
    belongs to the harness), its task and its flow module."""
    files = _tree("systems", name)
    for layer in ("tasks", "flows"):
        path = _layer_dir(layer) / f"{name}.py"
        if path.exists():
            files.append((f"{layer}/{name}.py", path))
    shared = {m for _, p in files for hit in _SHARED_IMPORT.findall(p.read_text()) for m in hit if m}
    # a family's shared task module (tasks/<family>.py) that the system's task module imports
    task_families = {m for _, p in files for m in _SHARED_TASKS.findall(p.read_text())}
    for family in sorted(shared - {name, "common"}):
        if (_layer_dir("systems") / family).is_dir():
            files += _tree("systems", family)
    for family in sorted(task_families - {name, "common"}):
        path = _layer_dir("tasks") / f"{family}.py"
        if path.exists():
            files.append((f"tasks/{family}.py", path))
    return files


_LAYERS = ("systems", "tasks", "flows", "blocks", "_project")


def harness_files() -> list[tuple[str, Path]]:
    files = _tree("systems", "common") + _tree("blocks")
    # the platform package and its subpackages, not the layers an installed wheel holds inside it
    root = _layer_dir("")
    files += [(f"mlsys_flows/{p.relative_to(root)}", p) for p in sorted(root.rglob("*.py"))
              if "__pycache__" not in p.parts and p.relative_to(root).parts[0] not in _LAYERS]
    files += [(f"{layer}/common.py", _layer_dir(layer) / "common.py") for layer in ("tasks", "flows")]
    return [(label, p) for label, p in files if p.exists()]


def code_hash(name: str) -> str:
    return _hash(system_files(name))


def harness_hash() -> str:
    return _hash(harness_files())


def load_average() -> tuple[float, float, float] | None:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())  # type: ignore[return-value]
    except OSError:
        return None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# Committed measured numbers start on a quiet machine (contract v4, issue 43 item 5): at most this
# 1-minute load per usable core before the run; above it, measured ratios partly time other work.
QUIET_LOAD_PER_CORE = 0.75


def quiet_load(cores: int | None = None) -> float:
    """The 1-minute load at or under which the machine counts as quiet for a measurement."""
    return QUIET_LOAD_PER_CORE * (cores or usable_cores())


def too_busy(report: dict) -> str | None:
    """Why a RunReport (as JSON) may not be committed: it has measured metrics and its run started
    above the quiet load; None when it may."""
    measured = sorted(m for m, kind in report.get("metric_kinds", {}).items() if kind == "measured")
    env = report.get("environment") or {}
    load = env.get("load_before")
    if not measured or not load:
        return None
    limit = quiet_load(env.get("usable_cores"))
    if load[0] <= limit:
        return None
    return (f"its run started at a 1-minute load of {load[0]:g}, above {limit:g} ({QUIET_LOAD_PER_CORE:g} per usable "
            f"core), and its measured metrics ({', '.join(measured)}) partly time other work")


# What a sweep writes into the tree (committed results, generated docs, the deployments file): a run
# after another run's results were written is still a run of the committed code.
_OUTPUTS = ("benchmarks/results/", "docs/", "README.md", "prefect.yaml")


def dirty_code(porcelain: str) -> list[str]:
    """Tracked files changed against the commit (``git status --porcelain`` lines), less results and
    generated outputs: the code a run ran differs from its ``git_sha`` exactly when this is non-empty."""
    paths = [line[3:].split(" -> ")[-1].strip('"') for line in porcelain.splitlines() if line.strip()]
    return sorted(p for p in paths if not p.startswith(_OUTPUTS))


def capture(system: str | None = None) -> Environment:
    """The machine and the code a run of ``system`` happened on; the load is taken now (the harness
    sets ``load_after`` when the run ends)."""
    versions = {"python": platform.python_version()}
    for pkg in _PACKAGES:
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            continue
    sha = (_git("rev-parse", "HEAD") or "").strip() or "unknown"
    status = _git("status", "--porcelain", "--untracked-files=no")
    dirty = None if status is None else dirty_code(status)
    return Environment(device=_device(), cores=os.cpu_count() or 1, usable_cores=usable_cores(),
                       platform=platform.platform(), versions=versions, git_sha=sha,
                       git_dirty=None if dirty is None else bool(dirty), dirty_files=dirty or [],
                       code_hash=code_hash(system) if system else "", harness_hash=harness_hash(),
                       load_before=load_average())
