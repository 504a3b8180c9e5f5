#!/usr/bin/env bash
# Train on two machines (or more) without a scheduler: run this script on every machine,
# each with its own NODE_RANK (0 on the machine at MASTER_ADDR). Arguments go to
# `lmctl train`, after the objective:
#
#   NODE_RANK=0 MASTER_ADDR=10.0.0.1 ./two-machines.sh --config clm.yaml    # on 10.0.0.1
#   NODE_RANK=1 MASTER_ADDR=10.0.0.1 ./two-machines.sh --config clm.yaml    # on the other
#
# The run directory is a bucket (OUTPUT_DIR): each machine writes its own local copy and
# uploads its part of every checkpoint; a lost process restarts every machine's processes
# from the newest complete checkpoint in the bucket, up to MAX_RESTARTS times. Every setting
# below can be given in the environment.
set -euo pipefail

: "${NODE_RANK:?set NODE_RANK: 0 on the machine at MASTER_ADDR, 1 on the next, ...}"
: "${MASTER_ADDR:?set MASTER_ADDR: the address of the machine with NODE_RANK 0}"
MASTER_PORT=${MASTER_PORT:-29500}            # free on MASTER_ADDR, reachable from the others
NNODES=${NNODES:-2}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l || true)
NPROC=${NPROC:-$(( gpus > 0 ? gpus : 1 ))}   # processes per machine: one per GPU
LAUNCHER=${LAUNCHER:-torchrun}               # or accelerate
OBJECTIVE=${OBJECTIVE:-clm}
OUTPUT_DIR=${OUTPUT_DIR:-s3://my-bucket/runs/$OBJECTIVE-1}
MAX_RESTARTS=${MAX_RESTARTS:-3}
LMCTL=${LMCTL:-lmctl}                        # or: python -m lmctl

exec $LMCTL train "$OBJECTIVE" "$@" \
    --output-dir "$OUTPUT_DIR" \
    --nproc "$NPROC" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    --launcher "$LAUNCHER" --max-restarts "$MAX_RESTARTS"
