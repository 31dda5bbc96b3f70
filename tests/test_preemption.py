"""Preemption: SIGTERM saves a resumable checkpoint within --preemption_grace_seconds and exits 143.

A scheduler preempts with SIGTERM and, a grace period later, SIGKILL. The reference for "the run
finishes as if nothing happened" is an uninterrupted run with the same seed and data, in a separate
process like the interrupted one (test_faults' fixture): the final weights must be equal. A budget
too small for the whole checkpoint is simulated by a grace of a microsecond: the checkpoint then
holds what resuming needs, and leaves the moving average out, saying so.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import TrainerState

from test_bad_input import refused_before_reading, train_argv
from test_faults import (  # noqa: F401 - data_dir and uninterrupted are fixtures
    MAX_STEPS,
    REPO,
    SAVE_STEPS,
    assert_same_weights,
    build,
    data_dir,
    finish,
    run_argv,
    uninterrupted,
    wait_for_updates,
)
from vanilla_transformer.training import run as train
from vanilla_transformer.training.checkpointing import (
    LEFT_OUT_NAME,
    RESUME_POINT_NAME,
    SAME_SIGNAL_SECONDS,
    StopOnSignal,
    TrainingInterrupted,
    check_resumable,
)
from vanilla_transformer.training.moving_average import EMA_FILE, ExponentialMovingAverage

# training/train.py as a user starts it, with two test hooks set by the environment: a pause before each
# update that prints the updates done (so that a signal lands mid-run), and a SIGTERM to itself in the
# middle of writing one checkpoint (the weights written, the optimizer state not yet).
DRIVER = textwrap.dedent("""
    import os, runpy, signal, sys, time
    from vanilla_transformer.training.trainer import TransformerTrainer

    pause = float(os.environ.get("PREEMPT_PAUSE", "0"))
    signal_at = int(os.environ.get("PREEMPT_SIGTERM_WHILE_SAVING", "-1"))
    signal_in = os.environ.get("PREEMPT_SIGTERM_IN")  # evaluate, save_final_model or build_trainer: outside training
    training_step = TransformerTrainer.training_step
    save_optimizer = TransformerTrainer._save_optimizer_and_scheduler

    def paused_step(self, *args, **kwargs):
        print(f"updates done: {self.state.global_step}", flush=True)
        time.sleep(pause)
        return training_step(self, *args, **kwargs)

    def signalled_while_saving(self, output_dir):
        if self.state.global_step == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        save_optimizer(self, output_dir)

    def signalled_first(function):
        def signalled(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return function(*args, **kwargs)

        return signalled

    TransformerTrainer.training_step = paused_step
    TransformerTrainer._save_optimizer_and_scheduler = signalled_while_saving
    if signal_in == "evaluate":
        TransformerTrainer.evaluate = signalled_first(TransformerTrainer.evaluate)
    elif signal_in:
        from vanilla_transformer.training import run

        setattr(run, signal_in, signalled_first(getattr(run, signal_in)))
    sys.argv = [sys.argv[1], *sys.argv[2:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def start(
    data_dir: Path,
    output_dir: Path,
    *extra: str,
    pause: float = 0.0,
    sigterm_while_saving: int = -1,
    sigterm_in: str = "",
    own_process_group: bool = False,
):
    """As test_faults.start (the final model: the mean of checkpoints 4, 8 and 12), with the hooks above."""
    driver = data_dir / "preemption_driver.py"
    driver.write_text(DRIVER)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PREEMPT_PAUSE": str(pause),
        "PREEMPT_SIGTERM_WHILE_SAVING": str(sigterm_while_saving),
        "PREEMPT_SIGTERM_IN": sigterm_in,
    }
    command = [
        sys.executable,
        str(driver),
        str(REPO / "training/train.py"),
        *run_argv(data_dir, output_dir, "--average_checkpoints", "3", *extra),
    ]
    log = output_dir.with_name(output_dir.name + ".log")  # a file, not a pipe: a full pipe would stall the run
    attempt = len(list(log.parent.glob(log.name + "*")))
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=own_process_group,
        stderr=open(f"{log}{attempt}", "w", encoding="utf-8"),
    )
    process.log = Path(f"{log}{attempt}")
    return process


def resume_to_the_end(data_dir: Path, output: Path) -> str:
    code, _, err = finish(start(data_dir, output, "--resume_from_checkpoint", "last"))
    assert code == 0, err[-3000:]
    return err


def stopped_at(err: str, by: str = "SIGTERM") -> int:
    return int(err.split(f"Training stopped by {by} at step ")[1].split()[0])


def test_sigterm_saves_within_the_budget_exits_143_and_resume_gives_the_uninterrupted_model(data_dir, uninterrupted):
    output = data_dir / "preempted"
    process = start(data_dir, output, pause=0.5)
    # in update SAVE_STEPS + 2, between two regular checkpoints: it stops there or after the next (the reader
    # seconds late on a loaded machine), still short of the next regular step
    wait_for_updates(process, SAVE_STEPS + 1)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code, _, err = finish(process)
    assert time.monotonic() - sent < 25  # the default budget, process exit included
    assert code == 128 + signal.SIGTERM, err[-3000:]  # 143: the requeue code (docs/training.md)
    step = stopped_at(err)
    assert step % SAVE_STEPS and step < MAX_STEPS  # saved where it stopped, not at a regular step
    assert f"saved a resumable checkpoint, {output / f'checkpoint-{step}'}" in err
    assert "within 25 s (--preemption_grace_seconds)" in err and "Traceback" not in err
    check_resumable(output / f"checkpoint-{step}")
    assert not (output / f"checkpoint-{step}" / LEFT_OUT_NAME).exists()  # nothing left out: there was time
    assert not (output / "model.safetensors").exists()  # an interrupted run is not a final model
    resume_to_the_end(data_dir, output)
    names = sorted(p.name for p in uninterrupted.glob("checkpoint-*"))
    assert sorted(p.name for p in output.glob("checkpoint-*")) == names  # the point saved on SIGTERM: gone
    assert_same_weights(output, uninterrupted)


def test_sigterm_while_a_checkpoint_is_written_stops_after_it_and_resume_gives_the_uninterrupted_model(
    data_dir, uninterrupted
):
    output = data_dir / "preempted-while-saving"
    code, out, err = finish(start(data_dir, output, sigterm_while_saving=2 * SAVE_STEPS))
    assert code == 128 + signal.SIGTERM, err[-3000:]
    # The regular checkpoint being written is finished and is the one to resume from: no further update.
    assert stopped_at(err) == 2 * SAVE_STEPS and "Traceback" not in err
    assert f"updates done: {2 * SAVE_STEPS}" not in out
    checkpoint = output / f"checkpoint-{2 * SAVE_STEPS}"
    check_resumable(checkpoint)
    assert not (checkpoint / RESUME_POINT_NAME).exists()  # a regular checkpoint, kept by the resumed run
    assert sorted(p.name for p in output.glob("checkpoint-*")) == [f"checkpoint-{SAVE_STEPS}", checkpoint.name]
    resume_to_the_end(data_dir, output)
    assert_same_weights(output, uninterrupted)


@pytest.mark.parametrize(
    "number",
    [pytest.param(signal.SIGTERM, marks=pytest.mark.slow), signal.SIGINT],  # the workers ignore both alike
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signal_to_every_process_data_loader_workers_too_saves_once(data_dir, tmp_path, number):
    """SLURM signals every process of a job step, and a terminal's Ctrl-C its whole foreground process group: the
    data loader's workers too. A worker killed by SIGTERM would end the run before the checkpoint (torch raises
    "DataLoader worker ... is killed by signal" in the main process); workers forked with the run's handler each
    said "SIGINT received" as if they would save. The main process alone saves, and says so once."""
    name = signal.Signals(number).name
    output = tmp_path / "whole-group"
    process = start(data_dir, output, "--dataloader_num_workers", "2", pause=0.3, own_process_group=True)
    wait_for_updates(process, 2)
    os.killpg(process.pid, number)
    code, _, err = finish(process)
    assert code == 128 + number, err[-3000:]
    assert "Traceback" not in err and err.count(f"{name} received") == 1, err[-3000:]
    check_resumable(output / f"checkpoint-{stopped_at(err, name)}")


def signalled_in_a_worker(collate):
    """``collate``, sending the worker that runs it a SIGTERM first, as SLURM signals every process of a job."""

    def collate_after_a_sigterm(features):
        if torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGTERM)
        return collate(features)

    return collate_after_a_sigterm


@pytest.mark.parametrize("loader", ["evaluation", "prediction", "sentence batches"])
def test_the_workers_of_every_data_loader_leave_a_sigterm_to_the_main_process(data_dir, tmp_path, loader):
    """Token batches' workers ignored SIGTERM; those transformers makes (evaluation, prediction, training with
    --max_tokens 0) died of it, and the main process raised "DataLoader worker ... is killed by signal" in the
    middle of an evaluation inside training, before any checkpoint."""
    extra = ("--max_tokens", "0", "--per_device_train_batch_size", "8") if loader == "sentence batches" else ()
    trainer = build(data_dir, tmp_path / "run", "--dataloader_num_workers", "1", *extra).trainer
    trainer.data_collator = signalled_in_a_worker(trainer.data_collator)
    dataset = trainer.train_dataset = trainer.train_dataset.select(range(16))
    make = {
        "evaluation": lambda: trainer.get_eval_dataloader(dataset),
        "prediction": lambda: trainer.get_test_dataloader(dataset),
        "sentence batches": trainer.get_train_dataloader,
    }[loader]
    batches = list(make())  # a worker killed by the signal: RuntimeError
    assert sum(len(batch["input_ids"]) for batch in batches) == 16


class SignalAt(train.TrainerCallback):
    def __init__(self, step: int, number: int = signal.SIGTERM):
        self.step, self.number = step, number

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.number)


