"""The arguments of a training run: `TransformerTrainingArguments`, `Seq2SeqTrainingArguments` with the
paper's values as defaults (§5.3, §5.4), token-count batches, checkpoint averaging and a budget in
minutes, and every check of their ranges, which the class runs itself when it is made.

    args = TransformerTrainingArguments(output_dir="out", max_tokens=4096, max_steps=100_000)

`options` builds the command line's parser from this class and `trainer` reads it; neither is
imported here.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import os
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import Seq2SeqTrainingArguments
from transformers.utils import import_utils as transformers_import_utils

from .averaging import AVERAGING_WEIGHTS
from .levers import FUSED_LOSSES, TRAINING_ATTENTION, check_levers
from .moving_average import check_decay

PAPER_WARMUP_STEPS = 4000
PAD_TO_BUCKETS = ("auto", "always", "never")  # --pad_to_buckets: auto pads to buckets only with --torch_compile
MEMORY_PROBE_CHOICES = ("auto", "on", "off")  # --memory_probe: auto tries the largest batches on CUDA only
EVAL_ORDERS = ("auto", "length", "input")  # --eval_order: auto sorts by length on the CPU only (measured there)


@dataclass
class TransformerTrainingArguments(Seq2SeqTrainingArguments):
    """Seq2SeqTrainingArguments with the paper's values as defaults (§5.3, §5.4) and token-count batches."""

    adam_beta2: float = field(default=0.98, metadata={"help": "Adam beta2 (paper: 0.98)"})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam epsilon (paper: 1e-9)"})
    learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "peak learning rate, reached after the warm-up; default lr_scale * d_model^-0.5 * "
            "warmup_steps^-0.5, the peak of eq. (3)"
        },
    )
    lr_scale: float = field(default=1.0, metadata={"help": "multiplies the paper's learning-rate formula"})
    lr_scheduler_type: str = field(
        default="inverse_sqrt",
        metadata={"help": "inverse_sqrt: eq. (3), linear warm-up then inverse square root, from the first update on"},
    )
    warmup_steps: float = field(default=PAPER_WARMUP_STEPS, metadata={"help": "warm-up steps (paper: 4000)"})
    label_smoothing_factor: float = field(default=0.1, metadata={"help": "label smoothing (paper: 0.1)"})
    max_grad_norm: float = field(
        default=0.0, metadata={"help": "clip the gradient to this norm; 0: no clipping (the paper clips none)"}
    )
    max_tokens: int | None = field(
        default=4096, metadata={"help": "padded tokens per batch and side (fairseq --max-tokens); 0: sentence batches"}
    )
    pad_to_buckets: str = field(
        default="auto",
        metadata={
            "help": "pad token batches to a few bucket shapes, so that a graph compiled per shape is reused; "
            "they then hold fewer real tokens (a Multi30k batch 15 in 100 fewer sentences); "
            "auto: only with --torch_compile",
            "choices": list(PAD_TO_BUCKETS),
        },
    )
    eval_order: str = field(
        default="auto",
        metadata={
            "help": "the order in which evaluation (and trainer.predict()) decodes: length (shortest first, as "
            "translate does; results in the input order) or input; auto: length on the CPU (measured there), "
            "input on a GPU (not measured). --do_predict translates by length always",
            "choices": list(EVAL_ORDERS),
        },
    )
    static_cache_decoding: bool = field(
        default=False,
        metadata={
            "help": "evaluation and prediction decode with a static cache, which generate() compiles on CUDA (a "
            "graph per batch shape, sources padded to a multiple of 16 tokens; as translate --static-cache); the "
            "same translations (not measured)"
        },
    )
    average_checkpoints: int = field(
        default=0,
        metadata={"help": "save the mean of the last N checkpoints as the final model (paper: 5 base, 20 big)"},
    )
    average_weights: str = field(
        default="uniform",
        metadata={
            "help": "with average_checkpoints: uniform, the mean (paper); linear, the k-th of the last N weighs k",
            "choices": list(AVERAGING_WEIGHTS),
        },
    )
    ema_decay: float = field(
        default=0.0,
        metadata={
            "help": "keep an exponential moving average of the weights, updated every update with this decay "
            "(0.998: about the last 500 updates), and save it as the final model instead of the last "
            "weights (checkpoints and evaluations during training keep the trained weights); 0: none "
            "(an alternative to --average_checkpoints)"
        },
    )
    predict_with_generate: bool = field(default=True, metadata={"help": "evaluate BLEU/chrF by decoding"})
    logging_nan_inf_filter: bool = field(
        default=False,
        metadata={
            "help": "log the mean of earlier losses in place of a NaN or infinite one (the Trainer's default); "
            "off: a diverging run shows in its log, and no update waits for the device to check its loss"
        },
    )
    save_minutes: float | None = field(
        default=None,
        metadata={
            "help": "also save a checkpoint every this many minutes (§6.1: every 10 minutes); 0: none (a recipe's)"
        },
    )
    max_train_minutes: float | None = field(
        default=None, metadata={"help": "stop training after this many minutes (or max_steps, whichever comes first)"}
    )
    cooldown_minutes: float | None = field(
        default=None,
        metadata={
            "help": "with max_train_minutes and eq. (3): decay the learning rate linearly to 0 over the last "
            "this many minutes of the budget (the rate then depends on the clock, not the update alone)"
        },
    )
    memory_probe: str = field(
        default="auto",
        metadata={
            "help": "before the first update, try the largest batches in one forward and backward pass, so that "
            "one that runs out of memory fails at once, with a --max_tokens that fits; auto: on CUDA only (its "
            "seconds at the start are not measured on a GPU yet: benchmarks/gpu.py's train.py runs time them)",
            "choices": list(MEMORY_PROBE_CHOICES),
        },
    )
    skip_oom_batches: bool = field(
        default=False,
        metadata={
            "help": "skip a batch that runs out of memory during training (with its update's "
            "gradients so far), count it in the logs and go on; one process only"
        },
    )
    # GPU speed levers (levers.py): each off by default until benchmarks/gpu.py --levers on a GPU decides it;
    # "H100" cites the Multi30k shape's row of docs/benchmarks/gpu.md (2026-11-27), "not measured" has none
    compile_layers: bool = field(
        default=False,
        metadata={
            "help": "torch.compile each encoder and decoder layer "
            "with dynamic shapes (regional compilation; H100, Multi30k shape: 0.99x the plain step's time, "
            "35 s of warm-up, measured before 6d5c8b8 gave compiled layers the eager step's attention kernels; "
            "big not measured)"
        },
    )
    fuse_projections: bool = field(
        default=False,
        metadata={
            "help": "the attention projections of one input as one matrix product (q, k, v; "
            "k, v of the encoder output): fewer, larger kernels (not measured)"
        },
    )
    cuda_graphs: bool = field(
        default=False,
        metadata={
            "help": "CUDA graphs: torch_compile with mode reduce-overhead and "
            "dynamic shapes, a graph recorded per bucket shape (CUDA only; not measured)"
        },
    )
    fused_loss: str = field(
        default="none",
        metadata={
            "help": "the pre-softmax projection and loss a chunk of rows "
            "at a time, without the full logits (chunked on an H100, Multi30k shape: 4.7x less memory, 1.06x "
            "the time; liger not measured)",
            "choices": list(FUSED_LOSSES),
        },
    )
    sync_free_step: bool = field(
        default=False,
        metadata={
            "help": "a training step that reads nothing back from the GPU: every batch keeps its attention masks, "
            "the loss's gradient is always scaled, batches are copied to the GPU without waiting (3 host reads "
            "and a wait an update fewer; not measured)"
        },
    )
    fp8: bool = field(
        default=False,
        metadata={"help": "float8 matrix multiplies in the layers, torchao (compute capability 8.9+; not measured)"},
    )
    bf16_weights: bool = field(
        default=False,
        metadata={
            "help": "the weights in bfloat16 and no autocast (it replaces --bf16's), float32 copies of them in the "
            "optimizer (fairseq's --bf16): fewer casts; checkpoints and the model saved in bfloat16, the copies "
            "in optimizer.pt (not measured)"
        },
    )
    training_attention: str = field(
        default="default",
        metadata={
            "help": "the attention kernel tried first in training (CUDA only; H100, Multi30k shape: none "
            "faster than the default; big not measured)",
            "choices": list(TRAINING_ATTENTION),
        },
    )
    preemption_grace_seconds: float = field(
        default=25.0,
        metadata={
            "help": "on SIGTERM (a scheduler's preemption), finish the update and save a checkpoint within this "
            "many seconds of the signal, what resumes best first (weights, optimizer, trainer state), "
            "the moving average only if it fits; then exit with status 143 (requeue). Set it below the "
            "scheduler's grace period (SLURM's GraceTime, Kubernetes' terminationGracePeriodSeconds)"
        },
    )

    def __post_init__(self):
        check_intervals(self)  # before the Trainer's own checks, which take an eval_steps of 0 as "not set"
        check_levers(self)
        if self.skip_oom_batches and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # before any data is read
            raise ValueError(SKIP_OOM_ONE_PROCESS)
        if self.skip_oom_batches and self.fp16:
            raise ValueError(
                "--skip_oom_batches with --fp16: an update whose batches were all skipped has no gradients, and "
                "fp16's loss scaler refuses to step it; use --bf16, or leave --skip_oom_batches out."
            )
        follows = matmul_follows_global_precision()  # before transformers sets the global one
        # transformers' enable_tf32 is cached: a second run's --tf32 false after a compiled run's TF32 (a notebook,
        # table3's rows in one process) would be a call it skips
        getattr(getattr(transformers_import_utils, "enable_tf32", None), "cache_clear", lambda: None)()
        super().__post_init__()
        keep_tf32_flags_readable(follows)
        check_argument_ranges(self)
        if self.sync_free_step and self.dataloader_pin_memory and self.device.type == "cuda":
            # a batch's copy to the GPU waits for the GPU too unless it is asynchronous (from pinned memory)
            self.accelerator_config.non_blocking = True

    def __getstate__(self) -> dict:
        """Pickled (the Trainer's training_args.bin, beside every checkpoint and final model, which its pushes
        upload to the Hub) without ``hub_token``: a token given as --hub_token reached the repository in it."""
        state = dict(self.__dict__)
        if state.get("hub_token") is not None:
            state["hub_token"] = None
        return state

    def __copy__(self):  # a copy in memory keeps the token (the Trainer pushes with it); only a pickle drops it
        copied = type(self).__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __deepcopy__(self, memo: dict):
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    @contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work"):
        """transformers' `main_process_first`, whose other processes wait in a barrier of a process group of their
        own (gloo, `PREPARATION_TIMEOUT`) rather than the training group's: the first run's preparation of a corpus
        (reading it, training the tokenizer, tokenising: 12 minutes for WMT14 en-de on 2 cores, 8x the pairs for
        en-fr) can outlast --ddp_timeout (30 minutes by default), after which every waiting process failed. On one
        machine only: across machines gloo needs their network interfaces named (GLOO_SOCKET_IFNAME), where a
        hostname that resolves to loopback would hang the group's creation, so there --ddp_timeout bounds the wait."""
        import torch.distributed as dist

        # torchrun and accelerate say how many processes run here; a launcher that does not: perhaps several machines
        one_machine = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) >= self.world_size
        if self.world_size <= 1 or not dist.is_available() or not dist.is_initialized() or not one_machine:
            with super().main_process_first(local=local, desc=desc):
                yield
            return
        group = preparation_group()
        first = (self.local_process_index if local else self.process_index) == 0
        if not first:
            dist.barrier(group=group)
        try:
            yield
        finally:
            if first:  # the wait is over
                dist.barrier(group=group)


