"""The benchmark protocol over the family's environments and agents (systems/embodied: numpy): the
variants' agents, the fixed seeded test sets, the episodes of a chunk, and the counts the report reads
(success by subset, by seed and by round budget; why episodes end)."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict

from mlsys_flows.systems.embodied.agents import PolicyAgent, make_agent, run_episode
from mlsys_flows.systems.embodied.api import LEVELS, SUBSETS, make_env, make_tasks  # noqa: F401 (LEVELS re-exported)

from . import COMPARED, Params


SCRIPTED_REFERENCE = {"scripted_no_feedback": ("scripted", False, False),
                      "scripted_with_feedback": ("scripted_feedback", True, True),
                      "scripted_replan_no_feedback": ("scripted_replan", False, True)}
#: the floor of the language agents' claims: random plans from the actions the scene offers (what the
#: constrained language model chooses from), on the tasks the headline's agent plays, at its plan budget
FLOOR = "random_plan"
#: the floor of ERA's learned policies' claims: one uniformly random valid action per step (the mask they
#: get), on every task, up to the step budget (as they play)
MASKED_FLOOR = "random_valid"
#: variants that replan until the episode's step budget (the paper's protocol: episodes are capped in
#: environment steps), not up to max_rounds: the scripted reference (cheap) and the learned policies' floor
STEP_BUDGET = ("scripted_with_feedback", "scripted_replan_no_feedback", MASKED_FLOOR)
#: the learned step policies of ERA (systems/era), trained in the run: prior only, prior + RL
POLICY_VARIANTS = ("era_prior", "era_prior_rl")
#: the project's scripted planners: a labelled reference; their claims decide nothing
REFERENCE = "scripted_"


def agent_kinds(p: Params) -> dict[str, tuple[str, bool, bool]]:
    """variant -> (agent kind, feedback, replan) of the language-agent variants (the learned policies,
    POLICY_VARIANTS, run apart: ``run_policies``). The headline's three protocols are played by
    ``p.agent``; the scripted planners are the labelled reference. The order is the order they run in."""
    kind = {"scripted": None, "llm": "llm", "smollm2": "smollm2"}[p.agent]
    out = ({"no_feedback": (kind, False, False), "with_feedback": (kind, True, True),
            "replan_no_feedback": (kind, False, True)} if kind else
           {"no_feedback": ("scripted", False, False), "with_feedback": ("scripted_feedback", True, True),
            "replan_no_feedback": ("scripted_replan", False, True)})
    out |= SCRIPTED_REFERENCE
    out[FLOOR] = ("random", False, True)
    out[MASKED_FLOOR] = ("random_valid", False, True)
    if p.expert:
        out["expert"] = ("expert", False, False)
    return out


def llm_played(p: Params) -> bool:
    """Whether a language model plays the headline's variants (their episodes are then the first
    ``llm_per_subset`` tasks of each subset)."""
    return p.agent in ("llm", "smollm2")


def eval_seeds(p: Params) -> list[int]:
    """The seeds of the test sets: seed, seed+1, ..."""
    return [p.seed + i for i in range(p.seeds)]


def tasks_for(p: Params, level: str, seed: int | None = None):
    return make_tasks(level, p.per_subset, p.seed if seed is None else seed)


def task_index(task) -> int:
    """The task's index within its subset in the test set (its id ends with it)."""
    return int(task.id.rsplit("-", 1)[1])


def run_chunk(p: Params, level: str, start: int, stop: int, client=None, seed: int | None = None) -> dict:
    """Every language-agent variant on tasks[start:stop] of ``level`` in the test set of ``seed``
    (default: p.seed); a language model plays only the first ``p.llm_per_subset`` tasks of each subset.
    Returns {variant: [episode dicts]}, each tagged with its test set's seed. One agent per variant
    (the model's ``client`` is shared: with greedy decoding the three protocols' identical first
    prompts are answered once). The floor of the language agents (``FLOOR``) plays the tasks and the plan
    budget they play; the learned policies' floor (``MASKED_FLOOR``) every task up to the step budget."""
    seed = p.seed if seed is None else seed
    tasks = tasks_for(p, level, seed)[start:stop]
    llm_kinds = ("llm", "smollm2")
    out: dict[str, list[dict]] = {}
    for variant, (kind, feedback, replan) in agent_kinds(p).items():
        agent = make_agent(kind, client, p.llm_max_tokens)
        llm_tasks = kind in llm_kinds or (variant == FLOOR and llm_played(p))
        mine = [t for t in tasks if not llm_tasks or task_index(t) < p.llm_per_subset]
        out[variant] = []
        for t in mine:
            env = make_env(t)
            rounds = env.max_steps if variant in STEP_BUDGET else p.max_rounds
            out[variant].append(asdict(run_episode(env, agent, feedback, rounds, replan)) | {"test_seed": seed})
    return out


