#!/bin/bash
# megarl on bare-metal nodes without a scheduler (SPMD, no Ray): run this on EVERY node, with the same
# NNODES/MASTER_ADDR/MASTER_PORT and each node's own NODE_RANK (0 on the MASTER_ADDR node).
#
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 launch/torchrun/node.sh configs/quickstart_grpo.yaml   # node 0
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 launch/torchrun/node.sh configs/quickstart_grpo.yaml   # node 1
#
# Environment: NNODES, NODE_RANK, MASTER_ADDR (required); MASTER_PORT (29500); NPROC_PER_NODE (the
# visible GPUs, else 1); MEGARL_PYTHON (python). Set NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME when the
# nodes' default interface is not the one they reach each other on. SIGTERM or SIGUSR1 to this process
# (torchrun) reaches every rank: they finish their step, save it and exit 75 (torchrun then exits 1).
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: NNODES=N NODE_RANK=R MASTER_ADDR=HOST launch/torchrun/node.sh CONFIG [key=value ...]" >&2
    exit 2
fi
: "${NNODES:?set NNODES (the number of nodes)}" "${NODE_RANK:?set NODE_RANK (0..NNODES-1)}"
: "${MASTER_ADDR:?set MASTER_ADDR (the address of the NODE_RANK=0 node)}"
python=${MEGARL_PYTHON:-python}
# the GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else every GPU nvidia-smi lists
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
else
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
nproc=${NPROC_PER_NODE:-$([ "${gpus:-0}" -gt 0 ] && echo "$gpus" || echo 1)}
exec "$python" -m megarl.distributed.store --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$nproc" \
    --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}" --max_restarts 0 \
    --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 --shutdown-timeout "${MEGARL_SHUTDOWN_TIMEOUT_S:-600}" \
    -m megarl.train "$@" trainer.launcher=torchrun trainer.nnodes="$NNODES" trainer.n_devices_per_node="$nproc"
