"""The slow tier: the full embedding tables in host memory behind a separate process that serves
gathers and applies sparse SGD updates (parameter-server style, as in CPU-GPU hybrid and XDL-style
training) with their row-wise Adagrad state (one accumulator per row, as in DLRM's fused
row-wise Adagrad). The trainer talks to it over a Unix socket pair: every gathered or updated row crosses
the process boundary as bytes, so every variant pays the same real per-row cost for the same
accesses. The server is a plain subprocess (``python tier.py``, not a multiprocessing child: it
also starts inside daemonic Dask worker processes), started and stopped by :class:`SlowTier`; a
finalizer kills it if the trainer forgets, and the server exits when its socket closes.

Protocol (little endian): a 17-byte header ``op:u8, n:u64, value:f64`` then the payload.
GATHER n ids -> n*dim float32 rows (value 1: n*(dim+1), the rows with their accumulators); UPDATE
n ids + n*dim grads: row-wise Adagrad with learning rate ``value`` (ids unique), no reply; WRITE n ids
+ n*(dim+1) rows with accumulators, no reply; PING -> one byte (a barrier); STOP.
"""
from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

HEADER = struct.Struct("<BQd")
GATHER, UPDATE, WRITE, PING, STOP = 1, 2, 3, 4, 5


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("slow tier connection closed")
        got += n


def _recv(sock: socket.socket, nbytes: int) -> bytearray:
    buf = bytearray(nbytes)
    _recv_into(sock, memoryview(buf))
    return buf


EPS = 1e-8


def adagrad_rows(w: np.ndarray, acc: np.ndarray, grads: np.ndarray, lr: float) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise Adagrad: the new rows and accumulators of the rows ``w`` [n, dim] with ``acc`` [n]."""
    acc = acc + np.mean(grads * grads, axis=1, dtype=np.float32)
    return w - (np.float32(lr) / (np.sqrt(acc) + np.float32(EPS)))[:, None] * grads, acc


def serve(sock: socket.socket, table: np.ndarray, row_cost_s: float = 0.0) -> None:
    """The server loop (runs in the tier process); ``table`` [rows, dim + 1]: rows, accumulator.
    ``row_cost_s``: an added cost per row gathered, updated or written (the process sleeps that long
    per row before it replies or takes the next request): a slower slow tier, the regime's knob."""
    dim = table.shape[1] - 1
    sock.sendall(b"R")
    while True:
        try:
            op, n, value = HEADER.unpack(_recv(sock, HEADER.size))
        except ConnectionError:
            return
        if op == STOP:
            return
        if op == PING:
            sock.sendall(b"P")
            continue
        ids = np.frombuffer(_recv(sock, 8 * n), np.int64)
        if row_cost_s > 0 and n:
            time.sleep(n * row_cost_s)
        if op == GATHER:
            sock.sendall(np.ascontiguousarray(table[ids] if value else table[ids, :dim]).data)
        elif op == UPDATE:
            grads = np.frombuffer(_recv(sock, 4 * n * dim), np.float32).reshape(n, dim)
            cur = table[ids]
            w, acc = adagrad_rows(cur[:, :dim], cur[:, dim], grads, value)
            cur[:, :dim], cur[:, dim] = w, acc
            table[ids] = cur
        elif op == WRITE:
            table[ids] = np.frombuffer(_recv(sock, 4 * n * (dim + 1)), np.float32).reshape(n, dim + 1)
        else:
            raise ValueError(f"unknown op {op}")


