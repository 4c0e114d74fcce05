"""Describe the machine a run happened on (pure: no prefect/dask imports)."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
from pathlib import Path

from .report import Environment

_PACKAGES = ("mlsys-flows", "prefect", "dask", "distributed", "torch", "numpy", "pyarrow", "highspy")


def _device() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    except Exception:  # torch missing or broken driver: report the CPU
        pass
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {cpu}"


def _git_sha() -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def capture() -> Environment:
    versions = {"python": platform.python_version()}
    for pkg in _PACKAGES:
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            continue
    return Environment(device=_device(), cores=os.cpu_count() or 1, platform=platform.platform(),
                       versions=versions, git_sha=_git_sha())