_PROBING = threading.Lock()  # `matmul_follows_global_precision`'s moment of another global precision


def matmul_follows_global_precision() -> bool:
    """Whether CUDA's matmul takes torch's global fp32 precision (the user set no other for it). Read, its precision
    is the global one's where it follows, so an own setting equal to the global one would pass for following: the
    global one is changed for a moment instead, and put back."""
    if not hasattr(torch.backends, "fp32_precision"):
        return True
    backends, matmul = torch.backends, torch.backends.cuda.matmul
    with _PROBING:  # two threads probing at once would each put back the other's probe
        was, probe = backends.fp32_precision, "ieee" if matmul.fp32_precision != "ieee" else "tf32"
        try:
            backends.fp32_precision = probe
            return matmul.fp32_precision == probe
        finally:
            backends.fp32_precision = was


def keep_tf32_flags_readable(follows: bool = True) -> None:
    """transformers turns TF32 on for --torch_compile on a GPU (and on or off for --tf32) through torch's global
    ``fp32_precision`` setting alone; where that disagrees with a legacy flag, torch refuses to read it
    (``matmul.allow_tf32``, `torch.get_float32_matmul_precision`: "mix of the legacy and new APIs"), and inductor
    reads them while it compiles a matrix product (torch 2.9-2.10: pytorch#166387, transformers#42371). This sets
    the legacy cuBLAS flag to the precision in effect, and oneDNN's matmul (the CPU's) to CUDA's where they
    differ; CUDA's precision stays as it was, and one that ``follows`` the global setting still follows it (a later
    --tf32 false applies), while one the user set stays theirs. cuDNN's legacy flag, read for convolutions only (the
    model has none), is left as it is."""
    if not hasattr(torch.backends, "fp32_precision"):  # torch before 2.9: the legacy flags only
        return
    matmul = torch.backends.cuda.matmul
    if not _readable(lambda: matmul.allow_tf32):
        set_cuda_matmul_precision(matmul.fp32_precision, follows)
    if not _readable(torch.get_float32_matmul_precision):
        torch.backends.mkldnn.matmul.fp32_precision = matmul.fp32_precision


