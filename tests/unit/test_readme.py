from pathlib import Path

from mlsys_flows import registry

ROOT = Path(__file__).resolve().parents[2]


def test_readme_generated_sections_are_current(monkeypatch):
    """The system table matches the registry and the measured table matches the RunReports."""
    from mlsys_flows.docsgen import readme

    monkeypatch.chdir(ROOT)
    text = (ROOT / "README.md").read_text()
    assert readme.render(text) == text, "regenerate with: mlsys-flows generate"
    assert "<!-- results:start -->" in text


def test_every_system_has_a_docs_page():
    for spec in registry.all_specs():
        assert (ROOT / "docs" / f"{spec.name}.md").exists(), spec.name


def test_every_docs_page_shows_its_committed_results(monkeypatch):
    """Each system page carries a generated block with every claim of its quick RunReport."""
    from mlsys_flows.docsgen import readme

    monkeypatch.chdir(ROOT)
    for spec in registry.all_specs():
        text = (ROOT / "docs" / f"{spec.name}.md").read_text()
        assert "<!-- results:start -->" in text, f"docs/{spec.name}.md has no generated results block"
        assert readme.render_system(spec.name, text) == text, \
            f"docs/{spec.name}.md results are stale: mlsys-flows generate"
