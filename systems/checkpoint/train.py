"""A deterministic training loop that checkpoints through a *saver* (pure: torch only).

The loop calls the saver at the two points lazy asynchronous checkpointing (DataStates-LLM,
HPDC 2024) needs: ``save(step, state)`` right after the optimizer step of every ``every``-th step,
and ``before_update()`` right before each optimizer step, the first moment the state is mutated
again (a lazy saver copies the state to host memory while forward and backward run, and blocks
there only if that copy is not finished). ``wait()`` before the loop returns. A synchronous saver
does all its work in ``save`` and nothing in the other two.

The time spent inside those three calls is the *stall*: what checkpointing blocks training for.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Protocol


class Saver(Protocol):
    def save(self, step: int, state: Any) -> None: ...

    def before_update(self) -> None: ...

    def wait(self) -> None: ...


@dataclass
class TrainResult:
    start_step: int  # optimizer steps already done when this run started (0, or a checkpoint's step)
    steps: int  # optimizer steps done when it ended
    losses: list[float]  # of the steps this run did
    last_loss: float | None  # of the last step, this run's or the checkpoint's it resumed from
    wall_s: float  # the loop, the final wait() included
    stall_s: float  # inside save / before_update / wait
    step_s: list[float] = field(default_factory=list)  # wall time of each step, its stall included
    digest: str = ""  # sha256 of the final parameters and optimizer state
    drain_s: float = 0.0  # of stall_s: the final wait() after the last step (the last flush draining)

    @property
    def loop_stall_s(self) -> float:
        """The stall inside the training loop (save and before_update), the final drain left out."""
        return self.stall_s - self.drain_s

    @property
    def iterations(self) -> int:
        return self.steps - self.start_step


def build(width: int, depth: int, seed: int):
    """An MLP of ``depth`` width x width layers (GELU) and its Adam optimizer, from ``seed``."""
    import torch

    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    # Adam's moments exist from the start, so every checkpoint holds the full state
    for prm in model.parameters():
        opt.state[prm]["step"] = torch.tensor(0.0)
        opt.state[prm]["exp_avg"] = torch.zeros_like(prm)
        opt.state[prm]["exp_avg_sq"] = torch.zeros_like(prm)
    return model, opt


def state_bytes(width: int, depth: int) -> int:
    """Bytes of the tensors of a checkpoint: fp32 parameters and Adam's two moments."""
    return 3 * 4 * depth * (width * width + width)


def batch(step: int, width: int, batch_size: int, seed: int):
    """The (inputs, targets) of ``step``: a pure function of (seed, step), so a resumed run sees the
    same data as an uninterrupted one without any data-loader state in the checkpoint."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(batch_size, width, generator=g)
    return x, torch.tanh(x.roll(1, dims=1))  # a fixed target function the MLP can learn


def state_of(model, opt, step: int, loss: float | None = None) -> dict[str, Any]:
    """The live training state (no copy): what a checkpoint holds (the last loss for the report)."""
    return {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "loss": loss}


def load_state(model, opt, state: dict[str, Any]) -> int:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return int(state["step"])


def digest(model, opt) -> str:
    """sha256 over every parameter and optimizer-state tensor, in a fixed order."""
    import torch

    h = hashlib.sha256()
    for prm in model.parameters():
        h.update(prm.detach().contiguous().numpy().tobytes())
        for name in ("exp_avg", "exp_avg_sq"):
            h.update(opt.state[prm][name].contiguous().numpy().tobytes())
        h.update(torch.as_tensor(opt.state[prm]["step"]).numpy().tobytes())
    return h.hexdigest()


def digest_number(hexdigest: str) -> float:
    """The first 28 bits of a hex digest as an exact float (a counted metric reports can compare)."""
    return float(int(hexdigest[:7], 16))


def train(width: int, depth: int, batch_size: int, steps: int, seed: int, *, saver: Saver | None = None,
          every: int = 0, state: dict[str, Any] | None = None, threads: int | None = None,
          on_step=None) -> TrainResult:
    """Train to ``steps`` optimizer steps (from ``state``'s step when given, else from scratch),
    checkpointing through ``saver`` after every ``every``-th step (0: never)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    model, opt = build(width, depth, seed)
    start = load_state(model, opt, state) if state is not None else 0
    if start > steps:
        raise ValueError(f"the checkpoint is at step {start}, past the {steps} steps of this run")
    loss_fn = torch.nn.MSELoss()
    losses, step_s, stall = [], [], 0.0
    t_begin = time.perf_counter()
    for step in range(start + 1, steps + 1):
        t0 = time.perf_counter()
        x, y = batch(step, width, batch_size, seed)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        if saver is not None:
            s0 = time.perf_counter()
            saver.before_update()  # a lazy snapshot of the previous checkpoint must be complete
            stall += time.perf_counter() - s0
        opt.step()
        losses.append(float(loss.detach()))
        if saver is not None and every and step % every == 0:
            s0 = time.perf_counter()
            saver.save(step, state_of(model, opt, step, losses[-1]))
            stall += time.perf_counter() - s0
        step_s.append(time.perf_counter() - t0)
        if on_step is not None:
            on_step(step)
    drain = 0.0
    if saver is not None:
        s0 = time.perf_counter()
        saver.wait()
        drain = time.perf_counter() - s0
        stall += drain
    wall = time.perf_counter() - t_begin
    last = losses[-1] if losses else (state or {}).get("loss")
    return TrainResult(start_step=start, steps=steps, losses=losses, last_loss=last, wall_s=wall, stall_s=stall, step_s=step_s,
                       digest=digest(model, opt), drain_s=drain)
