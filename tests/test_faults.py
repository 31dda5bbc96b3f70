"""Crashes during training: kill -9 at any moment, a full disk, Ctrl-C.

The reference for "the run finishes as if nothing happened" is an uninterrupted run with the same
seed and data, in a separate process like the interrupted one: the final weights must be equal.
Checkpoints are checked by their files (complete, resumable) and by what `resume ... last` picks.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import transformers
from packaging.version import Version
from safetensors.torch import load_file
from transformers.trainer_callback import ExportableState

from vanilla_transformer import train_tokenizer
from vanilla_transformer.training import run as train
from vanilla_transformer.training.checkpointing import (
    STAGING_DIR,
    CheckpointWriteError,
    TrainingInterrupted,
    check_resumable,
    last_complete_checkpoint,
)
from vanilla_transformer.training.trainer import WallClock

REPO = Path(__file__).resolve().parents[1]
LETTERS = "a b c d e f g h i j".split()
SAVE_STEPS, MAX_STEPS = 4, 12


def reverse_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        words = [rng.choice(LETTERS) for _ in range(rng.randint(2, 5))]
        pairs.append((" ".join(words), " ".join(reversed(words))))
    return pairs


def write_train_file(folder: Path) -> Path:
    """``folder`` with the runs' train.tsv: 400 pairs of letters and their reversal."""
    pairs = reverse_pairs(400, seed=1)
    (folder / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def data_dir(fault_runs_folder) -> Path:
    """The runs' folder (tests/conftest.py): one for this module and those that import its fixtures."""
    return fault_runs_folder


def run_argv(data_dir: Path, output_dir: Path, *extra: str) -> list[str]:
    new_tokenizer = [] if "--tokenizer_name_or_path" in extra else ["--tokenizer_vocab_size", "280"]
    return [
        "--train_file",
        str(data_dir / "train.tsv"),
        "--preset",
        "tiny",
        *new_tokenizer,
        "--output_dir",
        str(output_dir),
        "--report_to",
        "none",
        "--use_cpu",
        "--disable_tqdm",
        "true",
        "--eval_strategy",
        "no",
        "--logging_steps",
        "1",
        "--max_steps",
        str(MAX_STEPS),
        "--max_tokens",
        "200",
        "--learning_rate",
        "0.003",
        "--warmup_steps",
        "4",
        "--save_strategy",
        "steps",
        "--save_steps",
        str(SAVE_STEPS),
        "--cache_dir",
        str(data_dir / "cache"),
        *extra,
    ]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = weights(a), weights(b)
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


# ---------------------------------------------------------------------------------------------
# Subprocess runs of training/train.py, as a user starts them
# ---------------------------------------------------------------------------------------------

# Runs training/train.py as `python training/train.py ...` does, with two test hooks set by the
# environment: a pause before each update (so that a signal can land mid-run) that also prints the
# number of updates done, and a SIGKILL of itself in the middle of writing one checkpoint (after
# the weights and optimizer, before the RNG and trainer state).
DRIVER = textwrap.dedent("""
    import os, runpy, signal, sys, time
    from vanilla_transformer.training.trainer import TransformerTrainer

    pause = float(os.environ.get("FAULT_PAUSE", "0"))
    hold = os.environ.get("FAULT_HOLD")  # a file: no update starts while it exists
    kill_at = int(os.environ.get("FAULT_KILL_WHILE_SAVING", "-1"))
    training_step = TransformerTrainer.training_step
    save_optimizer = TransformerTrainer._save_optimizer_and_scheduler

    def paused_step(self, *args, **kwargs):
        print(f"updates done: {self.state.global_step}", flush=True)
        time.sleep(pause)
        while hold and os.path.exists(hold):
            time.sleep(0.02)
        return training_step(self, *args, **kwargs)

    def killed_while_saving(self, output_dir):
        save_optimizer(self, output_dir)
        if self.state.global_step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    TransformerTrainer.training_step = paused_step
    TransformerTrainer._save_optimizer_and_scheduler = killed_while_saving
    sys.argv = [sys.argv[1], *sys.argv[2:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def start(
    data_dir: Path,
    output_dir: Path,
    *extra: str,
    pause: float = 0.0,
    kill_while_saving: int = -1,
    hold: Path | None = None,
):
    driver = data_dir / "driver.py"
    driver.write_text(DRIVER)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "FAULT_PAUSE": str(pause),
        "FAULT_KILL_WHILE_SAVING": str(kill_while_saving),
        "FAULT_HOLD": str(hold or ""),
    }
    command = [
        sys.executable,
        str(driver),
        str(REPO / "training/train.py"),  # the final model: mean of 4, 8, 12
        *run_argv(data_dir, output_dir, "--average_checkpoints", "3", *extra),
    ]
    log = output_dir.with_name(output_dir.name + ".log")  # a file, not a pipe: a full pipe would stall the run
    attempt = len(list(log.parent.glob(log.name + "*")))
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, text=True, stderr=open(f"{log}{attempt}", "w", encoding="utf-8")
    )
    process.log = Path(f"{log}{attempt}")
    return process


def finish(process, timeout: int = 600) -> tuple[int, str, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out, process.log.read_text(encoding="utf-8")


def wait_for_updates(process, updates: int) -> int:
    """Read the driver's progress lines until ``updates`` updates are done; returns the last count seen."""
    for line in process.stdout:
        if line.startswith("updates done:") and (done := int(line.split(":")[1])) >= updates:
            return done
    raise AssertionError(f"the run ended before {updates} updates: {process.log.read_text()[-3000:]}")


def run_uninterrupted(data_dir: Path) -> Path:
    output = data_dir / "uninterrupted"
    code, _, err = finish(start(data_dir, output))
    assert code == 0, err[-3000:]
    return output


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_fault_run) -> Path:
    """The reference run (tests/conftest.py): trained once for this module and those that import its fixtures."""
    return uninterrupted_fault_run


def resume_to_the_end(data_dir: Path, output: Path) -> str:
    code, _, err = finish(start(data_dir, output, "--resume_from_checkpoint", "last"))
    assert code == 0, err[-3000:]
    return err


def test_kill_9_while_a_checkpoint_is_written_loses_at_most_one_interval(data_dir, uninterrupted):
    output = data_dir / "killed-while-saving"
    code, _, _ = finish(start(data_dir, output, kill_while_saving=2 * SAVE_STEPS))
    assert code == -signal.SIGKILL
    # The half-written checkpoint is only under the temporary name; resume takes the one before.
    assert sorted(p.name for p in output.glob("checkpoint-*")) == [f"checkpoint-{SAVE_STEPS}"]
    staged = output / STAGING_DIR / f"checkpoint-{2 * SAVE_STEPS}"
    assert (staged / "optimizer.pt").is_file() and not (staged / "trainer_state.json").exists()
    assert last_complete_checkpoint(output) == output / f"checkpoint-{SAVE_STEPS}"
    err = resume_to_the_end(data_dir, output)
    assert f"resuming from {output / f'checkpoint-{SAVE_STEPS}'}" in err
    assert not (output / STAGING_DIR).exists()
    assert json.loads((output / "trainer_state.json").read_text())["global_step"] == MAX_STEPS
    assert_same_weights(output, uninterrupted)


@pytest.mark.slow  # the kill -9 while a checkpoint is written stays in the default suite
def test_kill_9_at_a_random_moment_then_resume_gives_the_uninterrupted_model(data_dir, uninterrupted):
    output = data_dir / "killed-at-random"
    process = start(data_dir, output, pause=0.3)
    done = wait_for_updates(process, SAVE_STEPS + 1)
    time.sleep(random.Random(os.getpid()).uniform(0, 0.6))  # anywhere in the next update or two
    assert process.poll() is None, "the run ended before the kill"
    process.kill()
    code, out, _ = finish(process)
    done = max([done, *(int(line.split(":")[1]) for line in out.splitlines() if line.startswith("updates done:"))])
    assert code == -signal.SIGKILL
    last = last_complete_checkpoint(output)
    assert last is not None and done - int(last.name.split("-")[1]) <= SAVE_STEPS  # at most one interval lost
    resume_to_the_end(data_dir, output)
    assert_same_weights(output, uninterrupted)


@pytest.mark.slow  # SIGTERM's twin (test_preemption.py) and SIGINT to every process stay in the default suite
def test_ctrl_c_saves_a_resumable_checkpoint_says_so_and_resume_finishes(data_dir, uninterrupted):
    output = data_dir / "interrupted"
    process = start(data_dir, output, pause=0.3)
    wait_for_updates(process, SAVE_STEPS + 2)  # between two regular checkpoints
    process.send_signal(signal.SIGINT)
    code, _, err = finish(process)
    assert code == 128 + signal.SIGINT, err[-3000:]
    step = int(err.split("Training stopped by SIGINT at step ")[1].split()[0])
    assert step % SAVE_STEPS and step < MAX_STEPS  # saved where it stopped, not at a regular step
    assert f"saved a resumable checkpoint, {output / f'checkpoint-{step}'}" in err
    assert "--resume_from_checkpoint last" in err
    check_resumable(output / f"checkpoint-{step}")
    assert not (output / "model.safetensors").exists()  # an interrupted run is not a final model
    resume_to_the_end(data_dir, output)
    # The checkpoint saved on Ctrl-C was only a point to resume from: the run's own ones remain, and
    # the final model, their mean, is the uninterrupted run's.
    assert sorted(p.name for p in output.glob("checkpoint-*")) == sorted(
        p.name for p in uninterrupted.glob("checkpoint-*")
    )
    assert_same_weights(output, uninterrupted)


# ---------------------------------------------------------------------------------------------
# In one process: a full disk, a signal, incomplete and mismatched checkpoints
# ---------------------------------------------------------------------------------------------


def build(data_dir: Path, output_dir: Path, *extra: str) -> train.Run:
    return train.build_trainer(*train.parse_arguments(run_argv(data_dir, output_dir, *extra)))


def fail_at(trainer, step: int, error: Exception, monkeypatch) -> None:
    save = trainer._save_optimizer_and_scheduler

    def failing(output_dir):
        if trainer.state.global_step == step:
            raise error
        save(output_dir)

    monkeypatch.setattr(trainer, "_save_optimizer_and_scheduler", failing)


def test_a_full_disk_ends_with_a_clear_error_and_the_previous_checkpoint_intact(data_dir, tmp_path, monkeypatch):
    output, steps = tmp_path / "run", ("--save_total_limit", "1", "--max_steps", str(2 * SAVE_STEPS))
    trainer = build(data_dir, output, *steps).trainer
    fail_at(trainer, 2 * SAVE_STEPS, OSError(errno.ENOSPC, "No space left on device"), monkeypatch)
    previous = output / f"checkpoint-{SAVE_STEPS}"
    with pytest.raises(CheckpointWriteError) as error:
        trainer.train()
    message = str(error.value)
    assert "the disk is full" in message and "MiB free" in message
    assert f"{previous}, is intact" in message and "--resume_from_checkpoint last" in message
    assert sorted(p.name for p in output.glob("checkpoint-*")) == [previous.name]  # not rotated away
    assert not (output / STAGING_DIR).exists()  # the partial files are gone, freeing their space
    check_resumable(previous)
    # Once there is space again, the run continues from there.
    resumed = build(data_dir, output, *steps, "--resume_from_checkpoint", "last")
    assert resumed.resume == previous
    resumed.trainer.train(resume_from_checkpoint=str(resumed.resume))
    assert resumed.trainer.state.global_step == 2 * SAVE_STEPS
    assert sorted(p.name for p in output.glob("checkpoint-*")) == [f"checkpoint-{2 * SAVE_STEPS}"]


def test_any_failed_write_names_the_checkpoint_and_the_free_space(data_dir, tmp_path, monkeypatch):
    """torch.save reports a full disk as a RuntimeError without errno: the message still says what to check."""
    trainer = build(data_dir, tmp_path / "run").trainer
    fail_at(
        trainer,
        SAVE_STEPS,
        RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
        monkeypatch,
    )
    with pytest.raises(
        CheckpointWriteError,
        match=r"checkpoint-4: RuntimeError: .*file write failed.* MiB free.*"
        r"no earlier checkpoint exists\. Check the filesystem of .*if it is full: free some space",
    ):
        trainer.train()
    assert not list((tmp_path / "run").glob("checkpoint-*"))


WRITE_ERRORS = {  # the error, the free bytes, and what the advice says (None: no word of space)
    "ENOSPC": (OSError(errno.ENOSPC, "No space left on device"), 10**12, "Free some space"),
    "torch.save's, less free than a checkpoint takes": (
        RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
        1000,
        "Free some space",
    ),
    "torch.save's, space enough": (
        RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
        10**12,
        "Check the filesystem of",
    ),
    "read-only": (OSError(errno.EROFS, "Read-only file system"), 10**12, "writable"),
    "read-only, on a nearly full disk": (PermissionError(errno.EACCES, "Permission denied"), 1000, "writable"),
    "a bug, not the disk": (KeyError("optimizer"), 10**12, "Fix what raised that error"),
    "a bug raised from None while handling a disk error": (
        lambda: raised_from_none(KeyError("optimizer"), OSError(errno.EIO, "I/O error")),
        1000,
        "Fix what raised that error",
    ),
    "a retry that chained its errors in a loop": (lambda: chained_in_a_loop(), 10**12, "Check the filesystem of"),
}


def raised_from_none(error: BaseException, handled: BaseException) -> BaseException:
    try:
        try:
            raise handled
        except type(handled):
            raise error from None
    except type(error) as caught:
        return caught


def chained_in_a_loop() -> BaseException:
    """A retry's errors: the first is raised again while handling the second, which was raised from it (the
    first's context is then the second, the second's cause the first)."""
    first = OSError(errno.EIO, "I/O error")
    try:
        try:
            raise RuntimeError("retry failed") from first
        except RuntimeError:
            raise first  # noqa: B904 (the loop is the point)
    except OSError as caught:
        assert caught.__context__.__cause__ is caught
        return caught


@pytest.mark.parametrize("case", list(WRITE_ERRORS))
def test_a_failed_checkpoint_write_advises_what_fits_its_error(case, tmp_path, monkeypatch):
    """Freeing space is advised for a full disk (or a failed write where less is free than the previous checkpoint
    took), not for a refused write or an error of the code (a KeyError once read "Free some space")."""
    from vanilla_transformer.training import checkpointing

    error, free, advice = WRITE_ERRORS[case]
    error = error() if callable(error) else error
    previous = tmp_path / "run" / "checkpoint-4"
    previous.mkdir(parents=True)
    (previous / "optimizer.pt").write_bytes(b"0" * 5000)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpointing.shutil, "disk_usage", lambda path: usage._replace(free=free))
    message = checkpointing._write_failure(error, tmp_path / "run", "checkpoint-8")
    assert message.startswith(f"Could not write checkpoint {tmp_path / 'run' / 'checkpoint-8'}: ")
    assert f"the previous checkpoint, {previous}, is intact" in message and advice in message, message
    assert ("ree some space" in message) == (advice == "Free some space" or "Check" in advice), message
    # the same folder resumes from its newest checkpoint; another folder (a disk with space) from the intact one
    elsewhere = f"; or continue on another disk with --output_dir <new folder> --resume_from_checkpoint {previous}."
    assert "then continue with --resume_from_checkpoint last" in message
    assert message.endswith(elsewhere) == (advice != "Fix what raised that error"), message


