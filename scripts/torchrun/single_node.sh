#!/usr/bin/env bash
# torchrun on one machine: NPROC ranks (default 2), started by torchrun, not by Lightning.
#
#   scripts/torchrun/single_node.sh trainer.accelerator=cpu          # 2 CPU ranks (gloo)
#   NPROC=8 scripts/torchrun/single_node.sh trainer=gpu              # 8 GPUs
#
# The same as: torchrun --nproc-per-node=2 -m litlab.cli.train trainer.devices=2 strategy=ddp ...
# Lightning detects TorchElasticEnvironment; every rank names the same run folder from the command.
# Other arguments go to litlab-train.
set -euo pipefail
NPROC="${NPROC:-2}"
exec torchrun --nproc-per-node="$NPROC" -m litlab.cli.train \
    trainer.devices="$NPROC" strategy=ddp "$@"
