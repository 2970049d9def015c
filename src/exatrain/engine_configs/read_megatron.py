"""A Megatron-LM or Megatron-DeepSpeed launch read back: the script's ``pretrain_gpt.py`` command (after
``torchrun`` / ``python -m torch.distributed.run`` / ``deepspeed`` / ``srun``, its words expanded as bash would
expand the variables and arrays the script assigns), or the ``MEGATRON_ARGS`` / ``MEGATRON_DEEPSPEED_ARGS``
array of an ``export-config`` file; the DeepSpeed JSON its ``--deepspeed_config`` names (written by the script's
own here-document, or a file beside it). Option names and defaults are those of the versions the exporters target
(engine_configs/megatron.py: Megatron-LM d98e8a64 megatron/training/arguments.py, Megatron-DeepSpeed 4efb479d
megatron/arguments.py, DeepSpeed edaa7221 deepspeed/runtime/constants.py).

The world size comes from the launcher (torchrun --nproc_per_node x --nnodes, deepspeed --num_gpus x --num_nodes,
srun -n or --ntasks-per-node x --nodes, the #SBATCH lines), else from an export's "# Launch N ranks" line, else
from the DeepSpeed JSON's batch (train_batch_size / (micro-batch x accumulation) data-parallel ranks).
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from exatrain.accounting.engines import get_engine
from exatrain.catalog.hf_config import moe_layout, window_layout
from exatrain.engine_configs.megatron import MEGATRON_FP8_RECIPES
from exatrain.engine_configs.read_common import AttentionShape, LaunchRead, number, positive
from exatrain.engine_configs.shell import Script, run_script
from exatrain.errors import UserError
from exatrain.plan import balanced_split
from exatrain.settings import cp_comm_for

PRETRAIN = re.compile(r"(^|/)pretrain_gpt\w*\.py$")
EXPORT_ARRAYS = ("MEGATRON_ARGS", "MEGATRON_DEEPSPEED_ARGS")  # what export-config writes the flags into
_LAUNCH_LINE = re.compile(r"^# Launch (\d+) ranks", re.M)  # an export's statement of its world size
_DS_CONFIG = ("--deepspeed_config", "--deepspeed-config", "--deepscale_config")

# Options that change nothing a plan holds (data, optimizer hyperparameters, logging, checkpoints, tokenizer
# files, initialisation), by prefix: read without a word. Any other option the reader does not use is named.
IGNORED = (
    "--lr",
    "--min-lr",
    "--weight-decay",
    "--start-weight-decay",
    "--end-weight-decay",
    "--clip-grad",
    "--adam-",
    "--sgd-",
    "--optimizer",
    "--init-method",
    "--data-",
    "--split",
    "--train-iters",
    "--train-samples",
    "--eval-",
    "--save",
    "--load",
    "--no-load-",
    "--no-save-",
    "--log",
    "--tensorboard",
    "--wandb",
    "--timing-log",
    "--seed",
    "--distributed-backend",
    "--distributed-timeout",
    "--exit-",
    "--tokenizer-",
    "--vocab-file",
    "--merge-file",
    "--mock-data",
    "--ckpt-",
    "--dist-ckpt",
    "--use-dist-ckpt",
    "--async-save",
    "--auto-detect-ckpt-format",
    "--use-checkpoint-args",
    "--use-mcore-models",
    "--transformer-impl",
    "--num-workers",
    "--dataloader-type",
    "--reset-",
    "--eod-mask-loss",
    "--no-create-attention-mask-in-dataloader",
    "--num-dataset-builder-threads",
    "--attention-softmax-in-fp32",
    "--override-opt_param-scheduler",
    "--use-cpu-initialization",
    "--loss-scale",
    "--initial-loss-scale",
    "--min-loss-scale",
    "--hysteresis",
    "--finetune",
    "--moe-aux-loss-coeff",
    "--moe-z-loss-coeff",
    "--moe-router-load-balancing-type",
    "--moe-router-dtype",
    "--moe-router-topk-scaling-factor",
    "--moe-router-pre-softmax",
    "--moe-token-drop-policy",
    "--moe-input-jitter-eps",
    "--moe-router-bias-update-rate",
    "--moe-per-layer-logging",
    "--moe-permute-fusion",
    "--moe-grouped-gemm",
    "--rotary-percent",
    "--rotary-interleaved",
    "--rotary-scaling-factor",
    "--use-rope-scaling",
    "--rotary-seq-len-interpolation-factor",
    "--fp8-amax-history-len",
    "--fp8-amax-compute-algo",
    "--fp8-margin",
    "--fp8-interval",
    "--apply-layernorm-1p",
    "--deepspeed",
    "--ddp-bucket-size",
    "--manual-gc",
    "--check-for-nan",
    "--calculate-per-token-loss",
    "--profile",
    "--use-pytorch-profiler",
    "--deterministic-mode",
    "--tp-comm-overlap-cfg",
    "--delay-wgrad-compute",
    "--expert-tensor-parallel-size",
    "--moe-pad-expert-input-to-capacity",
    "--no-pipeline-parallel",
    "--checkpoint-num-layers",
    "--deepspeed-activation-checkpointing",
    "--data-parallel-sharding-strategy",
    "--use-flash-attn",
    "--window-attn-skip-freq",
    "--num-query-groups",
)


class _Flags:
    """The command's options ({name: values}); every read marks the name used, so the rest can be named."""

    def __init__(self, flags: dict[str, list[str]], source: str) -> None:
        self.flags, self.source, self.used = flags, source, set()

    def has(self, *names: str) -> bool:
        self.used.update(names)
        return any(n in self.flags for n in names)

    def value(self, *names: str) -> str | None:
        self.used.update(names)
        for n in names:
            if n in self.flags:
                values = self.flags[n]
                if not values:
                    raise UserError(f"{self.source}: {n} needs a value")
                return values[0]
        return None

    def values(self, name: str) -> list[str] | None:
        self.used.add(name)
        return self.flags.get(name)

    def int(self, *names: str, default: int | None = None) -> int | None:
        v = self.value(*names)
        return default if v is None else positive(v, names[0], self.source)

    def unknown(self) -> list[str]:
        return [n for n in self.flags if n not in self.used and not n.startswith(IGNORED)]


