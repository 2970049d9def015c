"""Option names of the engines export-config targets, recorded from their sources (facts, not code).

Each set was read out of the named file at the named commit, restricted to the options about model
shape, parallel layout, batch, recompute, optimizer-state sharding, precision and attention (the
concerns export-config maps), so a misspelt or invented flag in an export fails the golden tests.

How they were read: Megatron-LM's set is the option strings of the real parser
(megatron.training.arguments.add_megatron_arguments, built with optional GPU packages stubbed);
Megatron-DeepSpeed's from the add_argument calls of megatron/arguments.py; torchtitan's from the
dataclass fields of torchtitan/config/job_config.py; DeepSpeed's from deepspeed/runtime/constants.py.
The exported 175B/1T flags were also run through both Megatron parsers' parse_args + validate_args
and the TOML through torchtitan v0.2.2's ConfigManager (which rejects unknown keys) by hand.
"""

# NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
# megatron/training/arguments.py add_megatron_arguments (options generated there from
# megatron/core/model_parallel_config.py, megatron/core/transformer/transformer_config.py,
# megatron/training/config/training_config.py, megatron/core/distributed/distributed_data_parallel_config.py).
MEGATRON_LM_OPTIONS = frozenset("""
    --attention-backend --bf16 --checkpoint-activations --ckpt-format
    --data-parallel-sharding-strategy --decoder-first-pipeline-num-layers
    --decoder-last-pipeline-num-layers --disable-bias-linear --distribute-saved-activations
    --distributed-backend --distributed-timeout-minutes --distributed-timeout-seconds-after-init
    --ffn-hidden-size --fp16 --fp16-lm-cross-entropy --global-batch-size --group-query-attention
    --hidden-size --make-vocab-size-divisible-by --max-position-embeddings --micro-batch-size
    --no-position-embedding --norm-epsilon --normalization --num-attention-heads --num-layers
    --num-layers-at-end-in-bf16 --num-layers-at-start-in-bf16
    --num-layers-per-virtual-pipeline-stage --num-query-groups
    --num-virtual-stages-per-pipeline-rank --pipeline-model-parallel-comm-backend
    --pipeline-model-parallel-layout --pipeline-model-parallel-size --position-embedding-type
    --recompute-activations --recompute-granularity --recompute-method --recompute-modules
    --recompute-num-layers --rotary-base --rotary-interleaved --rotary-percent
    --rotary-scaling-factor --rotary-seq-len-interpolation-factor --seq-length
    --sequence-parallel --swiglu --tensor-model-parallel-size
    --untie-embeddings-and-output-weights --use-distributed-optimizer --use-flash-attn
    --use-megatron-fsdp --use-rotary-position-embeddings --use-torch-fsdp2 --vocab-size
""".split())

# deepspeedai/Megatron-DeepSpeed 4efb479d5317ce9b86096b9d8e3e8030b0b5263b (2025-07-16), megatron/arguments.py.
MEGATRON_DEEPSPEED_OPTIONS = frozenset("""
    --bf16 --checkpoint-activations --checkpoint-num-layers --deepspeed-activation-checkpointing
    --disable-bias-linear --distribute-checkpointed-activations --distribute-saved-activations
    --distributed-backend --distributed-timeout-minutes --ffn-hidden-size --fp16
    --fp16-lm-cross-entropy --global-batch-size --hidden-size --hidden-size-teacher
    --layernorm-epsilon --make-vocab-size-divisible-by --max-position-embeddings
    --micro-batch-size --no-pipeline-parallel --no-position-embedding --normalization
    --num-attention-heads --num-attention-heads-teacher --num-key-value-heads --num-layers
    --num-layers-per-virtual-pipeline-stage --num-layers-teacher --partition-activations
    --pipeline-model-parallel-size --pipeline-model-parallel-split-rank --recompute-activations
    --recompute-granularity --recompute-method --recompute-num-layers --rotary-percent
    --rotary-position-embeddings-theta --seq-length --sequence-parallel --swiglu
    --tensor-model-parallel-size --untie-embeddings-and-output-weights
    --use-distributed-optimizer --use-flash-attn --use-flash-attn-builder
    --use-flash-attn-triton --use-flash-attn-v1 --use-flash-attn-v2
    --use-rotary-position-embeddings --vocab-size --zero-allgather-bucket-size
    --zero-contigious-gradients --zero-reduce-bucket-size --zero-reduce-scatter --zero-stage
""".split())