def ema_updates(folder: Path) -> int:
    with safe_open(str(folder / EMA_FILE), framework="pt") as file:
        return int(file.metadata()["updates"])


def test_with_time_to_spare_a_sigterm_checkpoint_holds_the_moving_average(data_dir, tmp_path):
    trainer = build(data_dir, tmp_path / "run", "--ema_decay", "0.9").trainer
    trainer.add_callback(SignalAt(2))
    with pytest.raises(TrainingInterrupted) as interrupted:
        trainer.train()
    checkpoint = interrupted.value.checkpoint
    assert checkpoint == tmp_path / "run" / "checkpoint-3" and interrupted.value.signal_number == signal.SIGTERM
    assert ema_updates(checkpoint) == 3 and not (checkpoint / LEFT_OUT_NAME).exists()


def test_a_signal_at_a_timed_save_makes_it_a_whole_checkpoint(data_dir, tmp_path):
    """--save_minutes wants a save at the update the signal stops after: a regular checkpoint (kept, averaged),
    not a point to resume from only, whichever callback learns of the save first."""
    trainer = build(data_dir, tmp_path / "run", "--save_minutes", "1e-9").trainer  # a save after every update
    trainer.add_callback(SignalAt(2))
    with pytest.raises(TrainingInterrupted) as interrupted:
        trainer.train()
    checkpoint = interrupted.value.checkpoint
    assert checkpoint == tmp_path / "run" / "checkpoint-3"
    assert not (checkpoint / RESUME_POINT_NAME).exists()


