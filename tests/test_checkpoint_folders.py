"""Which checkpoints a run keeps, resumes and averages, on hand-made checkpoint folders (no training): the
reference is each folder's step, as its name gives it, and what the folder holds.

save_total_limit's rotation, the checkpoints a run continued in another folder averages, the checks before a
resume (a link to a checkpoint, ``~``, a damaged moving average) and what the messages advise."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from test_faults import data_dir, run_argv  # noqa: F401 (fixture)
from vanilla_transformer.checkpoint_files import EMA_FILE
from vanilla_transformer.training import run as train
from vanilla_transformer.training.checkpointing import (
    RESUME_POINT_NAME,
    check_nothing_later,
    check_resumable,
    last_complete_checkpoint,
    resolve_checkpoint,
    rotate_checkpoints,
    run_checkpoints,
)
from vanilla_transformer.training.trainer import RunFolders


def checkpoint(folder: Path, step: int, resumable: bool = True) -> Path:
    """A checkpoint-<step> folder as the Trainer writes one (`check_resumable`'s files); its weight is the step."""
    folder = folder / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "vanilla_transformer"}))
    save_file({"w": torch.full((2,), float(step))}, str(folder / "model.safetensors"))
    if resumable:
        torch.save({}, folder / "optimizer.pt")
        torch.save({}, folder / "scheduler.pt")
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "stateful_callbacks": {}}))
    return folder


def names(folder: Path) -> list[str]:
    return sorted((path.name for path in folder.iterdir()), key=lambda name: (len(name), name))


def test_rotation_keeps_the_highest_steps_whatever_the_folders_times(tmp_path):
    """A run folder copied (cp -r, rsync without -t, a restored backup) has modification times in any order:
    transformers' rotation by time removed checkpoint-500, and averaging then took checkpoint-100."""
    run, now = tmp_path / "run", time.time()
    for age, step in enumerate([100, 200, 300, 400, 500]):  # checkpoint-500 the oldest on disk
        os.utime(checkpoint(run, step), (now - 100 + 10 * (4 - age),) * 2)
    rotate_checkpoints(checkpoint(run, 600), limit=5, best=None)
    assert names(run) == [f"checkpoint-{step}" for step in (200, 300, 400, 500, 600)]
    assert [path.name for path in run_checkpoints(run)] == names(run)


def test_rotation_neither_counts_nor_removes_what_is_not_a_checkpoint_of_the_run(tmp_path):
    """A user's checkpoint-300-keep is no checkpoint of the run (averaging ignores it): transformers counted it
    among the ones kept, and removed checkpoint-200, which averaging the last 3 needs. A later checkpoint left
    beside the one just written (an incomplete one, which resuming skipped) stays for the user to look at."""
    run = tmp_path / "run"
    for step in (100, 200, 300):
        checkpoint(run, step)
    (run / "checkpoint-300-keep").mkdir()
    checkpoint(run, 500, resumable=False)
    rotate_checkpoints(checkpoint(run, 400), limit=3, best=None)
    assert names(run) == ["checkpoint-200", "checkpoint-300", "checkpoint-400", "checkpoint-500", "checkpoint-300-keep"]


