from pathlib import Path

from mlsys_flows import registry

ROOT = Path(__file__).resolve().parents[2]


def test_readme_generated_sections_are_current(monkeypatch):
    """The system table matches the registry and the measured table matches the RunReports."""
    from mlsys_flows import readme

    monkeypatch.chdir(ROOT)
    text = (ROOT / "README.md").read_text()
    assert readme.render(text) == text, "regenerate with: python -m mlsys_flows.readme"
    assert "<!-- results:start -->" in text


def test_every_implemented_system_has_a_docs_page():
    for spec in registry.implemented():
        assert (ROOT / "docs" / f"{spec.name}.md").exists(), spec.name
