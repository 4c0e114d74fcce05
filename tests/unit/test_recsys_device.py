"""The two-tier trainer's device path (systems/recsys_embeddings/device.py), tested on the CPU.

- the one place the device is chosen (``resolve_device``): ``cpu`` always works, ``auto`` is CUDA
  when present, an absent CUDA device falls back to the CPU with a logged warning, anything else
  fails naming ``device``;
- the model, the fast tier (hot rows, accumulators) and the prepared inputs sit on the resolved
  device (on a CUDA machine the same checks run on ``cuda`` too);
- the host<->device copies: a *staged* placement on the CPU routes every slow-tier row and gradient
  through the same staging buffers and ``copy_(..., non_blocking=True)`` calls a CUDA placement uses
  (not pinned: pinning needs CUDA); it trains bit for bit as the copy-free CPU path, and its counts
  match the rows the slow tier moved;
- the CPU results are those of the trainer before the device path existed (golden values below);
- the run records its device, and the report's notes say it.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from mlsys_flows.systems.recsys_embeddings import experiment as ex
from mlsys_flows.systems.recsys_embeddings.device import Placement, resolve_device
from mlsys_flows.systems.recsys_embeddings.trainer import Trainer, init_tables, prepare
from mlsys_flows.systems.slipstream import Params

CUDA = torch.cuda.is_available()
PIPELINES = ("hybrid", "fae", "cache", "hotline", "hotline_sync", "slipstream")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device here"))]

# The trainer before the device path (commit ade042d), this module's parameters, device "cpu": test
# logloss and the counted rows. The row counts do not depend on float rounding (but slipstream's
# skips, which depend on the rows' drift); the logloss tolerance only allows another CPU's rounding.
BEFORE = {
    "hybrid": (0.4469122211148225, dict(rows_gathered=15771, rows_sent=15771, syncs=0, sync_rows=0, skipped=0,
                                        popular_inputs=0)),
    "fae": (0.44843276316255987, dict(rows_gathered=10659, rows_sent=10659, syncs=12, sync_rows=17220, skipped=0,
                                      popular_inputs=0)),
    "cache": (0.4469122210259887, dict(rows_gathered=4529, rows_sent=4529, syncs=0, sync_rows=0, skipped=0,
                                       popular_inputs=0)),
    "hotline": (0.4469122229048734, dict(rows_gathered=4529, rows_sent=4529, syncs=0, sync_rows=0, skipped=0,
                                         popular_inputs=1516)),
    "hotline_sync": (0.4469122229048734, dict(rows_gathered=4529, rows_sent=4529, syncs=0, sync_rows=0, skipped=0,
                                              popular_inputs=1516)),
    "slipstream": (0.44674212581299266, dict(rows_gathered=4529, rows_sent=4529, syncs=0, sync_rows=0, skipped=402,
                                             popular_inputs=1114)),
}


@pytest.fixture(scope="module")
def setup():
    p = Params.for_scale("smoke", samples=2048, test_samples=512, batch_size=256, evals_per_epoch=2, epochs=2,
                         snapshot_every=2, stale_warmup=2, max_skip=0.5,
                         # the golden values' workload and rule: independent tables (the data bit for bit as
                         # then) and a loss tolerance this run never reaches, so the skip cap alone decides
                         popularity_correlation=0.0, max_loss_increase=1.0, probe_samples=2048)
    ds = ex.dataset(p)
    hot, _ = ex.hot_rows(ds, p)
    return p, ds, hot


def trainer(setup, name: str, place: Placement | None = None, device: str = "cpu") -> Trainer:
    p, ds, hot = setup
    return Trainer(ds, ex.config(p, device), ex.variant(name, p, hot), init_tables(ds.offsets, p.embedding_dim, p.seed),
                   place)


def state(tr: Trainer) -> list[torch.Tensor]:
    """The trained state: dense parameters, hot rows and their accumulators (on the host)."""
    out = [x.detach().cpu().clone() for x in tr.params]
    if tr.hot_w is not None:
        out += [tr.hot_w.cpu().clone(), tr.hot_acc.cpu().clone()]
    return out


@pytest.fixture(scope="module")
def plain(setup):
    """Every pipeline on the copy-free CPU path (the default): {name: (trainer, result)}."""
    out = {}
    for name in PIPELINES:
        tr = trainer(setup, name)
        out[name] = (tr, tr.run())
    return out


@pytest.fixture(scope="module")
def staged(setup):
    """Every pipeline on a staged CPU placement (the CUDA copy path, on the CPU)."""
    out = {}
    for name in PIPELINES:
        tr = trainer(setup, name, Placement("cpu", staged=True))
        out[name] = (tr, tr.run())
    return out


# ----- choosing the device ---------------------------------------------------------------------
def test_cpu_always_resolves_and_auto_takes_cuda_only_when_present():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if CUDA else "cpu")
    assert resolve_device(None) == resolve_device("auto")


@pytest.mark.skipif(CUDA, reason="checks the fallback where no CUDA device exists")
@pytest.mark.parametrize("asked", ["cuda", "cuda:0", "cuda:3"])
def test_absent_cuda_falls_back_to_cpu_with_a_warning(asked, caplog):
    with caplog.at_level(logging.WARNING, logger="mlsys_flows.recsys_embeddings"):
        assert resolve_device(asked) == torch.device("cpu")
    assert any(asked in r.getMessage() and "training on cpu" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records), caplog.text


@pytest.mark.skipif(not CUDA, reason="no CUDA device here")
def test_a_visible_cuda_device_is_taken_and_an_invisible_one_falls_back(caplog):
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with caplog.at_level(logging.WARNING, logger="mlsys_flows.recsys_embeddings"):
        assert resolve_device(f"cuda:{torch.cuda.device_count()}") == torch.device("cpu")
    assert "training on cpu" in caplog.text


@pytest.mark.parametrize("bad", ["tpu", "gpu", "cuda:x", "fpga-sw:0", ""])
def test_an_unknown_device_fails_naming_the_parameter(bad, setup):
    with pytest.raises(ValueError, match="device must be"):
        resolve_device(bad)
    with pytest.raises(ValueError, match="device must be"):  # through the trainer's configuration too
        trainer(setup, "hybrid", device=bad)


# ----- what sits where -------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["hybrid", "fae", "hotline"])
def test_model_fast_tier_and_inputs_sit_on_the_resolved_device(setup, device, name):
    p, ds, _ = setup
    tr = trainer(setup, name, device=device)
    want = resolve_device(device)
    assert tr.place.device == want
    tensors = {f"model.{n}": t for n, t in [*tr.model.named_parameters(), *tr.model.named_buffers()]}
    tensors |= {"test.dense": tr.test[0], "test.inv": tr.test_inv}
    if name != "hybrid":
        tensors |= {"hot_w": tr.hot_w, "hot_acc": tr.hot_acc}
    dense, ids, labels = ds.split("train")
    m = prepare(dense[:64], ids[:64], labels[:64], tr.slots, False, tr.place)
    tensors |= {f"micro.{k}": getattr(m, k) for k in ("dense", "labels", "inv", "cold_pos", "hot_pos", "hot_slot")}
    wrong = {k: str(t.device) for k, t in tensors.items() if t.device != want}
    assert not wrong, f"not on {want}: {wrong}"
    # the slow tier's side stays on the host: the micro-batch keeps its host arrays for re-preparing
    assert isinstance(m.host_dense, np.ndarray) and isinstance(m.uniq, np.ndarray)


# ----- the copies --------------------------------------------------------------------------------
def test_staged_copies_go_through_reused_buffers_and_do_not_alias():
    place = Placement("cpu", staged=True)
    rows = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    dev = place.to_device(rows)
    assert torch.equal(dev, torch.from_numpy(rows)) and dev.device == place.device
    rows[:] = 0  # the slow tier's buffer may be reused at once: the device copy is the device's own
    assert dev.abs().sum() > 0
    cap = place._h2d.buf.numel()
    assert cap >= 300 * 8 and cap & (cap - 1) == 0  # grown once, to a power of two
    place.to_device(rows[:10])
    assert place._h2d.buf.numel() == cap  # reused, not reallocated
    g = torch.randn(50, 8)
    host = place.to_host(g)
    assert np.array_equal(host, g.numpy()) and np.shares_memory(host, place._d2h.buf.numpy())
    assert (place.h2d_copies, place.h2d_rows, place.d2h_copies, place.d2h_rows) == (2, 310, 1, 50)
    # the copy-free CPU path: no buffers, the tier's array and the tensor's memory as they are
    free = Placement("cpu")
    a = np.ones((4, 2), np.float32)
    assert np.shares_memory(free.to_device(a).numpy(), a) and free._h2d.buf.numel() == 0


@pytest.mark.parametrize("name", PIPELINES)
def test_staged_copy_path_trains_bit_for_bit_as_the_copy_free_path(plain, staged, name):
    (a_tr, a), (b_tr, b) = plain[name], staged[name]
    assert b_tr.place.staged and not a_tr.place.staged
    assert b_tr.place._h2d.buf.numel() > 0 and b_tr.place._d2h.buf.numel() > 0  # the path was taken
    assert [c[1:] for c in a.curve] == [c[1:] for c in b.curve]  # samples, test logloss, AUC at every evaluation
    for x, y in zip(state(a_tr), state(b_tr), strict=True):
        assert torch.equal(x, y)
    keep = {k: v for k, v in a.counters.items() if not k.endswith("_s")}
    assert keep == {k: v for k, v in b.counters.items() if not k.endswith("_s")}


@pytest.mark.parametrize("name", PIPELINES)
def test_every_row_the_slow_tier_moves_crosses_the_copies(staged, setup, name):
    """Host-to-device: the batches' gathers, FAE's syncs read back, and the evaluations' gathers;
    device-to-host: the gradients sent, FAE's syncs written and Slipstream's snapshots."""
    tr, r = staged[name]
    c = r.counters
    evals = len(r.curve) * len(tr.test_uniq)
    assert c["h2d_rows"] == c["rows_gathered"] + c["sync_gathered"] + evals
    written = c["sync_rows"] - c["sync_gathered"]
    snapshots = c.get("stale_picks", 0) + (1 if name == "slipstream" else 0)  # the first one only snapshots
    assert c["d2h_rows"] == c["rows_sent"] + written + snapshots * c["hot_rows"]
    assert tr.place.d2h_rows == c["d2h_rows"] and tr.place.h2d_rows == c["h2d_rows"]


# ----- the CPU results did not change --------------------------------------------------------------
@pytest.mark.parametrize("name", PIPELINES)
def test_cpu_results_are_those_before_the_device_path(plain, name):
    _, r = plain[name]
    loss, counts = BEFORE[name]
    assert r.device == "cpu"
    assert {k: r.counters[k] for k in counts} == counts
    assert r.samples == 4096 and r.trained_samples == 4096 - counts["skipped"]
    assert r.test_logloss == pytest.approx(loss, abs=1e-6)


def test_the_golden_check_fails_for_a_changed_update(setup):
    """Companion: a trainer whose embedding learning rate differs trains other rows, and the check
    above sees it (the counted rows are the same: the logloss catches it)."""
    p, ds, hot = setup
    from dataclasses import replace

    cfg = replace(ex.config(p), emb_lr=p.emb_lr * 1.5)
    r = Trainer(ds, cfg, ex.variant("hotline", p, hot), init_tables(ds.offsets, p.embedding_dim, p.seed)).run()
    assert r.test_logloss != pytest.approx(BEFORE["hotline"][0], abs=1e-6)


# ----- the device recorded -----------------------------------------------------------------------
def test_runs_and_report_notes_record_the_device(setup):
    p, ds, hot = setup
    q = p.model_copy(update={"epochs": 1, "evals_per_epoch": 1})
    variants = [ex.variant(n, q, hot) for n in ("hybrid", "hotline")]
    runs = ex.run_interleaved(ds, q, variants, 1, device="cpu")
    assert {r["device"] for rs in runs.values() for r in rs} == {"cpu"}
    assert all(r["h2d_rows"] >= r["rows_gathered"] and r["d2h_rows"] >= r["rows_sent"] for rs in runs.values()
               for r in rs)
    assert ex.devices_of(runs) == "cpu" and ex.devices_of({0.0: {"a": {"device": "cuda:0"}}}) == "cuda:0"
    data = {"total_rows": ds.total_rows, "hot_share": ds.hot_share, "positive_rate": float(ds.labels.mean()),
            "bayes_logloss": ds.bayes_logloss}
    result, _ = ex.training_result(runs, q, data, 1)
    notes = " ".join(result.notes)
    assert "every variant trained on cpu" in notes and "no-op copies" in notes
    assert "pinned" not in notes  # the CUDA wording only where CUDA ran
    gpu = ex.device_note("cuda:0 (NVIDIA H200)")
    assert "cuda:0 (NVIDIA H200)" in gpu and "pinned host buffers" in gpu
    assert "GPU" in ex.projection_assumptions(q, "cuda:0")["compute_s"].source
    assert "CPU" in ex.projection_assumptions(q, "cpu")["compute_s"].source


@pytest.mark.skipif(CUDA, reason="checks the fallback where no CUDA device exists")
def test_a_run_asked_for_cuda_without_one_trains_and_records_cpu(setup, caplog):
    p, ds, hot = setup
    q = p.model_copy(update={"epochs": 1, "evals_per_epoch": 1})
    with caplog.at_level(logging.WARNING, logger="mlsys_flows.recsys_embeddings"):
        r = ex.run_once(ds, q, ex.variant("hybrid", q, hot), device="cuda")
    assert r["device"] == "cpu" and "training on cpu" in caplog.text


@pytest.mark.skipif(not CUDA, reason="no CUDA device here")
@pytest.mark.parametrize("name", PIPELINES)
def test_cuda_trains_to_the_cpu_result_up_to_rounding(plain, setup, name):
    """On a CUDA machine: the same pipeline on the GPU reaches the CPU run's logloss (float rounding
    differs), moves the same rows and records the GPU."""
    tr = trainer(setup, name, device="cuda")
    r = tr.run()
    _, a = plain[name]
    assert r.device.startswith("cuda") and tr.place.cuda and tr.place._h2d.buf.is_pinned()
    assert r.test_logloss == pytest.approx(a.test_logloss, abs=2e-3)
    if name != "slipstream":  # skipping depends on the rows' drift, which rounding moves
        assert r.counters["rows_gathered"] == a.counters["rows_gathered"]
