"""The installable wheel (issue 33): `python -m build` (sdist, then the wheel from it), the wheel installed
into a clean venv, and, in an empty folder, `run` (smoke), `bench`, `report` and `deploy` (into a new
project folder) work from it: they read the flows, work-pool templates and committed results the wheel
carries (``settings.project_root()``), not this checkout.

The venv borrows this venv's packages (torch, prefect, dask, ...) rather than downloading them: a ``.pth``
line puts this venv's site-packages on its path after its own, and the wheel is installed with
``--no-deps``. A plain path entry runs none of the ``.pth`` files there, so this venv's editable install
of mlsys_flows (a ``.pth``-installed finder) stays invisible: ``import mlsys_flows`` is the wheel. The
console scripts of the borrowed dependencies (``prefect``, ``dask``), which pip would have installed with
them, are written into the venv's bin/ from their entry points."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from importlib.metadata import distribution
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "moetuner"  # a short smoke flow
BORROWED_SCRIPTS = ("prefect", "dask", "distributed", "uvicorn")  # distributions whose console scripts are used


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """(venv folder, an empty working folder, the environment of a shell in that venv)."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    # not from the checkout: its ignored build/ folder would shadow the `build` package
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)], cwd=base,
                           env=dict(os.environ), capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    assert "absent from the `packages`" not in built.stdout + built.stderr  # every folder of package data listed
    wheels = sorted(dist.glob("mlsys_flows-*.whl"))
    assert len(wheels) == 1, wheels
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=base, env=dict(os.environ))
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    borrowed = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_borrowed_site_packages.pth").write_text("".join(f"{p}\n" for p in sorted(borrowed)))
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheels[0])],
         cwd=base, env=dict(os.environ))
    for dist in BORROWED_SCRIPTS:
        for ep in distribution(dist).entry_points.select(group="console_scripts"):
            module, _, attr = ep.value.partition(":")
            script = venv / "bin" / ep.name
            script.write_text(f"#!{py}\nimport sys\nfrom {module} import {attr.split('.')[0]}\n"
                              f"sys.exit({attr}())\n")
            script.chmod(0o755)
    work = base / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLSYS_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin", VIRTUAL_ENV=str(venv))
    return venv, work, env


def test_the_installed_package_is_the_wheel_with_its_project_files(wheel_venv):
    venv, work, env = wheel_venv
    out = _run([str(venv / "bin/python"), "-c", "import mlsys_flows.settings as s, mlsys_flows.platform.infra as i; "
                "print(s.project_root(), s.is_checkout(), len(i.dask_specs()))"], cwd=work, env=env)
    root, checkout, specs = out.split()
    assert Path(root).is_relative_to(venv) and checkout == "False" and int(specs) > 0
    assert (Path(root) / "flows" / f"{SYSTEM}.py").is_file()
    assert (Path(root) / "benchmarks" / "results" / f"{SYSTEM}-quick.json").is_file()


def test_run_and_bench_in_an_empty_folder(wheel_venv, prefect_api):
    """Against a running API (the session's), as with `mlsys-flows server` up: the embedded API's first
    run is test_standalone's, and each command here would boot one (about 7 s each)."""
    from prefect.settings import PREFECT_API_URL

    from mlsys_flows.blocks import DaskCluster

    venv, work, env = wheel_venv
    env = {**env, "PREFECT_API_URL": PREFECT_API_URL.value()}
    cli = str(venv / "bin" / "mlsys-flows")
    # each command's embedded cluster (started by the wheel's code) with one worker, named as a user names a
    # saved block: the default's second worker would cost each command a worker start (torch, Prefect and
    # the flow imported) on a loaded machine, and `run`'s default cluster is test_standalone's
    DaskCluster(n_workers=1).save("wheel-one-worker", overwrite=True)
    one = ["--cluster", "wheel-one-worker"]
    _run([cli, "run", SYSTEM, "--scale", "smoke", *one, "--json", "run.json"], cwd=work, env=env)
    assert json.loads((work / "run.json").read_text())["system"] == SYSTEM
    _run([cli, "bench", SYSTEM, "--scale", "smoke", *one, "--json", "bench.json"], cwd=work, env=env)
    assert (work / "bench.json").exists()


def test_report_reads_the_committed_results_the_wheel_carries(wheel_venv):
    venv, work, env = wheel_venv
    _run([str(venv / "bin" / "mlsys-flows"), "report", "--out", "catalogue"], cwd=work, env=env)
    index = (work / "catalogue" / "index.html").read_text()
    assert SYSTEM in index and "recd" in index


def test_deploy_into_a_new_project_folder(wheel_venv, prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    venv, work, env = wheel_venv
    api_url = PREFECT_API_URL.value()
    project = work / "my-project"
    _run([str(venv / "bin" / "mlsys-flows"), "deploy", SYSTEM, "--project-dir", str(project), "--api-url", api_url],
         cwd=work, env={**env, "PREFECT_API_URL": api_url})
    assert yaml.safe_load((project / "prefect.yaml").read_text())["deployments"]
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(f"{SYSTEM}/{SYSTEM}")
    directory = Path(dep.pull_steps[0]["prefect.deployments.steps.set_working_directory"]["directory"])
    assert directory.is_relative_to(venv), directory  # the wheel's copy of flows/, not the checkout
    # what the process worker's run does there: load the entrypoint (with the wheel's modules)
    out = _run([str(venv / "bin/python"), "-c", "import sys; from prefect.flows import load_flow_from_entrypoint; "
                f"f = load_flow_from_entrypoint({dep.entrypoint!r}); import mlsys_flows; print(f.name, mlsys_flows.__file__)"],
               cwd=directory, env=env)
    name, package = out.split()[-2:]
    assert name == SYSTEM and Path(package).is_relative_to(venv)
