"""A Megatron command's options as read_megatron reads them: {option: values}, each read marked so that an option
the reader does not use is named (IGNORED: the options that change nothing a plan holds)."""

from __future__ import annotations

from exatrain.engine_configs.read_common import positive
from exatrain.errors import UserError

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


def _stage(text: str, what: str, source: str) -> int:
    if text not in ("0", "1", "2", "3"):
        raise UserError(f"{source}: {what} must be 0, 1, 2 or 3, got {text!r}")
    return int(text)


__all__ = ["IGNORED", "parse_flags"]