def parse_flags(words: list[str]) -> dict[str, list[str]]:
    """argv words as {option: its values} (an option takes the words up to the next --option; --opt=v is one);
    a repeated option keeps its last values, as argparse does."""
    flags: dict[str, list[str]] = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("--"):
            continue
        name, eq, value = word.partition("=")
        values = [value] if eq else []
        while not eq and i < len(words) and not words[i].startswith("--"):
            values.append(words[i])
            i += 1
        flags[name] = values
    return flags


def _command(script: Script, source: str) -> tuple[list[str], list[str]]:
    """(the launcher's words before pretrain_gpt.py, pretrain_gpt.py's own words)."""
    for cmd in script.commands:
        for i, word in enumerate(cmd):
            if PRETRAIN.search(word):
                return cmd[:i], cmd[i + 1 :]
    for name in EXPORT_ARRAYS:
        if name in script.variables:
            return [], list(script.variables[name])
    raise UserError(
        f"{source}: no pretrain_gpt.py command: a Megatron-LM or Megatron-DeepSpeed launch runs "
        "pretrain_gpt.py (or give a torchtitan TOML)"
    )


def side_file_names(text: str, *, source: str) -> tuple[str, ...]:
    script = run_script(text)
    _, words = _command(script, source)
    flags = parse_flags(words)
    name = next((flags[n][0] for n in _DS_CONFIG if flags.get(n)), None)
    return (name,) if name and name not in script.heredocs else ()


def _option(words: list[str], *names: str) -> str | None:
    """The value of the first of ``names`` among a launcher's words (--x v, --x=v, -n v, -n8)."""
    for i, w in enumerate(words):
        for n in names:
            if w == n and i + 1 < len(words):
                return words[i + 1]
            if w.startswith(n + "=") and n.startswith("--"):
                return w[len(n) + 1 :]
            if len(n) == 2 and w.startswith(n) and len(w) > 2 and w[2:].isdigit():
                return w[2:]
    return None


def _count(value: str | None) -> int | None:
    """A launcher count, or None where the script leaves it to run time ($SLURM_NNODES, $(nproc), gpu, 1:4)."""
    if value is None:
        return None
    value = value.split("(")[0]  # SBATCH --ntasks-per-node=8(x2) style
    return int(value) if value.isdigit() and int(value) > 0 else None


def _world_size(launcher: list[str], script: Script, text: str) -> tuple[int | None, str]:
    """(ranks, where the number comes from), or (None, why not)."""
    sb = script.sbatch
    sb_nodes = _count(_option(sb, "--nodes", "-N"))
    sb_per_node = _count(_option(sb, "--ntasks-per-node")) or _count(_option(sb, "--gpus-per-node"))
    names = [w.rsplit("/", 1)[-1] for w in launcher]
    if "torchrun" in names or "torch.distributed.run" in launcher or "torch.distributed.launch" in launcher:
        per_node = _count(_option(launcher, "--nproc_per_node", "--nproc-per-node"))
        nodes_text = _option(launcher, "--nnodes")
        nodes = _count(nodes_text) if nodes_text is not None else 1
        nodes = nodes or sb_nodes
        if per_node and nodes:
            return per_node * nodes, "torchrun"
        return None, "torchrun's --nproc_per_node / --nnodes are set at run time"
    if "deepspeed" in names:
        per_node = _count(_option(launcher, "--num_gpus", "--num-gpus"))
        nodes = _count(_option(launcher, "--num_nodes", "--num-nodes")) or (1 if per_node else None)
        if per_node and nodes:
            return per_node * nodes, "deepspeed"
        return None, "the deepspeed launcher's --num_gpus / --num_nodes are not given"
    if "srun" in names:
        tasks = _count(_option(launcher, "--ntasks", "-n"))
        per_node = _count(_option(launcher, "--ntasks-per-node")) or sb_per_node
        nodes = _count(_option(launcher, "--nodes", "-N")) or sb_nodes
        if tasks:
            return tasks, "srun"
        if per_node and nodes:
            return per_node * nodes, "srun"
    tasks = _count(_option(sb, "--ntasks", "-n"))
    if tasks:
        return tasks, "#SBATCH"
    if sb_per_node and sb_nodes and launcher:
        return sb_per_node * sb_nodes, "#SBATCH"
    m = _LAUNCH_LINE.search(text)
    if m:
        return int(m.group(1)), "the export's launch line"
    return None, "no launcher line states it"


