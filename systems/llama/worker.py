"""A serverless worker process: ``python worker.py TIER``.

Started on demand by :class:`runtime.WorkerPool`. It loads ``ops.py`` by file path (standard
library and numpy only: a cold start is the interpreter, numpy and the classifier's weights),
reports ``ready``, then serves invocations read from stdin as pickles (``(op, items, args)``) and
answers each with ``("ok", outputs, compute_s)`` or ``("error", message, 0.0)`` on the original
stdout. It exits on ``None`` or when stdin closes (its parent died or closed it).
"""
import importlib.util
import os
import pickle
import sys
import time


def main() -> None:
    started = time.perf_counter()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, never into the protocol
    spec = importlib.util.spec_from_file_location("llama_ops", os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops.py"))
    ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ops)
    inp = sys.stdin.buffer
    pickle.dump(("ready", os.getpid(), time.perf_counter() - started), out)
    out.flush()
    while True:
        try:
            msg = pickle.load(inp)
        except (EOFError, OSError, pickle.UnpicklingError):
            break
        if msg is None:
            break
        op, items, args = msg
        t0 = time.perf_counter()
        try:
            reply = ("ok", ops.run(op, items, args), time.perf_counter() - t0)
        except Exception as exc:  # reported to the caller, the worker stays up
            reply = ("error", f"{type(exc).__name__}: {exc}", 0.0)
        try:
            pickle.dump(reply, out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
        except (BrokenPipeError, OSError):
            break


if __name__ == "__main__":
    main()
