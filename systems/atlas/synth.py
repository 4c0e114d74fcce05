"""Graph synthesis: one agent per component proposes that component's dependencies, the proposals are
composed into one component graph, cycles are broken (the weakest edge of each cycle, by the agent's
score, ties in a seeded order of names: never the component numbering), and the fixed per-component
metric template expands it to a causal graph over metrics.

The agent is pluggable: :class:`~.docs.DocParser` offline, :class:`LLMSynthesizer` for any
OpenAI-compatible chat model (the client comes from the task layer). A reply that is not JSON, names
unknown components, or an HTTP failure is counted and leaves that component without proposed
dependencies; it never stops the run.
"""
from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field

from mlsys_flows.errors import MlsysError

PROMPT = (
    "You are building the causal graph of a microservice deployment for root-cause analysis. Each "
    "component exports the metrics <name>.cpu, <name>.queue, <name>.latency and <name>.errors.\n\n"
    "Components (telemetry names): {names}\n\n"
    "Documentation of {me}:\n{page}\n\n"
    "Which components does {me} call or depend on at run time (so that their latency and errors "
    "propagate to {me})? Ignore components it no longer uses, components that call it, and mentions "
    "that are not dependencies. Reply with JSON only, using telemetry names exactly as listed: "
    '{{"component": "{me}", "depends_on": ["<name>", ...]}}')
SYSTEM = "You are a site reliability engineer. You answer with JSON only."


class ReplyError(MlsysError, ValueError):
    """A synthesizer reply that cannot be read as a dependency list."""


def parse_reply(text: str, names: list[str], me: int) -> tuple[list[int], list[str]]:
    """(dependencies, unknown names) from a model's reply. Accepts a bare JSON object, one in a
    ```json fence or inside prose, or a bare JSON list. Raises ReplyError when no dependency list can
    be read. Names are matched exactly, then case-insensitively; unknown ones and the component
    itself are returned separately (the caller counts them)."""
    text = re.sub(r"<think>.*?</think>", " ", text or "", flags=re.S)
    candidates = [m.group(1) for m in re.finditer(r"```(?:json)?\s*(.*?)```", text, re.S)]
    candidates += [text.strip()]
    m = re.search(r"\{.*\}", text, re.S)
    if m:
        candidates.append(m.group())
    data = None
    for cand in candidates:
        try:
            data = json.loads(cand)
            break
        except (ValueError, TypeError):
            continue
    if data is None:
        raise ReplyError(f"reply is not JSON: {text[:80]!r}")
    deps = data.get("depends_on", data.get("dependencies")) if isinstance(data, dict) else data
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise ReplyError(f"reply has no 'depends_on' list of names: {str(data)[:80]!r}")
    lower = {nm.lower(): i for i, nm in enumerate(names)}
    out, unknown = set(), []
    for d in deps:
        i = lower.get(d.strip().lower())
        if i is None or i == me:
            unknown.append(d)
        else:
            out.add(i)
    return sorted(out), unknown


class LLMSynthesizer:
    """One chat request per component (the paper's per-component agents). ``client`` is any object
    with ``complete(prompt, max_tokens, system)`` (systems.common.llm.OpenAICompatibleClient)."""

    name = "llm"

    def __init__(self, client, max_tokens: int = 400):
        self.client, self.max_tokens = client, max_tokens
        self.calls = 0

    def propose(self, component: int, page: str, names: list[str]) -> str:
        self.calls += 1
        return self.client.complete(PROMPT.format(names=", ".join(names), me=names[component], page=page),
                                    max_tokens=self.max_tokens, system=SYSTEM)


@dataclass
class Synthesis:
    """The composed component graph and what went wrong on the way."""

    edges: set[tuple[int, int]]          # (callee/cause, caller/effect), acyclic
    requests: int = 0
    malformed: int = 0                   # replies that were not a readable dependency list
    failed: int = 0                      # requests that raised (HTTP errors, timeouts)
    unknown_names: int = 0               # names in replies that are no component (or the component itself)
    cycle_edges_removed: int = 0
    problems: list[str] = field(default_factory=list)

    def stats(self) -> dict[str, float]:
        return {"synth_requests": self.requests, "malformed_replies": self.malformed, "failed_requests": self.failed,
                "unknown_names": self.unknown_names, "cycle_edges_removed": self.cycle_edges_removed}


