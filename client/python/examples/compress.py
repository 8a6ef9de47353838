import os, numpy as np, centroidkv
client = centroidkv.Client(os.environ.get("CKV_TARGET", "127.0.0.1:50051"))
rng = np.random.default_rng(0)
keys = rng.standard_normal((8, 4096, 128)).astype(np.float16)    # [heads, tokens, dim]
values = rng.standard_normal((8, 4096, 128)).astype(np.float16)
r = client.compress(keys, values, target_ratio=0.25, return_assignment=True)
print(client.info().version, r.backend, "entries", r.keys.shape, r.keys.dtype)
print("head 0 keeps", len(r.head(0).counts), "centroids for", r.counts[:r.offsets[1]].sum(), "tokens")
layers = client.compress_layers([(keys, values)] * 32, target_ratio=0.25)  # one stream
print(len(layers), "layers, in order:", [l.layer_index for l in layers][:4], "...")
