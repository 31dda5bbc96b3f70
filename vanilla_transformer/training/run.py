"""A training run with the paper's recipe, from arguments to a Hub folder: what ``training/train.py`` runs.

Arguments -> data (Arrow) -> tokenizer -> model -> `TransformerTrainer` -> Hub folder, one step a
function, each usable from a script of your own (`build_trainer`, `save_final_model`, ...). The flags
follow transformers' ``run_translation.py`` where they mean the same (``--source_lang``,
``--train_file``, ``--do_train/--do_eval/--do_predict``, ``--test_file``, ``--max_source_length``,
``--preprocessing_num_workers``, ``--predict_with_generate``, every `Seq2SeqTrainingArguments` flag);
those of its flags that mean something else here are refused with the flag to use instead.

Which steps run: ``--do_train``, ``--do_eval`` (validation set), ``--do_predict`` (test set: the
hypotheses in input order in ``generated_predictions.txt``, scores in ``predict_results.json``).
Without any of them: train, then evaluate when there is validation data.

Before any data is read, every flag is checked (ranges, names with the closest match, the first
record of each data file for its columns or keys), and so are the checkpoint to resume from and any
model or tokenizer to load; a problem is an error naming the flag, file and line (`check_arguments`).
Ctrl-C saves a checkpoint and exits with the command to continue (see `checkpointing`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import PartialState
from huggingface_hub.errors import StrictDataclassError
from transformers import (AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, GenerationConfig,
                          HfArgumentParser, TrainerCallback, set_seed)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .. import PRESETS, VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, check_tokenizer_matches_model, train_tokenizer
from ..checkpoint_files import (check_has_tokenizer, check_model_folder, has_tokenizer, tokenizer_definition,
                                without_runtime_settings)
from ..modeling_vanilla_transformer import LENGTH_PENALTY_FORMULA, LENGTH_PENALTY_FORMULAS
from ..tokenization_vanilla_transformer import MIN_VOCAB_SIZE
from . import data
from .averaging import MEAN_NAMES, architecture, average_checkpoints
from .caches import dataset_cache_folder, rebuilt_if_damaged, usable_tokenizer_cache
from .checkpointing import RESUME_HINT, TrainingInterrupted, checkpoint_folders, complete_checkpoints, resolve_checkpoint
from .metrics import TranslationMetrics, check_sacrebleu_tokenize, score
from .moving_average import check_checkpoint as check_moving_average
from .trainer import TransformerTrainer, TransformerTrainingArguments, schedule_name
from .translation import translate

logger = logging.getLogger("vanilla_transformer.train")

ROLES = ("train", "validation", "test")
ATTENTION_IMPLEMENTATIONS = ALL_ATTENTION_FUNCTIONS.valid_keys()
PREDICTIONS_FILE = "generated_predictions.txt"  # run_translation.py's name
# Fine-tuning (--model_name_or_path) without --learning_rate / --warmup_steps: the paper's 4000
# warm-up steps would leave a short fine-tune inside the warm-up, and its peak (7e-4 for the base
# model) is for training from scratch. Continued training usually runs at about a tenth of that.
FINE_TUNING_LEARNING_RATE = 1e-4
FINE_TUNING_WARMUP_RATIO = 0.1

# run_translation.py flags that have no meaning here, and what to do instead.
RUN_TRANSLATION_FLAGS = {
    "num_beams": "decoding follows the model's generation config (the paper's 4 beams); to evaluate with another "
                 "beam size use --generation_num_beams",
    "source_prefix": "a T5-style task prefix has no meaning for a model trained on one translation direction; drop it",
    "forced_bos_token": "this model has no language tokens to force; drop it",
    "overwrite_output_dir": "transformers 5 removed it; use a new --output_dir, or --resume_from_checkpoint last",
    "pad_to_max_length": "batches are padded to their longest sentence; drop it",
    "ignore_pad_token_for_loss": "padding never counts in the loss; drop it",
    "val_max_target_length": "decoding stops at the paper's source length + 50; give --generation_max_length for a "
                             "fixed limit",
    "tokenizer_name": "use --tokenizer_name_or_path",
    "config_name": "a new model comes from --preset and --config_overrides",
    "use_fast_tokenizer": "the tokenizer is always the fast one; drop it",
    "overwrite_cache": "the data cache is keyed by the files' size and time and by the tokenizer; to rebuild it "
                       "anyway, give a new --cache_dir",
}


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


@dataclass
class DataArguments:
    """Where the parallel text comes from: local files, or a Hub dataset (only when named)."""

    source_lang: str = field(default="en", metadata={"help": "source language code, e.g. en"})
    target_lang: str = field(default="de", metadata={"help": "target language code, e.g. de"})
    train_source_file: str | None = field(default=None, metadata={"help": "source side, one sentence a line (.gz ok)"})
    train_target_file: str | None = field(default=None, metadata={"help": "target side, aligned with the source"})
    train_file: str | None = field(default=None, metadata={"help": "pairs in one .tsv or .jsonl file (.gz ok)"})
    validation_source_file: str | None = field(default=None)
    validation_target_file: str | None = field(default=None)
    validation_file: str | None = field(default=None, metadata={"help": ".tsv or .jsonl validation pairs"})
    test_source_file: str | None = field(default=None, metadata={"help": "--do_predict: sources to translate"})
    test_target_file: str | None = field(default=None, metadata={"help": "--do_predict: their references"})
    test_file: str | None = field(default=None, metadata={"help": "--do_predict: .tsv or .jsonl test pairs"})
    source_column: str | None = field(
        default=None,
        metadata={"help": "TSV: 0-based column (default 0); JSONL/Hub: key, dotted for nesting "
                  "(default: the language code, or translation.<lang> when records have 'translation')"},
    )
    target_column: str | None = field(default=None, metadata={"help": "as --source_column (TSV default 1)"})
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "a Hub dataset (downloaded only when given); 'none' drops one named in an argument file, "
                          "with its config and splits"},
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "e.g. de-en for wmt14"})
    train_split: str = field(default="train")
    validation_split: str | None = field(default=None, metadata={"help": "Hub split for validation, e.g. validation"})
    test_split: str | None = field(default=None, metadata={"help": "Hub split for --do_predict, e.g. test"})
    validation_size: int = field(
        default=0, metadata={"help": "hold out this many training pairs for validation when no validation data is given"}
    )
    max_source_length: int | None = field(
        default=None, metadata={"help": "drop (and count) longer pairs; default: the model's max_position_embeddings"}
    )
    max_target_length: int | None = field(default=None, metadata={"help": "as --max_source_length, target side"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training pairs"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "evaluate on the first N validation pairs"})
    max_predict_samples: int | None = field(default=None, metadata={"help": "predict only the first N test pairs"})
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "processes for tokenising (default: every CPU, fewer for small data)"}
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "where the Arrow caches go (default: the datasets cache, ~/.cache/huggingface)"}
    )
    sacrebleu_tokenize: str | None = field(default=None, metadata={"help": "sacreBLEU tokenizer (default: 13a)"})
    compound_split_bleu: bool = field(
        default=False,
        metadata={"help": "--do_predict: also report tokenized BLEU as the paper scored it (Moses tokenizer, "
                          "##AT## compound splits, multi-bleu.perl's corpus BLEU), as predict_tokenized_bleu"},
    )


@dataclass
class ModelArguments:
    """A new model from a preset, or an existing checkpoint to fine-tune; a tokenizer to load or train."""

    model_name_or_path: str | None = field(default=None, metadata={"help": "checkpoint to fine-tune (folder or Hub id)"})
    preset: str = field(default="base", metadata={"help": f"new model from a preset: {', '.join(PRESETS)}"})
    config_overrides: str | None = field(
        default=None, metadata={"help": "comma-separated config fields for a new model, e.g. d_model=256,encoder_layers=3"}
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "tokenizer to load; default: the checkpoint's, or train a joint BPE on the data"}
    )
    tokenizer_vocab_size: int = field(default=37000, metadata={"help": "joint BPE vocabulary size when training one (§5.1)"})
    tokenizer_min_frequency: int = field(default=2)
    tokenizer_train_pairs: int = field(
        default=1_000_000,
        metadata={"help": "train the tokenizer on at most this many pairs, sampled in blocks (sentencepiece's "
                          "input_sentence_size)"},
    )
    attn_implementation: str | None = field(default=None, metadata={"help": "eager, sdpa or flex_attention"})
    length_penalty: float | None = field(
        default=None,
        metadata={"help": "beam search's length penalty alpha, saved in the model's generation config (used by "
                          "evaluation, prediction and generate() later); default: the model's own, for a new model "
                          "the paper's 0.6 (§6.1)"},
    )
    length_penalty_formula: str | None = field(
        default=None,
        metadata={"help": "what alpha divides the log-probability by, saved likewise: gnmt, ((5 + |Y|) / 6)^alpha "
                          "(the paper's, GNMT's), or length, |Y|^alpha (transformers'); default: the model's own, "
                          "for a new model gnmt"},
    )


def parse_arguments(argv: list[str] | None = None):
    """Parse flags into ``(model_args, data_args, training_args)``.

    A first argument ending in .yaml/.yml/.json supplies defaults that later flags override.
    run_translation.py flags that mean something else here are refused; fine-tuning gets its own
    learning-rate defaults unless they are given.
    """
    # No abbreviated flags: "--learning_rat" must not pass as --learning_rate unseen by `given` below.
    parser = HfArgumentParser((ModelArguments, DataArguments, TransformerTrainingArguments), allow_abbrev=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    known = {action.dest for action in parser._actions}
    given = {token[2:].split("=", 1)[0].replace("-", "_") for token in argv if token.startswith("--")}
    on_command_line = set(given)  # a recipe file may set model flags that a fine-tuning command does not need
    if argv and Path(argv[0]).suffix in {".yaml", ".yml", ".json"}:
        path = Path(argv.pop(0))
        values = _read_argument_file(path)
        _refuse_foreign_flags(values, f"{str(path)!r}")
        if unknown := sorted(set(values) - known):
            raise ValueError(f"{str(path)!r} has unknown argument(s) {unknown}; see `train.py --help` for the names.")
        parser.set_defaults(**values)
        given |= set(values)
    _refuse_foreign_flags(given, "the command line")
    model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    _drop_hub_dataset_named_none(data_args)
    _warn_ignored_flags(model_args, on_command_line)
    if model_args.model_name_or_path and not given & {"learning_rate", "lr_scale"}:
        training_args.learning_rate = FINE_TUNING_LEARNING_RATE
    if model_args.model_name_or_path and "warmup_steps" not in given:
        training_args.warmup_steps = FINE_TUNING_WARMUP_RATIO
    return model_args, data_args, training_args


def _drop_hub_dataset_named_none(data_args: DataArguments) -> None:
    """``--dataset_name none`` unsets the Hub dataset of an argument file (a recipe) and what belongs to it
    (its config and splits), so that the same recipe runs on local files."""
    if data_args.dataset_name is not None and data_args.dataset_name.lower() == "none":
        data_args.dataset_name = data_args.dataset_config_name = None
        data_args.validation_split = data_args.test_split = None


def _refuse_foreign_flags(names, where: str) -> None:
    for name in sorted(set(names) & set(RUN_TRANSLATION_FLAGS)):
        raise ValueError(f"--{name} (from {where}) is a run_translation.py flag that does not apply here: "
                         f"{RUN_TRANSLATION_FLAGS[name]}.")


def _warn_ignored_flags(model_args: ModelArguments, given: set) -> None:
    """Flags for a new model or a new tokenizer, given where none is built: said in the log (they do nothing)."""
    loaded = model_args.model_name_or_path
    if loaded and (names := sorted(given & {"preset"})):
        logger.warning(f"--{names[0]} is ignored: --model_name_or_path {loaded} is loaded with its own architecture")
    tokenizer_flags = {"tokenizer_vocab_size", "tokenizer_min_frequency", "tokenizer_train_pairs"}
    if (model_args.tokenizer_name_or_path or loaded) and (names := sorted(given & tokenizer_flags)):
        logger.warning(f"{', '.join('--' + name for name in names)} ignored: the tokenizer is loaded (from "
                       "--tokenizer_name_or_path or --model_name_or_path), not trained")


def _read_argument_file(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"Argument file {str(path)!r} does not exist.")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        values = json.loads(text)
    else:
        import yaml

        values = yaml.safe_load(text)
    if not isinstance(values, dict):
        raise ValueError(f"{str(path)!r} must hold a mapping of argument names to values, got {type(values).__name__}.")
    return values


def check_training_arguments(training_args: TransformerTrainingArguments) -> None:
    """Refuse combinations where a flag would be accepted and then have no effect."""
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerTrainingArguments)}
    if training_args.max_tokens:
        for name in ("per_device_train_batch_size", "train_sampling_strategy", "dataloader_drop_last"):
            if getattr(training_args, name) != defaults[name]:
                raise ValueError(
                    f"--{name} applies to batches of sentences, but --max_tokens {training_args.max_tokens} makes "
                    "batches by token count; drop it, or pass --max_tokens 0 for sentence batches."
                )
    if training_args.average_checkpoints:
        if training_args.save_strategy == "no":
            raise ValueError("--average_checkpoints needs checkpoints: set --save_strategy steps and --save_steps.")
        limit = training_args.save_total_limit
        if limit is not None and limit < training_args.average_checkpoints:
            raise ValueError(
                f"--save_total_limit {limit} keeps fewer checkpoints than --average_checkpoints "
                f"{training_args.average_checkpoints} averages; raise the limit."
            )


def check_data_arguments(args: DataArguments) -> None:
    """Counts, lengths and names of the data flags, refused before any file is read."""
    for name in ("max_source_length", "max_target_length", "max_train_samples", "max_eval_samples",
                 "max_predict_samples", "preprocessing_num_workers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be a positive number, got {value}; leave it out for the default.")
    if args.validation_size < 0:
        raise ValueError(f"--validation_size must be 0 or a positive number of pairs, got {args.validation_size}.")
    if args.validation_size and (args.validation_source_file or args.validation_file or args.validation_split):
        raise ValueError("Give validation data or --validation_size (held out from training), not both.")
    for name in ("source_lang", "target_lang"):
        if not getattr(args, name).strip():
            raise ValueError(f"--{name} is empty; give a language code such as en or de.")
    if any(_pairs_format(path) == ".tsv" for path in (args.train_file, args.validation_file, args.test_file) if path):
        _tsv_column(args.source_column, "--source_column", 0)
        _tsv_column(args.target_column, "--target_column", 1)
    if args.source_column is not None and args.source_column == args.target_column:
        raise ValueError(f"--source_column and --target_column are both {args.source_column!r}: the model would "
                         "learn to copy. Give the target's column.")
    if args.sacrebleu_tokenize is not None:
        check_sacrebleu_tokenize(args.sacrebleu_tokenize, "--sacrebleu_tokenize")


def check_model_arguments(model_args: ModelArguments) -> None:
    """The new model's preset and overrides (built once, without weights), the tokenizer's sizes and the
    attention implementation, refused before any data is read."""
    if model_args.model_name_or_path:
        _refuse_overrides_of_a_checkpoint(model_args)
    else:
        if model_args.preset not in PRESETS:
            close = difflib.get_close_matches(model_args.preset, PRESETS, n=1)
            raise ValueError(f"--preset {model_args.preset!r} does not exist"
                             f"{f' (did you mean {close[0]!r}?)' if close else ''}; choose one of {', '.join(PRESETS)}.")
        new_model_config(model_args)  # a value the config refuses fails now, not after tokenising
    if model_args.tokenizer_vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"--tokenizer_vocab_size {model_args.tokenizer_vocab_size} cannot hold the 256 bytes and 4 "
                         f"special tokens every vocabulary starts with; give at least {MIN_VOCAB_SIZE} (the paper: 37000).")
    for name in ("tokenizer_min_frequency", "tokenizer_train_pairs"):
        if getattr(model_args, name) < 1:
            raise ValueError(f"--{name} must be a positive number, got {getattr(model_args, name)}.")
    if model_args.length_penalty is not None and not math.isfinite(model_args.length_penalty):
        raise ValueError(f"--length_penalty must be a finite number (the paper: 0.6), got {model_args.length_penalty}.")
    formula = model_args.length_penalty_formula
    if formula is not None and formula not in LENGTH_PENALTY_FORMULAS:
        raise ValueError(f"--length_penalty_formula {formula!r} does not exist; choose gnmt (the paper's "
                         "((5 + |Y|) / 6)^alpha) or length (transformers' |Y|^alpha).")
    implementation = model_args.attn_implementation
    if implementation is not None and implementation != "eager" and implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"--attn_implementation {implementation!r} does not exist; choose eager, sdpa or "
                         f"flex_attention (or {', '.join(k for k in ATTENTION_IMPLEMENTATIONS if 'flash' in k)} with "
                         "their packages).")


def check_output_dir(training_args, resuming: bool) -> None:
    """A new run must not write into the folder of another: their checkpoints would mix (averaging would
    take some of each) and the new tokenizer would replace the one the old checkpoints need."""
    output_dir = Path(training_args.output_dir)
    if resuming or not output_dir.is_dir():
        return
    if old := checkpoint_folders(output_dir):
        raise ValueError(
            f"--output_dir {output_dir} already holds checkpoints of a run ({', '.join(p.name for p in old[-3:])}). "
            f"Continue that run with {RESUME_HINT}, or choose a new --output_dir (or delete the old one)."
        )


def check_arguments(model_args: ModelArguments, data_args: DataArguments, training_args) -> None:
    """Every check that needs only the flags: done before any data is read or any model is built."""
    check_training_arguments(training_args)
    check_data_arguments(data_args)
    check_model_arguments(model_args)
    max_tokens = training_args.max_tokens
    for name in ("max_source_length", "max_target_length"):
        limit = getattr(data_args, name)
        if max_tokens and limit is not None and limit > max_tokens:
            raise ValueError(f"--{name} {limit} keeps pairs longer than --max_tokens {max_tokens}, which fit in no "
                             f"batch; lower --{name} to at most {max_tokens}, or raise --max_tokens.")


def steps_to_run(training_args) -> tuple[bool, bool, bool]:
    """(train, evaluate, predict): the --do_* flags, or train (and evaluate) when none is given."""
    if training_args.do_train or training_args.do_eval or training_args.do_predict:
        return training_args.do_train, training_args.do_eval, training_args.do_predict
    return True, None, False  # None: evaluate when there is validation data


# ---------------------------------------------------------------------------------------------
# Data: text -> Arrow, for each role
# ---------------------------------------------------------------------------------------------


def _pairs_format(path: str) -> str | None:
    """".tsv" or ".jsonl" (".json" counts as JSON Lines) by suffix, ".gz" aside; None for anything else."""
    suffixes = [suffix for suffix in Path(path).suffixes if suffix != ".gz"]
    suffix = suffixes[-1] if suffixes else None
    return ".jsonl" if suffix == ".json" else suffix if suffix in {".tsv", ".jsonl"} else None


def _local_dataset(args: DataArguments, role: str):
    """The role's local files as an Arrow dataset of (source, target), or None when none are given."""
    source_file, target_file = getattr(args, f"{role}_source_file"), getattr(args, f"{role}_target_file")
    pairs_file = getattr(args, f"{role}_file")
    if (source_file is None) != (target_file is None):
        raise ValueError(f"Give both --{role}_source_file and --{role}_target_file, or neither.")
    if source_file and pairs_file:
        raise ValueError(f"Give --{role}_source_file/--{role}_target_file or --{role}_file, not both.")
    if source_file:
        return data.parallel_text_dataset(source_file, target_file, (f"--{role}_source_file", f"--{role}_target_file"),
                                          cache_dir=args.cache_dir)
    if not pairs_file:
        return None
    what = f"--{role}_file"
    if _pairs_format(pairs_file) == ".tsv":
        columns = [_tsv_column(args.source_column, "--source_column", 0), _tsv_column(args.target_column, "--target_column", 1)]
        _check_tsv_columns(pairs_file, what, columns)
        return data.tsv_dataset(pairs_file, *columns, what=what, cache_dir=args.cache_dir)
    if _pairs_format(pairs_file) == ".jsonl":
        keys = _json_keys(args, data.first_json_record(pairs_file, what), f"{what} {pairs_file!r}, first record")
        return data.jsonl_dataset(pairs_file, *keys, what=what, cache_dir=args.cache_dir)
    raise ValueError(f"{what} {pairs_file!r}: use a .tsv or .jsonl file (optionally .gz).")


