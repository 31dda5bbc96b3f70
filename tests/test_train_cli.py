"""train.py as a user of transformers' run_translation.py meets it: --do_train/--do_eval/--do_predict,
--test_file, --predict_with_generate False, flags of that script that mean something else here, and
what fine-tuning applies."""

from __future__ import annotations

import json
import logging
import re
import shutil
import types
from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from helpers import legacy_tokenizer_file
from test_train import reverse_pairs, tiny_args, write_pairs
from vanilla_transformer.training import run
from vanilla_transformer.training.translation import translate


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("reverse")
    write_pairs(folder, "train", reverse_pairs(600, seed=1))
    write_pairs(folder, "valid", reverse_pairs(12, seed=2))
    write_pairs(folder, "test", reverse_pairs(9, seed=3))
    return folder


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("trained")
    run.main(
        tiny_args(
            data_dir,
            output,
            "--max_steps",
            "40",
            "--learning_rate",
            "0.003",
            "--warmup_steps",
            "10",
            "--max_tokens",
            "300",
        )
    )
    return output


def test_do_predict_alone_translates_the_test_file_in_input_order_and_scores_it(data_dir, trained, tmp_path):
    before = load_file(trained / "model.safetensors")
    metrics = run.main(
        [
            "--model_name_or_path",
            str(trained),
            "--do_predict",
            "--output_dir",
            str(tmp_path),
            "--test_source_file",
            str(data_dir / "test.src"),
            "--test_target_file",
            str(data_dir / "test.tgt"),
            "--report_to",
            "none",
            "--use_cpu",
            "--disable_tqdm",
            "true",
        ]
    )
    sources = (data_dir / "test.src").read_text().splitlines()
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(trained), AutoTokenizer.from_pretrained(trained)
    expected = translate(model, tokenizer, sources)
    assert (tmp_path / "generated_predictions.txt").read_text().splitlines() == expected
    saved = json.loads((tmp_path / "predict_results.json").read_text())
    assert saved["predict_bleu"] == pytest.approx(metrics["predict_bleu"]) and saved["predict_samples"] == 9
    assert "train_runtime" not in metrics and not (tmp_path / "model.safetensors").exists()  # nothing trained
    after = load_file(trained / "model.safetensors")
    assert all((before[name] == after[name]).all() for name in before)


def test_predictions_cut_off_by_the_length_limit_name_trains_flag(data_dir, trained, tmp_path, caplog):
    """The warning for translations the length limit cut off names the flag that moves the limit: train's
    --generation_max_length, not translate's --max-new-tokens."""
    test = ["--test_source_file", str(data_dir / "test.src"), "--test_target_file", str(data_dir / "test.tgt")]
    flags = ["--use_cpu", "--disable_tqdm", "true", "--report_to", "none", "--generation_max_length", "2"]
    with caplog.at_level(logging.WARNING):
        run.main(["--model_name_or_path", str(trained), "--do_predict", "--output_dir", str(tmp_path), *test, *flags])
    assert "9 of 9 translation(s) reached the length limit" in caplog.text
    assert "a longer limit (--generation_max_length)" in caplog.text and "--max-new-tokens" not in caplog.text


def test_do_eval_alone_evaluates_the_checkpoint_without_training(data_dir, trained, tmp_path):
    metrics = run.main(
        [
            "--model_name_or_path",
            str(trained),
            "--do_eval",
            "--output_dir",
            str(tmp_path),
            "--validation_source_file",
            str(data_dir / "valid.src"),
            "--validation_target_file",
            str(data_dir / "valid.tgt"),
            "--report_to",
            "none",
            "--use_cpu",
            "--disable_tqdm",
            "true",
            "--generation_num_beams",
            "1",
        ]
    )
    assert {"eval_loss", "eval_bleu", "eval_gen_len"} <= set(metrics) and "train_runtime" not in metrics


@pytest.mark.floor  # transformers' callback, at the oldest release too
def test_an_evaluation_only_run_writes_tensorboard_events_under_its_output_dir(
    data_dir, trained, tmp_path, monkeypatch
):
    """transformers' TensorBoardCallback picks its folder when training begins: a run that only evaluates (or a
    requeued run that trains no more) wrote its events into ./runs of whatever directory it was started in."""
    started_in = tmp_path / "cwd"
    started_in.mkdir()
    monkeypatch.chdir(started_in)
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    output = tmp_path / "evaluation"
    valid = ["--validation_source_file", str(data_dir / "valid.src"), "--validation_target_file"]
    valid.append(str(data_dir / "valid.tgt"))
    flags = ["--use_cpu", "--disable_tqdm", "true", "--generation_num_beams", "1", "--report_to", "tensorboard"]
    run.main(["--model_name_or_path", str(trained), "--do_eval", "--output_dir", str(output), *valid, *flags])
    assert not list(started_in.iterdir())
    assert len(list((output / "runs").glob("*/events.out.tfevents.*"))) >= 1


def test_predict_with_generate_false_reports_the_loss_and_finishes_the_run(data_dir, tmp_path):
    metrics = run.main(
        tiny_args(
            data_dir,
            tmp_path,
            "--max_steps",
            "3",
            "--max_tokens",
            "300",
            "--predict_with_generate",
            "false",
            "--validation_source_file",
            str(data_dir / "valid.src"),
            "--validation_target_file",
            str(data_dir / "valid.tgt"),
        )
    )
    assert "eval_loss" in metrics and "eval_bleu" not in metrics
    assert (tmp_path / "README.md").is_file() and (tmp_path / "all_results.json").is_file()
    assert "| processes | 1 |" in (tmp_path / "README.md").read_text()  # (2 under a launcher: test_cli.py)


def test_do_train_alone_skips_the_evaluation(data_dir, tmp_path):
    metrics = run.main(
        tiny_args(
            data_dir,
            tmp_path,
            "--do_train",
            "--max_steps",
            "2",
            "--max_tokens",
            "300",
            "--validation_source_file",
            str(data_dir / "valid.src"),
            "--validation_target_file",
            str(data_dir / "valid.tgt"),
        )
    )
    assert "train_runtime" in metrics and "eval_loss" not in metrics


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--do_predict"], "--do_predict needs test data"),
        (["--do_eval"], "--do_eval needs validation data"),
    ],
)
def test_a_step_without_its_data_says_what_to_give(data_dir, trained, tmp_path, arguments, message):
    with pytest.raises(ValueError, match=message):
        run.main(["--model_name_or_path", str(trained), "--output_dir", str(tmp_path), "--use_cpu", *arguments])


