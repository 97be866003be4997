#!/usr/bin/env bash
# The GPU variant of the benchmarks, prepared for one lent H200 (the `device` tool; see
# ../.library/device/README.md): under 8 minutes. Results land in $OUT (the device tool's folder) or
# outputs/bench/gpu.
#
#   train    Megatron vs transformers eager, fp32 and bf16, 25m and 350m: tokens/s and MFU
#   rollout  vLLM in the trainer after a weight sync vs a standalone engine (1 GPU: 1 replica)
#   reshard  the transition into the engine, a bucket sweep, vs a fresh engine from safetensors
#
# The image there has CUDA torch and transformers but not megatron-core, omegaconf, Ray or vLLM, and
# nothing can be installed from the network: carry wheels in .whl (the device README's recipe), e.g.
# megatron-core==0.16.1 omegaconf antlr4-python3-runtime psutil. A CUDA vLLM wheel (~400 MB) is over
# the tool's 64 MiB carry, so without one installed there the rollout and reshard variants are skipped
# with a line saying so. The e2e GPU variant needs TRL with CUDA torch in its own venv: not possible
# there for the same reason, and not attempted.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-outputs/bench/gpu}
work=${WORK:-/tmp/megarl-gpu-bench}  # models and runs (GBs) stay here; tables and JSON go to $out
mkdir -p "$out" "$work"
py=${PYTHON:-python3}
if [ -d .whl ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
"$py" - <<'EOF'
import torch
assert torch.cuda.is_available(), "no GPU visible: this script is for a lent GPU machine"
print(torch.cuda.get_device_name(), torch.__version__)
EOF
"$py" -c "import megatron.core, omegaconf" || {
    echo "megatron-core / omegaconf missing: carry them as wheels in .whl"
    exit 2
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$out/gpu.csv"

bench() { timeout "$1" "$py" -m megarl.cli bench "${@:2}" 2>&1 | tee -a "$out/log.txt" | grep -v "^\s*$" | tail -20; }

for dtype in bf16 fp32; do
    mkdir -p "$work/train-$dtype" && ln -sfn "$work/models" "$work/train-$dtype/models"
    bench 150 train --sizes 25m 350m --dtype "$dtype" --sequences 32 --prompt-len 128 --response-len 384 \
        --threads 8 --out "$work/train-$dtype" || echo "bench train $dtype failed"
    cp "$work/train-$dtype/train.json" "$out/train-$dtype.json" 2>/dev/null || true
    cp "$work/train-$dtype/train.md" "$out/train-$dtype.md" 2>/dev/null || true
done
if "$py" -c "import vllm" 2>/dev/null; then
    bench 150 rollout --sizes 25m 350m --nproc 1 --out "$work" || echo "bench rollout failed"
    bench 90 reshard --hf "$work/models/350m" --tp 1 --gen-tp 1 --nproc 1 --engine \
        --bucket-mib 16 64 256 1024 --out "$work" || echo "bench reshard failed"
    cp "$work"/rollout.{json,md} "$work"/reshard.{json,md} "$out/" 2>/dev/null || true
else
    echo "vLLM is not installed here: bench rollout and bench reshard --engine skipped" | tee -a "$out/log.txt"
fi
ls -l "$out"
