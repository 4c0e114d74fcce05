"""`.venv-airflow`: Airflow 3.3.2 alone from PyPI, plus this project with ``--no-deps`` (Airflow cannot
share the project's venv: docs/platform.md, section 4). Built once per environment, like the project's
own venv: `make test` builds it before the suite (``python tests/airflow_env.py``) and the Airflow
tests reuse it while its stamps match: the Airflow requirements and Python for the venv, the packaging
files for the project's install. One builder at a time (a file lock)."""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AIRFLOW_REQUIREMENTS = ("apache-airflow==3.3.2",)


class AirflowUnavailable(RuntimeError):
    """Airflow could not be installed from PyPI (no index reachable): its tests skip."""


def _stamped(stamp: Path, want: str, build) -> None:
    """Run ``build`` unless ``stamp`` already holds ``want``; then record ``want``."""
    if stamp.exists() and stamp.read_text() == want:
        return
    build()
    stamp.write_text(want)


def airflow_venv() -> Path:
    """``.venv-airflow`` (or ``$MLSYS_FLOWS_AIRFLOW_VENV_DIR``), built or reused."""
    venv = Path(os.environ.get("MLSYS_FLOWS_AIRFLOW_VENV_DIR", REPO / ".venv-airflow"))
    py = venv / "bin" / "python"

    def build_airflow():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        done = subprocess.run([str(py), "-m", "pip", "install", "-q", *AIRFLOW_REQUIREMENTS],
                              capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise AirflowUnavailable(f"could not install {' '.join(AIRFLOW_REQUIREMENTS)} from PyPI into {venv}: "
                                     f"{(done.stdout + done.stderr).strip()[-800:]}")

    def install_project():  # our packaging: a failure here is a bug, not a missing index
        done = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO)],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"pip install --no-deps -e . in {venv}:\n{(done.stdout + done.stderr)[-3000:]}")

    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _stamped(venv / ".airflow-stamp", f"{sys.version}\n{AIRFLOW_REQUIREMENTS}", build_airflow)
        packaging = hashlib.sha256(b"".join((REPO / f).read_bytes() for f in ("pyproject.toml", "setup.py")))
        _stamped(venv / ".project-stamp", f"{REPO}\n{packaging.hexdigest()}", install_project)
    return venv


if __name__ == "__main__":  # `make airflow-venv`: a missing index only warns (the tests then skip)
    try:
        print(f"airflow venv ready: {airflow_venv()}")
    except AirflowUnavailable as exc:
        print(f"WARNING: {exc}; the Airflow tests will skip", file=sys.stderr)
