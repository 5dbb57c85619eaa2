#!/usr/bin/env bash
# Megatron-LM core_v0.16.1: tp4 pp8 dp2 cp128 ep256 etp4 sp
# run from a Megatron-LM checkout
set -euo pipefail
CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun \
    --nnodes 2048 \
    --nproc-per-node 4 \
    --node-rank ${NODE_RANK} \
    --master-addr ${MASTER_ADDR} \
    --master-port 29500 pretrain_gpt.py \
    --num-layers 61 \
    --seq-length 4096 \
    --bf16 \
    --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model deepseek-v3 \
    --hidden-size 7168 \
    --ffn-hidden-size 18432 \
    --num-attention-heads 128 \
    --max-position-embeddings 163840 \
    --vocab-size 129280 \
    --normalization RMSNorm \
    --position-embedding-type rope \
    --swiglu \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --multi-latent-attention \
    --kv-lora-rank 512 \
    --qk-head-dim 128 \
    --qk-pos-emb-head-dim 64 \
    --v-head-dim 128 \
    --q-lora-rank 1536 \
    --num-experts 256 \
    --moe-router-topk 8 \
    --moe-ffn-hidden-size 2048 \
    --moe-grouped-gemm \
    --moe-layer-freq '([0]*3+[1]*58)' \
    --moe-shared-expert-intermediate-size 2048 \
    --tensor-model-parallel-size 4 \
    --pipeline-model-parallel-size 8 \
    --context-parallel-size 128 \
    --micro-batch-size 2 \
    --global-batch-size 4096 \
    --expert-model-parallel-size 256 \
    --expert-tensor-parallel-size 4 \
    --moe-token-dispatcher-type alltoall \
    --sequence-parallel \
    --pipeline-model-parallel-layout 'Et*7|t*8|t*8|t*8|t*8|t*8|t*7|t*7L' \
    --use-distributed-optimizer \
    --train-iters ${TRAIN_ITERS:-1000} \
    --lr ${LR:-3e-4}