def _tsv_column(value: str | None, flag: str, default: int) -> int:
    if value is None:
        return default
    if not value.isdigit():
        raise ValueError(f"{flag} {value!r}: a TSV column is a 0-based number (e.g. 0 or 1).")
    return int(value)


def _check_tsv_columns(path: str, what: str, columns: list[int]) -> None:
    """The columns exist on the first line (the reader then holds every line to the same fields)."""
    _, first = next(data.numbered_lines(path, what))
    fields = len(first.split("\t"))
    for flag, column in zip(("--source_column", "--target_column"), columns):
        if column >= fields:
            raise ValueError(f"{flag} {column}: {what} {path!r} has {fields} tab-separated field(s) on line 1, "
                             f"columns 0 to {fields - 1}; give the 0-based column of each side.")


def _json_keys(args: DataArguments, record: dict, where: str) -> tuple[str, str]:
    """The source and target keys for JSON records (given, or from the language codes), checked on one record."""
    keys = []
    for side in ("source", "target"):
        given, language = getattr(args, f"{side}_column"), getattr(args, f"{side}_lang")
        key = given or data.default_key(language, record)
        try:
            data.json_field(record, key, where)
        except ValueError as error:
            origin = f"--{side}_column {given}" if given else f"--{side}_lang {language}"
            raise ValueError(f"{error} The key {key!r} comes from {origin}: give --{side}_column with the key "
                             f"(dotted for nesting, e.g. translation.{language}), or check --{side}_lang.") from None
        keys.append(key)
    if keys[0] == keys[1]:
        raise ValueError(f"Source and target would both be read from {keys[0]!r} ({where}): give different "
                         "--source_lang/--target_lang or --source_column/--target_column.")
    return keys[0], keys[1]


