"""What a run reports while and after it trains (vanilla_transformer.training.progress): a budget in minutes
shows minutes, not updates out of a bound; the loss; throughput from the sentences and target tokens
actually trained on; no warning a CPU user cannot act on."""

import warnings
from pathlib import Path

import pytest
import torch
from transformers import ProgressCallback, TrainerControl, TrainerState

import vanilla_transformer.training.progress as progress
from test_train import reverse_pairs, tiny_args, write_pairs
from vanilla_transformer.training import run as train
from vanilla_transformer.training.progress import TargetTokens, TimeBudgetProgress


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("reverse")
    write_pairs(folder, "train", reverse_pairs(120, seed=1))
    return folder


def test_a_budget_in_minutes_shows_minutes_updates_loss_and_target_tokens_per_second(monkeypatch, capsys):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    counter = TargetTokens()
    bar = TimeBudgetProgress(max_minutes=25, counter=counter, processes=2)
    state, control = TrainerState(max_steps=1_000_000), TrainerControl()
    state.is_world_process_zero = True
    bar.on_train_begin(None, state, control)
    counter.add(torch.tensor([[5, 6, 7, -100], [8, 9, -100, -100]]))  # 5 target tokens
    bar.on_log(None, state, control, logs={"loss": 2.3456})
    now[0] += 90.0  # a minute and a half
    state.global_step = 7
    bar.on_step_end(None, state, control)
    bar.training_bar.refresh()
    shown = capsys.readouterr().err.splitlines()[-1].split("\r")[-1]
    assert "1.5/25 min" in shown and "update=7" in shown and "loss=2.346" in shown
    assert f"tok/s={5 * 2 / 90:,.0f}" in shown  # this process's tokens times the processes, per second
    assert "1000000" not in shown
    bar.on_train_end(None, state, control)


def test_a_resumed_run_shows_the_minutes_of_the_budget_trained_before(monkeypatch, capsys):
    """Preempted at minute 20 of 25, resumed: the budget (`WallClock`) stops 5 minutes later, and the bar
    goes on from 20, not from 0 (it would stop at 5.0/25)."""
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    bar = TimeBudgetProgress(max_minutes=25, counter=TargetTokens(), minutes_before=lambda: 20.0)
    state, control = TrainerState(max_steps=1_000_000), TrainerControl()
    state.is_world_process_zero = True
    bar.on_train_begin(None, state, control)
    now[0] += 90.0
    bar.on_step_end(None, state, control)
    bar.training_bar.refresh()
    assert "21.5/25 min" in capsys.readouterr().err.splitlines()[-1].split("\r")[-1]
    bar.on_train_end(None, state, control)


def test_the_bar_reads_the_minutes_the_wall_clock_restored(data_dir, tmp_path):
    arguments = tiny_args(data_dir, tmp_path, "--max_steps", "1000000", "--max_train_minutes", "25")
    arguments[arguments.index("--disable_tqdm") + 1] = "false"
    trainer = train.build_trainer(*train.parse_arguments(arguments)).trainer
    bar = next(c for c in trainer.callback_handler.callbacks if isinstance(c, TimeBudgetProgress))
    trainer.wall_clock.trained_before = 1200.0  # as WallClock.on_train_begin sets it from a checkpoint
    assert bar.minutes_before() == 20.0


def test_the_end_of_training_reports_the_sentences_and_target_tokens_trained_on(data_dir, tmp_path):
    """One epoch of token batches: every training pair once, so the counts are the data set's own."""
    prepared = train.build_trainer(
        *train.parse_arguments(
            tiny_args(data_dir, tmp_path, "--num_train_epochs", "1", "--max_tokens", "200", "--warmup_steps", "2")
        )
    )
    result = prepared.trainer.train()
    dataset = prepared.datasets["train"]
    tokens = sum(len(labels) for labels in dataset["labels"])
    runtime = result.metrics["train_runtime"]
    assert result.metrics["train_target_tokens"] == tokens
    assert result.metrics["train_samples_per_second"] == pytest.approx(len(dataset) / runtime, rel=1e-2)
    assert result.metrics["train_target_tokens_per_second"] == pytest.approx(tokens / runtime, rel=1e-2)
    logged = prepared.trainer.state.log_history[-1]
    assert logged["train_target_tokens"] == tokens  # what the log printed, too


def test_a_time_budget_replaces_the_bar_in_updates_and_a_cpu_run_pins_no_memory(data_dir, tmp_path):
    arguments = tiny_args(
        data_dir, tmp_path, "--max_steps", "1000000", "--max_train_minutes", "25", "--warmup_steps", "2"
    )
    arguments[arguments.index("--disable_tqdm") + 1] = "false"
    trainer = train.build_trainer(*train.parse_arguments(arguments)).trainer
    kinds = [type(callback) for callback in trainer.callback_handler.callbacks]
    assert TimeBudgetProgress in kinds and ProgressCallback not in kinds
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch: "pin_memory ... no accelerator is found"
        next(iter(trainer.get_train_dataloader()))


def test_one_process_counts_its_target_tokens_without_a_device_tensor():
    """The totals of one process made a float64 tensor on the training device, which Apple's MPS does not have:
    the end of training's log would fail there, after all the training. A device whose tensors cannot be read
    (meta) stands in for it."""
    from types import SimpleNamespace

    counter = TargetTokens()
    counter.add(torch.tensor([[5, 6, -100], [7, -100, -100]]))
    counter.add(torch.tensor([[8, 9, 10]]))
    assert counter.totals(SimpleNamespace(device=torch.device("meta"), num_processes=1)) == (6, 3)
