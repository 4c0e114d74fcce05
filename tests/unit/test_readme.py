from pathlib import Path

from mlsys_flows import registry

ROOT = Path(__file__).resolve().parents[2]


def test_readme_system_table_matches_registry():
    text = (ROOT / "README.md").read_text()
    start, end = "<!-- systems:start -->\n", "<!-- systems:end -->"
    table = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert table == registry.markdown_table(), "regenerate with: mlsys-flows list --markdown"


def test_every_implemented_system_has_a_docs_page():
    for spec in registry.implemented():
        assert (ROOT / "docs" / f"{spec.name}.md").exists(), spec.name
