"""Checkpoints: one policy for what they hold and how they are written; which one to resume from.

transformers' Trainer writes ``checkpoint-<step>`` in place, file after file, and picks the
highest step to resume from. A run killed while it writes (``kill -9``, an out-of-memory kill, a
power cut) leaves a half-written folder with the highest step, which ``resume`` would then take.
Here:

- `CheckpointPolicy` (a Trainer mixin) is the one place that decides what a checkpoint holds and how
  it is written, in one visible order: the divergence check, what resuming needs, the moving average
  (as a SIGTERM's grace budget allows), then the staged write published by one rename, then rotation.
  A failed write (a full disk) removes the partial folder and raises `CheckpointWriteError`, which
  names the folder, the free space and the checkpoint that is still intact.
- `last_complete_checkpoint` skips (and names in the log) any ``checkpoint-<step>`` that is
  incomplete, e.g. one written in place by an older version or another tool.
- `StopOnSignal` (a callback) turns Ctrl-C (SIGINT) or SIGTERM into "finish this update, save a
  checkpoint, stop", a SIGTERM within ``--preemption_grace_seconds``; the trainer then raises
  `TrainingInterrupted`, which says where the checkpoint is.
"""

from __future__ import annotations

import copy
import errno
import json
import logging
import os
import queue
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, seed_worker

from ..checkpoint_files import (
    CHECKPOINT_NAME,
    LEFT_OUT_NAME,
    MODEL_WEIGHTS,
    check_json,
    check_model_folder,
    check_safetensors,
    check_torch_archive,
    checkpoint_folders,
    left_out,
)
from ..private_api import require
from .divergence import TrainingDiverged, refuse_non_finite, resume_hint
from .moving_average import EMA_FILE

# CheckpointPolicy overrides these Trainer internals: fail at import, naming the versions, where they are gone
require(
    "transformers.Trainer._save_checkpoint",
    "transformers.Trainer._get_output_dir",
    "transformers.Trainer._push_from_checkpoint",
    "transformers.Trainer._save",
    "transformers.Trainer._load_optimizer_and_scheduler",
)

logger = logging.getLogger(__name__)

STAGING_DIR = "_checkpoint_in_progress"  # "_*" is also what push_to_hub leaves out
TRAINER_STATE_NAME = "trainer_state.json"  # the Trainer writes it last into a checkpoint
RESUME_POINT_NAME = "resume_point_only.json"  # marks a checkpoint saved on a signal between regular saves
RESUME_HINT = "--resume_from_checkpoint last"
CONTINUED_FROM_NAME = "_continued_from.json"  # the checkpoint a run folder's run began at ("_*": not pushed)
FSDP_MODEL_NAME = "pytorch_model_fsdp"  # transformers' prefix for FSDP's sharded model state


# ---------------------------------------------------------------------------------------------
# Which checkpoints are complete
# ---------------------------------------------------------------------------------------------


def check_resumable(folder: str | os.PathLike, what: str = "--resume_from_checkpoint") -> Path:
    """A checkpoint the Trainer can resume from: model, trainer state, every torch file and the moving average
    (where there is one) intact; the folder, ``~`` expanded."""
    folder = Path(folder).expanduser()
    remedy = (
        f"Resume from an earlier checkpoint (--resume_from_checkpoint {folder.parent}/checkpoint-<step>), "
        f"or move {folder} away and use {RESUME_HINT}."
    )
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{what} {folder}: {'not a folder' if folder.exists() else 'no such folder'}; give "
            f"a checkpoint-<step> folder of the run, or {RESUME_HINT}."
        )
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
    # optimizer.pt (FSDP: optimizer.bin or an optimizer_0 folder) and scheduler.pt, or DeepSpeed's global_step*
    # folder, which holds both: without them the Trainer resumes in silence with Adam's moments at zero and
    # eq. (3)'s warm-up from its start (--save_only_model)
    names = [path.name for path in folder.iterdir()]
    deepspeed = any(name.startswith("global_step") for name in names)
    if not deepspeed and (not any(name.startswith("optimizer") for name in names) or "scheduler.pt" not in names):
        raise ValueError(
            f"{what} {folder} holds no optimizer or scheduler state (saved with --save_only_model?): resuming "
            "would restart Adam's moments and the learning rate's warm-up at that update. Fine-tune from its "
            f"weights instead (--model_name_or_path {folder}), or resume from a checkpoint saved with them."
        )
    for path in sorted(folder.iterdir()):  # optimizer.pt, scheduler.pt, rng_state*.pth (torch's zip archives)
        if path.suffix in {".pt", ".pth"} and path.is_file():
            check_torch_archive(path, f"{what} {folder}", remedy)
    if (folder / EMA_FILE).is_file():  # a copy cut short: `last` takes the checkpoint before
        check_safetensors(folder / EMA_FILE, f"{what} {folder}", remedy)
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


def saved_attributes(stateful_callbacks: dict, callback: type) -> dict:
    """What a trainer state's ``stateful_callbacks`` (a checkpoint's trainer_state.json) keeps of ``callback``'s
    attributes (transformers' `ExportableState`: one entry, or a list of them, the first taken); {} where none."""
    saved = stateful_callbacks.get(callback.__name__)
    saved = saved[0] if isinstance(saved, list) and saved else saved
    return (saved or {}).get("attributes") or {}