def files(data_dir: Path, *roles: str) -> list[str]:
    return [
        each
        for role, stem in (("train", "train"), ("validation", "valid"))
        if role in roles
        for each in (
            f"--{role}_source_file",
            str(data_dir / f"{stem}.src"),
            f"--{role}_target_file",
            str(data_dir / f"{stem}.tgt"),
        )
    ]


@pytest.mark.parametrize("checkpoint", [False, True], ids=["new-model", "fine-tuning"])
def test_an_eval_strategy_without_do_flags_still_trains(data_dir, trained, tmp_path, checkpoint):
    """transformers turns do_eval on for any --eval_strategy; without a --do_* flag the run still trains (and
    evaluates, having validation data), for a new model and a checkpoint alike, as docs/training.md runs it."""
    model = ["--model_name_or_path", str(trained)] if checkpoint else []
    argv = [*model, *files(data_dir, "train", "validation"), "--eval_strategy", "steps", "--eval_steps", "2"]
    _, data_args, training_args = run.parse_arguments([*argv, "--output_dir", str(tmp_path)])
    assert run.steps_to_run(training_args, data_args) == (True, True, False)
    _, data_args, training_args = run.parse_arguments([*argv, "--do_eval", "--output_dir", str(tmp_path)])
    assert run.steps_to_run(training_args, data_args) == (False, True, False)  # a --do_* flag decides


@pytest.mark.parametrize(
    "flags, steps",
    [
        (["--do_eval", "false"], (True, False, False)),  # train, as without the flag, but no evaluation
        (["--do-eval=false"], (True, False, False)),
        (["--do_train", "false"], (False, True, False)),
        (["--do_predict", "false"], (True, True, False)),
        (["--do_train", "--do_eval", "false"], (True, False, False)),
        (["--do_train", "--eval_strategy", "steps"], (True, True, False)),  # transformers' do_eval stays
    ],
)
def test_a_step_turned_off_leaves_the_others_following_the_data(data_dir, tmp_path, flags, steps):
    argv = [*files(data_dir, "train", "validation"), *flags, "--output_dir", str(tmp_path)]
    _, data_args, training_args = run.parse_arguments(argv)
    assert run.steps_to_run(training_args, data_args) == steps


def test_training_files_with_steps_that_do_not_train_are_said_to_be_unused(data_dir, tmp_path, caplog):
    """--do_predict alone predicts with the checkpoint as it is: the training files given with it were dropped
    without a word (the predictions then came from the untrained-on model)."""
    argv = [*files(data_dir, "train"), "--model_name_or_path", "m", "--output_dir", str(tmp_path)]
    with caplog.at_level(logging.WARNING):
        run.parse_arguments([*argv, "--do_predict"])
    assert "--train_source_file given, but --do_predict alone does not train" in caplog.text
    assert "add --do_train to train first" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run.parse_arguments([*argv, "--do_predict", "--do_train"])
        run.parse_arguments(argv)  # no --do_* flag: it trains
    assert "does not train" not in caplog.text


def test_a_recipe_file_turning_evaluation_off_trains_without_evaluating(data_dir, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("do_eval: false\n")
    argv = [str(recipe), *files(data_dir, "train", "validation"), "--output_dir", str(tmp_path / "out")]
    _, data_args, training_args = run.parse_arguments(argv)
    assert run.steps_to_run(training_args, data_args) == (True, False, False)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--do_train", "false", "--do_eval", "false"], "--do_train false --do_eval false: nothing left to run"),
        (["--do_eval", "false", "--eval_strategy", "steps"], "--do_eval false and --eval_strategy steps"),
        (["--do_train", "--do_eval", "false", "--eval_strategy", "epoch"], "give --eval_strategy no"),
    ],
)
def test_steps_that_leave_nothing_or_contradict_are_refused(data_dir, tmp_path, flags, message):
    argv = [*files(data_dir, "train", "validation"), *flags, "--output_dir", str(tmp_path)]
    with pytest.raises(ValueError, match=re.escape(message)):
        run.parse_arguments(argv)


def test_an_eval_strategy_without_validation_data_is_refused_before_reading(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(run, "load_text_datasets", lambda *a, **k: pytest.fail("read the data first"))
    argv = [*files(data_dir, "train"), "--eval_strategy", "steps", "--output_dir", str(tmp_path), "--use_cpu"]
    with pytest.raises(ValueError, match="--eval_strategy steps evaluates during training and needs validation data"):
        run.main(argv)


def test_evaluating_without_a_model_is_refused(data_dir, tmp_path):
    with pytest.raises(ValueError, match="need the model: give --model_name_or_path"):
        run.main(
            [
                "--do_eval",
                "--output_dir",
                str(tmp_path),
                "--use_cpu",
                "--validation_source_file",
                str(data_dir / "valid.src"),
                "--validation_target_file",
                str(data_dir / "valid.tgt"),
            ]
        )


@pytest.mark.parametrize(
    "flag, value, hint",
    [
        ("--num_beams", "4", "--generation_num_beams"),
        ("--source_prefix", "translate: ", "drop it"),
        ("--overwrite_output_dir", "true", "--resume_from_checkpoint last"),
        ("--pad_to_max_length", "true", "padded to their longest sentence"),
        ("--val_max_target_length", "128", "--generation_max_length"),
        ("--tokenizer_name", "t5-small", "--tokenizer_name_or_path"),
    ],
)
def test_run_translation_flags_that_mean_something_else_are_refused_naming_ours(flag, value, hint, tmp_path):
    with pytest.raises(ValueError, match=rf"{flag} \(from the command line\) is a run_translation.py flag.*{hint}"):
        run.parse_arguments([flag, value, "--output_dir", str(tmp_path)])
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: out\n{flag[2:]}: {value!r}\n")
    with pytest.raises(ValueError, match=rf"{flag} \(from '.*run.yaml'\) is a run_translation.py flag"):
        run.parse_arguments([str(config)])


@pytest.mark.parametrize(
    "line, message",
    [
        ("max_tokens: 4096.5", r"max_tokens: 4096.5 is not a value --max_tokens takes"),
        ("validation_size: true", r"validation_size: True is not a value --validation_size takes"),
        ("max_train_samples: [10]", r"max_train_samples: \[10\] is not a value --max_train_samples takes \(a list"),
        ("eval_order: sideways", r"eval_order: 'sideways' is not one of auto, length, input"),
    ],
)
def test_an_argument_files_values_are_typed_as_the_flags_are(line, message, tmp_path):
    """argparse converts and checks the command line's values, not the defaults an argument file sets: each of
    the file's values goes through its flag's type and choices, refused naming the file and the flag."""
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: out\n{line}\n")
    with pytest.raises(ValueError, match=rf"^'.*run.yaml': {message}"):
        run.parse_arguments([str(config)])


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "run.yaml",
            "output_dir: out\nmax_steps: 10\n  bad: indent\n",
            r"^'.*run.yaml', line 3, column \d+: not valid YAML",
        ),
        ("run.yaml", "output_dir: out\nreport_to: [none\n", r"^'.*run.yaml', line \d+, column \d+: not valid YAML"),
        ("run.json", '{"output_dir": "out",}', r"^'.*run.json', line 1, column \d+: not valid JSON"),
        ("run.yaml", "", r"^'.*run.yaml' is empty"),
    ],
    ids=["yaml indentation", "yaml bracket", "json comma", "empty"],
)
def test_a_malformed_argument_file_is_one_line_naming_the_file_and_line(tmp_path, capsys, name, text, message):
    """A YAML or JSON syntax error in a recipe file: one line naming the file, the line and the column, exit 2 from
    the command line (it was the parser's traceback, without the file's name)."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        run.parse_arguments([str(path)])
    with pytest.raises(SystemExit) as stopped:
        run.main([str(path)], exit_on_bad_input=True)
    error = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and len(error.splitlines()) == 1 and name in error, error


def test_flex_attention_is_refused_for_training_on_the_cpu_before_any_data_is_read(tmp_path, monkeypatch):
    """torch has no backward pass of flex attention on the CPU: the run failed at its first update, after the data
    and the tokenizer ("FlexAttention does not support backward on CPU"); now before anything is read."""
    from vanilla_transformer.training import data

    monkeypatch.setattr(data, "load_text_datasets", lambda *a, **k: pytest.fail("the data was read"))
    monkeypatch.setattr(run, "load_text_datasets", lambda *a, **k: pytest.fail("the data was read"))
    source, target = tmp_path / "train.en", tmp_path / "train.de"
    source.write_text("a b\n")
    target.write_text("b a\n")
    argv = ["--train_source_file", str(source), "--train_target_file", str(target), "--preset", "tiny", "--use_cpu"]
    argv += ["--output_dir", str(tmp_path / "out"), "--attn_implementation", "flex_attention", "--report_to", "none"]
    with pytest.raises(ValueError, match=r"^--attn_implementation flex_attention: torch has no backward pass"):
        run.main(argv)


def test_an_argument_files_values_take_the_flags_types(tmp_path):
    """YAML's numbers and booleans where a flag takes text or a number: as the command line's tokens would be."""
    config = tmp_path / "run.yaml"
    config.write_text("output_dir: out\nsource_column: 0\ntarget_column: 1\nmax_tokens: 2048\nlearning_rate: 1\n")
    _, data_args, training_args = run.parse_arguments([str(config), "--do_eval", "true"])
    assert (data_args.source_column, data_args.target_column) == ("0", "1")
    assert training_args.max_tokens == 2048 and training_args.learning_rate == 1.0 and training_args.do_eval is True


def test_a_field_of_one_value_or_a_list_takes_a_files_list(tmp_path):
    """``report_to: str | list[str]`` (TrainingArguments): the command line gives one value, a file may give a
    list, as transformers takes it from Python; a list for a flag of one value is still refused (above)."""
    config = tmp_path / "run.yaml"
    config.write_text("output_dir: out\nreport_to: [none]\n")
    assert run.parse_arguments([str(config)])[2].report_to == []  # transformers' "none", as a list
    config.write_text("output_dir: out\nreport_to: [tensorboard]\n")
    assert run.parse_arguments([str(config)])[2].report_to == ["tensorboard"]
    config.write_text("output_dir: out\nreport_to: tensorboard\n")
    assert run.parse_arguments([str(config)])[2].report_to == ["tensorboard"]


@pytest.mark.parametrize(
    ("file", "command_line", "message"),
    [
        ("report_to: [none, tensorboard]", [], r"^'.*run.yaml': report_to: 'none' stands alone, not in a list with "),
        ("report_to: [tensorboard, all]", [], r"^'.*run.yaml': report_to: 'all' stands alone"),
        ("report_to: [tensorbaord]", [], r"^'.*run.yaml': report_to: 'tensorbaord' is not .*did you mean tensorb"),
        ("", ["--report_to", "wandbb"], r"^--report_to: 'wandbb' is not an integration .*did you mean wandb\?"),
        ("report_to: [none]", ["--report_to", "tensorbaord"], r"^--report_to: 'tensorbaord' is not an integ"),
    ],
)
def test_report_to_is_checked_before_any_data_is_read(tmp_path, file, command_line, message):
    """transformers checks --report_to's names when the Trainer is built, after the tokenizer is trained and the
    data tokenized (hours into WMT14), and reads ``[none, tensorboard]`` as an integration named "none": both
    refused at once, naming the file or the flag. The reference: transformers' own error for the same value."""
    import yaml
    from transformers.integrations import get_reporting_integration_callbacks

    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: out\n{file}\n")
    with pytest.raises(ValueError, match=message):
        run.parse_arguments([str(config), *command_line])
    value = command_line[-1:] or yaml.safe_load(file)["report_to"]  # the value the run would have used
    with pytest.raises(ValueError, match="is not supported"):
        get_reporting_integration_callbacks(value)


def test_equals_sign_flags_are_recognised_too(tmp_path):
    with pytest.raises(ValueError, match="--num_beams .* is a run_translation.py flag"):
        run.parse_arguments(["--num_beams=4", "--output_dir", str(tmp_path)])


def test_fine_tuning_gets_its_own_schedule_unless_told_otherwise(trained, tmp_path):
    _, _, fine_tune = run.parse_arguments(["--model_name_or_path", str(trained), "--output_dir", str(tmp_path)])
    assert fine_tune.learning_rate == run.FINE_TUNING_LEARNING_RATE and fine_tune.warmup_steps == 0.1
    _, _, told = run.parse_arguments(
        [
            "--model_name_or_path",
            str(trained),
            "--output_dir",
            str(tmp_path),
            "--learning_rate",
            "3e-4",
            "--warmup_steps",
            "50",
        ]
    )
    assert told.learning_rate == 3e-4 and told.warmup_steps == 50
    _, _, scratch = run.parse_arguments(["--output_dir", str(tmp_path)])
    assert scratch.learning_rate is None and scratch.warmup_steps == 4000  # eq. (3)'s peak, the paper's warm-up