def test_a_signal_in_process_saves_stops_and_restores_the_handlers(data_dir, tmp_path):
    trainer = build(data_dir, tmp_path / "run").trainer
    before = signal.getsignal(signal.SIGINT)

    class SendSigint(train.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 2:
                os.kill(os.getpid(), signal.SIGINT)

    trainer.add_callback(SendSigint())
    with pytest.raises(TrainingInterrupted) as interrupted:
        trainer.train()
    assert interrupted.value.step == 3 and interrupted.value.checkpoint == tmp_path / "run" / "checkpoint-3"
    check_resumable(tmp_path / "run" / "checkpoint-3")
    assert signal.getsignal(signal.SIGINT) is before


@pytest.fixture(scope="module")
def four_steps(data_dir, tmp_path_factory):
    """A run of one checkpoint interval, and (folder asked to save into, checkpoint folders present) at each save."""
    output = tmp_path_factory.mktemp("four-steps") / "run"
    trainer = build(data_dir, output, "--max_steps", str(SAVE_STEPS)).trainer
    seen = []
    save_model = trainer.save_model

    def watching(output_dir=None, _internal_call=False):
        seen.append((output_dir, sorted(p.name for p in output.glob("checkpoint-*"))))
        return save_model(output_dir, _internal_call)

    trainer.save_model = watching
    trainer.train()
    return output, seen


def test_resume_last_skips_a_checkpoint_half_written_in_place(data_dir, four_steps, tmp_path, caplog):
    """Another tool (or an older version) may write checkpoint-<step> in place and be killed half-way."""
    output = tmp_path / "run"
    shutil.copytree(four_steps[0], output)
    complete = output / f"checkpoint-{SAVE_STEPS}"
    half = output / f"checkpoint-{2 * SAVE_STEPS}"
    shutil.copytree(complete, half)
    optimizer = half / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:1000])
    with caplog.at_level(logging.WARNING):
        assert last_complete_checkpoint(output) == complete
    assert any(str(optimizer) in record.message for record in caplog.records)
    with pytest.raises(ValueError, match=f"{optimizer} is truncated or corrupt"):
        build(data_dir, output, "--resume_from_checkpoint", str(half))
    (half / "trainer_state.json").unlink()
    with pytest.raises(FileNotFoundError, match=f"{half} has no trainer_state.json"):
        build(data_dir, output, "--resume_from_checkpoint", str(half))
    # `last` takes the complete one, and train() (which checks it again) does not count the later half-written
    # one as a later checkpoint of an abandoned run: it resumes and trains on
    run = build(data_dir, output, "--resume_from_checkpoint", "last")
    assert run.resume == complete
    run.trainer.train(resume_from_checkpoint=str(run.resume))
    assert run.trainer.state.global_step > SAVE_STEPS


