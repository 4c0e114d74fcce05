"""Regenerate the README's system table from the registry: ``python -m mlsys_flows.readme``."""
from pathlib import Path

from mlsys_flows import registry

START, END = "<!-- systems:start -->\n", "<!-- systems:end -->"


def update(path: Path = Path("README.md")) -> None:
    text = path.read_text()
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{START}{registry.markdown_table()}\n{END}{tail}")


if __name__ == "__main__":
    update()
