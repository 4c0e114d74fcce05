"""The Shield: per-region authenticated encryption of everything that crosses the FPGA's boundary.

Each memory region (or stream) has an :class:`EngineConfig`: an engine (``aes-gcm``;
``aes-ctr-hmac``: AES-CTR with an HMAC-SHA256 tag truncated to 16 bytes; ``none``), a chunk size
(the unit one tag authenticates: a read of any byte decrypts and verifies its whole chunk; a partial
write is a read-modify-write of the chunk) and freshness counters on or off.

Layout in device DRAM (untrusted): region ``R`` holds the ciphertext at the plaintext's offsets,
region ``R#tags`` one 16-byte tag per chunk. On chip (trusted; here: the device process's memory):
the region keys and, with counters on, one 32-bit version per chunk. The nonce of chunk ``c`` at
version ``v`` is ``c (8 bytes) || v (4 bytes)``; the associated data binds the region's name and the
nonce, so a chunk moved to another address or region fails authentication.

With counters off a region is write-once: the user provisions it (version 0) and the accelerator
only reads it; a device write is refused (it would reuse a nonce, and an old copy of the chunk
would still verify: no freshness). With counters on every write bumps the chunk's version, so an
old copy of a chunk replayed into DRAM fails authentication.

Both sides use this module: the remote user seals the inputs (:func:`seal`) and opens the outputs
(:func:`open_sealed`) with the data key; the accelerator reads and writes through a
:class:`Shield` (device side). Pure: numpy and ``cryptography``; no board or Prefect imports.
"""
from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from mlsys_flows.devices.fpga import BoundsError
from mlsys_flows.errors import MlsysError

Engine = Literal["aes-gcm", "aes-ctr-hmac", "none"]
ENGINES: tuple[str, ...] = ("aes-gcm", "aes-ctr-hmac", "none")
TAG = 16  # bytes of one chunk's tag (GCM tag; truncated HMAC-SHA256)
COUNTER = 4  # bytes of one chunk's on-chip version counter


class ShieldError(MlsysError, RuntimeError):
    """A Shield configuration or access the Shield refuses."""


class IntegrityError(ShieldError):
    """A chunk failed authentication: its ciphertext or tag was modified, it was moved, or (with
    freshness counters) an old copy was replayed."""


