"""Out of memory at once, not hours in: the largest batches of a run tried before its first update.

A run meets its largest token batch (`TokenBatchSampler`) whenever the shuffled order first brings it,
possibly hours in. `check_largest_batches_fit` runs one forward and
backward pass on each of the largest shapes (the most padded tokens; the longest sentences, whose
attention grows with the square of the length) before training starts, with the optimizer's two
moments held aside (Adam allocates them at the first update), then drops the gradients: no weight
and no random stream changes. A shape that runs out of memory ends the run with `MemoryCheckError`:
one line naming the shape, ``--max_tokens`` and a value that fits, found by halving ``--max_tokens``
and trying the largest batches it would make (measured, not estimated).

``--memory_probe auto`` (the default) tries on CUDA only: elsewhere memory runs out differently (a CPU
swaps). The model runs as it is before training starts: uncompiled (``--torch_compile`` usually needs
less) and whole (not under FSDP, which shards it only when training starts: no probe there).

`SkipOutOfMemoryBatches` (``--skip_oom_batches``, as fairseq recovers from an out-of-memory batch)
drops a batch that runs out of memory during training with the gradients of its update so far,
counts it (``skipped_oom_batches`` in the logs, the whole run's: a resumed run goes on counting) and goes on;
one process only.
"""

from __future__ import annotations

import gc
import logging

import numpy as np
import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..training_kernels import label_smoothed_cross_entropy
from .arguments import SKIP_OOM_ONE_PROCESS
from .batching import length_pairs
from .checkpointing import saved_attributes
from .data import example_lengths
from .levers import training_loss

logger = logging.getLogger(__name__)


class MemoryCheckError(ValueError):
    """Found before the first update: the largest batches run out of the device's memory, or
    ``--skip_oom_batches`` is asked of several processes."""


# ---------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------


def largest_shapes(shapes: np.ndarray) -> list[tuple[int, int, int]]:
    """The (rows, source, target) shapes to try: the most padded tokens, and the longest sentences
    (attention's scores grow with rows x length^2), each with ties to the longer target (the logits)."""
    shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
    rows, source, target = shapes[:, 0], shapes[:, 1], shapes[:, 2]
    chosen = []
    for size in (rows * (source + target), rows * np.maximum(source, target) ** 2):
        best = np.lexsort((target, size))[-1]
        if tuple(shapes[best].tolist()) not in chosen:
            chosen.append(tuple(shapes[best].tolist()))
    return chosen


def batch_of_shape(shape: tuple[int, int, int], config, device) -> dict[str, torch.Tensor]:
    """A training batch of ``shape`` with no padding (every position counts, as in the fullest batch)."""
    rows, source, target = shape
    token = (config.pad_token_id + 1) % config.vocab_size if config.pad_token_id is not None else 0
    return {
        "input_ids": torch.full((rows, source), token, device=device),
        "attention_mask": torch.ones(rows, source, dtype=torch.long, device=device),
        "decoder_input_ids": torch.full((rows, target), token, device=device),
        "labels": torch.full((rows, target), token, device=device),
    }


