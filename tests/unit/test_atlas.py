"""Atlas, pure parts: the microservice SCM and its faults, the generated documentation and the offline
parser (and that dropping its negation cues breaks it), reply parsing and composition (malformed
replies, unknown names and cycles counted, never raised), the Fisher-z tests, validation and the PC
algorithm on graphs with a known answer, and the localizer (the true graph explains a timeout error
storm that z-score ranking blames on a caller)."""
import numpy as np
import pytest

from mlsys_flows.systems.atlas import Params, ci, docs
from mlsys_flows.systems.atlas.docs import DocParser, make_docs, mentions
from mlsys_flows.systems.atlas.evaluate import build, calibration_incidents, learn_graphs, rank_incidents, summarize
from mlsys_flows.systems.atlas.model import (ERR, LAT, FAULTS, expand, make_incident, make_system, simulate,
                                             true_graph, var)
from mlsys_flows.systems.atlas.rca import Localizer, rank_of
from mlsys_flows.systems.common.graphs import is_acyclic
from mlsys_flows.systems.atlas.learned import MentionSynthesizer
from mlsys_flows.systems.atlas.synth import ReplyError, break_cycles, parse_reply, synthesize
from mlsys_flows.systems.common.params import ParamsError


@pytest.fixture(scope="module")
def system():
    return make_system(16, 3)


def test_call_graph_is_a_dag_with_every_component_called(system):
    s = system
    assert is_acyclic(s.component_edges(), s.n)
    for u in range(s.n):
        if s.kinds[u] != "frontend":
            assert s.callers(u), s.names[u]
        assert all(c > u for c in s.calls[u])      # topological numbering
    assert len(set(s.names)) == s.n
    A = true_graph(s)
    assert A.shape == (s.V, s.V) and not A[:, 0].any()


def test_faults_shift_the_faulted_metric_and_propagate_upstream(system):
    s = system
    normal = simulate(s, 3000, np.random.default_rng(0))
    root = next(u for u in range(s.n) if s.callers(u))
    inc = simulate(s, 200, np.random.default_rng(1), (root, "latency_injection", 6.0))
    z = (inc.mean(0) - normal.mean(0)) / normal.std(0)
    assert z[var(root, LAT)] > 4
    caller = s.callers(root)[0]
    assert z[var(caller, LAT)] > 1 and z[var(caller, ERR)] > 2     # slower and timing out (anomalous at threshold 2)
    assert abs(z[var(root, ERR)]) < 1                               # the root itself does not fail
    # p99 timeouts: about 1% of requests time out in normal operation, a share that rises with the latency
    from mlsys_flows.systems.atlas.model import timeout_share

    share = timeout_share(s, root, normal[:, var(root, LAT)])
    assert 0.003 < share.mean() < 0.03
    slow = normal[:, var(root, LAT)] > np.quantile(normal[:, var(root, LAT)], 0.9)
    assert share[slow].mean() > 3 * share[~slow].mean()
    assert timeout_share(s, root, inc[:, var(root, LAT)]).mean() > 0.5      # the fault: most requests time out


def test_timeout_link_is_in_normal_telemetry_at_p99_and_not_without_timeouts():
    """The latency -> errors (timeout) edges: most are detectable in a long window of normal telemetry given
    the true parents at a p99 timeout; with timeouts off the same test rejects at about its level."""
    from mlsys_flows.systems.atlas.evaluate import detectable, timeout_edges

    shares = {}
    for q in (0.99, 1.0):
        s = make_system(30, 4, timeout_quantile=q)
        X = simulate(s, 2000, np.random.default_rng(9))
        shares[q] = detectable(true_graph(s), timeout_edges(s), X)
    assert shares[0.99] > 0.6 and shares[1.0] < 0.2


def test_clean_documentation_is_parsed_exactly(system):
    """The scripted parser reads the calibration phrasings (written with its cue words) exactly."""
    s = system
    pages = make_docs(s, 0, omit=0.0, hard=0.0, stale=0.0, distractor=0.0, phrasings="calibration")
    dp = DocParser()
    for v in range(s.n):
        assert dp.propose(v, pages[v], s.names) == sorted(s.calls[v]), pages[v]
    assert dp.calls == s.n


