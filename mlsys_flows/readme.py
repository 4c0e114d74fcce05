"""Regenerate the README's generated sections: ``python -m mlsys_flows.readme``.

- the system table, from the registry;
- the results, from the RunReports that ``mlsys-flows bench NAME --scale quick`` wrote
  to ``benchmarks/results/`` (no number is typed in).
"""
import json
from pathlib import Path

from mlsys_flows import registry

SECTIONS = {"systems": registry.markdown_table}
RESULTS = Path("benchmarks/results")


def results_table(results: Path = RESULTS) -> str:
    lines = ["| system | headline (technique vs baseline) | kind | ratio (range over repeats) | paper | "
             "vs strongest baseline | run | device |",
             "|---|---|---|---|---|---|---|---|"]
    for spec in registry.implemented():
        path = results / f"{spec.name}-quick.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        h, s = r["headline"], r["headline"]["vs_strongest"]
        paper = f"{h['paper']:.2f}x" if h["paper"] else "n/a"
        spread = f" ({h['range'][0]:.2f}-{h['range'][1]:.2f})" if h["range"] else ""
        lines.append(f"| [{spec.name}](docs/{spec.name}.md) | {h['metric']} ({h['technique']} vs {h['baseline']}) | "
                     f"{h['kind']} | **{h['ratio']:.2f}x**{spread} | {paper} | {s['ratio']:.2f}x vs {s['baseline']} | "
                     f"`{r['run_id'][:8]}` | {r['environment']['device']}, {r['environment']['cores']} cores |")
    return "\n".join(lines)


SECTIONS["results"] = results_table


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
