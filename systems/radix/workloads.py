"""Request sets with the sharing patterns of the paper's benchmarks (SGLang, Sec. 6 and Fig. 8):
few-shot prompts behind one long shared prefix, multi-turn chat, tree-of-thought branching, no
sharing at all, and several few-shot templates interleaved under cache pressure. Token ids are
drawn at random from the model's ordinary wordpieces (no tokenizer, no text): which tokens repeat
where is what the cache sees, and the model's cost per token does not depend on which they are."""
from __future__ import annotations

import numpy as np

from .engine import Request, longest_sequence  # noqa: F401 (re-exported)


def _tokens(rng: np.random.Generator, ids: range, n: int) -> tuple[int, ...]:
    """``n`` token ids drawn uniformly from ``ids`` (the model's ordinary wordpieces)."""
    if not isinstance(ids, range) or len(ids) < 2 or ids.step != 1:
        raise ValueError(f"ids must be a contiguous range of at least 2 token ids (got {ids!r})")
    return tuple(int(t) for t in rng.integers(ids.start, ids.stop, n))


def fewshot(rng, ids: range, requests: int, prefix_len: int, question_len: int, new: int) -> list[Request]:
    """One few-shot prefix (instructions + examples), then a different question per request."""
    prefix = _tokens(rng, ids, prefix_len)
    return [Request(i, None, prefix + _tokens(rng, ids, question_len), new) for i in range(requests)]


def chat(rng, ids: range, sessions: int, turns: int, system_len: int, user_len: int, new: int) -> list[Request]:
    """Sessions that share a system prompt; turn k's prompt is the whole conversation so far plus a
    new user message, so it is ready only when turn k-1 has answered."""
    system = _tokens(rng, ids, system_len)
    out, rid = [], 0
    for _ in range(sessions):
        parent = None
        for t in range(turns):
            user = _tokens(rng, ids, user_len)
            out.append(Request(rid, parent, (system if t == 0 else ()) + user, new))
            parent, rid = rid, rid + 1
    return out


def tree_of_thought(rng, ids: range, trees: int, branch: int, depth: int, question_len: int,
                    step_len: int, new: int) -> list[Request]:
    """Per problem: a root call on the question, then ``branch`` continuations of every call down to
    ``depth`` (each appends its own short instruction to the parent's prompt and answer)."""
    out, rid = [], 0
    for _ in range(trees):
        level = [rid]
        out.append(Request(rid, None, _tokens(rng, ids, question_len), new))
        rid += 1
        for _ in range(depth):
            nxt = []
            for parent in level:
                for _ in range(branch):
                    out.append(Request(rid, parent, _tokens(rng, ids, step_len), new))
                    nxt.append(rid)
                    rid += 1
            level = nxt
    return out


def no_sharing(rng, ids: range, requests: int, prompt_len: int, new: int) -> list[Request]:
    """Independent prompts (random tokens: only chance shares a first token or two)."""
    return [Request(i, None, _tokens(rng, ids, prompt_len), new) for i in range(requests)]


def shared_share(rng, ids: range, requests: int, prompt_len: int, share: float, new: int) -> list[Request]:
    """Prompts of ``prompt_len`` tokens whose first round(share x prompt_len) tokens are one common
    prefix and the rest their own (share 0: nothing shared but chance)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1] (got {share})")
    common = int(round(share * prompt_len))
    prefix = _tokens(rng, ids, common)
    return [Request(i, None, prefix + _tokens(rng, ids, prompt_len - common), new) for i in range(requests)]


def interleaved_templates(rng, ids: range, templates: int, per_template: int, prefix_len: int,
                          question_len: int, new: int) -> list[Request]:
    """Several few-shot templates, their requests arriving shuffled (the queue order FCFS follows)."""
    prefixes = [_tokens(rng, ids, prefix_len) for _ in range(templates)]
    which = rng.permutation(np.repeat(np.arange(templates), per_template))
    return [Request(i, None, prefixes[int(k)] + _tokens(rng, ids, question_len), new) for i, k in enumerate(which)]