class ContinuedFrom(TrainerCallback, ExportableState):
    """The run folders a run trained in, oldest first, each with the update it began at there: more than one where
    it was resumed into a new --output_dir from a checkpoint of another folder (after a full disk, on another
    machine). Each checkpoint's trainer_state.json keeps them (the Trainer's ``stateful_callbacks``), relative to
    the run folder (no local path in a checkpoint pushed to the Hub; two folders moved together still find each
    other), so that a run resumed again in the new folder still knows them, and averaging the last N checkpoints
    at the end (§6.1) takes the old folders' too (`run_checkpoints`). Data only: `TransformerTrainer` sets it where
    training begins, also on the copy transformers makes from a checkpoint
    (--restore_callback_states_from_checkpoint)."""

    def __init__(self, folders: list | None = None):
        self.folders = [[str(folder), int(start)] for folder, start in folders or []]
        self.home: Path | None = None  # the run folder (resolved) the folders are saved relative to

    def state(self) -> dict:
        return {"args": {}, "attributes": {"folders": [[_relative(f, self.home), start] for f, start in self.folders]}}

    def begin(self, output_dir: str | os.PathLike, state, checkpoint: str | os.PathLike | None = None) -> None:
        """Set (and write into ``state``) for training in ``output_dir`` from ``state``: a new run's, or that of
        ``checkpoint``, resumed. The checkpoint's folder is where it lies now (a run folder moved or copied
        elsewhere resumes as the same run, its checkpoints not counted twice)."""
        here = Path(output_dir).resolve()
        folders = []
        if checkpoint is not None:
            origin = Path(checkpoint).resolve().parent
            folders = self.saved_in(state.stateful_callbacks, origin)
            folders = [*folders[:-1], [str(origin), folders[-1][1]]] if folders else [[str(origin), 0]]
        if not folders or folders[-1][0] != str(here):
            folders.append([str(here), state.global_step])
        self.folders, self.home = folders, here
        state.stateful_callbacks[type(self).__name__] = self.state()  # also where a checkpoint predates it

    @classmethod
    def saved_in(cls, stateful_callbacks: dict, run_folder: str | os.PathLike) -> list:
        """The folders a trainer state's ``stateful_callbacks`` records (absolute, resolved), for a checkpoint of
        ``run_folder``; [] where it records none."""
        folders = saved_attributes(stateful_callbacks, cls).get("folders") or []
        return [[str((Path(run_folder) / folder).resolve()), int(start)] for folder, start in folders]


def _relative(folder: str, home: Path | None) -> str:
    try:
        return folder if home is None else os.path.relpath(folder, home)
    except ValueError:  # another drive (Windows): no relative path
        return folder


def run_checkpoints(output_dir: str | os.PathLike, folders: list | None = None) -> list[Path]:
    """The complete checkpoints of a run, oldest first: ``output_dir``'s and, for a run continued from other
    folders (``folders``: `ContinuedFrom`'s (folder, update it began at there) pairs), theirs up to the update the
    next folder began at (later ones were abandoned). A folder no longer there, or an incomplete checkpoint, is
    named in the log."""
    here = Path(output_dir).resolve()
    found = []
    for (folder, start), following in zip(folders or [], [*(folders or [])[1:], None]):
        if Path(folder) == here:
            continue
        if not Path(folder).is_dir():
            logger.warning(f"the run continued from {folder}, which is gone: its checkpoints are not averaged")
            continue
        end = following[1] if following is not None else float("inf")
        found += [
            path
            for path in complete_checkpoints(folder)
            # a point to resume from, saved on a signal: in one folder the next regular save removes it
            if start < _step(path) <= end and not (path / RESUME_POINT_NAME).is_file()
        ]
    found += complete_checkpoints(output_dir)
    return sorted(found, key=_step)


def recorded_run_folders(root: str | os.PathLike) -> list:
    """The folders the run of ``root`` trained in, as its newest checkpoint records them (`ContinuedFrom`), the
    last one ``root`` itself (where that checkpoint lies now); [] where none records them."""
    here = Path(root).resolve()
    for folder in reversed(checkpoint_folders(root)):
        try:
            saved = json.loads((folder / TRAINER_STATE_NAME).read_text(encoding="utf-8"))
            folders = ContinuedFrom.saved_in(saved.get("stateful_callbacks") or {}, here)
        except (OSError, ValueError, TypeError, AttributeError):  # incomplete or of another shape: the one before
            continue
        if folders:
            folders[-1][0] = str(here)
        return folders
    return []


def of_another_folder(checkpoint: str | os.PathLike | None, output_dir: str | os.PathLike) -> bool:
    """Whether resuming from ``checkpoint`` into ``output_dir`` continues the run in a new folder (links resolved)."""
    return checkpoint is not None and Path(checkpoint).resolve().parent != Path(output_dir).resolve()


def record_continuation(output_dir: str | os.PathLike, checkpoint: str | os.PathLike) -> None:
    """Write ``output_dir``/_continued_from.json, naming ``checkpoint`` of another folder, which a run continues
    from in ``output_dir``: until the run saves a checkpoint there, ``--resume_from_checkpoint last`` in
    ``output_dir`` resumes from it again (a job requeued before its first save). Relative to ``output_dir``
    where the two share a drive; written whole (a temporary file renamed)."""
    here = Path(output_dir).resolve()
    here.mkdir(parents=True, exist_ok=True)
    record = here / CONTINUED_FROM_NAME
    temporary = record.with_name(f".{record.name}.{socket.gethostname()}.{os.getpid()}")  # nodes may share the disk
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(json.dumps({"checkpoint": _relative(str(Path(checkpoint).resolve()), here)}) + "\n")
        file.flush()
        os.fsync(file.fileno())  # a power cut is among the crashes it is there for
    os.replace(temporary, record)
    _fsync_directory(here)


def forget_continuation(output_dir: str | os.PathLike) -> None:
    """Remove ``output_dir``'s _continued_from.json once the folder holds a checkpoint or the final model of its own
    run: from then on its checkpoints' trainer state records the old folder (`ContinuedFrom`), and `last` must not
    go back past them (nor train a finished model again)."""
    (Path(output_dir) / CONTINUED_FROM_NAME).unlink(missing_ok=True)


def continued_from(output_dir: str | os.PathLike) -> Path | None:
    """The checkpoint ``output_dir``/_continued_from.json names (`record_continuation`), or None where there is
    no such file; one that is not of that shape is an error naming it."""
    record = Path(output_dir) / CONTINUED_FROM_NAME
    try:
        text = record.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        checkpoint = json.loads(text)["checkpoint"]
        if not isinstance(checkpoint, str):
            raise TypeError(f"'checkpoint' is {checkpoint!r}, not a path")
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{record} does not name the checkpoint its run continued from ({type(error).__name__}: {error}); "
            "delete it, or resume with --resume_from_checkpoint PATH."
        ) from None
    return (record.parent / checkpoint).resolve()


def _step(checkpoint: Path) -> int:
    return int(CHECKPOINT_NAME.fullmatch(checkpoint.name).group(1))


def last_complete_checkpoint(root: str | os.PathLike, log: bool = True) -> Path | None:
    """The highest-step checkpoint of ``root`` that training can resume from; incomplete ones are skipped (logged,
    where ``log``)."""
    for folder in reversed(checkpoint_folders(root)):
        if (problem := _problem(check_resumable, folder)) is None:
            return folder
        if log:
            logger.warning(f"not resuming from {folder}: {problem}")
    return None


def last_good_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """Where a run that went wrong can continue from, said without logging: the newest complete checkpoint of
    ``output_dir``, or, for a run continued there that saved none yet, the checkpoint it began at; None."""
    good = last_complete_checkpoint(output_dir, log=False)
    if good is None:
        try:
            origin = continued_from(output_dir)
        except ValueError:
            return None
        good = origin if origin is not None and _problem(check_resumable, origin) is None else None
    return good


def check_nothing_later(checkpoint: Path, output_dir: str | os.PathLike, what: str) -> None:
    """Resuming from an earlier checkpoint of ``output_dir`` than its latest would leave the later ones of the
    abandoned run beside the new run's: ``last`` would resume from them, and averaging the last N would mix
    the two runs. Refused, naming them, before any data is read. Later folders that ``last`` skips as
    incomplete do not count (so ``last`` itself, checked again by `TransformerTrainer.train`, always passes)."""
    match = CHECKPOINT_NAME.fullmatch(checkpoint.resolve().name)  # a link to a checkpoint is that checkpoint
    if match is None or of_another_folder(checkpoint, output_dir):
        return
    later = [
        folder
        for folder in checkpoint_folders(output_dir)
        if int(CHECKPOINT_NAME.fullmatch(folder.name)[1]) > int(match[1]) and _problem(check_resumable, folder) is None
    ]
    if later:
        raise ValueError(
            f"{what} {checkpoint}: {output_dir} also holds later checkpoints ({', '.join(f.name for f in later)}) "
            f"of the run it goes back on; the new run's checkpoints would be mixed with them ({RESUME_HINT} and "
            "--average_checkpoints take the highest steps). Move them out of the folder first, or resume from "
            "the latest."
        )


def resolve_checkpoint(
    resume_from_checkpoint, output_dir: str | os.PathLike, what: str = "resume_from_checkpoint"
) -> Path | None:
    """What to resume from: True -> the newest complete checkpoint of ``output_dir`` (incomplete ones
    skipped and logged); a path -> that checkpoint, once checked; None or False -> nothing."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is not True:
        checkpoint = check_resumable(resume_from_checkpoint, what)
        check_nothing_later(checkpoint, output_dir, what)
        return checkpoint
    last = last_complete_checkpoint(output_dir)
    if last is None and (origin := continued_from(output_dir)) is not None:
        # a run continued here that saved no complete checkpoint yet: where it began is still its newest one
        record = Path(output_dir) / CONTINUED_FROM_NAME
        if finished := [name for name in MODEL_WEIGHTS if (Path(output_dir) / name).is_file()]:
            raise ValueError(
                f"{what} last: {output_dir} holds no checkpoint but a final model ({finished[0]}), which resuming "
                f"from {origin} ({record} names it) would train over. Fine-tune it into a new --output_dir "
                f"(--model_name_or_path {output_dir}), or delete {record} if that model is not this run's."
            )
        if not origin.is_dir():
            raise ValueError(
                f"{what} last: {output_dir} holds no complete checkpoint, and {origin}, the one its run began at "
                f"({record} names it), is gone. Resume from another checkpoint of the run (--resume_from_checkpoint "
                f"PATH), or start the run anew (delete {record})."
            )
        checkpoint = check_resumable(origin, f"{what} last ({record} names it)")
        logger.info(f"no complete checkpoint in {output_dir} yet: resuming from {checkpoint}, which its run began at")
        return checkpoint
    if last is None:
        found = checkpoint_folders(output_dir)
        anew = (
            f" (the ones there are incomplete, see the log above); to start the run anew, move them out of "
            f"{str(output_dir)!r} or choose a new --output_dir"
            if found
            else "; start the run anew without resuming"
        )
        raise ValueError(f"{what} last: no complete checkpoint-<step> folder in {str(output_dir)!r}{anew}.")
    logger.info(f"resuming from {last}")
    return last


# ---------------------------------------------------------------------------------------------
# Writing a checkpoint: under a temporary name, renamed when complete
# ---------------------------------------------------------------------------------------------


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (e.g. the disk is full); the partial folder was removed."""


