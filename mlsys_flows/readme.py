"""Regenerate the README's generated sections: ``python -m mlsys_flows.readme``.

- the system table, from the registry;
- the measured results, from the RunReports that ``mlsys-flows bench NAME --scale quick`` wrote
  to ``benchmarks/results/`` (no number is typed in).
"""
import json
from pathlib import Path

from mlsys_flows import registry

SECTIONS = {"systems": registry.markdown_table}
RESULTS = Path("benchmarks/results")


def measured_table(results: Path = RESULTS) -> str:
    lines = ["| system | headline (technique vs baseline) | measured | paper | run | device |",
             "|---|---|---|---|---|---|"]
    for spec in registry.implemented():
        path = results / f"{spec.name}-quick.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        h = r["headline"]
        paper = f"{h['paper_ratio']:.2f}x" if h["paper_ratio"] else "n/a"
        lines.append(f"| [{spec.name}](docs/{spec.name}.md) | {h['metric']} ({h['technique']} vs {h['baseline']}) | "
                     f"**{h['measured_ratio']:.2f}x** | {paper} | `{r['run_id'][:8]}` | "
                     f"{r['environment']['device']}, {r['environment']['cores']} cores |")
    return "\n".join(lines)


SECTIONS["measured"] = measured_table


def render(text: str) -> str:
    for name, make in SECTIONS.items():
        start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1]
        text = f"{head}{start}{make()}\n{end}{tail}"
    return text


def update(path: Path = Path("README.md")) -> None:
    path.write_text(render(path.read_text()))


if __name__ == "__main__":
    update()
