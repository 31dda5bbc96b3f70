"""A run whose loss or gradients stop being finite ends at once, says so in one line, and saves nothing of it.

A learning rate too high for the batch, a float16 overflow or a bad batch can turn the loss into
``nan`` or ``inf``; the optimizer then writes ``nan`` into the weights, and every later update,
checkpoint and moving average inherits them. fairseq stops with a ``FloatingPointError``
("Minimum loss scale reached", NaN gradients) and never saves such weights; so does this module.

Checking a value on the host costs a synchronisation with the device, which at every update would
stall a GPU run. So nothing is read per update: `DivergenceGuard` keeps, on the device, from values
the Trainer computes anyway (each micro-batch's loss, the gradient norm where it is measured: with
clipping, or without it on logged updates only, so that a non-finite gradient is otherwise seen in the
next update's loss), whether every update so
far was finite, the last finite one and the first that was not. It reads that record (one
synchronisation) only where the Trainer reads values itself: at logging, evaluation and saving steps
and at the end of training; before a checkpoint is written, the checkpoint policy
(`checkpointing.CheckpointPolicy`) has it check the weights and the moving average (``--ema_decay``)
too, and refuses non-finite weights to ``save_model``. Detection therefore comes at the next of
those steps, never after a save.

With float16's loss scaler, an update whose gradients overflow is skipped by the scaler, which then
lowers the scale: that is normal, and counted in the log (``skipped_updates``). The run has diverged
only when the scale falls below `MIN_LOSS_SCALE`, fairseq's ``--min-loss-scale``: the loss then
overflows at any scale.

`TrainingDiverged` is the error: a ``FloatingPointError`` whose message is one line naming the update,
the last finite loss, the likely causes and the last good checkpoint, which is left as it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from transformers import TrainerCallback

from ..private_api import require

# DivergenceGuard overrides these Trainer internals (private: checked at import)
require("transformers.Trainer._save", "transformers.Trainer._save_checkpoint")

MIN_LOSS_SCALE = 1e-4  # fairseq's --min-loss-scale: below it, the loss overflows float16 at any scale
CAUSES = (
    "Likely causes: too high a learning rate (lower --learning_rate or --lr_scale, or give more "
    "--warmup_steps), a float16 overflow (train with --bf16 or in float32), or a bad batch."
)


class TrainingDiverged(FloatingPointError):
    """Training produced a non-finite loss, gradient or weight; nothing from that update on was saved."""

    def __init__(self, message: str, update: int | None = None, last_finite_loss: float | None = None):
        self.update, self.last_finite_loss = update, last_finite_loss
        super().__init__(message)


def resume_hint(checkpoint) -> str:
    """The end of a divergence message: where to continue from, ``checkpoint`` (the run's last complete one, as
    `checkpointing.last_good_checkpoint` finds it), or None where there is none."""
    if checkpoint is None:
        return "No checkpoint was saved before it: start again once the cause is fixed."
    return (
        f"The last good checkpoint, {checkpoint}, is intact; --resume_from_checkpoint {checkpoint} continues "
        "from it with its own learning rate and batch order, so for a lower learning rate start a new run."
    )


def finite_flags(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """One flag per tensor, on the device of the first: whether it holds no nan and no inf."""
    device = next(iter(tensors.values())).device
    return torch.stack([torch.isfinite(_local(tensor)).all().to(device) for tensor in tensors.values()])


def non_finite(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The names of the tensors holding a nan or an inf (one synchronisation for all of them)."""
    if not tensors:
        return []
    return [name for name, finite in zip(tensors, finite_flags(tensors).tolist()) if not finite]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of a sharded (FSDP) tensor; the tensor itself otherwise."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def refuse_non_finite(tensors: dict[str, torch.Tensor], what: str, hint: Callable[[], str] | None = None) -> None:
    """Raise `TrainingDiverged` instead of writing ``what`` when one of ``tensors`` is not finite; ``hint``: the
    message's end, where to continue from (`resume_hint`), asked for only then."""
    if bad := non_finite(tensors):
        raise TrainingDiverged(
            f"Training diverged: {what} holds non-finite values ({len(bad)} of {len(tensors)} tensors, e.g. {bad[0]}), "
            f"so it was not written. {CAUSES} {hint() if hint else ''}".rstrip()
        )


