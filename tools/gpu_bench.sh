#!/usr/bin/env bash
# The GPU benchmarks for one lent H100/H200 (the `device` tool: ../.library/device/README.md), within
# 8 minutes, as one JSON: $OUT/gpu_bench.json (or outputs/bench/gpu/gpu_bench.json), each stage's
# status, seconds, result, and on failure why.
#
#   parity-bf16 Megatron (CUDA, nccl, TP1) vs transformers in bf16: megatron's error against transformers
#               in fp32 within a few times transformers' own bf16 error (`megarl verify-model --dtype bf16`)
#   parity-fp32 the same in fp32: logits and loss within 5e-5 (`megarl verify-model`)
#   train-bf16  policy update tokens/s and MFU: Megatron vs transformers vs megarl's FSDP backend,
#               ~0.35B and ~1.5B random Llamas (`megarl bench train --backend fsdp`)
#   train-fp32  the same in fp32
#
# The image there has CUDA torch and transformers but neither megatron-core nor omegaconf nor vLLM, and
# no network: carry wheels in .whl (64 MiB at most: megatron-core==0.16.1 omegaconf
# antlr4-python3-runtime psutil; a CUDA vLLM is ~400 MB, so nothing here needs vLLM). Each stage has
# its own time limit and fails alone, saying why; the script exits 1 if any stage failed.
#
#   bash tools/gpu_bench.sh            # on the GPU machine
#   bash tools/gpu_bench.sh --dry-run  # (or DRY_RUN=1) every stage on the CPU at the tiny size, a few
#                                      # steps: the plumbing, in CI (tests/launch/test_gpu_bench_script.py)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
dry_run=${DRY_RUN:-0}
[ "${1:-}" = "--dry-run" ] && dry_run=1
out=${OUT:-outputs/bench/gpu}
work=${WORK:-/tmp/megarl-gpu-bench}  # models and runs (GBs) stay here; the JSON and logs go to $out
py=${PYTHON:-python3}
mkdir -p "$out/logs" "$work"
: >"$work/stages.tsv"

if [ -d .whl ] && compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
        { echo "gpu_bench: installing the carried wheels in .whl failed"; exit 2; }
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

# Preflight: what every stage needs, checked once, each missing piece named.
if [ "$dry_run" = 1 ]; then
    mode=dry-run sizes=(tiny) parity_limit=240 train_limit=300
    train_args=(--sequences 2 --prompt-len 8 --response-len 8 --warmup 0 --repeats 1 --threads 1)
    export CUDA_VISIBLE_DEVICES=""
else
    mode=gpu sizes=(350m 1.5b) parity_limit=55 train_limit=170  # 2·55 + 2·170 s, the rest for set-up
    train_args=(--sequences 8 --prompt-len 128 --response-len 384 --warmup 1 --repeats 3 --threads 8)
    "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" ||
        { echo "gpu_bench: no CUDA GPU visible to torch (use --dry-run on a CPU)"; exit 2; }
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >"$out/gpu.csv" || true
fi
"$py" -c "import megatron.core, omegaconf, transformers, safetensors, psutil" 2>"$out/logs/preflight.log" || {
    echo "gpu_bench: $(tail -n 1 "$out/logs/preflight.log"): carry the missing packages as wheels in .whl"
    exit 2
}

# stage NAME LIMIT_S RESULT_FILE COMMAND...: run COMMAND under LIMIT_S, log to $out/logs/NAME.log; one
# line of stages.tsv: name, status, seconds, why (on failure), the result file.
stage() {
    local name=$1 limit=$2 result=$3 start rc why=""
    shift 3
    start=$(date +%s)
    echo "gpu_bench: $name (limit ${limit}s) …"
    timeout "$limit" "$@" >"$out/logs/$name.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "gpu_bench: $name ok in $(($(date +%s) - start))s"
        printf '%s\tok\t%s\t\t%s\n' "$name" "$(($(date +%s) - start))" "$result" >>"$work/stages.tsv"
        return 0
    fi
    if [ "$rc" -eq 124 ]; then
        why="timed out after ${limit}s"
    else
        why="exit $rc: $(grep -v '^\s*$' "$out/logs/$name.log" | tail -n 1 | tr '\t' ' ' | cut -c1-300)"
    fi
    echo "gpu_bench: $name FAILED ($why); log $out/logs/$name.log"
    printf '%s\tfailed\t%s\t%s\t%s\n' "$name" "$(($(date +%s) - start))" "$why" "$result" >>"$work/stages.tsv"
}

parity_model="$work/models/parity"
# Logits of magnitude ~5 (HF's default init gives ~1, where bf16 rounding hides a wrong rotary base).
[ -f "$parity_model/config.json" ] ||
    "$py" -m megarl.cli tiny-model --out "$parity_model" --initializer-range 0.1 >/dev/null
for dtype in bf16 fp32; do
    # shellcheck disable=SC2016  # expanded by the inner bash, from its arguments
    stage "parity-$dtype" "$parity_limit" "$work/parity-$dtype.jsonl" bash -c \
        'set -o pipefail; "$0" -m megarl.cli verify-model --hf "$1" --tp 1 --dtype "$2" --json | tee "$3"' \
        "$py" "$parity_model" "$dtype" "$work/parity-$dtype.jsonl"
done
for dtype in bf16 fp32; do
    mkdir -p "$work/train-$dtype" "$work/models" && ln -sfn "$work/models" "$work/train-$dtype/models"
    stage "train-$dtype" "$train_limit" "$work/train-$dtype/train.json" \
        "$py" -m megarl.cli bench train --sizes "${sizes[@]}" --dtype "$dtype" --backend fsdp \
        "${train_args[@]}" --out "$work/train-$dtype"
done

"$py" - "$work/stages.tsv" "$out/gpu_bench.json" "$mode" <<'EOF'
import json, sys
from pathlib import Path

stages_tsv, out, mode = sys.argv[1:4]
stages = {}
for line in Path(stages_tsv).read_text().splitlines():
    name, status, seconds, why, result = line.split("\t")
    entry = {"status": status, "seconds": int(seconds), "error": why or None, "result": None}
    path = Path(result)
    if path.exists():
        text = path.read_text()
        if path.suffix == ".jsonl":  # one JSON line per layout among the launch's other output
            entry["result"] = [json.loads(r) for r in text.splitlines() if r.startswith("{")]
        else:
            entry["result"] = json.loads(text)
    stages[name] = entry
try:
    import torch
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
except ImportError:
    device = "unknown"
Path(out).write_text(json.dumps({"mode": mode, "device": device, "stages": stages}, indent=2))
print(f"gpu_bench: {out}: " + ", ".join(f"{n} {s['status']}" for n, s in stages.items()))
EOF
! grep -q "	failed	" "$work/stages.tsv"