def _hub_split(args: DataArguments, split: str):
    return data.hub_dataset(args.dataset_name, args.dataset_config_name, split, args.source_column,
                            args.target_column, (args.source_lang, args.target_lang),
                            args.preprocessing_num_workers, args.cache_dir)


def _first(dataset, count: int | None, flag: str):
    if count is None:
        return dataset
    if count > len(dataset):
        logger.info(f"{flag} {count}: there are only {len(dataset)} pairs; using them all")
    return dataset.select(range(min(count, len(dataset))))


def load_text_datasets(args: DataArguments, seed: int) -> dict:
    """``{"train": ..., "validation": ..., "test": ...}`` Arrow datasets of (source, target); None where absent."""
    check_data_arguments(args)
    local = {role: _local_dataset(args, role) for role in ROLES}
    if local["train"] is not None and args.dataset_name:
        raise ValueError("Give training data as files or as --dataset_name, not both.")
    datasets = dict(local)
    if args.dataset_name:
        train_split = args.train_split + (f"[:{args.max_train_samples}]" if args.max_train_samples else "")
        datasets["train"] = _hub_split(args, train_split)  # read only what is asked for
        for role, split in (("validation", args.validation_split), ("test", args.test_split)):
            if datasets[role] is None and split:
                datasets[role] = _hub_split(args, split)
    if args.validation_size:
        if datasets["train"] is None:
            raise ValueError("--validation_size holds out training pairs, but no training data is given.")
        if args.validation_size >= len(datasets["train"]):
            raise ValueError(f"--validation_size {args.validation_size} leaves no training data "
                             f"({len(datasets['train'])} pairs).")
        split = rebuilt_if_damaged(lambda: datasets["train"].train_test_split(  # a damaged cached split: rebuilt
            test_size=args.validation_size, shuffle=True, seed=seed), dataset_cache_folder(datasets["train"]))
        datasets["train"], datasets["validation"] = split["train"], split["test"]
    for role, count in (("train", args.max_train_samples), ("validation", args.max_eval_samples),
                        ("test", args.max_predict_samples)):
        if datasets[role] is not None:
            datasets[role] = _first(datasets[role], count, {"train": "--max_train_samples",
                                                            "validation": "--max_eval_samples",
                                                            "test": "--max_predict_samples"}[role])
    return datasets


