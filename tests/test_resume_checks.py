"""What a resumed run is checked for before any data is read: the folder it saves into, the flags whose value the
checkpoint's saved state decides, and how the command line names a recipe and the steps a recipe turns on.

The references are the checkpoint's own files (scheduler.pt, optimizer.pt, trainer_state.json), the folders on
disk, and the recipe file read on its own."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from test_train import build, local_file_flags, reverse_pairs, tiny_args, write_pairs
from vanilla_transformer import cli
from vanilla_transformer.command_line import recipe_path
from vanilla_transformer.training import run as train
from vanilla_transformer.training.averaging import last_checkpoints
from vanilla_transformer.training.averaging import main as average_main

SCHEDULE = ("--learning_rate", "0.003", "--warmup_steps", "4")
STEPS = ("--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2", "--max_tokens", "200")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("reverse")
    write_pairs(folder, "train", reverse_pairs(400, seed=1))
    write_pairs(folder, "valid", reverse_pairs(20, seed=2))
    return folder


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory) -> Path:
    """A run of 4 updates with checkpoints at 2 and 4 (only read by the tests)."""
    output = tmp_path_factory.mktemp("trained") / "run"
    train.main(tiny_args(data_dir, output, *STEPS, *SCHEDULE))
    assert sorted(p.name for p in output.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    return output


@pytest.fixture
def no_data_read(monkeypatch):
    monkeypatch.setattr(train, "load_text_datasets", lambda *a, **k: pytest.fail("read the data before refusing"))


def copy_of(run: Path, where: Path, *checkpoints: str) -> Path:
    """A run folder holding ``checkpoints`` of ``run`` and its tokenizer."""
    where.mkdir(parents=True)
    shutil.copytree(run / "tokenizer", where / "tokenizer")
    for name in checkpoints:
        shutil.copytree(run / name, where / name)
    return where


# ---------------------------------------------------------------------------------------------
# The folder a resumed run saves into
# ---------------------------------------------------------------------------------------------


def test_a_checkpoint_of_another_folder_is_not_resumed_into_a_folder_of_checkpoints(
    data_dir, trained, tmp_path, no_data_read
):
    """Resuming B's checkpoint with --output_dir A, where A holds its own run's checkpoints, trained into A and
    saved over and rotated away A's checkpoints. Refused, naming A's checkpoints and the two ways out; A is
    left as it was."""
    other = copy_of(trained, tmp_path / "A", "checkpoint-2", "checkpoint-4")
    before = sorted(p.name for p in other.iterdir())
    checkpoint = trained / "checkpoint-2"
    with pytest.raises(ValueError) as refused:
        build(data_dir, other, *STEPS, *SCHEDULE, "--resume_from_checkpoint", str(checkpoint))
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert f"--resume_from_checkpoint {checkpoint}" in message and "another run's checkpoints" in message
    assert "(checkpoint-2, checkpoint-4)" in message  # A's, as listed on disk
    assert f"--output_dir {trained}" in message and "a new --output_dir" in message
    assert sorted(p.name for p in other.iterdir()) == before


def test_a_checkpoint_of_another_folder_resumes_into_a_new_or_checkpointless_folder(data_dir, trained, tmp_path):
    """What continuing elsewhere legitimately looks like: a new folder, or one without checkpoints."""
    checkpoint = trained / "checkpoint-2"
    new = build(data_dir, tmp_path / "new", *STEPS, *SCHEDULE, "--resume_from_checkpoint", str(checkpoint))
    assert new.resume == checkpoint
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a checkpoint")
    empty = build(data_dir, tmp_path / "empty", *STEPS, *SCHEDULE, "--resume_from_checkpoint", str(checkpoint))
    assert empty.resume == checkpoint


def test_resuming_last_and_the_folders_own_latest_checkpoint_are_unaffected(data_dir, trained, tmp_path):
    run = copy_of(trained, tmp_path / "run", "checkpoint-2", "checkpoint-4")
    assert build(data_dir, run, *STEPS, *SCHEDULE, "--resume_from_checkpoint", "last").resume == run / "checkpoint-4"
    own = build(data_dir, run, *STEPS, *SCHEDULE, "--resume_from_checkpoint", str(run / "checkpoint-4"))
    assert own.resume == run / "checkpoint-4"


@pytest.mark.parametrize("restore", [False, True], ids=["", "restore_callback_states"])
def test_a_run_continued_in_a_new_folder_averages_the_checkpoints_of_both(data_dir, trained, tmp_path, caplog, restore):
    """Continuing elsewhere (a full disk: --output_dir <new folder> --resume_from_checkpoint <an intact checkpoint>)
    and then resuming again in the new folder: the final mean of the last N checkpoints (§6.1) takes the old
    folder's up to the one resumed from (not the abandoned ones after it), as the same run in one folder would;
    also where transformers replaces the callbacks by copies made from the checkpoint. A checkpoint saved
    without its tokenizer resumes with its run folder's, which the new folder then holds too. The reference: the
    mean of the chosen checkpoints' weights, computed here from their files."""
    from vanilla_transformer.checkpoint_files import TOKENIZER_MARKERS

    old = copy_of(trained, tmp_path / "old", "checkpoint-2", "checkpoint-4")
    for name in TOKENIZER_MARKERS:
        (old / "checkpoint-2" / name).unlink(missing_ok=True)
    new = tmp_path / "new"
    flags = ("--save_strategy", "steps", "--save_steps", "2", "--max_tokens", "200", *SCHEDULE)
    flags += ("--restore_callback_states_from_checkpoint", str(restore).lower())
    train.main(
        tiny_args(data_dir, new, *flags, "--max_steps", "6", "--resume_from_checkpoint", str(old / "checkpoint-2"))
    )
    assert (new / "tokenizer" / "tokenizer.json").read_text() == (old / "tokenizer" / "tokenizer.json").read_text()
    assert sorted(p.name for p in new.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert not (new / "_continued_from.json").exists()  # its checkpoints record the old folder from then on
    with caplog.at_level(logging.INFO, logger="vanilla_transformer"):
        train.main(tiny_args(data_dir, new, *flags, "--max_steps", "8", *RESUME, "--average_checkpoints", "4"))
    chosen = [old / "checkpoint-2", new / "checkpoint-4", new / "checkpoint-6", new / "checkpoint-8"]
    weights = [load_file(folder / "model.safetensors") for folder in chosen]
    final = load_file(new / "model.safetensors")
    assert final.keys() == weights[0].keys()
    for name, value in final.items():
        torch.testing.assert_close(value, sum(w[name] for w in weights) / len(weights), rtol=1e-5, atol=1e-6)
    assert f"of {(old / 'checkpoint-2').resolve()}, checkpoint-4, checkpoint-6, checkpoint-8" in caplog.text
    card = (new / "README.md").read_text()
    assert "../old/checkpoint-2, checkpoint-4, checkpoint-6, checkpoint-8" in card and str(tmp_path) not in card
    assert "two runs" not in caplog.text  # the averaging's own check: one run's checkpoints
    assert str(tmp_path) not in (new / "checkpoint-8" / "trainer_state.json").read_text()  # no local path
    # `vanilla-transformer average --checkpoint-root <new folder> --last 4` takes the same
    average_main(["--checkpoint-root", str(new), "--last", "4", "--output-dir", str(tmp_path / "averaged")])
    assert load_file(tmp_path / "averaged" / "model.safetensors").keys() == final.keys()
    with pytest.raises(
        ValueError,
        match=r"and the folders its run continued from hold: there are 4 checkpoint-<step> "
        r"folder\(s\) \(\S+old/checkpoint-2, checkpoint-4, checkpoint-6, checkpoint-8\)\. Pass",
    ):
        last_checkpoints(new, 5)
    for name, value in load_file(tmp_path / "averaged" / "model.safetensors").items():
        torch.testing.assert_close(value, final[name], rtol=0, atol=0)


def test_a_run_continued_in_a_new_folder_resumes_last_from_where_it_began_until_it_saves_there(
    data_dir, trained, tmp_path, caplog
):
    """A job continued in a new folder and requeued before its first save there (the new folder holds only its
    tokenizer, or an incomplete checkpoint): the same command with `last` resumes from the checkpoint it began at,
    as the run's newest complete one, not "start anew". The reference: the path the first command named. Both
    folders moved together still find each other; once the new folder holds a checkpoint, `last` takes that."""
    old = copy_of(trained, tmp_path / "old", "checkpoint-2", "checkpoint-4")
    new = tmp_path / "new"
    flags = (*STEPS, *SCHEDULE)
    build(data_dir, new, *flags, "--resume_from_checkpoint", str(old / "checkpoint-2"))
    assert sorted(p.name for p in new.iterdir()) == ["_continued_from.json", "tokenizer"]  # what a crash leaves
    assert json.loads((new / "_continued_from.json").read_text()) == {"checkpoint": "../old/checkpoint-2"}
    with caplog.at_level(logging.INFO, logger="vanilla_transformer"):
        assert build(data_dir, new, *flags, *RESUME).resume == (old / "checkpoint-2").resolve()
    assert "resuming from" in caplog.text and "which its run began at" in caplog.text
    (new / "checkpoint-4").mkdir()  # incomplete (a save cut short): passed over, as `last` does in one folder
    assert build(data_dir, new, *flags, *RESUME).resume == (old / "checkpoint-2").resolve()
    moved = tmp_path / "moved"
    moved.mkdir()
    old.rename(moved / "old")
    new.rename(moved / "new")
    assert build(data_dir, moved / "new", *flags, *RESUME).resume == (moved / "old" / "checkpoint-2").resolve()
    with pytest.raises(ValueError, match=r"holds another run's checkpoints \(checkpoint-4\)"):  # not where it began
        build(data_dir, moved / "new", *flags, "--resume_from_checkpoint", str(moved / "old" / "checkpoint-4"))
    shutil.rmtree(moved / "new" / "checkpoint-4")
    shutil.copytree(trained / "checkpoint-4", moved / "new" / "checkpoint-4")
    assert build(data_dir, moved / "new", *flags, *RESUME).resume == moved / "new" / "checkpoint-4"


def test_the_trainer_records_where_a_run_continued_elsewhere_began_before_it_trains(data_dir, trained, tmp_path):
    """`TransformerTrainer.train(resume_from_checkpoint=...)` from a user's own script writes the record too,
    before the first update (the Trainer's own train() is made to crash here, as a killed job would)."""
    import transformers

    old = copy_of(trained, tmp_path / "old", "checkpoint-2")
    run = build(data_dir, tmp_path / "new", *STEPS, *SCHEDULE)
    assert not (tmp_path / "new" / "_continued_from.json").exists()  # a new run: nothing to record

    def crash(*args, **kwargs):
        raise RuntimeError("killed")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformers.Trainer, "train", crash)
        with pytest.raises(RuntimeError, match="killed"):
            run.trainer.train(resume_from_checkpoint=str(old / "checkpoint-2"))
    assert json.loads((tmp_path / "new" / "_continued_from.json").read_text()) == {"checkpoint": "../old/checkpoint-2"}


