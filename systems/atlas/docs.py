"""Generated component documentation and the scripted parser (a reference synthesizer) that reads it.

Disjoint sets of phrasings write the pages. The *calibration* phrasings (``CALIBRATION``: the parser's
cue words were written around them), widened programmatically into the *training* phrasings
(``TRAINING``: the calibration set plus subject x frame x tail compositions and more prose and
non-dependency sentences), write the pages of calibration systems, on which a learned synthesizer fits
its decision rule; the *held-out* phrasings (``HELDOUT``, sharing no template and no four-word run of fixed
text with the training set: tests/unit/test_atlas_synth.py) write the evaluated pages. The sets are
lexically disjoint, not semantically, and not independent: the same project wrote both, the held-out set
served as a development set while the training set was widened, some held-out phrasings keep a training
phrasing's verb, and each held-out non-dependency phrasing has a near-paraphrase in the training set ("Do not
confuse it with {w}" ~ "Its name is similar to {w}, but they are unrelated"). A frozen set written outside both
(``OUTSIDE`` in tests/unit/test_atlas_synth.py) checks that the rule transfers beyond them.

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
# CALIBRATION phrasings. Those the parser's cue words cover ({d}: a dependency, in telemetry name or alias form)
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

# HELDOUT phrasings: the evaluated pages' (lexically disjoint from the training set and from the parser's cues, not
# independent of them: see the module docstring; a reader understands every one): dependencies with a verb of use, in prose only, and non-dependency mentions
_HELD_VERB = ("On each request it fetches {p} from {d}.", "{me} talks to {d} to obtain {p}.",
              "Before responding, it looks up {p} in {d}.", "It relies on {d} for {p}.",
              "All of its {p} are kept in {d}.", "It invokes {d} synchronously while handling a request.",
              "Lookups of {p} go through {d}.", "State is persisted in {d}.",
              "A client library for {d} is embedded in {me}.", "Retries against {d} are capped at three attempts.",
              # common verbs of real pages (some are the parser's cue words, written in new sentences)
              "It calls {d} through a pooled connection.", "{me} reads its {p} from {d} at startup.",
              "It uses {d} as a write-through store.")
_HELD_PROSE = ("Latency of {me} tracks that of {d}.", "When {d} is unavailable, {me} returns errors.",
               "Its runbook starts with checking {d}.", "Outages of {d} have taken {me} down twice.",
               "{d} is on its critical path.")
_HELD_DISTRACT = ("{w} is a consumer of its API.", "It was migrated off {w} in the last release.",
                  "There is no runtime link to {w}.", "The on-call rotation is shared with {w}.",
                  "Traffic from {w} is rate-limited at the edge.",
                  "Do not confuse it with {w}, which serves a different domain.",
                  "{w} subscribes to its change feed.", "It once read from {w}; that integration has since been retired.")

# TRAINING phrasings: the calibration set widened programmatically (a subject x a frame x a tail), for the
# learned synthesizer's calibration pages only (the parser's cue words stay written around CALIBRATION).
# Every generated template shares no template and no four-word run of fixed text with the held-out set
# (tests/unit/test_atlas_synth.py). Frames: {d} a dependency, {w} another component, {p} a purpose.
_SUBJECTS = ("It", "{me}", "This component")
_GEN_VERB = ("sends its requests to {d}", "depends on {d}", "calls {d}", "queries {d}", "reads data from {d}",
             "writes records to {d}", "forwards traffic to {d}", "publishes events to {d}", "keeps a cache in {d}",
             "needs {d} to serve a page", "gets {p} from {d}", "stores {p} in {d}", "opens connections to {d}",
             "uses {d}", "issues RPCs to {d}", "is a client of {d}", "waits on {d} for {p}", "consumes {d}")
_GEN_VERB_TAIL = ("", " on every call", " over HTTP", " for {p}", " in its request path")
_GEN_PROSE = ("Without {d}, {me} cannot answer.", "Every request of {me} waits for {d}.",
              "A slow {d} makes {me} slow as well.", "Errors in {d} surface as errors of {me}.",
              "{d} is a hard dependency.", "{d} is upstream of nothing but serves {me}.",
              "Page views need a reply from {d} first.", "If {d} is down, so is {me}.",
              "The {p} come from {d}.", "{d} holds the {p} it serves.")
_GEN_DISTRACT = ("{w} depends on {me}.", "{w} sends its requests to {me}.", "{me} stopped calling {w} years ago.",
                 "{me} never calls {w}.", "{w} is owned by another team.", "{w} shares a cluster with {me}.",
                 "{me} replaced {w} in the spring.", "{w} reads from {me} for {p}.", "{w} is deployed next to {me}.",
                 "{me} has nothing to do with {w}.", "Alerts for {w} go to the same pager.",
                 "{w} used to be a dependency, until the rewrite.", "Requests from {w} are served by {me}.",
                 "{w} was deprecated and is not called.", "Its name is similar to {w}, but they are unrelated.")


# template -> its group for the learned rule's cross-validation: a generated verb template's group is its frame
# (subject and tail vary the wording, not the relation), every other template is its own group
GROUP: dict[str, str] = {}


def _generated() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    verb = []
    for frame in _GEN_VERB:
        for subj in _SUBJECTS:
            for tail in _GEN_VERB_TAIL:
                if not ("{p}" in frame and "{p}" in tail):
                    verb.append(f"{subj} {frame}{tail}.")
                    GROUP[verb[-1]] = frame
    return tuple(verb), _GEN_PROSE, _GEN_DISTRACT


# (dependency phrasings with a verb of use, dependency phrasings in prose only, non-dependency mentions)
CALIBRATION = (_EASY, _HARD, _DISTRACT)
HELDOUT = (_HELD_VERB, _HELD_PROSE, _HELD_DISTRACT)
# the calibration set first
TRAINING = tuple(c + tuple(t for t in g if t not in c) for c, g in zip(CALIBRATION, _generated()))
PHRASINGS = {"calibration": CALIBRATION, "training": TRAINING, "heldout": HELDOUT}


def alias(name: str) -> str:
    """Prose form of a telemetry name: 'orders-db' -> 'the orders database'."""
    base, _, suffix = name.rpartition("-")
    word = {"svc": "service", "db": "database", "cache": "cache", "queue": "queue", "frontend": "frontend"}[suffix]
    return f"the {base} {word}"


def _cap(sentence: str) -> str:
    return "The" + sentence[3:] if sentence.startswith("the ") else sentence


def make_docs(s: Microservices, seed: int, omit: float, hard: float, stale: float, distractor: float,
              phrasings: str = "heldout", sources: list | None = None) -> list[str]:
    """One documentation page per component (see the module docstring for the imperfections), written
    with the ``phrasings`` set ("heldout": evaluated pages; "calibration": the parser's set; "training":
    the calibration set widened, a learned synthesizer's calibration pages). ``sources``: when a list,
    gets one {sentence: its template} per page."""
    if phrasings not in PHRASINGS:
        raise ValueError(f"phrasings must be one of {', '.join(PHRASINGS)} (got {phrasings!r})")
    easy_pool, hard_pool, distract_pool = PHRASINGS[phrasings]
    rng = np.random.default_rng([seed, 21])
    pages = []
    for v, (nm, kind, dom) in enumerate(zip(s.names, s.kinds, s.domains)):
        out = [f"{nm} is {_ROLE[kind].format(d=dom)}."]
        made: dict[str, str] = {}
        for u in s.calls[v]:
            if rng.random() < omit:
                continue
            d = s.names[u] if rng.random() < 0.6 else alias(s.names[u])
            pool = hard_pool if rng.random() < hard else easy_pool
            t = str(rng.choice(pool))
            out.append(_cap(t.format(d=d, me=nm, p=_PURPOSE[s.kinds[u]])))
            made[out[-1]] = t
        others = [u for u in range(s.n) if u != v and u not in s.calls[v]]
        if others and rng.random() < stale:   # a stale page: names a component it does not call
            w_i = int(rng.choice(others))
            w = s.names[w_i]
            # phrased like a true dependency (its purpose too): only the call graph says it is stale
            # (from the first three verb phrasings; on training pages from all of them, so that a few verbs
            # are not taught as mostly stale)
            t = str(rng.choice(easy_pool if phrasings == "training" else easy_pool[:3]))
            out.append(_cap(t.format(d=w, me=nm, p=_PURPOSE[s.kinds[w_i]])))
            made[out[-1]] = t
        if others and rng.random() < distractor:
            w = s.names[int(rng.choice(others))]
            t = str(rng.choice(distract_pool))
            out.append(_cap(t.format(w=w if rng.random() < 0.6 else alias(w), me=nm, p="its lookups")))
            made[out[-1]] = t
        if rng.random() < 0.5:
            out.append(f"It exports {nm}.cpu, {nm}.queue, {nm}.latency and {nm}.errors to the metrics pipeline.")
        head, rest = out[0], out[1:]
        rng.shuffle(rest)
        pages.append(" ".join([head, *rest]))
        if sources is not None:
            sources.append(made)
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


def sentences(page: str) -> list[str]:
    return [x for x in re.split(r"(?<=[.;])\s+", page) if x]


class DocParser:
    """The scripted reference synthesizer (written around the calibration phrasings): per component, the sentences of its page that carry a dependency cue
    word and no negation/ownership cue propose an edge to every component they name."""

    name = "doc_parser"

    def __init__(self):
        self.calls = 0

    def propose(self, component: int, page: str, names: list[str]) -> list[int]:
        self.calls += 1
        ev: dict[int, int] = {}   # ``last_evidence``: the cue sentences naming each (the cycle breaker's evidence)
        for sent in sentences(page):
            if _CUES.search(sent) and not _NEGATION.search(sent):
                for u in mentions(sent, names):
                    ev[u] = ev.get(u, 0) + 1
        ev.pop(component, None)
        self.last_evidence = ev
        return sorted(ev)