def _causes(error: BaseException | None):
    """The error and the errors it was raised from (or while handling, unless ``from None`` hid them); each once,
    though a retry can chain them in a loop."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)


def _disk_full(error: BaseException) -> bool:
    return any(
        (isinstance(cause, OSError) and cause.errno in {errno.ENOSPC, errno.EDQUOT})
        or "No space left on device" in str(cause)
        for cause in _causes(error)
    )


def _not_writable(error: BaseException) -> bool:
    return any(
        isinstance(cause, OSError) and cause.errno in {errno.EACCES, errno.EPERM, errno.EROFS}
        for cause in _causes(error)
    )


def _write_failed(error: BaseException) -> bool:
    """An error of the filesystem: an OSError, or torch.save's RuntimeError without errno (a full disk among
    its causes: "PytorchStreamWriter failed writing file ...: file write failed")."""
    return any(isinstance(cause, OSError) or "write failed" in str(cause) for cause in _causes(error))


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


class CheckpointPolicy:
    """Trainer mixin: the one place that decides what a checkpoint holds and how it is written.

    When: at the Trainer's ``save_steps`` (``save_strategy``) and wherever a callback sets
    ``control.should_save`` (`WallClock`'s minutes, `StopOnSignal`'s stop). What and how, in
    `_save_checkpoint`'s order:

    1. nothing after a non-finite update, nor non-finite weights (``divergence``, a `DivergenceGuard`);
    2. what resuming needs, by the Trainer's own writer, into ``<output_dir>/_checkpoint_in_progress/``:
       the weights (`_save`), optimizer and scheduler, loss scaler, RNG states, trainer state;
    3. the moving average of the weights (``moving_average``, ``--ema_decay``), unless a SIGTERM's grace
       budget (``--preemption_grace_seconds``) has no room left for it at the write speed just measured:
       then ``left_out.json`` says so, and a run resumed from it starts the average again;
    4. every file flushed to disk, the folder renamed to ``checkpoint-<step>`` (`publish`); only then are
       passed resume points removed, old checkpoints rotated (``save_total_limit``) and the checkpoint pushed.

    A failed write removes the partial folder and raises `CheckpointWriteError`; older checkpoints stay intact.
    """

    divergence = None  # a DivergenceGuard among the callbacks (TransformerTrainer's)
    moving_average = None  # an ExponentialMovingAverage among the callbacks (--ema_decay)
    stop_on_signal: StopOnSignal | None = None  # its SIGTERM grace budget bounds the checkpoint written then
    resume_point_only = False  # the next save is only a point to resume from (set by `StopOnSignal`)
    _writing_checkpoint = False
    _push_when_published = False

    def _save_checkpoint(self, model, trial) -> None:
        if self.divergence is not None:  # 1. never a checkpoint of a diverged run
            self.divergence.check(self.state.global_step, self._weights_to_check())
        run_dir = Path(super()._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staged = run_dir / STAGING_DIR / name
        if self.args.should_save:
            shutil.rmtree(staged.parent, ignore_errors=True)  # what a run killed while saving left behind
        self.accelerator.wait_for_everyone()
        self._writing_checkpoint = True
        try:
            left_out = self._write_checkpoint(model, trial, staged)  # 2. and 3.
        except Exception as error:
            if self.args.should_save:
                shutil.rmtree(staged.parent, ignore_errors=True)
            if isinstance(error, TrainingDiverged):  # refused, not failed: its own message
                raise
            raise CheckpointWriteError(_write_failure(error, run_dir, name)) from error
        finally:
            self._writing_checkpoint = False
        self.accelerator.wait_for_everyone()
        best = self.state.best_model_checkpoint  # the Trainer recorded where it wrote, as os.path.join spells it
        best_is_this = best is not None and Path(best) == staged  # "./run/..." and "run/..." alike
        if best_is_this:  # on every process, not only the one that renames: the best is loaded by all at the end
            self.state.best_model_checkpoint = str(run_dir / name)
        if self.args.should_save:  # 4.
            self._publish_checkpoint(staged, run_dir / name, left_out, best_is_this)
        self.accelerator.wait_for_everyone()
        if self._push_when_published:
            self._push_when_published = False
            super()._push_from_checkpoint(str(run_dir / name))
        if self.args.should_save and self.stop_on_signal is not None and self.stop_on_signal.deadline() is not None:
            taken = time.monotonic() - self.stop_on_signal.received_at
            logger.warning(
                f"saved {run_dir / name} {taken:.1f} s after SIGTERM (grace budget "
                f"{self.stop_on_signal.grace_seconds:g} s, --preemption_grace_seconds)"
            )

    def _write_checkpoint(self, model, trial, staged: Path) -> dict[str, str]:
        """Steps 2 and 3 into ``staged``; what was left out for lack of time, each with why."""
        start = time.monotonic()
        super()._save_checkpoint(model, trial)  # 2. into staging: _get_output_dir points there meanwhile
        if not self.args.should_save or self.moving_average is None or self.args.save_only_model:
            return {}
        deadline = self.stop_on_signal.deadline() if self.stop_on_signal is not None else None  # after a SIGTERM
        if deadline is not None:  # 3. only as the budget allows, at the speed the pieces so far were written
            _fsync_tree(staged)  # the disk's speed, not the page cache's
            speed = _size(staged) / max(time.monotonic() - start, 1e-6)
            needed, left = self.moving_average.nbytes / speed, deadline - time.monotonic()
            if needed > left:
                why = (
                    f"{max(left, 0):.1f} s were left of the {self.stop_on_signal.grace_seconds:g} s grace budget "
                    f"after SIGTERM (--preemption_grace_seconds), and writing it takes about {needed:.1f} s at "
                    f"the {speed / 2**20:,.1f} MiB/s just measured"
                )
                logger.warning(
                    f"{staged.name} holds what resuming needs, but not the moving average of the weights "
                    f"({EMA_FILE}): {why}. A run resumed from it starts the average again."
                )
                return {EMA_FILE: why}
        self.moving_average.save(staged)
        return {}

    def _publish_checkpoint(self, staged: Path, final: Path, left_out: dict[str, str], best_is_this=False) -> None:
        if best_is_this:  # the state saved in it names the final folder as the best
            self.state.save_to_json(str(staged / TRAINER_STATE_NAME))
        if self.resume_point_only:
            (staged / RESUME_POINT_NAME).write_text(json.dumps({"step": self.state.global_step}) + "\n")
        if left_out:
            (staged / LEFT_OUT_NAME).write_text(json.dumps(left_out, indent=1) + "\n")
        publish(staged, final)
        forget_continuation(final.parent)  # a checkpoint of the run's own here: `last` takes it from now on
        shutil.rmtree(staged.parent, ignore_errors=True)
        if not self.resume_point_only:
            remove_resume_points(final)
        rotate_checkpoints(final, self.args.save_total_limit, self.state.best_model_checkpoint)

    def _get_output_dir(self, trial) -> str:
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING_DIR) if self._writing_checkpoint else run_dir

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """push_to_hub uploads the checkpoint in the background: only from its final name, never the temporary one."""
        if self._writing_checkpoint:
            self._push_when_published = True
        else:
            super()._push_from_checkpoint(checkpoint_folder)

    def _weights_to_check(self) -> dict[str, torch.Tensor]:
        weights = {name: p.detach() for name, p in self.accelerator.unwrap_model(self.model).named_parameters()}
        if self.moving_average is not None:
            weights.update({f"moving average of {name}": t for name, t in self.moving_average.average.items()})
        return weights

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """The weights, into a checkpoint or the final model's folder: never non-finite ones, and under FSDP the
        gathered ones (FULL_STATE_DICT) from a plain copy of the model.

        FSDP 2 swaps the model's class for ``FSDP<Name>(FSDPModule, <Name>)``; ``save_pretrained`` on it
        would copy torch's ``_fsdp_*.py`` files into the folder as remote code, and the gathered state
        dict holds the tied embedding matrix (§3.4) once per tie. The plain copy saves as any other model.
        """
        if self.divergence is not None:  # this process's own weights, or the gathered ones (FSDP)
            model = self.accelerator.unwrap_model(self.model)
            tensors = state_dict if state_dict is not None else dict(model.named_parameters())
            refuse_non_finite(
                {name: t.detach() for name, t in tensors.items() if isinstance(t, torch.Tensor)},
                f"the model to save in {output_dir or self.args.output_dir}",
                lambda: resume_hint(last_good_checkpoint(self.args.output_dir)),
            )
        if not (self.is_fsdp_enabled and state_dict is not None and self.args.should_save):
            return super()._save(output_dir, state_dict)
        sharded, self.model = self.model, plain_copy(self.accelerator.unwrap_model(self.model), state_dict)
        try:
            super()._save(output_dir)
        finally:
            self.model = sharded

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """The training state of a checkpoint, with the moving average of the weights (``--ema_decay``)."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if self.moving_average is None or checkpoint is None:
            return
        if EMA_FILE in left_out(checkpoint):
            self.moving_average.reset()  # check_checkpoint has said so in the log
        else:
            self.moving_average.load(checkpoint)


