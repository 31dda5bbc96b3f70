"""Bad input to the command-line tools ends in a correct result or in an error that names the file,
line or flag and says how to fix it, before any long work.

"Before any long work" is checked by giving a flag error together with a training file that does
not exist: the flag must be named, not the file, so nothing was read. The references are the
files themselves (bytes written, folders left untouched) and the flags as given.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vanilla_transformer
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.checkpoint_files import DamagedFileError, check_safetensors
from vanilla_transformer.convert import main as convert_main
from vanilla_transformer.training import averaging, data, translation
from vanilla_transformer.training import run as train

REPO = Path(__file__).resolve().parents[1]
SENTENCES = ["a b c d", "b c d e", "c d e f", "d e f g", "e f g h", "f g h i"]
NOWHERE = "/nonexistent/train.tsv"  # a flag error must be found before this file is looked at


def save_tiny_model(folder: Path, tokenizer=None, seed: int = 0, **overrides) -> Path:
    tokenizer = tokenizer or vanilla_transformer.train_tokenizer(iter(SENTENCES * 3), vocab_size=280)
    torch.manual_seed(seed)
    config = VanillaTransformerConfig.from_preset(
        "tiny",
        **{
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "decoder_start_token_id": tokenizer.bos_token_id,
            **overrides,
        },
    )
    model = VanillaTransformerForConditionalGeneration(config)
    model.generation_config.max_new_tokens = 4
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("model"))


def truncate(path: Path, keep: float = 0.5) -> None:
    content = path.read_bytes()
    path.write_bytes(content[: int(len(content) * keep)])


def train_argv(*extra: str, train_file: str = NOWHERE, output_dir: str = "/nonexistent/out") -> list[str]:
    return [
        "--train_file",
        train_file,
        "--preset",
        "tiny",
        "--output_dir",
        output_dir,
        "--report_to",
        "none",
        "--use_cpu",
        "--save_strategy",
        "no",
        "--eval_strategy",
        "no",
        *extra,
    ]


def refused_before_reading(argv: list[str]) -> str:
    """The error message of train.py's flag checks; a FileNotFoundError for NOWHERE would mean the data
    was looked at first."""
    with pytest.raises((ValueError, OSError)) as error:
        train.build_trainer(*train.parse_arguments(argv))
    assert NOWHERE not in str(error.value), f"the data was read before the flags were checked: {error.value}"
    return str(error.value)


# ---------------------------------------------------------------------------------------------
# train.py: numbers out of range, refused before any data is read
# ---------------------------------------------------------------------------------------------

OUT_OF_RANGE = [  # (flag, value, what the message says)
    ("--max_tokens", "-5", "--max_tokens"),
    ("--average_checkpoints", "-3", "--average_checkpoints"),
    ("--max_steps", "0", "--max_steps must be a positive number"),
    ("--warmup_steps", "-1", "warmup_steps"),
    ("--warmup_steps", "10.5", "--warmup_steps 10.5: give a whole number"),
    ("--label_smoothing_factor", "1.0", r"--label_smoothing_factor must be in \[0, 1\)"),
    ("--label_smoothing_factor", "-0.1", r"--label_smoothing_factor must be in \[0, 1\)"),
    ("--max_source_length", "0", "--max_source_length must be a positive number"),
    ("--max_target_length", "-1", "--max_target_length must be a positive number"),
    ("--max_train_samples", "-5", "--max_train_samples must be a positive number"),
    ("--max_train_samples", "0", "--max_train_samples must be a positive number"),
    ("--max_eval_samples", "0", "--max_eval_samples must be a positive number"),
    ("--max_predict_samples", "-2", "--max_predict_samples must be a positive number"),
    ("--validation_size", "-1", "--validation_size must be 0 or a positive number"),
    ("--tokenizer_vocab_size", "100", "--tokenizer_vocab_size 100 cannot hold"),
    ("--tokenizer_vocab_size", "-1", "--tokenizer_vocab_size -1 cannot hold"),
    ("--tokenizer_train_pairs", "0", "--tokenizer_train_pairs must be a positive number"),
    ("--tokenizer_min_frequency", "0", "--tokenizer_min_frequency must be a positive number"),
    ("--preprocessing_num_workers", "0", "--preprocessing_num_workers must be a positive number"),
    ("--per_device_train_batch_size", "0", "--per_device_train_batch_size must be a positive number"),
    ("--per_device_eval_batch_size", "-1", "--per_device_eval_batch_size must be a positive number"),
    ("--gradient_accumulation_steps", "0", "--gradient_accumulation_steps must be a positive number"),
    ("--save_total_limit", "0", "--save_total_limit must be a positive number"),
    ("--generation_num_beams", "0", "--generation_num_beams must be a positive number"),
    ("--generation_max_length", "0", "--generation_max_length must be a positive number"),
    ("--num_train_epochs", "0", "--num_train_epochs must be positive"),
    ("--learning_rate", "0", "--learning_rate must be positive"),
    ("--lr_scale", "-1", "--lr_scale must be positive"),
    ("--adam_beta2", "1.0", r"--adam_beta2 must be in \[0, 1\)"),
    ("--weight_decay", "-0.1", "--weight_decay"),
    ("--max_grad_norm", "-1", "--max_grad_norm"),
    ("--dataloader_num_workers", "-1", "--dataloader_num_workers"),
    ("--seed", "-1", "--seed"),
]


@pytest.mark.parametrize("flag, value, message", OUT_OF_RANGE)
def test_train_numbers_out_of_range_name_the_flag_before_reading_data(flag, value, message):
    assert re.search(message, refused_before_reading(train_argv(flag, value)))


@pytest.mark.parametrize("flag", ["--save_steps", "--eval_steps", "--logging_steps"])
def test_zero_intervals_are_refused_not_taken_as_unset(flag):
    """The Trainer takes eval_steps=0 as "use logging_steps", and save_steps=0 divides by zero mid-run."""
    assert f"{flag} must be a positive number" in refused_before_reading(
        train_argv("--save_strategy", "steps", "--eval_strategy", "steps", flag, "0")
    )


def test_epochs_beside_a_number_of_updates_are_refused_not_ignored():
    """transformers trains --max_steps updates whatever --num_train_epochs says, without a word: a recipe's
    max_steps (multi30k: an upper bound of 1,000,000) would make ``--num_train_epochs 1`` train for days."""
    message = refused_before_reading(["multi30k", *train_argv("--num_train_epochs", "1")])
    assert "--num_train_epochs 1 does nothing beside --max_steps 1000000 (the recipe's)" in message
    assert "add --max_steps -1" in message
    message = refused_before_reading(train_argv("--num_train_epochs", "2", "--max_steps", "5"))
    assert "--max_steps 5, which decides" in message and "recipe" not in message
    _, _, epochs = train.parse_arguments(["multi30k", *train_argv("--num_train_epochs", "2", "--max_steps", "-1")])
    assert (epochs.num_train_epochs, epochs.max_steps) == (2, -1)


def test_a_length_limit_above_the_batch_size_is_refused():
    message = refused_before_reading(train_argv("--max_tokens", "200", "--max_source_length", "300"))
    assert "--max_source_length 300" in message and "--max_tokens 200" in message


def test_abbreviated_flags_are_not_accepted():
    """argparse would take --learning_rat as --learning_rate, unseen by the fine-tuning defaults."""
    with pytest.raises(ValueError, match=r"--learning_rat is not a flag of .* \(did you mean --learning_rate\?\)"):
        train.parse_arguments(train_argv("--learning_rat", "0.1"))


def test_average_checkpoints_never_slices_from_the_end(tmp_path):
    """Python's checkpoints[-k:] with k > count would still give the last ones; with k < 0 it would drop the first."""
    with pytest.raises(ValueError, match="--average_checkpoints"):
        train.parse_arguments(train_argv("--average_checkpoints", "-3"))
    with pytest.raises(ValueError, match="average must be 0"):
        train.save_final_model(trainer=None, tokenizer=None, average=-3)


