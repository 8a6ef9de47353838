"""models/longctx from Python: centroidkv.convert_llama2c reads its RoPE base
(500000) from the llama2.c file's legacy table, the converted model equals the C++ worker
and survives a save and a reload as a transformers folder, and with the full cache it
answers the held-out cases of test_cases.json."""
from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from centroidkv.convert_llama2c import read_llama2c, to_transformers
from server_process import BIN_DIR

HERE = pathlib.Path(__file__).resolve().parents[2] / "models" / "longctx"


@pytest.fixture(scope="module")
def cases():
    return json.loads((HERE / "test_cases.json").read_text())


@pytest.fixture(scope="module")
def converted():
    return to_transformers(HERE / "model.bin").eval()


def test_the_rope_base_comes_from_the_file(converted):
    config, _ = read_llama2c(HERE / "model.bin")
    assert config["rope_theta"] == 500000.0
    assert converted.config.rope_theta == 500000.0


def test_converted_equals_its_saved_folder_and_the_worker(converted, cases, tmp_path):
    converted.save_pretrained(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["rope_theta"] == 500000.0
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    prompt = cases[0]["prompt"]
    with torch.no_grad():
        a = converted(torch.tensor([prompt])).logits[0]
        b = reloaded(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    out = tmp_path / "logits.f32"
    tail = prompt[-16:]  # the worker feeds the whole prompt; compare the last positions
    subprocess.run([str(BIN_DIR / "ckv_worker_logits"), str(HERE / "model.bin"), str(out)] +
                   [str(t) for t in prompt], check=True)
    worker = torch.from_numpy(np.fromfile(out, np.float32).reshape(len(prompt), -1))
    torch.testing.assert_close(worker[-len(tail):], a[-len(tail):], rtol=0, atol=2e-3)


def test_full_cache_answers_the_held_out_cases(converted, cases):
    hits = 0
    for c in cases:
        seq = torch.tensor([c["prompt"] + c["answer"][:-1]])
        with torch.no_grad():
            logits = converted(seq).logits[0, len(c["prompt"]) - 1:]
        hits += logits.argmax(-1).tolist() == c["answer"]
    assert 10 * hits >= 9 * len(cases), f"{hits} of {len(cases)}"