def test_resume_with_another_architecture_or_tokenizer_is_refused_before_the_data_is_read(
    data_dir, four_steps, tmp_path, monkeypatch
):
    output = four_steps[0]  # only read
    monkeypatch.setattr(train, "load_text_datasets", lambda *a, **k: pytest.fail("read the data before refusing"))
    with pytest.raises(ValueError, match=r"another architecture than the flags build \(d_model: 64 there, 32 now"):
        build(data_dir, output, "--resume_from_checkpoint", "last", "--config_overrides", "d_model=32")
    other = tmp_path / "other-tokenizer"  # the same data in capitals: as many tokens, other ones
    capitals = (data_dir / "train.tsv").read_text(encoding="utf-8").upper().replace("\t", "\n").splitlines()
    train_tokenizer(iter(capitals), vocab_size=280).save_pretrained(other)
    with pytest.raises(ValueError, match="trained with another tokenizer"):
        build(data_dir, output, "--resume_from_checkpoint", "last", "--tokenizer_name_or_path", str(other))


def test_resume_from_a_folder_that_does_not_exist(data_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="--resume_from_checkpoint checkpoint-99: no such folder"):
        build(data_dir, tmp_path / "run", "--resume_from_checkpoint", "checkpoint-99")


def test_resume_last_without_any_complete_checkpoint_says_to_start_anew(data_dir, tmp_path):
    (tmp_path / "run" / STAGING_DIR / "checkpoint-4").mkdir(parents=True)
    with pytest.raises(ValueError, match="no complete checkpoint-<step> folder .* start the run anew"):
        build(data_dir, tmp_path / "run", "--resume_from_checkpoint", "last")


