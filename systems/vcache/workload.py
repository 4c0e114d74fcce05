"""Workloads of the vCache flow: prompt streams with known equivalence classes (two prompts of a
class share one correct answer), so a cached response is right exactly when its class matches.

- ``sphere_stream``: the scale workload. Equivalence classes are points on the unit sphere in
  ``dim`` dimensions, grouped into topics (sibling classes close together, as "weather in Paris" and
  "weather in Rome" are); each class has its own spread, so one global similarity threshold is too
  strict for the loose classes and too lax for the crowded topics. Class popularity is Zipf.
- ``paraphrase_corpus``: real text. Question families (capital of a country, weather in a city, unit
  conversions, ...) with several paraphrase templates, light prefixes and suffixes; a class is one
  family with one slot value. Embedded with the real MiniLM model (``systems/common/text_embed``).
Pure numpy: no prefect/dask imports.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from mlsys_flows.systems.common.embeddings import zipf_weights


@dataclass
class Stream:
    vectors: np.ndarray   # float32 [n, dim], unit rows
    labels: np.ndarray    # int [n]: equivalence class of each prompt
    name: str

    def __len__(self) -> int:
        return len(self.labels)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def sphere_stream(n_queries: int, n_classes: int, dim: int, classes_per_topic: int, scale_min: float,
                  scale_max: float, within: float, zipf_s: float, seed: int, near_dup_share: float = 0.0,
                  near_dup_offset: float = 0.3, traffic: int | None = None) -> Stream:
    """``n_queries`` unit vectors. Topics are random directions; each topic has its own scale r
    (log-uniform in [scale_min, scale_max]): its classes' centres lie at distance about r from the
    topic direction and a class's prompts at distance about ``within`` x r from their centre. So in
    every topic the classes are separable by a similarity threshold, but the threshold differs from
    topic to topic (tight topics need a strict one, loose topics a lax one). Class popularity is
    Zipf(``zipf_s``) in a seeded order.

    Near-duplicates whose answers differ: a share ``near_dup_share`` of the classes are twins, each
    placed ``near_dup_offset`` x r from a partner class (a class that is not a twin, same scale r),
    with its own answer and popularity. With the offset below the spread ``within``, the two classes'
    prompts interleave, so one global threshold strict enough for the twins is far too strict for the
    rest, while a per-entry threshold can be strict at twins and lax elsewhere. The twins use their
    own random stream: with share 0 the stream is exactly the one without twins.

    ``traffic``: None draws the prompts (which class each query asks, and its noise) from the world's
    own random stream; an integer draws them from a separate one, ``[seed, 2, traffic]``: other
    traffic from the same world (same topics, classes, twins and popularity), e.g. the held-out
    traffic a deployment calibrates its static threshold on."""
    if not 0 <= near_dup_share < 1:
        raise ValueError(f"near_dup_share must lie in [0, 1) (got {near_dup_share})")
    rng = np.random.default_rng(seed)
    n_topics = max(1, -(-n_classes // classes_per_topic))
    topics = _unit(rng.standard_normal((n_topics, dim)))
    scale = np.exp(rng.uniform(np.log(scale_min), np.log(scale_max), n_topics))
    topic_of = np.arange(n_classes) // classes_per_topic
    r = scale[topic_of]
    centres = topics[topic_of] + r[:, None] * rng.standard_normal((n_classes, dim)) / np.sqrt(dim)
    n_twins = min(int(round(near_dup_share * n_classes)), n_classes - 1)
    if n_twins:
        trng = np.random.default_rng([seed, 1])
        order = trng.permutation(n_classes)
        twins, others = order[:n_twins], order[n_twins:]
        partner = others[trng.integers(0, len(others), n_twins)]
        r = r.copy()
        r[twins] = r[partner]
        centres[twins] = centres[partner] + (near_dup_offset * r[twins])[:, None] * \
            trng.standard_normal((n_twins, dim)) / np.sqrt(dim)
    popularity = zipf_weights(n_classes, zipf_s)[rng.permutation(n_classes)]
    qrng = rng if traffic is None else np.random.default_rng([seed, 2, int(traffic)])
    labels = qrng.choice(n_classes, size=n_queries, p=popularity)
    noise = qrng.standard_normal((n_queries, dim)) / np.sqrt(dim)
    vecs = _unit(centres[labels] + (within * r[labels])[:, None] * noise).astype(np.float32)
    return Stream(vecs, labels.astype(np.int64), "sphere")


# --- paraphrase sets ------------------------------------------------------------------------------
FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "capital": (("What is the capital of {x}?", "Which city is the capital of {x}?", "Name the capital city of {x}.",
                 "Tell me the capital of {x}.", "{x}'s capital is which city?", "What city serves as the capital of {x}?"),
                ("France", "Germany", "Japan", "Brazil", "Canada", "Kenya", "India", "Australia", "Egypt", "Mexico",
                 "Norway", "Peru")),
    "weather": (("What will the weather be like in {x} tomorrow?", "Tomorrow's forecast for {x}?",
                 "Is it going to rain in {x} tomorrow?", "How is the weather tomorrow in {x}?",
                 "Give me the weather forecast for {x} for tomorrow.", "Weather in {x} tomorrow, please."),
                ("Paris", "London", "Tokyo", "Chicago", "Sydney", "Cairo", "Toronto", "Berlin", "Mumbai", "Lima")),
    "convert": (("How many {x} are in a mile?", "Convert one mile to {x}.", "One mile equals how many {x}?",
                 "What is a mile in {x}?", "How do I express a mile in {x}?", "Mile to {x} conversion?"),
                ("kilometers", "meters", "feet", "yards", "inches", "centimeters", "nautical miles", "furlongs")),
    "recipe": (("How do I make {x}?", "Give me a recipe for {x}.", "What's the best way to cook {x}?",
                "Steps to prepare {x} at home?", "Can you explain how to make {x}?", "Recipe for homemade {x}, please."),
               ("pancakes", "lasagna", "guacamole", "sourdough bread", "fried rice", "tomato soup", "chocolate cake",
                "pad thai", "hummus", "risotto")),
    "translate": (("How do you say 'thank you' in {x}?", "Translate 'thank you' into {x}.",
                   "What is 'thank you' in {x}?", "'Thank you' in {x}?", "How would I thank someone in {x}?",
                   "Give me the {x} word for 'thank you'."),
                  ("Spanish", "French", "German", "Italian", "Japanese", "Korean", "Portuguese", "Swahili", "Dutch",
                   "Turkish")),
    "define": (("What does {x} mean?", "Define {x}.", "Give me the definition of {x}.", "What is the meaning of {x}?",
                "Explain the word {x}.", "What is {x}?"),
               ("photosynthesis", "inflation", "entropy", "democracy", "osmosis", "recursion", "metaphor",
                "gravity", "mitochondria", "blockchain", "irony", "latency")),
    "author": (("Who wrote {x}?", "Who is the author of {x}?", "{x} was written by whom?", "Name the writer of {x}.",
                "Which author wrote {x}?", "Tell me who wrote the book {x}."),
               ("Pride and Prejudice", "1984", "Moby-Dick", "War and Peace", "The Hobbit", "Don Quixote",
                "Hamlet", "The Odyssey", "Frankenstein", "Dracula")),
    "health": (("What are the symptoms of {x}?", "How do I know if I have {x}?", "Signs of {x}?",
                "List the common symptoms of {x}.", "What symptoms does {x} cause?", "How does {x} usually show up?"),
               ("flu", "diabetes", "migraine", "anemia", "asthma", "dehydration", "allergies", "covid",
                "food poisoning", "insomnia")),
    "sports": (("What are the rules of {x}?", "How do you play {x}?", "Explain the rules of {x}.",
                "How does a game of {x} work?", "Teach me to play {x}.", "Basic rules for {x}?"),
               ("chess", "basketball", "tennis", "cricket", "volleyball", "rugby", "badminton", "golf",
                "baseball", "hockey")),
    "travel": (("How long is the flight from New York to {x}?", "Flight time New York to {x}?",
                "How many hours does it take to fly from New York to {x}?", "Flying from New York to {x}: how long?",
                "What's the flight duration between New York and {x}?", "How long would I be in the air from New York to {x}?"),
               ("London", "Tokyo", "Rome", "Madrid", "Dubai", "Miami", "Seattle", "Bangkok", "Istanbul", "Dublin")),
}
PREFIXES = ("", "Quick question: ", "Hey, ", "I was wondering, ", "Please help: ")
SUFFIXES = ("", " Thanks!", " Keep it short.", " I need this for school.")


def paraphrase_corpus(n_classes: int, per_class_max: int, zipf_s: float, seed: int) -> tuple[list[str], np.ndarray]:
    """(texts, class of each text), in stream order, every text distinct (no exact repeats: a hit
    always needs a paraphrase). The first ``n_classes`` classes in a seeded order over all families;
    class popularity is Zipf(``zipf_s``): the most popular class gets ``per_class_max`` paraphrases
    (template x prefix x suffix, at most 120), the others proportionally fewer (at least one)."""
    rng = np.random.default_rng(seed)
    classes = [(fam, x) for fam, (_, values) in FAMILIES.items() for x in values]
    if not 1 <= n_classes <= len(classes):
        raise ValueError(f"n_classes must lie in [1, {len(classes)}] (got {n_classes})")
    order = rng.permutation(len(classes))[:n_classes]
    weights = zipf_weights(n_classes, zipf_s)
    counts = np.maximum(1, np.round(per_class_max * weights / weights[0])).astype(int)
    texts, labels = [], []
    for c, k in enumerate(order):
        fam, x = classes[k]
        variants = [p + t.format(x=x) + s for t, p, s in itertools.product(FAMILIES[fam][0], PREFIXES, SUFFIXES)]
        pick = rng.choice(len(variants), size=min(int(counts[c]), len(variants)), replace=False)
        texts += [variants[i] for i in pick]
        labels += [c] * len(pick)
    perm = rng.permutation(len(texts))
    return [texts[i] for i in perm], np.asarray(labels, np.int64)[perm]


def max_paraphrase_classes() -> int:
    return sum(len(v) for _, v in FAMILIES.values())


def corpus_stream(vectors: np.ndarray, labels: np.ndarray, name: str = "minilm") -> Stream:
    return Stream(np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(labels, np.int64), name)