def test_a_budget_too_small_for_the_whole_checkpoint_saves_what_resumes_says_so_and_resumes(data_dir, tmp_path, caplog):
    extra = ("--ema_decay", "0.9", "--preemption_grace_seconds", "1e-6")
    reference = build(data_dir, tmp_path / "uninterrupted", *extra).trainer
    reference.train()
    output = tmp_path / "run"
    trainer = build(data_dir, output, *extra).trainer
    trainer.add_callback(SignalAt(SAVE_STEPS + 1))
    with caplog.at_level(logging.WARNING), pytest.raises(TrainingInterrupted) as interrupted:
        trainer.train()
    step = interrupted.value.step
    checkpoint = output / f"checkpoint-{step}"
    assert interrupted.value.checkpoint == checkpoint and step == SAVE_STEPS + 2
    check_resumable(checkpoint)  # weights, optimizer, scheduler, RNG and trainer state: all there
    assert not (checkpoint / EMA_FILE).exists()
    assert "grace budget" in json.loads((checkpoint / LEFT_OUT_NAME).read_text())[EMA_FILE]
    assert any(f"not the moving average of the weights ({EMA_FILE})" in record.message for record in caplog.records)
    assert ema_updates(output / f"checkpoint-{SAVE_STEPS}") == SAVE_STEPS  # a regular save has no budget
    with pytest.raises(ValueError, match=LEFT_OUT_NAME):
        ExponentialMovingAverage.from_checkpoint(checkpoint)
    # Resuming takes it, says that the average starts again, and trains as the uninterrupted run did.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        resumed = build(data_dir, output, *extra, "--resume_from_checkpoint", "last")
        assert resumed.resume == checkpoint
        resumed.trainer.train(resume_from_checkpoint=str(resumed.resume))
    assert any("the average starts again" in record.message for record in caplog.records)
    last = f"checkpoint-{MAX_STEPS}"
    assert_same_weights(output / last, tmp_path / "uninterrupted" / last)  # checkpoints hold the trained weights
    assert ema_updates(output / last) == MAX_STEPS - step  # the average of the updates since the resume
    assert ema_updates(tmp_path / "uninterrupted" / last) == MAX_STEPS
    # Resuming from a later checkpoint, whose average covers fewer updates than its trainer state: it goes on
    # (it began anew once, and says so), not "starts again"
    caplog.clear()
    average = ExponentialMovingAverage.from_checkpoint(output / last)
    with caplog.at_level(logging.INFO):
        average.on_train_begin(None, TrainerState(global_step=MAX_STEPS), None)
    said = " ".join(record.message for record in caplog.records)
    assert f"with the moving average of the weights of the last {MAX_STEPS - step}" in said
    assert "starts again" not in said and average.updates == MAX_STEPS - step


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--preemption_grace_seconds", "0"], "--preemption_grace_seconds must be positive"),
        (["--preemption_grace_seconds", "nan"], "--preemption_grace_seconds must be positive"),
        (["--enable_jit_checkpoint"], "--enable_jit_checkpoint: the trainer saves a checkpoint on SIGTERM itself"),
    ],
)
def test_preemption_flags_out_of_range_are_refused_before_reading_data(flags, message):
    assert message in refused_before_reading(train_argv(*flags))