def test_resuming_a_checkpoint_saved_without_optimizer_state_is_refused_naming_the_fix(data_dir, tmp_path):
    """--save_only_model leaves out optimizer.pt and scheduler.pt: the Trainer would resume in silence with
    Adam's moments at zero and eq. (3)'s warm-up from its start. Refused before the data is read, both named
    and by 'last', which skips it (logged) and finds nothing else."""
    output = tmp_path / "run"
    build(data_dir, output, "--max_steps", str(SAVE_STEPS), "--save_only_model", "true").trainer.train()
    checkpoint = output / f"checkpoint-{SAVE_STEPS}"
    assert (checkpoint / "model.safetensors").is_file() and not (checkpoint / "optimizer.pt").exists()
    with pytest.raises(ValueError, match=rf"{checkpoint} holds no optimizer or scheduler state .*--model_name_or_path"):
        build(data_dir, output, "--max_steps", str(2 * SAVE_STEPS), "--resume_from_checkpoint", str(checkpoint))
    with pytest.raises(ValueError, match="no complete checkpoint-<step> folder"):
        build(data_dir, output, "--max_steps", str(2 * SAVE_STEPS), "--resume_from_checkpoint", "last")
    # DeepSpeed keeps the optimizer and the scheduler in its own global_step<N> folder: that is state to resume
    (checkpoint / f"global_step{SAVE_STEPS}").mkdir()
    (checkpoint / f"global_step{SAVE_STEPS}" / "mp_rank_00_model_states.pt").write_bytes(b"")
    assert check_resumable(checkpoint) == checkpoint