def test_a_new_run_in_a_folder_where_a_continued_run_began_is_refused_naming_the_record(
    data_dir, trained, tmp_path, monkeypatch
):
    """The folder holds the start of a run (what `last` would resume): a new run there would be taken for it."""
    old = copy_of(trained, tmp_path / "old", "checkpoint-2")
    new = tmp_path / "new"
    build(data_dir, new, *STEPS, *SCHEDULE, "--resume_from_checkpoint", str(old / "checkpoint-2"))
    monkeypatch.setattr(train, "load_text_datasets", lambda *a, **k: pytest.fail("read the data before refusing"))
    with pytest.raises(ValueError, match=r"new.?_continued_from\.json names it.*--resume_from_checkpoint last"):
        train.main(tiny_args(data_dir, new, *STEPS, *SCHEDULE))


def test_a_continued_run_that_finished_without_checkpoints_is_not_trained_again_by_last(data_dir, trained, tmp_path):
    """Continued with --save_strategy no: its final model is the run's own; `last` then finds no checkpoint to
    resume (the record is gone with the final save), and a record left beside a final model is refused too."""
    old = copy_of(trained, tmp_path / "old", "checkpoint-2")
    new = tmp_path / "new"
    flags = ("--max_steps", "4", "--max_tokens", "200", "--save_strategy", "no", *SCHEDULE)
    train.main(tiny_args(data_dir, new, *flags, "--resume_from_checkpoint", str(old / "checkpoint-2")))
    assert (new / "model.safetensors").is_file() and not (new / "_continued_from.json").exists()
    with pytest.raises(ValueError, match="no complete checkpoint"):
        build(data_dir, new, *flags, *RESUME)
    (new / "_continued_from.json").write_text(json.dumps({"checkpoint": "../old/checkpoint-2"}))
    with pytest.raises(ValueError, match=r"holds no checkpoint but a final model \(model\.safetensors\)"):
        build(data_dir, new, *flags, *RESUME)


