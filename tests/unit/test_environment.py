"""What a RunReport says about the machine (systems/common/environment.py)."""
from __future__ import annotations

import subprocess
import sys

from mlsys_flows.systems.common.environment import nvidia_gpus


def test_capturing_the_environment_does_not_import_torch():
    """A flow process runs no torch work (its tasks run on Dask workers); importing torch only to ask
    for CUDA took 1.2 s of every run's fixed cost (issue 42 item 4)."""
    code = ("import sys; from mlsys_flows.systems.common.environment import capture; "
            "env = capture('placement'); assert env.device, env; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_driver_lists_the_gpus_a_process_may_use(tmp_path, monkeypatch):
    for i, model in enumerate(["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]):
        board = tmp_path / f"0000:0{i}:00.0"
        board.mkdir()
        (board / "information").write_text(f"Model: \t\t {model}\nIRQ:   42\n")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvidia_gpus(tmp_path) == ["NVIDIA H100 80GB HBM3"] * 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert nvidia_gpus(tmp_path) == ["NVIDIA H100 80GB HBM3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert nvidia_gpus(tmp_path) == []
    assert nvidia_gpus(tmp_path / "absent") == []