def cuda_matmul_tf32_setting() -> tuple[bool, str] | bool:
    """CUDA's own fp32 matmul setting, for `restore_cuda_matmul_tf32_setting`: torch 2.9+, whether it follows the
    global one and its precision (read, it is the global one's where it follows); before, the legacy ``allow_tf32``."""
    matmul = torch.backends.cuda.matmul
    if not hasattr(torch.backends, "fp32_precision"):
        return matmul.allow_tf32
    return matmul_follows_global_precision(), matmul.fp32_precision


def restore_cuda_matmul_tf32_setting(setting: tuple[bool, str] | bool) -> bool:
    """Put back CUDA's fp32 matmul ``setting`` (`cuda_matmul_tf32_setting`'s); whether it had changed.
    accelerate turns TF32 on for a compiled float32 run on CUDA when it builds its state (``AcceleratorState``:
    ``matmul.allow_tf32 = True``), after the arguments applied --tf32: over --tf32 false, over a setting of the
    user's own, and for good (its setting no longer follows the global one, which a later --tf32 sets)."""
    matmul = torch.backends.cuda.matmul
    if isinstance(setting, bool):
        changed = matmul.allow_tf32 != setting
        matmul.allow_tf32 = setting
        return changed
    if cuda_matmul_tf32_setting() == setting:
        return False
    follows, precision = setting
    set_cuda_matmul_precision(precision, follows)
    return True