# ---------------------------------------------------------------------------------------------
# train.py: names that do not exist
# ---------------------------------------------------------------------------------------------


def test_fp16_on_the_cpu_is_refused_before_the_data_is_read():
    message = refused_before_reading(train_argv("--fp16", "--use_cpu"))
    assert "--fp16 on cpu" in message and "--bf16" in message


def test_a_misspelt_config_override_is_refused_with_the_close_match():
    message = refused_before_reading(train_argv("--config_overrides", "d_modle=32,encoder_layers=1"))
    assert "no field 'd_modle'" in message and "'d_model'" in message


@pytest.mark.parametrize(
    "overrides, message",
    [
        ("vocab_sise=300", "'vocab_size'"),
        ("dropuot=0.3", "'dropout'"),
        ("banana=1", "no field 'banana'"),
        ("d_model=64,d_model=32", "sets d_model twice"),
        ("d_model=60,encoder_attention_heads=8", "d_model=60 is not divisible"),
        ("dropout=1.5", r"dropout must be in \[0, 1\)"),
        ("d_model=abc", "'d_model' expected int, got str"),
        ("normalize_before=maybe", "'normalize_before' expected bool, got str"),
        ("scale_embedding=no", "'scale_embedding' expected bool, got str"),
    ],
)
def test_config_overrides_are_checked_before_reading_data(overrides, message):
    assert re.search(message, refused_before_reading(train_argv("--config_overrides", overrides)))


@pytest.mark.parametrize("spelling", ["false", "False"])
def test_a_boolean_override_in_either_spelling_builds_the_model_it_names(spelling):
    """``normalize_before=False`` once arrived as the string 'False', which is true: the pre-norm model."""
    overrides = train.parse_overrides(f"normalize_before={spelling},scale_embedding={spelling},head_dim=None")
    assert overrides == {"normalize_before": False, "scale_embedding": False, "head_dim": None}
    config = train.model_config("tiny", f"normalize_before={spelling.lower()}")
    assert config.normalize_before is False
    model = VanillaTransformerForConditionalGeneration(config)
    assert isinstance(model.model.encoder.layer_norm, torch.nn.Identity)  # post-norm (§3.1): no final LayerNorm


def test_a_config_override_typo_never_reaches_config_json(tmp_path):
    """The reference: what VanillaTransformerConfig would have saved, a new field beside the default."""
    config = VanillaTransformerConfig.from_preset("tiny", d_modle=32)
    assert config.to_dict()["d_modle"] == 32 and config.d_model == 64  # what train.py must not let through
    with pytest.raises(ValueError, match="did you mean 'd_model'"):
        train.parse_overrides("d_modle=32")


@pytest.mark.parametrize(
    "preset, message", [("huge", "--preset 'huge' does not exist"), ("bas", "did you mean 'base'")]
)
def test_unknown_preset_is_refused_before_reading_data(preset, message):
    assert message in refused_before_reading(train_argv("--preset", preset))


def test_a_length_penalty_that_is_not_a_number_or_an_unknown_formula_is_refused_before_reading_data():
    assert "--length_penalty must be a finite number" in refused_before_reading(train_argv("--length_penalty", "nan"))
    assert "--length_penalty_formula 'wu' does not exist; choose gnmt" in refused_before_reading(
        train_argv("--length_penalty_formula", "wu")
    )


def test_unknown_attention_implementation_and_sacrebleu_tokenizer():
    assert "--attn_implementation 'bogus'" in refused_before_reading(train_argv("--attn_implementation", "bogus"))
    assert "--sacrebleu_tokenize 'bogus' does not exist" in refused_before_reading(
        train_argv("--sacrebleu_tokenize", "bogus")
    )


