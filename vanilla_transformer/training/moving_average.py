"""An exponential moving average of the weights, updated after every update: §6.1's checkpoint
averaging taken to its limit (Polyak & Juditsky, 1992; Marian's ``--exponential-smoothing``).

Averaging the last checkpoints (`averaging`) sees the model only where a checkpoint happened to be
written: in a short run at a high learning rate, where the last checkpoints fall moves the averaged
model's BLEU by up to a point (README, "Multi30k"). This average sees every update instead. After
update t it holds the weighted mean of all the weights so far, the weights of update k weighing
``decay ** (t - k)``:

    average_t = sum_k decay^(t-k) * weights_k / sum_k decay^(t-k)

kept in float32 by one ``lerp`` per update, ``average += r_t * (weights_t - average)`` with
``r_t = (1 - decay) / (1 - decay^t)`` (``r_1 = 1``: no start value to forget, as Adam's bias
correction). The mean age of what it averages is about ``decay / (1 - decay)`` updates: 0.998 averages
the last ~500 updates, as linearly weighted checkpoints a minute apart over the last 10 minutes of a
run of ~170 updates a minute do. It costs one float32 copy of the parameters and, at d_model 256 on
2 CPU cores, 2.6 ms an update (about 0.25% of a training step).

With `TransformerTrainer` (``--ema_decay``), the average is written into every checkpoint
(``ema.safetensors``, unless ``--save_only_model``; a resumed run goes on averaging from where it
stopped; a checkpoint saved after SIGTERM may leave it out for lack of time, and a run resumed from
that one starts the average again, saying so), and ``train()`` ends by putting it into the model,
which ``save_model`` then saves; checkpoints themselves hold the trained weights, as always, and so
do evaluations during training.
With another Trainer the callback averages alike, but saving and loading the average are yours
(`save`, `load`, `copy_to`). An update the float16 loss scaler skips still counts as one (the
weights are then folded in twice), which at a decay near 1 is negligible.

    ema = ExponentialMovingAverage(decay=0.998)
    trainer.add_callback(ema)          # TransformerTrainer(args with ema_decay=0.998) does this itself
    trainer.train()
    ema.copy_to(trainer.model)
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import TrainerCallback

from ..checkpoint_files import EMA_FILE, left_out
from ..private_api import require
from .divergence import refuse_non_finite

# The moving average's update is one fused call of this (private: checked at import)
require("torch._foreach_lerp_")


logger = logging.getLogger(__name__)


class ExponentialMovingAverage(TrainerCallback):
    """A float32 moving average of a model's trainable parameters, updated at every optimizer step."""

    def __init__(self, decay: float):
        check_decay(decay)
        if decay == 0:
            raise ValueError("--ema_decay 0 averages nothing (the last weights alone): leave the callback out.")
        self.decay = decay
        self.updates = 0
        self.average: dict[str, torch.Tensor] = {}
        self._lists = None  # (model, averages, its parameters, all float32) in one order, for the fused update

    @staticmethod
    def _parameters(model) -> dict[str, torch.Tensor]:
        return {name: p for name, p in model.named_parameters() if p.requires_grad}  # a tied matrix once (§3.4)

    @property
    def nbytes(self) -> int:
        """The size of the average on disk (float32), to tell whether writing it fits a time budget."""
        return sum(t.numel() * t.element_size() for t in self.average.values())

    def reset(self) -> None:
        """Forget every update: the next one starts a new average."""
        self.updates, self.average, self._lists = 0, {}, None

    @torch.no_grad()
    def update(self, model) -> None:
        """Fold the model's current weights into the average (after an optimizer step).

        The (average, parameter) pairs are listed once per model, start and load: the optimizer updates
        the same parameters in place, so the lists stay true and an update is one fused lerp."""
        parameters = self._parameters(model) if self._lists is None or self._lists[0] is not model else None
        self.updates += 1
        if self.updates == 1:  # r_1 = 1: the first average is the weights themselves
            self.average = {name: p.detach().to(torch.float32, copy=True) for name, p in parameters.items()}
            self._lists = None
            return
        if parameters is not None:
            self._check_names(parameters)
            for name, p in parameters.items():  # loaded from a checkpoint: to where the parameter lives
                self.average[name] = self.average[name].to(p.device)
            weights = [p.detach() for p in parameters.values()]
            fused = all(weight.dtype == torch.float32 for weight in weights)
            self._lists = (model, [self.average[name] for name in parameters], weights, fused)
        _, averages, weights, fused = self._lists
        rate = (1 - self.decay) / (1 - self.decay**self.updates)
        if fused:
            torch._foreach_lerp_(averages, weights, rate)  # fused over all tensors, no Python loop per parameter
        else:  # bfloat16 weights: one float32 copy at a time
            for average, weight in zip(averages, weights):
                average.lerp_(weight.float(), rate)

    def _check_names(self, parameters: dict) -> None:
        if set(parameters) != set(self.average):
            raise ValueError(
                f"The model's parameters {sorted(set(parameters) ^ set(self.average))} are not in both "
                "the model and its moving average: was the average loaded from another model?"
            )

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step > self.updates and self.average:  # loaded: it began anew after a checkpoint without it
            logger.info(
                f"Training resumes at update {state.global_step} with the moving average of the weights of the "
                f"last {self.updates} (it began anew after a checkpoint saved without it): it goes on from there."
            )
        elif state.global_step > self.updates:
            logger.warning(
                f"Training resumes at update {state.global_step}, but the moving average of the weights has "
                f"seen {self.updates}: it starts again from here. TransformerTrainer saves the average in "
                f"each checkpoint ({EMA_FILE}) and loads it on resuming; with another Trainer, load it "
                "yourself (ExponentialMovingAverage.load)."
            )

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.update(model)

    @torch.no_grad()
    def copy_to(self, model) -> None:
        """Put the average into the model's parameters (cast to their dtype)."""
        if not self.average:
            raise RuntimeError("The moving average has seen no update yet: train first.")
        parameters = self._parameters(model)
        self._check_names(parameters)
        for name, p in parameters.items():
            p.copy_(self.average[name])

    # -- in checkpoints, so that a resumed run averages on ----------------------------------------

    def save(self, folder: str | Path) -> None:
        refuse_non_finite(self.average, f"the moving average of the weights for {folder}")
        metadata = {"decay": repr(self.decay), "updates": str(self.updates)}
        save_file({name: t.contiguous() for name, t in self.average.items()}, str(Path(folder) / EMA_FILE), metadata)

    @classmethod
    def from_checkpoint(cls, folder: str | Path) -> ExponentialMovingAverage:
        """The average a checkpoint holds, with the decay it was trained with: to score the averaged model at
        that update, ``copy_to`` a model loaded from the same folder."""
        path = Path(folder) / EMA_FILE
        if not path.is_file():
            raise ValueError(
                f"{folder} holds no moving average ({EMA_FILE}): it was trained without --ema_decay "
                "(or saved with --save_only_model, or after SIGTERM without time for it: left_out.json)."
            )
        average = cls(float(_metadata(path)["decay"]))
        average.load(folder)
        return average

    def load(self, folder: str | Path) -> None:
        """The average saved in ``folder``, refused if it has another decay; on the CPU until the next update
        moves each tensor to its parameter's device."""
        path = Path(folder) / EMA_FILE
        check_checkpoint(folder, self.decay)
        self.updates = int(_metadata(path)["updates"])
        self.average, self._lists = load_file(str(path)), None


def check_decay(decay: float) -> None:
    """0 <= decay < 1; 0, whose average is the last weights alone, stands for no moving average."""
    if not 0 <= decay < 1:
        raise ValueError(
            f"--ema_decay must be at least 0 and below 1, got {decay}; 0.998 averages about the last "
            "500 updates, 0 turns the average off."
        )


def check_checkpoint(folder: str | Path, decay: float) -> None:
    """Refuse to resume ``folder`` with ``--ema_decay decay`` unless it holds a moving average of that decay
    (and refuse one that holds an average when none is asked for (0), which would silently drop it)."""
    path = Path(folder) / EMA_FILE
    if not decay:
        if path.is_file():
            decay = float(_metadata(path)["decay"])
            raise ValueError(
                f"{folder} holds a moving average of the weights ({EMA_FILE}): resume it with "
                f"--ema_decay {decay}, or the average would be dropped (to drop it on purpose, delete "
                f"{path})."
            )
        return
    if not path.is_file() and EMA_FILE in left_out(folder):
        logger.warning(
            f"{folder} was saved after SIGTERM without its moving average of the weights ({EMA_FILE}: "
            f"{left_out(folder)[EMA_FILE]}): the average starts again from its update, so the final "
            "model averages the updates from there on."
        )
        return
    if not path.is_file():
        raise ValueError(
            f"--ema_decay {decay}: {folder} holds no moving average ({EMA_FILE}); it was trained "
            "without --ema_decay (or saved with --save_only_model). Resume without the flag, or start a "
            "new run."
        )
    stored = float(_metadata(path)["decay"])
    if stored != decay:
        raise ValueError(
            f"--ema_decay {decay}: {path} averages with decay {stored}; resume with --ema_decay {stored} "
            "(a moving average cannot change its decay half-way)."
        )


def _metadata(path: Path) -> dict[str, str]:
    """The decay and update count the average was saved with."""
    try:
        with safe_open(str(path), framework="pt") as file:
            metadata = file.metadata() or {}
        if not {"decay", "updates"} <= metadata.keys():
            raise KeyError("no decay and update count in its metadata")
        return metadata
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same advice
        raise ValueError(
            f"{path} is not a moving average written by --ema_decay ({error}); delete it, or resume "
            "from another checkpoint."
        ) from error


__all__ = ["EMA_FILE", "ExponentialMovingAverage", "check_checkpoint", "check_decay"]
