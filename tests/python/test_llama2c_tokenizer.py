"""centroidkv.llama2c_tokenizer: llama2.c's tok512.bin as a transformers fast tokenizer,
saved by `python -m centroidkv.convert_llama2c --tokenizer` and loaded back with
AutoTokenizer (kvpress's KVzip loads it that way), encoding every text as llama2.c's
encoder does (the independent one in models/longctx/llama.py, which trained that model)."""
from __future__ import annotations

import importlib.util
import pathlib
import random
import subprocess
import sys

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from centroidkv.convert_llama2c import to_transformers, tokenizer_to_transformers
from server_process import SHARED_DIR

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENIZER = SHARED_DIR / "models" / "tok512.bin"
MODEL = SHARED_DIR / "models" / "stories260K.bin"


@pytest.fixture(scope="module")
def llama2c_encoder():
    spec = importlib.util.spec_from_file_location("longctx_llama", ROOT / "models" / "longctx" / "llama.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.Tokenizer(str(TOKENIZER))


@pytest.fixture(scope="module")
def converted_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("stories260K-hf")
    subprocess.run([sys.executable, "-m", "centroidkv.convert_llama2c", str(MODEL), str(out),
                    "--tokenizer", str(TOKENIZER)], check=True, capture_output=True)
    return out


def texts():
    """Story text, characters without a piece (byte fallback), runs of one character (where
    a merge order that differed from llama2.c's would show) and random strings."""
    rng = random.Random(5)
    story = (ROOT / "models" / "longctx" / "stories.py").read_text()
    out = [" Once upon a time, there was a little girl named Lily.", "", " ", "aaaaaaa",
           "   \n\n  the the  thethe", " café 😀 naïve – “quoted”", "<s> x </s>"]
    for _ in range(300):
        start = rng.randrange(len(story) - 200)
        out.append(story[start:start + rng.randint(1, 200)])
    for alphabet in [" ae", " th", "lo l", "ing ", " .\n", "eee  "]:
        out += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
                for _ in range(200)]
    return out


def test_autotokenizer_loads_the_saved_tokenizer_and_encodes_as_llama2c(converted_dir,
                                                                        llama2c_encoder):
    tokenizer = AutoTokenizer.from_pretrained(converted_dir)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (1, 2, 0)
    assert tokenizer.chat_template is None
    for text in texts():
        if "<s>" in text:  # special tokens are split off first, as transformers does
            assert tokenizer.encode(text, add_special_tokens=False) == \
                [1] + llama2c_encoder.encode(" x ") + [2]
            continue
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == llama2c_encoder.encode(text), text
        assert tokenizer.encode(text) == [1] + ids  # BOS with special tokens
        assert tokenizer.decode(ids) == llama2c_encoder.decode(ids)
    byte_fallback = tokenizer.encode("😀", add_special_tokens=False)
    assert byte_fallback == [3 + b for b in "😀".encode()]


def test_the_converted_folder_loads_as_the_in_memory_conversion(converted_dir):
    saved = LlamaForCausalLM.from_pretrained(converted_dir).eval()
    direct = to_transformers(MODEL)
    ids = torch.tensor([tokenizer_to_transformers(TOKENIZER).encode(" Lily saw a cat.")])
    with torch.no_grad():
        torch.testing.assert_close(saved(ids).logits, direct(ids).logits, rtol=0, atol=0)