def test_unknown_averaging_weights_are_refused_by_flag_and_in_python(capsys):
    """On the command line argparse names the flag and its choices; in Python the arguments class does."""
    from vanilla_transformer.training.trainer import TransformerTrainingArguments

    with pytest.raises(SystemExit):
        train.parse_arguments(train_argv("--average_checkpoints", "3", "--average_weights", "exponential"))
    error = capsys.readouterr().err
    assert "--average_weights" in error and "invalid choice: 'exponential' (choose from 'uniform', 'linear')" in error
    with pytest.raises(ValueError, match="--average_weights must be one of uniform, linear, got 'exponential'"):
        TransformerTrainingArguments(
            output_dir="/nonexistent/out", average_checkpoints=3, average_weights="exponential"
        )


def test_new_model_flags_with_a_checkpoint_and_tokenizer_flags_with_a_tokenizer_are_named(model_dir, caplog):
    with caplog.at_level(logging.WARNING):
        train.parse_arguments(train_argv("--model_name_or_path", str(model_dir), "--preset", "big"))
        train.parse_arguments(train_argv("--tokenizer_name_or_path", str(model_dir), "--tokenizer_vocab_size", "500"))
    messages = [record.message for record in caplog.records]
    checkpoint = f"--model_name_or_path {model_dir} is loaded with its own architecture and tokenizer"
    tokenizer = f"the tokenizer is loaded from --tokenizer_name_or_path {model_dir}, not trained"
    assert f"--preset ignored: {checkpoint}" in messages
    assert f"--tokenizer_vocab_size ignored: {tokenizer}" in messages
    with pytest.raises(ValueError, match="--config_overrides applies to a new model"):
        train.build_trainer(
            *train.parse_arguments(
                train_argv("--model_name_or_path", str(model_dir), "--config_overrides", "dropout=0.2")
            )
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU may take --bf16 itself")
def test_bf16_without_a_gpu_names_the_flag_that_trains_in_bfloat16_on_the_cpu():
    """transformers says "Your setup doesn't support bf16/gpu. You need to assign use_cpu": the flags by our names."""
    no_cpu_flag = [a for a in train_argv() if a != "--use_cpu"]
    with pytest.raises(ValueError, match=r"^--bf16 true: no GPU with bfloat16 here; add --use_cpu true.* leave --bf16"):
        train.parse_arguments([*no_cpu_flag, "--bf16", "true"])
    with pytest.raises(ValueError, match=r"^--bf16_full_eval true: .* leave --bf16_full_eval out"):
        train.parse_arguments([*no_cpu_flag, "--bf16_full_eval", "true"])
    with pytest.raises(ValueError, match=r"give --bf16 false \(the recipe sets bf16: true\)"):
        train.parse_arguments(["wmt14-en-de-base", "--output_dir", "/nonexistent/out"])
    assert train.parse_arguments(train_argv("--bf16", "true"))[2].bf16  # with --use_cpu: bfloat16 on the CPU
    # --tokenizer_only trains nothing in any precision: the recipe's bf16 does not stop it on a CPU-only machine
    only = train.parse_arguments(["wmt14-en-de-base", "--output_dir", "/nonexistent/out", "--tokenizer_only", "true"])
    assert only[0].tokenizer_only and not only[2].bf16 and only[1].dataset_name.endswith("wmt14")


def write(path: Path, text: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(path)


def test_jsonl_with_an_unknown_language_names_the_flag_and_file_before_reading_it_all(tmp_path):
    records = [{"translation": {"en": s, "de": s.upper()}} for s in SENTENCES]
    path = write(tmp_path / "train.jsonl", "".join(json.dumps(r) + "\n" for r in records) + "not json\n")
    args = train.parse_arguments(train_argv("--target_lang", "fr", train_file=path))[1]
    with pytest.raises(ValueError) as error:
        train.load_text_datasets(args, seed=0)
    message = str(error.value)
    assert "missing key 'translation.fr'" in message and "--target_lang fr" in message and path in message
    assert "not json" not in message  # the first record decided, not a read of the whole file


@pytest.mark.parametrize("form", ["aligned", "tsv"])
def test_a_validation_file_empty_once_decompressed_is_named(form, tmp_path):
    """gzip of nothing is 20 bytes, so it passed the check for empty files: the reader then ended in a bare
    StopIteration (TSV) or in datasets' 'Instruction "train" corresponds to no data!' (aligned files)."""
    train_file = write(tmp_path / "train.tsv", "".join(f"{s}\t{s.upper()}\n" for s in SENTENCES))
    empty = gzip.compress(b"")
    if form == "tsv":
        flags = ["--validation_file", write(tmp_path / "valid.tsv.gz", empty)]
        expected = "--validation_file .*valid.tsv.gz' is empty once decompressed"
    else:
        flags = [
            "--validation_source_file",
            write(tmp_path / "valid.en.gz", empty),
            "--validation_target_file",
            write(tmp_path / "valid.de.gz", empty),
        ]
        expected = "--validation_source_file .*valid.en.gz' is empty once decompressed"
    args = train.parse_arguments(train_argv(*flags, train_file=train_file))[1]
    with pytest.raises(ValueError, match=expected):
        train.load_text_datasets(args, seed=0)


def test_a_validation_set_of_blank_pairs_is_refused_before_the_tokenizer_is_trained(tmp_path, monkeypatch):
    train_file = write(tmp_path / "train.tsv", "".join(f"{s}\t{s.upper()}\n" for s in SENTENCES))
    flags = [
        "--validation_source_file",
        write(tmp_path / "valid.en", "\n \nsome text\n"),
        "--validation_target_file",
        write(tmp_path / "valid.de", "\nblank\n\n"),
    ]
    monkeypatch.setattr(train, "prepare_tokenizer", lambda *a, **k: pytest.fail("the tokenizer was trained"))
    with pytest.raises(ValueError, match="--validation_source_file and --validation_target_file: none of its 3 pairs"):
        train.build_trainer(*train.parse_arguments(train_argv(*flags, train_file=train_file)))


def test_a_training_corpus_of_blank_pairs_is_named_by_its_flag(tmp_path, monkeypatch):
    """It was refused by the tokenizer trainer, in its Python argument's words (texts_or_files)."""
    train_file = write(tmp_path / "train.tsv", "\t\n \t \nonly source\t\n")
    monkeypatch.setattr(train, "prepare_tokenizer", lambda *a, **k: pytest.fail("the tokenizer was trained"))
    with pytest.raises(ValueError, match="--train_file: none of its 3 pairs has text on both sides"):
        train.build_trainer(*train.parse_arguments(train_argv(train_file=train_file)))


@pytest.mark.parametrize("how", ["same path", "symbolic link", "hard link"])
def test_one_file_given_as_both_sides_is_refused_before_it_is_read(tmp_path, monkeypatch, how):
    """A typo (--train_target_file train.en) trained a model to copy, for as long as the run was given."""
    source = write(tmp_path / "train.en", "".join(s + "\n" for s in SENTENCES))
    target = {"same path": source, "symbolic link": tmp_path / "train.de", "hard link": tmp_path / "train.de"}[how]
    if how == "symbolic link":
        os.symlink(source, target)
    elif how == "hard link":
        os.link(source, target)
    validation = write(tmp_path / "valid.en", "a\n")
    argv = train_argv("--train_source_file", source, "--train_target_file", str(target))
    argv += ["--validation_source_file", validation, "--validation_target_file", write(tmp_path / "valid.de", "b\n")]
    argv = argv[: argv.index("--train_file")] + argv[argv.index("--train_file") + 2 :]
    monkeypatch.setattr(data, "_arrow_from", lambda *a, **k: pytest.fail("a file was read"))
    with pytest.raises(
        ValueError,
        match="--train_source_file .* and --train_target_file .* are (the same file|one "
        "file \\(a link\\)): the model would learn to copy. Give the de side's file",
    ):
        train.load_text_datasets(train.parse_arguments(argv)[1], seed=0)


def test_a_validation_file_is_checked_before_the_training_corpus_is_read(tmp_path):
    """The training pairs here are misaligned, which only a full read of them finds: the validation file's
    missing key must be named instead, as it is found on its first record."""
    source = write(tmp_path / "train.en", "".join(s + "\n" for s in SENTENCES))
    target = write(tmp_path / "train.de", "".join(s + "\n" for s in SENTENCES[:-1]))
    validation = write(tmp_path / "valid.jsonl", json.dumps({"translation": {"en": "a"}}) + "\n")
    argv = train_argv("--train_source_file", source, "--train_target_file", target, "--validation_file", validation)
    argv = argv[: argv.index("--train_file")] + argv[argv.index("--train_file") + 2 :]
    with pytest.raises(ValueError, match="missing key 'translation.de'"):
        train.load_text_datasets(train.parse_arguments(argv)[1], seed=0)


def test_a_utf16_file_is_named_as_such_with_the_conversion_that_works(tmp_path):
    """'Not valid UTF-8 ... iconv -f latin1' turned UTF-16 (what PowerShell writes) into text with a NUL
    between every two characters, which the reader then accepted."""
    path = tmp_path / "train.en"
    path.write_text("Hello world\nGood morning\n", encoding="utf-16")
    with pytest.raises(ValueError, match="is UTF-16 text .*iconv -f utf-16 -t utf-8"):
        data.read_lines(path, "--train_source_file")


def test_jsonl_missing_nested_key_later_names_the_line(tmp_path):
    lines = [json.dumps({"translation": {"en": "a", "de": "b"}}), json.dumps({"translation": {"en": "c"}})]
    path = write(tmp_path / "train.jsonl", "\n".join(lines) + "\n")
    args = train.parse_arguments(train_argv(train_file=path))[1]
    with pytest.raises(ValueError, match=r"line 2: missing key 'translation.de'"):
        train.load_text_datasets(args, seed=0)


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--target_column", "5"), "--target_column 5: .* has 2 tab-separated field"),
        (("--source_column", "1", "--target_column", "1"), "both read TSV column 1 .*: the model would learn to copy"),
        (("--source_column", "1"), "both read TSV column 1 \\(the target's default is 1"),  # the default's column
        (("--source_column", "01", "--target_column", "1"), "both read TSV column 1"),
        (("--source_column", "x"), "--source_column 'x': a TSV column is a 0-based number"),
    ],
)
def test_tsv_columns_that_do_not_exist_are_named(tmp_path, flags, message):
    path = write(tmp_path / "train.tsv", "".join(f"{s}\t{s.upper()}\n" for s in SENTENCES))
    with pytest.raises(ValueError, match=message):
        train.load_text_datasets(train.parse_arguments(train_argv(*flags, train_file=path))[1], seed=0)


