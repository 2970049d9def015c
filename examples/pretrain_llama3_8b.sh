#!/bin/bash
# Llama-3.1-8B pre-training with Megatron-LM on 8 nodes of 8 H100s (64 GPUs), as a team might launch it today:
# tp 2, pp 1, the distributed optimizer, selective recomputation, bf16. `exatrain estimate --from` reads its model,
# world size, layout, batch and precision; the data and tokenizer paths are placeholders it does not need.
#SBATCH --job-name=llama3-8b
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00

export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NNODES=${SLURM_NNODES:-8}
TP=2
PP=1
DATA=/data/fineweb_text_document
CKPT=/checkpoints/llama3-8b

MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention --num-query-groups 8
    --seq-length 8192 --max-position-embeddings 8192
    --position-embedding-type rope --rotary-base 500000
    --normalization RMSNorm --norm-epsilon 1e-5 --swiglu --disable-bias-linear
    --untie-embeddings-and-output-weights
    --attention-dropout 0.0 --hidden-dropout 0.0
)
TRAINING_ARGS=(
    --micro-batch-size 1 --global-batch-size 512
    --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2000 --train-iters 100000
    --weight-decay 0.1 --clip-grad 1.0 --bf16
)
PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP --sequence-parallel
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
    --recompute-granularity selective
)

srun torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $SLURM_NODEID \
    --rdzv_backend c10d --rdzv_endpoint "$(hostname):29500" \
    pretrain_gpt.py \
    "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${PARALLEL_ARGS[@]}" \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Llama-3.1-8B \
    --data-path $DATA --split 99,1,0 \
    --save $CKPT --load $CKPT --save-interval 1000 --log-interval 10 --eval-interval 1000 --eval-iters 10