@pytest.mark.parametrize("output_dir", ["absolute", "./run"])
def test_the_best_checkpoint_is_recorded_by_its_final_name_before_it_is_published(
    data_dir, tmp_path, monkeypatch, output_dir
):
    """The Trainer records the best checkpoint where it wrote it (the staging folder). Under several processes
    only the saving one publishes it, so every process must hold the final name before publishing: the others
    load the best model from it at the end of training. The Trainer spells the path with os.path.join, so
    ``./run`` stays ``./run/...`` there: compared as paths, not strings."""
    flags = ["--max_steps", "4", "--save_steps", "2", "--eval_strategy", "steps", "--eval_steps", "2"]
    flags += ["--load_best_model_at_end", "true", "--validation_size", "10", "--predict_with_generate", "false"]
    monkeypatch.chdir(tmp_path)
    trainer = build(data_dir, tmp_path / "run" if output_dir == "absolute" else output_dir, *flags).trainer
    seen, publish = [], type(trainer)._publish_checkpoint

    def spy(self, staged, final, *rest):
        seen.append((self.state.best_model_checkpoint, str(final)))
        return publish(self, staged, final, *rest)

    monkeypatch.setattr(type(trainer), "_publish_checkpoint", spy)
    trainer.train()
    assert len(seen) == 2 and all(STAGING_DIR not in best for best, _ in seen), seen
    assert Path(trainer.state.best_model_checkpoint) in [Path(final) for _, final in seen]
    saved = json.loads((Path(seen[-1][1]) / "trainer_state.json").read_text())
    assert Path(saved["best_model_checkpoint"]) == Path(trainer.state.best_model_checkpoint)
    assert Path(trainer.state.best_model_checkpoint).is_dir()
    from vanilla_transformer.training.run import best_and_scoring_lines  # the card names where its weights are from

    best = Path(trainer.state.best_model_checkpoint).name
    assert best_and_scoring_lines(trainer, scored=False) == {"weights from": f"the best checkpoint, {best}"}


