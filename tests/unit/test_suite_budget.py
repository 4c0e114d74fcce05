"""The suite's budget for one test body (tests/conftest.py TEST_BUDGET_S): a test that passes but takes
longer fails, naming the budget. Checked in a child pytest with the budget set below the test's own sleep."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_a_passing_test_over_the_budget_fails(tmp_path):
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_slow():\n    time.sleep(0.5)\n\n"
                                           "def test_quick():\n    pass\n")
    env = {**os.environ, "MLSYS_TEST_BUDGET_S": "0.2", "PYTHONPATH": str(TESTS)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           str(tmp_path / "test_slow.py")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed" in proc.stdout and "over the 0.2 s one test may take" in proc.stdout, proc.stdout


def test_a_test_marked_with_a_larger_budget_passes_within_it(tmp_path):
    (tmp_path / "test_slow.py").write_text("import time\nimport pytest\n\n"
                                           "@pytest.mark.budget(30, reason='an end-to-end run')\n"
                                           "def test_slow():\n    time.sleep(0.5)\n")
    env = {**os.environ, "MLSYS_TEST_BUDGET_S": "0.2", "PYTHONPATH": str(TESTS)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           str(tmp_path / "test_slow.py")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout
