"""Checkpoints that survive crashes, full disks and Ctrl-C; which checkpoint to resume from.

transformers' Trainer writes ``checkpoint-<step>`` in place, file after file, and picks the
highest step to resume from. A run killed while it writes (``kill -9``, an out-of-memory kill, a
power cut) leaves a half-written folder with the highest step, which ``resume`` would then take.
Here:

- `AtomicCheckpoints` (a Trainer mixin) writes each checkpoint under ``_checkpoint_in_progress/``,
  flushes it to disk and renames it to ``checkpoint-<step>`` only when every file is written; older
  checkpoints are deleted (``save_total_limit``) only after that. A failed write (a full disk)
  removes the partial folder and raises `CheckpointWriteError`, which names the folder, the free
  space and the checkpoint that is still intact.
- `last_complete_checkpoint` skips (and names in the log) any ``checkpoint-<step>`` that is
  incomplete, e.g. one written in place by an older version or another tool.
- `StopOnSignal` (a callback) turns Ctrl-C (SIGINT) or SIGTERM into "finish this update, save a
  checkpoint, stop"; the trainer then raises `TrainingInterrupted`, which says where the checkpoint is.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from ..checkpoint_files import check_json, check_model_folder, check_torch_archive
from ..private_api import require

# AtomicCheckpoints overrides these Trainer internals: fail at import, naming the versions, where they are gone
require("transformers.Trainer._save_checkpoint", "transformers.Trainer._get_output_dir",
        "transformers.Trainer._push_from_checkpoint")

logger = logging.getLogger(__name__)

STAGING_DIR = "_checkpoint_in_progress"  # "_*" is also what push_to_hub leaves out
TRAINER_STATE_NAME = "trainer_state.json"  # the Trainer writes it last into a checkpoint
RESUME_POINT_NAME = "resume_point_only.json"  # marks a checkpoint saved on a signal between regular saves
CHECKPOINT_NAME = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)")
RESUME_HINT = "--resume_from_checkpoint last"
FSDP_MODEL_NAME = "pytorch_model_fsdp"  # transformers' prefix for FSDP's sharded model state


# ---------------------------------------------------------------------------------------------
# Which checkpoints are complete
# ---------------------------------------------------------------------------------------------


def checkpoint_folders(root: str | os.PathLike) -> list[Path]:
    """The ``checkpoint-<step>`` folders of a Trainer output_dir, oldest first (by integer step)."""
    root = Path(root)
    found = [(int(match.group(1)), path) for path in (root.iterdir() if root.is_dir() else [])
             if path.is_dir() and (match := CHECKPOINT_NAME.fullmatch(path.name))]
    return [path for _, path in sorted(found)]


def check_resumable(folder: str | os.PathLike, what: str = "--resume_from_checkpoint") -> Path:
    """A checkpoint the Trainer can resume from: model, trainer state and every torch file intact."""
    folder = Path(folder)
    remedy = (f"Resume from an earlier checkpoint (--resume_from_checkpoint {folder.parent}/checkpoint-<step>), "
              f"or move {folder} away and use {RESUME_HINT}.")
    if not folder.is_dir():
        raise FileNotFoundError(f"{what} {folder}: {'not a folder' if folder.exists() else 'no such folder'}; give "
                                f"a checkpoint-<step> folder of the run, or {RESUME_HINT}.")
    # FSDP's sharded state dict keeps the weights in torch.distributed.checkpoint folders, which its
    # loader checks; every other checkpoint has them as safetensors.
    sharded = any(path.name.startswith(FSDP_MODEL_NAME) for path in folder.iterdir())
    check_model_folder(folder, f"{what} {folder}", remedy, weights=not sharded)
    if not (folder / TRAINER_STATE_NAME).is_file():
        raise FileNotFoundError(
            f"{what} {folder} has no {TRAINER_STATE_NAME}, which the Trainer writes last: the checkpoint was not "
            f"finished, or is a model folder rather than a training checkpoint. {remedy}"
        )
    check_json(folder / TRAINER_STATE_NAME, f"{what} {folder}", remedy)
    for path in sorted(folder.iterdir()):  # optimizer.pt, scheduler.pt, rng_state*.pth (torch's zip archives)
        if path.suffix in {".pt", ".pth"} and path.is_file():
            check_torch_archive(path, f"{what} {folder}", remedy)
    return folder


def _problem(check, folder: Path) -> str | None:
    try:
        check(folder)
    except (OSError, ValueError) as error:
        return str(error)
    return None


def complete_checkpoints(root: str | os.PathLike) -> list[Path]:
    """The checkpoints of ``root`` whose model is complete (what averaging needs), oldest first; each
    incomplete one is named in the log."""
    complete = []
    for folder in checkpoint_folders(root):
        if (problem := _problem(lambda path: check_model_folder(path, str(path)), folder)) is None:
            complete.append(folder)
        else:
            logger.warning(f"skipping {folder}: {problem}")
    return complete


def last_complete_checkpoint(root: str | os.PathLike) -> Path | None:
    """The highest-step checkpoint of ``root`` that training can resume from; incomplete ones are skipped (logged)."""
    for folder in reversed(checkpoint_folders(root)):
        if (problem := _problem(check_resumable, folder)) is None:
            return folder
        logger.warning(f"not resuming from {folder}: {problem}")
    return None


def resolve_checkpoint(resume_from_checkpoint, output_dir: str | os.PathLike,
                       what: str = "resume_from_checkpoint") -> Path | None:
    """What to resume from: True -> the newest complete checkpoint of ``output_dir`` (incomplete ones
    skipped and logged); a path -> that checkpoint, once checked; None or False -> nothing."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is not True:
        return check_resumable(resume_from_checkpoint, what)
    last = last_complete_checkpoint(output_dir)
    if last is None:
        found = checkpoint_folders(output_dir)
        raise ValueError(
            f"{what} last: no complete checkpoint-<step> folder in {str(output_dir)!r}"
            f"{' (the ones there are incomplete, see the log above)' if found else ''}; start the run anew "
            "without resuming."
        )
    logger.info(f"resuming from {last}")
    return last


# ---------------------------------------------------------------------------------------------
# Writing a checkpoint: under a temporary name, renamed when complete
# ---------------------------------------------------------------------------------------------


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (e.g. the disk is full); the partial folder was removed."""


def _disk_full(error: BaseException) -> bool:
    while error is not None:
        if isinstance(error, OSError) and error.errno in {errno.ENOSPC, errno.EDQUOT}:
            return True
        if "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _fsync_tree(folder: Path) -> None:
    """Flush every file of ``folder`` to disk, so that a rename never publishes data still in memory."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as file:
                os.fsync(file.fileno())


def _fsync_directory(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # some filesystems do not open directories
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def publish(staged: Path, final: Path) -> None:
    """Make the complete folder ``staged`` appear as ``final`` in one rename (replacing an older ``final``)."""
    _fsync_tree(staged)
    if final.exists():  # the same step saved again, e.g. by a run resumed from an earlier checkpoint
        replaced = staged.parent / f"replaced-{final.name}"
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(final, replaced)
        os.rename(staged, final)
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        os.rename(staged, final)
    _fsync_directory(final.parent)


class AtomicCheckpoints:
    """Trainer mixin: ``checkpoint-<step>`` appears only complete, and a failed write leaves the older ones intact.

    The Trainer's own ``_save_checkpoint`` runs unchanged with its output folder pointed at
    ``<output_dir>/_checkpoint_in_progress``; then every process waits, the main one flushes the
    files, renames the folder into place, and only then rotates old checkpoints (``save_total_limit``).
    """

    _writing_checkpoint = False
    _push_when_published = False
    resume_point_only = False  # the next save is only a point to resume from (set by `StopOnSignal`)

    def _get_output_dir(self, trial) -> str:
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING_DIR) if self._writing_checkpoint else run_dir

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """push_to_hub uploads the checkpoint in the background: only from its final name, never the temporary one."""
        if self._writing_checkpoint:
            self._push_when_published = True
        else:
            super()._push_from_checkpoint(checkpoint_folder)

    def _save_checkpoint(self, model, trial) -> None:
        run_dir = super()._get_output_dir(trial)
        staging = os.path.join(run_dir, STAGING_DIR)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)  # what a run killed while saving left behind
        self.accelerator.wait_for_everyone()
        self._writing_checkpoint = True
        try:
            super()._save_checkpoint(model, trial)
        except Exception as error:
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)
            raise CheckpointWriteError(_write_failure(error, Path(run_dir), name)) from error
        finally:
            self._writing_checkpoint = False
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            self._publish_checkpoint(Path(staging) / name, Path(run_dir) / name)
        self.accelerator.wait_for_everyone()
        if self._push_when_published:
            self._push_when_published = False
            super()._push_from_checkpoint(os.path.join(run_dir, name))

    def _publish_checkpoint(self, staged: Path, final: Path) -> None:
        if self.state.best_model_checkpoint == str(staged):  # the Trainer recorded where it wrote
            self.state.best_model_checkpoint = str(final)
            self.state.save_to_json(str(staged / TRAINER_STATE_NAME))
        if self.resume_point_only:
            (staged / RESUME_POINT_NAME).write_text(json.dumps({"step": self.state.global_step}) + "\n")
        publish(staged, final)
        shutil.rmtree(staged.parent, ignore_errors=True)
        if not self.resume_point_only:
            remove_resume_points(final)
        rotate_checkpoints(output_dir=str(final.parent), save_total_limit=self.args.save_total_limit,
                           best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)


def remove_resume_points(newest: Path) -> None:
    """Checkpoints saved on Ctrl-C between regular saves, older than ``newest``: the resumed run is past
    them, and without them averaging and save_total_limit see the checkpoints of an uninterrupted run."""
    step = int(CHECKPOINT_NAME.fullmatch(newest.name).group(1))
    for folder in checkpoint_folders(newest.parent):
        if (folder / RESUME_POINT_NAME).is_file() and int(CHECKPOINT_NAME.fullmatch(folder.name).group(1)) < step:
            shutil.rmtree(folder, ignore_errors=True)
            logger.info(f"removed {folder}, saved on a signal to resume from: {newest} is newer")


def _write_failure(error: BaseException, run_dir: Path, name: str) -> str:
    free = shutil.disk_usage(run_dir).free / 2**20 if run_dir.exists() else float("nan")
    earlier = [folder.name for folder in checkpoint_folders(run_dir) if folder.name != name]
    kept = f"the previous checkpoint, {run_dir / earlier[-1]}, is intact" if earlier else "no earlier checkpoint exists"
    cause = "the disk is full" if _disk_full(error) else f"{type(error).__name__}: {error}"
    return (
        f"Could not write checkpoint {run_dir / name}: {cause} ({free:,.0f} MiB free on that filesystem). The "
        f"partial checkpoint was removed and {kept}. Free some space (or choose an --output_dir on a larger disk; "
        f"fewer checkpoints: --save_total_limit), then continue with {RESUME_HINT}."
    )


# ---------------------------------------------------------------------------------------------
# Ctrl-C and SIGTERM: save, then stop
# ---------------------------------------------------------------------------------------------


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on a signal after saving ``checkpoint`` (None when the signal came too late to save)."""

    def __init__(self, signal_number: int, step: int, checkpoint: Path | None):
        self.signal_number, self.step, self.checkpoint = signal_number, step, checkpoint
        name = signal.Signals(signal_number).name
        if checkpoint is None:
            message = f"Training stopped by {name} at step {step}, after its last update; no checkpoint was written."
        else:
            message = (f"Training stopped by {name} at step {step} and saved a resumable checkpoint, {checkpoint}. "
                       f"To continue, run the same command with {RESUME_HINT}.")
        super().__init__(message)


class StopOnSignal(TrainerCallback):
    """On Ctrl-C (SIGINT) or SIGTERM: finish the current update, save a checkpoint, stop training.

    A second signal acts at once (the previous handlers are back), for when saving is not wanted.
    With several processes they agree at every update whether any of them got a signal, so that
    all stop at the same step and write one checkpoint together.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, trainer):
        self.trainer = trainer
        self.received: int | None = None
        self.saved: Path | None = None
        self._previous: dict = {}

    @contextmanager
    def installed(self):
        """Handle the signals while the block runs (only the main thread may install handlers)."""
        self.received, self.saved, self.trainer.resume_point_only = None, None, False
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._previous = {number: signal.getsignal(number) for number in self.SIGNALS}
        for number in self.SIGNALS:
            signal.signal(number, self._handle)
        try:
            yield
        finally:
            self._restore()

    def _restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def _handle(self, number, frame) -> None:
        self.received = number
        self._restore()
        logger.warning(f"{signal.Signals(number).name} received: finishing this update, then saving a checkpoint "
                       "and stopping (send it again to stop at once, without saving).")

    def _stop_requested(self) -> bool:
        stop = self.received is not None
        if self.trainer.args.world_size > 1:
            flag = torch.tensor([float(stop)], device=self.trainer.accelerator.device)
            stop = bool(self.trainer.accelerator.reduce(flag, reduction="sum").item() > 0)
        return stop

    def on_step_end(self, args, state, control, **kwargs):
        if self._stop_requested():
            if self.received is None:  # another process got the signal
                self.received = signal.SIGINT
            self.trainer.resume_point_only = not control.should_save  # not a save the run makes anyway
            control.should_save, control.should_training_stop, control.should_evaluate = True, True, False
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.received is not None:
            self.saved = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.saved is not None:  # stopping: no second save or evaluation at the epoch's end
            control.should_save = control.should_evaluate = False
        return control

    def raise_if_stopped(self, step: int) -> None:
        if self.received is not None:
            raise TrainingInterrupted(self.received, step, self.saved)
