"""Converts a llama2.c checkpoint (legacy "version 0" float32 layout, e.g.
../shared/models/stories260K.bin) into a Hugging Face transformers LlamaForCausalLM folder.

    python -m centroidkv.convert_llama2c stories260K.bin OUT_DIR [--tokenizer tok512.bin]

With --tokenizer, OUT_DIR also holds the tokenizer (tokenizer.json), so that
AutoTokenizer.from_pretrained(OUT_DIR) loads it: kvpress's KVzip press needs that.

The layout (worker/model.h): 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
vocab_size, seq_len; vocab_size < 0 means an unshared classifier), then float32 row-major
[out, in] tensors: embedding [V, D], rms_att [L, D], wq [L, D, D], wk [L, KV, D],
wv [L, KV, D], wo [L, D, D], rms_ffn [L, D], w1 [L, F, D], w2 [L, D, F], w3 [L, F, D],
rms_final [D], a legacy RoPE table [S, hs/2] x 2 (read for its base, as the worker does:
10000 in llama2.c's own files, 500000 in models/longctx), the classifier [V, D] if
unshared. llama2.c rotates interleaved pairs (2i, 2i+1) of each head, transformers rotates
halves (i, i + hs/2): the rows of wq and wk are permuted so that the model is the same
(rms_norm_eps 1e-5, as llama2.c and worker use).
"""
from __future__ import annotations

import argparse
import pathlib
import struct

import numpy as np


def read_llama2c(path) -> tuple:
    data = pathlib.Path(path).read_bytes()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", data[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    head = dim // heads
    kv = head * kv_heads
    floats = np.frombuffer(data, dtype="<f4", offset=28)
    cursor = 0

    def take(*shape):
        nonlocal cursor
        n = int(np.prod(shape))
        if cursor + n > floats.size:
            raise ValueError(f"{path}: truncated checkpoint")
        out = floats[cursor:cursor + n].reshape(shape)
        cursor += n
        return out

    w = dict(embedding=take(vocab, dim), rms_att=take(layers, dim), wq=take(layers, dim, dim),
             wk=take(layers, kv, dim), wv=take(layers, kv, dim), wo=take(layers, dim, dim),
             rms_ffn=take(layers, dim), w1=take(layers, hidden, dim),
             w2=take(layers, dim, hidden), w3=take(layers, hidden, dim), rms_final=take(dim))
    cos = take(seq_len, head // 2)
    sin = take(seq_len, head // 2)
    w["classifier"] = w["embedding"] if shared else take(vocab, dim)
    config = dict(dim=dim, hidden_dim=hidden, n_layers=layers, n_heads=heads,
                  n_kv_heads=kv_heads, vocab_size=vocab, seq_len=seq_len, shared=shared,
                  rope_theta=rope_theta_of_table(cos, sin))
    return config, w


def rope_theta_of_table(cos: np.ndarray, sin: np.ndarray) -> float:
    """The RoPE base of a legacy table [S, hs/2]: the slowest pair's angle at the last
    position, rounded to 4 significant digits (worker/model.h RopeThetaOfTable)."""
    seq_len, half = cos.shape
    if seq_len < 2 or half < 2:
        return 10000.0
    frequency = float(np.arctan2(np.float64(sin[-1, -1]), np.float64(cos[-1, -1]))) / (seq_len - 1)
    if not frequency > 0:
        return 10000.0
    theta = frequency ** (-(2 * half) / (2 * half - 2))
    return float(f"{theta:.4g}")


def interleaved_to_halves(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows [heads * hs, D] from llama2.c's pair order to transformers' half order."""
    rows, cols = w.shape
    hs = rows // heads
    return w.reshape(heads, hs // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def to_transformers(path):
    """The checkpoint as a LlamaForCausalLM (float32, eval mode)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    c, w = read_llama2c(path)
    config = LlamaConfig(
        vocab_size=c["vocab_size"], hidden_size=c["dim"], intermediate_size=c["hidden_dim"],
        num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"],
        num_key_value_heads=c["n_kv_heads"], max_position_embeddings=c["seq_len"],
        rms_norm_eps=1e-5, rope_theta=c["rope_theta"], hidden_act="silu",
        tie_word_embeddings=c["shared"], bos_token_id=1, eos_token_id=2,
        attention_bias=False, mlp_bias=False, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    t = lambda a: torch.from_numpy(np.array(a, dtype=np.float32))  # noqa: E731 (a copy)
    state = {"model.embed_tokens.weight": t(w["embedding"]), "model.norm.weight": t(w["rms_final"]),
             "lm_head.weight": t(w["classifier"])}
    for l in range(c["n_layers"]):
        p = f"model.layers.{l}."
        state[p + "input_layernorm.weight"] = t(w["rms_att"][l])
        state[p + "post_attention_layernorm.weight"] = t(w["rms_ffn"][l])
        state[p + "self_attn.q_proj.weight"] = t(interleaved_to_halves(w["wq"][l], c["n_heads"]))
        state[p + "self_attn.k_proj.weight"] = t(interleaved_to_halves(w["wk"][l], c["n_kv_heads"]))
        state[p + "self_attn.v_proj.weight"] = t(w["wv"][l])
        state[p + "self_attn.o_proj.weight"] = t(w["wo"][l])
        state[p + "mlp.gate_proj.weight"] = t(w["w1"][l])
        state[p + "mlp.down_proj.weight"] = t(w["w2"][l])
        state[p + "mlp.up_proj.weight"] = t(w["w3"][l])
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (c["shared"] and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights do not fit LlamaForCausalLM: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.eval()


def tokenizer_to_transformers(path):
    """llama2.c's tokenizer.bin as a transformers fast tokenizer (centroidkv.llama2c_tokenizer)."""
    from .llama2c_tokenizer import fast_tokenizer

    return fast_tokenizer(str(path))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("out_dir")
    parser.add_argument("--tokenizer", default="", help="llama2.c tokenizer.bin to save too")
    args = parser.parse_args()
    model = to_transformers(args.checkpoint)
    model.save_pretrained(args.out_dir)
    if args.tokenizer:
        tokenizer_to_transformers(args.tokenizer).save_pretrained(args.out_dir)
    print(f"wrote {args.out_dir}: LlamaForCausalLM, {sum(p.numel() for p in model.parameters())} "
          "parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