@pytest.mark.parametrize(
    "flags, message",
    [
        (  # fine-tuning's warm-up is a share of the updates; eq. (3)'s peak needs a number of steps
            ["--lr_scale", "0.5"],
            r"eq\. 3, --lr_scale 0\.5\) needs --lr_scheduler_type inverse_sqrt and a whole number of "
            r"--warmup_steps; got inverse_sqrt and 0\.1 \(0\.1 is a share of the updates, the default when",
        ),
        (
            ["--lr_scale", "2", "--lr_scheduler_type", "linear", "--warmup_steps", "10"],
            "needs --lr_scheduler_type inverse_sqrt .*; got linear and 10. Give",
        ),
        (["--learning_rate", "1e-3", "--warmup_steps", "0"], "Eq. \\(3\\) needs at least one warm-up step; got"),
        (["--learning_rate", "1e-3", "--lr_scheduler_kwargs", '{"power": 2}'], "--lr_scheduler_kwargs .* does nothing"),
    ],
    ids=["lr-scale-fine-tuning", "another-schedule", "no-warm-up", "scheduler-kwargs"],
)
def test_schedule_flags_eq_3_cannot_take_are_refused_before_the_data_is_read(
    data_dir, trained, tmp_path, monkeypatch, flags, message
):
    monkeypatch.setattr(run, "load_text_datasets", lambda *a, **k: pytest.fail("read the data first"))
    argv = ["--model_name_or_path", str(trained), *files(data_dir, "train"), "--output_dir", str(tmp_path)]
    with pytest.raises(ValueError, match=message):
        run.main([*argv, "--use_cpu", *flags])


def test_a_fine_tune_of_a_local_checkpoint_names_it_in_the_card(data_dir, trained, tmp_path):
    """The card said nothing of a local base model (the Hub's base_model metadata takes Hub ids only): its text
    names the folder, not the path, and the metadata stays without one. A Hub id: test_model_card.py."""
    from huggingface_hub import ModelCard

    argv = ["--model_name_or_path", str(trained), *files(data_dir, "train"), "--output_dir", str(tmp_path / "ft")]
    run.main([*argv, "--use_cpu", "--max_steps", "2", "--report_to", "none", "--disable_tqdm", "true"])
    card = ModelCard.load(tmp_path / "ft" / "README.md")
    assert f"Fine-tuned from a local checkpoint, `{trained.name}`." in card.text
    assert str(trained.parent) not in card.text and card.data.base_model is None


def test_the_card_names_the_data_each_score_is_of_and_carries_the_test_scores(data_dir, trained, tmp_path):
    """The card's results named local data "custom" under a "test set" header even for validation scores, left the
    --do_predict scores out, and named a base checkpoint-N folder without its run. Each score now says what it was
    scored on (file names, not folders; or the held-out pairs), the test set's scores come with their signatures
    (the same as predict_results.json's), and a checkpoint is named with its run's folder."""
    from huggingface_hub import ModelCard

    base = tmp_path / "base-run" / "checkpoint-40"
    shutil.copytree(trained, base)
    argv = ["--model_name_or_path", str(base), *files(data_dir, "train", "validation"), "--output_dir", str(tmp_path)]
    argv += ["--test_source_file", str(data_dir / "test.src"), "--test_target_file", str(data_dir / "test.tgt")]
    argv += ["--do_train", "--do_eval", "--do_predict", "--generation_num_beams", "1"]
    metrics = run.main([*argv, "--use_cpu", "--max_steps", "2", "--report_to", "none", "--disable_tqdm", "true"])
    card = ModelCard.load(tmp_path / "README.md")
    rows = {(r.dataset_name, r.dataset_split, r.metric_type): r for r in card.data.eval_results}
    assert set(rows) == {
        ("valid.src and valid.tgt", "validation", "bleu"),
        ("valid.src and valid.tgt", "validation", "chrf"),
        ("test.src and test.tgt", "test", "bleu"),
        ("test.src and test.tgt", "test", "chrf"),
    }
    predicted = json.loads((tmp_path / "predict_results.json").read_text())
    for kind in ("bleu", "chrf"):
        assert rows["test.src and test.tgt", "test", kind].metric_value == round(predicted[f"predict_{kind}"], 2)
        assert rows["test.src and test.tgt", "test", kind].metric_args == {
            "signature": predicted[f"predict_{kind}_signature"]
        }
        assert rows["valid.src and valid.tgt", "validation", kind].metric_value == round(metrics[f"eval_{kind}"], 2)
    assert "| data | split | metric | score |" in card.text and "custom" not in card.text
    assert "Fine-tuned from a local checkpoint, `base-run/checkpoint-40`." in card.text
    assert str(tmp_path) not in card.text


def test_fine_tuning_a_checkpoint_of_a_moving_average_run_says_which_weights_it_starts_from(
    data_dir, trained, tmp_path, caplog
):
    base = tmp_path / "ema-run" / "checkpoint-40"
    shutil.copytree(trained, base)
    shutil.copy(base / "model.safetensors", base / "ema.safetensors")
    argv = ["--model_name_or_path", str(base), *files(data_dir, "train"), "--output_dir", str(tmp_path / "ft")]
    with caplog.at_level(logging.WARNING):
        run.build_trainer(*run.parse_arguments([*argv, "--use_cpu", "--max_steps", "1"]))
    assert f"--model_name_or_path {base}: a checkpoint of a run with --ema_decay; its trained weights" in caplog.text