def test_parser_ignores_negated_and_ownership_mentions(system):
    """Every distractor page; the parser is fooled only by "Calls from X arrive ..." (a caller, read
    as a dependency: the reversed edge the composition's cycle breaking then meets)."""
    s = system
    pages = make_docs(s, 0, omit=0.0, hard=0.0, stale=0.0, distractor=1.0, phrasings="calibration")
    dp = DocParser()
    for v in range(s.n):
        extra = set(dp.propose(v, pages[v], s.names)) - set(s.calls[v])
        assert not extra or "Calls from" in pages[v], pages[v]


def test_parser_without_negation_cues_falls_for_distractors(system, monkeypatch):
    s = system
    pages = make_docs(s, 0, omit=0.0, hard=0.0, stale=0.0, distractor=1.0, phrasings="calibration")
    monkeypatch.setattr(docs, "_NEGATION", __import__("re").compile(r"(?!x)x"))   # matches nothing
    dp = DocParser()
    extra = sum(len(set(dp.propose(v, pages[v], s.names)) - set(s.calls[v])) for v in range(s.n))
    assert extra > 0


def test_imperfect_documentation_costs_recall_and_precision(system):
    s = system
    pages = make_docs(s, 0, omit=0.3, hard=0.3, stale=1.0, distractor=0.0, phrasings="calibration")
    dp = DocParser()
    found = {(u, v) for v in range(s.n) for u in dp.propose(v, pages[v], s.names)}
    truth = s.component_edges()
    assert truth - found and found - truth


def test_mentions_match_names_and_aliases_not_metric_names():
    names = ["orders-db", "orders-svc", "web-frontend"]
    assert mentions("It reads from the orders database.", names) == [0]
    assert mentions("Requests are forwarded to orders-svc and orders-db.", names) == [0, 1]
    assert mentions("It exports orders-svc.latency.", names) == []


NAMES = ["a-svc", "b-db", "c-cache"]


@pytest.mark.parametrize("reply, deps, unknown", [
    ('{"component": "a-svc", "depends_on": ["b-db", "c-cache"]}', [1, 2], []),
    ('Sure!\n```json\n{"depends_on": ["B-DB"]}\n```', [1], []),
    ('Here you go: {"depends_on": ["c-cache", "redis"]} hope it helps', [2], ["redis"]),
    ('["b-db", "a-svc"]', [1], ["a-svc"]),
    ('<think>maybe x</think>{"dependencies": []}', [], []),
])
def test_parse_reply_reads_common_styles(reply, deps, unknown):
    assert parse_reply(reply, NAMES, 0) == (deps, unknown)


@pytest.mark.parametrize("reply", ["", "b-db and c-cache", '{"depends_on": "b-db"}', '{"answer": 3}',
                                   '{"depends_on": [1, 2]}', "```json\n{broken\n```"])
def test_parse_reply_rejects_unreadable_replies(reply):
    with pytest.raises(ReplyError):
        parse_reply(reply, NAMES, 0)


class ScriptedAgent:
    def __init__(self, replies):
        self.replies = replies

    def propose(self, v, page, names):
        r = self.replies[v]
        if isinstance(r, Exception):
            raise r
        return r


def test_synthesize_counts_every_problem_and_returns_an_acyclic_graph():
    names = ["a", "b", "c", "d"]
    agent = ScriptedAgent([
        '{"depends_on": ["b", "zzz"]}',     # b -> a, one unknown name
        '{"depends_on": ["c"]}',             # c -> b
        '{"depends_on": ["a"]}',             # a -> c: closes the cycle a -> c -> b -> a
        "I think d depends on nothing",      # malformed
    ])
    syn = synthesize(agent, ["p"] * 4, names)
    assert (syn.requests, syn.malformed, syn.unknown_names, syn.cycle_edges_removed) == (4, 1, 1, 1)
    assert len(syn.edges) == 2 and is_acyclic(syn.edges, 4)
    syn = synthesize(ScriptedAgent([RuntimeError("HTTP 500"), [0], [], []]), ["p"] * 4, names)
    assert syn.failed == 1 and syn.edges == {(0, 1)}


