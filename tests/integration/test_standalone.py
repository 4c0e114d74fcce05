"""The project stands on its own: a copy of the repository with no ``shared`` folder beside it and no
$MLSYS_PLACEMENT_GRAPHS validates every registered system's parameters (defaults and every scale
preset) and runs ``mlsys-flows run placement --scale smoke`` to exit code 0.

How the copy is made and imported (the cheapest way that tests the copy's code, not /work/main's):

- **Copy, not ``git clone``.** The files git would commit (``git ls-files --cached --others
  --exclude-standard``: tracked files plus new, not-ignored ones, as they are in the working tree) are
  copied into ``tmp_path/repo``, so uncommitted edits are tested before they are committed. Nothing
  ignored comes along (``.venv``, ``.mlsys-flows``, caches, egg-info). ``tmp_path`` lies under /tmp;
  since ``graphs_dir()`` reads only $MLSYS_PLACEMENT_GRAPHS, no ``shared`` folder above it could count.
- **Imports.** The project's venv holds an editable install of /work/main whose import hook maps
  ``mlsys_flows.<layer>`` to /work/main/<layer> (setup.py's ``package_dir``). That hook sits at the end
  of ``sys.meta_path``, after the ordinary path finder, so a copy whose ``mlsys_flows`` package is first
  on ``sys.path`` wins, provided its layers are found inside that package. The test links
  ``repo/mlsys_flows/<layer> -> ../<layer>`` for each layer in the copy's setup.py (the same mapping
  packaging makes) and runs the venv's python with ``cwd`` = the copy: ``sys.path[0]`` is then the copy,
  and Dask's spawned worker processes inherit that ``sys.path`` too, so every process runs the copy's
  code. No pip install, no second venv: seconds instead of a minute. The subprocess asserts it imported
  from the copy.
- **Environment.** ``PYTHONPATH``, ``MLSYS_PLACEMENT_GRAPHS``, ``MLSYS_FLOWS_HOME`` and every
  ``PREFECT_*`` variable of the test session are removed, so the run uses its own embedded Prefect API
  and state under the copy (``.mlsys-flows``), as a user's first run does.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

VALIDATE = """
import json, sys
from pathlib import Path
import mlsys_flows, mlsys_flows.systems
root = Path.cwd().resolve()
for mod in (mlsys_flows, mlsys_flows.systems):
    assert Path(mod.__file__).resolve().is_relative_to(root), f"{mod.__name__} imported from {mod.__file__}"
from mlsys_flows import registry
from mlsys_flows.systems.common.params import SCALES
checked, errors = [], []
for spec in registry.all_specs():
    model = spec.params_model()
    for scale in (None, *SCALES):
        try:
            model() if scale is None else model.for_scale(scale)
            checked.append(f"{spec.name}:{scale or 'defaults'}")
        except Exception as exc:
            errors.append(f"{spec.name} {scale or 'defaults'}: {exc}")
print(json.dumps({"checked": checked, "errors": errors}))
"""

RUN_CLI = """
import sys
from pathlib import Path
import mlsys_flows.systems.placement as placement
assert Path(placement.__file__).resolve().is_relative_to(Path.cwd().resolve()), placement.__file__
from mlsys_flows.cli import main
sys.argv = ["mlsys-flows", "run", "placement", "--scale", "smoke", "--json", "report.json"]
sys.exit(main())
"""


def _layers(setup_py: Path) -> tuple[str, ...]:
    """LAYERS of setup.py (the folders mapped into mlsys_flows), read without running setup()."""
    for node in ast.parse(setup_py.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAYERS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("setup.py defines no LAYERS")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """(copy of the repository, environment without the session's data and Prefect settings)."""
    repo = tmp_path_factory.mktemp("standalone") / "repo"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if not src.exists() and not src.is_symlink():  # deleted in the working tree, not yet committed
            continue
        dst = repo / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    assert not any(p.name == "shared" and p.is_dir() for p in (repo.parent, *repo.parents))
    for layer in _layers(repo / "setup.py"):
        (repo / "mlsys_flows" / layer).symlink_to(Path("..") / layer, target_is_directory=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "MLSYS_PLACEMENT_GRAPHS", "MLSYS_FLOWS_HOME") and not k.startswith("PREFECT_")}
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    return repo, env


def _python(repo: Path, env: dict, code: str, timeout: float) -> subprocess.CompletedProcess:
    """The venv's python on ``code`` in the copy, in a session of its own: whatever it leaves behind (the
    embedded Prefect API, Dask workers) is stopped with it, also on a timeout."""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout:.0f} s:\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_every_system_validates_its_defaults_and_presets_without_shared(standalone):
    repo, env = standalone
    out = _python(repo, env, VALIDATE, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["errors"], "\n".join(result["errors"])
    assert "placement:smoke" in result["checked"] and len(result["checked"]) >= 4 * 20


def test_placement_smoke_runs_without_shared(standalone):
    repo, env = standalone
    started = time.perf_counter()
    out = _python(repo, env, RUN_CLI, timeout=540)
    seconds = time.perf_counter() - started
    assert out.returncode == 0, \
        f"exit {out.returncode} after {seconds:.0f} s:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    report = json.loads((repo / "report.json").read_text())
    assert report["system"] == "placement" and report["parameters"]["graph"] == "fx_resnet50"
    assert report["headline"]["ratio"] > 1.0