def test_under_a_launcher_a_grace_past_its_sigkill_is_refused_before_reading_data(monkeypatch):
    """torchrun's agent sends SIGKILL 30 s after it passes a SIGTERM on (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, which
    torch 2.13 reads, sets that time): a grace of 90 s would be cut at 30, and the checkpoint with it."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    message = refused_before_reading(train_argv("--preemption_grace_seconds", "90"))
    assert "sends SIGKILL 30 s after it passes a SIGTERM on" in message and "within 25 s" in message
    train.parse_arguments(train_argv("--preemption_grace_seconds", "25"))  # the default fits
    for name in ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "PET_SHUTDOWN_TIMEOUT"):  # torch's variable, torchrun's flag's
        monkeypatch.setenv(name, "120")
        train.parse_arguments(train_argv("--preemption_grace_seconds", "90"))
        monkeypatch.delenv(name)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    train.parse_arguments(train_argv("--preemption_grace_seconds", "600"))  # no launcher: the scheduler's call


class Voters:
    """What `StopOnSignal` sees of a trainer on one of two processes: the other process's votes, and a hook that
    runs inside the all-reduce (where a signal's handler runs once the collective returns)."""

    def __init__(self, others: list[list[float]], during=None):
        self.args = type("Args", (), {"world_size": 2})()
        self.accelerator, self.resume_point_only = self, False
        self.device, self.others, self.during = "cpu", others, during

    def reduce(self, tensor, reduction):
        if self.during is not None:
            self.during()
            self.during = None
        return tensor + torch.tensor(self.others.pop(0))


def test_a_signal_during_the_vote_counts_at_the_next_vote_on_every_process():
    """A SIGTERM handled while this process waits in the vote: the vote (nobody had one) decides, for this process
    as for the other, and no grace deadline applies before they agree; the next vote stops both."""
    stop = StopOnSignal(None, grace_seconds=25)
    stop.trainer = Voters([[0, 0], [0, 0]], during=lambda: stop._handle(signal.SIGTERM, None))
    assert stop._stop_requested() is False  # the other process, given the same sum, does not stop either
    assert stop.deadline() is None  # a checkpoint written now holds what the other's holds
    assert stop._stop_requested() is True and stop.received == signal.SIGTERM
    assert stop.deadline() == pytest.approx(stop.received_at + 25)


def test_a_signal_after_the_last_vote_stops_every_process_at_the_end_alike():
    stop = StopOnSignal(None, grace_seconds=25)
    stop.trainer = Voters([[0, 1]])  # the other process got a SIGTERM after the last update's vote
    with pytest.raises(TrainingInterrupted, match="Training stopped by SIGTERM at step 7"):
        stop.raise_if_stopped(7)
    calm = StopOnSignal(None, grace_seconds=25)
    calm.trainer = Voters([[0, 0]])
    calm.raise_if_stopped(7)  # nobody got one: both go on to evaluate and save


@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="POSIX signals")
def lone_stop_on_signal() -> StopOnSignal:
    """StopOnSignal of one process with a 25 s grace budget, outside a Trainer."""
    stop = StopOnSignal(None, grace_seconds=25)
    stop.trainer = Voters([])
    stop.trainer.args.world_size = 1
    return stop