def run_policies(p: Params, level: str, policies: dict, seeds: list[int] | None = None) -> dict:
    """Learned step policies (variant -> ``policy(observation_vector, valid_mask) -> action id``) on every
    task of ``level`` in the test sets of ``seeds`` (default: all), under the same episodes and step
    budgets: one action per plan, up to the episode's step budget (``PolicyAgent``); no feedback text
    (a policy has no channel for it). Their floor (``MASKED_FLOOR``: a random valid action per step) plays
    the same tasks in ``run_chunk``. Returns {variant: [episode dicts]}."""
    out: dict[str, list[dict]] = {}
    for seed in (eval_seeds(p) if seeds is None else seeds):
        for variant, policy in policies.items():
            agent = PolicyAgent(policy, variant)
            for t in tasks_for(p, level, seed):
                env = make_env(t)
                out.setdefault(variant, []).append(
                    asdict(run_episode(env, agent, False, env.max_steps, replan=True)) | {"test_seed": seed})
    return out


def is_reference(name: str) -> bool:
    """Whether ``name`` is a variant of the scripted reference (its comparisons decide nothing)."""
    return name.startswith(REFERENCE)


def is_floor(name: str) -> bool:
    """Whether ``name`` is a floor variant (``FLOOR`` or ``MASKED_FLOOR``, pooled or per level)."""
    return name.removesuffix("_high").removesuffix("_low") in (FLOOR, MASKED_FLOOR)


REFERENCE_WHY = ("reference: played by the project's scripted planners, whose weaknesses it wrote; "
                 "decides nothing")


def decides_nothing(p: Params, samples: dict[str, dict[str, list[float]]], pairs,
                    metric: str = "success_rate") -> dict[str, str]:
    """The comparisons among ``pairs`` that get no verdict, ``claim_key`` -> why: those played by the
    scripted planners (the ``scripted_*`` reference's, and with ``agent=scripted`` every claim of the
    headline's protocols, which the scripted planner then plays), then those at their floor
    (``at_floor``)."""
    from mlsys_flows.systems.common.report import claim_key

    out = at_floor(samples, pairs, metric)
    for tech, base in pairs:
        era = tech.startswith("era_") and (base.startswith("era_") or is_floor(base))
        if is_reference(tech) or is_reference(base) or (p.agent == "scripted" and not era):
            out[claim_key(tech, base)] = REFERENCE_WHY
    return out


def _floor_of(name: str) -> str | None:
    """The floor variant of ``name``'s scope: ``MASKED_FLOOR`` for ERA's learned policies, ``FLOOR`` for the
    language agents (``<floor>_high`` / ``_low`` for a level's variant), None for the scripted reference
    (no floor: its comparisons decide nothing anyway)."""
    if is_reference(name):
        return None
    floor = MASKED_FLOOR if name.startswith("era_") else FLOOR
    for lv in LEVELS:
        if name.endswith(f"_{lv}"):
            return f"{floor}_{lv}"
    return floor


def at_floor(samples: dict[str, dict[str, list[float]]], pairs, metric: str = "success_rate") -> dict[str, str]:
    """The comparisons (technique, baseline) among ``pairs`` whose both sides' medians are at or below the
    floor of their scope (``_floor_of``: random plans for the language agents, a random valid action per
    step for ERA's policies; per level for a level's variant): ``claim_key`` -> why they decide nothing
    ('at the floor: ...'). A comparison without the floor's samples (or of the scripted reference) is left
    out (decided as usual)."""
    import statistics

    from mlsys_flows.systems.common.report import claim_key

    def med(v):
        xs = samples.get(v, {}).get(metric) if v else None
        return statistics.median(xs) if xs else None

    out = {}
    for tech, base in pairs:
        if is_floor(base):
            # a claim against the floor itself: decided as usual, unless neither side scores at all
            if med(tech) == med(base) == 0.0:
                out[claim_key(tech, base)] = f"at the floor: {tech} and {base} both 0.000 (medians over the test sets)"
            continue
        t, b, ft, fb = med(tech), med(base), med(_floor_of(tech)), med(_floor_of(base))
        if None in (t, b, ft, fb):
            continue
        if t <= ft and b <= fb:
            what = "a random valid action per step" if _floor_of(tech).startswith(MASKED_FLOOR) else "random plans"
            floors = (f"{what} {ft:.3f}" if _floor_of(tech) == _floor_of(base) else
                      f"{what} {ft:.3f} and {fb:.3f}")
            out[claim_key(tech, base)] = (f"at the floor: {tech} {t:.3f} and {base} {b:.3f}, at or below {floors} "
                                          "(medians over the test sets)")
    return out


