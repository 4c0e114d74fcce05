"""The placement experiment: every variant's split of a graph, checked by the independent scorer, and
the accelerator sweep (numpy, the DP, the IP; the package itself holds only Params and SPEC)."""
from __future__ import annotations

import math
import time

from . import SWEPT, Params
from .graph import Graph, GraphError, score


def _timed(fn):
    """(fn(), its wall-clock seconds)."""
    t0 = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t0


def contiguous_splits(g: Graph, k: int, l: int, mem: float, p: Params) -> tuple:
    """(the DP's result, {variant: (split, solve seconds)}) for every contiguous variant on ``g`` with
    ``k`` accelerators, ``l`` CPU cores and ``mem`` bytes each; GraphError when nothing fits."""
    from .baselines import dp_chain, greedy, local_search, one_accelerator, pipedream
    from .dp import solve_dp

    dp, dp_s = _timed(lambda: solve_dp(g, k, l, mem, max_ideals=p.max_ideals))
    if not math.isfinite(dp.max_load):
        raise infeasible(g, k, l, mem)
    out = {"dp": (dp.device, dp_s)}
    ch, s = _timed(lambda: dp_chain(g, k, l, mem, p.max_ideals))
    out["dp_chain"] = (ch.device, s)
    pd, s = _timed(lambda: pipedream(g, k, l, mem, p.max_ideals))
    out["pipedream"] = (pd.device, s)
    gr, s = _timed(lambda: greedy(g, k, l, mem))
    out["greedy"] = (gr, s)
    out["local_search"] = _timed(lambda: local_search(g, k, l, mem, seconds=p.local_search_s, seed=p.seed, start=gr))
    one, s = _timed(lambda: one_accelerator(g, k, l, mem, dp))
    out["one_accelerator"] = (one[1], s)  # read from the DP's (l, 1) state
    return dp, out


def solve_graph(g: Graph, p: Params, log=None) -> dict:
    """Every variant on one graph. Returns {variant: {"max_load", "device", "seconds", ...}} and settings;
    every split is checked by the independent scorer (feasible; contiguous except ip)."""
    from .ip import solve_ip

    k = p.accelerators or g.accelerators
    l = g.cpus if p.cpus is None else p.cpus
    mem = p.memory_per_accelerator or g.memory
    g = g.with_settings(k, l, mem)
    dp, splits = contiguous_splits(g, k, l, mem, p)
    out = {v: {"device": device, "seconds": s} for v, (device, s) in splits.items()}
    out["dp"] |= {"ideals": dp.ideals, "ideal_pairs": dp.pairs, "exact": dp.exact, "merged": dp.merged}

    ip, s = _timed(lambda: solve_ip(g, k, l, mem, time_limit_s=p.ip_time_limit_s, start=dp.device, seed=p.seed))
    out["ip"] = {"device": ip.device, "seconds": s, "ip_gap": ip.gap, "ip_bound": ip.bound, "status": ip.status}
    for name, r in out.items():
        sc = score(g, r["device"], k, l, mem)
        if not sc.feasible:
            raise RuntimeError(f"{g.name}: the {name} split is infeasible: {sc.problems[:3]}")
        if name != "ip" and not sc.contiguous:
            raise RuntimeError(f"{g.name}: the {name} split is not contiguous")
        r["max_load"] = sc.max_load
        r["contiguous"] = sc.contiguous
        r["device"] = [int(x) for x in r["device"]]
        if log:
            log(f"{g.name}: {name} max_load {sc.max_load:.5g} ({r['seconds']:.2f} s)")
    # the DP is optimal over contiguous splits; the IP (warm-started by it) over all splits
    tol = 1e-9 * max(1.0, out["dp"]["max_load"])
    for name in ("dp_chain", "pipedream", "greedy", "local_search", "one_accelerator"):
        if out[name]["max_load"] < out["dp"]["max_load"] - tol and out["dp"]["exact"]:
            raise RuntimeError(f"{g.name}: {name} beat the exact DP over contiguous splits ({out[name]['max_load']} < "
                               f"{out['dp']['max_load']}): the DP is wrong")
    if out["ip"]["max_load"] > out["dp"]["max_load"] + tol:
        raise RuntimeError(f"{g.name}: the IP's value is above the DP's")
    return {"graph": g.name, "nodes": g.n, "edges": len(g.edges), "training": g.training, "accelerators": k,
            "cpus": l, "memory": mem if math.isfinite(mem) else None, "ids": [str(i) for i in g.ids], "results": out}


def infeasible(g: Graph, k: int, l: int, memory: float) -> GraphError:
    """The error for settings no contiguous split satisfies, naming the parameter to change."""
    if l == 0 and not g.supported.all():
        return GraphError("cpus", f"graph {g.name!r} has {int((~g.supported).sum())} node(s) that only run on a CPU "
                                  "core, and cpus is 0")
    need = float(g.size.sum())
    return GraphError("memory_per_accelerator", f"no contiguous split of graph {g.name!r} fits {k} accelerator(s) of "
                                                f"{memory:.4g} bytes with {l} CPU core(s) (the nodes' sizes add up to "
                                                f"{need:.4g} bytes); raise memory_per_accelerator, accelerators or cpus")


def sweep_accelerators(g: Graph, p: Params) -> dict[int, dict[str, float]]:
    """The regime: the contiguous variants' max-load on ``g`` at each accelerator count of
    ``p.regime_accelerators`` (the graph's CPUs and memory; local search with its usual budget),
    every split re-scored by the independent scorer."""
    l = g.cpus if p.cpus is None else p.cpus
    mem = p.memory_per_accelerator or g.memory
    out = {}
    for k in p.regime_accelerators:
        gk = g.with_settings(k, l, mem)
        _, splits = contiguous_splits(gk, k, l, mem, p)
        out[k] = {v: score(gk, splits[v][0], k, l, mem).max_load for v in SWEPT}
    return out