def _size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def is_sharded(model) -> bool:
    """Whether FSDP 2 has sharded ``model`` (its class then derives from ``FSDPModule``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def plain_copy(model, state_dict: dict):
    """A new, unsharded model of ``model``'s own class with the weights of a full ``state_dict``."""
    from torch.distributed.fsdp import FSDPModule

    plain_class = next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))
    with torch.random.fork_rng(devices=[]):  # its throw-away initialisation must not move training's RNG
        plain = plain_class(model.config)
    plain.load_state_dict(state_dict)
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain


def rotate_checkpoints(final: Path, limit: int | None, best: str | None) -> None:
    """``save_total_limit``: of the checkpoints of ``final``'s folder up to ``final`` (the one just written), by
    step, the newest ``limit`` stay, and always ``final`` and the best (``best``). A later checkpoint left beside
    it (an incomplete one, which resuming skipped) is neither counted nor removed. transformers' own rotation
    orders by modification time, which a copied run folder does not keep, and counts every ``checkpoint-*``
    (a ``checkpoint-300-keep`` of the user's) among the ones it keeps."""
    if not limit:
        return
    kept = {final.resolve(), *([Path(best).resolve()] if best else [])}
    candidates = [folder for folder in checkpoint_folders(final.parent) if _step(folder) <= _step(final)]
    excess = len(candidates) - limit
    for folder in candidates:
        if excess <= 0:
            break
        if folder.resolve() in kept:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        logger.info(f"removed {folder} (--save_total_limit {limit})")
        excess -= 1