@pytest.mark.parametrize(
    "record, problem",
    [
        ("not json", "JSONDecodeError"),
        ('{"from": "../old/checkpoint-2"}', "KeyError"),
        ('{"checkpoint": 2}', "'checkpoint' is 2, not a path"),
        ('{"checkpoint": "../gone/checkpoint-2"}', "gone/checkpoint-2"),
    ],
)
def test_a_continuation_record_that_names_no_checkpoint_is_an_error_naming_it(tmp_path, no_data_read, record, problem):
    """The record is the run's: one damaged, or naming a checkpoint that is gone, is not passed over for
    "start anew" (which would throw the run away); the error names the file and the way out."""
    from vanilla_transformer.training.checkpointing import resolve_checkpoint

    new = tmp_path / "new"
    new.mkdir()
    (new / "_continued_from.json").write_text(record)
    with pytest.raises(ValueError, match=r"continued_from\.json") as error:
        resolve_checkpoint(True, new, "--resume_from_checkpoint")
    assert problem in str(error.value)


def test_a_run_folder_moved_elsewhere_resumes_as_the_same_run_not_as_a_continuation(tmp_path):
    """A checkpoint records the folder it was saved in; resumed where it lies now (the run folder copied to another
    disk, resumed with `last` there), that is the folder it counts in, so its checkpoints are not averaged twice
    (nor the stale ones of the old place). Moved and then continued in a third folder: the moved one counts."""
    from transformers import TrainerState

    from vanilla_transformer.training.checkpointing import ContinuedFrom

    def resumed(saved: list, checkpoint: Path, output_dir: Path, step: int) -> list:
        state = TrainerState(global_step=step, stateful_callbacks={"ContinuedFrom": ContinuedFrom(saved).state()})
        continued = ContinuedFrom()
        continued.begin(output_dir, state, checkpoint)
        assert ContinuedFrom.saved_in(state.stateful_callbacks, output_dir) == continued.folders  # saved as known
        assert str(tmp_path) not in json.dumps(state.stateful_callbacks)  # relative to the run folder
        return continued.folders

    old, moved, third = (str((tmp_path / name).resolve()) for name in ("old", "moved", "third"))
    assert resumed([[old, 0]], tmp_path / "moved" / "checkpoint-4", tmp_path / "moved", 4) == [[moved, 0]]
    assert resumed([[old, 0]], tmp_path / "moved" / "checkpoint-4", tmp_path / "third", 4) == [[moved, 0], [third, 4]]
    assert resumed([], tmp_path / "old" / "checkpoint-4", tmp_path / "third", 4) == [[old, 0], [third, 4]]  # older
    fresh = ContinuedFrom([[old, 0]])
    fresh.begin(tmp_path / "third", TrainerState(global_step=0))
    assert fresh.folders == [[third, 0]]


@pytest.mark.parametrize(
    "state",
    ['{"global_step": 4, "a_field_of_another_version": 1}', "[1]", '{"stateful_callbacks": {"ContinuedFrom": 3}}'],
)
def test_average_of_a_folder_whose_newest_state_is_of_another_shape_takes_the_folders_own(trained, tmp_path, state):
    """`vanilla-transformer average --checkpoint-root` reads the newest checkpoint's trainer_state.json for the
    folders its run continued from: one of another shape (another version's fields, not an object) is passed over,
    not a crash."""
    run = copy_of(trained, tmp_path / "run", "checkpoint-2", "checkpoint-4")
    (run / "checkpoint-4" / "trainer_state.json").write_text(state)
    assert last_checkpoints(run, 2) == [run / "checkpoint-2", run / "checkpoint-4"]
    with pytest.raises(
        ValueError,
        match=r"than \S+ holds: it has 2 checkpoint-<step> folder\(s\) \(checkpoint-2, checkpoint-4\)\. Pass",
    ):
        last_checkpoints(run, 3)


def test_the_checkpoints_of_a_folder_continued_from_that_is_gone_are_left_out_with_a_warning(trained, tmp_path, caplog):
    from vanilla_transformer.training.checkpointing import run_checkpoints

    old = copy_of(trained, tmp_path / "old", "checkpoint-2", "checkpoint-4")
    new = copy_of(trained, tmp_path / "new", "checkpoint-4")
    gone = tmp_path / "gone"
    with caplog.at_level(logging.WARNING, logger="vanilla_transformer"):  # old from update 0, gone from 2, new from 4
        found = run_checkpoints(new, [[str(old), 0], [str(gone), 2], [str(new.resolve()), 4]])
    assert found == [old / "checkpoint-2", new / "checkpoint-4"]  # not old's checkpoint-4, abandoned at 2
    assert f"the run continued from {gone}, which is gone" in caplog.text


