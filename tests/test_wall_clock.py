"""WallClock on several processes: the clock is agreed every ~agree_seconds, and read alike in between.

One process stands in for several (the all-reduce is counted, the MAX of one clock is itself); the
clock is a counter, so that each reading can be checked against the time it should say."""

import types

import pytest
import torch
from transformers import TrainerControl, TrainerState

from vanilla_transformer.training import trainer as trainer_module
from vanilla_transformer.training.trainer import WallClock


@pytest.fixture
def several_processes(monkeypatch):
    now, reductions = [0.0], []
    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(trainer_module, "_several_processes", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, op=None: reductions.append(tensor.item()))
    return now, reductions


def run(clock: WallClock, now: list, seconds_per_update, updates: int) -> list[float]:
    args, state, control = types.SimpleNamespace(device="cpu"), TrainerState(), None
    clock.on_train_begin(args, state, control)
    readings = []
    for update in range(1, updates + 1):
        now[0] += seconds_per_update(update)
        clock.on_optimizer_step(args, state, control)
        readings.append(clock.elapsed())
    return readings


def test_agrees_every_agree_seconds_and_reads_the_time_in_between(several_processes):
    now, reductions = several_processes
    readings = run(WallClock(max_minutes=10, agree_seconds=10.0), now, lambda update: 1.0, 25)
    assert reductions == [1.0, 2.0, 4.0, 8.0, 16.0]  # after updates 1 and 2, then 2, 4, 8, ... up to 10 updates
    assert readings == [float(update) for update in range(1, 26)]  # extrapolated exactly at a steady pace


def test_slow_updates_agree_at_every_update(several_processes):
    now, reductions = several_processes
    readings = run(WallClock(max_minutes=10, agree_seconds=10.0), now, lambda update: 30.0, 4)
    assert reductions == readings == [30.0, 60.0, 90.0, 120.0]


def test_between_agreements_the_reading_follows_the_last_agreed_pace(several_processes):
    """A process whose own clock runs faster after an agreement still reads the agreed pace: every
    process computes the same number from the same agreement. The pace is that between the last two
    agreements: the first update's warm-up (here 2 s against 1 s) is not counted again for the next ones
    (it was: 2, 4, 6, 8, 10 s, then back to 7 at the next agreement, and a short budget stopped early)."""
    now, reductions = several_processes
    pace = {1: 2.0, 2: 1.0}
    readings = run(WallClock(max_minutes=10, agree_seconds=10.0), now, lambda update: pace.get(update, 0.5), 8)
    assert reductions == [2.0, 3.0, 4.0, 6.0]  # after updates 1 and 2 (1 s an update), then 4 (0.5 s) and 8
    assert readings == [2.0, 3.0, 4.0, 4.0, 4.5, 5.0, 5.5, 6.0]  # update 3 at the agreed 1 s, not its own 0.5


def test_a_short_budget_stops_at_its_time_after_a_slow_first_update(several_processes):
    """2 processes on the CPU, --max_train_minutes 0.15 (9 s): the clock counted the 3-s first update for each
    update until the next agreement and stopped after 6 s. Now within an update of 9 s, never ahead of the time."""
    now, _ = several_processes
    clock = WallClock(max_minutes=0.15)
    args, state = types.SimpleNamespace(device="cpu", save_strategy="no"), TrainerState()
    clock.on_train_begin(args, state, None)
    for update in range(1, 1000):
        now[0] += 3.0 if update == 1 else 0.1
        clock.on_optimizer_step(args, state, None)
        control = clock.on_step_end(args, state, TrainerControl())
        assert clock.last_reading <= now[0] + 1e-6, update
        if control.should_training_stop:
            break
    assert 9.0 - 1e-6 <= now[0] <= 9.1 + 1e-6


def test_a_resumed_run_goes_on_with_the_seconds_its_checkpoint_trained(monkeypatch):
    """The budget counts the whole run: a checkpoint holds the seconds trained until it (`WallClock.state`, in
    trainer_state.json), and a run resumed from it stops when the sum reaches --max_train_minutes, saves at the
    next multiple of --save_minutes after it, and cools down from where it was."""
    now = [100.0]
    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    first = WallClock(max_minutes=1, save_minutes=0.5)
    args = types.SimpleNamespace(device="cpu", save_strategy="steps")
    state = TrainerState()
    first.on_train_begin(args, state, TrainerControl())
    now[0] += 50.0  # 50 s of training to the end of an update, then its checkpoint, then a preemption
    first.on_step_end(args, state, TrainerControl())
    now[0] += 5.0  # writing the checkpoint: not training
    saved = TrainerState(global_step=40, stateful_callbacks={"WallClock": first.state()})
    assert saved.stateful_callbacks["WallClock"]["attributes"]["trained_before"] == pytest.approx(50.0)

    resumed = WallClock(max_minutes=1, save_minutes=0.5)
    now[0] += 1000.0  # requeued much later: only training time counts
    resumed.on_train_begin(args, saved, TrainerControl())
    assert resumed.elapsed() == pytest.approx(50.0) and resumed.next_save == pytest.approx(60.0)
    assert resumed.cooldown_factor(0.5) == pytest.approx(10 / 30)  # 10 s of the 60 left: a third of the cooldown
    control = TrainerControl()
    now[0] += 9.0
    resumed.on_step_end(args, saved, control)
    assert not control.should_training_stop and not control.should_save
    now[0] += 1.0  # 60 s trained in all
    resumed.on_step_end(args, saved, control)
    assert control.should_training_stop and control.should_save and resumed.next_save == pytest.approx(90.0)


@pytest.mark.parametrize("strategy", ["no", "steps"])
def test_the_end_of_the_budget_keeps_a_timed_save_due_at_the_same_update(monkeypatch, strategy):
    """--save_minutes 1 --max_train_minutes 2: the update that ends the budget is also the second timed
    save. With --save_strategy no the end of the budget alone saves nothing, but the timed save stays."""
    now = [0.0]
    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    clock, args = WallClock(max_minutes=2, save_minutes=1), types.SimpleNamespace(device="cpu", save_strategy=strategy)
    clock.on_train_begin(args, TrainerState(), TrainerControl())
    seen = []
    for at in (90.0, 121.0):  # past the budget at the update after 121 s; the save of minute 2 due too
        control = TrainerControl()
        now[0] = at
        clock.on_step_end(args, TrainerState(), control)
        seen.append((control.should_save, control.should_training_stop))
    assert seen == [(True, False), (True, True)]


def test_a_checkpoint_from_before_the_clocks_state_starts_it_at_zero(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    clock, state = WallClock(max_minutes=1), TrainerState(global_step=40, stateful_callbacks={})
    clock.on_train_begin(types.SimpleNamespace(device="cpu"), state, TrainerControl())
    assert clock.elapsed() == 0.0 and "WallClock" in state.stateful_callbacks  # its next checkpoint holds it
