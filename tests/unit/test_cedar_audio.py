"""cedar's third benchmark pipeline (audio): its operators against independent computations, and
the optimized pipeline, cedar as written and the DataLoader baseline yielding the same samples."""
from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from mlsys_flows.systems.cedar import Params, make_workload, pipelines
from mlsys_flows.systems.cedar.workloads import (LogMel, RandomTimeCrop, Resample, SpecAugment, TorchLoader,
                                                 decode_wav, encode_wav, make_clip, mel_filterbank, multiset,
                                                 normalize_mel)


class MemStore(dict):
    """The byte/parquet interface of ObjectStorage, in memory."""

    def write_bytes(self, key, data):
        self[key] = bytes(data)

    def read_bytes(self, key):
        return self[key]

    def write_parquet(self, key, table, row_group_size=None):
        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(table, buf, row_group_size=row_group_size)
        self[key] = buf.getvalue()

    def open_input(self, key):
        return io.BytesIO(self[key])


@pytest.fixture(scope="module")
def audio():
    p = Params.for_scale("smoke", n_images=8, n_docs=8, n_clips=24, clip_seconds=0.5, batch_size=5)
    store = MemStore()
    manifest = make_workload(p, store, "data")
    return p, store, manifest, pipelines(p, store, manifest)["audio"]


# ----- operators against independent computations --------------------------------------------

def test_wav_round_trip_and_clip_shape():
    rng = np.random.default_rng(1)
    pcm = make_clip(rng, 4, 0.3, 22050)
    assert pcm.dtype == np.int16 and len(pcm) == round(0.3 * 22050) and np.abs(pcm).max() > 10000
    data = encode_wav(pcm, 22050)
    with wave.open(io.BytesIO(data)) as w:  # a standard WAV file
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 22050, len(pcm))
    s = decode_wav({"data": data, "label": 4})
    assert "data" not in s and s["rate"] == 22050 and s["label"] == 4
    np.testing.assert_array_equal(s["wave"], pcm.astype(np.float32) / 32768)


def test_resample_keeps_the_frequency_and_the_duration():
    src, dst, f = 44100, 16000, 1000.0
    t = np.arange(src) / src  # one second
    out = Resample(dst)({"wave": np.sin(2 * np.pi * f * t).astype(np.float32), "rate": src})
    assert out["rate"] == dst and out["wave"].dtype == np.float32
    assert len(out["wave"]) == dst
    spectrum = np.abs(np.fft.rfft(out["wave"]))
    assert np.argmax(spectrum) * dst / len(out["wave"]) == pytest.approx(f, abs=2)
    assert Resample(dst)({"wave": out["wave"], "rate": dst})["wave"] is out["wave"]  # already at the rate


def test_log_mel_matches_a_frame_by_frame_computation():
    rate, n_fft, hop, n_mels = 16000, 400, 160, 32
    x = np.random.default_rng(2).normal(0, 0.1, 4000).astype(np.float32)
    got = LogMel(rate, n_fft, hop, n_mels)({"wave": x, "rate": rate, "label": 1})
    assert set(got) == {"mel", "label"}
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    fb = mel_filterbank(rate, n_fft, n_mels).astype(np.float64)
    cols = []
    for start in range(0, len(x) - n_fft + 1, hop):
        power = np.abs(np.fft.rfft(x[start:start + n_fft].astype(np.float64) * window)) ** 2
        cols.append(np.log(fb @ power + 1e-6))
    np.testing.assert_allclose(got["mel"], np.array(cols).T, rtol=1e-4, atol=1e-4)


def test_mel_filters_are_triangles_peaking_at_mel_spaced_centres():
    fb = mel_filterbank(16000, 512, 20)
    assert fb.shape == (20, 257) and fb.min() >= 0 and fb.max() <= 1
    peaks = fb.argmax(axis=1)
    assert np.all(np.diff(peaks) > 0)  # centres increase
    assert np.all(np.diff(np.diff(peaks)) >= -1)  # and spread out (mel spacing), up to rounding