def fits(trainer, shape: tuple[int, int, int]) -> bool:
    """Whether one forward and backward pass of a ``shape`` batch fits, next to Adam's moments; on every
    process the same answer (each tries, the answers are combined)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    device = next(model.parameters()).device
    outcome = _try(trainer, model, shape, device)
    gc.collect()  # the failed pass's tensors, held by the traceback until now
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        agreed = torch.tensor([int(outcome)], device=trainer.args.device)
        torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MIN)
        outcome = bool(agreed.item())
    return outcome


def _try(trainer, model, shape, device) -> bool:
    was_training = model.training
    model.train()
    batch = None
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # dropout's draws undone
            moments = torch.empty(_moment_bytes(trainer, model), dtype=torch.uint8, device=device)
            batch = batch_of_shape(shape, model.config, device)
            labels = batch.pop("labels")
            smoothing, fused_loss = trainer.args.label_smoothing_factor, trainer.args.fused_loss
            if fused_loss != "none":  # the run's own pass: the loss a chunk of rows at a time, no full logits
                with trainer.accelerator.autocast():
                    loss = training_loss(model, batch, labels, labels.numel(), smoothing, fused_loss)
            else:
                with trainer.accelerator.autocast():
                    logits = model(**batch).logits
                logits = logits.float()  # as accelerate returns a mixed-precision model's outputs
                loss = label_smoothed_cross_entropy(logits, labels, labels.numel(), smoothing)
                del logits
            loss.backward()
            del moments, loss
        return True
    except (torch.OutOfMemoryError, RuntimeError) as error:
        if not is_out_of_memory(error):
            raise
        return False
    finally:
        del batch
        model.zero_grad(set_to_none=True)
        model.train(was_training)


def is_out_of_memory(error: BaseException) -> bool:
    """torch's ``OutOfMemoryError``, or a library's allocation failure that torch raises as a ``RuntimeError``
    (cuBLAS's or cuDNN's ``..._STATUS_ALLOC_FAILED`` creating a handle or a workspace, "out of memory" from
    another allocator): fairseq takes "out of memory" in the message for one too."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    message = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in message or "STATUS_ALLOC_FAILED" in message)


def _moment_bytes(trainer, model) -> int:
    """What the first update allocates beside the batch: Adam's first and second moments, one of each per
    trained weight; with --bf16_weights the float32 masters too, and the moments in float32 (the masters'
    gradients live only within the optimizer's step, after the backward pass); with --ema_decay the moving
    average, a float32 copy of each trained weight on its device."""
    trained = [p for p in model.parameters() if p.requires_grad]
    weights = sum(p.numel() for p in trained)
    average = 4 * weights if getattr(trainer.args, "ema_decay", 0) else 0
    adam = "adam" in str(getattr(trainer.args.optim, "value", trainer.args.optim)).lower()
    if getattr(trainer.args, "bf16_weights", False):
        return (3 if adam else 1) * 4 * weights + average
    return (2 * sum(p.numel() * p.element_size() for p in trained) if adam else 0) + average


def probe_applies(trainer) -> bool:
    """``--memory_probe``: on, off, or auto (on CUDA); only for token batches of a model that is whole."""
    args = trainer.args
    if args.memory_probe == "off" or not args.max_tokens or trainer.train_dataset is None:
        return False
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        logger.info("--memory_probe: not under FSDP or DeepSpeed (the model is sharded only when training starts)")
        return False
    device = next(trainer.accelerator.unwrap_model(trainer.model).parameters()).device
    return args.memory_probe == "on" or device.type == "cuda"


def check_largest_batches_fit(trainer) -> None:
    """Before the first update: try the largest batch shapes of the run (`largest_shapes`); `MemoryCheckError`
    naming the one that ran out of memory and a ``--max_tokens`` that fits (halved until one does)."""
    if trainer.args.skip_oom_batches and trainer.accelerator.num_processes > 1:
        raise MemoryCheckError(SKIP_OOM_ONE_PROCESS)
    if not probe_applies(trainer):
        return
    max_tokens = trainer.args.max_tokens
    lengths = length_pairs(example_lengths(trainer.train_dataset))
    failed = _first_failing(trainer, lengths, max_tokens)
    if failed is None:
        logger.info(f"--memory_probe: the largest batches of --max_tokens {max_tokens} fit")
        return
    raise MemoryCheckError(_advice(trainer, lengths, max_tokens, failed))


def _first_failing(trainer, lengths: np.ndarray, max_tokens: int) -> tuple[int, int, int] | None:
    """The first of the largest shapes of ``max_tokens`` batches that runs out of memory, or None."""
    kept = lengths[lengths.max(axis=1) <= max_tokens]  # longer pairs are left out of such a run
    shapes = trainer.token_batches(kept, max_tokens).shapes  # the run's (`TransformerTrainer.token_batches`)
    for shape in largest_shapes(shapes):
        if not fits(trainer, shape):
            return shape
    return None