def tokenized(dataset, tokenizer, config, args: DataArguments, role: str, max_tokens: int | None = None):
    """Token ids of one role's pairs, without the empty and too-long ones (counted in the log).

    Too long: beyond --max_source_length/--max_target_length, by default the model's positions, or
    ``max_tokens`` (the batch size) when that is smaller, since such a pair fits in no batch.
    """
    limits = []
    for name in ("max_source_length", "max_target_length"):
        given = getattr(args, name)
        if given is not None and given > config.max_position_embeddings:
            raise ValueError(f"--{name} {given} is more than the model's {config.max_position_embeddings} positions "
                             f"(max_position_embeddings); give at most {config.max_position_embeddings}.")
        limits.append(given or min(config.max_position_embeddings, max_tokens or config.max_position_embeddings))
    ids = data.tokenize_dataset(dataset, tokenizer, args.preprocessing_num_workers, desc=f"tokenizing {role}")
    kept, _ = data.drop_unusable(ids, *limits, role)
    return kept


# ---------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------


def build_tokenizer(model_args: ModelArguments, training_args, train_text, seed: int, checkpoint: Path | None = None,
                    cache_dir: str | None = None):
    """Load the given (or the fine-tuned model's) tokenizer; when resuming, the checkpoint's; otherwise
    train a joint BPE on a sample of the training data (kept under ``cache_dir`` for the next run on the
    same data with the same settings)."""
    name = model_args.tokenizer_name_or_path or model_args.model_name_or_path
    if name:
        check_has_tokenizer(name, "--tokenizer_name_or_path" if model_args.tokenizer_name_or_path
                            else "--model_name_or_path", "Give --tokenizer_name_or_path with the tokenizer it was "
                            "trained with.")
        return AutoTokenizer.from_pretrained(name)
    tokenizer_dir = Path(training_args.output_dir) / "tokenizer"
    if checkpoint is not None:  # never a new tokenizer for a model trained with another
        saved = checkpoint if has_tokenizer(checkpoint) else tokenizer_dir
        if not has_tokenizer(saved):
            raise FileNotFoundError(f"Resuming from {checkpoint}: neither it nor {tokenizer_dir} holds the tokenizer "
                                    "the run was trained with; give it with --tokenizer_name_or_path.")
        logger.info(f"resuming: using the tokenizer trained before, {saved}")
        return AutoTokenizer.from_pretrained(saved)
    if train_text is None:
        raise ValueError("No tokenizer to load and no training data to train one on: give --tokenizer_name_or_path "
                         "or --model_name_or_path.")
    settings = {"vocab_size": model_args.tokenizer_vocab_size, "min_frequency": model_args.tokenizer_min_frequency,
                "pairs": model_args.tokenizer_train_pairs, "seed": seed}
    cached = data.tokenizer_cache_dir(train_text, settings, cache_dir)
    with training_args.main_process_first(desc="training the tokenizer"):  # once; the other processes load it
        if usable_tokenizer_cache(cached):  # a damaged one is deleted (with a warning) and trained again
            logger.info(f"using the tokenizer trained before on the same data with the same settings, {cached}")
            tokenizer = AutoTokenizer.from_pretrained(cached)
        elif training_args.process_index == 0:
            pairs = min(model_args.tokenizer_train_pairs, len(train_text))
            logger.info(f"training a joint BPE tokenizer on {pairs} of {len(train_text)} training pairs "
                        "(--tokenizer_train_pairs)")
            tokenizer = train_tokenizer(
                data.tokenizer_training_texts(train_text, model_args.tokenizer_train_pairs, seed),
                vocab_size=model_args.tokenizer_vocab_size, min_frequency=model_args.tokenizer_min_frequency,
            )
            logger.info(f"trained a joint BPE tokenizer of {len(tokenizer)} tokens")
            partial = cached.with_name(cached.name + ".partial")
            tokenizer.save_pretrained(partial)
            partial.replace(cached)  # complete or absent, never half-written
        else:
            tokenizer = AutoTokenizer.from_pretrained(cached)
    if training_args.process_index == 0:
        tokenizer.save_pretrained(tokenizer_dir)
    return tokenizer