def reason_kind(reason: str) -> str:
    """Coarse category of a failure reason (for counting)."""
    r = reason.split(": ", 1)[-1]
    if "endpoint error" in r:
        return "endpoint_error"
    if "invalid JSON" in r:
        return "invalid_json"
    if "out of range" in r or "not an integer" in r or "not a list" in r or "without a 'plan'" in r or "empty plan" in r:
        return "invalid_action_id"
    if "invalid plan" in reason:
        return "other_invalid_plan"
    if "invalid action" in reason:
        return "invalid_action"
    return "unfinished"


def summarize(episodes: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Counted metrics per variant and per variant_level: success rate overall and per subset,
    invalid plans/actions per episode, steps, and the number of episodes."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for variant, eps in episodes.items():
        for e in eps:
            groups[variant].append(e)
            groups[f"{variant}_{e['level']}"].append(e)
    out = {}
    for name, eps in groups.items():
        n = len(eps)
        success = sum(e["success"] for e in eps) / n
        m = {"success_rate": success, "failure_rate": 1.0 - success, "episodes": float(n),
             "invalid_plans": float(sum(e["invalid_plans"] for e in eps)),
             "invalid_plan_episodes": float(sum(e["invalid_plans"] > 0 for e in eps)),
             "invalid_actions_per_episode": sum(e["invalid_actions"] for e in eps) / n,
             "steps_per_episode": sum(e["steps"] for e in eps) / n,
             "plans_per_episode": sum(e["rounds"] for e in eps) / n}
        for s in SUBSETS:
            sub = [e for e in eps if e["subset"] == s]
            if sub:
                m[f"success_{s}"] = sum(e["success"] for e in sub) / len(sub)
        out[name] = m
    return out


def reason_counts(episodes: dict[str, list[dict]]) -> dict[str, dict[str, int]]:
    out = {}
    for variant, eps in episodes.items():
        c = Counter(reason_kind(r) for e in eps for r in e["reasons"])
        out[variant] = dict(c)
    return out


def success_by_round(eps: list[dict], max_rounds: int) -> list[float]:
    """Share of episodes solved within r plans, r = 1..max_rounds."""
    return [success_within(eps, r) for r in range(1, max_rounds + 1)]


def success_within(eps: list[dict], rounds: int) -> float:
    """Share of episodes solved within ``rounds`` plans: what the same (budget-unaware) agent scores with
    a budget of ``rounds`` plans, read off episodes run with a larger budget."""
    return sum(e["success"] and e["success_round"] is not None and e["success_round"] < rounds for e in eps) / max(1, len(eps))


def per_seed(episodes: dict[str, list[dict]], seeds: list[int]) -> dict[str, dict[str, list[float]]]:
    """Samples of success_rate and failure_rate, one per test set: variant (and variant_level) ->
    {"success_rate": [...], "failure_rate": [...]}."""
    out: dict[str, dict[str, list[float]]] = {}
    for seed in seeds:
        s = summarize({v: [e for e in eps if e["test_seed"] == seed] for v, eps in episodes.items()})
        for name, m in s.items():
            for metric in ("success_rate", "failure_rate"):
                out.setdefault(name, {}).setdefault(metric, []).append(m[metric])
    return out


def sweep_rounds(episodes: dict[str, list[dict]], seeds: list[int], rounds: list[int]) -> dict[int, dict[str, list[float]]]:
    """The regime: round budget r -> {variant: [success within r plans, one per test set]} for the compared
    variants (no_feedback plans once, so its success does not move with r)."""
    return {r: {v: [success_within([e for e in episodes[v] if e["test_seed"] == s], r) for s in seeds]
                for v in COMPARED if v in episodes} for r in sorted(rounds)}