def read_megatron(text: str, *, source: str, side_files: Mapping[str, str]) -> LaunchRead:
    """The launch ``text`` (the module doc) as a LaunchRead."""
    script = run_script(text)
    launcher, words = _command(script, source)
    f = _Flags(parse_flags(words), source)
    names = [w.rsplit("/", 1)[-1] for w in launcher]
    ds_path = f.value(*_DS_CONFIG)
    deepspeed = (
        f.has("--deepspeed")
        or ds_path is not None
        or "deepspeed" in names
        or "MEGATRON_DEEPSPEED_ARGS" in script.variables
    )
    runtime = "megatron-deepspeed" if deepspeed else "megatron-core"
    engine = "Megatron-DeepSpeed" if deepspeed else "Megatron-LM"
    ds = _deepspeed_json(ds_path, script, side_files, source) if deepspeed and ds_path else {}
    defaults: list[str] = []
    notes: list[str] = []
    s: dict[str, Any] = {}

    tp = f.int("--tensor-model-parallel-size", default=1)
    pp = f.int("--pipeline-model-parallel-size", default=1)
    cp = f.int("--context-parallel-size", default=1)
    ep = f.int("--expert-model-parallel-size", default=1)
    s.update(tp=tp, pp=pp)
    if cp > 1:
        s["cp"] = cp
    model, missing = _model(f, tp, deepspeed, source, defaults, notes)
    if model.get("experts"):
        s["ep"] = ep
        _moe_settings(f, s, source, defaults, notes)
    s["sequence_parallel"] = f.has("--sequence-parallel")
    _pipeline(f, s, model, pp, source, notes)
    _batch(f, s, ds, defaults, source)
    _memory(f, s, ds, deepspeed, source, defaults, notes)
    _precision(f, s, ds, runtime, source, defaults, notes)
    if cp > 1:
        comm = f.value("--cp-comm-type")
        if comm is not None:
            mapped = {"p2p": "p2p", "a2a": "a2a", "allgather": "all_gather"}.get(comm)
            if mapped is None:
                raise UserError(f"{source}: --cp-comm-type {comm} is not modelled (p2p, a2a or allgather)")
            if mapped != cp_comm_for(runtime, "", AttentionShape(model)):
                s["cp_comm"] = mapped
        else:
            defaults.append(f"--cp-comm-type ({cp_comm_for(runtime, '', AttentionShape(model))})")
    overlap = _overlap(f, ds, runtime, defaults)

    gpus, where = _world_size(launcher, script, text)
    if ds:
        _check_deepspeed_batch(ds, s, tp * pp * cp, gpus, source)
        if gpus is None and ds.get("train_batch_size"):
            gpus = ds["train_batch_size"] // (s["micro_batch"] * _accum(ds, s)) * tp * pp * cp
            where = "the DeepSpeed JSON's batch"
    unknown = f.unknown()
    return LaunchRead(
        source=engine,
        runtime=runtime,
        model_fields=model,
        model_missing=missing,
        settings=s,
        gpus=gpus,
        world=where,
        overlap=overlap,
        defaults=tuple(defaults),
        unknown=tuple(unknown) + _ds_unknown(ds),
        notes=tuple(notes),
    )


def _stage(text: str, what: str, source: str) -> int:
    if text not in ("0", "1", "2", "3"):
        raise UserError(f"{source}: {what} must be 0, 1, 2 or 3, got {text!r}")
    return int(text)