CONFIG_FIELDS = tuple(field.name for field in dataclasses.fields(VanillaTransformerConfig))


def parse_overrides(text: str | None) -> dict:
    """``"d_model=256,dropout=0.3,activation_function=relu"`` -> typed dict (JSON values, else strings).

    Every key must be a field of `VanillaTransformerConfig`: a misspelt one would otherwise be saved
    in config.json as a new field while the real one kept its default.
    """
    overrides = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--config_overrides item {item!r} is not key=value (e.g. d_model=256).")
        if key not in CONFIG_FIELDS:
            close = difflib.get_close_matches(key, CONFIG_FIELDS, n=3)
            raise ValueError(f"--config_overrides {key}={value}: the config has no field {key!r}"
                             f"{' (did you mean ' + ' or '.join(map(repr, close)) + '?)' if close else ''}. The fields "
                             "are those of VanillaTransformerConfig, e.g. d_model, encoder_layers, dropout.")
        if key in overrides:
            raise ValueError(f"--config_overrides sets {key} twice; give it once.")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value.strip()
    return overrides


def new_model_config(model_args: ModelArguments, tokenizer=None) -> VanillaTransformerConfig:
    """The config of a new model: the preset, the tokenizer's size and special ids, then --config_overrides.

    Without a tokenizer (to check the flags before the tokenizer exists) the preset's ids stand in.
    """
    overrides = parse_overrides(model_args.config_overrides)
    special = {} if tokenizer is None else {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": tokenizer.bos_token_id,
    }
    try:
        return VanillaTransformerConfig.from_preset(model_args.preset, **{**special, **overrides})
    except (ValueError, TypeError, StrictDataclassError) as error:  # the config's own message, from the flags
        raise ValueError(f"--preset {model_args.preset} with --config_overrides {model_args.config_overrides!r} "
                         f"gives an invalid config: {error.__cause__ or error}") from None


