"""centroidkv.kvpress: the CentroidKV press in kvpress's own "kv-press-text-generation"
pipeline, on stories260K converted to a LlamaForCausalLM, against a real server: the kept
entries and counts, the answer equal to the same compression done through
centroidkv.transformers, kvpress's compression_ratio convention, and bad input (a NaN in the
cache, a server gone mid-prefill, a budget out of range) raising errors that name the layer;
and kvpress's own head-wise presses (AdaKV, KVzip) masking through the count-aware attention."""
from __future__ import annotations

import contextlib
import math
import tempfile

import numpy as np
import pytest
import torch

kvpress = pytest.importorskip("kvpress")  # the suite's environment always has it (setup_python)
from transformers import AutoTokenizer, DynamicCache, LlamaForCausalLM, pipeline  # noqa: E402

import centroidkv  # noqa: E402
from centroidkv.convert_llama2c import to_transformers, tokenizer_to_transformers  # noqa: E402
from centroidkv.kvpress import CentroidKVPress, CentroidKVPressError  # noqa: E402
from centroidkv.presets import SMALL_MODEL  # noqa: E402
from centroidkv.torch import padded_heads  # noqa: E402
from centroidkv.transformers import CentroidKVCache, CompressedLayer, enable  # noqa: E402
from server_process import SHARED_DIR, ServerProcess  # noqa: E402

QUALITY = dict(SMALL_MODEL)  # centroidkv-quality's preset
QUESTION = " What did Lily find?"
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def model():
    return to_transformers(SHARED_DIR / "models" / "stories260K.bin")


@pytest.fixture(scope="module")
def tokenizer():
    return tokenizer_to_transformers(SHARED_DIR / "models" / "tok512.bin")


@pytest.fixture(scope="module")
def pipe(model, tokenizer):
    return pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")


@pytest.fixture(scope="module")
def context(model, tokenizer):
    """About 300 tokens sampled from the model (seeded), as text."""
    g = torch.Generator().manual_seed(7)
    ids = [1] + tokenizer.encode(" Once upon a time, Lily found a", add_special_tokens=False)
    with torch.no_grad():
        while len(ids) < 300:
            logits = model(torch.tensor([ids])).logits[0, -1]
            logits[[1, 2]] = -math.inf
            ids.append(int(torch.multinomial(torch.softmax(logits / 0.8, -1), 1, generator=g)))
    return tokenizer.decode(ids[1:])


def offsets_of(result) -> np.ndarray:
    return np.asarray(result.offsets, dtype=np.int64)


def lengths_of(result) -> np.ndarray:
    return np.diff(offsets_of(result))


def counts_of(result) -> np.ndarray:
    return np.asarray(result.counts, dtype=np.int64)


def answer_through_the_cache(model, tokenizer, client, context, **params):
    """The pipeline's tokens (BOS + context, then question + "\\n"), compressed by
    CentroidKVCache after the prefill and decoded greedily: the text and the cache."""
    enable(model)
    context_ids = tokenizer.encode(tokenizer.bos_token + context, add_special_tokens=False)
    question_ids = tokenizer.encode(QUESTION + "\n", add_special_tokens=False)
    cache = CentroidKVCache(client, **params)
    out = []
    with torch.no_grad():
        model(torch.tensor([context_ids]), past_key_values=cache)
        logits = model(torch.tensor([question_ids]), past_key_values=cache).logits[0, -1]
        for _ in range(NEW_TOKENS):
            out.append(int(logits.argmax()))
            if out[-1] == tokenizer.eos_token_id:
                break
            logits = model(torch.tensor([[out[-1]]]), past_key_values=cache).logits[0, -1]
    return tokenizer.decode(out, skip_special_tokens=True), cache, len(context_ids)


def test_the_press_keeps_a_quarter_with_counts_and_answers_as_the_transformers_cache(
        model, tokenizer, pipe, context, client):
    press = CentroidKVPress(client, target_ratio=0.25, **QUALITY)
    answer = pipe(context, question=QUESTION, press=press, max_new_tokens=NEW_TOKENS)["answer"]
    expected, cache, n = answer_through_the_cache(model, tokenizer, client, context,
                                                  target_ratio=0.25, **QUALITY)
    layers = model.config.num_hidden_layers
    assert sorted(press.results) == list(range(layers))
    for layer in range(layers):
        got, want = press.results[layer], cache.results[layer]
        lengths = lengths_of(got)
        assert (lengths == math.ceil(0.25 * n)).all(), lengths
        # Every token is in exactly one centroid of its head, and some were merged.
        for h in range(got.num_heads):
            assert int(counts_of(got)[offsets_of(got)[h]:offsets_of(got)[h + 1]].sum()) == n
        assert int(counts_of(got).max()) > 1
        # The same keys went to the server both ways, so the same centroids came back.
        np.testing.assert_array_equal(np.asarray(got.keys), np.asarray(want.keys))
        np.testing.assert_array_equal(counts_of(got), counts_of(want))
    assert answer == expected, (answer, expected)
    assert answer.strip(), "the model answered nothing"