def test_a_second_sigterm_is_ignored_and_a_second_ctrl_c_stops_at_once():
    """SLURM signals every process of a step and torchrun passes its own SIGTERM on: each process gets two at
    once, and the second must not kill it before it saves. Ctrl-C twice still means "stop now"."""
    stop = lone_stop_on_signal()
    with stop.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # before this test, the default handler: the process died here
        assert stop.received == signal.SIGTERM and signal.getsignal(signal.SIGTERM) == stop._handle
        with pytest.raises(KeyboardInterrupt):  # the handler before the run's, given the Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class SignalledMidWrite(io.RawIOBase):
    """A terminal whose first write is interrupted by ``number``: the handler runs inside io.BufferedWriter's write,
    as when a signal lands while a progress bar is drawn."""

    def __init__(self, number: int):
        self.number, self.written = number, bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self.number is not None:
            number, self.number = self.number, None
            os.kill(os.getpid(), number)  # Python runs the handler here, before the next instruction
        self.written += data
        return len(data)


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_write_to_stderr_is_said_after_it(monkeypatch, number):
    """Before this test, the handler's warning went to the stderr it had interrupted: io's "reentrant call inside
    <_io.BufferedWriter>" RuntimeError, raised into the training step that was writing."""
    terminal = SignalledMidWrite(number)
    stderr = io.TextIOWrapper(io.BufferedWriter(terminal), line_buffering=True)
    monkeypatch.setattr(sys, "stderr", stderr)  # logging's own error report goes there too
    said = logging.StreamHandler(stderr)
    checkpointing_log = logging.getLogger("vanilla_transformer.training.checkpointing")
    checkpointing_log.addHandler(said)
    stop = lone_stop_on_signal()
    try:
        with stop.installed():
            stderr.write("a progress bar\n")  # the signal lands inside this write
            assert stop.received == number
    finally:
        checkpointing_log.removeHandler(said)
    stderr.flush()
    lines = terminal.written.decode().splitlines()
    name = signal.Signals(number).name
    assert lines[0] == "a progress bar" and lines[1].startswith(f"{name} received: finishing this update")


def test_signal_lines_of_blocks_opened_within_each_other_are_all_written_and_each_block_ends(caplog):
    """Both blocks' threads read one queue: the inner block's end went to the outer thread, and its join waited
    forever. Run in a thread of its own, so that a hang fails the test instead of stopping the suite."""
    import threading

    from vanilla_transformer.training.checkpointing import SignalSafeLog

    log = SignalSafeLog()

    def nested() -> None:
        with log.open():
            log.say("outer, first")
            with log.open():
                log.say("inner")
            log.say("outer, second")
        log.say("after both")

    with caplog.at_level(logging.WARNING, logger="vanilla_transformer.training.checkpointing"):
        runner = threading.Thread(target=nested, daemon=True)
        runner.start()
        runner.join(timeout=20)
    assert not runner.is_alive(), "a block's end waited forever"
    written = [r.getMessage() for r in caplog.records]  # each block's thread writes as it can: any order across them
    assert sorted(written) == sorted(["outer, first", "inner", "outer, second", "after both"]), written


def test_a_second_ctrl_c_goes_to_the_handler_before_and_leaves_it_installed():
    """The second Ctrl-C is handed to the SIGINT handler that was there before training (here: ignoring it, as a job
    started in the background has), which stays after training; the first within the window was taken as the same."""
    stop = lone_stop_on_signal()
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop.installed():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # the same one, delivered twice
            assert signal.getsignal(signal.SIGINT) == stop._handle
            time.sleep(SAME_SIGNAL_SECONDS + 0.05)
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C: the handler before (ignored)
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_handler_installed_outside_python_gives_way_to_pythons_own_after_training(monkeypatch):
    """signal.getsignal says None for a handler an embedding program installed before Python: it cannot be put
    back, and StopOnSignal's own stayed installed after training (every later Ctrl-C dropped, the Trainer kept
    alive by it). Python's own handlers take its place."""
    stop = lone_stop_on_signal()
    before = {number: signal.getsignal(number) for number in StopOnSignal.SIGNALS}
    getsignal = signal.getsignal
    monkeypatch.setattr(signal, "getsignal", lambda number: None)
    try:
        with stop.installed():
            monkeypatch.setattr(signal, "getsignal", getsignal)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def test_a_sigterm_after_a_ctrl_c_is_a_preemption_with_its_budget():
    """Ctrl-C, then the scheduler's SIGTERM before the checkpoint is written: the run must save within the SIGTERM's
    grace budget and end as preempted (143, what a requeue script waits for), not as the Ctrl-C without a budget."""
    stop = lone_stop_on_signal()
    with stop.installed():
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.received == signal.SIGINT and stop.deadline() is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == signal.SIGTERM
        assert stop.deadline() == pytest.approx(stop.received_at + 25)


@pytest.mark.parametrize("eval_sets", [1, 2], ids=["one-eval-set", "two-eval-sets"])
def test_a_signal_during_an_evaluation_in_training_saves_without_finishing_it(data_dir, tmp_path, eval_sets):
    """SIGTERM while training evaluates: the evaluation ends at its next batch (not after the whole validation set,
    past the grace budget), the update it followed is saved, and training stops there, resumable. The save is a
    point to resume from only (rotation and averaging leave it out), with several evaluation sets too (the
    Trainer evaluates each in turn, and each stops)."""
    extra = ["--validation_size", "20", "--do_train", "true", "--do_eval", "true", "--eval_strategy", "steps"]
    extra += ["--eval_steps", "2", "--per_device_eval_batch_size", "4"]
    trainer = build(data_dir, tmp_path / "run", *extra).trainer
    if eval_sets == 2:
        trainer.eval_dataset = {"first": trainer.eval_dataset, "second": trainer.eval_dataset}
    calls, generate = [], trainer.model.generate

    def generate_and_signal(*args, **kwargs):
        calls.append(trainer.state.global_step)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return generate(*args, **kwargs)

    trainer.model.generate = generate_and_signal
    with pytest.raises(TrainingInterrupted) as interrupted:
        trainer.train()
    assert calls == [2]  # one batch of the five, then the evaluation ended
    assert interrupted.value.checkpoint == tmp_path / "run" / "checkpoint-2" and trainer.state.global_step == 2
    check_resumable(interrupted.value.checkpoint)
    assert (interrupted.value.checkpoint / RESUME_POINT_NAME).is_file()