def test_same_language_on_both_sides_is_refused(tmp_path):
    records = [{"en": s, "de": s.upper()} for s in SENTENCES]
    path = write(tmp_path / "train.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    args = train.parse_arguments(train_argv("--source_lang", "en", "--target_lang", "en", train_file=path))[1]
    with pytest.raises(ValueError, match="both be read from 'en'"):
        train.load_text_datasets(args, seed=0)


def test_a_run_that_only_translates_does_not_read_the_training_split(model_dir, tmp_path):
    """With --dataset_name, the training split was taken into (source, target) pairs and checked whatever the
    steps: on WMT14, 4.5M pairs processed to translate 3k test sentences (datasets itself prepares every split
    of a dataset it loads, which is not ours to change)."""
    records = [{"translation": {"en": s, "de": s.upper()}} for s in SENTENCES]
    write(tmp_path / "hub" / "train.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    write(tmp_path / "hub" / "test.jsonl", "".join(json.dumps(r) + "\n" for r in records[:2]))
    argv = [
        "--dataset_name",
        str(tmp_path / "hub"),
        "--test_split",
        "test",
        "--do_predict",
        "--model_name_or_path",
        str(model_dir),
        "--output_dir",
        str(tmp_path / "o"),
        "--cache_dir",
        str(tmp_path / "cache"),
        "--report_to",
        "none",
        "--use_cpu",
    ]
    prepared = train.build_trainer(*train.parse_arguments(argv))
    assert prepared.text["train"] is None and prepared.text["test"]["source"] == SENTENCES[:2]
    files = write(tmp_path / "train.tsv", "".join(f"{s}\t{s.upper()}\n" for s in SENTENCES))
    with pytest.raises(ValueError, match="as files or as --dataset_name, not both"):  # refused by the flags
        train.build_trainer(*train.parse_arguments([*argv, "--train_file", files]))


def test_hub_style_dataset_with_an_unknown_language_is_refused_on_the_first_row(tmp_path):
    """A local folder loads through the same `datasets.load_dataset` call as a Hub name (no network)."""
    records = [{"translation": {"en": s, "de": s.upper()}} for s in SENTENCES]
    write(tmp_path / "hub" / "train.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    argv = [
        "--dataset_name",
        str(tmp_path / "hub"),
        "--target_lang",
        "fr",
        "--output_dir",
        str(tmp_path / "o"),
        "--cache_dir",
        str(tmp_path / "cache"),
    ]
    with pytest.raises(ValueError, match=r"row 0: missing key 'translation.fr'.*--source_lang/--target_lang"):
        train.load_text_datasets(train.parse_arguments(argv)[1], seed=0)
    argv[argv.index("fr")] = "de"
    text = train.load_text_datasets(train.parse_arguments(argv)[1], seed=0)["train"]
    assert text["target"] == [s.upper() for s in SENTENCES]


def test_a_sliced_hub_split_takes_max_train_samples_too(tmp_path):
    """--train_split with a slice of its own (train[:50%]) and --max_train_samples: the first N of that slice
    (datasets refuses a second slice appended to the first)."""
    records = [{"translation": {"en": f"{s} {i}", "de": s.upper()}} for i, s in enumerate(SENTENCES * 4)]
    write(tmp_path / "hub" / "train.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    argv = ["--dataset_name", str(tmp_path / "hub"), "--output_dir", str(tmp_path / "o")]
    argv += ["--cache_dir", str(tmp_path / "cache"), "--train_split", "train[:50%]", "--max_train_samples", "5"]
    text = train.load_text_datasets(train.parse_arguments(argv)[1], seed=0)["train"]
    assert text["source"] == [r["translation"]["en"] for r in records[:5]]


def test_a_hub_split_with_validation_size_and_max_train_samples_is_cut_as_local_files_are(tmp_path):
    """--validation_size V --max_train_samples N: V pairs held out of the whole split, then the first N of
    the rest, the same pairs from a Hub dataset as from the same records in a local file (the Hub split was
    cut to N first: N - V pairs trained, validation drawn from the first N only)."""
    records = [{"translation": {"en": f"{s} {i}", "de": s.upper()}} for i, s in enumerate(SENTENCES * 4)]
    text = "".join(json.dumps(r) + "\n" for r in records)
    write(tmp_path / "hub" / "train.jsonl", text)
    local = write(tmp_path / "local.jsonl", text)
    flags = ["--validation_size", "3", "--max_train_samples", "5", "--output_dir", str(tmp_path / "o")]
    flags += ["--cache_dir", str(tmp_path / "cache")]
    hub = train.load_text_datasets(train.parse_arguments(["--dataset_name", str(tmp_path / "hub"), *flags])[1], seed=0)
    files = train.load_text_datasets(train.parse_arguments(["--train_file", str(local), *flags])[1], seed=0)
    for role, count in (("train", 5), ("validation", 3)):
        assert len(hub[role]) == count and hub[role]["source"] == files[role]["source"], role


def test_bom_and_crlf_are_read_as_the_text(tmp_path):
    """Correct result: the byte-order mark and the carriage returns are not part of any sentence."""
    path = write(
        tmp_path / "train.jsonl",
        b"\xef\xbb\xbf" + b"".join(json.dumps({"en": s, "de": s.upper()}).encode() + b"\r\n" for s in SENTENCES),
    )
    text = train.load_text_datasets(train.parse_arguments(train_argv(train_file=path))[1], seed=0)["train"]
    assert text["source"] == SENTENCES and text["target"] == [s.upper() for s in SENTENCES]


def test_a_run_folder_holding_checkpoints_is_not_reused_without_resuming(tmp_path):
    (tmp_path / "run" / "checkpoint-10").mkdir(parents=True)  # incomplete: `last` would refuse it too
    message = refused_before_reading(train_argv(output_dir=str(tmp_path / "run")))
    assert "already holds checkpoints" in message and "none of them complete" in message
    assert "--resume_from_checkpoint last" not in message


@pytest.mark.parametrize("weights", ["model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"])
def test_a_folder_holding_a_trained_model_is_not_trained_over(tmp_path, weights):
    """A finished run whose checkpoints were deleted after averaging: a new run into its folder replaced its model
    without a word (the checkpoints' refusal alone guarded it)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / weights).write_bytes(b"weights")
    message = refused_before_reading(train_argv(output_dir=str(tmp_path / "run")))
    assert f"already holds a trained model ({weights}), which this run would replace" in message
    assert f"--model_name_or_path {tmp_path / 'run'} --output_dir <new folder>" in message


def test_train_from_a_checkpoint_without_tokenizer_or_with_truncated_weights(model_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model_dir / name, bare / name)
    message = refused_before_reading(train_argv("--model_name_or_path", str(bare)))
    assert f"--model_name_or_path: {bare} has no tokenizer" in message and "--tokenizer_name_or_path" in message
    truncate(bare / "model.safetensors")
    message = refused_before_reading(train_argv("--model_name_or_path", str(bare)))
    assert f"{bare / 'model.safetensors'} is truncated or corrupt" in message
    message = refused_before_reading(train_argv("--tokenizer_name_or_path", str(tmp_path / "none")))
    assert f"--tokenizer_name_or_path: the folder {tmp_path / 'none'} does not exist" in message


def test_train_cli_exits_with_the_message_and_no_output(tmp_path):
    """As a user runs it: a non-zero exit, the flag in the last line of stderr, nothing written."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    output = tmp_path / "out"
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO / "training/train.py"),
            *train_argv("--config_overrides", "d_modle=32", output_dir=str(output)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode != 0
    assert "did you mean 'd_model'" in completed.stderr.strip().splitlines()[-1]
    assert not output.exists()


# ---------------------------------------------------------------------------------------------
# Damaged or mismatched artefacts
# ---------------------------------------------------------------------------------------------


def test_safetensors_check_agrees_with_the_format(model_dir, tmp_path):
    """Reference: safetensors' own loader accepts the intact file and refuses every truncation."""
    intact = model_dir / "model.safetensors"
    check_safetensors(intact)
    load_file(intact)
    size = intact.stat().st_size
    for keep in (0, 4, 8, 100, size // 2, size - 1):
        damaged = tmp_path / f"cut{keep}.safetensors"
        damaged.write_bytes(intact.read_bytes()[:keep])
        with pytest.raises(DamagedFileError, match=f"{damaged}"):
            check_safetensors(damaged)
        with pytest.raises(Exception):  # noqa: B017 (whatever safetensors raises: the point is that it fails late)
            load_file(damaged)
    grown = tmp_path / "grown.safetensors"
    grown.write_bytes(intact.read_bytes() + b"\0" * 8)
    with pytest.raises(DamagedFileError, match="where its header describes"):
        check_safetensors(grown)


def checkpoint_copies(model_dir: Path, root: Path, steps=(10, 20, 30)) -> list[Path]:
    folders = []
    for step in steps:
        folder = root / f"checkpoint-{step}"
        shutil.copytree(model_dir, folder)
        folders.append(folder)
    return folders


def test_averaging_a_truncated_checkpoint_names_folder_and_file(model_dir, tmp_path):
    folders = checkpoint_copies(model_dir, tmp_path / "run")
    truncate(folders[1] / "model.safetensors")
    with pytest.raises(ValueError, match=f"{folders[1]}.*model.safetensors is truncated or corrupt"):
        averaging.main(["--inputs", *map(str, folders), "--output-dir", str(tmp_path / "avg")])
    assert not (tmp_path / "avg").exists()


def test_averaging_the_last_skips_an_incomplete_checkpoint_and_says_so(model_dir, tmp_path, caplog):
    """A checkpoint half-written in place (by another tool or an older version) is never averaged."""
    folders = checkpoint_copies(model_dir, tmp_path / "run")
    truncate(folders[-1] / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        chosen = averaging.last_checkpoints(tmp_path / "run", 2)
    assert chosen == folders[:2]
    assert any("skipping" in r.message and "checkpoint-30" in r.message for r in caplog.records)
    with pytest.raises(ValueError, match=r"it has 2 checkpoint-<step> folder\(s\).* and 1 incomplete"):
        averaging.last_checkpoints(tmp_path / "run", 3)


@pytest.mark.parametrize("last", ["0", "-3"])
def test_averaging_last_zero_or_negative_is_refused(model_dir, tmp_path, last):
    checkpoint_copies(model_dir, tmp_path / "run")
    with pytest.raises(SystemExit):
        averaging.main(
            ["--checkpoint-root", str(tmp_path / "run"), "--last", last, "--output-dir", str(tmp_path / "a")]
        )
    with pytest.raises(ValueError, match="--last must be at least 1"):
        averaging.last_checkpoints(tmp_path / "run", int(last))
    assert not (tmp_path / "a").exists()


def test_averaging_checkpoints_with_different_tokenizers_is_refused(model_dir, tmp_path):
    """Same architecture and shapes, another vocabulary: the mean would mix embeddings of different tokens."""
    other_tokenizer = vanilla_transformer.train_tokenizer(iter(["x y z w"] * 20 + SENTENCES), vocab_size=280)
    first = save_tiny_model(tmp_path / "a", seed=1, vocab_size=300)
    second = save_tiny_model(tmp_path / "b", tokenizer=other_tokenizer, seed=2, vocab_size=300)
    assert load_file(first / "model.safetensors").keys() == load_file(second / "model.safetensors").keys()
    with pytest.raises(ValueError, match=f"{first} was trained with another tokenizer than {second}"):
        averaging.main(["--inputs", str(first), str(second), "--output-dir", str(tmp_path / "avg")])


def test_averaging_refuses_duplicates_and_an_existing_model(model_dir, tmp_path):
    with pytest.raises(ValueError, match="given more than once"):
        averaging.main(["--inputs", str(model_dir), str(model_dir), "--output-dir", str(tmp_path / "avg")])
    existing = save_tiny_model(tmp_path / "existing", seed=3)
    before = (existing / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="--force"):
        averaging.main(["--inputs", str(model_dir), "--output-dir", str(existing)])
    assert (existing / "model.safetensors").read_bytes() == before


def test_averaging_root_that_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="--checkpoint-root .* does not exist"):
        averaging.main(
            ["--checkpoint-root", str(tmp_path / "none"), "--last", "2", "--output-dir", str(tmp_path / "a")]
        )


def test_translate_a_model_folder_without_tokenizer_says_to_give_one(model_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(model_dir / name, bare / name)
    source = write(tmp_path / "in.txt", "a b c\n")
    with pytest.raises(FileNotFoundError, match=f"--model {bare}: .* has no tokenizer.*--tokenizer"):
        translation.main(["--model", str(bare), "--input", source, "--output", str(tmp_path / "out.txt")])
    translation.main(
        [
            "--model",
            str(bare),
            "--tokenizer",
            str(model_dir),
            "--input",
            source,
            "--output",
            str(tmp_path / "out.txt"),
            "--no-progress",
        ]
    )
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 1


def test_translate_a_model_folder_with_tokenizer_config_but_no_tokenizer_json(model_dir, tmp_path, monkeypatch):
    half = tmp_path / "half"
    shutil.copytree(model_dir, half)
    (half / "tokenizer.json").unlink()
    source = write(tmp_path / "in.txt", "a b c\n")
    monkeypatch.setattr(translation, "translate", lambda *a, **k: pytest.fail("decoded before the check"))
    with pytest.raises(FileNotFoundError, match=f"--model {half}: .* but no tokenizer.json.*--tokenizer"):
        translation.main(["--model", str(half), "--input", source, "--output", str(tmp_path / "out.txt")])


def test_translate_a_truncated_model_names_the_file(model_dir, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(model_dir, damaged)
    truncate(damaged / "model.safetensors")
    source = write(tmp_path / "in.txt", "a b c\n")
    with pytest.raises(ValueError, match=f"{damaged / 'model.safetensors'} is truncated or corrupt"):
        translation.main(["--model", str(damaged), "--input", source])


def test_translate_checks_where_results_go_before_loading(model_dir, tmp_path, monkeypatch):
    source = write(tmp_path / "in.txt", "a b c\n")
    monkeypatch.setattr(translation, "translate", lambda *a, **k: pytest.fail("decoded before the check"))
    with pytest.raises(FileNotFoundError, match="--output .*: the folder .* does not exist"):
        translation.main(["--model", str(model_dir), "--input", source, "--output", str(tmp_path / "no" / "o.txt")])
    with pytest.raises(ValueError, match="--output .* is also an input file"):
        translation.main(["--model", str(model_dir), "--input", source, "--output", source])
    assert Path(source).read_text() == "a b c\n"
    with pytest.raises(ValueError, match="--sacrebleu-tokenize 'bogus' does not exist"):
        translation.main(["--model", str(model_dir), "--input", source, "--sacrebleu-tokenize", "bogus"])


def test_translate_a_model_that_exists_nowhere(tmp_path):
    source = write(tmp_path / "in.txt", "a b c\n")
    with pytest.raises(FileNotFoundError, match=f"--model {tmp_path / 'none'}: the folder .* does not exist"):
        translation.main(["--model", str(tmp_path / "none"), "--input", source])


@pytest.fixture
def hub_offline(monkeypatch):
    """Hub ids resolved from the local cache alone, as HF_HUB_OFFLINE=1 does, without the client's retries."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_a_name_that_is_no_folder_and_no_hub_model_is_said_so_in_one_line(hub_offline, tmp_path, capsys):
    """A name without a folder of that name is taken for a Hub id; when the Hub cannot give it either, the
    Hub client's several lines (offline-mode advice and all) became the whole error, naming no flag."""
    source = write(tmp_path / "in.txt", "a b c\n")
    with pytest.raises(OSError, match="^--model no-such-model: no such folder here, and not loadable as a Hub model"):
        translation.main(["--model", "no-such-model", "--input", source, "--output", str(tmp_path / "out.txt")])
    cases = [
        ["to-ctranslate2", "no-such-model", str(tmp_path / "ct2"), "--tokenizer", "no-such-tokenizer"],
        ["to-ctranslate2", "no-such-model", str(tmp_path / "ct2")],
        ["from-marian", "no-such-model", str(tmp_path / "m")],
    ]
    for argv in cases:
        with pytest.raises(SystemExit) as exit_info:
            convert_main(argv)
        error = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and len(error.splitlines()) == 1, (argv, error)
        assert "no-such-" in error and "no such folder here, and not loadable as a Hub model" in error, (argv, error)


def test_convert_without_tokenizer_truncated_weights_and_unknown_quantization(model_dir, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model_dir / name, bare / name)
    damaged = tmp_path / "damaged"
    shutil.copytree(model_dir, damaged)
    truncate(damaged / "model.safetensors")
    cases = [
        (["to-ctranslate2", str(bare), str(tmp_path / "ct2")], f"{bare} has no tokenizer"),
        (["to-ctranslate2", str(damaged), str(tmp_path / "ct2")], "model.safetensors is truncated or corrupt"),
        (["to-ctranslate2", str(model_dir), str(tmp_path / "ct2"), "--quantization", "int3"], "--quantization 'int3'"),
        (["from-marian", str(damaged), str(tmp_path / "m")], "model.safetensors is truncated or corrupt"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            convert_main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err, argv
    assert not (tmp_path / "ct2").exists() and not (tmp_path / "m").exists()


# ---------------------------------------------------------------------------------------------
# translate.py inputs
# ---------------------------------------------------------------------------------------------


def stdin_of(monkeypatch, content: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(content)))


def test_translate_empty_stdin_and_invalid_utf8_on_stdin(model_dir, monkeypatch):
    stdin_of(monkeypatch, b"")
    with pytest.raises(ValueError, match="--input - has no lines"):
        translation.main(["--model", str(model_dir)])
    stdin_of(monkeypatch, b"fine\ncaf\xe9\n")
    with pytest.raises(ValueError, match=r"--input \(standard input\), line 2: not valid UTF-8"):
        translation.main(["--model", str(model_dir)])


def test_translate_references_that_do_not_align_name_both_files(model_dir, tmp_path):
    source = write(tmp_path / "in.txt", "a\nb\nc\n")
    references = write(tmp_path / "ref.txt", "A\nB\n")
    with pytest.raises(ValueError, match=f"--input {source} has 3 lines but --references has 2 \\({references}\\)"):
        translation.main(["--model", str(model_dir), "--input", source, "--references", references])


# ---------------------------------------------------------------------------------------------
# The model API
# ---------------------------------------------------------------------------------------------


def test_empty_source_tensors_get_a_clear_error(model_dir):
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    empty = torch.zeros(2, 0, dtype=torch.long)
    with pytest.raises(ValueError, match=r"empty sequence in input_ids \(shape \(2, 0\)\)"):
        model(input_ids=empty, decoder_input_ids=torch.full((2, 1), model.config.decoder_start_token_id))
    with pytest.raises(ValueError, match=r"empty sequence in input_ids \(shape \(2, 0\)\)"):
        model.generate(input_ids=empty)
    with pytest.raises(ValueError, match=r"empty sequence in decoder_input_ids \(or labels\) \(shape \(2, 0\)\)"):
        model(input_ids=torch.full((2, 3), 5), decoder_input_ids=empty)


def test_missing_or_doubled_inputs_are_named_by_the_side_they_are_missing_on(model_dir):
    """model(input_ids=x) without decoder inputs said "Pass exactly one of input_ids and inputs_embeds": the
    source, which had been given."""
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    ids = torch.full((2, 3), 5)
    with pytest.raises(ValueError, match=r"^Got no decoder_input_ids \(or labels\) and no decoder_inputs_embeds: pass"):
        model(input_ids=ids)
    with pytest.raises(ValueError, match=r"^Got no input_ids and no inputs_embeds: pass exactly one of them"):
        model(decoder_input_ids=ids)
    embeds = model.get_input_embeddings()(ids)
    with pytest.raises(ValueError, match=r"^Got both input_ids and inputs_embeds"):
        model(input_ids=ids, inputs_embeds=embeds, decoder_input_ids=ids)


def test_a_source_without_any_token_in_a_batch_is_refused_as_it_is_alone(model_dir):
    """A row of the batch all padding (attention_mask 0) decoded into something else under each attention kernel
    (eager spread over the padding, sdpa took zeros), where alone it is refused."""
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    ids = torch.full((3, 4), 5)
    mask = torch.ones_like(ids)
    ids[1], mask[1] = model.config.pad_token_id, 0
    with pytest.raises(ValueError, match=r"Source 1 of the batch has no token \(its attention_mask is all 0\)"):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3)


def test_pad_to_buckets_outside_its_choices_is_refused_from_python_too(tmp_path):
    from vanilla_transformer.training.trainer import TransformerTrainingArguments

    with pytest.raises(ValueError, match="--pad_to_buckets must be one of auto, always, never, got 'yes'"):
        TransformerTrainingArguments(output_dir=str(tmp_path), pad_to_buckets="yes", use_cpu=True, report_to="none")


def test_validation_held_out_for_no_evaluation_is_refused():
    """--do_train alone with --validation_size would take pairs out of training and evaluate nothing."""
    message = refused_before_reading(train_argv("--do_train", "true", "--validation_size", "20"))
    assert message.startswith("--validation_size 20 holds training pairs out for evaluation, but none runs")


def test_bucket_padding_of_sentence_batches_is_refused():
    """--pad_to_buckets always pads token batches; with sentence batches it would be accepted and do nothing."""
    message = refused_before_reading(train_argv("--max_tokens", "0", "--pad_to_buckets", "always"))
    assert message.startswith("--pad_to_buckets always pads token batches (--max_tokens)")


def test_a_missing_test_file_is_named_before_the_training_corpus_is_read(tmp_path, monkeypatch):
    """Every role's files are checked before any is read: a mistyped --test_source_file fails at once, not after
    reading (and caching) a large training corpus."""
    from vanilla_transformer.training import data

    source, target = (write(tmp_path / f"train.{side}", "".join(s + "\n" for s in SENTENCES)) for side in "st")
    monkeypatch.setattr(data, "parallel_text_dataset", lambda *a, **k: pytest.fail("read before the check"))
    argv = [arg for arg in train_argv(train_file=source) if arg not in ("--train_file", source)]
    argv += ["--train_source_file", source, "--train_target_file", target, "--do_predict", "true"]
    argv += ["--test_source_file", str(tmp_path / "tset.en"), "--test_target_file", target]
    with pytest.raises(FileNotFoundError, match=r"^--test_source_file '.*tset.en' does not exist"):
        train.load_text_datasets(train.parse_arguments(argv)[1], seed=0)


def test_a_length_limit_past_a_new_models_positions_is_refused_before_reading():
    """--max_source_length above a new model's positions (known from --preset and --config_overrides) fails with
    the flags, before any data is read or a tokenizer trained."""
    argv = train_argv("--config_overrides", "max_position_embeddings=64", "--max_source_length", "100")
    message = refused_before_reading(argv + ["--max_tokens", "4096"])
    assert (
        message
        == "--max_source_length 100 is more than the model's 64 positions (max_position_embeddings); give at most 64."
    )


def test_python_callers_get_the_range_checks_the_flags_get(tmp_path):
    """A smoothing of 2.0 gave a loss, and --learning_rate with --lr_scale was accepted by the arguments and
    refused only when training started."""
    from vanilla_transformer.training import TransformerTrainingArguments
    from vanilla_transformer.training_kernels import label_smoothed_cross_entropy

    logits, labels = torch.randn(2, 3, 11), torch.randint(0, 11, (2, 3))
    import numpy as np

    from vanilla_transformer.training.levers import chunked_linear_cross_entropy

    hidden, weight = torch.randn(2, 3, 4), torch.randn(11, 4)
    for smoothing in (2.0, -0.1, 1.0, np.float32(1.5), np.int64(2)):
        with pytest.raises(
            ValueError, match=rf"label_smoothing must be in \[0, 1\) \(the paper: 0.1\), got {smoothing}"
        ):
            label_smoothed_cross_entropy(logits, labels, label_smoothing=smoothing)
        with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\)"):  # the fused loss's too
            chunked_linear_cross_entropy(hidden, weight, labels, label_smoothing=smoothing)
    with pytest.raises(ValueError, match=r"Give --learning_rate \(the peak\) or --lr_scale"):
        TransformerTrainingArguments(output_dir=str(tmp_path), learning_rate=1e-3, lr_scale=2.0)
    # the Multi30k recipe sets learning_rate: --lr_scale alone meets it, which the message says
    message = r"--learning_rate 0.002 \(given, or set by the recipe\) with --lr_scale 2.*change the peak with"
    with pytest.raises(ValueError, match=message):
        train.parse_arguments(["multi30k", "--lr_scale", "2", "--output_dir", str(tmp_path / "run")])