def test_fp8_centroids_go_into_the_cache_widened_with_their_scales(pipe, context, client):
    press = CentroidKVPress(client, target_ratio=0.25, output_dtype="fp8_e4m3", **QUALITY)
    answer = pipe(context, question=QUESTION, press=press, max_new_tokens=4)["answer"]
    assert answer.strip()
    for result in press.results.values():
        assert result.dtype == "fp8_e4m3" and result.key_scales.shape == (result.num_heads,)
        padded = padded_heads(result)
        for h in range(result.num_heads):
            lo, hi = int(result.offsets[h]), int(result.offsets[h + 1])
            np.testing.assert_array_equal(padded.keys[h, :hi - lo].numpy(),
                                          result.float_keys()[lo:hi])


def test_compression_ratio_is_kvpress_share_removed(pipe, context, client):
    ours = CentroidKVPress(client, target_ratio=0.25, **QUALITY)
    theirs = CentroidKVPress(client, compression_ratio=0.75, **QUALITY)
    a = pipe(context, question=QUESTION, press=ours, max_new_tokens=4)["answer"]
    b = pipe(context, question=QUESTION, press=theirs, max_new_tokens=4)["answer"]
    assert a == b
    for layer, result in ours.results.items():
        np.testing.assert_array_equal(counts_of(result), counts_of(theirs.results[layer]))


def test_passthrough_heads_come_back_whole_and_count_in_the_budget(pipe, context, client,
                                                                   tokenizer):
    # Layer 2 keeps its head 0 whole, so it is longer than the other layers: the model's one
    # mask (built from layer 0) does not fit it, and the count-aware attention must cope. The
    # head kept whole counts in the quarter: every other head shrinks to pay for it.
    press = CentroidKVPress(client, target_ratio=0.25, passthrough_heads={2: [0]}, **QUALITY)
    answer = pipe(context, question=QUESTION, press=press, max_new_tokens=NEW_TOKENS)["answer"]
    n = len(tokenizer.encode(tokenizer.bos_token + context, add_special_tokens=False))
    layers, heads = len(press.results), press.results[0].num_heads
    budget = math.ceil(0.25 * layers * heads * n)
    share = (budget - n) // (layers * heads - 1)
    lengths = lengths_of(press.results[2])
    assert lengths[0] == n and (lengths[1:] == share).all(), (lengths, share)
    assert int(counts_of(press.results[2])[:n].max()) == 1
    assert (lengths_of(press.results[1]) == share).all()
    assert sum(int(r.offsets[-1]) for r in press.results.values()) <= budget
    assert answer.strip()


def test_a_budget_the_passthrough_heads_exceed_is_refused_naming_them(pipe, context, client):
    every_head = {layer: [0, 1, 2, 3] for layer in range(2)}  # 8 of 20 heads whole > 25%
    press = CentroidKVPress(client, target_ratio=0.25, passthrough_heads=every_head, **QUALITY)
    with pytest.raises(CentroidKVPressError) as info:
        pipe(context, question=QUESTION, press=press, max_new_tokens=2)
    assert "passthrough_heads" in str(info.value)


def test_shared_memory_carries_the_layers_where_the_server_is_local(pipe, context, client,
                                                                     monkeypatch):
    regions = []
    make_region = client.shared_region

    def spy(size):
        regions.append(make_region(size))
        return regions[-1]

    monkeypatch.setattr(client, "shared_region", spy)
    assert client.info().shared_memory  # the fixture's server is on a unix socket
    shared = CentroidKVPress(client, target_ratio=0.25, **QUALITY)
    a = pipe(context, question=QUESTION, press=shared, max_new_tokens=NEW_TOKENS)["answer"]
    slabs = CentroidKVPress(client, target_ratio=0.25, shared_memory=False, **QUALITY)
    b = pipe(context, question=QUESTION, press=slabs, max_new_tokens=NEW_TOKENS)["answer"]
    assert len(regions) == 1, "one region for the whole prefill, none with shared_memory=False"
    assert regions[0].region_id is None, "the region is closed when the block ends"
    assert a == b
    for layer, result in shared.results.items():
        np.testing.assert_array_equal(np.asarray(result.keys),
                                      np.asarray(slabs.results[layer].keys))
        np.testing.assert_array_equal(counts_of(result), counts_of(slabs.results[layer]))