def signal_self(number: int):
    """A stand-in that signals this process, as a terminal would while the real call runs."""

    def stand_in(original):
        def signalled(*args, **kwargs):
            os.kill(os.getpid(), number)
            return original(*args, **kwargs)

        return signalled

    return stand_in


OUTSIDE_TRAINING = ["--validation_size", "8", "--save_strategy", "steps", "--save_steps", "2"]


def stopped_outside_training(data_dir: Path, output: Path, where: str, said: str) -> str:
    """SIGTERM outside training (a scheduler preempting the final evaluation, or the data's tokenization) ended the
    process without a word and left its run lock. It still ends it as the signal's default does (exit status 143
    to a shell: what a requeueing script tests), after one line saying where the run stopped and what is saved,
    with --output_dir unlocked. That line."""
    code, _, err = finish(start(data_dir, output, *OUTSIDE_TRAINING, sigterm_in=where))
    assert code == -signal.SIGTERM, err[-3000:]
    lines = [line.split(": ", 1)[1] for line in err.splitlines() if " stopped by SIGTERM " in line]
    assert len(lines) == 1 and lines[0].startswith(said), err[-3000:]
    assert "Traceback" not in err and not (output / "_run.lock").exists()
    return lines[0]


@pytest.mark.parametrize(
    "where, said",
    [
        ("save_final_model", "stopped by SIGTERM after training, while saving the final model: "),
        pytest.param(  # its line is Ctrl-C's (test_a_ctrl_c_outside_training_says_where_it_stopped_in_one_line)
            "build_trainer", "stopped by SIGTERM before training started: nothing was saved", marks=pytest.mark.slow
        ),
    ],
)
def test_a_sigterm_outside_training_says_where_it_stopped_frees_the_folder_and_ends_as_killed(
    data_dir, tmp_path, where, said
):
    output = tmp_path / "run"
    line = stopped_outside_training(data_dir, output, where, said)
    if where == "save_final_model":  # the run's last checkpoint is complete: resuming from it ends the run
        assert f"{output} may be incomplete; the same command with --resume_from_checkpoint last takes " in line
        assert line.endswith(f"checkpoint-{MAX_STEPS} and trains no more")


@pytest.mark.parametrize(
    "where, said",
    [
        ("evaluate", "stopped by Ctrl-C after training, while evaluating: the model is saved in "),
        ("build_trainer", "stopped by Ctrl-C before training started: nothing was saved"),
    ],
)
def test_a_ctrl_c_outside_training_says_where_it_stopped_in_one_line(
    data_dir, tmp_path, monkeypatch, caplog, where, said
):
    """Ctrl-C after training ended in a KeyboardInterrupt traceback; now one line, exit status 130, the folder
    unlocked and the caller's SIGTERM and SIGINT handlers back."""
    output = tmp_path / "run"
    if where == "evaluate":
        monkeypatch.setattr(
            train.TransformerTrainer, "evaluate", signal_self(signal.SIGINT)(train.TransformerTrainer.evaluate)
        )
    else:
        monkeypatch.setattr(train, where, signal_self(signal.SIGINT)(getattr(train, where)))
    before, ctrl_c_before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit) as stopped:
        train.main(run_argv(data_dir, output, *OUTSIDE_TRAINING))
    assert stopped.value.code == 128 + signal.SIGINT
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("stopped by")]
    assert len(lines) == 1 and lines[0].startswith(said), lines
    assert not (output / "_run.lock").exists() and signal.getsignal(signal.SIGTERM) is before
    assert signal.getsignal(signal.SIGINT) is ctrl_c_before


