"""WallClock on several processes: the clock is agreed every ~agree_seconds, and read alike in between.

One process stands in for several (the all-reduce is counted, the MAX of one clock is itself); the
clock is a counter, so that each reading can be checked against the time it should say."""

import types

import pytest
import torch

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
    args, state, control = types.SimpleNamespace(device="cpu"), None, None
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
    assert reductions == [1.0, 11.0, 21.0]  # after update 1, then every 10 updates of 1 s
    assert readings == [float(update) for update in range(1, 26)]  # extrapolated exactly at a steady pace


def test_slow_updates_agree_at_every_update(several_processes):
    now, reductions = several_processes
    readings = run(WallClock(max_minutes=10, agree_seconds=10.0), now, lambda update: 30.0, 4)
    assert reductions == readings == [30.0, 60.0, 90.0, 120.0]


def test_between_agreements_the_reading_follows_the_last_agreed_pace(several_processes):
    """A process whose own clock runs faster after an agreement still reads the agreed pace: every
    process computes the same number from the same agreement."""
    now, reductions = several_processes
    readings = run(WallClock(max_minutes=10, agree_seconds=10.0), now, lambda update: 2.0 if update == 1 else 1.0, 6)
    assert reductions == [2.0, 7.0]  # agreed after update 1 (2 s an update: next in 5 updates), then at 6
    assert readings == [2.0, 4.0, 6.0, 8.0, 10.0, 7.0]
