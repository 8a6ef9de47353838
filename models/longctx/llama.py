"""A llama2.c-architecture transformer in PyTorch, the llama2.c tokenizer, and the two export
formats of the long-context model: llama2.c "version 0" (what the C++ worker loads) and a
transformers LlamaForCausalLM folder.

RoPE here is llama2.c's interleaved-pair layout (pairs (2j, 2j+1), angle pos * 10000^(-2j/hs)),
so the llama2.c file needs no permutation; the transformers export permutes wq/wk rows into the
"rotate_half" layout, as transformers' own llama conversion does.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads


def rope_tables(cfg: Config, length: int, device=None):
    hs = cfg.head_size
    freqs = cfg.rope_theta ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    angles = torch.outer(torch.arange(length, dtype=torch.float64), freqs)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rope(x, cos, sin):
    # x: [B, T, H, hs]; cos/sin: [T, hs/2]; interleaved pairs.
    x2 = x.float().reshape(*x.shape[:-1], -1, 2)
    a, b = x2[..., 0], x2[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    out = torch.stack((a * c - b * s, a * s + b * c), dim=-1)
    return out.flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        hs = cfg.head_size
        self.cfg = cfg
        self.rms_att = nn.Parameter(torch.ones(cfg.dim))
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hs, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hs, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hs, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hs, cfg.dim, bias=False)
        self.rms_ffn = nn.Parameter(torch.ones(cfg.dim))
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)

    def forward(self, x, cos, sin, cache=None, start=0):
        cfg = self.cfg
        B, T, _ = x.shape
        hs = cfg.head_size
        h = rmsnorm(x, self.rms_att, cfg.norm_eps)
        q = self.wq(h).view(B, T, cfg.n_heads, hs)
        k = self.wk(h).view(B, T, cfg.n_kv_heads, hs)
        v = self.wv(h).view(B, T, cfg.n_kv_heads, hs)
        q = apply_rope(q, cos[start:start + T], sin[start:start + T])
        k = apply_rope(k, cos[start:start + T], sin[start:start + T])
        if cache is not None:
            ck, cv = cache
            ck[:, start:start + T] = k
            cv[:, start:start + T] = v
            k, v = ck[:, :start + T], cv[:, :start + T]
        group = cfg.n_heads // cfg.n_kv_heads
        q = q.transpose(1, 2)
        k = k.transpose(1, 2).repeat_interleave(group, dim=1)
        v = v.transpose(1, 2).repeat_interleave(group, dim=1)
        if cache is None or T > 1:
            if start == 0:
                att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(start)
                att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            att = F.scaled_dot_product_attention(q, k, v)
        x = x + self.wo(att.transpose(1, 2).reshape(B, T, -1))
        h = rmsnorm(x, self.rms_ffn, cfg.norm_eps)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def rmsnorm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


class Transformer(nn.Module):
    """Shared input/output embedding, as llama2.c's positive vocab_size header means."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.rms_final = nn.Parameter(torch.ones(cfg.dim))
        cos, sin = rope_tables(cfg, cfg.seq_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def init_weights(self, generator: torch.Generator):
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith("wo.weight") or name.endswith("w2.weight"):
                    std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
                with torch.no_grad():
                    p.normal_(0.0, std, generator=generator)

    def forward(self, tokens, caches=None, start=0):
        x = self.embedding(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.cos, self.sin, None if caches is None else caches[i], start)
        x = rmsnorm(x, self.rms_final, self.cfg.norm_eps)
        return x @ self.embedding.weight.t()

    def new_caches(self, batch: int, length: int):
        hs = self.cfg.head_size
        return [(torch.zeros(batch, length, self.cfg.n_kv_heads, hs),
                 torch.zeros(batch, length, self.cfg.n_kv_heads, hs))
                for _ in range(self.cfg.n_layers)]


# ---- llama2.c checkpoint ("version 0", float32) ------------------------------------------

def _stacked(model: Transformer, attr: str):
    return [getattr(layer, attr) for layer in model.layers]


def _tensor_order(model: Transformer):
    def weights(attr):
        return [getattr(layer, attr).weight for layer in model.layers]
    return ([model.embedding.weight] + _stacked(model, "rms_att") + weights("wq") +
            weights("wk") + weights("wv") + weights("wo") + _stacked(model, "rms_ffn") +
            weights("w1") + weights("w2") + weights("w3") + [model.rms_final])


def load_llama2c(path: str) -> Transformer:
    with open(path, "rb") as f:
        data = f.read()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", data[:28])
    if vocab <= 0:
        raise ValueError(f"{path}: only shared classifiers are supported")
    floats = np.frombuffer(data, dtype="<f4", offset=28)
    cfg = Config(dim, hidden, layers, heads, kv_heads, vocab, seq_len)
    weights = sum(t.numel() for t in _tensor_order(Transformer(cfg)))
    cfg.rope_theta = rope_theta_of_table(floats[weights:], cfg)
    model = Transformer(cfg)
    offset = 0
    with torch.no_grad():
        for t in _tensor_order(model):
            n = t.numel()
            t.copy_(torch.from_numpy(floats[offset:offset + n].copy()).view_as(t))
            offset += n
    return model


def rope_theta_of_table(table: np.ndarray, cfg: Config) -> float:
    """The RoPE base that wrote a llama2.c file's legacy table (cos then sin, [seq_len,
    head_size/2] each): from the slowest pair's angle at the last position, rounded to 4
    significant digits (10000 for llama2.c's own files, 500000 for the circuit model).
    The C++ worker reads it the same way (worker/model.cc)."""
    half = cfg.head_size // 2
    n = cfg.seq_len * half
    if cfg.seq_len < 2 or table.size < 2 * n:
        return 10000.0
    cos, sin = float(table[n - 1]), float(table[2 * n - 1])
    freq = math.atan2(sin, cos) / (cfg.seq_len - 1)
    if freq <= 0:
        return 10000.0
    theta = freq ** (-cfg.head_size / (cfg.head_size - 2))
    return float(f"{theta:.4g}")


def export_llama2c(model: Transformer, path: str):
    cfg = model.cfg
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<7i", cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads,
                            cfg.n_kv_heads, cfg.vocab_size, cfg.seq_len))
        for t in _tensor_order(model):
            f.write(t.detach().float().cpu().numpy().astype("<f4").tobytes())
        cos, sin = rope_tables(cfg, cfg.seq_len)  # legacy table the loaders skip
        f.write(cos.numpy().astype("<f4").tobytes())
        f.write(sin.numpy().astype("<f4").tobytes())
    os.replace(path + ".tmp", path)


