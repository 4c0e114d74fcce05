"""The video pipeline's operations and its synthetic workload (pure numpy, no package imports).

This module is loaded by file path inside every serverless worker process (``worker.py``), so it
imports only the standard library and numpy: a cold start pays for the interpreter, numpy and the
classifier's weights, nothing else.

Items are ``(key, payload)`` pairs. Keys: a frame index for decode, sample, motion and detect; a
``(frame, slot)`` pair for an object crop; the video id for the aggregate.
"""
from __future__ import annotations

import zlib

import numpy as np

OPS = ("decode", "sample", "motion", "detect", "classify", "aggregate")
CLASSES = 8
SLOT = 32            # object slot size at full resolution (pixels)
CROP = SLOT // 2     # crop side after the sample op's 2x downscale
HIDDEN = 1536        # classifier hidden width
_MODEL_SEED = 20210202


def _stripes(cls: int, side: int) -> np.ndarray:
    """Class texture: stripes whose period and orientation depend on the class."""
    yy, xx = np.mgrid[0:side, 0:side]
    period = 2 + cls % 4
    coord = xx if cls < 4 else yy
    return np.where((coord // period) % 2 == 0, 0.95, 0.6)


def make_video(seed: int, video: int, frames: int, size: int, motion_share: float, object_rate: float) -> list[tuple[int, bytes]]:
    """A seeded synthetic video: ``frames`` zlib-compressed grey frames (``size`` x ``size``) of a
    dark noisy background with striped objects in a grid of slots. The video alternates static
    segments (objects still, only sensor noise changes) with moving segments (objects shift, appear
    and vanish); ``motion_share`` is the expected share of frames in moving segments."""
    rng = np.random.default_rng([seed, video])
    # videos differ: some are busy (much motion, many objects), some quiet
    motion_share = min(1.0, motion_share * rng.uniform(0.0, 2.0))
    object_rate = min(1.0, object_rate * rng.uniform(0.5, 1.5))
    slots = size // SLOT
    present = rng.random((slots, slots)) < object_rate
    classes = rng.integers(0, CLASSES, (slots, slots))
    offsets = rng.integers(0, SLOT // 4, (slots, slots, 2))
    moving = False
    out = []
    for i in range(frames):
        if i % 8 == 0:  # segment boundaries every 8 frames
            moving = bool(rng.random() < motion_share)
        if moving:
            offsets = np.clip(offsets + rng.integers(-3, 4, offsets.shape), 0, SLOT // 2)
            flip = rng.random((slots, slots)) < 0.1
            present = present ^ flip
        frame = 0.08 + 0.02 * rng.standard_normal((size, size))
        for r in range(slots):
            for c in range(slots):
                if present[r, c]:
                    side = SLOT // 2
                    y, x = r * SLOT + offsets[r, c, 0], c * SLOT + offsets[r, c, 1]
                    frame[y:y + side, x:x + side] = _stripes(int(classes[r, c]), side)
        raw = np.clip(frame * 255, 0, 255).astype(np.uint8)
        out.append((i, zlib.compress(raw.tobytes(), 1)))
    return out


# --- the operations -----------------------------------------------------------------------------

def decode(items, args):
    """Decompress each frame and convert it to float32 in [0, 1]."""
    size = args["size"]
    return [(k, np.frombuffer(zlib.decompress(b), np.uint8).reshape(size, size).astype(np.float32) / 255.0)
            for k, b in items]


def sample(items, args):
    """Keep every ``sample_rate``-th frame and downscale it 2x (mean of 2x2 blocks)."""
    rate = args["sample_rate"]
    out = []
    for k, f in items:
        if k % rate == 0:
            h, w = f.shape
            out.append((k, f.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))))
    return out


def motion(items, args):
    """Frame differencing: a frame goes on when the share of changed pixels (blurred absolute
    difference to the previous sampled frame) exceeds the threshold; the first frame always goes on."""
    thr = args["motion_threshold"]
    out = []
    for k, (cur, prev) in items:
        if prev is None:
            out.append((k, cur))
            continue
        d = np.abs(cur - prev)
        h, w = d.shape
        blurred = d.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))
        if float((blurred > 0.15).mean()) > thr:
            out.append((k, cur))
    return out


FILTERS, KSIZE = 32, 7
_KERNELS = np.random.default_rng(_MODEL_SEED + 1).standard_normal((KSIZE * KSIZE, FILTERS)).astype(np.float32)
_KERNELS[:, 0] = 1.0 / (KSIZE * KSIZE)  # map 0: a box filter (objectness)


def detect(items, args):
    """A small convolutional detector: 32 7x7 filters over the frame (im2col + matmul), objectness =
    box-filtered brightness; a slot whose objectness peak passes the threshold yields a crop. The
    number of crops per frame varies with the content."""
    out = []
    for k, f in items:
        win = np.lib.stride_tricks.sliding_window_view(f, (KSIZE, KSIZE))
        maps = win.reshape(win.shape[0], win.shape[1], KSIZE * KSIZE) @ _KERNELS   # (h-6, w-6, FILTERS)
        obj = np.pad(maps[..., 0], KSIZE // 2)
        h, w = f.shape
        for r in range(h // CROP):
            for c in range(w // CROP):
                cell = obj[r * CROP:(r + 1) * CROP, c * CROP:(c + 1) * CROP]
                if float(cell.max()) > 0.5:
                    out.append(((k, r * (w // CROP) + c), f[r * CROP:(r + 1) * CROP, c * CROP:(c + 1) * CROP].copy()))
    return out


_W1 = np.random.default_rng(_MODEL_SEED).standard_normal((CROP * CROP, HIDDEN)) / CROP
_W2 = np.random.default_rng(_MODEL_SEED + 2).standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)
_W3 = np.random.default_rng(_MODEL_SEED + 3).standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN)


def classify(items, args):
    """A two-hidden-layer MLP (float64) over the flattened crops of one batch: one matmul chain per
    invocation, so larger batches amortise the per-call overhead."""
    if not items:
        return []
    x = np.stack([c.reshape(-1) for _, c in items]).astype(np.float64)
    hdn = np.maximum(x @ _W1, 0.0)
    hdn = np.maximum(hdn @ _W2, 0.0)
    labels = np.argmax(hdn @ _W3, axis=1)
    return [(k, int(lab)) for (k, _), lab in zip(items, labels)]


def aggregate(items, args):
    """Objects per class over the video (the pipeline's answer)."""
    counts = [0] * CLASSES
    for _, lab in items:
        counts[lab] += 1
    return [(args["video"], tuple(counts))]


FUNCS = {"decode": decode, "sample": sample, "motion": motion, "detect": detect, "classify": classify,
         "aggregate": aggregate}


def run(op: str, items, args):
    return FUNCS[op](items, args)