@pytest.mark.slow  # a requeued finished run and a signal while evaluating stay in the default suite
def test_after_a_sigterm_in_the_final_evaluation_the_same_command_resumed_evaluates_without_training(
    data_dir, tmp_path, monkeypatch, caplog
):
    """What the line after a SIGTERM in the final evaluation promises: the same command with --resume_from_checkpoint
    last takes the last checkpoint, trains no more, and evaluates."""
    output = tmp_path / "run"
    said = "stopped by SIGTERM after training, while evaluating: the model is saved in "
    assert f"takes {output / f'checkpoint-{MAX_STEPS}'} and trains no more" in stopped_outside_training(
        data_dir, output, "evaluate", said
    )
    steps = []
    monkeypatch.setattr(train.TransformerTrainer, "training_step", lambda *a, **k: steps.append(1))
    with caplog.at_level(logging.WARNING):
        metrics = train.main(run_argv(data_dir, output, *OUTSIDE_TRAINING, "--resume_from_checkpoint", "last"))
    assert "eval_loss" in metrics and not steps
    assert f"checkpoint-{MAX_STEPS} ends the training" in caplog.text


def ready_script(path: Path, text: str, **popen) -> subprocess.Popen:
    """``text`` run as a script at ``path``, once it has printed "ready" (its handler installed)."""
    path.write_text(text)
    process = subprocess.Popen(
        [sys.executable, str(path)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    assert process.stdout.readline() == "ready\n"
    return process


FORKED_WORKERS = textwrap.dedent("""
    import multiprocessing, sys, time
    from vanilla_transformer.training.checkpointing import sigterm_ends_the_run

    def work(seconds):
        time.sleep(seconds)
        return seconds

    with sigterm_ends_the_run(lambda: print("last words", file=sys.stderr, flush=True)):
        with multiprocessing.get_context("fork").Pool(2) as pool:
            print("ready", flush=True)
            pool.map(work, [30, 30])
""")


def test_a_sigterm_to_the_process_group_ends_forked_workers_without_last_words_or_tracebacks(tmp_path):
    """datasets' map forks workers (--preprocessing_num_workers) that inherit the handler: SLURM, `timeout` and a
    pool's shutdown signal them too. A handler that raised printed a traceback from each, and the pool's clean-up
    replaced the main process's stop with its own error (exit status 1, which no requeueing script tests for)."""
    process = ready_script(tmp_path / "workers.py", FORKED_WORKERS, start_new_session=True)
    time.sleep(0.5)  # the workers are in their sleep
    os.killpg(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGTERM and err.strip().splitlines() == ["last words"], err[-3000:]


CTRL_C_IN_THE_TOKENIZATION = textwrap.dedent("""
    import glob, os, runpy, signal, sys, time
    import multiprocess
    from vanilla_transformer.training import data

    data.ROWS_PER_WORKER = 1  # every map starts its workers
    tokenize = data._TokenizePairs.__call__

    def pressed_in_a_worker(self, batch):  # the terminal's Ctrl-C reaches every process of the job
        tokenized = tokenize(self, batch)
        # once both workers are at work: a worker still starting (unpickling its first task, before any of
        # our code runs in it) has Python's default handler and prints a KeyboardInterrupt of its own
        open(f"{__file__}.started.{os.getpid()}", "w").close()
        deadline = time.monotonic() + 120
        while len(glob.glob(glob.escape(__file__) + ".started.*")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        marker = __file__ + ".pressed"
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            os.killpg(os.getpgid(0), signal.SIGINT)
        except FileExistsError:
            pass
        time.sleep(20)  # still at work when the main process stops
        return tokenized

    data._TokenizePairs.__call__ = pressed_in_a_worker
    if __name__ == "__main__":
        multiprocess.set_start_method(os.environ["START_METHOD"], force=True)
        multiprocess.set_forkserver_preload(["ctrl_c_driver"])  # the forkserver's workers are patched too
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
""")


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_a_ctrl_c_in_the_tokenizations_workers_ends_the_run_in_one_line(data_dir, tmp_path, start_method):
    """--preprocessing_num_workers starts workers that the terminal's Ctrl-C reaches too: each printed a
    KeyboardInterrupt traceback, and datasets, waiting for their results, replaced the main process's with a
    TimeoutError (exit status 1, a traceback). Now the workers leave it to the main process: one line, 130.
    Forked workers inherit the main process's handler; a forkserver's (Python 3.14's default on Linux) do not."""
    driver = tmp_path / "ctrl_c_driver.py"
    driver.write_text(CTRL_C_IN_THE_TOKENIZATION)
    output, own_data = tmp_path / "run", tmp_path / "data"  # data no other test tokenized: none in the cache
    own_data.mkdir()
    (own_data / "train.tsv").write_text((data_dir / "train.tsv").read_text() + "a b c\tc b a\n")
    data_dir = own_data
    done = subprocess.run(
        [sys.executable, str(driver), str(REPO / "training/train.py"), *run_argv(data_dir, output)]
        + ["--preprocessing_num_workers", "2"],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)]),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "START_METHOD": start_method,
        },
        capture_output=True,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job
        timeout=300,
    )
    err = done.stderr
    assert done.returncode == 128 + signal.SIGINT, err[-3000:]
    lines = [line.split(": ", 1)[1] for line in err.splitlines() if " stopped by Ctrl-C " in line]
    assert len(lines) == 1 and lines[0].startswith("stopped by Ctrl-C before training started: nothing was saved")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert not (output / "_run.lock").exists()
    pressed = Path(f"{driver}.pressed").stat().st_mtime  # when a worker pressed Ctrl-C (after the imports)
    assert time.time() - pressed < 15  # the workers, asleep for 20 s from then, were stopped, not waited for


