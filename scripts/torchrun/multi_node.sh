#!/usr/bin/env bash
# torchrun across machines: run this once on every node, with the same MASTER_ADDR/MASTER_PORT
# (node 0's address, reachable from all nodes) and its own NODE_RANK.
#
#   node 0:  NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 NPROC=8 scripts/torchrun/multi_node.sh trainer=gpu
#   node 1:  NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 NPROC=8 scripts/torchrun/multi_node.sh trainer=gpu
#
# World size NNODES x NPROC; global rank 0 (node 0) alone writes checkpoints and summary.json. Every
# rank writes its train.log lines into the run's folder, which each names from the command: put
# LITLAB_LOG_DIR on a filesystem all nodes share to keep them in one place (otherwise each node keeps
# its ranks' lines in that folder under its own LITLAB_LOG_DIR). Other arguments go to litlab-train.
set -euo pipefail
: "${NNODES:?set NNODES, the number of nodes}"
: "${NODE_RANK:?set NODE_RANK, the rank of this node (0..NNODES-1)}"
: "${MASTER_ADDR:?set MASTER_ADDR, the address of node 0}"
MASTER_PORT="${MASTER_PORT:-29500}"
NPROC="${NPROC:-1}"
exec torchrun --nnodes="$NNODES" --node-rank="$NODE_RANK" --nproc-per-node="$NPROC" \
    --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" -m litlab.cli.train \
    trainer.devices="$NPROC" trainer.num_nodes="$NNODES" strategy=ddp "$@"