def test_rotation_keeps_the_best_checkpoint_however_its_path_is_spelled(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "x"
    for step in (100, 200, 300):
        checkpoint(run, step)
    monkeypatch.chdir(tmp_path)
    rotate_checkpoints(checkpoint(run, 400), limit=2, best="runs/x/../x/checkpoint-100")  # relative, roundabout
    assert names(run) == ["checkpoint-100", "checkpoint-400"]  # the limit, then the best as well


def test_a_resumed_run_finds_its_best_checkpoint_beside_the_one_it_resumed_from(tmp_path, monkeypatch):
    """The best checkpoint is recorded as the saving run spelled it: relative to its working directory, in a
    folder since moved. Resumed elsewhere, the name no longer led to it: rotation removed it and
    --load_best_model_at_end found nothing to load."""
    moved = tmp_path / "moved" / "run"
    for step in (100, 200):
        checkpoint(moved, step)
    monkeypatch.chdir(tmp_path)  # the saving run's was another: runs/x/checkpoint-100 is no folder from here
    state = SimpleNamespace(best_model_checkpoint="runs/x/checkpoint-100")
    trainer = SimpleNamespace(continued_from=None, resumed_from=moved / "checkpoint-200")
    RunFolders(trainer).on_train_begin(None, state, None)
    assert Path(state.best_model_checkpoint) == moved / "checkpoint-100"
    elsewhere = SimpleNamespace(best_model_checkpoint=str(tmp_path / "other" / "checkpoint-700"))  # not beside it
    RunFolders(trainer).on_train_begin(None, elsewhere, None)
    assert elsewhere.best_model_checkpoint == str(tmp_path / "other" / "checkpoint-700")


def test_a_point_to_resume_from_in_a_folder_continued_from_is_not_averaged(tmp_path):
    """A checkpoint saved on a signal between regular saves is removed by the next regular save in its own
    folder; a run continued from it in another folder left it in the average."""
    first, second = tmp_path / "first", tmp_path / "second"
    for step in (100, 200, 250):
        checkpoint(first, step)
    (first / "checkpoint-250" / RESUME_POINT_NAME).write_text(json.dumps({"step": 250}))
    for step in (300, 400):
        checkpoint(second, step)
    folders = [[str(first), 0], [str(second), 250]]
    averaged = [path.relative_to(tmp_path).as_posix() for path in run_checkpoints(second, folders)]
    assert averaged == [
        "first/checkpoint-100",
        "first/checkpoint-200",
        "second/checkpoint-300",
        "second/checkpoint-400",
    ]


def test_a_link_to_an_earlier_checkpoint_is_refused_as_the_checkpoint_itself(tmp_path):
    run = tmp_path / "run"
    for step in (300, 400):
        checkpoint(run, step)
    (run / "best").symlink_to(run / "checkpoint-300", target_is_directory=True)
    for given in (run / "checkpoint-300", run / "best"):
        with pytest.raises(ValueError, match=r"also holds later checkpoints \(checkpoint-400\)"):
            check_nothing_later(given, run, "--resume_from_checkpoint")


def test_a_checkpoint_named_with_a_tilde_is_found_in_the_home_folder(tmp_path, monkeypatch):
    """transformers expands ~ in --output_dir; --flag=~/... and recipe files reach us unexpanded."""
    monkeypatch.setenv("HOME", str(tmp_path))
    checkpoint(tmp_path / "run", 100)
    assert check_resumable("~/run/checkpoint-100") == tmp_path / "run" / "checkpoint-100"


def test_last_skips_a_checkpoint_whose_moving_average_is_cut_short(tmp_path, caplog):
    run = tmp_path / "run"
    checkpoint(run, 100)
    cut = checkpoint(run, 200)
    save_file({"w": torch.zeros(64)}, str(cut / EMA_FILE), metadata={"decay": "0.9", "updates": "200"})
    (cut / EMA_FILE).write_bytes((cut / EMA_FILE).read_bytes()[:-16])  # a copy that did not finish
    with caplog.at_level(logging.WARNING):
        assert last_complete_checkpoint(run) == run / "checkpoint-100"
    assert any(EMA_FILE in record.message for record in caplog.records)


def test_only_incomplete_checkpoints_are_met_with_one_consistent_advice(data_dir, tmp_path):  # noqa: F811
    """`last` said "start the run anew without resuming", and starting anew said "continue with last"."""
    run = tmp_path / "run"
    checkpoint(run, 4, resumable=False)  # e.g. saved with --save_only_model
    with pytest.raises(ValueError, match="incomplete.*move them out of .* or choose a new --output_dir") as last:
        resolve_checkpoint(True, run)
    assert "without resuming" not in str(last.value)
    with pytest.raises(ValueError, match=r"checkpoint-4\), none of them complete") as anew:
        train.build_trainer(*train.parse_arguments(run_argv(data_dir, run)))
    assert "--resume_from_checkpoint last" not in str(anew.value)