# ---------------------------------------------------------------------------------------------
# Flags whose value the checkpoint's state decides
# ---------------------------------------------------------------------------------------------


def checkpoint_value(checkpoint: Path, flag: str) -> str:
    """What the checkpoint's own files say a resumed run will use, as text."""
    if flag in ("learning_rate", "lr_scale", "warmup_steps", "lr_scheduler_type"):
        scheduler = torch.load(checkpoint / "scheduler.pt", weights_only=True)
        return f"peak learning rate {scheduler['base_lrs'][0]:.3g}"
    if flag.startswith("adam_beta"):
        optimizer = torch.load(checkpoint / "optimizer.pt", weights_only=True)
        return f"--{flag} {optimizer['param_groups'][0]['betas'][int(flag[-1]) - 1]:g} there"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return f"{flag}, {state[flag]}"


@pytest.mark.parametrize(
    "flag, value, fix",
    [
        ("learning_rate", "1e-05", "fine-tune from the checkpoint"),
        ("lr_scale", "2", "fine-tune from the checkpoint"),
        ("warmup_steps", "3", "fine-tune from the checkpoint"),
        ("lr_scheduler_type", "linear", "fine-tune from the checkpoint"),
        ("adam_beta2", "0.5", "fine-tune from the checkpoint"),
        ("save_steps", "1", "leave --save_steps out"),
    ],
)
def test_a_flag_the_checkpoints_state_overrides_is_refused_when_given_otherwise(
    data_dir, trained, tmp_path, no_data_read, flag, value, fix
):
    """transformers restores the scheduler's state (its peak), the optimizer's (Adam's settings) and
    trainer_state.json's intervals over the flags: another value on the command line was taken and then not
    used, while the log named it. Refused with the flag, the checkpoint's value and the fix."""
    run = copy_of(trained, tmp_path / "run", "checkpoint-2")
    schedule = () if flag == "lr_scale" else SCHEDULE  # (--lr_scale with --learning_rate is refused on its own)
    with pytest.raises(ValueError) as refused:
        build(data_dir, run, *STEPS, *schedule, f"--{flag}", value, "--resume_from_checkpoint", "last")
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"--{flag} {value}: resuming {run / 'checkpoint-2'}"), message
    assert checkpoint_value(run / "checkpoint-2", flag) in message, message
    assert f"leave --{flag} out" in message and fix in message
    if "fine-tune" in fix:
        assert f"--model_name_or_path {run / 'checkpoint-2'} and a new --output_dir" in message


def test_the_checkpoints_own_values_given_again_are_accepted(data_dir, trained, tmp_path):
    run = copy_of(trained, tmp_path / "run", "checkpoint-2")
    again = ("--adam_beta2", "0.98", "--weight_decay", "0", "--lr_scheduler_type", "inverse_sqrt")
    resumed = build(data_dir, run, *STEPS, *SCHEDULE, *again, "--resume_from_checkpoint", "last")
    assert resumed.resume == run / "checkpoint-2"