# deepspeedai/DeepSpeed edaa7221267243c7be7fb49c5d5f5c4fb97b4641 (2026-08-22), deepspeed/__init__.py
# _add_core_arguments (what add_config_arguments adds to Megatron-DeepSpeed's parser).
DEEPSPEED_LAUNCHER_OPTIONS = frozenset({"--deepspeed", "--deepspeed_config", "--deepscale", "--deepscale_config"})

# Same DeepSpeed commit: deepspeed/runtime/constants.py (TRAIN_BATCH_SIZE, TRAIN_MICRO_BATCH_SIZE_PER_GPU,
# GRADIENT_ACCUMULATION_STEPS, BFLOAT16 / BFLOAT16_ENABLED, FP16 / FP16_ENABLED, GRADIENT_CLIPPING,
# STEPS_PER_PRINT) and deepspeed/runtime/zero/config.py (ZERO_OPTIMIZATION; DeepSpeedZeroConfig.stage).
DEEPSPEED_CONFIG_KEYS = {
    "train_batch_size": None, "train_micro_batch_size_per_gpu": None, "gradient_accumulation_steps": None,
    "steps_per_print": None, "gradient_clipping": None,
    "bf16": {"enabled"}, "fp16": {"enabled"}, "zero_optimization": {"stage"},
}

# pytorch/torchtitan v0.2.2 = 73a0e697 (2026-02-20), torchtitan/config/job_config.py: JobConfig's
# sections and the fields of their dataclasses (Job, Model, Training, Parallelism, ActivationCheckpoint,
# Compile, Debug).
TORCHTITAN_FIELDS = {
    "job": frozenset("""
    config_file dump_folder description print_config save_config_file custom_config_module
    """.split()),
    "model": frozenset("""
    name flavor hf_assets_path tokenizer_path converters print_after_conversion
    """.split()),
    "training": frozenset("""
    dataset dataset_path local_batch_size global_batch_size seq_len max_norm steps
    enable_cpu_offload dtype mixed_precision_param mixed_precision_reduce gc_freq gc_debug
    dataloader
    """.split()),
    "parallelism": frozenset("""
    data_parallel_replicate_degree data_parallel_shard_degree fsdp_reshard_after_forward
    tensor_parallel_degree disable_loss_parallel enable_async_tensor_parallel
    pipeline_parallel_degree module_fqns_per_model_part
    pipeline_parallel_first_stage_less_layers pipeline_parallel_last_stage_less_layers
    pipeline_parallel_layers_per_stage pipeline_parallel_schedule pipeline_parallel_schedule_csv
    pipeline_parallel_microbatch_size pipeline_parallel_expert_parallel_overlap
    context_parallel_degree context_parallel_load_balancer context_parallel_rotate_method
    expert_parallel_degree expert_tensor_parallel_degree expert_parallel_comm_backend
    """.split()),
    "activation_checkpoint": frozenset("""
    mode selective_ac_option per_op_sac_force_recompute_mm_shapes_by_fqns early_stop
    memory_budget visualize_memory_budget_pareto preserve_rng_state determinism_check debug
    """.split()),
    # [compile] (Compile: enable, components of "model" / "loss"; replaced training.compile in 2025)
    "compile": frozenset("enable components".split()),
    # [debug] (Debug)
    "debug": frozenset("seed deterministic deterministic_warn_only moe_force_load_balance".split()),
}