def _stop(proc: subprocess.Popen, sock: socket.socket) -> None:
    try:
        sock.sendall(HEADER.pack(STOP, 0, 0.0))
    except OSError:
        pass
    sock.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class SlowTier:
    """Client of one tier process holding ``table`` [rows, dim] (a copy: the process owns it) and a
    zero Adagrad accumulator per row."""

    def __init__(self, table: np.ndarray, row_cost_s: float = 0.0):
        if row_cost_s < 0:
            raise ValueError(f"row_cost_s must be >= 0 (got {row_cost_s})")
        table = np.concatenate([np.asarray(table, np.float32), np.zeros((len(table), 1), np.float32)], axis=1)
        self.rows, self.dim = table.shape[0], table.shape[1] - 1
        with tempfile.TemporaryDirectory(prefix="slowtier-") as tmp:
            path = os.path.join(tmp, "init.npy")
            np.save(path, table)
            ours, theirs = socket.socketpair()
            for s in (ours, theirs):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
            # run as a script, not ``-m``: the server needs numpy only, not the package's imports
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), path, str(theirs.fileno()),
                                          repr(float(row_cost_s))],
                                         pass_fds=(theirs.fileno(),))
            theirs.close()
            self.sock = ours
            self._finalizer = weakref.finalize(self, _stop, self.proc, self.sock)
            ours.settimeout(120)
            if _recv(ours, 1) != b"R":
                raise RuntimeError("slow tier did not start")
            ours.settimeout(None)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="slowtier-gather")
        self.rows_gathered = 0
        self.rows_sent = 0
        self.row_cost_s = float(row_cost_s)

    @property
    def injected_s(self) -> float:
        """Seconds of sleep requested of the tier process so far (``row_cost_s`` x the rows of every
        gather, update and write sent): the part of its cost that is emulated, not measured. The
        request, not the time slept: ``time.sleep`` overshoots small requests, so it slept at least this."""
        return self.row_cost_s * (self.rows_gathered + self.rows_sent)

    # ----- requests --------------------------------------------------------------------------
    def gather(self, ids: np.ndarray, with_state: bool = False) -> np.ndarray:
        """Rows [n, dim]; ``with_state``: [n, dim + 1], each row with its Adagrad accumulator."""
        ids = np.ascontiguousarray(ids, np.int64)
        out = np.empty((len(ids), self.dim + with_state), np.float32)
        self.sock.sendall(HEADER.pack(GATHER, len(ids), float(with_state)) + ids.tobytes())
        if len(ids):
            _recv_into(self.sock, memoryview(out).cast("B"))
        self.rows_gathered += len(ids)
        return out

    def gather_async(self, ids: np.ndarray) -> Future:
        """The gather on a background thread (the socket is not used by anyone else until it is done);
        the future's result is (rows, seconds the gather took)."""
        def job():
            t0 = time.perf_counter()
            rows = self.gather(ids)
            return rows, time.perf_counter() - t0
        return self._pool.submit(job)

    def update(self, ids: np.ndarray, grads: np.ndarray, lr: float) -> None:
        """Row-wise Adagrad on the rows ``ids`` (unique) with their gradients [n, dim]."""
        self._send(UPDATE, ids, grads, lr, self.dim)

    def write(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Overwrite rows and accumulators: ``rows`` [n, dim + 1]."""
        self._send(WRITE, ids, rows, 0.0, self.dim + 1)

    def _send(self, op: int, ids: np.ndarray, rows: np.ndarray, value: float, width: int) -> None:
        ids = np.ascontiguousarray(ids, np.int64)
        rows = np.ascontiguousarray(rows, np.float32)
        if rows.shape != (len(ids), width):
            raise ValueError(f"rows of shape {rows.shape} for {len(ids)} ids of width {width}")
        self.sock.sendall(HEADER.pack(op, len(ids), value) + ids.tobytes())
        self.sock.sendall(rows.data)
        self.rows_sent += len(ids)

    def barrier(self) -> None:
        self.sock.sendall(HEADER.pack(PING, 0, 0.0))
        _recv(self.sock, 1)

    def fetch_all(self) -> np.ndarray:
        """Every row (without accumulators)."""
        return self.gather(np.arange(self.rows))

    # ----- lifetime --------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._finalizer()

    def __enter__(self) -> "SlowTier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _main(argv: list[str]) -> None:
    path, fd = argv[0], int(argv[1])
    row_cost_s = float(argv[2]) if len(argv) > 2 else 0.0
    table = np.array(np.load(path), np.float32)  # its own copy in this process's memory
    sock = socket.socket(fileno=fd)
    try:
        serve(sock, table, row_cost_s)
    finally:
        sock.close()


if __name__ == "__main__":
    _main(sys.argv[1:])