def test_a_run_scaled_with_lr_scale_resumes_again_and_again_with_the_same_command(data_dir, tmp_path):
    """A checkpoint of a resumed run holds the peak itself (scaled) and lr_scale 1: the same --lr_scale 0.5 was
    then refused as another value. Compared as peaks; another scale is still refused."""
    output = tmp_path / "run"
    command = ("--lr_scale", "0.5", "--warmup_steps", "4", "--save_strategy", "steps", "--save_steps", "1")
    train.main(tiny_args(data_dir, output, *command, "--max_steps", "1", "--max_tokens", "200"))
    train.main(tiny_args(data_dir, output, *command, "--max_steps", "2", "--max_tokens", "200", *RESUME))
    assert torch.load(output / "checkpoint-2" / "training_args.bin", weights_only=False).lr_scale == 1
    resumed = build(data_dir, output, *command, "--max_steps", "3", "--max_tokens", "200", *RESUME)
    assert resumed.resume == output / "checkpoint-2"
    with pytest.raises(ValueError, match=r"^--lr_scale 0.25: resuming"):
        build(data_dir, output, *command[:1], "0.25", *command[2:], "--max_steps", "3", "--max_tokens", "200", *RESUME)


RESUME = ("--resume_from_checkpoint", "last")


@pytest.mark.parametrize("optim", ["sgd", "adafactor", "the other AdamW"])
def test_another_optimizer_on_the_command_line_is_refused_before_the_data_is_read(
    data_dir, trained, tmp_path, no_data_read, optim
):
    """The checkpoint's optimizer.pt is AdamW's state: SGD and Adafactor, given it, failed at the first update
    after the data was read, in torch's KeyError: 'momentum' / 'beta1'. AdamW fused or not reads it, but takes its
    parameter groups, fused=True or False with them: the flag was taken and then not used. Refused first, naming
    both optimizers and the ways on."""
    run = copy_of(trained, tmp_path / "run", "checkpoint-2")
    saved = torch.load(run / "checkpoint-2" / "training_args.bin", weights_only=False).optim.value
    if optim == "the other AdamW":
        optim = {"adamw_torch": "adamw_torch_fused", "adamw_torch_fused": "adamw_torch"}[saved]
        groups = torch.load(run / "checkpoint-2" / "optimizer.pt", weights_only=True)["param_groups"]
        assert {group["fused"] for group in groups} == {saved == "adamw_torch_fused"}  # what loading would take
    with pytest.raises(ValueError) as refused:
        build(data_dir, run, *STEPS, *SCHEDULE, "--optim", optim, *RESUME)
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"--optim {optim}: resuming {run / 'checkpoint-2'} restores its optimizer"), message
    assert f"(--optim {saved} there)" in message and "leave --optim out" in message
    assert f"--model_name_or_path {run / 'checkpoint-2'} and a new --output_dir" in message


def test_the_checkpoints_own_optimizer_given_again_is_accepted(data_dir, trained, tmp_path):
    run = copy_of(trained, tmp_path / "run", "checkpoint-2")
    saved = torch.load(run / "checkpoint-2" / "training_args.bin", weights_only=False).optim.value
    resumed = build(data_dir, run, *STEPS, *SCHEDULE, "--optim", saved, *RESUME)
    assert resumed.trainer.args.optim.value == saved