def test_break_cycles_drops_the_weakest_edge_of_each_cycle():
    edges = {(0, 1), (1, 2), (2, 0), (2, 3), (3, 2), (1, 3)}
    kept, removed = break_cycles(edges, 4)
    assert not is_acyclic(edges, 4) and is_acyclic(kept, 4) and kept | removed == edges and not kept & removed
    assert break_cycles({(0, 1), (1, 2)}, 3) == ({(0, 1), (1, 2)}, set())   # an edge on no cycle is kept
    # the weakest edge of the cycle goes, wherever it sits in the numbering
    for weak in ((0, 1), (1, 2), (2, 0)):
        ev = {e: (0.5 if e == weak else 2.0) for e in ((0, 1), (1, 2), (2, 0))}
        assert break_cycles({(0, 1), (1, 2), (2, 0), (3, 0)}, 4, list("abcd"), ev)[1] == {weak}
    with pytest.raises(ValueError, match="names"):
        break_cycles(edges, 4, ["a"])


def _index_order_breaker(edges, n, names=None, evidence=None):
    """The earlier cycle breaker (back edges of a depth-first search in component index order): the review
    found it tied to the numbering, which is the true graph's order (callers before callees)."""
    succ = {i: sorted(v for u, v in edges if u == i) for i in range(n)}
    state, removed = [0] * n, set()
    for start in range(n):
        if state[start]:
            continue
        stack, state[start] = [(start, iter(succ[start]))], 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state[nxt] == 1:
                removed.add((node, nxt))
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(succ[nxt])))
    return set(edges) - removed, removed


def _relabelling_invariant(breaker, trials=30) -> bool:
    """Relabel the components (their names move with them) by a random permutation: the removed edges must
    be the relabelled removed edges, so the order cannot come from the numbering."""
    rng = np.random.default_rng(0)
    for _ in range(trials):
        n = 12
        names = [f"c{i}-svc" for i in rng.permutation(100)[:n]]
        edges = {(int(u), int(v)) for u, v in rng.integers(0, n, (30, 2)) if u != v}
        ev = {e: float(rng.integers(1, 3)) for e in edges}      # evidence with ties
        perm = rng.permutation(n)                                # perm[i]: the new label of component i
        names2 = [None] * n
        for i in range(n):
            names2[perm[i]] = names[i]
        edges2 = {(int(perm[u]), int(perm[v])) for u, v in edges}
        ev2 = {(int(perm[u]), int(perm[v])): x for (u, v), x in ev.items()}
        _, removed = breaker(edges, n, names, ev)
        _, removed2 = breaker(edges2, n, names2, ev2)
        if {(int(perm[u]), int(perm[v])) for u, v in removed} != removed2:
            return False
    return True


def test_break_cycles_order_does_not_follow_the_component_numbering():
    assert _relabelling_invariant(break_cycles)
    assert not _relabelling_invariant(_index_order_breaker)     # the check can fail: the earlier breaker fails it


def test_synthesizers_give_the_cycle_breaker_their_evidence():
    names = ["a-svc", "b-svc", "c-svc"]
    pages = ["It calls b-svc. It uses b-svc again.", "It calls c-svc.", "It calls a-svc."]   # a -> c -> b -> a
    syn = synthesize(MentionSynthesizer(), pages, names)
    # b -> a is named twice, the other two once: one of the weaker two goes
    assert syn.cycle_edges_removed == 1 and (1, 0) in syn.edges
    syn = synthesize(DocParser(), pages, names)
    assert syn.cycle_edges_removed == 1 and (1, 0) in syn.edges


