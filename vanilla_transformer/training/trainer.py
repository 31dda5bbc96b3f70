"""The paper's training recipe (§5) on `Seq2SeqTrainer`: the pieces a user's own script needs.

- `TransformerTrainingArguments` (defined in `arguments`, importable from here too):
  `Seq2SeqTrainingArguments` with the paper's values as defaults (Adam 0.9/0.98/1e-9, 4000 warm-up
  steps, label smoothing 0.1, no gradient clipping) plus ``max_tokens`` (token-count batches),
  ``lr_scale`` and ``average_checkpoints``.
- `TransformerTrainer`: `Seq2SeqTrainer` that batches by token count (`TokenBatchSampler`), smooths
  the labels per target token over the whole accumulated batch (the model file's
  `label_smoothed_cross_entropy`, the package's one loss), runs eq. (3) itself as the
  learning-rate schedule, and reports the evaluation loss per target token of the whole set
  (`EvaluationLoss`), scoring each sentence once on any number of processes.

    args = TransformerTrainingArguments(output_dir="out", max_tokens=4096, max_steps=100_000)
    trainer = TransformerTrainer(model=model, args=args, train_dataset=train, eval_dataset=valid,
                                 data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
                                 processing_class=tokenizer)
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from transformers import ProgressCallback, Seq2SeqTrainer, TrainerCallback, TrainerState
from transformers.integrations import TensorBoardCallback
from transformers.integrations.integration_utils import default_logdir
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import EvalLoopOutput, EvalPrediction, TrainOutput, has_length

from ..private_api import require
from ..training_kernels import label_smoothed_cross_entropy
from .arguments import (
    TransformerTrainingArguments,
    check_one_learning_rate,
    check_schedule,
    cuda_matmul_tf32_setting,
    fp16_refusal,
    pads_to_buckets,
    refuse_data_parallel,
    restore_cuda_matmul_tf32_setting,
    sorts_evaluation,
)
from .batching import LengthSortedSampler, PadToBucket, TokenBatchSampler, allow_recompiles
from .checkpointing import (
    TRAINER_STATE_NAME,
    CheckpointPolicy,
    ContinuedFrom,
    StopOnSignal,
    is_sharded,
    last_good_checkpoint,
    of_another_folder,
    plain_copy,
    record_continuation,
    resolve_checkpoint,
    saved_attributes,
    seeded_worker_start,
    signals_to_the_main_process,
)
from .data import example_lengths, list_lengths
from .divergence import DivergenceGuard, StopOnDivergence
from .levers import CUDA_GRAPHS, apply_levers, keep_float32_masters, take_float32_masters, training_loss
from .memory_check import SkipOutOfMemoryBatches, SkippedBatches, check_largest_batches_fit
from .moving_average import EMA_FILE, ExponentialMovingAverage, check_checkpoint
from .progress import TargetTokens, TimeBudgetProgress, add_throughput
from .translation import STATIC_CACHE_MULTIPLE, padded_to_multiple

logger = logging.getLogger(__name__)

# TransformerTrainer overrides or reads these internals: fail at import, naming the versions, where they are gone
require(
    "transformers.Trainer._remove_unused_columns",
    "transformers.Trainer._get_collator_with_removed_columns",
    "transformers.Trainer._created_lr_scheduler",
    "transformers.Seq2SeqTrainer._gen_kwargs",
    "accelerate.Accelerator._models",
    "transformers.Trainer._build_accelerator_args",
    "transformers.Trainer._load_callback_state",
)

# ---------------------------------------------------------------------------------------------
# §5.3 The learning rate
# ---------------------------------------------------------------------------------------------


def noam_learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), equation (3) of §5.3 (times ``scale``).

    ``step`` counts updates from 1: the first update runs at ``step = 1``, never at a rate of 0.
    """
    if step < 1:
        raise ValueError(f"Equation (3) counts updates from 1, got step={step}.")
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def noam_schedule(
    optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int, cooldown: Callable[[], float] | None = None
) -> LambdaLR:
    """Equation (3) as a scheduler: update n (from 1) runs at ``peak * noam(n) / noam(warmup_steps)``.

    ``peak`` is the optimizer's learning rate, the rate reached after ``warmup_steps`` updates; with
    the paper's peak, d_model^-0.5 * warmup_steps^-0.5, this is eq. (3) exactly. ``cooldown``, if
    given, is a factor in [0, 1] read at every update (`WallClock.cooldown_factor`).
    """
    peak = noam_learning_rate(warmup_steps, d_model, warmup_steps)

    def factor(done: int) -> float:  # LambdaLR counts the updates already done (0 before the first): n = done + 1
        rate = noam_learning_rate(done + 1, d_model, warmup_steps) / peak
        return rate * cooldown() if cooldown is not None else rate

    return LambdaLR(optimizer, factor)


# ---------------------------------------------------------------------------------------------
# §6.1 Checkpoints by the clock, and a training budget
# ---------------------------------------------------------------------------------------------


