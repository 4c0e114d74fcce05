"""BAGEL's text workload: a generated corpus of short passages about cities, each passage about one
(city, aspect) pair (history, food, climate, football, ...), written from templates with seeded
fillers, so relevance is known by construction. A query asks about one city under one aspect
(several words of that aspect's vocabulary) and, in a short tail, under a second aspect whose
passages lie far away in the embedding space: the query's embedding sits near the first cluster and
the dense retriever's neighbourhood misses the second.

Graded relevance of a passage to the query (city c, aspects A and B): 1 for (c, A) and (c, B),
``same_city`` for c under another aspect, ``same_aspect`` for another city under A or B, else 0.
Embedded with the real MiniLM model (``systems/common/text_embed``) by the caller. Pure: no
prefect/dask imports.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import CITIES
from .workload import Query

# aspect -> (passage templates, fillers, the query's long question, the short tail naming the aspect)
ASPECTS: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, ...]], str, str]] = {
    "history": (
        ("{c} was founded {era}, and its {building} still recalls the reign of {ruler}.",
         "Historians say {c} changed hands during {war}; the {building} survived the siege.",
         "The chronicles of {c} describe {ruler} who fortified the {building} {era}."),
        {"era": ("by Roman settlers", "as a medieval trading post", "in the twelfth century", "after an ancient treaty"),
         "building": ("castle walls", "old cathedral", "hilltop fortress", "city gates", "royal palace"),
         "ruler": ("a medieval king", "rival dynasties", "a crusader order", "an ancient empire"),
         "war": ("a long dynastic war", "the wars of succession", "a colonial conquest", "a civil war")},
        "What is the history of {c}: who founded the city, which kings and empires ruled it, which wars and sieges "
        "shaped its castle and cathedral in medieval times?", "and its history"),
    "food": (
        ("In {c}, locals eat {dish} with {side}, and every {place} serves {drink}.",
         "The food of {c} is known for {dish}; cooks add {side} and diners order {drink}.",
         "A typical dinner in {c}: {dish}, {side} on the side, and {drink} at a {place}."),
        {"dish": ("grilled sardines", "slow-cooked stew", "spiced dumplings", "fried pastries", "fish soup"),
         "side": ("fresh bread", "roasted peppers", "sticky rice", "pickled vegetables"),
         "place": ("tavern", "street stall", "family restaurant", "market kitchen"),
         "drink": ("sweet tea", "local wine", "strong coffee", "fruit juice")},
        "Which dishes and drinks should I eat in {c}: what do locals cook for dinner, which restaurants, street "
        "food stalls and recipes are famous?", "and its food"),
    "climate": (
        ("{c} has {summer} summers and {winter} winters, with most rain falling in {month}.",
         "The weather in {c} is {summer} in summer; in {month} {winter} days and fog are common.",
         "Climate records for {c} show {winter} winters, {summer} summers and storms every {month}."),
        {"summer": ("hot and dry", "mild and humid", "cool and windy", "warm and sunny"),
         "winter": ("snowy", "rainy", "freezing", "grey and mild"),
         "month": ("November", "April", "January", "September")},
        "What is the climate and weather of {c} like: how hot are the summers, how cold and rainy the winters, "
        "when do storms, snow and fog come?", "and its weather"),
    "football": (
        ("The football club of {c} won the {trophy} after a {result} in front of {crowd} fans.",
         "Supporters in {c} still sing about the {result} that brought the {trophy} home; the striker scored twice.",
         "{c}'s football team plays in a stadium for {crowd} fans and chases the {trophy} every season."),
        {"trophy": ("national cup", "league title", "continental trophy", "derby shield"),
         "result": ("penalty shootout", "late comeback", "three-goal win", "goalless draw"),
         "crowd": ("thirty thousand", "fifty thousand", "twenty thousand", "eighty thousand")},
        "How good is the football club of {c}: which trophies and league titles has the team won, who scores the "
        "goals, how big is the stadium and its crowd of fans?", "and its football"),
    "transport": (
        ("The metro of {c} has {lines} lines; {vehicle} connect the airport with the central station.",
         "Commuters in {c} buy a {ticket} for the {vehicle} and the metro, and trains leave for the airport hourly.",
         "Public transport in {c}: {lines} metro lines, {vehicle} and a {ticket} valid on every route."),
        {"lines": ("two", "four", "six", "nine"),
         "vehicle": ("trams", "electric buses", "ferries", "cable cars"),
         "ticket": ("day pass", "monthly card", "contactless ticket", "tourist travel card")},
        "How does public transport in {c} work: metro lines, trams and buses, tickets and passes, and trains "
        "between the airport and the central station?", "and its transport"),
    "economy": (
        ("The economy of {c} relies on {industry}; its port exports {goods} and employs {share} of workers.",
         "Banks and firms in {c} invest in {industry}, and exports of {goods} grew last year.",
         "{c}'s businesses earn most from {industry}, while {goods} make up {share} of exports."),
        {"industry": ("shipping and logistics", "software start-ups", "textile factories", "tourism and hotels"),
         "goods": ("machinery", "cork and timber", "coffee beans", "electronics"),
         "share": ("a quarter", "a third", "half", "a tenth")},
        "What drives the economy of {c}: which industries, companies and banks, which exports and trade, how many "
        "jobs and how much growth?", "and its economy"),
    "music": (
        ("{c} hosts a {genre} festival every {season}, where {band} play until dawn.",
         "Musicians in {c} are known for {genre}; {band} perform in the concert hall each {season}.",
         "The concert halls of {c} fill every {season} when {band} bring {genre} to the stage."),
        {"genre": ("jazz", "folk song", "classical", "electronic"),
         "band": ("local orchestras", "touring bands", "street musicians", "young choirs"),
         "season": ("spring", "summer", "autumn", "winter")},
        "What music can I hear in {c}: which concerts, festivals, orchestras and bands, which songs and genres "
        "are popular?", "and its music"),
    "nature": (
        ("Hikers leave {c} for {feature}, where trails pass {animal} and {plant}.",
         "Around {c}, the national park protects {feature}; rangers count {animal} among the {plant}.",
         "Near {c}, walkers climb to {feature} and watch {animal} in fields of {plant}."),
        {"feature": ("a volcanic lake", "a river gorge", "coastal cliffs", "pine forests"),
         "animal": ("wild goats", "nesting seabirds", "deer", "eagles"),
         "plant": ("wild flowers", "old oaks", "ferns", "lavender")},
        "Where can I go hiking in the nature around {c}: national parks, trails, mountains and lakes, wild animals, "
        "birds and plants?", "and its nature"),
}


@dataclass
class TextCorpus:
    texts: list[str]           # passage texts
    city: np.ndarray           # city index of every passage
    aspect: np.ndarray         # aspect index of every passage
    aspects: tuple[str, ...]
    cities: tuple[str, ...]
    slot: np.ndarray | None = None   # index of every passage within its (city, aspect) pair

    def subset(self, idx: np.ndarray) -> "TextCorpus":
        """The passages ``idx`` (in that order) as a corpus of their own."""
        idx = np.asarray(idx, np.int64)
        return TextCorpus([self.texts[i] for i in idx], self.city[idx], self.aspect[idx], self.aspects, self.cities,
                          None if self.slot is None else self.slot[idx])


def make_corpus(n_cities: int, per_pair: int, seed: int) -> TextCorpus:
    """``per_pair`` passages for each (city, aspect) pair of the first ``n_cities`` cities: a template and
    its fillers drawn at random (seeded per pair), distinct texts within a pair where the templates allow.
    Nested: the corpus with fewer passages per pair is the first ``per_pair`` of every pair of a larger
    one (``slot`` < per_pair), so one embedding of the largest corpus serves every smaller one."""
    if not 1 <= n_cities <= len(CITIES):
        raise ValueError(f"n_cities must be in 1..{len(CITIES)}")
    texts, city, aspect, slot = [], [], [], []
    names = tuple(ASPECTS)
    for ci, c in enumerate(CITIES[:n_cities]):
        for ai, a in enumerate(names):
            rng = np.random.default_rng([seed, ci, ai])
            templates, fillers, _, _ = ASPECTS[a]
            seen: set[str] = set()
            for s in range(per_pair):
                for _try in range(20):
                    t = templates[rng.integers(len(templates))]
                    text = t.format(c=c, **{k: v[rng.integers(len(v))] for k, v in fillers.items()})
                    if text not in seen:
                        break
                seen.add(text)
                texts.append(text)
                city.append(ci)
                aspect.append(ai)
                slot.append(s)
    return TextCorpus(texts, np.asarray(city, np.int64), np.asarray(aspect, np.int64), names, CITIES[:n_cities],
                      np.asarray(slot, np.int64))


def query_text(city: str, near: str, far: str) -> str:
    """The query: the near aspect's long question about ``city``, then the far aspect's short tail."""
    return ASPECTS[near][2].format(c=city).rstrip("?") + f", {ASPECTS[far][3]}?"


def text_queries(corpus: TextCorpus, X: np.ndarray, n_queries: int, far_quantile: float, same_city: float,
                 same_aspect: float, seed: int) -> list[tuple[Query, str]]:
    """Queries as (Query without its embedding, query text): a random city and an ordered aspect pair whose
    centroids (in ``X``) are at least the ``far_quantile`` quantile of all aspect-pair distances apart.
    The caller embeds the texts and sets ``Query.q``."""
    rng = np.random.default_rng(seed + 1)
    k = len(corpus.aspects)
    cent = np.stack([X[corpus.aspect == a].mean(0) for a in range(k)])
    dist = np.linalg.norm(cent[:, None] - cent[None], axis=-1)
    iu = np.triu_indices(k, 1)
    cut = np.quantile(dist[iu], far_quantile)
    pairs = [(int(a), int(b)) for a, b in zip(*iu) if dist[a, b] >= cut]
    out = []
    for _ in range(n_queries):
        a, b = pairs[rng.integers(len(pairs))]
        if rng.random() < 0.5:
            a, b = b, a
        c = int(rng.integers(len(corpus.cities)))
        here = corpus.city == c
        near = np.flatnonzero(here & (corpus.aspect == a))
        far = np.flatnonzero(here & (corpus.aspect == b))
        rel = np.zeros(len(corpus.texts))
        rel[(corpus.aspect == a) | (corpus.aspect == b)] = same_aspect
        rel[here] = same_city
        rel[near] = rel[far] = 1.0
        q = Query(np.zeros(X.shape[1]), rel, np.concatenate([near, far]), near, rng.standard_normal(len(rel)), (a, b))
        out.append((q, query_text(corpus.cities[c], corpus.aspects[a], corpus.aspects[b])))
    return out


def text_workload(n_cities: int, per_pair: int, n_queries: int, far_quantile: float, same_city: float,
                  same_aspect: float, seed: int, embed) -> dict:
    """The corpus, embedded by ``embed(texts) -> [n, dim]`` (MiniLM in the flow), and the queries with their
    embedded texts: {'X', 'queries', 'texts', 'query_texts'}."""
    corpus = make_corpus(n_cities, per_pair, seed)
    X = np.asarray(embed(corpus.texts), np.float64)
    pairs = text_queries(corpus, X, n_queries, far_quantile, same_city, same_aspect, seed)
    Q = np.asarray(embed([t for _, t in pairs]), np.float64)
    for (q, _), v in zip(pairs, Q):
        q.q = v
    return {"X": X, "queries": [q for q, _ in pairs], "texts": corpus.texts, "query_texts": [t for _, t in pairs]}
