import os, sys, kvpress, centroidkv, centroidkv.convert_llama2c as convert  # kvpress: the pipeline
from transformers import pipeline
from centroidkv.kvpress import CentroidKVPress
model = convert.to_transformers(sys.argv[1])            # stories260K.bin -> LlamaForCausalLM
tokenizer = convert.tokenizer_to_transformers(sys.argv[2])  # tok512.bin -> a transformers tokenizer
client = centroidkv.Client(os.environ.get("CKV_TARGET", "127.0.0.1:50051"))
pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
context = " Once upon a time, there was a girl named Lily. She had a red ball. She liked to play with it in the park every day." * 4
for press in (CentroidKVPress(client, target_ratio=0.25), kvpress.StreamingLLMPress(compression_ratio=0.75)):
    answer = pipe(context, question=" What did Lily have?", press=press, max_new_tokens=12)["answer"]
    print(f"{type(press).__name__:>20}: {answer!r}")