def test_fine_tuning_with_another_tokenizer_than_the_models_is_refused_before_reading(
    data_dir, trained, tmp_path, monkeypatch
):
    """A tokenizer of the same size but other ids (here two tokens swapped) fine-tuned the model on words its
    embeddings never meant, silently; resuming refused it already. The model's own tokenizer still passes."""
    other = tmp_path / "other-tokenizer"
    shutil.copytree(trained, other)
    definition = json.loads((other / "tokenizer.json").read_text())
    vocab = definition["model"]["vocab"]
    first, second = [token for token in vocab if vocab[token] >= 10][:2]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (other / "tokenizer.json").write_text(json.dumps(definition))
    argv = ["--model_name_or_path", str(trained), *files(data_dir, "train"), "--output_dir", str(tmp_path / "ft")]
    argv += ["--use_cpu", "--max_steps", "1"]
    run.build_trainer(*run.parse_arguments([*argv, "--tokenizer_name_or_path", str(trained)]))
    # the same tokenizer in the file format of tokenizers < 0.20 (merges as "a b" strings): the model's own still
    legacy = tmp_path / "legacy-model"
    shutil.copytree(trained, legacy)
    legacy_tokenizer_file(legacy)
    legacy_argv = [*argv[:1], str(legacy), *argv[2:]]
    run.build_trainer(*run.parse_arguments([*legacy_argv, "--tokenizer_name_or_path", str(trained)]))
    monkeypatch.setattr(run, "load_text_datasets", lambda *a, **k: pytest.fail("read the data first"))
    message = f"--tokenizer_name_or_path {other} holds another tokenizer than --model_name_or_path {trained} was"
    with pytest.raises(ValueError, match=re.escape(message)):
        run.build_trainer(*run.parse_arguments([*argv, "--tokenizer_name_or_path", str(other)]))


