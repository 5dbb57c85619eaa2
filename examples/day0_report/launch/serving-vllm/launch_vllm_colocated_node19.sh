#!/usr/bin/env bash
# vLLM 0.33.0, colocated pool: tp4 pp16 dp8 cp1 ep8 etp4
# 1 x 512 devices
# node 19 of 128
set -euo pipefail
VLLM_PP_LAYER_PARTITION=3,4,4,4,4,4,4,4,4,4,4,4,4,4,3,3 vllm serve deepseek-v3 \
    --dtype bfloat16 \
    --tensor-parallel-size 4 \
    --pipeline-parallel-size 16 \
    --data-parallel-size 8 \
    --enable-expert-parallel \
    --all2all-backend deepep_high_throughput \
    --kv-cache-dtype auto \
    --max-num-seqs 1 \
    --nnodes 128 \
    --node-rank 19 \
    --master-addr ${MASTER_ADDR} \
    --headless
