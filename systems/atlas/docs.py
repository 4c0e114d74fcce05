"""Generated component documentation and the offline synthesizer that reads it.

Each component's page describes what it does and names its dependencies (its callees) in varied
phrasings. Like real documentation it is imperfect: some dependencies are not mentioned
(``omit``), some are described only in prose without a call verb (``hard``), some pages are stale and
name a component the service no longer calls (``stale``), and pages mention other components in
sentences that are not dependencies (negations, deprecations, ownership, callers: ``distractor``).
"""
from __future__ import annotations

import re

import numpy as np

from .model import Microservices

_PURPOSE = {"cache": "hot-key lookups", "db": "persistent records", "queue": "asynchronous events",
            "service": "business logic", "frontend": "user traffic"}
_ROLE = {"frontend": "the entry point that serves {d} traffic from browsers and apps",
         "service": "a stateless service that owns the {d} domain",
         "cache": "an in-memory cache holding {d} data",
         "db": "the database of record for {d}",
         "queue": "a message queue carrying {d} events"}
# phrasings the parser's cue words cover ({d}: a dependency, in telemetry name or alias form)
_EASY = ("It calls {d} over gRPC.", "Requests are forwarded to {d}.", "{me} depends on {d} for {p}.",
         "It reads from and writes to {d}.", "Hot keys are cached in {d}.", "Events are published to {d}.",
         "It uses {d} for {p}.", "Downstream dependencies: {d}.", "It sends requests to {d} on every page view.",
         "It queries {d} for {p}.")
# phrasings without a call verb: a reader understands them, the keyword parser does not
_HARD = ("{d} answers its {p}.", "Nothing is served until {d} has responded.", "{d} sits directly behind it.",
         "If {d} slows down, so does {me}.")
_DISTRACT = ("Unlike older releases, it does not call {w}.", "It no longer uses {w} (deprecated last year).",
             "It is maintained by the team that owns {w}.", "{w} calls it for {p}.",
             "Formerly it depended on {w}; that path was removed.", "Its dashboards sit next to those of {w}.",
             "Calls from {w} arrive through the gateway.")


def alias(name: str) -> str:
    """Prose form of a telemetry name: 'orders-db' -> 'the orders database'."""
    base, _, suffix = name.rpartition("-")
    word = {"svc": "service", "db": "database", "cache": "cache", "queue": "queue", "frontend": "frontend"}[suffix]
    return f"the {base} {word}"


def _cap(sentence: str) -> str:
    return "The" + sentence[3:] if sentence.startswith("the ") else sentence


def make_docs(s: Microservices, seed: int, omit: float, hard: float, stale: float, distractor: float) -> list[str]:
    """One documentation page per component (see the module docstring for the imperfections)."""
    rng = np.random.default_rng([seed, 21])
    pages = []
    for v, (nm, kind, dom) in enumerate(zip(s.names, s.kinds, s.domains)):
        out = [f"{nm} is {_ROLE[kind].format(d=dom)}."]
        for u in s.calls[v]:
            if rng.random() < omit:
                continue
            d = s.names[u] if rng.random() < 0.6 else alias(s.names[u])
            pool = _HARD if rng.random() < hard else _EASY
            out.append(_cap(str(rng.choice(pool)).format(d=d, me=nm, p=_PURPOSE[s.kinds[u]])))
        others = [u for u in range(s.n) if u != v and u not in s.calls[v]]
        if others and rng.random() < stale:   # a stale page: names a component it does not call
            w = s.names[int(rng.choice(others))]
            out.append(str(rng.choice(_EASY[:3])).format(d=w, me=nm, p="legacy lookups"))
        if others and rng.random() < distractor:
            w = s.names[int(rng.choice(others))]
            out.append(_cap(str(rng.choice(_DISTRACT)).format(w=w if rng.random() < 0.6 else alias(w), p="its lookups")))
        if rng.random() < 0.5:
            out.append(f"It exports {nm}.cpu, {nm}.queue, {nm}.latency and {nm}.errors to the metrics pipeline.")
        head, rest = out[0], out[1:]
        rng.shuffle(rest)
        pages.append(" ".join([head, *rest]))
    return pages


_CUES = re.compile(r"\b(calls?|forwarded|depends|reads|writes|cached|published|uses|dependencies|sends|queries)\b", re.I)
_NEGATION = re.compile(r"\b(not|no longer|deprecated|formerly|removed|maintained|owns|calls it)\b", re.I)


def mentions(sentence: str, names: list[str]) -> list[int]:
    """Components a sentence names, by telemetry name or prose alias (longest match first)."""
    found, text = [], sentence.lower()
    for i, nm in sorted(enumerate(names), key=lambda t: -len(t[1])):
        for form in (nm.lower(), alias(nm)[4:].lower()):
            pat = re.compile(r"(?<![\w-])" + re.escape(form) + r"(?![\w-]|\.(cpu|queue|latency|errors))")
            if pat.search(text):
                found.append(i)
                text = pat.sub(" ", text)
                break
    return sorted(found)


class DocParser:
    """The offline synthesizer: per component, the sentences of its page that carry a dependency cue
    word and no negation/ownership cue propose an edge to every component they name."""

    name = "doc_parser"

    def __init__(self):
        self.calls = 0

    def propose(self, component: int, page: str, names: list[str]) -> list[int]:
        self.calls += 1
        deps: set[int] = set()
        for sent in re.split(r"(?<=[.;])\s+", page):
            if _CUES.search(sent) and not _NEGATION.search(sent):
                deps.update(mentions(sent, names))
        deps.discard(component)
        return sorted(deps)