def set_cuda_matmul_precision(precision: str, follows: bool) -> None:
    """CUDA's fp32 matmul at ``precision``, following the global setting again where it ``follows``: the legacy
    cuBLAS flag first (it also sets the matmul's own setting), so that both APIs read the same and stay readable."""
    matmul = torch.backends.cuda.matmul
    matmul.allow_tf32 = precision == "tf32"
    if follows:
        matmul.fp32_precision = "none"


def _readable(read) -> bool:
    try:
        with warnings.catch_warnings():  # torch 2.9 warns that a legacy read is deprecated
            warnings.simplefilter("ignore")
            read()
    except RuntimeError:
        return False
    return True


PREPARATION_TIMEOUT = datetime.timedelta(hours=12)  # the longest wait for the first process's data preparation
_preparation_groups: dict = {}


def preparation_group():
    """The gloo group every process waits in for the data's preparation (`main_process_first`), one per default
    process group; made collectively, by every process at its first wait."""
    import torch.distributed as dist

    world = dist.group.WORLD
    if world not in _preparation_groups:
        _preparation_groups[world] = dist.new_group(backend="gloo", timeout=PREPARATION_TIMEOUT)
    return _preparation_groups[world]


SKIP_OOM_ONE_PROCESS = (
    "--skip_oom_batches works in one process only: a process that skips a batch would leave the others waiting "
    "for its gradients; leave it out, or lower --max_tokens."
)