# ---- the model ------------------------------------------------------------------------------------------------
def _model(
    f: _Flags, tp: int, deepspeed: bool, source: str, defaults: list[str], notes: list[str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """ModelSpec fields from the network-size options (Megatron-LM's defaults where one is left out)."""
    m: dict[str, Any] = {}
    missing: dict[str, str] = {}
    for field, flag in (
        ("layers", "--num-layers"),
        ("hidden", "--hidden-size"),
        ("heads", "--num-attention-heads"),
        ("seq_len", "--seq-length"),
    ):
        value = f.int(flag)
        if value is None:
            missing[field] = f"no {flag}"
        else:
            m[field] = value
    swiglu = f.has("--swiglu")
    m["arch"] = "llama" if swiglu else "gpt"
    hidden = m.get("hidden", 0)
    ffn = f.int("--ffn-hidden-size")
    if ffn is None and hidden:
        # megatron/training/arguments.py: 4h, or with --swiglu int(4h * 2/3 / 64) * 64
        ffn = int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden
        defaults.append(f"--ffn-hidden-size ({ffn})")
    if ffn:
        m["ffn_hidden"] = ffn
    rope = f.value("--position-embedding-type") == "rope" or f.has("--use-rotary-position-embeddings")
    no_positions = f.has("--no-position-embedding") or f.value("--position-embedding-type") == "none"
    if swiglu and not (rope or no_positions):
        notes.append(
            "learned positions with a SwiGLU MLP are not modelled: planned with rotary positions (no position table)"
        )
    if not swiglu and (rope or no_positions):
        notes.append(
            "rotary positions with a GELU MLP are not modelled: planned with the gpt family's learned "
            "position table (seq_len x hidden parameters more)"
        )
    norm = (f.value("--normalization") or "LayerNorm").lower()
    if (norm == "rmsnorm") != swiglu:
        notes.append(
            f"{norm} with a {'SwiGLU' if swiglu else 'GELU'} MLP is not modelled: planned with the "
            f"{'llama' if swiglu else 'gpt'} family's norm"
        )
    disable, add = f.has("--disable-bias-linear"), f.has("--add-bias-linear")
    bias = add or not disable
    if swiglu and bias:
        m["linear_bias"] = True
        if not add:
            defaults.append("biases on the linear layers (no --disable-bias-linear)")
    if not swiglu and not bias:
        notes.append("a GELU model without biases is not modelled: planned with the gpt family's biases")
    if f.has("--add-qkv-bias") and not bias:
        notes.append("q, k and v biases alone (--add-qkv-bias) are not modelled: planned without them")
    heads = m.get("heads", 0)
    if f.has("--group-query-attention"):
        m["kv_heads"] = f.int("--num-query-groups", default=1)
    elif f.int("--num-key-value-heads") is not None:  # Megatron-DeepSpeed
        m["kv_heads"] = f.int("--num-key-value-heads")
    kv_channels = f.int("--kv-channels")
    if kv_channels and heads and (kv_channels != hidden // heads or hidden % heads):
        m["kv_channels"] = kv_channels
    if f.has("--qk-layernorm") and not f.has("--multi-latent-attention"):  # under MLA: the latents' norms (below)
        m["qk_norm"] = True
    m["tied_embeddings"] = not f.has("--untie-embeddings-and-output-weights")
    if m["tied_embeddings"]:
        defaults.append("embeddings tied to the output layer (no --untie-embeddings-and-output-weights)")
    eps = f.value("--layernorm-epsilon" if deepspeed else "--norm-epsilon")
    m["norm_eps"] = number(eps, "--norm-epsilon", source) if eps is not None else 1e-5
    theta = f.value("--rotary-position-embeddings-theta" if deepspeed else "--rotary-base")
    m["rope_theta"] = number(theta, "--rotary-base", source) if theta is not None else 10000.0
    hd, ad = f.value("--hidden-dropout"), f.value("--attention-dropout")
    if hd is None and ad is None:
        defaults.append("dropout (0.1)")
    hd_v = number(hd, "--hidden-dropout", source) if hd is not None else 0.1
    ad_v = number(ad, "--attention-dropout", source) if ad is not None else 0.1
    if hd_v != ad_v:
        notes.append(f"attention dropout {ad_v:g} and hidden dropout {hd_v:g} differ: planned with {hd_v:g} for both")
    m["dropout"] = hd_v
    vocab = _vocab(f, tp, defaults)
    if vocab is None:
        missing["vocab"] = "the tokenizer's size, which the script does not state: pass --vocab"
    else:
        m["vocab"] = vocab
    _model_moe(f, m, source, defaults, notes)
    _model_attention(f, m, source, notes)
    positions = f.int("--max-position-embeddings")
    if not swiglu and not (rope or no_positions) and positions and positions != m.get("seq_len"):
        notes.append(
            f"--max-position-embeddings {positions} rows of learned positions are planned as seq_len "
            f"{m.get('seq_len')} rows"
        )
    mtp = f.int("--mtp-num-layers")
    if mtp:
        notes.append(f"the {mtp} multi-token-prediction layer(s) (--mtp-num-layers) are not modelled")
    return m, missing


# megatron/training/tokenizer: the tokenizers whose size the script's flags fix
_TOKENIZER_SIZES = {"GPT2BPETokenizer": 50257}


def _vocab(f: _Flags, tp: int, defaults: list[str]) -> int | None:
    """The embedding rows Megatron allocates: the tokenizer's size padded to a multiple of
    --make-vocab-size-divisible-by (default 128) x tp (build_tokenizer.py vocab_size_with_padding). Without a size
    the script fixes, one padding unit (an export sets the unit to the plan's vocabulary: every tokenizer up to that
    size pads to it)."""
    divisor = f.int("--make-vocab-size-divisible-by")
    unit = (divisor or 128) * tp
    size = f.int("--vocab-size")
    kind = f.value("--tokenizer-type")
    if size is None and kind in _TOKENIZER_SIZES:
        size = _TOKENIZER_SIZES[kind]
    if size is not None:
        return -(-size // unit) * unit
    if divisor is None:
        return None
    defaults.append(
        f"the vocabulary ({unit} rows: one padding unit, --make-vocab-size-divisible-by x tp, which "
        "every tokenizer up to that size pads to)"
    )
    return unit


def _model_moe(f: _Flags, m: dict[str, Any], source: str, defaults: list[str], notes: list[str]) -> None:
    experts = f.int("--num-experts")
    if not experts:
        return
    m["experts"] = experts
    top_k = f.int("--moe-router-topk")
    if top_k is None:
        defaults.append("--moe-router-topk (2)")
    m["top_k"] = top_k or 2
    width = f.int("--moe-ffn-hidden-size")
    if width and width != m.get("ffn_hidden"):
        m["expert_ffn_hidden"] = width
    expert = width or m.get("ffn_hidden", 0)
    shared = f.int("--moe-shared-expert-intermediate-size")
    if shared:
        if expert and shared % expert:
            raise UserError(
                f"{source}: --moe-shared-expert-intermediate-size {shared} is not a whole number of "
                f"experts of width {expert}; not modelled"
            )
        m["shared_experts"] = shared // expert
    freq = f.value("--moe-layer-freq")
    layers = m.get("layers", 0)
    if freq is not None and layers:
        pattern = _layer_freq(freq, layers, source)
        layout = moe_layout(pattern)
        if layout is None:
            raise UserError(
                f"{source}: --moe-layer-freq {freq}: MoE layers {[i for i, x in enumerate(pattern) if x]} "
                "are not a leading run of dense layers then every n-th layer MoE; not modelled"
            )
        m["dense_layers"], m["moe_every"] = layout
    score = f.value("--moe-router-score-function")
    if score not in (None, "softmax", "sigmoid"):
        raise UserError(f"{source}: --moe-router-score-function {score} is not modelled (softmax or sigmoid)")
    if score == "sigmoid":
        m["router"] = "sigmoid"
    if f.has("--moe-router-enable-expert-bias"):
        m["router_bias"] = True
    etp = f.int("--expert-tensor-parallel-size")
    if etp not in (None, 1):
        notes.append(
            f"--expert-tensor-parallel-size {etp} is not modelled: experts priced whole on each rank "
            "(expert-tensor-parallel size 1)"
        )


def _layer_freq(text: str, layers: int, source: str) -> list[bool]:
    """--moe-layer-freq: an integer N (layer i is MoE when i % N == 0) or a Python list expression of 0/1 per layer
    such as ([0]*3+[1]*58) (megatron/core/transformer/transformer_config.py moe_layer_freq)."""
    text = text.strip()
    if text.isdigit() and int(text) > 0:
        return [i % int(text) == 0 for i in range(layers)]
    body = text.strip("()").replace(" ", "")
    pattern: list[bool] = []
    for part in body.split("+"):
        m = re.fullmatch(r"\[([01](?:,[01])*)\](?:\*(\d+))?", part)
        if not m:
            raise UserError(f"{source}: --moe-layer-freq {text!r} is not an integer or a list like ([0]*3+[1]*58)")
        pattern += [x == "1" for x in m.group(1).split(",")] * int(m.group(2) or 1)
    if len(pattern) != layers:
        raise UserError(f"{source}: --moe-layer-freq {text!r} gives {len(pattern)} layers, not {layers}")
    return pattern


def _model_attention(f: _Flags, m: dict[str, Any], source: str, notes: list[str]) -> None:
    """Latent attention, sliding windows and sinks."""
    if f.has("--multi-latent-attention"):
        qk, v = f.int("--qk-head-dim", default=128), f.int("--v-head-dim", default=128)
        if qk != v:
            raise UserError(f"{source}: --qk-head-dim {qk} != --v-head-dim {v} is not modelled (one head_dim)")
        q_lora = f.value("--q-lora-rank")
        m.update(
            kv_channels=qk,
            kv_lora_rank=f.int("--kv-lora-rank", default=32),
            q_lora_rank=positive(q_lora, "--q-lora-rank", source) if q_lora not in (None, "None") else 0,
            rope_head_dim=f.int("--qk-pos-emb-head-dim", default=64),
        )
        if not f.has("--qk-layernorm"):  # gpt_layer_specs.py: the latents' RMSNorms are built with it only
            notes.append(
                "latent attention without --qk-layernorm builds no RMSNorm on the query and key/value "
                "latents: planned with them (DeepSeek-V2/V3 have them)"
            )
    window = f.value("--window-size")
    if window is not None:
        sizes = [w for w in re.split(r"[(),\s]+", window) if w]
        left = positive(sizes[0], "--window-size", source) if sizes and sizes[0] not in ("-1", "None") else 0
        if left:
            m["sliding_window"] = left + 1  # (left, 0): a query sees itself and the left keys before it
            skip = f.int("--window-attn-skip-freq")
            if skip and m.get("layers"):
                windowed = [(i + 1) % skip != 0 for i in range(m["layers"])]
                every = window_layout(windowed)
                if every:
                    m["full_attention_every"] = every
    softmax = f.value("--softmax-type")
    if softmax == "learnable":
        m["attention_sinks"] = True
    elif softmax not in (None, "vanilla"):
        notes.append(f"--softmax-type {softmax} is not modelled: planned with the usual softmax")


# ---- layout, batch, memory, precision --------------------------------------------------------------------------
def _pipeline(f: _Flags, s: dict[str, Any], model: Mapping[str, Any], pp: int, source: str, notes: list[str]) -> None:
    """Virtual stages and an uneven split: --num-virtual-stages-per-pipeline-rank, --num-layers-per-virtual-
    pipeline-stage, --pipeline-model-parallel-layout, --decoder-first/last-pipeline-num-layers."""
    layers = model.get("layers", 0)
    stages: list[int] | None = None
    layout = f.value("--pipeline-model-parallel-layout")
    virtual = f.int("--num-virtual-stages-per-pipeline-rank")
    per_virtual = f.int("--num-layers-per-virtual-pipeline-stage")
    first, last = f.int("--decoder-first-pipeline-num-layers"), f.int("--decoder-last-pipeline-num-layers")
    if layout is not None:
        stages = _parse_layout(layout, source)
        if len(stages) % pp:
            raise UserError(
                f"{source}: --pipeline-model-parallel-layout has {len(stages)} stages, not a multiple of pp {pp}"
            )
        virtual = len(stages) // pp
    elif per_virtual and layers:
        if layers % (pp * per_virtual):
            raise UserError(
                f"{source}: {layers} layers do not split into pp {pp} x stages of "
                f"--num-layers-per-virtual-pipeline-stage {per_virtual}"
            )
        virtual = layers // (pp * per_virtual)
    elif (first or last) and layers and pp > 1:
        rest = layers - (first or 0) - (last or 0)
        middle = pp - (first is not None) - (last is not None)
        if middle < 0 or rest < 0 or (middle and rest % middle) or (not middle and rest):
            raise UserError(
                f"{source}: --decoder-first/last-pipeline-num-layers leave {rest} layers for {middle} stages"
            )
        each = rest // middle if middle else 0
        stages = ([first] if first is not None else []) + [each] * middle + ([last] if last is not None else [])
    virtual = virtual or 1
    if pp > 1:
        s["schedule"] = "interleaved" if virtual > 1 else "1f1b"
        s["interleave"] = virtual
    if stages is not None:
        if layers and sum(stages) != layers:
            raise UserError(f"{source}: the pipeline layout holds {sum(stages)} layers, the model {layers}")
        if not (layers and tuple(stages) == balanced_split(layers, len(stages))):
            s["stage_layers"] = tuple(stages)


def _parse_layout(text: str, source: str) -> list[int]:
    """Megatron-LM's --pipeline-model-parallel-layout: stages split by '|', 't' a layer, 't*n' n of them, 'E' the
    embedding, 'L' the loss (pipeline_parallel_layer_layout.py); other modules (MTP 'm') are not modelled."""
    stages = []
    for stage in text.replace('"', "").split("|"):
        count = 0
        for token in re.findall(r"[A-Za-z](?:\*\d+)?", stage.replace(",", "")):
            kind, _, times = token.partition("*")
            if kind == "t":
                count += int(times or 1)
            elif kind not in "EL":
                raise UserError(f"{source}: --pipeline-model-parallel-layout module {kind!r} is not modelled (t, E, L)")
        stages.append(count)
    return stages


def _batch(f: _Flags, s: dict[str, Any], ds: Mapping[str, Any], defaults: list[str], source: str) -> None:
    micro = f.int("--micro-batch-size")
    ds_micro = ds.get("train_micro_batch_size_per_gpu")
    if micro is not None and ds_micro is not None and micro != ds_micro:
        raise UserError(
            f"{source}: --micro-batch-size {micro} but the DeepSpeed JSON's "
            f"train_micro_batch_size_per_gpu is {ds_micro}"
        )
    micro = micro or (positive(ds_micro, "train_micro_batch_size_per_gpu", source) if ds_micro is not None else None)
    if micro is None:
        defaults.append("--micro-batch-size (1)")
    s["micro_batch"] = micro or 1
    glob = f.int("--global-batch-size")
    ds_glob = ds.get("train_batch_size")
    if glob is not None and ds_glob is not None and glob != ds_glob:
        raise UserError(f"{source}: --global-batch-size {glob} but the DeepSpeed JSON's train_batch_size is {ds_glob}")
    glob = glob or (positive(ds_glob, "train_batch_size", source) if ds_glob is not None else None)
    if glob is None:
        defaults.append("--global-batch-size (micro-batch x data-parallel size)")
    else:
        s["global_batch"] = glob


def _memory(
    f: _Flags,
    s: dict[str, Any],
    ds: Mapping[str, Any],
    deepspeed: bool,
    source: str,
    defaults: list[str],
    notes: list[str],
) -> None:
    """Recomputation and optimizer-state sharding."""
    granularity = f.value("--recompute-granularity")
    method, count = f.value("--recompute-method"), f.int("--recompute-num-layers")
    if f.has("--checkpoint-activations") and granularity is None:
        granularity = "full"  # Megatron-DeepSpeed (and Megatron-LM's legacy spelling): every layer
        every = f.int("--checkpoint-num-layers", default=1)
        if every > 1:
            notes.append(f"--checkpoint-num-layers {every} (chunks of layers) is priced as every layer recomputed")
    if f.has("--recompute-activations") and granularity is None:
        granularity = "selective"
    if granularity == "full":
        s["recompute"] = "full"
        if method == "block" and count:
            s["recompute_layers"] = count
        elif method == "uniform" and count and count > 1:
            notes.append(
                f"--recompute-method uniform --recompute-num-layers {count} (chunks of {count} layers) is "
                "priced as every layer recomputed"
            )
    elif granularity == "selective":
        s["recompute"] = "selective"
        modules = f.values("--recompute-modules")
        if modules:
            s["recompute_modules"] = tuple(modules)
    elif granularity is not None:
        raise UserError(f"{source}: --recompute-granularity {granularity} is not full or selective")
    else:
        defaults.append("recomputation (none)")
    zero = None
    if f.has("--use-distributed-optimizer"):
        zero = 1
    if f.has("--use-megatron-fsdp"):
        strategy = f.value("--data-parallel-sharding-strategy") or "no_shard"
        zero = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(strategy)
        if zero is None:
            raise UserError(f"{source}: --data-parallel-sharding-strategy {strategy} is not modelled")
    if f.has("--use-torch-fsdp2"):
        zero = 3
        notes.append("--use-torch-fsdp2 is priced as ZeRO-3 (Megatron-FSDP's optim_grads_params)")
    stage_text = f.value("--zero-stage")
    flag_stage = None if stage_text is None else _stage(stage_text, "--zero-stage", source)
    ds_stage = ds.get("zero_optimization", {}).get("stage") if isinstance(ds.get("zero_optimization"), dict) else None
    if deepspeed:
        if flag_stage is not None and ds_stage is not None and flag_stage != ds_stage:
            raise UserError(
                f"{source}: --zero-stage {flag_stage} but the DeepSpeed JSON's zero_optimization.stage is {ds_stage}"
            )
        zero = ds_stage if ds_stage is not None else flag_stage
    if zero is None:
        defaults.append(
            "ZeRO (0: " + ("no zero_optimization.stage" if deepspeed else "no --use-distributed-optimizer") + ")"
        )
    s["zero"] = zero or 0


def _precision(
    f: _Flags,
    s: dict[str, Any],
    ds: Mapping[str, Any],
    runtime: str,
    source: str,
    defaults: list[str],
    notes: list[str],
) -> None:
    engine = get_engine(runtime)
    bf16, fp16 = f.has("--bf16"), f.has("--fp16")
    ds_bf16 = (ds.get("bf16") or {}).get("enabled") if isinstance(ds.get("bf16"), dict) else None
    ds_fp16 = (ds.get("fp16") or {}).get("enabled") if isinstance(ds.get("fp16"), dict) else None
    if ds_bf16 is not None and ds_bf16 != bf16 and (bf16 or ds_bf16):
        raise UserError(
            f"{source}: {'--bf16' if bf16 else 'no --bf16'} but the DeepSpeed JSON's bf16.enabled is "
            f"{str(ds_bf16).lower()}"
        )
    if (bf16 or ds_bf16) and (fp16 or ds_fp16):
        raise UserError(f"{source}: both bf16 and fp16 are set; Megatron trains in one of them")
    if not (bf16 or fp16 or ds_bf16 or ds_fp16):
        defaults.append("precision (float32: no --bf16)")
    s["dtype"] = "float16" if (fp16 or ds_fp16) else "bfloat16" if (bf16 or ds_bf16) else "float32"
    if runtime == "megatron-core":
        backend = f.value("--attention-backend")
        if backend is None:
            defaults.append("--attention-backend (auto: Transformer Engine's fused)")
            kernel = "fa2" if f.has("--use-flash-attn") else ""
            s["flash_attention"] = True
        elif backend in ("unfused", "local"):
            s["flash_attention"], kernel = False, ""
        elif backend in ("flash", "fused", "auto"):
            s["flash_attention"], kernel = True, {"flash": "fa2", "fused": "fused", "auto": ""}[backend]
        else:
            raise UserError(f"{source}: --attention-backend {backend} is not flash, fused, unfused, local or auto")
    else:
        flash = [
            n
            for n in (
                "--use-flash-attn-v2",
                "--use-flash-attn",
                "--use-flash-attn-v1",
                "--use-flash-attn-triton",
                "--use-flash-attn-builder",
            )
            if f.has(n)
        ]
        s["flash_attention"] = bool(flash)
        kernel = "fa2" if flash else ""
        if not flash:
            defaults.append("attention (no flash attention: no --use-flash-attn-v2)")
        elif flash[0] != "--use-flash-attn-v2":
            notes.append(f"{flash[0]} is priced as FlashAttention-2")
    if kernel and kernel != engine.activations.flash_kernel:
        s["attention_kernel"] = kernel
    fmt, recipe = f.value("--fp8-format"), f.value("--fp8-recipe")
    if fmt is not None or recipe is not None:
        recipe = recipe or "delayed"  # Megatron-LM's default --fp8-recipe
        inverse = {v: k for k, v in MEGATRON_FP8_RECIPES.items()}
        if recipe not in inverse:
            raise UserError(f"{source}: --fp8-recipe {recipe} is not modelled ({', '.join(inverse)})")
        s["fp8"] = inverse[recipe]
    if f.has("--fp8-param-gather"):
        s["fp8_param_gather"] = True
    accum = (
        "bfloat16"
        if f.has("--grad-reduce-in-bf16")
        else "float32"
        if f.has("--accumulate-allreduce-grads-in-fp32")
        else None
    )
    ds_accum = (ds.get("data_types") or {}).get("grad_accum_dtype") if isinstance(ds.get("data_types"), dict) else None
    if ds_accum is not None:
        accum = {"fp32": "float32", "bf16": "bfloat16", "fp16": "bfloat16"}.get(str(ds_accum), accum)
    if accum is not None and s["dtype"] == "bfloat16" and accum != engine.accum_dtype("bfloat16"):
        s["grad_accum"] = accum
    if f.has("--no-gradient-accumulation-fusion"):
        s["grad_accum_fusion"] = "off"


def _moe_settings(f: _Flags, s: dict[str, Any], source: str, defaults: list[str], notes: list[str]) -> None:
    dispatcher = f.value("--moe-token-dispatcher-type")
    if dispatcher == "flex":
        backend = f.value("--moe-flex-dispatcher-backend") or "deepep"
        if backend not in ("deepep", "hybridep"):
            raise UserError(f"{source}: --moe-flex-dispatcher-backend {backend} is not modelled (deepep or hybridep)")
        s["moe_dispatcher"] = backend
    elif dispatcher in (None, "allgather"):
        (defaults if dispatcher is None else notes).append(
            "--moe-token-dispatcher-type (allgather, priced as alltoall)"
            if dispatcher is None
            else "--moe-token-dispatcher-type allgather is priced as alltoall"
        )
    elif dispatcher not in ("alltoall", "alltoall_seq"):
        raise UserError(
            f"{source}: --moe-token-dispatcher-type {dispatcher} is not modelled (alltoall, allgather or flex)"
        )
    capacity = f.value("--moe-expert-capacity-factor")
    if capacity is not None and capacity != "None":
        s["moe_capacity_factor"] = number(capacity, "--moe-expert-capacity-factor", source)
        if not f.has("--moe-pad-expert-input-to-capacity"):
            notes.append("a capacity factor without --moe-pad-expert-input-to-capacity is priced padded to capacity")
    if f.has("--moe-router-force-load-balancing"):
        s["moe_force_balance"] = True


def _overlap(f: _Flags, ds: Mapping[str, Any], runtime: str, defaults: list[str]) -> str:
    """The --overlap value of the overlaps the launch switches on (accounting.engines' switches)."""
    engine = get_engine(runtime)
    offered = {o.comm: o for o in engine.overlaps}
    on = {c for c, o in offered.items() if o.default_on}
    if runtime == "megatron-core":
        for comm, flag in (
            ("dp_grad_reduce", "--overlap-grad-reduce"),
            ("dp_param_gather", "--overlap-param-gather"),
            ("tp", "--tp-comm-overlap"),
            ("ep_a2a", "--overlap-moe-expert-parallel-comm"),
        ):
            if f.has(flag):
                on.add(comm)
        if f.has("--no-overlap-p2p-communication"):
            on.discard("pp_p2p")
        f.has("--overlap-p2p-communication")
        what = "--overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap"
    else:
        zero = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
        if zero.get("overlap_comm"):
            on |= {"dp_grad_reduce", "dp_param_gather"}
        what = "zero_optimization.overlap_comm"
    on &= set(offered)
    default_on = {c for c, o in offered.items() if o.default_on}
    if on == default_on:
        defaults.append(f"overlap ({what} off)")
        return "default"
    return ",".join(c for c in offered if c in on) or "none"


# ---- DeepSpeed JSON ----------------------------------------------------------------------------------------------
_DS_KNOWN = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "bf16",
    "fp16",
    "data_types",
}
_DS_IGNORED = {
    "gradient_clipping",
    "steps_per_print",
    "wall_clock_breakdown",
    "optimizer",
    "scheduler",
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comms_logger",
    "zero_allow_untested_optimizer",
    "memory_breakdown",
    "dump_state",
    "prescale_gradients",
    "gradient_predivide_factor",
    "seed",
    "zero_force_ds_cpu_optimizer",
}
_ZERO_KNOWN = {
    "stage",
    "overlap_comm",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "contiguous_gradients",
    "reduce_scatter",
    "allgather_partitions",
    "round_robin_gradients",
    "sub_group_size",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save",
    "ignore_unused_parameters",
    "elastic_checkpoint",
    "load_from_fp32_weights",
}


def _deepspeed_json(path: str, script: Script, side_files: Mapping[str, str], source: str) -> dict[str, Any]:
    text = script.heredocs.get(path)
    if text is None:
        text = side_files.get(path)
    if text is None:
        raise UserError(f"{source}: --deepspeed_config {path} is neither written by the script nor beside it")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{source}: the DeepSpeed JSON {path} is not valid JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{source}: the DeepSpeed JSON {path} is not an object")
    return data


def _ds_unknown(ds: Mapping[str, Any]) -> tuple[str, ...]:
    out = [k for k in ds if k not in _DS_KNOWN | _DS_IGNORED]
    zero = ds.get("zero_optimization")
    if isinstance(zero, dict):
        out += [f"zero_optimization.{k}" for k in zero if k not in _ZERO_KNOWN]
    return tuple(out)


def _accum(ds: Mapping[str, Any], s: Mapping[str, Any]) -> int:
    accum = ds.get("gradient_accumulation_steps")
    return accum if isinstance(accum, int) and accum > 0 else 1


def _check_deepspeed_batch(
    ds: Mapping[str, Any], s: Mapping[str, Any], ranks: int, gpus: int | None, source: str
) -> None:
    """DeepSpeed's own check (runtime/config.py _batch_assertion): train_batch_size = micro x accumulation x dp."""
    batch, accum = ds.get("train_batch_size"), ds.get("gradient_accumulation_steps")
    micro = s["micro_batch"]
    if batch is None or accum is None:
        return
    if not isinstance(batch, int) or not isinstance(accum, int) or batch <= 0 or accum <= 0:
        raise UserError(
            f"{source}: the DeepSpeed JSON's train_batch_size and gradient_accumulation_steps must be positive integers"
        )
    if batch % (micro * accum):
        raise UserError(
            f"{source}: the DeepSpeed JSON's train_batch_size {batch} is not micro-batch {micro} x "
            f"gradient_accumulation_steps {accum} x data-parallel ranks"
        )
    dp = batch // (micro * accum)
    if gpus is not None and gpus != dp * ranks:
        raise UserError(
            f"{source}: the DeepSpeed JSON's batch makes {dp} data-parallel ranks, {dp * ranks} ranks with "
            f"tp*pp {ranks}, but the launch runs {gpus}"
        )


__all__ = ["EXPORT_ARRAYS", "IGNORED", "parse_flags", "read_megatron", "side_file_names"]