def test_a_bf16_cache_goes_out_and_comes_back_in_bf16(model, context, tokenizer, client):
    half = to_transformers(SHARED_DIR / "models" / "stories260K.bin").to(torch.bfloat16)
    ids = tokenizer.encode(tokenizer.bos_token + context, add_special_tokens=False)
    press = CentroidKVPress(client, target_ratio=0.25, **QUALITY)
    cache = DynamicCache()
    with press(half), torch.no_grad():
        half.model(input_ids=torch.tensor([ids]), past_key_values=cache)
    assert cache.layers[0].keys.dtype == torch.bfloat16
    assert press.results[0].keys.dtype == torch.bfloat16
    assert (lengths_of(press.results[0]) == math.ceil(0.25 * len(ids))).all()


@pytest.mark.parametrize("kwargs, name", [
    (dict(target_ratio=1.5), "target_ratio"),
    (dict(target_ratio=0.0), "target_ratio"),
    (dict(compression_ratio=1.0), "compression_ratio"),
    (dict(target_tokens=0), "target_tokens"),
    (dict(target_ratio=0.25, compression_ratio=0.75), "exactly one"),
    (dict(), "exactly one"),
    (dict(target_ratio=0.25, region=object()), "region is set by the press"),
])
def test_a_budget_out_of_range_is_refused_naming_it(client, kwargs, name):
    with pytest.raises(ValueError, match=name):
        CentroidKVPress(client, **kwargs)


def test_a_nan_in_the_cache_raises_naming_the_layer(model, pipe, context, client):
    def poison(module, args, output):
        output[0, 5, 3] = math.nan
        return output

    hook = model.model.layers[1].self_attn.k_proj.register_forward_hook(poison)
    try:
        with pytest.raises(CentroidKVPressError, match="layer 1") as raised:
            pipe(context, question=QUESTION, press=CentroidKVPress(client, target_ratio=0.5),
                 max_new_tokens=2)
    finally:
        hook.remove()
    assert raised.value.layer == 1
    assert isinstance(raised.value.error, centroidkv.InvalidArgumentError)
    assert raised.value.error.argument == "keys"


def test_a_server_gone_mid_prefill_raises_naming_the_layer(model, pipe, context):
    with tempfile.TemporaryDirectory(prefix="ckv-kvpress-") as folder:
        server = ServerProcess(f"unix://{folder}/ckv.sock")
        with centroidkv.Client(server.target, timeout=3) as client:
            hook = model.model.layers[2].self_attn.register_forward_pre_hook(
                lambda module, args: server.kill())
            press = CentroidKVPress(client, target_ratio=0.5)
            try:
                with pytest.raises(CentroidKVPressError, match="layer [0-2]") as raised:
                    pipe(context, question=QUESTION, press=press, max_new_tokens=2)
            finally:
                hook.remove()
            # The jobs run while the next layers compute: the first that failed is named
            # (layer 2's, or one still in flight when the server went), and the layers
            # before it were compressed.
            assert raised.value.layer <= 2
            assert sorted(press.results) == list(range(raised.value.layer))
            assert isinstance(raised.value.error, centroidkv.CompressError)


def decode_one_by_one(model, cache, tokens, start):
    """Logits of `tokens` fed after the cache one at a time (decoding), at true positions."""
    rows = []
    with torch.no_grad():
        for i, token in enumerate(tokens):
            rows.append(model(torch.tensor([[token]]), past_key_values=cache,
                              position_ids=torch.tensor([[start + i]])).logits[0, -1])
    return torch.stack(rows)


def prefilled(model, press, ids):
    cache = DynamicCache()
    with torch.no_grad(), (press(model) if press is not None else contextlib.nullcontext()):
        model.model(input_ids=torch.tensor([ids]), past_key_values=cache)
    return cache