def _refuse_overrides_of_a_checkpoint(model_args: ModelArguments) -> None:
    if model_args.config_overrides:
        raise ValueError("--config_overrides applies to a new model; a checkpoint (--model_name_or_path) keeps its "
                         "architecture.")


def build_model(model_args: ModelArguments, tokenizer, resume: Path | None = None
                ) -> VanillaTransformerForConditionalGeneration:
    """A new model from a preset sized to the tokenizer, or the checkpoint to fine-tune; resuming (``resume``,
    a checkpoint folder), the generation config that run saved; --length_penalty and --length_penalty_formula
    set in it (saved with the model)."""
    extra = {"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}
    if model_args.model_name_or_path:
        _refuse_overrides_of_a_checkpoint(model_args)
        model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, **extra)
        check_tokenizer_matches_model(tokenizer, model.config)
    else:
        config = new_model_config(model_args, tokenizer)
        check_tokenizer_matches_model(tokenizer, config)
        model = VanillaTransformerForConditionalGeneration._from_config(config, **extra)
    if resume is not None and (resume / "generation_config.json").is_file():  # the Trainer restores weights only
        model.generation_config = GenerationConfig.from_pretrained(resume)
    set_decoding(model, model_args)
    return model


def set_decoding(model, model_args: ModelArguments) -> None:
    """--length_penalty and --length_penalty_formula, where given, into the model's generation config."""
    if model_args.length_penalty is not None:
        model.generation_config.length_penalty = model_args.length_penalty
    if model_args.length_penalty_formula is not None:
        setattr(model.generation_config, LENGTH_PENALTY_FORMULA, model_args.length_penalty_formula)


def check_resume_matches(checkpoint: Path, model, tokenizer) -> None:
    """Resuming continues one model with one tokenizer: flags that build another architecture, or another
    tokenizer, would load the checkpoint's weights into a model that reads them differently."""
    saved = architecture(AutoConfig.from_pretrained(checkpoint).to_dict())
    current = architecture(model.config.to_dict())
    if differing := sorted(key for key in saved.keys() | current.keys() if saved.get(key) != current.get(key)):
        details = ", ".join(f"{key}: {saved.get(key)!r} there, {current.get(key)!r} now" for key in differing)
        raise ValueError(f"--resume_from_checkpoint {checkpoint} holds another architecture than the flags build "
                         f"({details}); resume with the flags the run started with.")
    if (saved_tokenizer := tokenizer_definition(checkpoint).get("tokenizer.json")) is not None:
        current_tokenizer = without_runtime_settings(json.loads(tokenizer.backend_tokenizer.to_str()))
        if saved_tokenizer != current_tokenizer:
            raise ValueError(f"--resume_from_checkpoint {checkpoint} was trained with another tokenizer than the one "
                             "given now; drop --tokenizer_name_or_path to use the checkpoint's.")


# ---------------------------------------------------------------------------------------------
# The trainer, and what happens after training
# ---------------------------------------------------------------------------------------------