@pytest.mark.parametrize("flag", ["--model_name_or_path", "--tokenizer_name_or_path"])
def test_a_mistyped_folder_is_named_as_not_found_not_as_a_network_failure(data_dir, tmp_path, flag, monkeypatch):
    """ "runs/en-de" with a typo reads as a Hub id (owner/name): the Hub client's lines about the network were all
    the user saw. As translate --model says it: one line naming the flag."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network to time out on
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run, "load_text_datasets", lambda *a, **k: pytest.fail("read the data first"))
    argv = [flag, "runs/en-dee", *files(data_dir, "train"), "--output_dir", str(tmp_path / "out"), "--use_cpu"]
    with pytest.raises(OSError, match=f"^{flag} runs/en-dee: no such folder here, and not loadable as a Hub model"):
        run.main(argv)


def test_a_card_names_held_out_validation_pairs_as_such(data_dir, tmp_path):
    from huggingface_hub import ModelCard

    argv = [*files(data_dir, "train"), "--validation_size", "10", "--preset", "tiny", "--tokenizer_vocab_size", "280"]
    argv += ["--output_dir", str(tmp_path), "--max_steps", "2", "--generation_num_beams", "1"]
    run.main([*argv, "--use_cpu", "--report_to", "none", "--disable_tqdm", "true", "--max_eval_samples", "4"])
    card = ModelCard.load(tmp_path / "README.md")
    assert {r.dataset_type for r in card.data.eval_results} == {"10 pairs held out of the training data"}
    # scores of part of the set say so (they were given as the whole set's)
    names = {r.dataset_name for r in card.data.eval_results}
    assert names == {"10 pairs held out of the training data, 4 pairs scored (--max_eval_samples 4)"}
    assert "10 pairs held out of the training data, 4 pairs scored (--max_eval_samples 4) | validation |" in card.text


def test_save_minutes_0_turns_off_a_recipes_timed_checkpoints(data_dir, tmp_path):
    """The multi30k recipe saves every minute; --save_minutes 0 turns that off from the command line (a YAML null
    cannot be typed there), and a negative value is refused."""
    from vanilla_transformer.training.trainer import WallClock

    argv = ["multi30k", "--dataset_name", "none", *files(data_dir, "train"), "--output_dir", str(tmp_path), "--use_cpu"]
    argv += ["--max_steps", "3", "--max_train_minutes", "5", "--do_eval", "false", "--do_predict", "false"]
    assert run.parse_arguments(argv)[2].save_minutes == 1  # the recipe's
    trainer = run.build_trainer(*run.parse_arguments([*argv, "--save_minutes", "0"])).trainer
    clocks = [callback for callback in trainer.callback_handler.callbacks if isinstance(callback, WallClock)]
    assert len(clocks) == 1 and clocks[0].save_seconds is None and clocks[0].max_minutes == 5
    with pytest.raises(ValueError, match="--save_minutes must be positive, or 0 for no timed checkpoints; got -1"):
        run.build_trainer(*run.parse_arguments([*argv, "--save_minutes", "-1"]))


def test_a_run_shorter_than_its_warm_up_is_warned_about(data_dir, tmp_path, caplog):
    prepared = run.build_trainer(
        *run.parse_arguments(tiny_args(data_dir, tmp_path, "--warmup_steps", "100", "--max_tokens", "300"))
    )
    with caplog.at_level(logging.WARNING):
        prepared.trainer.create_optimizer_and_scheduler(num_training_steps=30)
    assert "inside the 100-step warm-up" in caplog.text and "30%" in caplog.text


def test_a_second_run_on_the_same_data_reuses_the_cached_data_and_tokenizer(data_dir, tmp_path, caplog):
    """The first run reads, trains the tokenizer and tokenises; the second memory-maps all of it."""
    arguments = tiny_args(data_dir, tmp_path / "a", "--cache_dir", str(tmp_path / "cache"), "--max_tokens", "300")
    with caplog.at_level(logging.INFO):
        first = run.build_trainer(*run.parse_arguments(arguments))
    assert "training a joint BPE tokenizer on 600 of 600" in caplog.text
    caplog.clear()
    second_arguments = [tmp_path / "b" if a == str(tmp_path / "a") else a for a in arguments]
    with caplog.at_level(logging.INFO):
        second = run.build_trainer(*run.parse_arguments([str(a) for a in second_arguments]))
    assert "training a joint BPE" not in caplog.text and "using the tokenizer trained before" in caplog.text
    assert second.tokenizer.backend_tokenizer.to_str() == first.tokenizer.backend_tokenizer.to_str()
    assert second.datasets["train"].cache_files == first.datasets["train"].cache_files  # the same Arrow files
    assert (tmp_path / "b" / "tokenizer" / "tokenizer.json").is_file()


def test_a_time_budget_stops_training_and_checkpoints_follow_the_clock(data_dir, tmp_path, monkeypatch):
    """--max_train_minutes and --save_minutes (§6.1's checkpoints every 10 minutes) on a fake clock:
    every update takes 20 s, a checkpoint every minute, stop after 2.5 minutes."""
    from vanilla_transformer.training import trainer as trainer_module

    now = [0.0]

    def tick():
        now[0] += 20.0
        return now[0]

    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(monotonic=tick))  # the run's clock only
    output = tmp_path / "run"
    run.main(
        tiny_args(
            data_dir,
            output,
            "--max_steps",
            "1000",
            "--max_tokens",
            "300",
            "--save_strategy",
            "steps",
            "--save_steps",
            "100000",
            "--save_minutes",
            "1",
            "--max_train_minutes",
            "2.5",
        )
    )
    state = json.loads((output / "trainer_state.json").read_text())
    # update n ends 20 n seconds after training began: a checkpoint at 60 s and 120 s, the stop at 160 s
    assert state["global_step"] == 8
    assert sorted(int(p.name.split("-")[1]) for p in output.glob("checkpoint-*")) == [3, 6, 8]


def test_config_overrides_after_a_recipe_change_its_model_key_by_key(tmp_path, caplog):
    """The command line's --config_overrides replaced the recipe's whole value: `multi30k --config_overrides
    dropout=0.3` trained the preset's 6+6 layers of 512, not the recipe's 3+3 of 256. And fine-tuning from a
    recipe was refused for the recipe's own config_overrides, which the user never typed. The reference: the
    recipe file's own values."""
    import yaml

    from vanilla_transformer.training.options import model_config, parse_arguments, parse_overrides, recipe_path

    recipe = parse_overrides(yaml.safe_load(recipe_path("multi30k").read_text())["config_overrides"])
    model_args, _, _ = parse_arguments(["multi30k", "--config_overrides", "dropout=0.3", "--output_dir", str(tmp_path)])
    config = model_config(model_args.preset, model_args.config_overrides)
    assert (config.d_model, config.encoder_layers, config.dropout) == (recipe["d_model"], recipe["encoder_layers"], 0.3)
    with caplog.at_level(logging.WARNING):
        model_args, _, _ = parse_arguments(
            ["multi30k", "--model_name_or_path", str(tmp_path / "model"), "--output_dir", str(tmp_path)]
        )
    assert model_args.config_overrides is None and "the recipe's config_overrides" in caplog.text


def test_a_recipes_model_and_tokenizer_keys_unused_by_a_fine_tune_are_named(tmp_path, caplog):
    """Fine-tuning a checkpoint with a recipe's data and schedule: the recipe's preset, config_overrides and
    tokenizer size build nothing (the checkpoint brings its shape and tokenizer); they were dropped silently,
    all but config_overrides. The reference: the keys the recipe file holds."""
    import yaml

    from vanilla_transformer.training.options import parse_arguments, recipe_path

    recipe = yaml.safe_load(recipe_path("multi30k").read_text())
    unused = sorted({"preset", "config_overrides", "tokenizer_vocab_size"} & set(recipe))
    assert len(unused) == 3
    output = ["--output_dir", str(tmp_path)]
    with caplog.at_level(logging.WARNING):
        parse_arguments(["multi30k", "--model_name_or_path", str(tmp_path / "model"), *output])
    lines = [r.getMessage() for r in caplog.records if "the recipe's" in r.getMessage()]
    assert lines == [
        f"the recipe's {', '.join(unused)} ignored: --model_name_or_path {tmp_path / 'model'} is "
        "loaded with its own architecture and tokenizer"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # a loaded tokenizer only: the recipe's model is built, its size unused
        model_args, _, _ = parse_arguments(["multi30k", "--tokenizer_name_or_path", str(tmp_path / "tok"), *output])
    assert [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()] == [
        f"the recipe's tokenizer_vocab_size ignored: the tokenizer is loaded from --tokenizer_name_or_path "
        f"{tmp_path / 'tok'}, not trained"
    ]
    assert model_args.config_overrides == recipe["config_overrides"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # both loaded: each named for what it brings
        parse_arguments(["multi30k", "--model_name_or_path", "ck", "--tokenizer_name_or_path", "tok", *output])
    assert [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()] == [
        f"the recipe's {', '.join(unused)} ignored: --model_name_or_path ck brings its architecture, "
        "--tokenizer_name_or_path tok the tokenizer"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # a new model and tokenizer: every key is used
        parse_arguments(["multi30k", *output])
    assert "ignored" not in caplog.text


def test_unused_recipe_keys_are_named_once_in_a_run_of_several_processes(tmp_path, caplog, monkeypatch):
    """Every process of a multi-machine run parses the flags; the line naming the unused keys comes from the one
    that logs (transformers' ``should_log``: process 0, or each machine's first with --log_on_each_node), not
    from all 16 of two 8-GPU machines."""
    from vanilla_transformer.training.arguments import TransformerTrainingArguments
    from vanilla_transformer.training.options import parse_arguments

    argv = ["multi30k", "--tokenizer_name_or_path", str(tmp_path / "tok"), "--output_dir", str(tmp_path)]
    monkeypatch.setattr(TransformerTrainingArguments, "process_index", property(lambda self: 3))
    with caplog.at_level(logging.WARNING):
        parse_arguments([*argv, "--log_on_each_node", "false"])
    assert "ignored" not in caplog.text
    monkeypatch.setattr(TransformerTrainingArguments, "process_index", property(lambda self: 0))
    with caplog.at_level(logging.WARNING):
        parse_arguments([*argv, "--log_on_each_node", "false"])
    assert "the recipe's tokenizer_vocab_size ignored" in caplog.text


def test_ctrl_c_before_training_starts_exits_130_and_says_nothing_was_saved(tmp_path, monkeypatch, caplog):
    """A Ctrl-C while a large corpus is read or the tokenizer trained (minutes on WMT14) ended in a traceback
    and exit status 1, which the documented table reads as "an error". The same Ctrl-C during training exits
    130 after saving; here there is nothing to resume."""
    write_pairs(tmp_path, "train", reverse_pairs(20, seed=1))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "build_trainer", interrupted)
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit) as exit_info:
        run.main(tiny_args(tmp_path, tmp_path / "out"), exit_on_bad_input=True)
    assert exit_info.value.code == 130
    assert "before training started: nothing was saved" in caplog.text


def test_the_help_describes_this_tools_behaviour_not_the_stock_trainers(capsys):
    """transformers' own help said --resume_from_checkpoint and --do_* are "not directly used by Trainer" and that
    --generation_max_length defaults to the model config's max_length; here `last` resumes, no --do_* flag
    trains, and the length is each source's + 50."""
    with pytest.raises(SystemExit):
        run.parse_arguments(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Not directly used by" not in text
    assert "or `last`: the newest complete checkpoint in --output_dir" in text
    assert "default: each source's length + 50 (§6.1)" in text


def test_an_unquoted_no_in_a_yaml_recipe_is_explained(tmp_path):
    """YAML 1.1 reads `eval_strategy: no` as false; the refusal named 'False' and the choices only."""
    recipe = tmp_path / "run.yaml"
    recipe.write_text("eval_strategy: no\n")
    with pytest.raises(ValueError, match="eval_strategy: 'False' is not one of .* quote it, e.g. 'no'"):
        run.parse_arguments([str(recipe), "--output_dir", str(tmp_path / "out")])


def test_do_flags_on_the_command_line_decide_the_steps_over_a_recipes(data_dir, trained, tmp_path, caplog):
    """`multi30k --model_name_or_path M --do_eval` took the recipe's do_train: true and do_predict: true as given
    on the command line: the evaluate-only command fine-tuned M. A step turned on there runs with only those turned
    on there; steps only turned off there leave the recipe's others. The reference: the recipe file's values."""
    import yaml

    from vanilla_transformer.training.options import recipe_path

    recipe = yaml.safe_load(recipe_path("multi30k").read_text())
    assert (recipe["do_train"], recipe["do_eval"], recipe["do_predict"]) == (True, True, True)
    local = ["multi30k", "--dataset_name", "none", *files(data_dir, "validation"), "--output_dir", str(tmp_path)]
    local += ["--model_name_or_path", str(trained), "--use_cpu", "--report_to", "none", "--disable_tqdm", "true"]
    with caplog.at_level(logging.WARNING):
        _, data_args, training_args = run.parse_arguments([*local, "--do_eval"])
    assert run.steps_to_run(training_args, data_args) == (False, True, False)
    assert "the recipe's do_train: true, do_predict: true ignored: --do_eval decides the steps" in caplog.text
    _, data_args, training_args = run.parse_arguments([*local, *files(data_dir, "train"), "--do_predict", "false"])
    assert run.steps_to_run(training_args, data_args) == (True, True, False)
    metrics = run.main([*local, "--do_eval", "--generation_num_beams", "1"])
    assert "eval_loss" in metrics and "train_runtime" not in metrics
    assert not (tmp_path / "model.safetensors").exists()


def test_a_recipes_schedule_for_training_from_scratch_gives_way_to_fine_tunings(trained, tmp_path, caplog):
    """A recipe's peak and warm-up counted as given: `multi30k --model_name_or_path M` fine-tuned M at the recipe's
    from-scratch peak of 2e-3, and a wmt14 recipe's 4,000 warm-up steps outlasted a short fine-tune. A file that
    names the checkpoint itself gives a schedule for fine-tuning it, and the command line's is kept. The
    reference: the recipe file's values, and fine-tuning's documented 1e-4 after 10% of the updates."""
    import yaml

    from vanilla_transformer.training.options import recipe_path

    recipe = yaml.safe_load(recipe_path("multi30k").read_text())
    assert recipe["learning_rate"] != 1e-4 and recipe["warmup_steps"] >= 1
    output = ["--output_dir", str(tmp_path / "out")]
    with caplog.at_level(logging.WARNING):
        _, _, args = run.parse_arguments(["multi30k", "--model_name_or_path", str(trained), *output])
    assert args.learning_rate == 1e-4 and args.warmup_steps == 0.1
    assert (
        f"fine-tuning --model_name_or_path {trained} at a peak of 0.0001 after 10% of the updates, not at "
        f"learning_rate {recipe['learning_rate']:g}, warmup_steps {recipe['warmup_steps']:g} from the recipe (a "
        "schedule for training from scratch)" in caplog.text
    )
    _, _, args = run.parse_arguments(
        ["multi30k", "--model_name_or_path", str(trained), "--learning_rate", "3e-4", *output]
    )
    assert args.learning_rate == 3e-4 and args.warmup_steps == 0.1
    own = tmp_path / "fine-tune.yaml"
    own.write_text(f"model_name_or_path: {trained}\nlearning_rate: 3.0e-4\nwarmup_steps: 50\n")
    _, _, args = run.parse_arguments([str(own), *output])
    assert args.learning_rate == 3e-4 and args.warmup_steps == 50


def test_evaluating_or_predicting_into_a_run_folder_keeps_its_earlier_metrics(data_dir, trained, tmp_path):
    """transformers' save_metrics("all") rewrote all_results.json with the new metrics alone: evaluating a trained
    run's model into its own folder lost its training metrics. The reference: the file before, and the split
    files (predict_results.json) the same runs write."""
    folder = tmp_path / "run"
    shutil.copytree(trained, folder)
    before = json.loads((folder / "all_results.json").read_text())
    assert "train_runtime" in before
    flags = ["--model_name_or_path", str(folder), "--output_dir", str(folder), "--use_cpu", "--report_to", "none"]
    flags += ["--disable_tqdm", "true", "--generation_num_beams", "1"]
    test = ["--test_source_file", str(data_dir / "test.src"), "--test_target_file", str(data_dir / "test.tgt")]
    run.main([*flags, "--do_predict", *test])
    predicted = json.loads((folder / "predict_results.json").read_text())
    assert json.loads((folder / "all_results.json").read_text()) == {**before, **predicted}
    evaluated = run.main([*flags, "--do_eval", *files(data_dir, "validation")])
    assert json.loads((folder / "all_results.json").read_text()) == {**before, **predicted, **evaluated}


def test_an_integration_that_is_not_installed_is_refused_before_any_data_is_read(tmp_path, monkeypatch):
    """`--report_to wandb` without wandb failed when the Trainer was built, after the tokenizer was trained and the
    data tokenized. The reference: transformers' own callback for it refuses to start in the same environment."""
    import sys

    from transformers.integrations import WandbCallback

    monkeypatch.setitem(sys.modules, "wandb", None)  # not importable, whether installed here or not
    with pytest.raises(RuntimeError, match="requires wandb to be installed"):
        WandbCallback()
    message = r"^--report_to: 'wandb' cannot report from here: install its package: pip install wandb; or leave"
    with pytest.raises(ValueError, match=message):
        run.parse_arguments(["--report_to", "wandb", "--output_dir", str(tmp_path)])
    config = tmp_path / "run.yaml"
    config.write_text("output_dir: out\nreport_to: [tensorboard, wandb]\n")
    with pytest.raises(ValueError, match=r"^'.*run.yaml': report_to: 'wandb' cannot report from here"):
        run.parse_arguments([str(config)])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--metric_for_best_model", "blue"], r"^--metric_for_best_model blue: evaluation reports no eval_blue \(did "),
        (["--metric_for_best_model", "eval_perplexity"], r"eval_perplexity is worked out from eval_loss after the"),
        (["--metric_for_best_model", "chrf", "--predict_with_generate", "false"], r"reports no eval_chrf, only the"),
    ],
)
def test_a_metric_for_best_model_that_evaluation_does_not_report_is_refused_before_reading(
    data_dir, tmp_path, monkeypatch, flags, message
):
    """transformers looks --metric_for_best_model up at the first evaluation: a KeyError after the data was read and
    the model trained until then."""
    monkeypatch.setattr(run, "load_text_datasets", lambda *a, **k: pytest.fail("read the data first"))
    argv = tiny_args(
        data_dir, tmp_path, *files(data_dir, "validation"), "--eval_strategy", "steps", "--eval_steps", "1"
    )
    with pytest.raises(ValueError, match=message):
        run.main([*argv, *flags])


@pytest.mark.parametrize("generate", [True, False], ids=["scores", "loss-only"])
def test_the_metrics_for_best_model_accepted_are_those_an_evaluation_during_training_reports(
    data_dir, tmp_path, generate
):
    """The reference: the metrics the Trainer hands its callbacks at an evaluation during training."""
    from transformers import TrainerCallback

    from vanilla_transformer.training.options import EVALUATION_METRICS, GENERATION_METRICS

    class Seen(TrainerCallback):
        metrics: dict = {}

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            Seen.metrics = dict(metrics)

    argv = [*files(data_dir, "validation"), "--eval_strategy", "steps", "--eval_steps", "1", "--max_steps", "1"]
    argv += ["--max_tokens", "300", "--generation_num_beams", "1", "--predict_with_generate", str(generate).lower()]
    prepared = run.build_trainer(*run.parse_arguments(tiny_args(data_dir, tmp_path, *argv)))
    prepared.trainer.add_callback(Seen())
    prepared.trainer.train()
    reported = {name.removeprefix("eval_") for name in Seen.metrics if name.startswith("eval_")}
    assert reported == set(EVALUATION_METRICS + (GENERATION_METRICS if generate else ()))


def test_a_generation_config_asking_for_several_translations_is_refused_before_reading(
    data_dir, trained, tmp_path, monkeypatch
):
    """num_return_sequences 2 (from --generation_config, or the checkpoint's generation_config.json) failed after
    training, when evaluation scored twice as many hypotheses as references. The reference: generate() with that
    config returns two rows a sentence."""
    from transformers import GenerationConfig

    model = tmp_path / "model"
    shutil.copytree(trained, model)
    several = GenerationConfig.from_pretrained(model)
    several.num_beams, several.num_return_sequences = 2, 2
    several.save_pretrained(model)
    checkpoint, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(model), AutoTokenizer.from_pretrained(model)
    assert len(checkpoint.generate(**tokenizer(["a b c"], return_tensors="pt"))) == 2
    monkeypatch.setattr(run, "load_text_datasets", lambda *a, **k: pytest.fail("read the data first"))
    message = f"--generation_config {model} sets num_return_sequences 2: evaluation and --do_predict score one"
    with pytest.raises(ValueError, match=re.escape(message)):
        run.main(
            tiny_args(data_dir, tmp_path / "new", *files(data_dir, "validation"), "--generation_config", str(model))
        )
    test = ["--test_source_file", str(data_dir / "test.src"), "--test_target_file", str(data_dir / "test.tgt")]
    message = f"the generation config of --model_name_or_path {model} sets num_return_sequences 2"
    with pytest.raises(ValueError, match=re.escape(message)):
        run.main(["--model_name_or_path", str(model), "--do_predict", *test, "--output_dir", str(tmp_path / "p")])


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--max_predict_samples", "5"],
            "--max_predict_samples 5 translates the first N test pairs, but no prediction",
        ),
        (["--compound_split_bleu", "true"], "--compound_split_bleu also scores the test set's translations as the"),
        (["--max_eval_samples", "5", "--do_eval", "false"], "--max_eval_samples 5 evaluates the first N validation"),
    ],
    ids=["max_predict_samples", "compound_split_bleu", "max_eval_samples"],
)
def test_a_flag_of_a_step_that_does_not_run_is_refused_before_reading(data_dir, tmp_path, monkeypatch, flags, message):
    """They did nothing, silently, where the step they belong to did not run. A recipe's (the wmt14 en-de recipes'
    compound_split_bleu: true) comes with its steps, and stays accepted when the command line turns one off."""
    monkeypatch.setattr(run, "load_text_datasets", lambda *a, **k: pytest.fail("read the data first"))
    with pytest.raises(ValueError, match=re.escape(message)):
        run.main(tiny_args(data_dir, tmp_path, *files(data_dir, "validation"), *flags))
    argv = ["wmt14-en-de-base", "--dataset_name", "none", *files(data_dir, "train"), "--do_predict", "false"]
    model_args, data_args, training_args = run.parse_arguments([*argv, "--output_dir", str(tmp_path), "--use_cpu"])
    assert data_args.compound_split_bleu and not training_args.do_predict
    run.check_arguments(model_args, data_args, training_args)