def trained_with_two_ctrl_cs(data_dir: Path, output: Path, monkeypatch, caplog, apart: float) -> int:
    """train.main with two SIGINTs ``apart`` seconds apart before update 3; its exit status (the log in caplog)."""
    step = train.TransformerTrainer.training_step

    def interrupted_twice(self, *args, **kwargs):
        if self.state.global_step == 2:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(apart)
            os.kill(os.getpid(), signal.SIGINT)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(train.TransformerTrainer, "training_step", interrupted_twice)
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit) as stopped:
        train.main(run_argv(data_dir, output))
    return stopped.value.code


def test_a_second_ctrl_c_in_training_ends_the_run_at_once_in_one_line(data_dir, tmp_path, monkeypatch, caplog):
    """The second Ctrl-C stops without saving (`StopOnSignal`); it ended in a KeyboardInterrupt traceback, and now
    in one line that says nothing was saved by it and how to go on."""
    output = tmp_path / "run"
    code = trained_with_two_ctrl_cs(data_dir, output, monkeypatch, caplog, SAME_SIGNAL_SECONDS + 0.1)  # a person's
    assert code == 128 + signal.SIGINT
    assert (
        "stopped by Ctrl-C during training, without saving a checkpoint: --resume_from_checkpoint last" in caplog.text
    )
    assert not list(output.glob("checkpoint-*")) and not (output / "_run.lock").exists()


def test_one_ctrl_c_delivered_twice_at_once_saves_as_one(data_dir, tmp_path, monkeypatch, caplog):
    """A SIGINT sent to every process of a job (`scancel -s INT`) that a launcher passes on too (table3 --devices)
    arrives twice within milliseconds: it stopped the run at once without saving, as a second Ctrl-C does. One
    Ctrl-C: the update is saved and the run resumes from it."""
    output = tmp_path / "run"
    assert trained_with_two_ctrl_cs(data_dir, output, monkeypatch, caplog, apart=0) == 128 + signal.SIGINT
    assert caplog.text.count("SIGINT received") == 1 and "taken as the same one" in caplog.text
    assert "Training stopped by SIGINT at step 3 and saved a resumable checkpoint" in caplog.text
    check_resumable(output / "checkpoint-3")  # the update under way finished, then saved
    assert not (output / "_run.lock").exists()


SLOW_LAST_WORDS = textwrap.dedent("""
    import sys, time
    from vanilla_transformer.training.checkpointing import sigterm_ends_the_run

    def last_words():
        time.sleep(1.0)  # a lock on a slow file system
        print("last words said", file=sys.stderr, flush=True)

    with sigterm_ends_the_run(last_words):
        print("ready", flush=True)
        time.sleep(60)
""")


def test_a_second_sigterm_while_the_last_words_are_said_does_not_cut_them_short(tmp_path):
    """A launcher passes the scheduler's SIGTERM on, so two arrive: the second one killed the process before the
    line was logged and the lock given back."""
    process = ready_script(tmp_path / "slow.py", SLOW_LAST_WORDS)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGTERM and "last words said" in err, err[-3000:]


def test_an_error_is_a_ctrl_c_only_when_raised_as_one_unwound():
    """What `main` answers as a Ctrl-C: the KeyboardInterrupt, or an error raised while one unwound (datasets'
    TimeoutError); not an error of its own, nor one raised later after an interrupt was handled."""
    from vanilla_transformer.training.checkpointing import stopped_by_ctrl_c

    def raised(make):
        try:
            make()
        except BaseException as error:  # noqa: BLE001 (the error itself is the subject)
            return error

    def timeout_while_unwinding():
        try:
            raise KeyboardInterrupt
        finally:
            raise TimeoutError

    def handled_then_failed():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        raise ValueError("a real error")

    assert stopped_by_ctrl_c(KeyboardInterrupt()) and stopped_by_ctrl_c(raised(timeout_while_unwinding))
    assert not stopped_by_ctrl_c(raised(handled_then_failed)) and not stopped_by_ctrl_c(ValueError())
    assert not stopped_by_ctrl_c(
        raised(lambda: exec("try:\n raise KeyboardInterrupt\nexcept BaseException:\n raise SystemExit(2)"))
    )