def _advice(trainer, lengths: np.ndarray, max_tokens: int, failed: tuple[int, int, int]) -> str:
    rows, source, target = failed
    device = trainer.args.device
    said = (
        f"a batch of {rows} x {source} x {target} (rows x source x target tokens), the largest of --max_tokens "
        f"{max_tokens}, runs out of {device.type} memory in one forward and backward pass (tried before the "
        "first update)"
    )
    smaller, accumulation = max_tokens // 2, trainer.args.gradient_accumulation_steps
    while smaller >= lengths.min() and (lengths.max(axis=1) <= smaller).any():
        accumulation *= 2
        if _first_failing(trainer, lengths, smaller) is None:
            left_out = int((lengths.max(axis=1) > smaller).sum())
            note = f", which leaves out the {left_out} pairs longer than {smaller} tokens" if left_out else ""
            return (
                f"{said}; --max_tokens {smaller} fits (tried the same way{note}): give it, with "
                f"--gradient_accumulation_steps {accumulation} to keep the tokens per update."
            )
        smaller //= 2
    return (
        f"{said}, and so do the largest batches of every --max_tokens down to {max(smaller * 2, 1)}: use a device "
        "with more memory, --bf16, or a smaller model."
    )


# ---------------------------------------------------------------------------------------------
# Skipping a batch that runs out of memory during training
# ---------------------------------------------------------------------------------------------


class SkippedBatches(TrainerCallback, ExportableState):
    """The batches ``--skip_oom_batches`` skipped in the whole run: a checkpoint's trainer state keeps the count
    (the Trainer's ``stateful_callbacks``), and a run resumed from it goes on counting from there."""

    def __init__(self, count: int = 0):
        self.count = count

    def state(self) -> dict:
        return {"args": {}, "attributes": {"count": self.count}}

    def on_train_begin(self, args, state, control, **kwargs):
        saved = saved_attributes(state.stateful_callbacks, type(self)) if state.global_step else {}
        self.count = int(saved.get("count") or 0)
        state.stateful_callbacks[type(self).__name__] = self.state()  # also where a checkpoint predates it
        return control


class SkipOutOfMemoryBatches:
    """A Trainer mixin: with ``--skip_oom_batches``, a micro-batch that runs out of memory is dropped with
    the gradients of its update so far (gradients set to None: Adam then leaves every weight as it is,
    unless later micro-batches of the update add some), the memory freed, and counted in the logs as
    ``skipped_oom_batches``; its loss is logged as 0, and its target tokens are not counted as trained on.
    fairseq drops such a batch the same way. The trainer adds a `SkippedBatches` as ``self.skipped_batches``
    (its count lasts across a resume) and counts target tokens in ``self.target_tokens``."""

    skipped_batches: SkippedBatches

    @property
    def skipped_oom_batches(self) -> int:
        return self.skipped_batches.count

    def training_step(self, model, inputs, num_items_in_batch=None):
        if not self.args.skip_oom_batches:
            return super().training_step(model, inputs, num_items_in_batch)
        counted = self.target_tokens.counted()
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not is_out_of_memory(error):
                raise
            shape = "x".join(str(size) for size in (*inputs["input_ids"].shape, inputs["labels"].shape[-1]))
        # here, after the except block: the traceback and the tensors it held are gone
        del inputs
        model.zero_grad(set_to_none=True)
        self.target_tokens.restore(counted)  # the throughput counts what was trained on
        gc.collect()
        if self.args.device.type == "cuda":
            torch.cuda.empty_cache()
        self.skipped_batches.count += 1
        logger.warning(
            f"update {self.state.global_step + 1}: skipped a batch of {shape} (rows x source x target) "
            f"that ran out of memory, with the update's gradients so far ({self.skipped_oom_batches} "
            "skipped in all)"
        )
        return torch.zeros((), device=self.args.device)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if self.skipped_oom_batches and ("loss" in logs or "train_runtime" in logs):
            logs["skipped_oom_batches"] = self.skipped_oom_batches
        super().log(logs, *args, **kwargs)
