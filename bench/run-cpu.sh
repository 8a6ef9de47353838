#!/usr/bin/env bash
# The CPU kernel benchmark in one command (SPEC section 5): installs what it needs,
# builds centroidkv-cpu-bench, runs it (fp32 FMA peak, our pipeline, the FAISS peer), runs
# the PyTorch peer on the same data, writes docs/results/cpu-bench.md and prints, last, one JSON
# line with one object per chunk size.
#
# Usage: bench/run-cpu.sh [centroidkv-cpu-bench flags...]
#   e.g. bench/run-cpu.sh --tokens=4096 --reps=3   (a quick check, labelled as such)
# Environment:
#   CKV_BUILD_DIR     build folder (default build)
#   CKV_JOBS          parallel compile jobs (default: the number of CPUs)
#   CKV_BENCH_DATA    where the data and raw results go (default /tmp/centroidkv-bench)
#   CKV_BENCH_DOC     the markdown written (default docs/results/cpu-bench.md)
#   CKV_BENCH_NO_INSTALL=1  never call apt-get
# Safe to rerun: packages are installed only when missing, the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${CKV_BUILD_DIR:-build}
data_dir=${CKV_BENCH_DATA:-/tmp/centroidkv-bench}
doc=${CKV_BENCH_DOC:-docs/results/cpu-bench.md}
python=/usr/bin/python3  # Debian's python, the one with numpy and torch
command_line="bench/run-cpu.sh${*:+ $*}"
load_at_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)

# libopenblas0-pthread: without it FAISS and PyTorch run on Debian's reference BLAS
# (netlib, unoptimised), which would make both peers look slower than they are.
packages=(libbenchmark-dev libfaiss-dev libopenblas0-pthread python3-torch python3-numpy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "${CKV_BENCH_NO_INSTALL:-0}" = 1 ]; then
    echo "run-cpu.sh: missing packages (not installing): ${missing[*]}" >&2
  else
    echo "run-cpu.sh: installing ${missing[*]}" >&2
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >&2
  fi
fi

# Configure (again, so that packages installed since the last configure are found) and
# build only the benchmark and what it links.
cmake -S . -B "$build_dir" -DCKV_BUILD_BENCH=ON >/dev/null
CKV_BUILD_DIR="$build_dir" scripts/build.sh centroidkv_cpu_bench >&2
bench_bin="$build_dir/bin/centroidkv-cpu-bench"
[ -x "$bench_bin" ] || { echo "run-cpu.sh: $bench_bin was not built (Google Benchmark missing?)" >&2; exit 1; }

# With --level forcing the cpu backend's kernels below the CPU's best, the peers are held to
# the same vectors where they can be: OpenBLAS (FAISS's and PyTorch's matrix products; Debian
# builds it for every CPU and picks the kernels at run time) and PyTorch's own kernels.
for arg in "$@"; do
  case "$arg" in
    --level=avx2) export OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 ;;
    --level=avx512) export OPENBLAS_CORETYPE=SkylakeX ATEN_CPU_CAPABILITY=avx512 ;;
    --level=scalar) export OPENBLAS_CORETYPE=Prescott ATEN_CPU_CAPABILITY=default ;;
  esac
done
[ -n "${OPENBLAS_CORETYPE:-}" ] && echo "run-cpu.sh: peers' OpenBLAS kernels: $OPENBLAS_CORETYPE" >&2

mkdir -p "$data_dir"
rm -f "$data_dir"/summary.json "$data_dir"/torch.json "$data_dir"/assignment_C*.npy
# Our pipeline, the FMA peak and FAISS, in one process; it also leaves the data (.npy) and
# our assignments for the PyTorch peer. Progress and tables go to stderr.
# Result rows in float32 (the headline) and fp16 side by side; a later --result_dtype in
# "$@" replaces the list.
"$bench_bin" --dump_dir="$data_dir" --summary_out="$data_dir/summary.json" \
  --benchmark_out="$data_dir/benchmark.json" --benchmark_out_format=json \
  --result_dtype=float32,float16 "$@" >&2
# The PyTorch peer on the same bytes.
torch_json=""
if "$python" -c "import torch, numpy" 2>/dev/null; then
  reps=5
  for arg in "$@"; do case "$arg" in --reps=*) reps=${arg#--reps=} ;; esac; done
  "$python" bench/torch_peer.py "$data_dir" --reps "$reps" --out "$data_dir/torch.json" >&2
  torch_json="$data_dir/torch.json"
else
  echo "run-cpu.sh: no torch/numpy for $python: PyTorch peer skipped" >&2
fi

"$python" bench/report.py --summary "$data_dir/summary.json" --torch "$torch_json" \
  --doc "$doc" --command "$command_line" --load "$load_at_start"