def remove_resume_points(newest: Path) -> None:
    """Checkpoints saved on Ctrl-C between regular saves, older than ``newest``: the resumed run is past
    them, and without them averaging and save_total_limit see the checkpoints of an uninterrupted run."""
    step = int(CHECKPOINT_NAME.fullmatch(newest.name).group(1))
    for folder in checkpoint_folders(newest.parent):
        if (folder / RESUME_POINT_NAME).is_file() and int(CHECKPOINT_NAME.fullmatch(folder.name).group(1)) < step:
            shutil.rmtree(folder, ignore_errors=True)
            logger.info(f"removed {folder}, saved on a signal to resume from: {newest} is newer")


def _write_failure(error: BaseException, run_dir: Path, name: str) -> str:
    """What failed, what is intact, and the advice that fits the error: space for a full disk (or a failed
    write where less is free than the previous checkpoint takes), permissions for a refused one."""
    free, earlier, needed = float("nan"), [], 0
    try:  # the filesystem may fail these too: then what it could tell
        free = shutil.disk_usage(run_dir).free
        earlier = [folder for folder in checkpoint_folders(run_dir) if folder.name != name]
        needed = sum(path.stat().st_size for path in earlier[-1].rglob("*") if path.is_file()) if earlier else 0
    except OSError:
        pass
    kept = f"the previous checkpoint, {earlier[-1]}, is intact" if earlier else "no earlier checkpoint exists"
    full = _disk_full(error)
    cause = "the disk is full" if full else f"{type(error).__name__}: {error}"
    space = "Free some space (fewer checkpoints: --save_total_limit)"
    elsewhere = (
        f"; or continue on another disk with --output_dir <new folder> --resume_from_checkpoint {earlier[-1]}"
        if earlier
        else ""
    )
    if full:
        advice = space
    elif _not_writable(error):
        advice = f"Make {run_dir} writable"
    elif _write_failed(error) and free < needed:  # torch.save's full disk, which says no errno
        advice = space
    elif _write_failed(error):
        advice = f"Check the filesystem of {run_dir} (if it is full: {space[0].lower()}{space[1:]})"
    else:  # not the filesystem: the error itself says what to fix
        advice, elsewhere = "Fix what raised that error", ""
    return (
        f"Could not write checkpoint {run_dir / name}: {cause} ({free / 2**20:,.0f} MiB free on that filesystem). "
        f"The partial checkpoint was removed and {kept}. {advice}, then continue with {RESUME_HINT}{elsewhere}."
    )


# ---------------------------------------------------------------------------------------------
# Ctrl-C and SIGTERM: save, then stop
# ---------------------------------------------------------------------------------------------


