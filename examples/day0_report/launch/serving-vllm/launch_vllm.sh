vllm serve deepseek-v3 \
    --tensor-parallel-size 1 \
    --pipeline-parallel-size 32 \
    --data-parallel-size 16 \
    --enable-expert-parallel \
    --kv-cache-dtype fp8 \
    --max-num-seqs 11 \
    --enable-dbo