def test_resuming_an_earlier_checkpoint_than_the_latest_is_refused_naming_the_later_ones(data_dir, tmp_path):
    """The later checkpoints of the abandoned run would sit beside the new run's: `last` would resume from them
    and averaging would mix the runs. Refused before the data is read; once they are moved away, it resumes."""
    output = tmp_path / "run"
    build(data_dir, output, "--max_steps", "4", "--save_steps", "2").trainer.train()
    assert {folder.name for folder in output.glob("checkpoint-*")} == {"checkpoint-2", "checkpoint-4"}
    earlier = ["--max_steps", "6", "--save_steps", "2", "--resume_from_checkpoint", str(output / "checkpoint-2")]
    with pytest.raises(ValueError, match=r"also holds later checkpoints \(checkpoint-4\) of the run it goes back on"):
        build(data_dir, output, *earlier)
    (output / "checkpoint-4").rename(tmp_path / "set-aside")
    assert build(data_dir, output, *earlier).resume == output / "checkpoint-2"


def test_trainer_writes_no_checkpoint_folder_before_it_is_complete(four_steps):
    """While the Trainer writes, only the temporary folder exists; checkpoint-<step> appears by one rename."""
    output, seen = four_steps
    assert seen == [(str(output / STAGING_DIR / f"checkpoint-{SAVE_STEPS}"), [])]
    check_resumable(output / f"checkpoint-{SAVE_STEPS}")
    assert not (output / STAGING_DIR).exists()


@pytest.mark.parametrize("extra", [[], ["--ema_decay", "0.9"]], ids=["last weights", "moving average"])
def test_resuming_a_finished_run_trains_no_further_update(data_dir, tmp_path, extra, caplog):
    """A run resumed from the checkpoint that ended its training (a requeued job whose evaluation was cut short)
    trains nothing more: the same model as the finished run's (its moving average with --ema_decay), the same
    update count, no new checkpoint. The Trainer alone would run one more update first."""
    output = tmp_path / "run"
    steps = ["--max_steps", str(2 * SAVE_STEPS), *extra]
    first = train.build_trainer(*train.parse_arguments(run_argv(data_dir, output, *steps)))
    first.trainer.train()
    finished = {name: p.detach().clone() for name, p in first.trainer.model.state_dict().items()}
    argv = run_argv(data_dir, output, *steps, "--resume_from_checkpoint", "last")
    again = train.build_trainer(*train.parse_arguments(argv))
    with caplog.at_level(logging.WARNING):
        result = again.trainer.train(resume_from_checkpoint=str(again.resume))
    assert result.global_step == again.trainer.state.global_step == 2 * SAVE_STEPS
    # the first trainer saved no trainer_state.json of its own (train.main does): its train_* metrics are unknown
    assert result.metrics == {} and "the train_* metrics of that training are not known" in caplog.text
    for name, tensor in again.trainer.model.state_dict().items():
        assert torch.equal(tensor, finished[name]), name
    assert sorted(p.name for p in output.glob("checkpoint-*")) == [
        f"checkpoint-{SAVE_STEPS}",
        f"checkpoint-{2 * SAVE_STEPS}",
    ]


def test_a_requeued_finished_run_keeps_the_train_metrics_of_the_training_it_found(data_dir, tmp_path):
    """The whole command run again after it finished (a requeued job): nothing is trained, and all_results.json
    and trainer_state.json were rewritten without the train_* metrics (train_runtime, train_loss, the
    throughput) of the training that made the model. The reference: the first run's own all_results.json."""
    output = tmp_path / "run"
    argv = run_argv(data_dir, output, "--max_steps", str(2 * SAVE_STEPS))
    train.main(argv)
    argv += ["--resume_from_checkpoint", "last"]  # the requeued job's command (docs/training.md)
    first = json.loads((output / "all_results.json").read_text())
    trained = {key: value for key, value in first.items() if key.startswith("train_")}
    assert {"train_runtime", "train_loss", "train_target_tokens_per_second"} <= set(trained)
    state = json.loads((output / "trainer_state.json").read_text())
    train.main(argv)
    again = json.loads((output / "all_results.json").read_text())
    assert {key: again.get(key) for key in trained} == trained
    assert json.loads((output / "trainer_state.json").read_text())["log_history"] == state["log_history"]
    # a damaged trainer_state.json, or another run's that ended at the same update: its metrics are not taken
    other = {**state, "log_history": [{**state["log_history"][0], "loss": 99.0}, *state["log_history"][1:]]}
    for text in ("null", "[]", '{"log_history": null}', "{not json", json.dumps(other)):
        (output / "trainer_state.json").write_text(text)
        train.main(argv)
        assert "train_runtime" not in json.loads((output / "all_results.json").read_text()), text