class SaveLastStep(TrainerCallback):
    """Save a checkpoint at the last step, so that averaging the last N includes the final weights."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps:
            control.should_save = True
        return control


@dataclass
class Run:
    """What `build_trainer` prepared: the trainer, the tokenizer, the data of each role, and the
    checkpoint to resume from (None for a new run)."""

    trainer: TransformerTrainer
    tokenizer: object
    datasets: dict  # role -> tokenized Arrow dataset (None where absent)
    text: dict  # role -> Arrow dataset of (source, target) text (None where absent)
    resume: Path | None = None


def check_steps_have_data(model_args, data_args, do_train, do_eval, do_predict) -> None:
    """Each step asked for has its data (and evaluation alone has a model), from the flags alone."""
    given = {
        "train": data_args.train_source_file or data_args.train_file or data_args.dataset_name,
        "validation": (data_args.validation_source_file or data_args.validation_file or data_args.validation_split
                       or data_args.validation_size),
        "test": data_args.test_source_file or data_args.test_file or data_args.test_split,
    }
    if do_train and not given["train"]:
        raise ValueError(
            "Give training data: --train_source_file/--train_target_file, --train_file (.tsv/.jsonl), or "
            "--dataset_name (a Hub dataset); or, to evaluate or predict only, --do_eval/--do_predict with "
            "--model_name_or_path."
        )
    for role, needed, flag in (("validation", do_eval, "--do_eval"), ("test", do_predict, "--do_predict")):
        if needed and not given[role]:
            raise ValueError(f"{flag} needs {role} data: give --{role}_source_file/--{role}_target_file, "
                             f"--{role}_file or --{role}_split of a Hub dataset.")
    if not do_train and not model_args.model_name_or_path:
        raise ValueError("Without training, --do_eval/--do_predict need the model: give --model_name_or_path.")


def build_trainer(model_args, data_args, training_args) -> Run:
    """Everything up to a ready trainer. Flags, the checkpoint to resume from and any model or tokenizer
    to load are checked before the data is read. In several processes, the first one reads and
    tokenises the data while the others wait, then they memory-map its cache."""
    check_arguments(model_args, data_args, training_args)
    set_seed(training_args.seed)
    do_train, do_eval, do_predict = steps_to_run(training_args)
    check_steps_have_data(model_args, data_args, do_train, do_eval, do_predict)
    resume = resolve_resume(training_args) if do_train else None
    if resume is not None:
        check_moving_average(resume, training_args.ema_decay)  # before the data is read
    if do_train:
        check_output_dir(training_args, resuming=resume is not None)
    if model_args.model_name_or_path:
        check_model_folder(model_args.model_name_or_path, f"--model_name_or_path {model_args.model_name_or_path}")
    trains_tokenizer = not (model_args.tokenizer_name_or_path or model_args.model_name_or_path or resume)
    tokenizer = None if trains_tokenizer else build_tokenizer(model_args, training_args, None, training_args.seed, resume)
    with training_args.main_process_first(desc="reading the data"):
        text = load_text_datasets(data_args, training_args.seed)
    if tokenizer is None:
        tokenizer = build_tokenizer(model_args, training_args, text["train"], training_args.seed,
                                    cache_dir=data_args.cache_dir)
    model = build_model(model_args, tokenizer, resume)
    if resume is not None:
        check_resume_matches(resume, model, tokenizer)
    tokenizer.model_max_length = model.config.max_position_embeddings  # so that truncation=True means something
    roles = [role for role, wanted in (("train", do_train), ("validation", do_eval is not False)) if wanted]
    with training_args.main_process_first(desc="tokenizing"):
        datasets = {role: tokenized(text[role], tokenizer, model.config, data_args, role,
                                    training_args.max_tokens if role == "train" else None)  # eval: sentence batches
                    if role in roles and text[role] is not None else None for role in ROLES}
    metrics = (TranslationMetrics(tokenizer, tokenize=data_args.sacrebleu_tokenize)
               if datasets["validation"] is not None and training_args.predict_with_generate else None)
    trainer = TransformerTrainer(
        model=model,
        args=training_args,
        train_dataset=datasets["train"],
        eval_dataset=datasets["validation"],
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        compute_metrics=metrics,
        callbacks=[SaveLastStep()] if training_args.average_checkpoints else None,
    )
    set_decoding(trainer.model, model_args)  # again: --generation_config replaced the model's in the Trainer
    return Run(trainer, tokenizer, datasets, text, resume)


def resolve_resume(training_args) -> Path | None:
    """--resume_from_checkpoint PATH (checked to be complete), or 'last' / 'true' for the newest complete
    checkpoint in output_dir (incomplete ones, e.g. of a run killed while saving, are skipped and logged)."""
    value = training_args.resume_from_checkpoint
    if value is None or str(value).lower() in {"false", "none", ""}:
        return None
    checkpoint = True if str(value).lower() in {"last", "true"} else value
    return resolve_checkpoint(checkpoint, training_args.output_dir, "--resume_from_checkpoint")


def save_final_model(trainer, tokenizer, average: int = 0, weights: str = "uniform") -> Path:
    """The final model (or the mean of the last ``average`` checkpoints, §6.1, with ``weights`` as
    `average_checkpoints` takes them; with ``--ema_decay`` the model already holds the moving average) +
    tokenizer + generation config in ``output_dir``, Hub format; the trainer's model then holds what
    was saved."""
    if average < 0:
        raise ValueError(f"average must be 0 (no averaging) or a number of checkpoints, got {average}.")
    output_dir = Path(trainer.args.output_dir)
    trainer.save_model(str(output_dir))
    if average and trainer.is_world_process_zero():
        checkpoints = complete_checkpoints(output_dir)  # oldest first; incomplete ones named in the log
        chosen = checkpoints[max(0, len(checkpoints) - average):]
        if len(chosen) < average:
            logger.warning(f"averaging {len(chosen)} checkpoints instead of {average}: only {len(chosen)} were kept")
        average_checkpoints(chosen, output_dir, weights)
        logger.info(f"final model = {MEAN_NAMES[weights]} of {', '.join(p.name for p in chosen)}")
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(output_dir)
    trainer.accelerator.wait_for_everyone()
    if average:  # evaluate what was saved
        averaged = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
        trainer.load_full_weights(averaged.state_dict())
    return output_dir


def predict(run: Run, data_args: DataArguments) -> dict:
    """Translate the test sources in input order into ``generated_predictions.txt`` and score them."""
    trainer, test = run.trainer, run.text["test"]
    output_dir = Path(trainer.args.output_dir)
    model = trainer.model_for_one_process()  # every process: a sharded model is gathered
    if not trainer.is_world_process_zero():
        trainer.accelerator.wait_for_everyone()
        return {}
    sources, references = test["source"], test["target"]
    hypotheses = translate(model, run.tokenizer, list(sources), trainer.args.per_device_eval_batch_size,
                           progress=not trainer.args.disable_tqdm)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / PREDICTIONS_FILE).write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    scores = score(hypotheses, list(references), tokenize=data_args.sacrebleu_tokenize,
                   **({"compound_split_bleu": True, "language": data_args.target_lang}
                      if data_args.compound_split_bleu else {}))
    results = {f"predict_{key}": value for key, value in scores.items()}
    results["predict_samples"] = len(hypotheses)
    trainer.save_metrics("predict", results)
    trainer.accelerator.wait_for_everyone()
    return results


def write_card(output_dir: Path, trainer, model_args, data_args, metrics: dict) -> Path:
    """README.md of the saved model: Hub metadata with the validation scores, the recipe, how to load it."""
    from ..model_card import write_model_card

    training_args = trainer.args
    # The Hub's base_model names a repo; a local folder is no such reference.
    checkpoint = model_args.model_name_or_path
    base_model = checkpoint if checkpoint and not Path(checkpoint).exists() else None
    signatures = trainer.compute_metrics.signatures if trainer.compute_metrics else {}
    dataset = data_args.dataset_name or "custom"
    scores = [
        {"name": name, "type": kind, "value": round(metrics[f"eval_{kind}"], 2), "dataset": dataset,
         "split": "validation", "signature": signatures.get(kind)}
        for name, kind in (("sacreBLEU", "bleu"), ("chrF", "chrf"))
        if f"eval_{kind}" in metrics
    ]
    return write_model_card(
        output_dir, model=trainer.accelerator.unwrap_model(trainer.model),
        languages=(data_args.source_lang, data_args.target_lang),
        datasets=[data_args.dataset_name] if data_args.dataset_name else [], metrics=scores,
        base_model=base_model, training_hyperparameters={
            "steps": trainer.state.global_step,
            "tokens per batch (max, padded)": training_args.max_tokens or "sentence batches",
            "gradient accumulation": training_args.gradient_accumulation_steps,
            "peak learning rate": training_args.learning_rate, "warm-up steps": training_args.warmup_steps,
            "schedule": schedule_name(training_args),
            "label smoothing": training_args.label_smoothing_factor,
            "Adam": f"({training_args.adam_beta1}, {training_args.adam_beta2}, {training_args.adam_epsilon})",
            "checkpoints averaged": (f"{training_args.average_checkpoints} ({training_args.average_weights} weights)"
                                     if training_args.average_checkpoints else "none"),
            **({"weights": f"exponential moving average, decay {training_args.ema_decay:g}"}
               if training_args.ema_decay else {}),
        },
    )


def main(argv: list[str] | None = None) -> dict:
    """train.py: train (or fine-tune), evaluate and predict as the flags say; returns the metrics.

    Under several processes it ends by closing the process group, as a script's last line should:
    a process that exits with gloo's threads still running is aborted at shutdown ("terminate called
    without an active exception", exit code -6) after a run that succeeded. Call the steps yourself
    (`build_trainer`, `run_steps`) to keep the group open."""
    try:
        model_args, data_args, training_args = parse_arguments(argv)
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
        run = build_trainer(model_args, data_args, training_args)
        metrics = run_steps(run, model_args, data_args, training_args)
        run.trainer.accelerator.wait_for_everyone()  # leave together: no process exits mid-collective
        return metrics
    finally:
        close_process_group()


def close_process_group() -> None:
    """Destroy the default process group if this process joined one (a no-op in a single process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        PartialState().destroy_process_group()


def run_steps(run: Run, model_args: ModelArguments, data_args: DataArguments, training_args) -> dict:
    """Train, evaluate and predict as `steps_to_run` says, save the model and its card; the metrics."""
    trainer, tokenizer = run.trainer, run.tokenizer
    do_train, do_eval, do_predict = steps_to_run(training_args)
    model = trainer.accelerator.unwrap_model(trainer.model)
    logger.info(f"process {training_args.process_index} of {training_args.world_size}")
    logger.info(
        f"model: {model.num_parameters():,} parameters; schedule: "
        f"{schedule_name(training_args)}, "
        f"peak learning rate {training_args.learning_rate:.3g} after {training_args.warmup_steps:g} warm-up "
        f"{'steps' if training_args.warmup_steps >= 1 else 'of the updates'}"
        + ("" if run.datasets["train"] is None else f"; {len(run.datasets['train'])} training pairs")
    )
    metrics: dict = {}
    if do_train:
        try:
            result = trainer.train(resume_from_checkpoint=str(run.resume) if run.resume else None)
        except TrainingInterrupted as interrupted:  # Ctrl-C or SIGTERM, after saving a checkpoint
            logger.warning(str(interrupted))
            raise SystemExit(128 + interrupted.signal_number) from None
        metrics.update(result.metrics)
        trainer.save_state()  # trainer_state.json: the logged loss curve, next to the model
        save_final_model(trainer, tokenizer, training_args.average_checkpoints, training_args.average_weights)
    if run.datasets["validation"] is not None and do_eval is not False:
        evaluation = trainer.evaluate(metric_key_prefix="eval")
        evaluation["eval_perplexity"] = math.exp(min(evaluation["eval_loss"], 50.0))
        metrics.update(evaluation)
    if do_predict:
        metrics.update(predict(run, data_args))
    trainer.save_metrics("all", metrics)
    if do_train and trainer.is_world_process_zero():
        write_card(Path(training_args.output_dir), trainer, model_args, data_args, metrics)
        logger.info(f"saved the model, tokenizer and generation config to {training_args.output_dir}")
    if trainer.is_world_process_zero():
        logger.info("metrics: " + json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}))
    return metrics