def pads_to_buckets(args: TransformerTrainingArguments) -> bool:
    """Whether token batches are padded to bucket shapes: where a graph per shape is compiled, buckets bound
    the graphs; elsewhere they only cost real tokens (15% of a Multi30k batch's sentences)."""
    return args.pad_to_buckets == "always" or (args.pad_to_buckets == "auto" and bool(args.torch_compile))


def sorts_evaluation(args: TransformerTrainingArguments) -> bool:
    """Whether evaluation and prediction decode the sentences sorted by length (`LengthSortedSampler`): less
    padding and batches whose hypotheses end together; measured on the CPU, not yet on a GPU."""
    return args.eval_order == "length" or (args.eval_order == "auto" and args.device.type == "cpu")


def schedule_name(args: TransformerTrainingArguments) -> str:
    """The learning-rate schedule in words, for logs and model cards."""
    if args.lr_scheduler_type != "inverse_sqrt":
        return str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))  # the Trainer makes it an enum
    if args.cooldown_minutes:
        return f"eq. (3), decaying linearly to 0 over the last {args.cooldown_minutes:g} minutes"
    return "eq. (3)"


# ---------------------------------------------------------------------------------------------
# Ranges of the training flags (run by TransformerTrainingArguments itself)
# ---------------------------------------------------------------------------------------------


# Counts that only make sense positive (None: not given). A 0 or a negative one would otherwise be
# taken as "not set", divide by zero mid-run, or end up as a Python slice from the end.
POSITIVE_COUNTS = (
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "generation_num_beams",
    "generation_max_length",
    "save_total_limit",
)
# name -> (lowest allowed, highest allowed or None, what the bounds mean)
RANGES = {
    "max_tokens": (0, None, "padded tokens per batch, or 0 for sentence batches"),
    "average_checkpoints": (0, None, "checkpoints to average, or 0 for none"),
    "dataloader_num_workers": (0, None, "worker processes, or 0 to load in the main process"),
    "max_grad_norm": (0, None, "the gradient norm to clip to, or 0 for no clipping"),
    "weight_decay": (0, None, "a decay rate"),
    "adam_epsilon": (0, None, "Adam's epsilon"),
    "seed": (0, 2**32 - 1, "a random seed"),
}
OPEN_FRACTIONS = ("label_smoothing_factor", "adam_beta1", "adam_beta2")  # in [0, 1)


def check_one_learning_rate(args: TransformerTrainingArguments) -> None:
    """--learning_rate gives the peak itself, --lr_scale a multiple of eq. (3)'s: one of them."""
    if args.learning_rate is not None and args.lr_scale != 1.0:
        raise ValueError(
            f"Give --learning_rate (the peak) or --lr_scale (a multiple of the paper's), not both: --learning_rate "
            f"{args.learning_rate:g} (given, or set by the recipe) with --lr_scale {args.lr_scale:g}. Under a recipe "
            "that sets learning_rate, change the peak with --learning_rate."
        )


