"""One generator for every generated file: none may be stale, and the check sees a stale one."""
from __future__ import annotations

import shutil

from typer.testing import CliRunner

from mlsys_flows.docsgen import generate
from mlsys_flows.cli import app


def test_no_generated_file_is_stale():
    assert generate.stale() == [], "regenerate with: mlsys-flows generate"


def test_the_generator_covers_every_kind_of_generated_file():
    paths = set(generate.files())
    assert {"README.md", "docs/limits.md", "prefect.yaml", "infra/work-pools/process.json"} <= paths
    assert any(p.startswith("docs/") and p != "docs/limits.md" for p in paths)  # system pages' results blocks


def test_check_fails_on_a_hand_edited_file_and_generate_repairs_it(tmp_path, monkeypatch):
    for path in generate.files():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(generate.REPO / path, target)
    monkeypatch.setattr(generate, "REPO", tmp_path)
    assert generate.stale() == []
    (tmp_path / "docs" / "limits.md").write_text("edited by hand\n")
    (tmp_path / "prefect.yaml").unlink()
    assert sorted(generate.stale()) == ["docs/limits.md", "prefect.yaml"]
    result = CliRunner().invoke(app, ["generate", "--check"])
    assert result.exit_code != 0 and "docs/limits.md" in result.output
    assert sorted(generate.write()) == ["docs/limits.md", "prefect.yaml"]
    assert generate.stale() == [] and CliRunner().invoke(app, ["generate", "--check"]).exit_code == 0


def test_the_limits_page_shows_every_presets_value():
    from mlsys_flows.docsgen import limits

    page = limits.render_markdown()
    assert "PydanticUndefined" not in page
    assert "| `workers_grid` |" in page  # a list field (default_factory) with its values per scale
