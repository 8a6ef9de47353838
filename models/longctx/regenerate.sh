#!/usr/bin/env bash
# Regenerates the committed model with one command: trains it from its fixed seeds
# (train.py --circuit, about 55 minutes on 2 quiet CPU cores), copies model.bin,
# config.json and train_log.jsonl here, prints the held-out table (evaluate.py) and rewrites
# test_cases.json, retrieval_cases.txt and calibration_cases.txt (cases.py).
# Keep the machine otherwise idle while it trains. Usage: models/longctx/regenerate.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-cache/run}
python=../../.venv/bin/python
[ -x "$python" ] || bash ../../scripts/setup_python.sh
nice -n 5 "$python" train.py --circuit --format circuit --no-bf16 --out "$out" \
  --train-stories 4096 --steps 2000 --tokens-per-step 8192 --schedule 256:0.6,512:0.2,1024:0.2 \
  --lr 3e-3 --warmup 50 --eval-every 250 --heldout-per-kind 4 --copy-prob 0 --answer-weight 2 \
  --dense-frac 0.3 --dim 384 --hidden-dim 512 --rms-cap 1.2 --rms-weight 1.0
cp "$out/model.bin" "$out/config.json" "$out/train_log.jsonl" .
"$python" evaluate.py
"$python" cases.py
