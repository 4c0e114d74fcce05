"""The shared two-tier embedding trainer of FAE, Hotline and Slipstream (torch + numpy).

The dense part of a DLRM (systems/common/dlrm.py: bottom MLP, dot interaction, top MLP) lives in the
trainer process with the fast tier (the hot rows, a torch tensor next to the compute). The full
tables live in the slow tier (tier.SlowTier, a separate process). A step works on the unique rows of
its inputs: their values are gathered (fast tier, slow tier or both), become one leaf tensor, the
model's forward and backward give the rows' gradients, and each row is updated (plain SGD) where it
is authoritative: in the fast tier or by a sparse update sent to the slow tier. Pipelines:

- ``hybrid`` (the baseline): every batch gathers all its rows from the slow tier and sends all
  gradients back (CPU-GPU hybrid / parameter-server training).
- ``fae``: hot inputs (every row hot) form hot batches that train entirely in the fast tier; cold
  batches run hybrid; the hot rows are written to the slow tier when a cold phase starts and read
  back when a hot phase starts. A hot phase is ``fae_phase_batches`` hot batches; the cold batches
  are spread evenly over the epoch's phases.
- ``cache`` (FAE's mechanism ablation: hybrid with FAE's hot set): batches in arrival order, hot rows
  read and updated in the fast tier, each batch's cold rows gathered from the slow tier before it
  trains; no hot/cold input classification, no phases, no syncs.
- ``hotline``: each batch splits into its popular micro-batch (hot inputs) and the rest; the rest's
  cold rows are gathered on a background thread while the popular part trains; both parts' gradients
  are applied in one step (the same update as hybrid up to float rounding); hot rows always live in
  the fast tier. ``overlap_gather=False`` (Hotline's mechanism ablation) gathers the cold rows
  inline, before the popular micro-batch trains: the same pipeline without the overlap.
- ``skip_stale`` (Slipstream) on top of hotline: after ``stale_warmup`` steps, every
  ``snapshot_every`` steps the hot rows' drift is measured in units of the update scale and the
  threshold re-picked by the loss change skipping would cause (hot.StalenessRule: the current model's
  loss on a sample of popular inputs, a forward pass without gradient, inside the timed loop as the
  paper pays for it too); popular inputs touching only stale rows are skipped.

Input preparation (dedup of each batch's rows, the hot/cold split, and the inputs' copy to the
device) is data-loader work done for every variant outside the clock: before it starts, and, for
Slipstream's popular micro-batch shrunk by a skip (its kept inputs prepared again), with the clock
paused around that ``prepare()`` (its time counted apart in ``prepare_s``). On CUDA the device's
queued work is waited for before the clock pauses (timed) and the kept inputs' host-to-device copy
after the preparation (paused), so the paused window holds only the host-side preparation and its
copy, never queued training kernels. Slipstream's own runtime work stays timed: the snapshots, the
drift, the threshold's loss probe and the skip test on every batch (the paper's snapshot, sampling
and input-classifier blocks). Everything else after the clock starts is timed.

Device (``TrainConfig.device``, resolved once by device.resolve_device: ``cpu`` always works, CUDA
when present and asked for): the dense model, the fast tier (hot rows and their Adagrad accumulators)
and the prepared inputs live on the device; the slow tier stays in host memory behind its process.
Rows it returns are copied host-to-device and the gradients (and the rows FAE's syncs write) copied
device-to-host before they go back to it (device.Placement: pinned staging buffers and non-blocking
copies on CUDA; no copies at all on the CPU, where the path is the same with device ``cpu``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from mlsys_flows.systems.common.dlrm import DLRM
from mlsys_flows.systems.recsys_embeddings.device import Placement
from mlsys_flows.systems.recsys_embeddings.hot import StalenessRule, hot_inputs, hot_slots, update_scale
from mlsys_flows.systems.recsys_embeddings.tier import EPS, SlowTier
from mlsys_flows.systems.recsys_embeddings.workload import Dataset, auc, logloss

PIPELINES = ("hybrid", "fae", "hotline", "cache")


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int
    epochs: int
    lr: float                 # dense parameters (SGD)
    emb_lr: float             # embedding rows (SGD, wherever the row lives)
    dim: int
    bottom: tuple[int, ...]
    top: tuple[int, ...]
    evals_per_epoch: int
    seed: int
    threads: int = 1
    slow_row_us: float = 0.0  # added slow-tier cost per row moved (the regime's knob; 0: the tier as it is)
    device: str = "cpu"       # auto | cpu | cuda | cuda:N (device.resolve_device; absent CUDA: cpu, with a warning)


@dataclass(frozen=True)
class Variant:
    name: str
    pipeline: str                          # hybrid | fae | hotline | cache
    hot_rows: np.ndarray | None = None     # global ids of the hot rows (every pipeline but hybrid)
    fae_phase_batches: int = 8             # hot batches per hot phase (fae)
    overlap_gather: bool = True            # hotline: cold rows gathered in the background (False: inline)
    skip_stale: bool = False               # Slipstream (on hotline)
    snapshot_every: int = 50               # steps between snapshots of the hot rows
    stale_warmup: int = 0                  # steps before the first snapshot (drift is large while rows settle)
    max_skip: float = 0.3                  # skip share the threshold may reach on the sample (a safety cap)
    max_loss_increase: float = 0.0         # skipped inputs' mean loss may exceed the sample's by this share
    probe_samples: int = 1024              # popular inputs sampled (drift and loss) at each threshold pick

    def __post_init__(self):
        if self.pipeline not in PIPELINES:
            raise ValueError(f"unknown pipeline {self.pipeline!r}; one of {PIPELINES}")
        if self.pipeline != "hybrid" and self.hot_rows is None:
            raise ValueError(f"{self.pipeline} needs hot rows")
        if self.skip_stale and self.pipeline != "hotline":
            raise ValueError("skip_stale runs on the hotline pipeline")
        if self.fae_phase_batches < 1:
            raise ValueError("fae_phase_batches must be >= 1")
        if not 0 <= self.max_skip < 1:
            raise ValueError(f"max_skip must lie in [0, 1) (got {self.max_skip})")
        if self.probe_samples < 1:
            raise ValueError(f"probe_samples must be >= 1 (got {self.probe_samples})")
        if not -1 < self.max_loss_increase <= 10:
            raise ValueError(f"max_loss_increase must lie in (-1, 10] (got {self.max_loss_increase})")


@dataclass
class RunResult:
    name: str
    train_time_s: float
    samples: int                 # inputs consumed (skipped ones included)
    trained_samples: int         # inputs trained on
    test_logloss: float
    test_auc: float
    curve: list[tuple[float, int, float, float]]   # (train seconds, samples consumed, test logloss, auc)
    counters: dict[str, float] = field(default_factory=dict)
    device: str = "cpu"          # the device it trained on (resolved), e.g. "cpu" or "cuda:0 (NVIDIA H200)"
    picks: list = field(default_factory=list)  # Slipstream: hot.Pick of every threshold pick, in order

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.train_time_s


# ----- model -----------------------------------------------------------------------------------
class _Rows:
    """DLRM sparse input whose embeddings were gathered already: [B, T, dim]."""

    def __init__(self, emb: torch.Tensor, keys: list[str]):
        self.emb, self._keys = emb, keys

    def keys(self) -> list[str]:
        return self._keys

    def pool(self, tables) -> dict[str, torch.Tensor]:
        return dict(zip(self._keys, self.emb.unbind(1)))  # one backward op, not one per table


def init_tables(offsets: np.ndarray, dim: int, seed: int) -> np.ndarray:
    """The DLRM reference init (uniform +-rows^-0.5 per table), the same for every variant."""
    g = np.random.default_rng([seed, 41])
    out = np.empty((int(offsets[-1]), dim), np.float32)
    for a, b in zip(offsets[:-1], offsets[1:]):
        bound = (b - a) ** -0.5
        out[a:b] = g.uniform(-bound, bound, (b - a, dim))
    return out


def build_model(ds: Dataset, cfg: TrainConfig) -> DLRM:
    torch.manual_seed(cfg.seed)
    keys = {f"t{t}": 1 for t in range(ds.num_tables)}  # the tables live in the tiers, not in the module
    return DLRM(ds.dense.shape[1], keys, cfg.dim, bottom=cfg.bottom, top=cfg.top)


def dense_params(model: DLRM) -> list[nn.Parameter]:
    return [p for n, p in model.named_parameters() if not n.startswith("tables.")]


# ----- prepared inputs -------------------------------------------------------------------------
@dataclass
class Micro:
    """One micro-batch, prepared: dense features, labels, unique rows, inverse map, slots, and which
    of the unique rows come from the slow tier."""

    dense: torch.Tensor
    labels: torch.Tensor
    ids: np.ndarray          # [b, T] global rows (Slipstream re-prepares after skipping)
    uniq: np.ndarray
    inv: torch.Tensor        # [b, T] positions in uniq
    slots: np.ndarray        # fast-tier slot of each unique row, -1: cold
    cold: np.ndarray         # positions in uniq read from / written to the slow tier
    host_dense: np.ndarray   # the dense features and labels on the host (Slipstream re-prepares from them)
    host_labels: np.ndarray
    cold_pos: torch.Tensor   # ``cold`` on the device
    hot_pos: torch.Tensor    # positions in uniq of the hot rows, on the device
    hot_slot: torch.Tensor   # their fast-tier slots, on the device


def prepare(dense: np.ndarray, ids: np.ndarray, labels: np.ndarray, slots: np.ndarray | None,
            all_slow: bool, place: Placement | None = None) -> Micro:
    """A micro-batch's inputs, unique rows and index tensors, on ``place``'s device (default: the CPU)."""
    put = place.put if place is not None else (lambda t: t)
    uniq, inv = np.unique(ids, return_inverse=True)
    s = slots[uniq] if slots is not None else np.full(len(uniq), -1, np.int64)
    cold = np.arange(len(uniq)) if all_slow else np.flatnonzero(s < 0)
    hot = np.flatnonzero(s >= 0)
    return Micro(put(torch.from_numpy(dense)), put(torch.from_numpy(labels)), ids, uniq,
                 put(torch.from_numpy(inv.reshape(ids.shape))), s, cold, dense, labels, put(torch.from_numpy(cold)),
                 put(torch.from_numpy(hot)), put(torch.from_numpy(s[hot])))


def epoch_orders(n: int, epochs: int, seed: int) -> list[np.ndarray]:
    g = np.random.default_rng([seed, 7])
    return [g.permutation(n) for _ in range(epochs)]


def batches_of(order: np.ndarray, batch: int) -> list[np.ndarray]:
    return [order[i:i + batch] for i in range(0, len(order), batch)]


def fae_schedule(order: np.ndarray, hot: np.ndarray, batch: int, phase_batches: int) -> list[tuple[bool, np.ndarray]]:
    """FAE's epoch: the epoch's order split into hot and cold inputs (order kept), batched within
    each, and laid out as phases of ``phase_batches`` hot batches, each followed by its even share of
    the cold batches (the phase length is set in hot batches, so the syncs' cost per hot batch does
    not depend on the epoch's size)."""
    hb = batches_of(order[hot[order]], batch)
    cb = batches_of(order[~hot[order]], batch)
    phases = max(1, -(-len(hb) // phase_batches))
    out: list[tuple[bool, np.ndarray]] = []
    for k in range(phases):
        out += [(True, b) for b in hb[k * len(hb) // phases:(k + 1) * len(hb) // phases]]
        out += [(False, b) for b in cb[k * len(cb) // phases:(k + 1) * len(cb) // phases]]
    return out


# ----- the trainer -------------------------------------------------------------------------------
class Trainer:
    """``place``: the device and its copies (default: ``cfg.device`` resolved, device.Placement)."""

    def __init__(self, ds: Dataset, cfg: TrainConfig, variant: Variant, table0: np.ndarray,
                 place: Placement | None = None):
        self.ds, self.cfg, self.v = ds, cfg, variant
        self.place = place if place is not None else Placement.for_device(cfg.device)
        torch.set_num_threads(cfg.threads)
        self.model = build_model(ds, cfg).to(self.place.device)  # initialised on the host, then moved
        self.keys = self.model.keys
        self.params = dense_params(self.model)
        self.opt = torch.optim.SGD(self.params, lr=cfg.lr)
        self.slots = hot_slots(variant.hot_rows, ds.total_rows) if variant.hot_rows is not None else None
        self.hot_ids = variant.hot_rows
        # the fast tier: the hot rows and their accumulators on the device
        self.hot_w = self.place.put(torch.from_numpy(table0[variant.hot_rows].copy())) \
            if variant.hot_rows is not None else None
        self.hot_acc = self.place.zeros(len(variant.hot_rows)) if variant.hot_rows is not None else None
        self.fast_authoritative = variant.pipeline in ("hotline", "cache")  # fae: only during hot phases
        self.table0 = table0
        self.rule: StalenessRule | None = None  # Slipstream's rule of the last run (its picks), else None
        self.counters: dict[str, float] = {"syncs": 0, "sync_rows": 0, "gather_s": 0.0, "gather_wait_s": 0.0,
                                           "skipped": 0, "popular_inputs": 0, "sync_gathered": 0,
                                           "blocking_gather_s": 0.0, "stale_rule_s": 0.0,
                                           "prepare_s": 0.0}  # untimed re-preparation after skips
        dense, ids, labels = ds.split("test")
        self.test = (self.place.put(torch.from_numpy(dense)), ids, labels)
        self.test_uniq, inv = np.unique(ids, return_inverse=True)
        self.test_inv = self.place.put(torch.from_numpy(inv.reshape(ids.shape)))
        test_slots = self.slots[self.test_uniq] if self.slots is not None else np.full(len(self.test_uniq), -1)
        hot = np.flatnonzero(test_slots >= 0)
        self.test_hot = (self.place.put(torch.from_numpy(hot)), self.place.put(torch.from_numpy(test_slots[hot])))

    # --- one step over one or two micro-batches ---
    def _forward_backward(self, m: Micro, rows: torch.Tensor, scale: float) -> torch.Tensor:
        u = rows.requires_grad_(True)
        emb = u[m.inv]
        logits = self.model(m.dense, [_Rows(emb, self.keys)])
        loss = nn.functional.binary_cross_entropy_with_logits(logits, m.labels, reduction="sum") * scale
        loss.backward()
        return u.grad

    def _rows(self, m: Micro, slow_rows: np.ndarray | None) -> torch.Tensor:
        """The step's unique rows on the device: hot ones from the fast tier, the slow tier's (host
        rows) copied host-to-device."""
        if len(m.cold) == len(m.uniq):  # all from the slow tier
            return self.place.to_device(slow_rows)
        rows = self.place.empty(len(m.uniq), self.cfg.dim)
        rows[m.hot_pos] = self.hot_w[m.hot_slot]
        if len(m.cold):
            rows[m.cold_pos] = self.place.to_device(slow_rows)
        return rows

    def _apply(self, micros: list[Micro], grads: list[torch.Tensor | None], tier: SlowTier) -> None:
        """Row-wise Adagrad on every row the step touched, where the row is authoritative: cold rows
        by one sparse update sent to the slow tier, hot rows in the fast tier (a row in both
        micro-batches gets the sum of its gradients, as in one hybrid step)."""
        lr = self.cfg.emb_lr
        hot_slots, hot_grads = [], []
        for m, g in zip(micros, grads):
            if g is None:
                continue
            if len(m.cold):  # the slow rows' gradients copied device-to-host, then sent
                tier.update(m.uniq[m.cold], self.place.to_host(g[m.cold_pos]), lr)
            if len(m.cold) < len(m.uniq):
                hot_slots.append(m.hot_slot)
                hot_grads.append(g[m.hot_pos])
        if hot_slots:
            slots, g = torch.cat(hot_slots), torch.cat(hot_grads)
            if len(hot_slots) > 1:
                slots, inv = torch.unique(slots, return_inverse=True)
                g = self.place.zeros(len(slots), g.shape[1]).index_add_(0, inv, g)
            acc = self.hot_acc[slots] + (g * g).mean(dim=1)
            self.hot_acc[slots] = acc
            self.hot_w[slots] -= (lr / (acc.sqrt() + EPS))[:, None] * g

    def step(self, micros: list[Micro], tier: SlowTier) -> None:
        """Hybrid / FAE: one micro-batch; Hotline: popular first while the rest's cold rows are
        gathered in the background."""
        n = sum(len(m.labels) for m in micros)
        if n == 0:
            return
        scale = 1.0 / n
        grads = []
        if len(micros) == 1:
            m = micros[0]
            t0 = time.perf_counter()
            slow = tier.gather(m.uniq[m.cold]) if len(m.cold) else None
            self.counters["blocking_gather_s"] += time.perf_counter() - t0  # includes queued updates ahead of it
            grads.append(self._forward_backward(m, self._rows(m, slow), scale))
        elif not self.v.overlap_gather:  # hotline without the overlap: the rest's cold rows first, inline
            pop, rest = micros
            t0 = time.perf_counter()
            slow = tier.gather(rest.uniq[rest.cold]) if len(rest.cold) else None
            self.counters["blocking_gather_s"] += time.perf_counter() - t0
            grads.append(self._forward_backward(pop, self._rows(pop, None), scale) if len(pop.labels) else None)
            grads.append(self._forward_backward(rest, self._rows(rest, slow), scale) if len(rest.labels) else None)
        else:
            pop, rest = micros
            fut = tier.gather_async(rest.uniq[rest.cold]) if len(rest.cold) else None
            if len(pop.labels):
                grads.append(self._forward_backward(pop, self._rows(pop, None), scale))
            else:
                grads.append(None)
            if fut is not None:
                t0 = time.perf_counter()
                slow, took = fut.result()
                self.counters["gather_wait_s"] += time.perf_counter() - t0
                self.counters["gather_s"] += took
            else:
                slow = None
            grads.append(self._forward_backward(rest, self._rows(rest, slow), scale) if len(rest.labels) else None)
        with torch.no_grad():
            self._apply(micros, grads, tier)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    # --- FAE phase switches ---
    def to_cold_phase(self, tier: SlowTier) -> None:
        if self.fast_authoritative:
            tier.write(self.hot_ids, self.place.to_host(torch.cat([self.hot_w, self.hot_acc[:, None]], dim=1)))
            self.fast_authoritative = False
            self.counters["syncs"] += 1
            self.counters["sync_rows"] += len(self.hot_ids)

    def to_hot_phase(self, tier: SlowTier) -> None:
        if not self.fast_authoritative:
            both = self.place.to_device(tier.gather(self.hot_ids, with_state=True))
            self.counters["sync_gathered"] += len(self.hot_ids)
            self.hot_w, self.hot_acc = both[:, :-1].contiguous(), both[:, -1].contiguous()
            self.fast_authoritative = True
            self.counters["syncs"] += 1
            self.counters["sync_rows"] += len(self.hot_ids)

    # --- Slipstream's loss probe (timed: it runs inside the training loop) ---
    def loss_probe(self, dense: np.ndarray, ids: np.ndarray, labels: np.ndarray):
        """The current model's loss per input on ``idx`` of the given (training) inputs, no gradient;
        they must be popular (every row hot), so their rows come from the fast tier alone."""
        def loss(idx: np.ndarray) -> np.ndarray:
            uniq, inv = np.unique(ids[idx], return_inverse=True)
            s = self.slots[uniq]
            if (s < 0).any():
                raise ValueError("the loss probe takes popular inputs only (every row hot)")
            with torch.no_grad():
                emb = self.hot_w[self.place.put(torch.from_numpy(s))][self.place.put(
                    torch.from_numpy(inv.reshape(len(idx), -1)))]
                logits = self.model(self.place.put(torch.from_numpy(dense[idx])), [_Rows(emb, self.keys)])
                out = nn.functional.binary_cross_entropy_with_logits(
                    logits, self.place.put(torch.from_numpy(labels[idx])), reduction="none")
            return self.place.to_numpy(out)
        return loss

    # --- evaluation (not timed) ---
    @torch.no_grad()
    def evaluate(self, tier: SlowTier) -> tuple[float, float]:
        table = self.place.to_device(tier.gather(self.test_uniq))
        if self.hot_w is not None and self.fast_authoritative:
            pos, slot = self.test_hot
            table[pos] = self.hot_w[slot]
        dense, _, labels = self.test
        logits = []
        for i in range(0, len(labels), 8192):
            emb = table[self.test_inv[i:i + 8192]]
            logits.append(self.model(dense[i:i + 8192], [_Rows(emb, self.keys)]))
        p = self.place.to_numpy(torch.sigmoid(torch.cat(logits)))
        return logloss(labels, p), auc(labels, p)

    # --- a whole run ---
    def run(self) -> RunResult:
        ds, cfg, v = self.ds, self.cfg, self.v
        dense, ids, labels = ds.split("train")
        hot_in = hot_inputs(ids, self.slots) if self.slots is not None else None
        plan: list[tuple[str, list[Micro]]] = []   # (kind, micro-batches) per step; kind: hot, cold, mixed
        place = self.place
        for order in epoch_orders(len(labels), cfg.epochs, cfg.seed):
            if v.pipeline == "fae":
                for is_hot, b in fae_schedule(order, hot_in, cfg.batch_size, v.fae_phase_batches):
                    micro = prepare(dense[b], ids[b], labels[b], self.slots, not is_hot, place)
                    plan.append(("hot" if is_hot else "cold", [micro]))
            else:
                for b in batches_of(order, cfg.batch_size):
                    if v.pipeline == "hybrid":
                        plan.append(("cold", [prepare(dense[b], ids[b], labels[b], None, True, place)]))
                    elif v.pipeline == "cache":
                        plan.append(("cached", [prepare(dense[b], ids[b], labels[b], self.slots, False, place)]))
                    else:
                        pb, rb = b[hot_in[b]], b[~hot_in[b]]
                        plan.append(("mixed", [prepare(dense[pb], ids[pb], labels[pb], self.slots, False, place),
                                               prepare(dense[rb], ids[rb], labels[rb], self.slots, False, place)]))
        steps_per_epoch = len(plan) // cfg.epochs
        eval_every = max(1, steps_per_epoch // cfg.evals_per_epoch)
        rule = StalenessRule(self.slots, v.max_skip, v.max_loss_increase,
                             update_scale(cfg.emb_lr, cfg.dim, v.snapshot_every), v.probe_samples) \
            if v.skip_stale else None
        probe = self.loss_probe(dense, ids, labels) if rule is not None else None
        self.rule = rule
        rng = np.random.default_rng([cfg.seed, 99])
        with SlowTier(self.table0, row_cost_s=cfg.slow_row_us * 1e-6) as tier:
            if v.pipeline == "fae":
                self.fast_authoritative = False
            curve = [(0.0, 0, *self.evaluate(tier))]
            clock, consumed, trained = 0.0, 0, 0
            self._batch_gathered = 0
            for i, (kind, micros) in enumerate(plan):
                t0 = time.perf_counter()
                untimed = 0.0  # preparation inside this step (Slipstream's kept inputs): not training time
                consumed += sum(len(m.labels) for m in micros)
                if v.pipeline == "fae":
                    (self.to_hot_phase if kind == "hot" else self.to_cold_phase)(tier)
                if rule is not None:
                    if i >= v.stale_warmup and (i - v.stale_warmup) % v.snapshot_every == 0:
                        t1 = time.perf_counter()
                        rule.observe(place.to_host(self.hot_w), ids, rng, probe)  # a snapshot: device-to-host
                        self.counters["stale_rule_s"] += time.perf_counter() - t1  # snapshot, drift, probe, pick
                    pop = micros[0]
                    skip = rule.skippable(pop.ids)  # the input classifier: timed, Slipstream's own cost
                    if skip.any():
                        keep = ~skip
                        # the kept inputs' micro-batch is data-loader work, as every variant's preparation:
                        # outside the clock (``clock`` excludes it; its time is counted in ``prepare_s``).
                        # The device's queued work (the last step's updates) finishes first, timed, so the
                        # paused window holds only this host-side preparation and its copy, waited for.
                        place.sync()
                        t1 = time.perf_counter()
                        micros = [prepare(pop.host_dense[keep], pop.ids[keep], pop.host_labels[keep],
                                          self.slots, False, place), micros[1]]
                        place.sync()
                        untimed += time.perf_counter() - t1
                        self.counters["skipped"] += int(skip.sum())
                if kind == "mixed":
                    self.counters["popular_inputs"] += len(micros[0].labels)
                before = tier.rows_gathered
                self.step(micros, tier)
                self._batch_gathered += tier.rows_gathered - before
                if i == len(plan) - 1 or (i + 1) % eval_every == 0:
                    tier.barrier()  # the slow tier has applied every update sent: they count as training time
                    place.sync()    # and the device has run every kernel queued (CUDA runs asynchronously)
                clock += time.perf_counter() - t0 - untimed
                self.counters["prepare_s"] += untimed
                trained += sum(len(m.labels) for m in micros)
                if i == len(plan) - 1 or (i + 1) % eval_every == 0:
                    curve.append((clock, consumed, *self.evaluate(tier)))
            # batch traffic only: the syncs' rows are counted apart (sync_rows); evaluation gathers excluded
            self.counters["rows_gathered"] = self._batch_gathered
            self.counters["rows_sent"] = tier.rows_sent - (self.counters["sync_rows"] - self.counters["sync_gathered"])
            # the sleep requested of the tier (row cost x rows, evaluations' gathers included): an emulated cost
            self.counters["injected_sleep_s"] = tier.injected_s
        final = curve[-1]
        self.counters["hot_input_fraction"] = float(hot_in.mean()) if hot_in is not None else 0.0
        self.counters["hot_rows"] = len(self.hot_ids) if self.hot_ids is not None else 0
        self.counters["stale_threshold"] = float(rule.threshold or 0.0) if rule is not None else 0.0
        if rule is not None:
            picks = rule.picks
            self.counters["stale_picks"] = len(picks)
            self.counters["stale_quantile_max"] = max((k.quantile for k in picks), default=0.0)
            self.counters["stale_quantile_min"] = min((k.quantile for k in picks), default=0.0)
            for bound in ("loss", "cap", "both", "none"):  # which constraint stopped a larger threshold, per pick
                self.counters[f"stale_bound_{bound}"] = sum(k.bound == bound for k in picks)
            self.counters["stale_skip_share_mean"] = float(np.mean([k.skip_share for k in picks])) if picks else 0.0
            self.counters["stale_probed"] = rule.probed
        for k, n in place.describe().items():
            if k.startswith(("h2d_", "d2h_")):
                self.counters[k] = n  # the host<->device copies (evaluations' included)
        return RunResult(v.name, clock, consumed, trained, final[2], final[3], curve, dict(self.counters), str(place),
                         list(rule.picks) if rule is not None else [])


def train(ds: Dataset, cfg: TrainConfig, variant: Variant) -> RunResult:
    table0 = init_tables(ds.offsets, cfg.dim, cfg.seed)
    return Trainer(ds, cfg, variant, table0).run()
