import os, sys, torch, centroidkv, centroidkv.convert_llama2c as convert
from centroidkv.transformers import CentroidKVCache, enable
from centroidkv.presets import SMALL_MODEL  # chunk 32, sink 4, recent 32: what the reports ran
model = convert.to_transformers(sys.argv[1])  # stories260K.bin -> LlamaForCausalLM (or from_pretrained)
enable(model)                             # count-aware attention, compression after prefill
client = centroidkv.Client(os.environ.get("CKV_TARGET", "127.0.0.1:50051"))
cache = CentroidKVCache(client, target_ratio=0.25, **SMALL_MODEL)  # scorer="window": scored jobs
prompt = torch.tensor([[1] + [400 + i % 50 for i in range(255)]])  # BOS + 255 token ids
out = model.generate(prompt, attention_mask=torch.ones_like(prompt), past_key_values=cache,
                     max_new_tokens=24, do_sample=False, pad_token_id=0)
print("each KV head keeps", len(cache.results[0].head(0).counts), "of 256; new:", out[0, 256:].tolist())