@pytest.mark.floor  # transformers before 5.20 counts train_loss otherwise: said only from 5.20
def test_a_resumed_run_says_its_train_metrics_cover_the_updates_since_the_resume(data_dir, tmp_path, caplog):
    """The Trainer's train_loss and train_runtime of a resumed run cover its own updates, not the run's: said
    in the log, and true (train_loss is the mean of the losses logged for those updates)."""
    output = tmp_path / "run"
    build(data_dir, output, "--max_steps", "4", "--save_steps", "2").trainer.train()
    shutil.rmtree(output / "checkpoint-4")
    with caplog.at_level(logging.INFO):
        train.main(
            run_argv(data_dir, output, "--max_steps", "4", "--save_steps", "2", "--resume_from_checkpoint", "last")
        )
    said = f"cover updates 3-4, trained since resuming from {output / 'checkpoint-2'}" in caplog.text
    if Version(transformers.__version__) < train.TRAIN_METRICS_OF_THE_RESUMED_UPDATES:
        assert not said  # train_loss there: their loss over the whole run's updates, which nothing can say simply
        return
    assert said
    losses = {
        entry["step"]: entry["loss"]
        for entry in json.loads((output / "trainer_state.json").read_text())["log_history"]
        if "loss" in entry
    }
    assert sorted(losses) == [1, 2, 3, 4]  # the whole run's curve
    trained = json.loads((output / "all_results.json").read_text())["train_loss"]
    assert trained == pytest.approx((losses[3] + losses[4]) / 2, abs=1e-3)
    assert trained != pytest.approx(sum(losses.values()) / 4, abs=1e-3)


class UpdatesSeen(train.TrainerCallback, ExportableState):
    """A user's callback with a state that checkpoints keep (as early stopping's patience)."""

    def __init__(self):
        self.updates = 0

    def state(self) -> dict:
        return {"args": {}, "attributes": {"updates": self.updates}}

    def on_step_end(self, args, state, control, **kwargs):
        self.updates += 1
        return control


@pytest.mark.parametrize("restore", [(), ("--restore_callback_states_from_checkpoint", "true")])
def test_the_training_budget_counts_the_minutes_trained_before_a_resume(data_dir, tmp_path, restore):
    """--max_train_minutes is the whole run's: each checkpoint's trainer_state.json holds the seconds trained
    until it, and the run resumed from it starts its clock there (the Trainer's own resume, in process), with
    the budget the resumed run gives. Restoring callback states, the Trainer made a clock of the checkpoint's
    budget and moved it last: now it restores a user's callback where it was and leaves the run's own."""
    output = tmp_path / "run"
    first = train.build_trainer(
        *train.parse_arguments(run_argv(data_dir, output, "--max_steps", "4", "--max_train_minutes", "60"))
    )
    first.trainer.add_callback(UpdatesSeen())
    first.trainer.train()
    saved = json.loads((output / "checkpoint-4" / "trainer_state.json").read_text())["stateful_callbacks"]
    trained = saved["WallClock"]["attributes"]["trained_before"]
    assert 0 < trained < 60
    argv = run_argv(
        data_dir, output, "--max_steps", "8", "--max_train_minutes", "90", "--resume_from_checkpoint", "last", *restore
    )
    resumed = train.build_trainer(*train.parse_arguments(argv))
    resumed.trainer.add_callback(UpdatesSeen())
    order = [type(c) for c in resumed.trainer.callback_handler.callbacks]
    resumed.trainer.train(resume_from_checkpoint=str(resumed.resume))
    assert [type(c) for c in resumed.trainer.callback_handler.callbacks] == order
    clocks = [c for c in resumed.trainer.callback_handler.callbacks if isinstance(c, WallClock)]
    assert clocks == [resumed.trainer.wall_clock] and resumed.trainer.wall_clock.max_minutes == 90
    assert resumed.trainer.wall_clock.trained_before == pytest.approx(trained)
    later = json.loads((output / "checkpoint-8" / "trainer_state.json").read_text())["stateful_callbacks"]
    assert later["WallClock"]["attributes"]["trained_before"] > trained
    seen = next(c for c in resumed.trainer.callback_handler.callbacks if isinstance(c, UpdatesSeen))
    assert seen.updates == (8 if restore else 4)