def check_argument_ranges(args: TransformerTrainingArguments) -> None:
    """Refuse numbers outside what they can mean, naming the flag, before any data is read."""
    for name in POSITIVE_COUNTS:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be a positive number, got {value}; leave it out for the default.")
    for name, (low, high, meaning) in RANGES.items():
        value = getattr(args, name)
        if value is not None and (value < low or high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ValueError(f"--{name} is {meaning}: it must be {bounds}, got {value}.")
    for name in OPEN_FRACTIONS:
        value = getattr(args, name)
        if not 0 <= value < 1:
            raise ValueError(
                f"--{name} must be in [0, 1), got {value} (the paper: label smoothing 0.1, Adam betas 0.9 and 0.98)."
            )
    if args.save_minutes is not None and args.save_minutes < 0:
        raise ValueError(f"--save_minutes must be positive, or 0 for no timed checkpoints; got {args.save_minutes}.")
    for name in (
        "learning_rate",
        "lr_scale",
        "max_train_minutes",
        "cooldown_minutes",
        "preemption_grace_seconds",
    ):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise ValueError(f"--{name} must be positive, got {value}.")
    for name, choices in (
        ("pad_to_buckets", PAD_TO_BUCKETS),
        ("memory_probe", MEMORY_PROBE_CHOICES),
        ("eval_order", EVAL_ORDERS),
    ):
        if getattr(args, name) not in choices:
            raise ValueError(f"--{name} must be one of {', '.join(choices)}, got {getattr(args, name)!r}.")
    if args.enable_jit_checkpoint:  # the Trainer's own SIGTERM save: in place, mid-update, without a budget
        raise ValueError(
            "--enable_jit_checkpoint: the trainer saves a checkpoint on SIGTERM itself (complete, after "
            "the update, within --preemption_grace_seconds); leave the flag out."
        )
    check_one_learning_rate(args)
    _check_duration(args)
    _check_cooldown(args)
    _check_average_weights(args)
    _check_ema_decay(args)
    _check_preemption_grace(args)


LAUNCHER_SHUTDOWN_ENVS = ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "PET_SHUTDOWN_TIMEOUT")  # torch's, torchrun's flag's
LAUNCHER_SHUTDOWN_MARGIN = 5  # seconds a process needs after its checkpoint to exit before the launcher's SIGKILL