def test_a_checkpoint_of_another_optimizer_resumed_without_optim_follows_its_optimizer(data_dir, tmp_path, caplog):
    """A run trained with --optim sgd, resumed with the flags' default optimizer (AdamW), failed at its first
    update. The checkpoint's optimizer is taken and said; the reference: the same run uninterrupted."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    train.main(tiny_args(data_dir, whole, *STEPS, *SCHEDULE, "--optim", "sgd"))
    copy_of(whole, resumed, "checkpoint-2")
    with caplog.at_level(logging.INFO, logger="vanilla_transformer.train"):
        train.main(tiny_args(data_dir, resumed, *STEPS, *SCHEDULE, *RESUME))
    default = train.parse_arguments(tiny_args(data_dir, resumed))[-1].optim.value
    assert f"optim sgd (not {default})" in caplog.text
    assert json.loads((resumed / "trainer_state.json").read_text())["global_step"] == 4
    before, after = (load_file(folder / "model.safetensors") for folder in (whole, resumed))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_a_resumed_run_without_the_schedule_flags_logs_and_follows_the_checkpoints_schedule(
    data_dir, trained, tmp_path, caplog
):
    """Resumed without --learning_rate and --warmup_steps, the run follows the checkpoint's schedule (its
    scheduler's state); the log said eq. (3)'s default peak after 4000 warm-up updates. The references: the
    checkpoint's scheduler.pt, and the rates the uninterrupted run logged for the same updates."""
    run = copy_of(trained, tmp_path / "run", "checkpoint-2")
    with caplog.at_level(logging.INFO, logger="vanilla_transformer.train"):
        train.main(tiny_args(data_dir, run, *STEPS, "--resume_from_checkpoint", "last"))
    peak = torch.load(run / "checkpoint-2" / "scheduler.pt", weights_only=True)["base_lrs"][0]
    lines = [r.getMessage() for r in caplog.records if "schedule: " in r.getMessage()]
    assert len(lines) == 1 and f"peak learning rate {peak:.3g} after 4 warm-up updates" in lines[0], lines
    assert "warmup_steps 4 (not 4000)" in caplog.text  # the flags' default, replaced: said

    def rates(folder: Path) -> dict[int, float]:
        history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
        return {entry["step"]: entry["learning_rate"] for entry in history if "learning_rate" in entry}

    assert rates(run) == pytest.approx(rates(trained)) and set(rates(run)) == {1, 2, 3, 4}
    card = (run / "README.md").read_text(encoding="utf-8")
    assert str(peak) in card  # the card's peak learning rate too


# ---------------------------------------------------------------------------------------------
# The command line: where a recipe goes, the steps a recipe turns on
# ---------------------------------------------------------------------------------------------


def test_a_recipe_after_a_flag_is_refused_with_the_command_in_its_order(tmp_path, capsys):
    """transformers said "Some specified arguments are not used by the HfArgumentParser: ['multi30k']". The
    command the message proposes reads the recipe (its values, read from the file here) and the flag."""
    argv = ["--max_steps", "5", "multi30k", "--output_dir", str(tmp_path)]
    with pytest.raises(ValueError) as refused:
        train.parse_arguments(argv)
    message = str(refused.value)
    command = f"vanilla-transformer train multi30k --max_steps 5 --output_dir {tmp_path}"
    assert message == f"multi30k after the flags: a recipe goes first, before them: {command}"
    _, _, training_args = train.parse_arguments(command.split()[2:])
    recipe = yaml.safe_load(recipe_path("multi30k").read_text())
    assert training_args.max_steps == 5 and training_args.max_tokens == recipe["max_tokens"]
    with pytest.raises(SystemExit) as stopped:
        cli.main(["train", *argv])
    error = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and error.splitlines() == [f"vanilla-transformer train: error: {message}"]


@pytest.mark.parametrize("flag", ["--do_train", "--use_cpu"])  # ours and a Trainer flag
def test_a_recipe_after_a_boolean_flag_is_refused_as_a_recipe_not_as_the_flags_value(flag, tmp_path, capsys):
    """argparse took the recipe for the boolean flag's value: "--do_train: Truthy value expected: got multi30k".
    The message is the recipe's, and the command it proposes (the flag alone: true) runs."""
    argv = [flag, "multi30k", "--output_dir", str(tmp_path)]
    with pytest.raises(ValueError) as refused:
        train.parse_arguments(argv)
    command = f"vanilla-transformer train multi30k {flag} --output_dir {tmp_path}"
    assert str(refused.value) == f"multi30k after the flags: a recipe goes first, before them: {command}"
    _, _, training_args = train.parse_arguments(command.split()[2:])
    assert getattr(training_args, flag[2:]) is True
    with pytest.raises(SystemExit) as stopped:  # a value that is no recipe: argparse's line, naming the flag
        cli.main(["train", flag, "maybe"])
    error = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(error) == 1
    assert error[0].startswith(f"vanilla-transformer train: error: {flag}: Truthy value expected: got maybe")