def trained_and_pushed(data_dir: Path, tmp_path: Path, name: str, *flags: str) -> dict:
    """training/train.py with --push_to_hub to a loopback Hub (output in tmp_path/pushed): the files of the
    repository's main branch."""
    from hub_server import USER, LoopbackHub, client_environment

    hub = LoopbackHub(tmp_path / "hub", lifetime=600).start()
    try:
        repo = f"{USER}/{name}"
        env = {**os.environ, **client_environment(hub, tmp_path / "home"), "PYTHONPATH": str(REPO)}
        argv = [*run_argv(data_dir, tmp_path / "pushed", *flags), "--push_to_hub", "--hub_model_id", repo]
        completed = subprocess.run(
            [sys.executable, str(REPO / "training/train.py"), *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert completed.returncode == 0, completed.stderr[-3000:]
        return hub.store.files(repo, hub.store.resolve(repo, "main"))
    finally:
        hub.stop()


def test_push_to_hub_uploads_the_averaged_model_and_the_projects_card(data_dir, tmp_path):
    """--push_to_hub with --average_checkpoints: the Hub gets the final folder as saved (the mean of the last
    checkpoints, and the card that says so), not the last weights the Trainer pushed while saving. Reference:
    the local final folder. The card names the checkpoints the mean is of: 3 asked for, 2 kept."""
    from hub_server import TOKEN, USER

    output = tmp_path / "pushed"
    files = trained_and_pushed(
        data_dir, tmp_path, "averaged", "--max_steps", str(2 * SAVE_STEPS), "--average_checkpoints", "3",
        "--hub_token", TOKEN,
    )  # fmt: skip
    pushed, card = files["model.safetensors"].read_bytes(), files["README.md"].read_text()
    assert pushed == (output / "model.safetensors").read_bytes()
    assert pushed != (output / f"checkpoint-{2 * SAVE_STEPS}" / "model.safetensors").read_bytes()  # not the last
    line = f"2 of the 3 asked for (uniform weights): checkpoint-{SAVE_STEPS}, checkpoint-{2 * SAVE_STEPS}"
    assert line in card and line in (output / "README.md").read_text()
    # the token given as --hub_token reached the repository in training_args.bin, which the Trainer's pushes
    # uploaded with the run's other files; the card's examples loaded <user>/pushed
    assert not [name for name, path in files.items() if TOKEN.encode() in path.read_bytes()]
    assert not [path for path in output.rglob("training_args.bin") if TOKEN.encode() in path.read_bytes()]
    assert not [name for name in files if name == "training_args.bin" or name.startswith(("tokenizer/", "runs/"))]
    assert f'model="{USER}/averaged"' in card and "<user>/" not in card


def test_push_to_hub_uploads_each_checkpoint_from_its_final_name(data_dir, tmp_path):
    """The Trainer uploads a checkpoint in the background; from the temporary folder, renamed meanwhile,
    that upload would lose files. Reference: the files of the last local checkpoint."""
    output = tmp_path / "pushed"
    files = trained_and_pushed(data_dir, tmp_path, "faults", "--max_steps", "4", "--hub_strategy", "checkpoint")
    pushed = {name.removeprefix("last-checkpoint/") for name in files if name.startswith("last-checkpoint/")}
    local = output / f"checkpoint-{SAVE_STEPS}"
    assert pushed == {path.name for path in local.iterdir()}
    assert files["last-checkpoint/model.safetensors"].read_bytes() == (local / "model.safetensors").read_bytes()
    assert not [name for name in files if STAGING_DIR in name]


def test_a_failed_write_on_a_failing_filesystem_still_says_what_is_known(tmp_path, monkeypatch):
    """Listing the folder or reading its free space can fail as the write did (EIO, a stale NFS handle): the
    message is still made, without the figures it could not read."""
    from vanilla_transformer.training import checkpointing

    (tmp_path / "run" / "checkpoint-4").mkdir(parents=True)

    def failing(path):
        raise OSError(errno.ESTALE, "Stale file handle")

    monkeypatch.setattr(checkpointing.shutil, "disk_usage", failing)
    message = checkpointing._write_failure(OSError(errno.EIO, "I/O error"), tmp_path / "run", "checkpoint-8")
    assert "OSError: [Errno 5] I/O error (nan MiB free on that filesystem)" in message, message
    assert "Check the filesystem of" in message and "then continue with --resume_from_checkpoint last" in message