def export_transformers(model: Transformer, folder: str):
    """A LlamaForCausalLM folder (config.json + model.safetensors) equal to `model`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = model.cfg
    hf_cfg = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=cfg.seq_len,
        rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, head_dim=cfg.head_size, torch_dtype="float32")
    hf = LlamaForCausalLM(hf_cfg)
    hs = cfg.head_size

    def to_rotate_half(w, heads):
        # interleaved pairs -> [first halves, second halves] per head
        return w.view(heads, hs // 2, 2, cfg.dim).transpose(1, 2).reshape(heads * hs, cfg.dim)

    sd = {"model.embed_tokens.weight": model.embedding.weight,
          "model.norm.weight": model.rms_final,
          "lm_head.weight": model.embedding.weight}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = to_rotate_half(layer.wq.weight, cfg.n_heads)
        sd[p + "self_attn.k_proj.weight"] = to_rotate_half(layer.wk.weight, cfg.n_kv_heads)
        sd[p + "self_attn.v_proj.weight"] = layer.wv.weight
        sd[p + "self_attn.o_proj.weight"] = layer.wo.weight
        sd[p + "mlp.gate_proj.weight"] = layer.w1.weight
        sd[p + "mlp.down_proj.weight"] = layer.w2.weight
        sd[p + "mlp.up_proj.weight"] = layer.w3.weight
        sd[p + "input_layernorm.weight"] = layer.rms_att
        sd[p + "post_attention_layernorm.weight"] = layer.rms_ffn
    hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()})
    hf.save_pretrained(folder)
    return hf


# ---- tokenizer (llama2.c tokenizer.bin) ----------------------------------------------------

class Tokenizer:
    """llama2.c's encoder: characters to pieces (byte fallback), then greedy best-score merges."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            data = f.read()
        (self.max_len,) = struct.unpack_from("<i", data, 0)
        off = 4
        self.pieces, self.scores = [], []
        while off < len(data):
            score, n = struct.unpack_from("<fi", data, off)
            off += 8
            self.pieces.append(data[off:off + n])
            self.scores.append(score)
            off += n
        self.lookup = {p: i for i, p in enumerate(self.pieces)}
        self._cache = {}

    def encode(self, text: str) -> list[int]:
        """Tokens of `text`, no BOS and no dummy-prefix space (callers start with ' ')."""
        if text in self._cache:
            return list(self._cache[text])
        ids = []
        for ch in text:
            b = ch.encode("utf-8")
            if b in self.lookup:
                ids.append(self.lookup[b])
            else:
                ids.extend(x + 3 for x in b)
        while True:
            best, best_i = None, -1
            for i in range(len(ids) - 1):
                j = self.lookup.get(self.pieces[ids[i]] + self.pieces[ids[i + 1]])
                if j is not None and (best is None or self.scores[j] > self.scores[best]):
                    best, best_i = j, i
            if best is None:
                break
            ids[best_i:best_i + 2] = [best]
        self._cache[text] = tuple(ids)
        return ids

    def decode(self, ids) -> str:
        out = b""
        for i in ids:
            p = self.pieces[i]
            if 3 <= i <= 258:
                p = bytes([i - 3])
            out += p
        return out.decode("utf-8", errors="replace")


def save_config(cfg: Config, path: str):
    with open(path, "w") as f:
        json.dump(asdict(cfg), f, indent=1)