def _chain_and_collider(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    y = 0.8 * x + rng.standard_normal(n)          # x -> y
    w = rng.standard_normal(n)
    z = 0.7 * y + 0.7 * w + rng.standard_normal(n)  # y -> z <- w
    return np.column_stack([x, y, z, w])


def test_fisher_z_partial_correlation():
    D = _chain_and_collider()
    C, n = ci.corr(D), len(D)
    assert ci.fisher_p(ci.partial_corr(C, 0, 2), n, 0) < 1e-6            # x, z dependent
    assert ci.fisher_p(ci.partial_corr(C, 0, 2, [1]), n, 1) > 0.01       # x independent of z given y
    assert ci.fisher_p(ci.partial_corr(C, 1, 3), n, 0) > 0.01            # y, w independent
    assert ci.fisher_p(ci.partial_corr(C, 1, 3, [2]), n, 1) < 1e-6       # ... but not given the collider
    S = np.array([[2], [0]])
    assert np.allclose(ci._batched_partial_corr(C, 1, 3, S), [ci.partial_corr(C, 1, 3, [2]), ci.partial_corr(C, 1, 3, [0])])


def test_validation_prunes_the_edge_the_data_contradicts():
    D = _chain_and_collider()
    A = np.zeros((4, 4), bool)
    A[0, 1] = A[1, 2] = A[3, 2] = True
    A[0, 2] = True                                   # false: x -> z is explained by y
    pruned, p = ci.validate(A, [(0, 2), (1, 2)], D, 0.01)
    assert not pruned[0, 2] and pruned[1, 2] and p[(0, 2)] > 0.01 > p[(1, 2)]


def test_meek_rule_1_orients_away_from_a_collider(monkeypatch):
    rng = np.random.default_rng(1)
    n = 3000
    x, w = rng.standard_normal(n), rng.standard_normal(n)
    z = 0.7 * x + 0.7 * w + rng.standard_normal(n)      # x -> z <- w
    y = 0.8 * z + rng.standard_normal(n)                # z -> y: only Meek rule 1 orients it
    G = ci.pc(np.column_stack([x, w, z, y]), 0.01, 2, roots=())
    assert G[2, 3] and not G[3, 2]
    monkeypatch.setattr(ci, "_meek", lambda G, adj: None)     # without the Meek rules it stays unoriented
    G = ci.pc(np.column_stack([x, w, z, y]), 0.01, 2, roots=())
    assert G[2, 3] and G[3, 2]


def test_pc_recovers_a_chain_into_a_collider():
    G = ci.pc(_chain_and_collider(), 0.01, 2, roots=())
    skeleton = G | G.T
    assert {(i, j) for i, j in zip(*np.nonzero(np.triu(skeleton)))} == {(0, 1), (1, 2), (2, 3)}
    assert G[1, 2] and not G[2, 1] and G[3, 2] and not G[2, 3]    # v-structure y -> z <- w
    assert G[0, 1] and G[1, 0]                 # x - y: no v-structure or Meek rule orients it (equivalence class)
    # reading the collider as a chain would be wrong: the test above has power
    assert not (G[2, 3] and not G[3, 2])


def test_pc_background_knowledge_keeps_and_orients_required_edges():
    D = _chain_and_collider()
    V = D.shape[1]
    req = np.zeros((V, V), bool)
    req[0, 1] = True                 # x -> y known (the data alone leaves x - y unoriented)
    req[0, 3] = True                 # x -> w known although the data finds them independent
    G = ci.pc(D, 0.01, 2, roots=(), required=req)
    assert G[0, 1] and not G[1, 0] and G[0, 3] and not G[3, 0]
    assert G[1, 2] and not G[2, 1]   # the rest is still learned from the data
    assert not ci.pc(D, 0.01, 2, roots=())[0, 3]   # without the knowledge the test removes x - w


def test_unoriented_pc_edges_make_neither_end_a_parent():
    from mlsys_flows.systems.atlas.evaluate import directed_only

    G = ci.pc(_chain_and_collider(), 0.01, 2, roots=())
    D = directed_only(G)
    assert not D[0, 1] and not D[1, 0]          # x - y unoriented: neither is the other's parent
    assert D[1, 2] and D[3, 2] and not D[2, 1]   # oriented edges stay


def test_true_graph_localizes_a_timeout_storm_that_zscore_blames_on_a_caller(system):
    s = system
    history = simulate(s, 400, np.random.default_rng(5))
    true_loc = Localizer.fit(true_graph(s), history)
    z_loc = Localizer.fit(np.zeros_like(true_graph(s)), history)
    no_timeouts = expand(s.n, s.component_edges())
    for u, v in s.component_edges():
        no_timeouts[var(u, LAT), var(v, ERR)] = False
    nt_loc = Localizer.fit(no_timeouts, history)
    true_hits = z_hits = nt_hits = 0
    for k in range(40):
        inc = make_incident(s, k, 3, 10, 4.0)
        true_hits += rank_of(true_loc.rank(inc.data, s.n), inc.root) == 1
        z_hits += rank_of(z_loc.rank(inc.data, s.n), inc.root) == 1
        nt_hits += rank_of(nt_loc.rank(inc.data, s.n), inc.root) == 1
    assert true_hits >= 38 and z_hits < true_hits and nt_hits < true_hits


def test_end_to_end_one_small_system():
    p = Params.for_scale("smoke", components=12, incidents=12, incident_chunks=2, curve_points=2)
    s, pages, history, past = build(p, 7)
    assert len(pages) == s.n and len(history) == max(p.history_sizes()) and len(past) == max(p.incident_counts()) * p.fault_window
    learned = learn_graphs(p, s, pages, history, past, DocParser(), calibration_incidents(p, s, 7))
    chunks = [rank_incidents(p, s, 7, learned, 0, 6), rank_incidents(p, s, 7, learned, 6, 12)]
    assert chunks[0]["roots"] != chunks[1]["roots"] or chunks[0]["faults"] != chunks[1]["faults"]
    v = summarize([{"learned": learned, "incidents": chunks}], p.headline_setting())
    assert v["true_graph"]["edge_precision"] == v["true_graph"]["edge_recall"] == 1.0
    assert all(v[k]["incidents"] == 12 for k in v)
    assert set(learned["settings"]) == set(p.settings()) and p.headline_setting() in learned["settings"]
    assert v["atlas"]["synth_requests"] == s.n and v["atlas"]["malformed_replies"] == 0
    a = v["atlas"]
    assert a["pruned_true_edges"] + a["pruned_false_edges"] <= a["validated_edges"]
    for k, m in v.items():
        assert 0 <= m["top1_accuracy"] <= m["top3_accuracy"] <= 1 and m["mean_rank"] >= 1
    assert set(FAULTS) == {k[5:] for k in v["atlas"] if k.startswith("top1_") and k != "top1_accuracy"}
    st = learned["settings"][p.headline_setting()]["stats"]
    assert st["pc_algorithm"]["pc_alpha"] in p.pc_alpha_grid and set(st["pc_alpha_scores"]) == set(p.pc_alpha_grid)
    assert v["atlas_no_docs"]["timeout_edge_recall"] == 0.0 and v["true_graph"]["timeout_edge_recall"] == 1.0
    # atlas_mentions: every named component, validated alike; before validation it holds every mention
    assert 0.0 < v["atlas_mentions"]["edge_recall"] <= 1.0 and "sentence_scores" not in learned["synthesis"]


def test_notes_say_whether_the_rule_transfers():
    """The notes' transfer verdict: above the mention base rate on the held-out sentences, or "does not transfer"
    when its accuracy is no better than accepting every mention (both branches)."""
    from mlsys_flows.systems.atlas.result import build_result

    p = Params.for_scale("smoke", components=12, incidents=4, incident_chunks=1, curve_points=1,
                         incident_curve_points=0, pc_alpha=0.05)
    s, pages, history, past = build(p, 7)
    learned = learn_graphs(p, s, pages, history, past, DocParser(), [])
    chunks = [rank_incidents(p, s, 7, learned, 0, 4)]

    def notes(scores):
        syn = {**learned["synthesis"], "agent": "minilm", "calibration": {}, "sentence_scores": scores}
        return " ".join(build_result(p, [{"learned": {**learned, "synthesis": syn}, "incidents": chunks}]).notes)

    above = notes({"tp": 30, "fp": 5, "fn": 5, "tn": 10})        # accuracy 0.8 against a base rate of 0.7
    assert "is above the base rate there" in above and "does not transfer" not in above
    level = notes({"tp": 35, "fp": 15, "fn": 0, "tn": 0})        # accepts every mention: accuracy = base rate
    assert "does not transfer" in level and "is above the base rate" not in level
    below = notes({"tp": 20, "fp": 10, "fn": 15, "tn": 5})       # accuracy 0.5 against 0.7
    assert "does not transfer" in below


def test_pc_level_is_chosen_on_calibration_incidents_only():
    """The chosen level is the grid's best top-1 on the calibration incidents; the evaluated incidents
    (indices 0..) never enter; without calibration incidents and no fixed level it refuses."""
    from mlsys_flows.systems.atlas.evaluate import CALIBRATION, tuned_pc
    from mlsys_flows.systems.atlas.learned import CalibrationError

    p = Params.for_scale("smoke", components=12, incidents=12, curve_points=1, pc_alpha_grid=[0.001, 0.05, 0.3])
    s, pages, history, past = build(p, 7)
    calib = calibration_incidents(p, s, 7)
    assert len(calib) == p.calibration_incidents and CALIBRATION > 10 * p.incidents
    data = history[: p.history_samples]
    template = expand(s.n, ())
    G, alpha, scores, ranks = tuned_pc(p, data, template, calib, s.n)
    assert set(scores) == set(ranks) == set(p.pc_alpha_grid)
    assert alpha == min(scores, key=lambda a: (-scores[a], ranks[a], p.pc_alpha_grid.index(a)))
    with pytest.raises(CalibrationError, match="calibration incidents"):
        tuned_pc(p, data, template, [], s.n)
    fixed = p.model_copy(update={"pc_alpha": 0.05})
    assert tuned_pc(fixed, data, template, [], s.n)[1:] == (0.05, {}, {})


def test_pc_level_tie_goes_to_the_lower_mean_rank(monkeypatch):
    """Equal top-1 on the calibration incidents: the level whose mean rank is lower wins, not the first."""
    from mlsys_flows.systems.atlas import evaluate

    p = Params.for_scale("smoke", components=12, incidents=12, curve_points=1, pc_alpha_grid=[0.01, 0.2])
    calib = [type("I", (), {"data": None, "root": 0})() for _ in range(4)]
    ranks = {0.01: iter([1, 1, 3, 4]), 0.2: iter([1, 1, 2, 2])}
    monkeypatch.setattr(evaluate.ci, "pc", lambda data, alpha, depth, required: np.full((2, 2), alpha))
    monkeypatch.setattr(evaluate, "rank_of", lambda alpha, root: next(ranks[alpha]))
    monkeypatch.setattr(evaluate, "directed_only", lambda G: G)

    class Loc(float):
        def rank(self, *a):
            return float(self)
    monkeypatch.setattr(evaluate.Localizer, "fit", classmethod(lambda cls, G, data: Loc(G[0, 0])))
    _, alpha, scores, mean_ranks = evaluate.tuned_pc(p, None, None, calib, 12)
    assert scores == {0.01: 0.5, 0.2: 0.5} and mean_ranks == {0.01: 2.25, 0.2: 1.5} and alpha == 0.2


def test_params_reject_bad_values_naming_the_field():
    with pytest.raises(ParamsError, match="'components'"):
        Params.for_scale("smoke", components=3)
    with pytest.raises(ParamsError, match="incident_chunks"):
        Params.for_scale("smoke", incidents=4, incident_chunks=8)
    with pytest.raises(ParamsError, match="history_samples / 2"):
        Params.for_scale("smoke", history_samples=40, curve_points=3)
    with pytest.raises(ParamsError, match="pc_alpha_grid"):
        Params.for_scale("smoke", pc_alpha_grid=[0.05, 0.05])
    with pytest.raises(ParamsError, match="timeout_quantile"):
        Params.for_scale("smoke", timeout_quantile=1.5)
    with pytest.raises(ParamsError, match="'llm_base_url'"):
        Params.for_scale("smoke", llm_base_url="ftp://x")
    q = Params.for_scale("quick")
    assert q.history_sizes()[1] == q.history_samples and q.headline_setting() in q.settings()
    assert q.incident_counts()[:2] == [0, q.history_incidents] and len(set(q.settings())) == len(q.settings())