def test_an_argument_file_after_a_flag_or_a_second_one_is_refused(tmp_path):
    flags = tmp_path / "flags.yaml"
    flags.write_text("max_steps: 7\n")
    with pytest.raises(ValueError, match=rf"^{flags} after the flags: an argument file goes first"):
        train.parse_arguments(["--output_dir", str(tmp_path), str(flags)])
    with pytest.raises(ValueError, match=rf"^{flags}: an argument file is read only as the first argument, which is "):
        train.parse_arguments(["multi30k", "--output_dir", str(tmp_path), str(flags)])
    assert train.parse_arguments([str(flags), "--output_dir", str(tmp_path)])[2].max_steps == 7
    # a flag's value that names a file of that suffix is a value, not an argument file
    assert train.parse_arguments(["--output_dir", str(tmp_path / "run.json")])[2].output_dir == str(
        tmp_path / "run.json"
    )


def test_prediction_a_recipe_turns_on_without_test_data_says_how_to_leave_it_out(data_dir, tmp_path, no_data_read):
    """The multi30k recipe on local files without test data: --do_predict false leaves prediction out, and the
    recipe is named as what turned it on (it sets do_predict: true)."""
    assert yaml.safe_load(recipe_path("multi30k").read_text())["do_predict"] is True
    local = [*local_file_flags(data_dir), "--output_dir", str(tmp_path / "run")]
    with pytest.raises(ValueError) as refused:
        train.build_trainer(*train.parse_arguments(["multi30k", *local]))
    message = str(refused.value)
    assert message.startswith("--do_predict needs test data: give --test_source_file/--test_target_file")
    assert message.endswith("or --do_predict false to leave prediction out (the recipe sets do_predict: true).")
    with pytest.raises(ValueError) as refused:
        build(data_dir, tmp_path / "run", "--do_train", "--do_predict")
    message = str(refused.value)
    assert "or --do_predict false to leave prediction out" in message and "recipe" not in message


@pytest.mark.parametrize("value", ["last", "checkpoint-4", "no-such-checkpoint"])
def test_resume_from_checkpoint_without_training_is_refused_naming_model_name_or_path(
    data_dir, trained, tmp_path, no_data_read, value
):
    """An evaluation with --resume_from_checkpoint evaluated --model_name_or_path and ignored the checkpoint, even one
    that does not exist."""
    checkpoint = str(trained / value) if value != "last" else value
    flags = [*local_file_flags(data_dir, ["validation"]), "--output_dir", str(trained), "--use_cpu"]
    flags += ["--model_name_or_path", str(trained), "--do_eval", "--resume_from_checkpoint", checkpoint]
    folder = "CHECKPOINT" if value == "last" else checkpoint
    with pytest.raises(ValueError) as refused:
        train.build_trainer(*train.parse_arguments(flags))
    assert str(refused.value) == (
        f"--resume_from_checkpoint {checkpoint} continues training, but this run does not train: to evaluate or "
        f"translate with a checkpoint, give it as --model_name_or_path {folder}; or add --do_train to train on."
    )


def test_resuming_with_the_tokenizer_of_another_model_names_the_flag_that_gave_it(data_dir, trained, tmp_path):
    """Resuming with --model_name_or_path of another model (its tokenizer, not the checkpoint's) was told to
    "drop --tokenizer_name_or_path", a flag it did not give. The reference: the tokenizers on disk differ."""
    other = tmp_path / "other-model"  # the same model with two of its tokenizer's tokens swapped
    shutil.copytree(trained / "checkpoint-4", other)
    definition = json.loads((other / "tokenizer.json").read_text())
    vocab = definition["model"]["vocab"]
    first, second = [token for token in vocab if vocab[token] >= 10][:2]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (other / "tokenizer.json").write_text(json.dumps(definition))
    output = copy_of(trained, tmp_path / "run", "checkpoint-4")
    flags = ["--model_name_or_path", str(other), "--resume_from_checkpoint", str(output / "checkpoint-4")]
    with pytest.raises(ValueError) as refused:
        build(data_dir, output, *flags, *STEPS, *SCHEDULE)
    message = str(refused.value)
    assert f"than --model_name_or_path {other} brings; resume with the flags the run started with" in message
    assert message.endswith(f"or give --tokenizer_name_or_path {output / 'checkpoint-4'} to use the checkpoint's.")
    assert build(data_dir, output, *flags, "--tokenizer_name_or_path", str(output / "checkpoint-4"), *STEPS, *SCHEDULE)
    assert "drop --tokenizer_name_or_path" not in message