def synthesize(agent, pages: list[str], names: list[str]) -> Synthesis:
    """Ask ``agent`` about every component and compose the answers into one acyclic graph.
    ``agent.propose`` returns a list of component indices (offline parser) or a reply text (LLM)."""
    syn = Synthesis(edges=set())
    evidence: dict[tuple[int, int], float] = {}
    for v, page in enumerate(pages):
        syn.requests += 1
        try:
            reply = agent.propose(v, page, names)
        except Exception as exc:   # an endpoint failure is one failed component, not a failed run
            syn.failed += 1
            syn.problems.append(f"{names[v]}: request failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if isinstance(reply, str):
            try:
                deps, unknown = parse_reply(reply, names, v)
            except ReplyError as exc:
                syn.malformed += 1
                syn.problems.append(f"{names[v]}: {exc}")
                continue
            if unknown:
                syn.unknown_names += len(unknown)
                syn.problems.append(f"{names[v]}: unknown names dropped: {unknown[:5]}")
        else:
            deps = list(reply)
            # an agent's score for each dependency it proposed (learned: the rule's logit; mentions, parser: the
            # sentences naming it): the cycle breaker drops the weakest edge of a cycle
            for u, e in (getattr(agent, "last_evidence", None) or {}).items():
                evidence[(u, v)] = float(e)
        syn.edges.update((u, v) for u in deps if u != v)
    syn.edges, removed = break_cycles(syn.edges, len(names), names, evidence)
    syn.cycle_edges_removed = len(removed)
    if removed:
        syn.problems.append(f"{len(removed)} edges removed to break cycles: "
                            + ", ".join(f"{names[u]}->{names[v]}" for u, v in sorted(removed)[:5]))
    return syn


# the seed of the cycle breaker's tie-break (a stable hash of the edge's component names, never their indices)
TIE_SEED = 7


def _tie(names: list[str], u: int, v: int, seed: int) -> int:
    return zlib.crc32(f"{seed}:{names[u]}->{names[v]}".encode())


def break_cycles(edges: set[tuple[int, int]], n: int, names: list[str] | None = None,
                 evidence: dict[tuple[int, int], float] | None = None,
                 seed: int = TIE_SEED) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """Make the graph acyclic by dropping, in each cycle, its weakest edge: edges are taken strongest first
    (``evidence``: the synthesizer's score for an edge, 0 where it gives none; ties in a seeded order from a
    stable hash of the two components' names) and an edge is kept unless the kept edges already lead from
    its head back to its tail. An edge on no cycle is always kept. The order depends on the evidence and
    the names only, never on the component numbering (components are numbered callers before callees, the
    true graph's order): relabelling the components relabels the removed edges. Returns (kept, removed)."""
    names = names if names is not None else [str(i) for i in range(n)]
    if len(names) != n:
        raise ValueError(f"names must give one name per component ({len(names)} for {n})")
    evidence = evidence or {}
    order = sorted(edges, key=lambda e: (-float(evidence.get(e, 0.0)), _tie(names, e[0], e[1], seed), names[e[0]],
                                         names[e[1]]))
    succ: dict[int, set[int]] = {i: set() for i in range(n)}

    def reaches(a: int, b: int) -> bool:
        seen, todo = {a}, [a]
        while todo:
            x = todo.pop()
            if x == b:
                return True
            for y in succ[x] - seen:
                seen.add(y)
                todo.append(y)
        return False

    removed: set[tuple[int, int]] = set()
    for u, v in order:
        if u == v or reaches(v, u):
            removed.add((u, v))
        else:
            succ[u].add(v)
    return set(edges) - removed, removed