class DivergenceGuard(TrainerCallback):
    """Records, on the device, whether each update's loss and gradient norm were finite; reads the record
    (one synchronisation) at logging, evaluation and saving steps and at the end, and raises
    `TrainingDiverged` there. `StopOnDivergence` feeds it the losses and gradient norms."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.skipped = 0  # updates the float16 loss scaler skipped (it knows on the host anyway)
        self.loss = None  # this update's loss, summed over its micro-batches (on the device)
        self.grad_norm = None
        self._checked_step = None

    # -- fed by the trainer, on the device ------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        device, self.skipped = args.device, 0
        self.loss = torch.zeros((), device=device)
        self.grad_norm = None
        self.updates = torch.full((), float(state.global_step), device=device)  # float32: exact to 2^24 updates
        self.clean = torch.ones((), dtype=torch.bool, device=device)  # every update so far finite
        self.last_good = torch.full((3,), float(state.global_step), device=device)  # (update, loss, grad norm)
        self.last_good[1:] = math.nan
        self.first_bad = torch.zeros(3, device=device)
        self._checked_step = state.global_step

    def add_loss(self, loss: torch.Tensor) -> None:
        if self.loss is not None:
            self.loss += loss.detach().float().sum()

    def add_grad_norm(self, grad_norm) -> None:
        if isinstance(grad_norm, torch.Tensor) and not hasattr(grad_norm, "to_local"):  # not an FSDP shard's
            self.grad_norm = grad_norm.detach().float()

    def on_step_end(self, args, state, control, **kwargs):
        self._fold_update()
        if control.should_log or control.should_evaluate or control.should_save or control.should_training_stop:
            self.check(state.global_step)
        return control

    def _fold_update(self) -> None:
        """One update into the record, without reading anything back from the device."""
        if self.loss is None:
            return
        self.updates += 1
        if self.trainer.accelerator.optimizer_step_was_skipped:  # the loss scaler's skip: normal (a host flag)
            self.skipped += 1
        else:
            norm = self.grad_norm if self.grad_norm is not None else torch.zeros_like(self.loss)
            record = torch.stack([self.updates, self.loss, norm.to(self.loss.device)])
            finite = torch.isfinite(record).all()
            self.first_bad = torch.where(self.clean & ~finite, record, self.first_bad)
            self.clean = self.clean & finite
            self.last_good = torch.where(self.clean, record, self.last_good)
        self.loss.zero_()
        self.grad_norm = None

    def on_epoch_end(self, args, state, control, **kwargs):
        if control.should_log or control.should_evaluate or control.should_save:
            self.check(state.global_step)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.check(state.global_step)
        return control

    # -- read back: one synchronisation -----------------------------------------------------------

    def check(self, step: int, weights: dict[str, torch.Tensor] | None = None) -> None:
        """Raise `TrainingDiverged` if an update since training began was not finite (every process calls it).

        ``weights``: also check these tensors (the model's and the moving average's, before a save).
        """
        if self.loss is None or (weights is None and step == self._checked_step):
            return
        self._checked_step = step
        weights_finite = finite_flags(weights).all().to(self.loss.device) if weights else torch.ones_like(self.clean)
        local = torch.cat([self.clean.float()[None], self.last_good, self.first_bad, (~weights_finite).float()[None]])
        accelerator = self.trainer.accelerator
        rows = accelerator.gather(local[None]) if accelerator.num_processes > 1 else local[None]
        rows = rows.cpu().tolist()  # the one synchronisation
        clean = all(row[0] for row in rows)
        last_update, last_loss = int(rows[0][1]), sum(row[2] for row in rows) / len(rows)  # loss: processes' mean
        scale = accelerator.scaler.get_scale() if accelerator.scaler is not None else None
        if clean and scale is not None and scale < MIN_LOSS_SCALE:
            raise TrainingDiverged(
                f"Training diverged at update {step}: the float16 loss scale fell to {scale:g}, below "
                f"{MIN_LOSS_SCALE:g}, after {self.skipped} skipped updates: the loss overflows float16 at any scale "
                f"({self._last_finite(last_update, last_loss)}). {CAUSES} {self._checkpoint()}",
                step,
                last_loss,
            )
        if not clean:
            bad = min((row for row in rows if not row[0]), key=lambda row: row[4])
            update, loss, norm = int(bad[4]), bad[5], bad[6]
            what = (
                f"the loss is {loss:g}"
                if not math.isfinite(loss)
                else f"the gradient norm is {norm:g} (loss {loss:.4g})"
            )
            raise TrainingDiverged(
                f"Training diverged at update {update}: {what} ({self._last_finite(last_update, last_loss)}). "
                f"{CAUSES} Nothing from update {update} on was saved. {self._checkpoint()}",
                update,
                last_loss,
            )
        if any(row[-1] for row in rows):
            name = next(iter(non_finite(weights)), "on another process") if weights else "on another process"
            raise TrainingDiverged(
                f"Training diverged by update {step}: the weights hold non-finite values (e.g. {name}) although every "
                f"loss, and every gradient norm measured, was finite ({self._last_finite(last_update, last_loss)}). {CAUSES} Nothing "
                f"from update {step} was saved. {self._checkpoint()}",
                step,
                last_loss,
            )

    def _checkpoint(self) -> str:
        last_good = getattr(self.trainer, "last_good_checkpoint", None)  # TransformerTrainer's
        return resume_hint(last_good()) if last_good else ""

    @staticmethod
    def _last_finite(update: int, loss: float) -> str:
        if math.isnan(loss):
            return "no update of this run had a finite loss"
        return f"last finite loss {loss:.4g}, at update {update}"


class StopOnDivergence:
    """Trainer mixin: feeds ``self.divergence`` (a `DivergenceGuard` among the callbacks) each micro-batch's
    loss and each update's gradient norm. ``self.divergence = None`` turns it off. The checkpoint policy
    (`checkpointing.CheckpointPolicy`) asks it, before anything is written, whether the run is still finite."""

    divergence: DivergenceGuard | None = None

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        if self.divergence is not None:
            self.divergence.add_loss(loss)
        return loss

    def _get_grad_norm(self, *args, **kwargs):
        grad_norm = super()._get_grad_norm(*args, **kwargs)
        if self.divergence is not None:
            self.divergence.add_grad_norm(grad_norm)
        return grad_norm

    def log(self, logs: dict, *args, **kwargs) -> None:
        if self.divergence is not None and "loss" in logs and self.accelerator.scaler is not None:
            logs["skipped_updates"] = self.divergence.skipped  # float16: updates whose gradients overflowed
        super().log(logs, *args, **kwargs)


__all__ = ["MIN_LOSS_SCALE", "DivergenceGuard", "StopOnDivergence", "TrainingDiverged", "refuse_non_finite"]