def test_head_wise_presses_mask_exactly_in_the_count_aware_attention(context, tokenizer):
    # AdaKV keeps every entry and names the evicted ones (module.masked_key_indices); the
    # count-aware attention hides them with -inf, kvpress's patched SDPA with fake keys.
    ids = tokenizer.encode(tokenizer.bos_token + context, add_special_tokens=False)
    prompt, follow = ids[:200], ids[200:208]
    ours = to_transformers(SHARED_DIR / "models" / "stories260K.bin")
    enable(ours)
    theirs = to_transformers(SHARED_DIR / "models" / "stories260K.bin")  # sdpa, kvpress's patch
    press = lambda: kvpress.AdaKVPress(press=kvpress.SnapKVPress(compression_ratio=0.75))  # noqa: E731
    got = decode_one_by_one(ours, prefilled(ours, press(), prompt), follow, len(prompt))
    masked = [len(layer.self_attn.masked_key_indices[0]) for layer in ours.model.layers]
    heads = ours.config.num_key_value_heads
    assert masked == [heads * (len(prompt) - math.ceil(0.25 * len(prompt)))] * len(masked)
    want = decode_one_by_one(theirs, prefilled(theirs, press(), prompt), follow, len(prompt))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    full = decode_one_by_one(ours, prefilled(ours, None, prompt), follow, len(prompt))
    assert (got - full).abs().max() > 1e-2, "the masked entries changed nothing"
    # Several queries at once (a question fed after the context): the same logits, where
    # kvpress's fake keys need a hyperplane that 8 dimensions rarely have for 8 queries.
    cache = prefilled(ours, press(), prompt)
    with torch.no_grad():
        together = ours(torch.tensor([follow]), past_key_values=cache,
                        position_ids=torch.arange(len(prompt), len(ids[:208]))[None]).logits[0]
    torch.testing.assert_close(together, got, rtol=0, atol=1e-4)


def test_kvzip_runs_in_the_pipeline_on_a_converted_folder(model, tokenizer, context, tmp_path):
    # KVzip reads the tokenizer from model.config.name_or_path: the converter's folder.
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    enable(loaded)
    pipe = pipeline("kv-press-text-generation", model=loaded,
                    tokenizer=AutoTokenizer.from_pretrained(tmp_path), device="cpu")
    answer = pipe(context, question=QUESTION, press=kvpress.KVzipPress(compression_ratio=0.75),
                  max_new_tokens=4)["answer"]
    assert answer.strip()
    n = len(tokenizer.encode(tokenizer.bos_token + context, add_special_tokens=False))
    masked = sum(len(layer.self_attn.masked_key_indices[0]) for layer in loaded.model.layers)
    total = n * loaded.config.num_key_value_heads * loaded.config.num_hidden_layers
    assert abs(masked - 0.75 * total) <= 1, (masked, total)


def test_the_layers_jobs_run_while_the_next_layers_compute(model, tokenizer, context, client):
    ids = tokenizer.encode(tokenizer.bos_token + context, add_special_tokens=False)
    press = CentroidKVPress(client, target_ratio=0.25, **QUALITY)
    seen = {}

    def at_layer_3(module, args, kwargs):
        cache = kwargs["past_key_values"]
        seen["queued"] = sorted(press._pending)
        seen["installed"] = [isinstance(layer, CompressedLayer) for layer in cache.layers[:3]]

    hook = model.model.layers[3].self_attn.register_forward_pre_hook(at_layer_3, with_kwargs=True)
    try:
        cache = prefilled(model, press, ids)
    finally:
        hook.remove()
    assert seen == {"queued": [0, 1, 2], "installed": [False] * 3}  # no wait per layer
    assert all(isinstance(layer, CompressedLayer) for layer in cache.layers)  # all by the end
    assert sorted(press.results) == list(range(model.config.num_hidden_layers))


def test_the_press_inside_kvpress_composed_press_compresses_layer_by_layer(model, tokenizer,
                                                                             context, client):
    ids = tokenizer.encode(tokenizer.bos_token + context, add_special_tokens=False)
    ours = CentroidKVPress(client, target_ratio=0.25, **QUALITY)
    cache = prefilled(model, kvpress.ComposedPress([ours]), ids)
    alone = CentroidKVPress(client, target_ratio=0.25, **QUALITY)
    prefilled(model, alone, ids)
    for layer in range(model.config.num_hidden_layers):
        assert isinstance(cache.layers[layer], CompressedLayer)
        np.testing.assert_array_equal(counts_of(ours.results[layer]),
                                      counts_of(alone.results[layer]))
    assert ours.compression_ratio == pytest.approx(0.75)  # kvpress's convention, as it reads it
    by_tokens = CentroidKVPress(client, target_tokens=len(ids) // 2, **QUALITY)
    prefilled(model, by_tokens, ids)
    assert by_tokens.compression_ratio == pytest.approx(1 - (len(ids) // 2) / len(ids))
