#!/bin/bash
# megarl on a running Ray cluster: `megarl train` submitted as a Ray job to the head's job server, with
# this checkout as the job's working dir (the cluster runs the code you have here). Logs are followed
# until the job ends. Ctrl-C detaches without
# stopping the job: stop it with `ray job stop JOB_ID`.
#
#   RAY_API_SERVER_ADDRESS=http://HEAD:8265 launch/ray/submit.sh configs/quickstart_grpo.yaml trainer.total_steps=10
#
# Exit code: 0 when the job SUCCEEDED (or was stopped with `ray job stop`), 1 when it FAILED.
#
# Environment (all optional):
#   RAY_API_SERVER_ADDRESS  the head's job server (default http://127.0.0.1:8265; `ray start --head` prints it)
#   RAY_AUTH_TOKEN          the cluster's token, when it is not in ~/.ray/auth_token (token auth is on by
#                           default in Ray 2.60; RAY_AUTH_MODE=token is set here)
#   MEGARL_NNODES, MEGARL_DEVICES_PER_NODE  override trainer.nnodes / trainer.n_devices_per_node
#   MEGARL_PYTHON           the Python that submits (default: python on PATH)
#   MEGARL_JOB_PYTHON       the Python the job runs with on the head (default: python on the head's PATH)
# .venv, .git and outputs are not uploaded (Ray's working dir limit is a few hundred MiB). The config is
# checked here before anything is submitted, and a relative trainer.output_dir is made absolute against
# this directory (the job's own working dir is a temporary copy): model, data and output paths must be
# on a file system the head node sees.
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: RAY_API_SERVER_ADDRESS=http://HEAD:8265 launch/ray/submit.sh CONFIG [key=value ...]" >&2
    exit 2
fi
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${MEGARL_PYTHON:-python}
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
export RAY_API_SERVER_ADDRESS=${RAY_API_SERVER_ADDRESS:-http://127.0.0.1:8265}
# CONFIG as the job sees it: inside this checkout, its path in the uploaded copy; else absolute
[ -f "$1" ] || { echo "megarl ray submit: no config file $1" >&2; exit 2; }
config_path=$(realpath "$1")
config=$config_path
case "$config" in "$repo"/*) config=${config#"$repo"/} ;; esac
shift
layout=(trainer.launcher=ray)
[ -n "${MEGARL_NNODES:-}" ] && layout+=(trainer.nnodes="$MEGARL_NNODES")
[ -n "${MEGARL_DEVICES_PER_NODE:-}" ] && layout+=(trainer.n_devices_per_node="$MEGARL_DEVICES_PER_NODE")
output_dir=$(PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$python" - "$config_path" "$@" "${layout[@]}" <<'PY'
import os
import sys

from megarl.config import ConfigError, load_config

try:
    config = load_config(sys.argv[1], sys.argv[2:], check_paths=False)
except (ConfigError, FileNotFoundError) as e:
    sys.exit(f"megarl ray submit: {e}")
print(os.path.abspath(config.trainer.output_dir))
PY
)
layout+=(trainer.output_dir="$output_dir")
echo "megarl ray submit: $RAY_API_SERVER_ADDRESS, outputs in $output_dir"
excludes='{"excludes": [".venv", ".git", "outputs", "__pycache__"]}'
exec "$python" -c "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()" \
    job submit --working-dir "$repo" --runtime-env-json "$excludes" -- \
    "${MEGARL_JOB_PYTHON:-python}" -m megarl.cli train "$config" "$@" "${layout[@]}"