def ignore_further_sigterms() -> None:
    """The run is stopping on a signal: another SIGTERM must not cut short what is left (a launcher passes the
    scheduler's on, so two arrive), until `sigterm_ends_the_run` ends."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


@contextmanager
def sigterm_ends_the_run(last_words: Callable[[], None]):
    """While the block runs, a SIGTERM ends the process as the default action would (exit status 143, whatever it
    was doing: no exception to unwind through a collective other processes wait in, or through a library's
    clean-up that would replace it), after ``last_words()``: the run's line saying where it stopped, and its lock
    given back. Python runs the handler between its own instructions, so a long native call (a tokenizer's merges,
    a collective) finishes first; a second SIGTERM meanwhile is ignored. During training `StopOnSignal` takes the signal over and gives it back. Processes forked
    meanwhile (the tokenization's workers) inherit the handler: they end as by default, without last words."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    this_process = os.getpid()

    def handle(number, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a launcher passes the scheduler's on: two arrive
        try:
            if os.getpid() == this_process:
                last_words()
        finally:  # whatever the last words met (a lock half given back), the process ends
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# The pid of the `table3 --devices` command that started this process as one of its rows (`table3.run_job`), in its
# own session: `stop_with_parent` stops the row as SIGTERM would when that command is gone.
PARENT_PID_VARIABLE = "VANILLA_TRANSFORMER_TABLE3_PID"


def stop_with_parent(poll_seconds: float = 1.0) -> None:
    """In a process started with `PARENT_PID_VARIABLE` (taken out of the environment, so that nothing it starts
    inherits it): a SIGTERM to itself once that parent is gone (killed with SIGKILL, or its terminal closed), so
    that the row saves a checkpoint and stops, as on a scheduler's SIGTERM, instead of training on unseen, holding
    its GPU and its folder's lock. A thread that reads the parent's pid every ``poll_seconds``."""
    value = os.environ.pop(PARENT_PID_VARIABLE, "")
    if not value.isdigit():
        return
    parent = int(value)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        logger.warning(f"the table3 command that started this run (pid {parent}) is gone: stopping as on SIGTERM")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="stop-with-parent", daemon=True).start()


def stopped_by_ctrl_c(error: BaseException) -> bool:
    """``error`` is a Ctrl-C's KeyboardInterrupt, or an error raised while one unwound (datasets' map collects
    its workers' results with a timeout and raises TimeoutError, the interrupt as its context)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        if not isinstance(error, Exception):  # SystemExit and the like: an answer already given
            return False
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


@contextmanager
def ctrl_c_stops_the_run():
    """While the block runs, Ctrl-C (SIGINT, which a terminal sends to every process of the job) raises
    KeyboardInterrupt in this process only. Processes forked meanwhile (the tokenization's workers) ignore it:
    each printed its own traceback; their pool stops them (SIGTERM, see `sigterm_ends_the_run`) as the exception
    unwinds. Workers started otherwise (forkserver, spawn) ignore it by `data.leave_ctrl_c_to_the_main_process`.
    A SIGINT ignored when the block starts (a job started in the background) stays ignored."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield
        return
    this_process = os.getpid()

    def handle(number, frame) -> None:
        if os.getpid() == this_process:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on a signal after saving ``checkpoint`` (None when the signal came too late to save)."""

    def __init__(self, signal_number: int, step: int, checkpoint: Path | None):
        self.signal_number, self.step, self.checkpoint = signal_number, step, checkpoint
        name = signal.Signals(signal_number).name
        if checkpoint is None:
            message = f"Training stopped by {name} at step {step}, after its last update; no checkpoint was written."
        else:
            message = (
                f"Training stopped by {name} at step {step} and saved a resumable checkpoint, {checkpoint}. "
                f"To continue, run the same command with {RESUME_HINT}."
            )
        super().__init__(message)


# A signal sent to every process of a job and passed on by its launcher as well (table3 --devices, `scancel -s INT`)
# arrives twice within milliseconds: one Ctrl-C, not two. A person's second Ctrl-C comes later.
SAME_SIGNAL_SECONDS = 0.2


def _settable(number: int, handler):
    """``handler`` as `signal.signal` takes it back: None (installed outside Python, which cannot be put back)
    becomes Python's own (Ctrl-C's KeyboardInterrupt, or the default action)."""
    if handler is None:
        return signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL
    return handler


def _hand_on(number: int, frame, handler) -> None:
    """Put back ``handler``, the one installed before ours, and give it signal ``number``: called, or the default
    action (SIG_DFL: the signal again, to this process), or nothing (SIG_IGN)."""
    handler = _settable(number, handler)
    signal.signal(number, handler)
    if handler == signal.SIG_DFL:
        os.kill(os.getpid(), number)
    elif handler != signal.SIG_IGN:
        handler(number, frame)


class SignalSafeLog:
    """Log lines said by a signal handler, written by a thread of their own.

    Python runs a handler between two instructions of the main thread, perhaps in the middle of a write to stderr
    (a progress bar's): writing there again from the handler raises "reentrant call inside BufferedWriter" into
    the interrupted code, a training run's crash at a random point. `queue.SimpleQueue.put` is safe in a handler;
    the thread writes the line once the interrupted write is done (the logging handler's lock waits for it)."""

    def __init__(self):
        self._lines: queue.SimpleQueue | None = None  # the open block's: `say` puts, its thread writes

    def say(self, line: str) -> None:
        lines = self._lines
        if lines is None:  # outside `open` (no signal handler of ours installed): at once
            logger.warning(line)
        else:
            lines.put(line)

    @staticmethod
    def _write(lines: queue.SimpleQueue) -> None:
        while (line := lines.get()) is not None:
            logger.warning(line)

    @contextmanager
    def open(self):
        """While the block runs, `say` hands its lines to a thread that writes each as soon as it can; all are
        written when the block ends. A block opened within another has a queue and thread of its own."""
        outer, lines = self._lines, queue.SimpleQueue()
        writer = threading.Thread(target=self._write, args=(lines,), name="signal-log", daemon=True)
        writer.start()
        self._lines = lines
        try:
            yield
        finally:
            self._lines = outer
            lines.put(None)
            writer.join()


class StopOnSignal(TrainerCallback):
    """On Ctrl-C (SIGINT) or SIGTERM: finish the current update, save a checkpoint, stop training.

    SIGTERM is how schedulers preempt (SLURM, Kubernetes, spot instances: SIGKILL follows after a grace
    period), so after it the checkpoint must be written within ``grace_seconds`` of the signal: what
    resumes best first, the rest as the budget allows (`CheckpointPolicy`). A signal during a regular
    save stops right after it, without another update. A Ctrl-C after the first signal acts at once (the
    previous handler is given it), for when saving is not wanted, unless it comes within `SAME_SIGNAL_SECONDS`
    of a first Ctrl-C (the same signal twice: sent to every process and passed on too); a second SIGTERM is ignored (a
    launcher passes the scheduler's on, and SLURM signals every process too, so each gets two at once). With several
    processes, whether to stop is decided by their vote alone, at every update (SIGTERM over SIGINT): all
    stop at the same step and write one checkpoint together, and a signal that lands while a vote runs
    counts at the next one.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, trainer, grace_seconds: float | None = None):
        self.trainer = trainer
        self.grace_seconds = grace_seconds
        self.received: int | None = None
        self.received_at: float | None = None  # time.monotonic() when this process learnt of the signal
        self.agreed = False  # every process knows of the signal (the vote): saves may now follow its budget
        self.saved: Path | None = None
        self.training = False  # inside `installed`: a signal now stops training (and an evaluation within it)
        self._previous: dict = {}
        self._log = SignalSafeLog()

    @contextmanager
    def installed(self):
        """Handle the signals while the block runs (only the main thread may install handlers)."""
        self.received, self.received_at, self.saved, self.trainer.resume_point_only = None, None, None, False
        self.agreed = False
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._previous = {number: signal.getsignal(number) for number in self.SIGNALS}
        with self._log.open():
            for number in self.SIGNALS:
                signal.signal(number, self._handle)
            self.training = True
            try:
                yield
            finally:
                self.training = False
                self._restore()

    def _restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, _settable(number, handler))
        self._previous = {}

    def _handle(self, number, frame) -> None:
        if self.received is not None and number == signal.SIGINT:
            if self.received == signal.SIGINT and time.monotonic() - self.received_at < SAME_SIGNAL_SECONDS:
                self._log.say(
                    f"Ctrl-C again within {SAME_SIGNAL_SECONDS:g} s of the first: taken as the same one (a signal "
                    "sent to every process and passed on too); press it again to stop at once, without saving."
                )
                return
            if signal.SIGINT in self._previous:  # a Ctrl-C after the first signal stops at once: the handler before
                _hand_on(number, frame, self._previous.pop(signal.SIGINT))
            return
        if self.received == signal.SIGTERM:  # a second SIGTERM: already stopping
            return
        self.received, self.received_at = number, time.monotonic()  # a first signal, or a SIGTERM after a Ctrl-C
        budget = (
            f" within {self.grace_seconds:g} s (--preemption_grace_seconds)"
            if number == signal.SIGTERM and self.grace_seconds
            else ""
        )
        self._log.say(
            f"{signal.Signals(number).name} received: finishing this update, then saving a checkpoint"
            f"{budget} and stopping (Ctrl-C again stops at once, without saving)."
        )

    def deadline(self) -> float | None:
        """When a checkpoint written now must be done (on the time.monotonic() clock): a SIGTERM's grace
        budget; None without one (no signal, or Ctrl-C, whose user can wait)."""
        if self.received != signal.SIGTERM or not self.grace_seconds:
            return None
        if self.trainer.args.world_size > 1 and not self.agreed:  # what a checkpoint holds is decided alike
            return None
        return self.received_at + self.grace_seconds

    def _stop_requested(self) -> bool:
        """Whether any process got a signal: with several, the sum of their votes (one all-reduce) alone decides,
        never what this process learnt after casting its vote, so that every process decides alike; all then
        hold the same signal."""
        if self.trainer.args.world_size > 1:
            got = torch.tensor(
                [self.received == signal.SIGINT, self.received == signal.SIGTERM],
                dtype=torch.float32,
                device=self.trainer.accelerator.device,
            )
            got = self.trainer.accelerator.reduce(got, reduction="sum").tolist()
            if not any(got):  # a signal that landed during the vote counts at the next one
                return False
            self.received = signal.SIGTERM if got[1] else signal.SIGINT
            self.received_at = self.received_at or time.monotonic()  # another process got it
        self.agreed = self.received is not None
        return self.agreed

    def on_step_end(self, args, state, control, **kwargs):
        if self._stop_requested():
            self.trainer.resume_point_only = not control.should_save  # not a save the run makes anyway
            control.should_save, control.should_training_stop, control.should_evaluate = True, True, False
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.saved is None and self._stop_requested():  # also a signal during a regular save: stop after it
            self.saved = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            control.should_training_stop = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.saved is not None:  # stopping: no second save or evaluation at the epoch's end
            control.should_save = control.should_evaluate = False
        return control

    def raise_if_stopped(self, step: int) -> None:
        """After training: a last vote, so that a signal after the last update's vote stops every process alike."""
        if self._stop_requested():
            raise TrainingInterrupted(self.received, step, self.saved)


def start_worker(worker_id: int, then: Callable[[int], None] | None = None) -> None:
    """A data loader worker's start (``worker_init_fn``): the stopping signals left to the main process, then
    ``then``, the loader's own start (the Trainer's seeding of a training loader's workers).

    SLURM signals every process of a job step, the loader's workers too. torch's worker handler dies of a
    SIGTERM that its parent did not send, and the main process then raises "DataLoader worker ... is killed
    by signal" in the middle of the update or of an evaluation, before any checkpoint. A terminal's Ctrl-C
    reaches every process of its group as well, and a worker forked while `StopOnSignal` was installed would
    say it saves. Ignored here, each signal reaches the main process alone, which saves, stops and shuts its
    workers down as at the end of any run (a worker whose parent has gone exits by itself).
    """
    for number in StopOnSignal.SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    if then is not None:
        then(worker_id)


def signals_to_the_main_process(loader):
    """``loader`` (a torch `DataLoader`, accelerate's prepared one too) with `start_worker` starting its
    workers, around the start it had: for every loader a trainer makes, training, evaluation and prediction."""
    base = getattr(loader, "base_dataloader", loader)  # accelerate's adapter iterates the loader it wraps
    start = base.worker_init_fn
    if base.num_workers and not (isinstance(start, partial) and start.func is start_worker):
        base.worker_init_fn = partial(start_worker, then=start)
    return loader


def seeded_worker_start(num_workers: int, rank: int) -> Callable[[int], None]:
    """The start of a training loader's workers: `start_worker` and the Trainer's seeding (`seed_worker`)."""
    return partial(start_worker, then=partial(seed_worker, num_workers=num_workers, rank=rank))