def launcher_shutdown_seconds() -> float | None:
    """How long `torchrun` / `accelerate launch` lets its processes run after passing a SIGTERM on, before it
    sends SIGKILL; None outside such a launch. ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (or ``PET_SHUTDOWN_TIMEOUT``,
    torchrun's ``--shutdown_timeout`` given as a variable) where the installed torch reads it (2.13 does;
    releases before 2.12 hard-code the 30 s), else 30."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    if tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 12):
        for name in LAUNCHER_SHUTDOWN_ENVS:
            try:
                return float(os.environ[name])
            except (KeyError, ValueError):  # unset, or not a number (torch's launcher would have refused it)
                continue
    return 30.0


def _check_preemption_grace(args: TransformerTrainingArguments) -> None:
    limit = launcher_shutdown_seconds()
    if limit is not None and args.preemption_grace_seconds > limit - LAUNCHER_SHUTDOWN_MARGIN:
        raise ValueError(
            f"--preemption_grace_seconds {args.preemption_grace_seconds:g}: the launcher (accelerate launch, torchrun) "
            f"sends SIGKILL {limit:g} s after it passes a SIGTERM on, so a checkpoint must be written within "
            f"{limit - LAUNCHER_SHUTDOWN_MARGIN:g} s. Give at most that, or launch with "
            f"{LAUNCHER_SHUTDOWN_ENVS[0]}=SECONDS set (torch 2.12 and later read it; torchrun's --shutdown_timeout "
            "alone does not reach the processes it starts)."
        )


def _check_ema_decay(args: TransformerTrainingArguments) -> None:
    check_decay(args.ema_decay)
    if not args.ema_decay:
        return
    if args.load_best_model_at_end:
        raise ValueError(
            f"--ema_decay {args.ema_decay} makes the moving average the final model, and "
            "--load_best_model_at_end the best checkpoint: give one of them."
        )
    if args.average_checkpoints:
        raise ValueError(
            f"--ema_decay {args.ema_decay} and --average_checkpoints {args.average_checkpoints} each make "
            "the final model (a moving average of every update, or the mean of the last checkpoints): "
            "give one of them."
        )


def _check_average_weights(args: TransformerTrainingArguments) -> None:
    if args.average_weights not in AVERAGING_WEIGHTS:
        raise ValueError(
            f"--average_weights must be one of {', '.join(AVERAGING_WEIGHTS)}, got {args.average_weights!r}."
        )
    if args.average_weights != "uniform" and not args.average_checkpoints:
        raise ValueError(
            f"--average_weights {args.average_weights} weighs the checkpoints that --average_checkpoints "
            "averages, but it is 0 (no averaging): give --average_checkpoints N, or drop --average_weights."
        )


def _check_cooldown(args: TransformerTrainingArguments) -> None:
    if args.cooldown_minutes is None:
        return
    if not args.max_train_minutes:
        raise ValueError(
            f"--cooldown_minutes {args.cooldown_minutes} decays the learning rate over the end of a "
            "budget in minutes: give --max_train_minutes too (for a budget in updates, use "
            "--lr_scheduler_type linear or cosine with --max_steps)."
        )
    if args.cooldown_minutes > args.max_train_minutes:
        raise ValueError(
            f"--cooldown_minutes {args.cooldown_minutes} is longer than --max_train_minutes "
            f"{args.max_train_minutes}: the decay must fit inside the budget."
        )
    if args.lr_scheduler_type != "inverse_sqrt":
        raise ValueError(
            f"--cooldown_minutes decays eq. (3) (--lr_scheduler_type inverse_sqrt), got "
            f"--lr_scheduler_type {schedule_name(args)}; leave one of them out."
        )


def _check_duration(args: TransformerTrainingArguments) -> None:
    """How long to train, and the intervals of warm-up, saving and evaluation."""
    if args.max_steps == 0 or args.max_steps < -1:
        raise ValueError(
            f"--max_steps must be a positive number of updates (or -1, the default, to train for "
            f"--num_train_epochs epochs), got {args.max_steps}."
        )
    if args.max_steps == -1 and not args.num_train_epochs > 0:
        raise ValueError(f"--num_train_epochs must be positive, got {args.num_train_epochs}; or give --max_steps.")
    if args.warmup_steps >= 1 and not float(args.warmup_steps).is_integer():
        raise ValueError(
            f"--warmup_steps {args.warmup_steps}: give a whole number of updates, or a fraction below 1 "
            "of the training updates."
        )


def check_intervals(args: TransformerTrainingArguments) -> None:
    for name in ("save_steps", "eval_steps", "logging_steps"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise ValueError(
                f"--{name} must be a positive number of updates (or a fraction below 1 of them), got {value}."
            )


def check_schedule(training_args: TransformerTrainingArguments) -> None:
    """Eq. (3)'s flags, before any data is read: its peak (no --learning_rate) needs an integer warm-up, and
    the schedule itself at least one warm-up step; it takes no --lr_scheduler_kwargs."""
    scheduler = getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)
    warmup = training_args.warmup_steps
    if training_args.learning_rate is None and (scheduler != "inverse_sqrt" or not float(warmup).is_integer()):
        ratio = (
            f" ({warmup:g} is a share of the updates, the default when fine-tuning)"
            if 0 < warmup < 1 and scheduler == "inverse_sqrt"
            else ""
        )
        raise ValueError(
            f"The paper's learning rate (eq. 3, --lr_scale {training_args.lr_scale:g}) needs --lr_scheduler_type "
            f"inverse_sqrt and a whole number of --warmup_steps; got {scheduler} and {warmup:g}{ratio}. Give "
            "--warmup_steps N, or the peak as --learning_rate."
        )
    if scheduler == "inverse_sqrt" and warmup <= 0:
        raise ValueError(f"Eq. (3) needs at least one warm-up step; got --warmup_steps {warmup:g}. Give 1 or more.")
    if scheduler == "inverse_sqrt" and training_args.lr_scheduler_kwargs:
        raise ValueError(
            f"--lr_scheduler_kwargs {training_args.lr_scheduler_kwargs!r} does nothing to eq. (3) "
            "(--lr_scheduler_type inverse_sqrt takes --warmup_steps and --cooldown_minutes); drop it."
        )


def fp16_refusal(device_type: str) -> str:
    return (
        f"--fp16 on {device_type}: accelerate autocasts to float16 (with a loss scaler) only on a GPU, so this run "
        "would train in float32 without saying so. Use --bf16 true --use_cpu true on the CPU, or run on a GPU."
    )


SENTENCE_BATCH_FLAGS = ("per_device_train_batch_size", "train_sampling_strategy", "dataloader_drop_last")


def sentence_batch_flag_refusal(name: str, max_tokens: int) -> str:
    return (
        f"--{name} applies to batches of sentences, but --max_tokens {max_tokens} makes batches by token count; "
        "drop it, or pass --max_tokens 0 for sentence batches."
    )


def check_training_arguments(training_args: TransformerTrainingArguments) -> None:
    """Refuse combinations where a flag would be accepted and then have no effect."""
    check_schedule(training_args)
    if training_args.fp16 and (training_args.use_cpu or not torch.accelerator.is_available()):
        raise ValueError(fp16_refusal("cpu"))  # where accelerate has no other device to choose
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerTrainingArguments)}
    if training_args.max_tokens:
        for name in SENTENCE_BATCH_FLAGS:  # a value other than the default (parse_arguments: any value given)
            if getattr(training_args, name) != defaults[name]:
                raise ValueError(sentence_batch_flag_refusal(name, training_args.max_tokens))
    if not training_args.max_tokens and training_args.pad_to_buckets == "always":
        raise ValueError(
            "--pad_to_buckets always pads token batches (--max_tokens) to bucket shapes; sentence batches "
            "(--max_tokens 0) are padded to their longest sentence. Drop one of them."
        )
    if training_args.average_checkpoints:
        if training_args.load_best_model_at_end:
            raise ValueError(
                f"--average_checkpoints {training_args.average_checkpoints} makes the average of the last "
                "checkpoints the final model, and --load_best_model_at_end the best checkpoint (which the Trainer "
                "also keeps out of --save_total_limit's rotation, so the last ones would not be the newest): give "
                "one of them."
            )
        if training_args.save_strategy == "no":
            raise ValueError("--average_checkpoints needs checkpoints: set --save_strategy steps and --save_steps.")
        limit = training_args.save_total_limit
        if limit is not None and limit < training_args.average_checkpoints:
            raise ValueError(
                f"--save_total_limit {limit} keeps fewer checkpoints than --average_checkpoints "
                f"{training_args.average_checkpoints} averages; raise the limit."
            )


def refuse_data_parallel(training_args) -> None:
    """One process that sees several GPUs: transformers would wrap the model in ``torch.nn.DataParallel``,
    which hands the loss a token count per GPU while the loss is computed on the gathered outputs (it failed at
    the first update), and which is slower than a process per GPU anyway."""
    if training_args.n_gpu > 1:
        count = training_args.n_gpu
        raise ValueError(
            f"{count} GPUs are visible to this one process, and transformers would run the model under "
            "torch.nn.DataParallel, which this recipe does not support. Start one process per GPU: accelerate "
            f"launch --num_processes {count} ... or torchrun --nproc_per_node {count} ...; or train on one GPU "
            "with CUDA_VISIBLE_DEVICES=0."
        )


def refuse_processes_left_alone(training_args) -> None:
    """A launcher (accelerate launch, torchrun) started this process as one of several, but it trains alone:
    torch.distributed was not set up (on a machine without GPUs, without --use_cpu). Each process would train
    the whole run by itself into the same --output_dir, the first to take its lock ending the others."""
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    by_a_launcher = "LOCAL_RANK" in os.environ  # a cluster may set WORLD_SIZE for a process it starts alone
    if launched > 1 and by_a_launcher and training_args.world_size == 1:
        if torch.cuda.is_available():
            why = "torch.distributed was not set up: check the launcher's flags"
        else:
            why = (
                "no GPU is visible: on the CPU, add --use_cpu true to train's flags, not --cpu to accelerate launch "
                "(which starts one process)"
            )
        raise ValueError(
            f"this process was started as one of {launched} (WORLD_SIZE={launched}, by accelerate launch or "
            f"torchrun) but would train alone, as {why}."
        )
