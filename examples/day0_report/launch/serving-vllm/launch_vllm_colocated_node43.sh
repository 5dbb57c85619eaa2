#!/usr/bin/env bash
# vLLM 0.33.0, colocated pool: tp4 pp32 dp4 cp1 ep4 etp4
# 1 x 512 devices
# node 43 of 128
set -euo pipefail
VLLM_PP_LAYER_PARTITION=1,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,1,1 vllm serve deepseek-v3 \
    --dtype bfloat16 \
    --tensor-parallel-size 4 \
    --pipeline-parallel-size 32 \
    --data-parallel-size 4 \
    --enable-expert-parallel \
    --all2all-backend deepep_high_throughput \
    --kv-cache-dtype fp8 \
    --max-num-seqs 2 \
    --nnodes 128 \
    --node-rank 43 \
    --master-addr ${MASTER_ADDR} \
    --headless