class SamplerEpoch(TrainerCallback):
    """Each epoch's start sets the token batch sampler's epoch, which (with the seed) orders its batches. The
    Trainer reaches the sampler through accelerate's wrappers only where it is one or two levels down; in the
    epoch a multi-process run resumes in, `skip_first_batches` wraps it once more, and the resumed epoch
    would take epoch 0's order (batches trained twice, others never). The epoch is the Trainer's own count:
    the updates done over the updates an epoch holds."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        """A run resumed in the middle of an epoch skips the batches its checkpoint trained, counted in this run's
        batches: said where they are not the checkpoint's (other data, another length filter, another batching)."""
        sampler = self.trainer.token_sampler
        if sampler is None:
            return control
        now = {"batches": sampler.num_batches, "digest": sampler.digest}
        saved = EpochBatches.saved_in(state) if state.global_step else None
        if saved and saved != now and state.global_step % self._updates_per_epoch(args) and not args.ignore_data_skip:
            logger.warning(
                f"resuming at update {state.global_step}, in the middle of an epoch, with other batches than the "
                f"checkpoint's ({saved['batches']} batches there, {sampler.num_batches} now, or other pairs in them: "
                "the training data, its length limits, --pad_to_buckets/--torch_compile or --max_tokens differ): the "
                "rest of the epoch is batched anew, so some of its pairs are trained twice and others not at all "
                "(the epochs after it are whole)"
            )
        for kept in (c for c in self.trainer.callback_handler.callbacks if isinstance(c, EpochBatches)):
            kept.batches, kept.digest = now["batches"], now["digest"]  # in every checkpoint from here
        return control

    def on_epoch_begin(self, args, state, control, **kwargs):
        trainer = self.trainer
        if trainer.token_sampler is not None and trainer.token_batches_per_epoch:
            trainer.token_sampler.set_epoch(state.global_step // self._updates_per_epoch(args))
        return control

    def _updates_per_epoch(self, args) -> int:
        """The Trainer's own count: an epoch's batches on this process over the batches an update accumulates."""
        return max(math.ceil(self.trainer.token_batches_per_epoch / args.gradient_accumulation_steps), 1)


class EpochBatches(TrainerCallback, ExportableState):
    """What a checkpoint's trainer_state.json keeps of the epoch's batches (`TokenBatchSampler.digest`), for
    `SamplerEpoch` to compare a resumed run's with. Data only: transformers may replace it by a copy made from a
    checkpoint (--restore_callback_states_from_checkpoint)."""

    def __init__(self, batches: int | None = None, digest: str | None = None):
        self.batches, self.digest = batches, digest

    def state(self) -> dict:
        return {"args": {}, "attributes": {"batches": self.batches, "digest": self.digest}}

    def on_train_begin(self, args, state, control, **kwargs):
        # also where a checkpoint predates it: transformers' save updates an entry it expects there
        state.stateful_callbacks[type(self).__name__] = self.state()
        return control

    @classmethod
    def saved_in(cls, state) -> dict | None:
        """The batches a trainer state (a checkpoint's) records, or None where it holds none."""
        attributes = saved_attributes(state.stateful_callbacks, cls)
        return attributes if attributes.get("digest") else None


class RunFolders(TrainerCallback):
    """Where training begins, the run's `ContinuedFrom` (the callbacks' own, a copy of the checkpoint's where
    transformers restored callback states) learns the folders the run trained in: from the trainer state and the
    checkpoint resumed from, which only the trainer knows."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if (continued_from := self.trainer.continued_from) is not None:
            continued_from.begin(args.output_dir, state, self.trainer.resumed_from)
        best, resumed_from = state.best_model_checkpoint, self.trainer.resumed_from
        if best and resumed_from is not None:
            # the best as the saving run spelled it (relative to its working directory, in a folder since moved or
            # copied): where it lies beside the checkpoint resumed from, for save_total_limit to keep it and
            # --load_best_model_at_end to find it
            beside = Path(resumed_from).resolve().parent / Path(best).name
            if beside.is_dir() and beside != Path(best).resolve():
                state.best_model_checkpoint = str(beside)
        return control


class TooFewBatches(ValueError):
    """Found when training starts: an epoch holds fewer batches per process than one update accumulates."""


class EvaluationInterrupted(Exception):
    """A signal (Ctrl-C, SIGTERM) arrived during an evaluation inside training: it ends, and the run saves."""


class WallClock(TrainerCallback, ExportableState):
    """Save a checkpoint every ``save_minutes`` ("checkpoints, which were written at 10-minute intervals",
    §6.1) and stop after ``max_train_minutes`` of training, saving the last update (so that averaging the
    last checkpoints includes it). The minutes count the whole run's training: each checkpoint's
    ``trainer_state.json`` holds the seconds trained until it (the Trainer's ``stateful_callbacks``), and a
    run resumed from it goes on from there, its budget, its cooldown and its next save included.

    With several processes, each reads its own clock, and they can disagree by an update: then one would
    stop or save while another goes on (and waits forever for it in the next all-reduce), or run another
    learning rate in a cooldown. So the processes agree on the clock, the longest of their elapsed times,
    after an update every ``agree_seconds`` or so (an all-reduce and a wait for the device each time), and
    in between all count the seconds per update of the last two agreements (after the first two updates, so
    that the first one's warm-up is not counted again for every update; the interval at most doubles from one
    agreement to the next): every reading is then the same on every process, and updates of ``agree_seconds``
    or more agree at every update.
    """

    def __init__(
        self, max_minutes: float | None = None, save_minutes: float | None = None, agree_seconds: float = 10.0
    ):
        self.max_minutes, self.save_minutes = max_minutes, save_minutes
        self.max_seconds = max_minutes * 60 if max_minutes else None
        self.save_seconds = save_minutes * 60 if save_minutes else None
        self.agree_seconds = agree_seconds
        self.start, self.trained_before = None, 0.0

    def state(self) -> dict:
        """What a checkpoint keeps of the clock (transformers' `ExportableState`): the seconds trained until the
        end of the update it holds (the clock's reading then; a checkpoint is written after `on_step_end`)."""
        return {
            "args": {"max_minutes": self.max_minutes, "save_minutes": self.save_minutes},
            "attributes": {"trained_before": self.trained_before if self.start is None else self.last_reading},
        }

    @classmethod
    def trained_in(cls, state) -> float | None:
        """The seconds trained that a trainer state (a checkpoint's) records, or None where it holds no clock."""
        return saved_attributes(state.stateful_callbacks, cls).get("trained_before")  # one clock a run

    def on_train_begin(self, args, state, control, **kwargs):
        self.trained_before = float((self.trained_in(state) if state.global_step else None) or 0.0)
        state.stateful_callbacks[type(self).__name__] = self.state()  # also where a checkpoint predates the clock's
        self.start = time.monotonic()
        self.last_reading = self.trained_before
        self.device = args.device
        self.next_save = None
        if self.save_seconds:  # the first multiple of the interval after what was trained before
            self.next_save = (math.floor(self.trained_before / self.save_seconds) + 1) * self.save_seconds
        self.updates, self.agreed, self.next_agreement = 0, (0, 0.0), 1  # agreed: (updates, seconds) then
        self.per_update, self.interval = 0.0, 1  # seconds an update and updates between the last two agreements

    def on_optimizer_step(self, args, state, control, **kwargs):
        """Count the update, and agree on the clock when due (before the scheduler reads it)."""
        self.updates += 1
        if self.updates < self.next_agreement or not _several_processes():
            return
        longest = torch.tensor([time.monotonic() - self.start], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(longest, op=torch.distributed.ReduceOp.MAX)
        (updates, seconds), self.agreed = self.agreed, (self.updates, longest.item())
        if updates == 0:  # the first update, its warm-up in it: agree again after the next one
            self.next_agreement = self.updates + 1
            return
        self.per_update = (self.agreed[1] - seconds) / (self.updates - updates)
        every = int(self.agree_seconds / self.per_update) if self.per_update > 0 else 1
        self.interval = min(2 * self.interval, max(1, every))  # one odd pace cannot put the next agreement far off
        self.next_agreement = self.updates + self.interval

    def elapsed(self) -> float:
        """Seconds trained, before a resume included: on several processes, the same reading on every one."""
        if not _several_processes():
            return self.trained_before + time.monotonic() - self.start
        updates, seconds = self.agreed
        return self.trained_before + seconds + (self.updates - updates) * self.per_update

    def cooldown_factor(self, cooldown_minutes: float) -> float:
        """1 until the last ``cooldown_minutes`` of the budget, then falling linearly to 0 at its end: the
        decay of a warm-up, stable, decay schedule (Hägele et al., 2024), placed by the clock because a
        budget in minutes leaves the number of updates unknown. 1 before training starts."""
        if self.start is None:
            return 1.0
        remaining = self.max_seconds - self.elapsed()
        return min(1.0, max(0.0, remaining / (cooldown_minutes * 60)))

    def on_step_end(self, args, state, control, **kwargs):
        elapsed = self.last_reading = self.elapsed()
        if self.save_seconds and elapsed >= self.next_save:
            control.should_save = True
            while self.next_save <= elapsed:  # a slow update may pass more than one interval
                self.next_save += self.save_seconds
        if self.max_seconds and elapsed >= self.max_seconds:
            control.should_training_stop = True
            control.should_save = control.should_save or args.save_strategy != "no"  # a --save_minutes save due
        return control


def without_padding_columns(tokens: torch.Tensor | None, pad_token_id: int | None) -> torch.Tensor | None:
    """``tokens`` (rows of ids) without the last columns that hold only ``pad_token_id`` or -100 (one column
    at least); None stays None."""
    if tokens is None or pad_token_id is None or tokens.dim() != 2 or tokens.shape[1] <= 1:
        return tokens
    filled = ((tokens != pad_token_id) & (tokens != -100)).any(dim=0).nonzero()  # columns with a token, ascending
    return tokens[:, : int(filled[-1]) + 1 if len(filled) else 1]


def _several_processes() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def resolve_learning_rate(args: TransformerTrainingArguments, d_model: int) -> float:
    """The peak learning rate: ``--learning_rate`` as given, or eq. (3)'s peak times ``--lr_scale``."""
    check_one_learning_rate(args)  # (also when the arguments were changed after they were made)
    if args.learning_rate is not None:
        return args.learning_rate
    check_schedule(args)  # an inverse_sqrt schedule with a whole number of warm-up steps, at least 1
    warmup = int(args.warmup_steps)
    return noam_learning_rate(warmup, d_model, warmup, args.lr_scale)


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------


def _tensorboard_beside_the_run(trainer) -> None:
    """TensorBoardCallback takes ``--output_dir/runs/<time>_<host>`` for its events at on_train_begin: a run that
    logs without training (evaluation or prediction only, or a requeued run whose checkpoint ends its training)
    had its writer made in ``./runs`` of the current directory. It gets that folder now (the environment's
    TENSORBOARD_LOGGING_DIR, which it read itself, still wins)."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback) and getattr(callback, "logging_dir", "") is None:
            callback.logging_dir = os.path.join(trainer.args.output_dir, default_logdir())


class TransformerTrainer(SkipOutOfMemoryBatches, StopOnDivergence, CheckpointPolicy, Seq2SeqTrainer):
    """Seq2SeqTrainer with the paper's recipe: token-count batches, per-token label smoothing, eq. (3).

    Needs `TransformerTrainingArguments` (a `Seq2SeqTrainingArguments` with the paper's defaults).
    ``lr_scheduler_type="inverse_sqrt"`` runs eq. (3) through `noam_schedule` (transformers' own
    inverse_sqrt starts at a rate of 0); any other type is the Trainer's.

    Checkpoints (`CheckpointPolicy`, the one place that decides what they hold and how they are
    written): they appear only complete; Ctrl-C or SIGTERM saves one (after SIGTERM within
    ``preemption_grace_seconds``) and raises `TrainingInterrupted`; resuming skips incomplete
    checkpoints. A non-finite loss or gradient (`divergence`) raises `TrainingDiverged` at the next
    logging, evaluation or saving step, before anything is saved.
    """

    loss_is_scaled_for_ga = True  # compute_loss divides by the tokens of the whole accumulated batch

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, TransformerTrainingArguments):
            raise TypeError(
                f"TransformerTrainer needs TransformerTrainingArguments (Seq2SeqTrainingArguments with the paper's "
                f"defaults and max_tokens), got {type(self.args).__name__}."
            )
        refuse_data_parallel(self.args)
        learning_rate = resolve_learning_rate(self.args, self._d_model)
        if learning_rate != self.args.learning_rate:  # eq. (3)'s peak for this model, on the trainer's own copy:
            self.args = copy.copy(self.args)  # the caller's arguments may build a trainer for another model
            self.args.learning_rate = learning_rate
        # compute_loss smooths itself in training. In evaluation, Seq2SeqTrainer takes the loss from
        # ``label_smoother(outputs, labels)``: ours is the plain per-token NLL, counted over the whole set.
        self.label_smoother = self.evaluation_loss = EvaluationLoss(self.accelerator)
        # Always count the target tokens of each accumulated batch: compute_loss normalises by them.
        self.model_accepts_loss_kwargs = True
        refuse_ignored_precision_or_sharding(self.args, self.accelerator, self.is_fsdp_enabled)
        if getattr(self.processing_class, "padding_side", "right") != "right":  # the collator pads as it says
            raise ValueError(
                f"The tokenizer pads on the {self.processing_class.padding_side}: the encoder's positions start at "
                "each row's first column (§3.5), so pad on the right (tokenizer.padding_side = 'right', its default)."
            )
        self.moving_average = None
        if self.args.ema_decay:
            self.moving_average = ExponentialMovingAverage(self.args.ema_decay)
            self.add_callback(self.moving_average)
        if self.args.save_minutes or self.args.max_train_minutes:
            self.add_callback(WallClock(self.args.max_train_minutes, self.args.save_minutes))
        self.target_tokens = TargetTokens()  # for throughput in target tokens/s
        if self.args.max_train_minutes and not self.args.disable_tqdm:  # a bar in minutes, not in max_steps
            self.remove_callback(ProgressCallback)
            self.add_callback(
                TimeBudgetProgress(
                    self.args.max_train_minutes,
                    self.target_tokens,
                    self.accelerator.num_processes,
                    minutes_before=lambda: self.wall_clock.trained_before / 60,
                )
            )
        if self.args.device.type == "cpu":  # pinned memory only helps a copy to an accelerator (torch warns)
            self.args.dataloader_pin_memory = False
        # after the callbacks that ask for saves (WallClock): a save they want is a whole checkpoint, not only a
        # point to resume from
        self.stop_on_signal = StopOnSignal(self, self.args.preemption_grace_seconds)
        self.add_callback(self.stop_on_signal)
        self.token_sampler, self.token_batches_per_epoch = None, 0  # set by get_train_dataloader
        self.add_callback(SamplerEpoch(self))
        self.add_callback(EpochBatches())
        self.skipped_batches = SkippedBatches()  # --skip_oom_batches' count, across a resume
        self.add_callback(self.skipped_batches)
        self.resumed_from = None  # the checkpoint train() resumes from
        self.add_callback(ContinuedFrom())  # the run folders a resumed run continues, for the final averaging
        self.add_callback(RunFolders(self))
        self.divergence = DivergenceGuard(self)  # last: it reads whether the others log, evaluate or save
        self.add_callback(self.divergence)
        apply_levers(self.accelerator.unwrap_model(self.model), self.args)
        _tensorboard_beside_the_run(self)

    def create_accelerator_and_postprocess(self) -> None:
        """transformers' (it builds the Accelerator), with CUDA's TF32 matmul setting as the arguments left it: the
        one --tf32 set, or transformers' choice for --torch_compile, or the user's own, not accelerate's."""
        tf32 = cuda_matmul_tf32_setting()
        super().create_accelerator_and_postprocess()
        if restore_cuda_matmul_tf32_setting(tf32):
            logger.info(
                "kept CUDA's float32 matmul precision as the arguments left it (accelerate turns TF32 on when compiled)"
            )

    def create_optimizer(self, *args, **kwargs) -> torch.optim.Optimizer:
        """The Trainer's optimizer (--optim); with --bf16_weights over float32 copies of the bfloat16 weights
        (`levers.keep_float32_masters`), which its checkpoints' optimizer.pt then holds; without, it takes such
        copies as its weights where it resumes a --bf16_weights checkpoint (`levers.take_float32_masters`)."""
        optimizer = super().create_optimizer(*args, **kwargs)
        if self.args.bf16_weights:
            keep_float32_masters(optimizer)
        else:  # a --bf16_weights checkpoint resumed without the flag: from its float32 masters
            take_float32_masters(optimizer)
        return optimizer

    @property
    def _d_model(self) -> int:
        return self.accelerator.unwrap_model(self.model).config.d_model

    def _build_accelerator_args(self, **kwargs):
        """The Trainer's; with ``--torch_compile`` and token batches padded to buckets, graphs of static shapes:
        the batches come in a few bucket shapes (`TokenBatchSampler`), so each is compiled once, not traced again
        with symbolic lengths (torch's default after a second shape, kept for batches of any shape). With
        ``--cuda_graphs``, dynamic shapes (`levers.CUDA_GRAPHS`): one compilation, and a CUDA graph recorded per
        bucket shape."""
        args = super()._build_accelerator_args(**kwargs)
        if self.args.torch_compile and "dynamo_plugin" in args:
            if self.args.cuda_graphs:  # with sentence batches too: a graph recorded per shape, not compiled
                args["dynamo_plugin"].dynamic = CUDA_GRAPHS["dynamic"]
            elif self.args.max_tokens and pads_to_buckets(self.args):
                args["dynamo_plugin"].dynamic = False  # without buckets (--pad_to_buckets never): torch's default
        return args

    def floating_point_ops(self, inputs: dict) -> int:
        """The Trainer's estimate, 6 x input tokens x non-embedding parameters, the parameters counted once:
        the Trainer counts them again, walking every parameter, at every micro-batch (~2.5 ms for base)."""
        if getattr(self, "_non_embedding_parameters", None) is None:
            self._non_embedding_parameters = self.model.num_parameters(exclude_embeddings=True)
        return 6 * inputs["input_ids"].numel() * self._non_embedding_parameters if "input_ids" in inputs else 0

    def _get_grad_norm(self, model, grad_norm=None):
        """The Trainer's, but without clipping measured only for the updates whose logs show it: otherwise a
        pass over every gradient each update (and under DeepSpeed a wait for the device) that nothing reads."""
        if grad_norm is None and not self._logs_this_update():
            return None
        return super()._get_grad_norm(model, grad_norm)

    def _logs_this_update(self) -> bool:
        """Whether the update now ending will be logged (the Trainer's DefaultFlowCallback rule)."""
        update = self.state.global_step + 1
        if update == 1 and self.args.logging_first_step:
            return True
        if self.args.logging_strategy == "epoch":  # an epoch's last update is known only to the Trainer's loop
            return True
        return self.args.logging_strategy == "steps" and update % self.state.logging_steps == 0

    def _load_callback_state(self) -> None:
        """--restore_callback_states_from_checkpoint: transformers' callbacks (early stopping's patience) as the
        checkpoint left them, each where it was in the list. Ours read the checkpoint's trainer state themselves
        where training begins, with this run's arguments: transformers' copies would take the checkpoint's (a
        longer --max_train_minutes lost) and move last, after the callbacks that must follow them."""
        before = list(self.callback_handler.callbacks)
        super()._load_callback_state()
        restored = {}
        for callback in self.callback_handler.callbacks:
            if not any(callback is kept for kept in before):
                restored.setdefault(type(callback), []).append(callback)
        own = (WallClock, EpochBatches, ContinuedFrom, SkippedBatches)
        self.callback_handler.callbacks = [
            callback
            if isinstance(callback, own) or not restored.get(type(callback))
            else restored[type(callback)].pop(0)
            for callback in before
        ]

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """`Trainer.train`; ``resume_from_checkpoint=True`` takes the newest *complete* checkpoint, a
        path is checked before anything is loaded, and a signal ends it with `TrainingInterrupted`.
        With ``ema_decay``, the model afterwards holds the moving average of its weights (save_model saves it)."""
        checkpoint = resolve_checkpoint(resume_from_checkpoint, self.args.output_dir)
        self.resumed_from = checkpoint
        if of_another_folder(checkpoint, self.args.output_dir) and self.args.should_save:  # `last` there finds it
            record_continuation(self.args.output_dir, checkpoint)
        if checkpoint is not None:
            check_checkpoint(checkpoint, self.args.ema_decay)
            finished = self._training_ended_at(checkpoint)
            if finished:  # the Trainer would run one more update before it looks
                return self._take_the_finished_checkpoint(checkpoint, finished)
        elif self.moving_average is not None:  # a new run (or a retry) averages its own updates only
            self.moving_average.reset()
        self.target_tokens.reset()  # a retry or another trial reports its own throughput, not the sum
        check_largest_batches_fit(self)  # --memory_probe: a batch that cannot fit fails now, not hours in
        with self.stop_on_signal.installed():
            result = super().train(None if checkpoint is None else str(checkpoint), *args, **kwargs)
        self.stop_on_signal.raise_if_stopped(self.state.global_step)
        warmup = getattr(self.lr_scheduler, "warmup_steps", None)
        if warmup is not None and self.state.global_step < warmup:  # e.g. a time budget ended it early
            logger.warning(
                f"Training stopped after {self.state.global_step} updates, inside the {warmup}-step warm-up (eq. 3): "
                f"the learning rate ended at {self.state.global_step / warmup:.0%} of its peak. Lower --warmup_steps "
                "(a number of updates, or a fraction of the updates planned by --max_steps or --num_train_epochs)."
            )
        if self.moving_average is not None:  # --ema_decay: what training made is the average
            self.moving_average.copy_to(self.accelerator.unwrap_model(self.model))
            logger.info(
                f"the model now holds the moving average of its weights over {self.moving_average.updates} "
                f"updates (decay {self.moving_average.decay:g}); the checkpoints hold the trained weights"
            )
        return result

    def _issue_warnings_after_load(self, load_result) -> None:
        """A checkpoint holds one shared matrix once (§3.4: source and target embeddings and the pre-softmax
        projection); its other names are aliases of a loaded parameter, tied again, not missing weights."""
        model = self.accelerator.unwrap_model(self.model)
        loaded = dict(model.named_parameters()).keys() | dict(model.named_buffers()).keys()
        aliases = set(model.state_dict()) - loaded
        missing = [key for key in load_result.missing_keys if key not in aliases]
        kept = type(load_result)(missing_keys=missing, unexpected_keys=load_result.unexpected_keys)  # a namedtuple
        super()._issue_warnings_after_load(kept)

    def _training_ended_at(self, checkpoint) -> str | None:
        """Why ``checkpoint`` ends the training these arguments ask for (its update reached --max_steps, or its
        minutes --max_train_minutes), or None: a run resumed from it (a requeued job whose evaluation was cut
        short) has nothing left to train. None too where it lacks the moving average --ema_decay needs."""
        path = Path(checkpoint) / TRAINER_STATE_NAME
        if not path.is_file() or (self.moving_average is not None and not (Path(checkpoint) / EMA_FILE).is_file()):
            return None
        state = TrainerState.load_from_json(str(path))
        if self.args.max_steps > 0 and state.global_step >= self.args.max_steps:
            return f"update {state.global_step}, --max_steps {self.args.max_steps}"
        trained = WallClock.trained_in(state)
        if self.args.max_train_minutes and trained is not None and trained >= self.args.max_train_minutes * 60:
            return f"{trained / 60:.2f} minutes trained, --max_train_minutes {self.args.max_train_minutes:g}"
        return None

    def _take_the_finished_checkpoint(self, checkpoint, why: str):
        """The model as training ended at ``checkpoint``: its weights (with --ema_decay, its moving average) and
        its trainer state, without another update."""
        logger.warning(f"{checkpoint} ends the training ({why}): nothing left to train, the model is its own")
        model = self.accelerator.unwrap_model(self.model)
        self.load_full_weights(type(model).from_pretrained(str(checkpoint)).state_dict())
        self.state = TrainerState.load_from_json(str(Path(checkpoint) / TRAINER_STATE_NAME))
        if self.continued_from is not None:  # the folders it trained in, for the final averaging
            self.continued_from.begin(self.args.output_dir, self.state, checkpoint)
        if self.moving_average is not None:
            self.moving_average.load(checkpoint)
            self.moving_average.copy_to(model)
        summary = self._end_of_training_entry(self.state.global_step)
        if summary is None:
            losses = [entry["loss"] for entry in self.state.log_history if "loss" in entry]
            logger.warning(
                f"{Path(self.args.output_dir) / TRAINER_STATE_NAME} holds no end-of-training entry for update "
                f"{self.state.global_step}: the train_* metrics of that training are not known to this run"
            )
            return TrainOutput(self.state.global_step, losses[-1] if losses else float("nan"), {})
        self.state.log_history.append(summary)  # save_state writes it back, as the finished run did
        metrics = {key: value for key, value in summary.items() if key != "step"}
        return TrainOutput(self.state.global_step, summary.get("train_loss", float("nan")), metrics)

    def _end_of_training_entry(self, global_step: int) -> dict | None:
        """The Trainer's end-of-training log entry (``train_runtime``, ``train_loss``, throughput...) for the training
        that ended at ``global_step``, from the trainer_state.json that run saved in --output_dir (the checkpoints
        are saved before it exists): only where that file's log begins with the finished checkpoint's (so it is
        the same run's), else None (that run did not get so far, or the file is another's or damaged)."""
        path = Path(self.args.output_dir) / TRAINER_STATE_NAME
        try:
            history = json.loads(path.read_text(encoding="utf-8")).get("log_history")
        except (OSError, ValueError, AttributeError):  # absent, unreadable, not JSON, not an object
            return None
        logged = self.state.log_history  # the finished checkpoint's, loaded from its trainer_state.json
        if not isinstance(history, list) or history[: len(logged)] != logged:
            return None
        ends = [
            entry
            for entry in history[len(logged) :]
            if isinstance(entry, dict) and "train_runtime" in entry and entry.get("step") == global_step
        ]
        return dict(ends[-1]) if ends else None

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        if self.args.lr_scheduler_type != "inverse_sqrt":
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            warmup = self.args.get_warmup_steps(num_training_steps)
            if warmup < 1:
                raise ValueError("Eq. (3) needs at least one warm-up step: set --warmup_steps >= 1.")
            if 0 < self.args.warmup_steps < 1 and self.args.max_train_minutes:
                logger.warning(
                    f"--warmup_steps {self.args.warmup_steps:g} is a share of the {num_training_steps} updates the run "
                    f"plans (--max_steps or --num_train_epochs): {warmup} updates of warm-up, which --max_train_minutes "
                    "may end long before. Give --warmup_steps as a number of updates."
                )
            if num_training_steps < warmup:
                logger.warning(
                    f"Training stops after {num_training_steps} updates, inside the {warmup}-step warm-up: the "
                    f"learning rate ends at {num_training_steps / warmup:.0%} of its peak. Lower --warmup_steps."
                )
            cooldown = None
            if self.args.cooldown_minutes:  # the last minutes of the budget decay eq. (3) to 0
                cooldown = partial(self._cooldown_factor, self.args.cooldown_minutes)
            self.lr_scheduler = noam_schedule(optimizer or self.optimizer, self._d_model, warmup, cooldown)
            # for the end of training's look back, where the plan did not say so already
            self.lr_scheduler.warmup_steps = warmup if num_training_steps >= warmup else None
            self._created_lr_scheduler = True
        return self.lr_scheduler

    @property
    def wall_clock(self) -> WallClock | None:
        """The run's `WallClock` (with --max_train_minutes or --save_minutes), as the callbacks hold it: the
        Trainer replaces it by a copy of its own when restoring callback states
        (--restore_callback_states_from_checkpoint)."""
        return next((c for c in self.callback_handler.callbacks if isinstance(c, WallClock)), None)

    def token_batches(self, lengths, max_tokens: int, **kwargs) -> TokenBatchSampler:
        """The run's token batches of ``lengths``: padded to bucket shapes where the run pads to them, none past
        the model's positions; training's and the memory probe's (`memory_check`) alike."""
        positions = self.accelerator.unwrap_model(self.model).config.max_position_embeddings
        return TokenBatchSampler(
            lengths, max_tokens, pad_to_buckets=pads_to_buckets(self.args), max_length=positions, **kwargs
        )

    def last_good_checkpoint(self) -> Path | None:
        """Where this run can continue from after it went wrong (`checkpointing.last_good_checkpoint`)."""
        return last_good_checkpoint(self.args.output_dir)

    @property
    def continued_from(self) -> ContinuedFrom | None:
        """The run's `ContinuedFrom`, as the callbacks hold it (a copy after --restore_callback_states_from_checkpoint)."""
        return next((c for c in self.callback_handler.callbacks if isinstance(c, ContinuedFrom)), None)

    def _cooldown_factor(self, cooldown_minutes: float) -> float:
        return self.wall_clock.cooldown_factor(cooldown_minutes)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        if "decoder_input_ids" not in inputs:
            inputs["decoder_input_ids"] = self.accelerator.unwrap_model(model).prepare_decoder_input_ids_from_labels(
                labels
            )
        if model.training and self.args.fused_loss != "none":  # levers.py: no full logits
            self.target_tokens.add(labels)
            # past the wrapper's forward, which accelerate wraps in the --bf16/--fp16 autocast: that autocast here
            with self.accelerator.autocast():
                loss = training_loss(
                    self.accelerator.unwrap_model(model),
                    inputs,
                    labels,
                    num_items_in_batch,
                    self.args.label_smoothing_factor,
                    self.args.fused_loss,
                    always_scale=self.args.sync_free_step,
                )
            loss = self._across_processes(loss, num_items_in_batch)
            return (loss, None) if return_outputs else loss
        outputs = model(**inputs, use_cache=False)  # teacher forcing needs no key/value cache, in training or not
        if not model.training:  # evaluation: the plain NLL, whose exp is the perplexity
            loss = self.evaluation_loss(outputs, labels)
            return (loss, outputs) if return_outputs else loss
        self.target_tokens.add(labels)
        loss = label_smoothed_cross_entropy(
            outputs.logits, labels, num_items_in_batch, self.args.label_smoothing_factor, self.args.sync_free_step
        )
        loss = self._across_processes(loss, num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def _across_processes(self, loss: torch.Tensor, num_items_in_batch) -> torch.Tensor:
        """A loss over all processes' target tokens (``num_items_in_batch``) times the processes: DDP averages the
        gradients over them, so the mean over every token is what comes out."""
        if num_items_in_batch is not None and self.args.average_tokens_across_devices:
            loss = loss * self.accelerator.num_processes
        return loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """The Trainer's, with the end of training's throughput from the sentences and target tokens trained on
        (the Trainer's counts updates times per_device_train_batch_size, which token batches ignore)."""
        if "train_runtime" in logs:  # every process logs it, at the end of train()
            add_throughput(logs, self.target_tokens, self.accelerator)
        super().log(logs, start_time)

    def evaluate(self, *args, **kwargs):
        """Seq2SeqTrainer's; an evaluation during training that a signal interrupts (`prediction_step`) ends
        at once, with no metrics, and the update it followed is saved before training stops (`StopOnSignal`),
        within a SIGTERM's grace budget rather than after the whole validation set."""
        try:
            return super().evaluate(*args, **kwargs)
        except EvaluationInterrupted:
            if not self.control.should_save:  # not a save the run makes anyway (the first of several eval sets
                self.resume_point_only = True  # asks for it; the next ones find it asked, and leave it so)
            self.control.should_save = True
            logger.warning(
                f"evaluation at update {self.state.global_step} stopped by the signal: saving, then stopping"
            )
            return {}

    def _interrupts_evaluation(self) -> bool:
        """Whether a signal caught during training (`StopOnSignal`, installed only then) ends this evaluation:
        not where the best model is chosen by its metrics, which an interrupted evaluation lacks."""
        stop = getattr(self, "stop_on_signal", None)
        return stop is not None and stop.training and not self.args.metric_for_best_model and stop._stop_requested()

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """Seq2SeqTrainer's, without its side effect on the model's generation config (it writes the
        library's fallback ``max_length=20`` there, which would then be saved with the model), and without the
        columns it pads every batch's hypotheses and labels with up to the generation config's ``max_length``
        (``max_position_embeddings`` as `save_pretrained` writes it: 1,024 a row, to be copied, gathered and
        decoded); the evaluation loop pads across batches itself."""
        if self._interrupts_evaluation():  # each batch, on every process alike
            raise EvaluationInterrupted
        if inputs.get("labels", 0) is None:  # DataCollatorForSeq2Seq's for a dataset without targets: none
            inputs = {name: value for name, value in inputs.items() if name != "labels"}
        unwrapped = self.accelerator.unwrap_model(model)
        if self.args.static_cache_decoding and self.args.predict_with_generate and not prediction_loss_only:
            # few batch shapes, one compiled graph each (translate --static-cache); the loss ignores the padding
            limit = unwrapped.config.max_position_embeddings
            inputs = padded_to_multiple(dict(inputs), STATIC_CACHE_MULTIPLE, limit, unwrapped.config.pad_token_id)
            given = gen_kwargs or getattr(self, "_gen_kwargs", {})  # Seq2SeqTrainer's, taken only where none is given
            gen_kwargs = {**given, "cache_implementation": "static"}
        saved = copy.deepcopy(unwrapped.generation_config)
        try:
            loss, generated, labels = super().prediction_step(
                model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs
            )
        finally:
            unwrapped.generation_config = saved
        if not self.args.predict_with_generate or prediction_loss_only:  # logits (or outputs), as the Trainer's
            return loss, generated, labels
        pad = unwrapped.config.pad_token_id
        return loss, without_padding_columns(generated, pad), without_padding_columns(labels, pad)

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        """The Trainer's, scoring each sentence once on several processes and able to run under FSDP
        without training first.

        - accelerate pads the last batches with repeated sentences so that every process gets one;
          ``gather_for_metrics`` drops them again. Seq2SeqTrainer gathers with plain ``gather`` instead
          (transformers #27025: ``gather_for_metrics`` counts sentences and would cut the extra rows
          of ``num_return_sequences > 1``), which keeps the repeats in BLEU, ``gen_len`` and the
          predictions. With one hypothesis per sentence, ``gather_for_metrics`` is exact, and is used.
        - Without training, the Trainer would prepare the model alone, which accelerate refuses for
          FSDP 2 ("a model and optimizer must be passed together"). A model that only evaluates needs
          no shards (every process holds it whole): it is prepared for evaluation, as without FSDP,
          and moved to the process's device (under FSDP neither the Trainer nor accelerate moves it).
        - The loss is `EvaluationLoss`'s: per target token of the whole set, each sentence once.
        """
        if self.is_fsdp_enabled and not self.accelerator._models:
            self.accelerator.prepare_model(self.model, device_placement=True, evaluation_mode=True)
        if self.args.static_cache_decoding:  # a compiled graph per batch shape: at most one a batch
            allow_recompiles(len(dataloader))
        if not self.args.predict_with_generate or self._sequences_per_input() == 1:
            self.gather_function = partial(
                self.accelerator.gather_for_metrics, use_gather_object=self.args.eval_use_gather_object
            )
        sampler, metric = length_sorted_sampler(dataloader), self.compute_metrics
        if sampler is not None and metric is not None:  # compute_metrics sees the dataset's order too
            self.compute_metrics = lambda prediction: metric(
                EvalPrediction(
                    *(sampler.restore_order(part) for part in (prediction.predictions, prediction.label_ids)),
                    inputs=sampler.restore_order(prediction.inputs),
                    losses=sampler.restore_order(prediction.losses),
                )
            )
        try:
            with self.evaluation_loss.counting():
                output = super().evaluation_loop(  # which sets gather_for_metrics again at its end
                    dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
                )
        finally:
            self.compute_metrics = metric
        if sampler is not None:  # predictions in the dataset's order
            output = EvalLoopOutput(
                predictions=sampler.restore_order(output.predictions),
                label_ids=sampler.restore_order(output.label_ids),
                metrics=output.metrics,
                num_samples=output.num_samples,
            )
        if f"{metric_key_prefix}_loss" in output.metrics:  # the Trainer's: a mean of per-batch means
            output.metrics[f"{metric_key_prefix}_loss"] = self.evaluation_loss.per_token()
        return output

    def _sequences_per_input(self) -> int:
        """``num_return_sequences`` of the generation that evaluate() or predict() is about to run."""
        gen_kwargs = getattr(self, "_gen_kwargs", None) or {}
        config = gen_kwargs.get("generation_config") or self.accelerator.unwrap_model(self.model).generation_config
        return gen_kwargs.get("num_return_sequences") or getattr(config, "num_return_sequences", None) or 1

    def create_model_card(self, *args, tags=None, tasks=None, **kwargs):
        """The Trainer's card, naming the task and this package (the model's tags) unless told otherwise."""
        model_tags = self.accelerator.unwrap_model(self.model).model_tags or []
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        return super().create_model_card(
            *args, tags=tags + [t for t in model_tags if t not in tags], tasks=tasks or "translation", **kwargs
        )

    def _get_eval_sampler(self, eval_dataset):
        """With `sorts_evaluation` (``--eval_order``), evaluation and prediction decode the sentences sorted
        by length (`LengthSortedSampler`), as `translate` does: a batch of generate() pads its sentences to
        similar lengths, and its hypotheses end together. `evaluation_loop` returns predictions and labels in
        the dataset's order, as the Trainer's order would. The Trainer's order where the rows are not one per
        sentence (several hypotheses per sentence, batches not concatenated), where metrics are computed per
        batch or the last batch is dropped (which would drop the longest sentences), or the examples have no
        ``input_ids``."""
        lengths = evaluation_lengths(eval_dataset) if sorts_evaluation(self.args) else None
        one_row_each = not self.args.predict_with_generate or self._sequences_per_input() == 1
        whole_set = self.args.eval_do_concat_batches and not self.args.batch_eval_metrics
        if lengths is None or not one_row_each or not whole_set or self.args.dataloader_drop_last:
            if lengths is not None and self.args.eval_order == "length":  # asked for by name: say why not
                reason = (
                    "several hypotheses a sentence (num_return_sequences)"
                    if not one_row_each
                    else "metrics per batch, or batches kept apart"
                    if not whole_set
                    else "--dataloader_drop_last"
                )
                logger.warning(f"--eval_order length: decoding in the dataset's order instead, because of {reason}")
            return super()._get_eval_sampler(eval_dataset)
        return LengthSortedSampler(lengths)

    def get_eval_dataloader(self, eval_dataset=None) -> DataLoader:
        return signals_to_the_main_process(super().get_eval_dataloader(eval_dataset))

    def get_test_dataloader(self, test_dataset) -> DataLoader:
        return signals_to_the_main_process(super().get_test_dataloader(test_dataset))

    def get_train_dataloader(self) -> DataLoader:
        """Token-count batches (§5.1) when ``max_tokens`` is set (`TokenBatchSampler`), padded to bucket shapes
        where `pads_to_buckets`; accelerate deals them out to the processes."""
        if not self.args.max_tokens:
            return check_accumulation(signals_to_the_main_process(super().get_train_dataloader()), self.args)
        import datasets

        dataset, collator = self.train_dataset, self.data_collator
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise ValueError(
                f"--max_tokens {self.args.max_tokens}: token batches group sentences of similar length from the "
                "whole training set, which a streamed (iterable) dataset does not hold; give --max_tokens 0 with "
                "--per_device_train_batch_size for sentence batches, or a map-style dataset."
            )
        lengths = example_lengths(dataset)  # before the length columns are removed
        if isinstance(dataset, datasets.Dataset):
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        # One process's view of all batches; accelerate deals them out to the processes (disjoint).
        seed = self.args.seed if self.args.data_seed is None else self.args.data_seed  # as the Trainer's samplers
        sampler = self.token_batches(lengths, self.args.max_tokens, shuffle=True, seed=seed)
        if self.args.torch_compile and sampler.pad_to_buckets:  # a graph per shape: room for all (torch keeps 8)
            allow_recompiles(len(np.unique(sampler.shapes, axis=0)))
        if sampler.pad_to_buckets:
            pad_token_id = self.accelerator.unwrap_model(self.model).config.pad_token_id
            collator = PadToBucket(collator, pad_token_id, sampler.longest, sampler.bucket_width)  # few shapes
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
            persistent_workers=self.args.dataloader_persistent_workers,
            prefetch_factor=self.args.dataloader_prefetch_factor,
            # flags of newer transformers releases, as the Trainer's own loaders take them
            multiprocessing_context=getattr(self.args, "dataloader_multiprocessing_context", None),
            in_order=getattr(self.args, "dataloader_in_order", True),
            worker_init_fn=seeded_worker_start(self.args.dataloader_num_workers, self.args.process_index),
        )
        loader = check_accumulation(self.accelerator.prepare(loader), self.args)
        self.token_sampler, self.token_batches_per_epoch = sampler, len(loader)  # for `SamplerEpoch`
        return loader

    # -----------------------------------------------------------------------------------------
    # Sharded models (FSDP): checkpoints and the final model stay Hub folders
    # -----------------------------------------------------------------------------------------

    def load_full_weights(self, state_dict: dict) -> None:
        """Put full (unsharded) weights, e.g. the average of checkpoints, into the trained model; every
        process calls it with the same ``state_dict``."""
        model = self.accelerator.unwrap_model(self.model)
        if not self.is_fsdp_enabled:
            model.load_state_dict(state_dict)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        # The sharded model lists the tied matrix (§3.4) under one name; its other names would arrive as
        # plain tensors to be copied into sharded ones, so they are left out (and come back tied).
        own = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
        aliases = set(state_dict) - own
        result = set_model_state_dict(
            model,
            {name: value for name, value in state_dict.items() if name in own},
            options=StateDictOptions(full_state_dict=True, strict=False),
        )
        if missing := set(result.missing_keys) - aliases:
            raise ValueError(f"The weights to load have no {sorted(missing)}.")

    def model_for_one_process(self):
        """The trained model, whole, for work that only the main process does (translating the test set).

        Every process must call it: a model FSDP has sharded (for training) is gathered (a collective)
        into a plain copy on the main process (None elsewhere); otherwise it is the unwrapped model itself.
        """
        model = self.accelerator.unwrap_model(self.model)
        if not is_sharded(model):  # also under FSDP, a model that has only evaluated
            return model
        state_dict = self.accelerator.get_state_dict(self.model)
        return plain_copy(model, state_dict) if self.is_world_process_zero() else None


# ---------------------------------------------------------------------------------------------
# The evaluation loss: every target token of the set once, however the sentences fall into batches
# ---------------------------------------------------------------------------------------------


class EvaluationLoss:
    """The negative log-likelihood per target token over a whole evaluation set; exp of it is the perplexity.

    The Trainer reports the mean of per-batch means, each weighted by ``per_device_eval_batch_size``, so a
    short last batch counts as a full one, and on several processes the sentences accelerate repeats to
    fill the last batches count too: the same model and sentences give another eval_loss with another
    batch layout. Here each batch's per-sentence sums and token counts are gathered with
    ``gather_for_metrics``, which drops the repeats, and summed over the set.

    Called as Seq2SeqTrainer calls its ``label_smoother``, ``(outputs, labels)``; it returns the batch's
    per-token NLL, and while `counting` it also adds the batch to the set's sums (a collective: every
    process calls it once a batch, as the evaluation loop does).
    """

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.nll, self.tokens, self.active = 0.0, 0, False

    @contextmanager
    def counting(self):
        self.nll, self.tokens, self.active = 0.0, 0, True
        try:
            yield self
        finally:
            self.active = False

    def __call__(self, outputs, labels: torch.Tensor, **_) -> torch.Tensor:
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        labels = labels.to(logits.device)
        # label_smoothed_cross_entropy with a count of 1 is the sum over one sentence's tokens
        sums = torch.stack(
            [label_smoothed_cross_entropy(row, row_labels, 1) for row, row_labels in zip(logits, labels)]
        )
        tokens = (labels != -100).sum(-1)
        if self.active:
            gathered = self.accelerator.gather_for_metrics(torch.stack([sums.float(), tokens.float()], dim=-1))
            gathered = gathered.cpu().double()  # summed in float64 on the CPU (MPS has no float64)
            self.nll += gathered[:, 0].sum().item()
            self.tokens += int(gathered[:, 1].sum().item())
        return sums.sum() / tokens.sum().clamp(min=1)

    def per_token(self) -> float:
        return self.nll / self.tokens if self.tokens else float("nan")


# ---------------------------------------------------------------------------------------------
# Precision and sharding that accelerate would silently not apply
# ---------------------------------------------------------------------------------------------


def evaluation_lengths(dataset) -> np.ndarray | None:
    """Source (and, where labelled, target) lengths of an evaluation set, at least 1 (they only order it),
    or None where its examples have no ``input_ids``."""
    import datasets

    if isinstance(dataset, datasets.Dataset):
        present = set(dataset.column_names)
    elif isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        return None
    else:
        dataset = [dataset[index] for index in range(len(dataset))]
        if not all(isinstance(example, Mapping) for example in dataset):
            return None
        present = set.intersection(*(set(example) for example in dataset)) if dataset else set()
    if "input_ids" not in present:
        return None
    lengths = list_lengths(dataset, [name for name in ("input_ids", "labels") if name in present])
    return np.maximum(lengths if lengths.shape[1] == 2 else lengths[:, 0], 1)  # (source, target) or source


def check_accumulation(loader: DataLoader, args) -> DataLoader:
    """An update sums ``--gradient_accumulation_steps`` batches of one epoch: an epoch with fewer batches per
    process would make every update smaller than asked (the Trainer updates at the epoch's end), so it is
    refused before the first update."""
    if not has_length(loader):  # a streamed data set: the Trainer runs --max_steps updates, epochs unknown
        return loader
    batches, accumulation = len(loader), args.gradient_accumulation_steps
    if batches < accumulation:
        unit = f"token batches of --max_tokens {args.max_tokens}" if args.max_tokens else "batches"
        raise TooFewBatches(
            f"--gradient_accumulation_steps {accumulation} asks for more batches per update than an epoch holds: "
            f"{batches} {unit} per process ({args.world_size} process(es)), so every update would sum {batches}. "
            f"Give --gradient_accumulation_steps {batches} or less, or more training data."
        )
    return loader


def length_sorted_sampler(loader) -> LengthSortedSampler | None:
    """The `LengthSortedSampler` under a DataLoader (accelerate wraps its batch sampler), or None."""
    found = [loader]
    for _ in range(4):
        found = [getattr(item, name, None) for item in found for name in ("batch_sampler", "sampler")]
        for item in found:
            if isinstance(item, LengthSortedSampler):
                return item
        found = [item for item in found if item is not None]
    return None


def refuse_ignored_precision_or_sharding(args, accelerator, is_fsdp_enabled: bool) -> None:
    """Refuse --fp16 and an FSDP launch where accelerate would quietly train in float32 / with DDP, and
    --ema_decay under FSDP (the moving average is of whole parameters, FSDP gives each process a shard).

    accelerate 1.15 enables float16 autocast and its loss scaler only on accelerators (on the CPU its
    Accelerator keeps ``native_amp=False``), and it selects FSDP only for GPU-like process groups
    (on the CPU the processes stay MULTI_CPU, i.e. DDP). Either way the run would not be what was asked.
    """
    if args.fp16 and not accelerator.native_amp:
        raise ValueError(fp16_refusal(accelerator.device.type))
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and not is_fsdp_enabled:
        raise ValueError(
            f"Launched with an FSDP config, but accelerate does not shard on {accelerator.device.type} (it would run "
            "plain data parallel): use the ddp config ($(vanilla-transformer config ddp)) on the CPU, or run FSDP on "
            "GPUs."
        )
    if is_fsdp_enabled and args.ema_decay:
        raise ValueError(
            f"--ema_decay {args.ema_decay} is not supported under FSDP (each process holds a shard of the "
            "weights): use --average_checkpoints N, or launch with the ddp config "
            "($(vanilla-transformer config ddp))."
        )