def test_normalize_and_augment():
    rng = np.random.default_rng(3)
    s = {"mel": rng.normal(5, 3, (16, 50)).astype(np.float32)}
    n = normalize_mel(s)["mel"]
    np.testing.assert_allclose(n.mean(axis=1), 0, atol=1e-5)
    np.testing.assert_allclose(n.std(axis=1), 1, atol=1e-3)
    aug = SpecAugment(freq_masks=1, max_freq=4, time_masks=1, max_time=6)({"mel": n}, np.random.default_rng(0))["mel"]
    assert aug.shape == n.shape and not np.shares_memory(aug, n)
    zero_rows, zero_cols = np.all(aug == 0, axis=1).sum(), np.all(aug == 0, axis=0).sum()
    assert zero_rows <= 4 and zero_cols <= 6 and np.count_nonzero(aug != n) <= 4 * 50 + 6 * 16
    crop = RandomTimeCrop(20)({"mel": n}, np.random.default_rng(0))["mel"]
    assert crop.shape == (16, 20) and any(np.array_equal(crop, n[:, t:t + 20]) for t in range(31))
    short = RandomTimeCrop(80)({"mel": n}, np.random.default_rng(0))["mel"]
    assert short.shape == (16, 80) and np.all(short[:, 50:] == 0)  # zero-padded


# ----- the pipeline -----------------------------------------------------------------------------

def test_audio_pipeline_batches(audio):
    p, _, manifest, build = audio
    batches = list(build(None).iterate(0))
    assert sum(len(b["label"]) for b in batches) == p.n_clips
    assert batches[0]["mel"].shape == (5, p.n_mels, p.crop_frames) and batches[0]["mel"].dtype == np.float32
    assert sorted(np.concatenate([b["label"] for b in batches]).tolist()) == sorted(manifest["clip_labels"])


def test_audio_plan_caches_the_deterministic_prefix(audio, tmp_path):
    _, _, _, build = audio
    fast = build(None).optimize(epochs=3, cache=str(tmp_path), workers=1)
    stage = fast.plan.steps[0]
    names = [o.name for o in stage.ops]
    assert fast.plan.cache is not None and names[:stage.cache_ops][-1] in ("log_mel", "normalize_mel")
    assert {"spec_augment", "time_crop"}.isdisjoint(names[:stage.cache_ops])  # random ops are never cached


@pytest.mark.parametrize("mode,workers", [("always", 2), ("cost", 2), ("cost", 1)])
def test_audio_optimized_equals_as_written(audio, tmp_path, mode, workers):
    """Same multiset of samples in epochs 0 and 1 (epoch 1 serves the cached prefix), whatever plan."""
    _, _, _, build = audio
    pipe = build(None)
    with pipe.optimize(epochs=2, cache=str(tmp_path), workers=workers, sample=8, mode=mode) as fast:
        if mode == "always":
            assert fast.plan.steps[0].cold == "process" and fast.plan.cache is not None
        epochs = [multiset(fast.iterate(e)) for e in range(2)]
    ref = [multiset(pipe.iterate(e)) for e in range(2)]
    assert epochs == ref and ref[0] != ref[1]  # and the random ops are redrawn each epoch


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_across_epochs_equals_as_written(audio, workers):
    _, _, _, build = audio
    pipe = build(None)
    with TorchLoader(pipe, workers, prefetch_factor=2) as loader:
        got = [multiset(loader.epoch()) for _ in range(2)]
    assert got == [multiset(pipe.iterate(e)) for e in range(2)]


def test_the_epoch_check_catches_a_loader_that_repeats_its_epoch(audio):
    """Companion: loaders rebuilt for every epoch at the same start epoch (a wrong baseline) fail it."""
    _, _, _, build = audio
    pipe = build(None)
    got = []
    for _ in range(2):
        with TorchLoader(pipe, 0) as loader:
            got.append(multiset(loader.epoch()))
    with pytest.raises(AssertionError):
        assert got == [multiset(pipe.iterate(e)) for e in range(2)]


def test_audio_params_are_checked_naming_the_field():
    from mlsys_flows.systems.common.params import ParamsError

    with pytest.raises(ParamsError, match="target_rate"):
        Params.for_scale("smoke", target_rate=48000, source_rate=44100)
    with pytest.raises(ParamsError, match="n_clips"):
        Params.for_scale("smoke", n_clips=2)
    with pytest.raises(ParamsError, match="prefetch_factor"):
        Params.for_scale("smoke", prefetch_factor=0)
