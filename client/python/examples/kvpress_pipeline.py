import os, sys, kvpress, centroidkv, centroidkv.convert_llama2c as convert  # kvpress: the pipeline
from transformers import pipeline
from centroidkv.kvpress import CentroidKVPress
from centroidkv.presets import SMALL_MODEL  # chunk 32, sink 4, recent 32: what the reports ran
model = convert.to_transformers(sys.argv[1])            # stories260K.bin -> LlamaForCausalLM
tokenizer = convert.tokenizer_to_transformers(sys.argv[2])  # tok512.bin -> a transformers tokenizer
client = centroidkv.Client(os.environ.get("CKV_TARGET", "127.0.0.1:50051"))
pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
context = " Once upon a time, there was a girl named Lily. She had a red ball. She liked to play with it in the park every day." * 4
presses = (CentroidKVPress(client, target_ratio=0.25, **SMALL_MODEL),  # the SPEC job, small-model preset
           CentroidKVPress(client, target_ratio=0.25, scorer=kvpress.SnapKVPress(),  # scored: SnapKV's
                           sink_tokens=4, recent_tokens=0, centroid_share=0.15),  # scores, tail centroids
           kvpress.StreamingLLMPress(compression_ratio=0.75))
for press in presses:
    answer = pipe(context, question=" What did Lily have?", press=press, max_new_tokens=12)["answer"]
    print(f"{type(press).__name__:>20}{'+scorer' if getattr(press, 'scorer', None) else '':7}: {answer!r}")