@dataclass(frozen=True)
class EngineConfig:
    """How one region is protected."""

    engine: Engine = "aes-gcm"
    chunk: int = 64
    counters: bool = True

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ShieldError(f"unknown engine {self.engine!r} (one of {', '.join(ENGINES)})")
        if not 16 <= self.chunk <= 1 << 24 or self.chunk % 16:
            raise ShieldError(f"chunk {self.chunk}: a multiple of 16 bytes between 16 and 16 MiB")

    @property
    def secure(self) -> bool:
        return self.engine != "none"

    def chunks(self, size: int) -> int:
        return -(-size // self.chunk)

    def tag_bytes(self, size: int) -> int:
        """Off-chip metadata: one tag per chunk."""
        return self.chunks(size) * TAG if self.secure else 0

    def counter_bytes(self, size: int) -> int:
        """On-chip metadata: one version per chunk when counters are on."""
        return self.chunks(size) * COUNTER if self.secure and self.counters else 0

    def as_dict(self) -> dict:
        return {"engine": self.engine, "chunk": self.chunk, "counters": self.counters}


def region_keys(data_key: bytes, region: str) -> tuple[bytes, bytes]:
    """(encryption key, MAC key) of one region, derived from the data key (HKDF-SHA256)."""
    okm = HKDF(algorithm=hashes.SHA256(), length=48, salt=None,
               info=b"shef-region-v1:" + region.encode()).derive(data_key)
    return okm[:16], okm[16:]


def _nonce(chunk: int, version: int) -> bytes:
    return struct.pack(">QI", chunk, version)


class _Engine:
    """Seals and opens single chunks of one region."""

    def __init__(self, config: EngineConfig, region: str, data_key: bytes):
        self.config, self.region = config, region
        self._aad = region.encode() + b"|"
        self._key, self._mac_key = region_keys(data_key, region)
        self._gcm = AESGCM(self._key) if config.engine == "aes-gcm" else None

    def seal(self, chunk: int, version: int, plain: bytes) -> tuple[bytes, bytes]:
        nonce = _nonce(chunk, version)
        if self._gcm is not None:
            out = self._gcm.encrypt(nonce, plain, self._aad + nonce)
            return out[:-TAG], out[-TAG:]
        enc = Cipher(algorithms.AES(self._key), modes.CTR(nonce + b"\0\0\0\0")).encryptor()
        ct = enc.update(plain) + enc.finalize()
        return ct, hmac.digest(self._mac_key, self._aad + nonce + ct, "sha256")[:TAG]

    def open(self, chunk: int, version: int, ct: bytes, tag: bytes) -> bytes:
        nonce = _nonce(chunk, version)
        if self._gcm is not None:
            try:
                return self._gcm.decrypt(nonce, ct + tag, self._aad + nonce)
            except InvalidTag:
                raise self._failed(chunk, version) from None
        if not hmac.compare_digest(hmac.digest(self._mac_key, self._aad + nonce + ct, "sha256")[:TAG], tag):
            raise self._failed(chunk, version)
        dec = Cipher(algorithms.AES(self._key), modes.CTR(nonce + b"\0\0\0\0")).decryptor()
        return dec.update(ct) + dec.finalize()

    def _failed(self, chunk: int, version: int) -> IntegrityError:
        fresh = f" at version {version} (tampered, or an old copy replayed)" if self.config.counters else \
            " (tampered or moved)"
        return IntegrityError(f"region {self.region!r} chunk {chunk} ({self.config.engine}, "
                              f"{self.config.chunk}-byte chunks): authentication failed{fresh}")


def seal(data_key: bytes, region: str, config: EngineConfig, plain: bytes) -> tuple[bytes, bytes]:
    """User side: the region's DRAM image (ciphertext, tags) for ``plain`` at version 0."""
    if not config.secure:
        return bytes(plain), b""
    eng, c = _Engine(config, region, data_key), config.chunk
    cts, tags = [], []
    for i in range(config.chunks(len(plain))):
        ct, tag = eng.seal(i, 0, bytes(plain[i * c:(i + 1) * c]))
        cts.append(ct)
        tags.append(tag)
    return b"".join(cts), b"".join(tags)


def open_sealed(data_key: bytes, region: str, config: EngineConfig, ct: bytes, tags: bytes,
                versions: np.ndarray | None = None) -> bytes:
    """User side: the plaintext of a region read back from DRAM; ``versions`` are the chunk
    versions the accelerator reports with its result (all 0 without counters)."""
    if not config.secure:
        return bytes(ct)
    eng, c = _Engine(config, region, data_key), config.chunk
    n = config.chunks(len(ct))
    vs = np.zeros(n, np.uint32) if versions is None else versions
    return b"".join(eng.open(i, int(vs[i]), ct[i * c:(i + 1) * c], tags[i * TAG:(i + 1) * TAG]) for i in range(n))


class Memory(Protocol):
    """What the Shield needs of device memory (``fpga.BoardMemory`` on a board)."""

    def buffer(self, region: str, offset: int = 0, length: int | None = None) -> memoryview: ...

    def size(self, region: str) -> int: ...


@dataclass
class Traffic:
    """What crossed the Shield, counted: plaintext the kernel got or gave, DRAM bytes moved (ciphertext
    and tags), chunk operations."""

    plain_read: int = 0
    plain_written: int = 0
    dram_read: int = 0
    dram_written: int = 0
    chunk_ops: int = 0

    def add(self, other: "Traffic") -> None:
        for k in ("plain_read", "plain_written", "dram_read", "dram_written", "chunk_ops"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("plain_read", "plain_written", "dram_read", "dram_written", "chunk_ops")}


@dataclass
class Shield:
    """Device side: one region's engine between the accelerator and DRAM."""

    memory: Memory
    region: str
    config: EngineConfig
    data_key: bytes = b""
    traffic: Traffic = field(default_factory=Traffic)

    def __post_init__(self) -> None:
        self.size = self.memory.size(self.region)
        n = self.config.chunks(self.size)
        if self.config.secure:
            if len(self.data_key) not in (16, 24, 32):
                raise ShieldError(f"region {self.region!r}: no data key provisioned")
            if self.memory.size(self.region + "#tags") < n * TAG:
                raise ShieldError(f"region {self.region!r}: its tag region holds fewer than {n} tags")
            self._engine = _Engine(self.config, self.region, self.data_key)
            self._tags = self.memory.buffer(self.region + "#tags", 0, n * TAG)
        self._data = self.memory.buffer(self.region)
        self.versions = np.zeros(n, np.uint32)  # on-chip freshness counters (used when counters are on)

    def _bounds(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise BoundsError(f"Shield region {self.region!r}: access [{offset}, {offset + length}) outside "
                              f"[0, {self.size})")

    def _open(self, i: int) -> bytes:
        c = self.config.chunk
        ct = bytes(self._data[i * c:(i + 1) * c])
        tag = bytes(self._tags[i * TAG:(i + 1) * TAG])
        self.traffic.dram_read += len(ct) + TAG
        self.traffic.chunk_ops += 1
        return self._engine.open(i, int(self.versions[i]) if self.config.counters else 0, ct, tag)

    def read(self, offset: int, length: int) -> bytes:
        """Plaintext of [offset, offset + length): every chunk it touches is fetched and verified."""
        self._bounds(offset, length)
        self.traffic.plain_read += length
        if not self.config.secure:
            self.traffic.dram_read += length
            return bytes(self._data[offset:offset + length])
        c = self.config.chunk
        first, last = offset // c, (offset + length - 1) // c if length else offset // c - 1
        data = b"".join(self._open(i) for i in range(first, last + 1))
        start = offset - first * c
        return data[start:start + length]

    def write(self, offset: int, data: bytes) -> None:
        """Seal ``data`` at ``offset``: each touched chunk gets a new version (partial chunks are
        read, verified, patched and re-sealed)."""
        length = len(data)
        self._bounds(offset, length)
        self.traffic.plain_written += length
        if not self.config.secure:
            self._data[offset:offset + length] = data
            self.traffic.dram_written += length
            return
        if not self.config.counters:
            raise ShieldError(f"region {self.region!r} has no freshness counters: it is write-once (provisioned "
                              "by the user); a device write would reuse a nonce and let old copies verify")
        c = self.config.chunk
        first, last = offset // c, (offset + length - 1) // c
        for i in range(first, last + 1):
            lo, hi = i * c, min((i + 1) * c, self.size)
            a, b = max(lo, offset), min(hi, offset + length)
            piece = data[a - offset:b - offset]
            if a > lo or b < hi:  # partial chunk: read-modify-write
                old = self._open(i)
                piece = old[:a - lo] + piece + old[b - lo:]
            version = int(self.versions[i]) + 1
            if version >= 1 << 32:
                raise ShieldError(f"region {self.region!r} chunk {i}: version counter exhausted (re-key the region)")
            ct, tag = self._engine.seal(i, version, piece)
            self._data[lo:hi] = ct
            self._tags[i * TAG:(i + 1) * TAG] = tag
            self.versions[i] = version
            self.traffic.dram_written += len(ct) + TAG
            self.traffic.chunk_ops += 1