@pytest.mark.parametrize("extra, decodes", [((), 1), (("--average_checkpoints", "2"), 2)], ids=["last", "averaged"])
def test_the_final_model_evaluated_at_the_last_update_is_not_decoded_again(
    data_dir, tmp_path, monkeypatch, extra, decodes
):
    """An evaluation during training at the last update scores the final model where it is those weights: the
    run's evaluation decoded the whole validation set again for the same numbers. An average of checkpoints is
    other weights: evaluated anew."""
    from vanilla_transformer.training.trainer import TransformerTrainer

    calls = []
    evaluate = TransformerTrainer.evaluate

    def counted(self, *args, **kwargs):
        calls.append(self.state.global_step)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(TransformerTrainer, "evaluate", counted)
    argv = [*files(data_dir, "validation"), "--eval_strategy", "steps", "--eval_steps", "2", "--max_steps", "2"]
    argv += ["--save_strategy", "steps", "--save_steps", "1", "--max_tokens", "300", "--generation_num_beams", "1"]
    metrics = run.main(tiny_args(data_dir, tmp_path, *argv, *extra))
    assert calls == [2] * decodes
    logged = [e for e in json.loads((tmp_path / "trainer_state.json").read_text())["log_history"] if "eval_loss" in e]
    assert len(logged) == 1 and logged[0]["step"] == 2
    same = all(metrics[name] == logged[0][name] for name in ("eval_loss", "eval_bleu", "eval_chrf"))
    assert same == (decodes == 1)
