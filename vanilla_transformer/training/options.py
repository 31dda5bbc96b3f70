"""The flags of a training run, the argument files and packaged recipes they come from, and every check
of them, in one place: what ``vanilla-transformer train`` parses before any data is read.

- `DataArguments`, `ModelArguments` and `TransformerTrainingArguments` (the Trainer's flags with the
  paper's defaults) are the three dataclasses of `parse_arguments`, which also reads an argument file
  (.yaml/.json) or a packaged recipe by name given first.
- `build_parser`: `HfArgumentParser` with the recipe's own flags first, in groups (data, model,
  training, evaluation and decoding), then the rest of `Seq2SeqTrainingArguments`.
- ``check_*``: ranges, names with the closest match, combinations that would be accepted and then do
  nothing; each error names the flag and the fix (`check_arguments` runs those that need the flags alone;
  the training flags' own ranges are `arguments`', run when `TransformerTrainingArguments` is made).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import math
import re
import shlex
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import HfArgumentParser
from transformers.integrations import integration_utils
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .. import PRESETS, VanillaTransformerConfig
from ..attention_backends import check_flex_attention_on_cpu
from ..checkpoint_files import MODEL_WEIGHTS
from ..command_line import did_you_mean, recipe_names, recipe_path
from ..generation_vanilla_transformer import LENGTH_PENALTY_FORMULAS
from ..private_api import require
from ..tokenization_vanilla_transformer import MIN_VOCAB_SIZE
from .arguments import (
    SENTENCE_BATCH_FLAGS,
    TransformerTrainingArguments,
    check_training_arguments,
    sentence_batch_flag_refusal,
)
from .checkpointing import (
    CONTINUED_FROM_NAME,
    RESUME_HINT,
    checkpoint_folders,
    continued_from,
    last_complete_checkpoint,
    of_another_folder,
)
from .data import check_data_arguments

# train --help in groups reads fields through this HfArgumentParser internal (private: checked at import)
require("transformers.HfArgumentParser._parse_dataclass_field")

TRAIN_LOGGER = "vanilla_transformer.train"  # train's log, whichever module writes to it
logger = logging.getLogger(TRAIN_LOGGER)

ATTENTION_IMPLEMENTATIONS = ALL_ATTENTION_FUNCTIONS.valid_keys()
ARGUMENT_FILE_SUFFIXES = (".yaml", ".yml", ".json")
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
        metadata={
            "help": "TSV: 0-based column (default 0); JSONL/Hub: key, dotted for nesting "
            "(default: the language code, or translation.<lang> when records have 'translation')"
        },
    )
    target_column: str | None = field(default=None, metadata={"help": "as --source_column (TSV default 1)"})
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "a Hub dataset (downloaded only when given); 'none' drops one named in an argument file, "
            "with its config and splits"
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "e.g. de-en for wmt14"})
    train_split: str = field(default="train")
    validation_split: str | None = field(default=None, metadata={"help": "Hub split for validation, e.g. validation"})
    test_split: str | None = field(default=None, metadata={"help": "Hub split for --do_predict, e.g. test"})
    validation_size: int = field(
        default=0,
        metadata={
            "help": "hold out this many training pairs for validation when no validation data is given (the same pairs "
            "whatever --seed)"
        },
    )
    max_source_length: int | None = field(
        default=None,
        metadata={
            "help": "drop (and count) longer pairs; default: the model's max_position_embeddings, or --max_tokens "
            "where smaller"
        },
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
        metadata={
            "help": "--do_predict: also report tokenized BLEU as the paper scored it (Moses tokenizer, "
            "##AT## compound splits, multi-bleu.perl's corpus BLEU), as predict_tokenized_bleu"
        },
    )


@dataclass
class ModelArguments:
    """A new model from a preset, or an existing checkpoint to fine-tune; a tokenizer to load or train."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "checkpoint to fine-tune (folder or Hub id)"}
    )
    preset: str = field(default="base", metadata={"help": f"new model from a preset: {', '.join(PRESETS)}"})
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "comma-separated config fields for a new model, e.g. d_model=256,encoder_layers=3"},
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={"help": "tokenizer to load; default: the checkpoint's, or train a joint BPE on the data"},
    )
    tokenizer_vocab_size: int = field(
        default=37000, metadata={"help": "joint BPE vocabulary size when training one (§5.1)"}
    )
    tokenizer_min_frequency: int = field(default=2)
    tokenizer_train_pairs: int = field(
        default=1_000_000,
        metadata={
            "help": "train the tokenizer on at most this many pairs, sampled in blocks (sentencepiece's "
            "input_sentence_size)"
        },
    )
    tokenizer_only: bool = field(
        default=False,
        metadata={
            "help": "train the tokenizer these flags would train, save it in <output_dir>/tokenizer and stop: "
            "once, as one process, for a run of several machines to load with --tokenizer_name_or_path"
        },
    )
    attn_implementation: str | None = field(default=None, metadata={"help": "eager, sdpa or flex_attention"})
    length_penalty: float | None = field(
        default=None,
        metadata={
            "help": "beam search's length penalty alpha, saved in the model's generation config (used by "
            "evaluation, prediction and generate() later); default: the model's own, for a new model "
            "the paper's 0.6 (§6.1)"
        },
    )
    length_penalty_formula: str | None = field(
        default=None,
        metadata={
            "help": "what alpha divides the log-probability by, saved likewise: gnmt, ((5 + |Y|) / 6)^alpha "
            "(the paper's, GNMT's), or length, |Y|^alpha (transformers'); default: the model's own, "
            "for a new model gnmt"
        },
    )


# ---------------------------------------------------------------------------------------------
# The parser: the recipe's flags first, in groups, then the Trainer's
# ---------------------------------------------------------------------------------------------

# Flags of TransformerTrainingArguments (mostly the Trainer's) that belong with the recipe's own.
TRAINING_GROUP = (
    "output_dir",
    "max_steps",
    "num_train_epochs",
    "max_tokens",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "lr_scale",
    "lr_scheduler_type",
    "warmup_steps",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "weight_decay",
    "max_grad_norm",
    "label_smoothing_factor",
    "max_train_minutes",
    "cooldown_minutes",
    "save_minutes",
    "save_steps",
    "save_total_limit",
    "average_checkpoints",
    "average_weights",
    "ema_decay",
    "resume_from_checkpoint",
    "seed",
    "do_train",
    "do_eval",
    "do_predict",
)
DECODING_GROUP = (
    "length_penalty",
    "length_penalty_formula",
    "predict_with_generate",
    "generation_num_beams",
    "generation_max_length",
    "generation_config",
    "per_device_eval_batch_size",
    "eval_order",
    "static_cache_decoding",
    "sacrebleu_tokenize",
    "compound_split_bleu",
)
GROUPS = {
    "data": "the parallel text: local files (.gz ok) or a Hub dataset (downloaded only when named)",
    "model": "a new model from a preset, or a checkpoint to fine-tune; the tokenizer",
    "training": "the paper's recipe (§5): token batches, Adam, eq. (3), label smoothing, checkpoint averaging",
    "evaluation and decoding": "beam search (§6.1), saved in the model's generation config; BLEU and chrF",
}
# Help texts that replace the Trainer's where our meaning differs.
HELP = {
    "per_device_train_batch_size": "sentences per batch, only with --max_tokens 0 (sentence batches); by default "
    "--max_tokens sets the batch by token count and this flag is refused",
    "output_dir": "where checkpoints, the final model (Hub format) and its card go",
    "resume_from_checkpoint": "a checkpoint folder to resume from, or `last`: the newest complete checkpoint in "
    "--output_dir (what a requeued job gives)",
    "do_train": "train; without any --do_* flag the run trains, and evaluates where validation data is given "
    "(--do_eval false: trains only)",
    "do_eval": "evaluate on the validation data (after training, where it trains)",
    "do_predict": "translate and score the test data after training (--test_file, --test_source_file or --test_split)",
    "generation_max_length": "the longest output in evaluation and prediction, in tokens; default: each "
    "source's length + 50 (§6.1)",
    "generation_num_beams": "beams in evaluation and prediction; default: the model's generation config (the "
    "paper's 4)",
}
NO_DEFAULT_SHOWN = {"per_device_train_batch_size"}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """One spelling a flag (the other is accepted too), a short metavar, and a default only where it says
    something: not None, and not where another flag decides the value (--max_tokens the batch size)."""

    def _get_help_string(self, action):
        if action.dest in NO_DEFAULT_SHOWN or action.default in (None, argparse.SUPPRESS) or action.nargs == 0:
            return action.help or ""
        return super()._get_help_string(action)

    def _format_action_invocation(self, action):
        if not action.option_strings:
            return super()._format_action_invocation(action)
        if action.nargs == 0:  # -h, --help; --no_predict_with_generate
            short = [option for option in action.option_strings if not option.startswith("--")]
            return ", ".join(short + [next(option for option in action.option_strings if option.startswith("--"))])
        return f"{action.option_strings[0]} {self._format_args(action, _metavar(action))}"


def _metavar(action) -> str:
    if action.choices:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return {int: "N", float: "X"}.get(action.type, "BOOL" if action.const is True else "VALUE")


class ArgumentParser(HfArgumentParser):
    """`HfArgumentParser` whose errors are one line naming the flag (no usage screen of 170 flags)."""

    def error(self, message: str):
        message = re.sub(r"^argument (--\w+)(/--[\w-]+)?:", r"\1:", message)  # "argument --max_tokens/--max-tokens:"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(prog: str = "vanilla-transformer train") -> ArgumentParser:
    """The parser of `parse_arguments`: data, model, training and decoding flags, then the Trainer's."""
    parser = ArgumentParser(
        [],
        prog=prog,
        allow_abbrev=False,  # "--learning_rat" must not pass as --learning_rate unseen
        formatter_class=HelpFormatter,
        usage=f"{prog} [RECIPE] [--flag value ...]",
        description="Train (or fine-tune), evaluate and translate a test set with the paper's recipe. RECIPE, "
        f"if given first, is a packaged recipe ({', '.join(recipe_names())}) or a .yaml/.json file of "
        "flags; flags after it override it. Every flag is also accepted with dashes (--max-tokens).",
        epilog="Several GPUs: accelerate launch --config_file $(vanilla-transformer config ddp) "
        "-m vanilla_transformer.cli train ...",
    )
    parser.dataclass_types = [ModelArguments, DataArguments, TransformerTrainingArguments]
    fields = {cls: {f.name: f for f in dataclasses.fields(cls) if f.init} for cls in parser.dataclass_types}
    types = {cls: typing.get_type_hints(cls) for cls in parser.dataclass_types}
    placement = {name: "data" for name in fields[DataArguments]}
    placement |= {name: "model" for name in fields[ModelArguments]}
    placement |= {name: "training" for name in TRAINING_GROUP} | {
        name: "evaluation and decoding" for name in DECODING_GROUP
    }
    groups = {title: parser.add_argument_group(title, description) for title, description in GROUPS.items()}
    groups["trainer"] = parser.add_argument_group(
        "Seq2SeqTrainingArguments",
        "transformers' Trainer flags, with the paper's values as defaults where it "
        "states them (https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments)",
    )
    listed = {name: index for index, name in enumerate(TRAINING_GROUP + DECODING_GROUP)}  # else: field order
    ordered = sorted(
        ((cls, name) for cls in parser.dataclass_types for name in fields[cls]),
        key=lambda item: (
            list(GROUPS).index(placement[item[1]]) if item[1] in placement else len(GROUPS),
            listed.get(item[1], 0),
        ),
    )
    for cls, name in ordered:
        original = fields[cls][name]
        metadata = dict(original.metadata)
        if name in HELP:
            metadata["help"] = HELP[name]
        copy = dataclasses.field(default=original.default, default_factory=original.default_factory, metadata=metadata)
        copy.name, copy.type = name, types[cls][name]
        HfArgumentParser._parse_dataclass_field(groups[placement.get(name, "trainer")], copy)
    return parser


def parse_arguments(argv: list[str] | None = None, prog: str = "vanilla-transformer train"):
    """Parse flags into ``(model_args, data_args, training_args)``.

    A first argument naming a packaged recipe (``multi30k``) or ending in .yaml/.yml/.json supplies
    defaults that later flags override. run_translation.py flags that mean something else here are
    refused; fine-tuning gets its own learning-rate defaults unless they are given (on the command line, or by
    an argument file that names the checkpoint: a recipe that names none is for training from scratch).
    """
    parser = build_parser(prog)
    argv = list(sys.argv[1:] if argv is None else argv)
    as_given = list(argv)
    known = {action.dest for action in parser._actions}
    given = {token[2:].split("=", 1)[0].replace("-", "_") for token in argv if token.startswith("--")}
    on_command_line = set(given)  # a recipe file may set model flags that a fine-tuning command does not need
    first = None
    if argv and not argv[0].startswith("-"):
        first = argv.pop(0)
        path = Path(first) if Path(first).suffix in ARGUMENT_FILE_SUFFIXES else recipe_or_error(first)
        values = read_argument_file(path)
        _refuse_foreign_flags(values, f"{str(path)!r}")
        for name in sorted(set(values) - known):
            raise ValueError(
                f"{str(path)!r}: {name!r} is not an argument of {prog}{did_you_mean(name, sorted(known))}; see "
                f"`{prog} --help` for the names."
            )
        recipe = _typed_file_values(parser, values, path)
        parser.set_defaults(**recipe)
        given |= set(values)
    else:
        recipe = {}
    _refuse_foreign_flags(given, "the command line")
    _refuse_unknown_flags(parser, argv)
    _refuse_a_recipe_after_the_flags(parser, argv, first)
    try:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    except ValueError as error:
        if "doesn't support bf16/gpu" not in str(error):  # transformers' words for bf16 without a bfloat16 GPU
            raise
        flags, _ = parser.parse_known_args(argv)
        if flags.tokenizer_only:  # nothing is trained in any precision: the recipe's bf16 (wmt14) does not apply
            return parse_arguments([*as_given, "--bf16", "false", "--bf16_full_eval", "false"], prog)
        raise ValueError(_no_bfloat16_message(flags, set(recipe) - on_command_line)) from None
    _drop_hub_dataset_named_none(data_args)
    _refuse_unknown_integrations(
        training_args.report_to, f"{str(path)!r}: report_to" if "report_to" in set(recipe) - on_command_line else None
    )
    if training_args.should_log:  # once, not in every process of a run of several
        _warn_ignored_flags(model_args, on_command_line, set(recipe) - on_command_line)
    if recipe.get("config_overrides"):
        model_args.config_overrides = _recipe_overrides(
            recipe["config_overrides"], model_args, on_command_line, recipe.get("preset", ModelArguments.preset)
        )
    _resolve_steps(
        parser.parse_known_args(argv)[0], on_command_line, set(recipe) - on_command_line, data_args, training_args
    )
    if "num_train_epochs" in given and training_args.max_steps > 0:  # transformers trains max_steps, says nothing
        whose = " (the recipe's)" if "max_steps" in set(recipe) - on_command_line else ""
        raise ValueError(
            f"--num_train_epochs {training_args.num_train_epochs:g} does nothing beside --max_steps "
            f"{training_args.max_steps}{whose}, which decides how long the run trains: add --max_steps -1 to "
            "train for epochs, or leave --num_train_epochs out."
        )
    training_files = [f"--{name}" for name in ("train_source_file", "train_file") if getattr(data_args, name)]
    if training_files and training_args.should_log and not steps_to_run(training_args, data_args)[0]:
        steps = " and ".join(f"--{name}" for name in STEP_FLAGS if getattr(training_args, name))
        logger.warning(
            f"{' and '.join(training_files)} given, but {steps} alone does not train (the --do_* flags given decide "
            "the steps, as in run_translation.py): add --do_train to train first."
        )
    for name in sorted(set(SENTENCE_BATCH_FLAGS) & given) if training_args.max_tokens else ():  # even at its default
        raise ValueError(sentence_batch_flag_refusal(name, training_args.max_tokens))
    if model_args.model_name_or_path:  # a file's schedule counts where the file names the checkpoint itself
        schedule_given = on_command_line | (set(recipe) if "model_name_or_path" in recipe else set())
        _fine_tuning_schedule(model_args, data_args, training_args, schedule_given, set(recipe) - schedule_given)
    sources = {"command line": frozenset(on_command_line), "recipe": frozenset(set(recipe) - on_command_line)}
    setattr(training_args, FLAG_SOURCES, sources)
    return model_args, data_args, training_args


def _fine_tuning_schedule(model_args, data_args, training_args, given: set, from_recipe: set) -> None:
    """Fine-tuning's peak learning rate and warm-up where neither is ``given`` (on the command line, or by an
    argument file that names the checkpoint itself). A recipe that names no checkpoint trains from scratch
    (``from_recipe``: its flags): its peak and warm-up are for that, and give way, said in the log."""
    replaced = []
    if not given & {"learning_rate", "lr_scale"}:
        replaced += [
            f"{name} {_number(getattr(training_args, name))}"
            for name in ("learning_rate", "lr_scale")
            if name in from_recipe
        ]
        training_args.learning_rate, training_args.lr_scale = FINE_TUNING_LEARNING_RATE, 1.0
    if "warmup_steps" not in given:
        replaced += [f"warmup_steps {_number(training_args.warmup_steps)}"] if "warmup_steps" in from_recipe else []
        training_args.warmup_steps = FINE_TUNING_WARMUP_RATIO
    if replaced and training_args.should_log and steps_to_run(training_args, data_args)[0]:
        logger.warning(
            f"fine-tuning --model_name_or_path {model_args.model_name_or_path} at a peak of "
            f"{training_args.learning_rate:g} after {_warmup_words(training_args.warmup_steps)}, not at "
            f"{', '.join(replaced)} from the recipe (a schedule for training from scratch); give --learning_rate "
            "or --warmup_steps to choose"
        )


def _warmup_words(warmup: float) -> str:
    return f"{warmup:g} updates" if warmup >= 1 else f"{warmup:.0%} of the updates"


def _number(value):
    return f"{value:g}" if isinstance(value, float) else value


# Where `parse_arguments` says each flag came from (the command line, the recipe or argument file), on the
# training arguments: later checks word their errors by it, and a resumed run compares only the flags given.
FLAG_SOURCES = "_flag_sources"


def flags_from(training_args, source: str) -> frozenset | None:
    """The flags that ``source`` ("command line" or "recipe") gave; None for arguments not made by
    `parse_arguments` (a script's own)."""
    sources = getattr(training_args, FLAG_SOURCES, None)
    return None if sources is None else sources[source]


def _refuse_a_recipe_after_the_flags(parser: argparse.ArgumentParser, argv: list[str], first: str | None) -> None:
    """A recipe or argument file given after a flag: only the first argument is read as one (transformers
    would call it an argument not used, or, after a boolean flag, a value that is not true or false). Said with
    the command in its order."""
    named = [index for index, token in enumerate(argv) if Path(token).suffix in ARGUMENT_FILE_SUFFIXES]
    named += [index for index, token in enumerate(argv) if token in recipe_names()]
    # ``--do_train multi30k``: argparse would take the recipe for the flag's value, and fail on it
    after_a_boolean = [argv[index] for index in named if index and _takes_true_or_false(parser, argv[index - 1])]
    left = after_a_boolean or parser.parse_known_args(argv)[1]
    for index, token in enumerate(argv):
        is_file = Path(token).suffix in ARGUMENT_FILE_SUFFIXES
        if token not in left or not (is_file or token in recipe_names()):
            continue
        what = "an argument file" if is_file else "a recipe"
        if first is not None:
            raise ValueError(
                f"{token}: {what} is read only as the first argument, which is {first}; give the flags of "
                f"{token} after {first} instead."
            )
        command = shlex.join([token, *argv[:index], *argv[index + 1 :]])
        raise ValueError(f"{token} after the flags: {what} goes first, before them: {parser.prog} {command}")


def _takes_true_or_false(parser: argparse.ArgumentParser, token: str) -> bool:
    """``token`` is a boolean flag of ``parser`` (HfArgumentParser's: an optional true/false, true alone)."""
    action = parser._option_string_actions.get(token)
    return action is not None and action.nargs == "?" and action.const is True


STEP_FLAGS = ("do_train", "do_eval", "do_predict")


def _resolve_steps(
    flags: argparse.Namespace, on_command_line: set, from_recipe: set, data_args: DataArguments, training_args
) -> None:
    """The --do_* flags as given (``flags``: before transformers turns do_eval on for any --eval_strategy).

    With none given, the steps follow the data (`steps_to_run`: train, and evaluate where validation data is
    given), so that --eval_strategy alone trains too. With only some turned off (``--do_eval false``), the
    others still follow the data: the run trains without evaluating, not the other way round.

    The command line's decide over a recipe's (``from_recipe``): a step turned on there runs with only the
    others turned on there (``multi30k --model_name_or_path M --do_eval`` evaluates M, it does not train it);
    steps only turned off there leave the recipe's others.
    """
    typed = [name for name in STEP_FLAGS if name in on_command_line]
    recipes = [name for name in STEP_FLAGS if name in from_recipe]
    named = typed if any(getattr(flags, name) for name in typed) else typed + recipes
    if not named:
        training_args.do_eval = False
        return
    if any(getattr(flags, name) for name in named):
        on = {name for name in named if getattr(flags, name)}
    else:
        on = {"do_train"} | ({"do_eval"} if validation_given(data_args) else set())
        on -= set(named)
        if not on:
            off = " ".join(f"--{name} false" for name in named)
            raise ValueError(f"{off}: nothing left to run; give --do_train, --do_eval or --do_predict.")
    strategy = getattr(training_args.eval_strategy, "value", training_args.eval_strategy)
    if "do_eval" in named and not flags.do_eval and strategy != "no":
        raise ValueError(
            f"--do_eval false and --eval_strategy {strategy}, which evaluates during training: "
            "give --eval_strategy no, or leave --do_eval out."
        )
    if strategy != "no" and "do_eval" not in named:  # transformers' do_eval for an --eval_strategy
        on.add("do_eval")
    dropped = [name for name in recipes if name not in named and getattr(flags, name) and name not in on]
    if dropped and training_args.should_log:
        given = " ".join(f"--{name}" for name in typed if getattr(flags, name))
        logger.warning(
            f"the recipe's {', '.join(f'{name}: true' for name in dropped)} ignored: {given} decides the steps"
        )
    for name in STEP_FLAGS:
        setattr(training_args, name, name in on)


def _no_bfloat16_message(flags: argparse.Namespace, from_recipe: set) -> str:
    """transformers' "Your setup doesn't support bf16/gpu", in the command's flags: which flag asked for bfloat16
    (--bf16, --bf16_full_eval; the recipe's or the command line's), and what to give instead."""
    name = "bf16" if flags.bf16 else "bf16_full_eval"
    off = f"give --{name} false (the recipe sets {name}: true)" if name in from_recipe else f"leave --{name} out"
    if torch.cuda.is_available():  # a GPU before Ampere (V100, T4): float16 instead
        return (
            f"--{name} true: this GPU has no bfloat16 (it needs compute capability 8.0+); give --fp16 true, or {off}."
        )
    return (
        f"--{name} true: no GPU with bfloat16 here; add --use_cpu true for bfloat16 on the CPU (autocast), or {off} "
        "for float32."
    )


def _recipe_overrides(from_recipe, model_args: ModelArguments, on_command_line: set, recipe_preset: str):
    """The recipe's --config_overrides with the command line's: merged key by key, the command line's winning
    (the recipe's model, with dropout=0.3, not the preset's); dropped with a warning when a checkpoint is
    fine-tuned, whose architecture is its own (the recipe's shape was never asked for on the command line), and
    when the command line names another --preset than the recipe's (``recipe_preset``), which is built as it is
    (with the command line's overrides only)."""
    given = model_args.config_overrides if "config_overrides" in on_command_line else None
    if model_args.model_name_or_path:
        return given  # _warn_ignored_flags said so; a command line's is refused with the checkpoint
    if "preset" in on_command_line and model_args.preset != recipe_preset:
        logger.warning(
            f"the recipe's config_overrides ({_as_text(from_recipe)}) shape its own preset: --preset "
            f"{model_args.preset} is built as it is{' with --config_overrides ' + _as_text(given) if given else ''}"
        )
        return given
    if given is None:
        return _as_text(from_recipe)  # text, as the command line's: every reader of the flag parses text
    return _as_text({**parse_overrides(_as_text(from_recipe)), **parse_overrides(_as_text(given))})


def _as_text(overrides: str | dict | None) -> str:
    """--config_overrides as text (a recipe may give a mapping): ``key=JSON value``, comma-separated."""
    if isinstance(overrides, dict):
        return ",".join(f"{key}={json.dumps(value)}" for key, value in overrides.items())
    return overrides or ""


def _typed_file_values(parser: argparse.ArgumentParser, values: dict, path: Path) -> dict:
    """An argument file's values, each converted by its flag's type and checked against its choices as argparse
    does for the command line (it does neither for defaults): YAML's 0 for a column named by a string becomes "0",
    and 4096.5 for a count of tokens is refused naming the file and the flag, before anything is read."""
    actions = {action.dest: action for action in parser._actions}
    one_or_a_list = _one_value_or_a_list()
    typed = {}
    for name, value in values.items():
        action = actions[name]
        if value is None or isinstance(value, dict):  # null: unset; a mapping (e.g. --fsdp_config) as it is
            typed[name] = value
            continue
        several = action.nargs in ("+", "*") or isinstance(action.nargs, int)
        several = several or (isinstance(value, list) and name in one_or_a_list)
        items = value if several and isinstance(value, list) else [value]
        try:
            if isinstance(value, list) and not several:
                raise ValueError("a list where one value goes")
            converted = [(action.type or str)(str(item)) for item in items]
        except (ValueError, TypeError, argparse.ArgumentTypeError) as error:
            raise ValueError(f"{str(path)!r}: {name}: {value!r} is not a value --{name} takes ({error}).") from None
        for item in converted:
            if action.choices is not None and item not in action.choices:
                choices = ", ".join(str(choice) for choice in action.choices)
                hint = ""
                if isinstance(value, bool) and {"no", "yes", "on", "off"} & {str(c) for c in action.choices}:
                    hint = " YAML reads an unquoted no, yes, on or off as a boolean: quote it, e.g. 'no'."
                raise ValueError(f"{str(path)!r}: {name}: {item!r} is not one of {choices}.{hint}")
        typed[name] = converted if several else converted[0]
    return typed


# What each --report_to integration needs (transformers' availability checks, which its callbacks run only when the
# Trainer is built): the package to install, or for kubeflow where it runs.
INTEGRATION_NEEDS = {
    "azure_ml": ("is_azureml_available", "install its package: pip install azureml-sdk"),
    "comet_ml": (lambda: importlib.util.find_spec("comet_ml") is not None, "install its package: pip install comet-ml"),
    "mlflow": ("is_mlflow_available", "install its package (pip install mlflow), and unset DISABLE_MLFLOW_INTEGRATION"),
    "neptune": ("is_neptune_available", "install its package: pip install neptune"),
    "tensorboard": ("is_tensorboard_available", "install its package: pip install tensorboard"),
    "trackio": ("is_trackio_available", "install its package: pip install trackio"),
    "wandb": ("is_wandb_available", "install its package: pip install wandb"),
    "codecarbon": ("is_codecarbon_available", "install its package: pip install codecarbon"),
    "clearml": ("is_clearml_available", "install its package: pip install clearml"),
    "dagshub": ("is_dagshub_available", "install its packages: pip install dagshub mlflow"),
    "flyte": ("is_flytekit_available", "install its package: pip install flytekit"),
    "dvclive": ("is_dvclive_available", "install its package: pip install dvclive"),
    "swanlab": ("is_swanlab_available", "install its package: pip install swanlab"),
    "kubeflow": (
        "is_kubeflow_available",
        "it reports from a Kubeflow TrainJob, which sets KUBEFLOW_TRAINER_SERVER_URL",
    ),
}


def _refuse_unknown_integrations(report_to: list[str], where: str | None) -> None:
    """--report_to's names, and that each integration can report from here (its package installed), checked before
    any data is read: transformers checks them when the Trainer is built, after the tokenizer is trained and the
    data tokenized. ``none`` and ``all`` stand alone (transformers reads
    ``[none, tensorboard]`` as an integration named none); ``where`` names the argument file that gave them."""
    known = set(INTEGRATION_TO_CALLBACK)
    where = where or "--report_to"
    alone = {"none", "all"} & set(report_to)
    if alone and len(report_to) > 1:
        word = alone.pop()
        raise ValueError(
            f"{where}: {word!r} stands alone, not in a list with {[name for name in report_to if name != word]}; "
            f"give {word} or the integrations."
        )
    for name in report_to:
        if name not in known:
            raise ValueError(
                f"{where}: {name!r} is not an integration transformers reports to"
                f"{did_you_mean(name, sorted(known), quoted=False)}; give none, all, or any of "
                f"{', '.join(sorted(known))}."
            )
        check, needs = INTEGRATION_NEEDS.get(name, (None, None))
        available = getattr(integration_utils, check, None) if isinstance(check, str) else check
        if available is not None and not available():
            raise ValueError(f"{where}: {name!r} cannot report from here: {needs}; or leave {name} out of --report_to.")


def _one_value_or_a_list() -> set[str]:
    """The fields that take one value or a list (``report_to: str | list[str]``): one on the command line, where
    the parser reads a single value, either in an argument file (``report_to: [tensorboard, trackio]``)."""
    names = set()
    for arguments in (ModelArguments, DataArguments, TransformerTrainingArguments):
        hints = typing.get_type_hints(arguments)
        for name in (f.name for f in dataclasses.fields(arguments)):
            if any(typing.get_origin(option) is list for option in typing.get_args(hints[name])):
                names.add(name)
    return names


def _refuse_unknown_flags(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """A flag the parser does not know, with the closest one it does (argparse would list them all unnamed)."""
    flags = [option for option in parser._option_string_actions if option.startswith("--")]
    for token in argv:
        flag = token.split("=", 1)[0]
        if token.startswith("--") and flag not in parser._option_string_actions:
            raise ValueError(
                f"{flag} is not a flag of {parser.prog}{did_you_mean(flag, flags, quoted=False)}; "
                f"see {parser.prog} --help."
            )
        if (
            token.startswith("-")
            and not token.startswith("--")
            and token not in parser._option_string_actions
            and not _is_number(token)
            and token != "-"
        ):
            raise ValueError(f"{token}: flags are spelt with two dashes (--flag value); see {parser.prog} --help.")


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _drop_hub_dataset_named_none(data_args: DataArguments) -> None:
    """``--dataset_name none`` unsets the Hub dataset of an argument file (a recipe) and what belongs to it
    (its config and splits), so that the same recipe runs on local files."""
    if data_args.dataset_name is not None and data_args.dataset_name.lower() == "none":
        data_args.dataset_name = data_args.dataset_config_name = None
        data_args.validation_split = data_args.test_split = None


def _refuse_foreign_flags(names, where: str) -> None:
    for name in sorted(set(names) & set(RUN_TRANSLATION_FLAGS)):
        raise ValueError(
            f"--{name} (from {where}) is a run_translation.py flag that does not apply here: "
            f"{RUN_TRANSLATION_FLAGS[name]}."
        )


MODEL_FLAGS = {"preset", "config_overrides"}  # a new model's shape
TOKENIZER_FLAGS = {"tokenizer_vocab_size", "tokenizer_min_frequency", "tokenizer_train_pairs"}  # a new tokenizer's


def _warn_ignored_flags(model_args: ModelArguments, given: set, from_recipe: set = frozenset()) -> None:
    """Flags for a new model or a new tokenizer, given on the command line (``given``) or by a recipe
    (``from_recipe``) where none is built: said in the log, in one line for each (they do nothing)."""
    loaded = model_args.model_name_or_path
    ignored = (MODEL_FLAGS if loaded else set()) | (
        TOKENIZER_FLAGS if model_args.tokenizer_name_or_path or loaded else set()
    )
    tokenizer = model_args.tokenizer_name_or_path
    if loaded and tokenizer:
        why = (
            f"--model_name_or_path {loaded} brings its architecture, --tokenizer_name_or_path {tokenizer} the tokenizer"
        )
    elif loaded:
        why = f"--model_name_or_path {loaded} is loaded with its own architecture and tokenizer"
    else:
        why = f"the tokenizer is loaded from --tokenizer_name_or_path {tokenizer}, not trained"
    if names := sorted(given & ignored - {"config_overrides"}):  # the command line's is refused (a checkpoint's)
        logger.warning(f"{', '.join('--' + name for name in names)} ignored: {why}")
    if names := sorted(from_recipe & ignored):
        logger.warning(f"the recipe's {', '.join(names)} ignored: {why}")


def recipe_or_error(name: str) -> Path:
    """The packaged recipe ``name``; its error adds that a recipe file is given by its path."""
    try:
        return recipe_path(name)
    except ValueError as error:
        raise ValueError(f"{error} Or give the path of a recipe file ({', '.join(ARGUMENT_FILE_SUFFIXES)}).") from None


def read_argument_file(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"Argument file {str(path)!r} does not exist.")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{str(path)!r}, line {error.lineno}, column {error.colno}: not valid JSON ({error.msg})."
            ) from None
    else:
        import yaml

        try:
            values = yaml.safe_load(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise ValueError(f"{str(path)!r}{where}: not valid YAML ({problem}).") from None
    if values is None:
        raise ValueError(f"{str(path)!r} is empty: give it the flags as `name: value` lines.")
    if not isinstance(values, dict):
        raise ValueError(f"{str(path)!r} must hold a mapping of argument names to values, got {type(values).__name__}.")
    named: dict = {}
    for key, value in values.items():  # max-steps or max_steps, as on the command line
        name = key.replace("-", "_") if isinstance(key, str) else key
        if not isinstance(name, str):
            raise ValueError(f"{str(path)!r}: {key!r} is not an argument name (a word, such as max_steps).")
        if name in named:
            raise ValueError(f"{str(path)!r} gives {name} twice (as {name} and as {name.replace('_', '-')}).")
        named[name] = value
    return named


def check_model_arguments(model_args: ModelArguments) -> None:
    """The new model's preset and overrides (built once, without weights), the tokenizer's sizes and the
    attention implementation, refused before any data is read."""
    if model_args.model_name_or_path:
        refuse_overrides_of_a_checkpoint(model_args.config_overrides)
    else:
        if model_args.preset not in PRESETS:
            raise ValueError(
                f"--preset {model_args.preset!r} does not exist{did_you_mean(model_args.preset, PRESETS)}; "
                f"choose one of {', '.join(PRESETS)}."
            )
        model_config(model_args.preset, model_args.config_overrides)  # a value the config refuses fails now
    if model_args.tokenizer_vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"--tokenizer_vocab_size {model_args.tokenizer_vocab_size} cannot hold the 256 bytes and 4 "
            f"special tokens every vocabulary starts with; give at least {MIN_VOCAB_SIZE} (the paper: 37000)."
        )
    for name in ("tokenizer_min_frequency", "tokenizer_train_pairs"):
        if getattr(model_args, name) < 1:
            raise ValueError(f"--{name} must be a positive number, got {getattr(model_args, name)}.")
    if model_args.length_penalty is not None and not math.isfinite(model_args.length_penalty):
        raise ValueError(f"--length_penalty must be a finite number (the paper: 0.6), got {model_args.length_penalty}.")
    formula = model_args.length_penalty_formula
    if formula is not None and formula not in LENGTH_PENALTY_FORMULAS:
        raise ValueError(
            f"--length_penalty_formula {formula!r} does not exist; choose gnmt (the paper's "
            "((5 + |Y|) / 6)^alpha) or length (transformers' |Y|^alpha)."
        )
    implementation = model_args.attn_implementation
    if implementation is not None and implementation != "eager" and implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"--attn_implementation {implementation!r} does not exist; choose eager, sdpa or "
            f"flex_attention (or {', '.join(k for k in ATTENTION_IMPLEMENTATIONS if 'flash' in k)} with "
            "their packages)."
        )


def check_output_dir(training_args, resuming: bool | Path, tokenizer_only: bool = False) -> None:
    """A new run must not write into the folder of another: their checkpoints would mix (averaging would
    take some of each), its model would replace the other's, and the new tokenizer would replace the one the old
    checkpoints need (``tokenizer_only``:
    that is all --tokenizer_only would write, and it has no run to continue). Nor must a run resumed from a
    checkpoint of another folder (``resuming``, the checkpoint) into one that holds checkpoints: they would mix,
    or the resumed run would save over them and rotate them away."""
    output_dir = Path(training_args.output_dir)
    if not output_dir.is_dir():
        return
    if isinstance(resuming, Path) and of_another_folder(resuming, output_dir):
        held = checkpoint_folders(output_dir)
        # the run in output_dir began at that checkpoint and saved none complete there yet (`last` took it)
        again = (
            held and continued_from(output_dir) == resuming.resolve() and last_complete_checkpoint(output_dir) is None
        )
        if held and not again:
            raise ValueError(
                f"--resume_from_checkpoint {resuming} is not in --output_dir {output_dir}, which holds another "
                f"run's checkpoints ({', '.join(p.name for p in held)}): the resumed run's would mix with them, or "
                f"save over them and rotate them away. Resume with --output_dir {resuming.parent} (the checkpoint's "
                f"own run folder), or choose a new --output_dir; to continue the run in {output_dir} (one resumed "
                f"from {resuming} before, say), give --resume_from_checkpoint last."
            )
    if resuming:
        return
    if (record := output_dir / CONTINUED_FROM_NAME).is_file():  # a run continued here that has saved nothing yet
        raise ValueError(
            f"--output_dir {output_dir} holds the start of a run continued from another folder's checkpoint "
            f"({record} names it) that saved nothing here yet. Continue it with {RESUME_HINT}, or choose a new "
            f"--output_dir (or delete {record} to start a new run here)."
        )
    if old := checkpoint_folders(output_dir):
        held = f"--output_dir {output_dir} already holds checkpoints of a run ({', '.join(p.name for p in old[-3:])})"
        if tokenizer_only:
            raise ValueError(
                f"{held}, which need the tokenizer they were trained with: choose a new --output_dir for the new "
                "tokenizer (or delete the old one)."
            )
        if last_complete_checkpoint(output_dir, log=False) is None:  # `last` would refuse them too
            raise ValueError(
                f"{held}, none of them complete (resuming from them is refused): choose a new --output_dir, or "
                "move them out of it to start the run anew there."
            )
        raise ValueError(
            f"{held}. Continue that run with {RESUME_HINT}, or choose a new --output_dir (or delete the old one)."
        )
    if not tokenizer_only and (model := next((n for n in MODEL_WEIGHTS if (output_dir / n).is_file()), None)):
        # a finished run whose checkpoints were deleted after averaging: its model would be trained over
        raise ValueError(
            f"--output_dir {output_dir} already holds a trained model ({model}), which this run would replace: "
            "choose a new --output_dir (or delete that model first); to train it further, fine-tune it into a new "
            f"folder: --model_name_or_path {output_dir} --output_dir <new folder>."
        )


# What an evaluation reports, as --metric_for_best_model names them (transformers puts eval_ before a name without
# it): the loss and the Trainer's timings, and `TranslationMetrics`' scores with --predict_with_generate.
EVALUATION_METRICS = ("loss", "runtime", "samples_per_second", "steps_per_second")
GENERATION_METRICS = ("bleu", "chrf", "gen_len", "unfinished_percent")


# Flags of evaluation and prediction alone: (the step's flag, what they do)
STEP_ONLY_FLAGS = {
    "max_eval_samples": ("do_eval", "evaluates the first N validation pairs"),
    "max_predict_samples": ("do_predict", "translates the first N test pairs"),
    "compound_split_bleu": ("do_predict", "also scores the test set's translations as the paper did"),
}


def refuse_flags_of_steps_not_run(data_args: DataArguments, training_args) -> None:
    """A flag of evaluation or prediction where that step does not run does nothing: refused, unless the recipe
    gave it (with its own steps, which the command line may turn off)."""
    _, do_eval, do_predict = steps_to_run(training_args, data_args)
    runs = {"do_eval": (do_eval, "evaluation"), "do_predict": (do_predict, "prediction")}
    from_recipe = flags_from(training_args, "recipe") or frozenset()
    for name, (step, what) in STEP_ONLY_FLAGS.items():
        value, (running, step_name) = getattr(data_args, name), runs[step]
        if value is None or value is False or running or name in from_recipe:
            continue
        shown = "" if value is True else f" {value}"
        raise ValueError(
            f"--{name}{shown} {what}, but no {step_name} runs: add --{step} (with its data), or leave --{name} out."
        )


def check_metric_for_best_model(training_args) -> None:
    """--metric_for_best_model names a metric the evaluations during training report: transformers looks it up at
    the first of them (a KeyError, the data read and the model trained until then)."""
    name = training_args.metric_for_best_model
    if name is None:
        return
    metric = name.removeprefix("eval_")
    scores = GENERATION_METRICS if training_args.predict_with_generate else ()
    if metric in EVALUATION_METRICS + scores:
        return
    reported = ", ".join(("loss", *scores, *EVALUATION_METRICS[1:]))
    if metric in GENERATION_METRICS:
        raise ValueError(
            f"--metric_for_best_model {name}: with --predict_with_generate false evaluation reports no eval_{metric}, "
            "only the loss and its timings; give loss, or leave --predict_with_generate out to score translations."
        )
    if metric == "perplexity":
        raise ValueError(
            f"--metric_for_best_model {name}: eval_perplexity is worked out from eval_loss after the final "
            "evaluation, not at the evaluations during training; give loss, which ranks checkpoints the same way."
        )
    raise ValueError(
        f"--metric_for_best_model {name}: evaluation reports no eval_{metric}"
        f"{did_you_mean(metric, reported.split(', '))}; give one of {reported} (with or without eval_)."
    )


def check_arguments(model_args: ModelArguments, data_args: DataArguments, training_args) -> None:
    """Every check that needs only the flags: done before any data is read or any model is built."""
    check_training_arguments(training_args)
    check_data_arguments(data_args)
    check_model_arguments(model_args)
    check_metric_for_best_model(training_args)
    refuse_flags_of_steps_not_run(data_args, training_args)
    if model_args.attn_implementation == "flex_attention" and (training_args.use_cpu or not torch.cuda.is_available()):
        check_flex_attention_on_cpu("--attn_implementation flex_attention")
        if steps_to_run(training_args, data_args)[0]:  # torch: "FlexAttention does not support backward on CPU"
            raise ValueError(
                "--attn_implementation flex_attention: torch has no backward pass of flex attention on the CPU, so "
                "it cannot train there; train with sdpa (the default) and decode with flex attention later, or "
                "train on a GPU."
            )
    max_tokens = training_args.max_tokens
    positions = (
        None
        if model_args.model_name_or_path
        else model_config(  # a new model's, known from the flags
            model_args.preset, model_args.config_overrides
        ).max_position_embeddings
    )
    for name in ("max_source_length", "max_target_length"):
        limit = getattr(data_args, name)
        if positions is not None and limit is not None and limit > positions:  # (a checkpoint's: once loaded)
            raise ValueError(
                f"--{name} {limit} is more than the model's {positions} positions (max_position_embeddings); "
                f"give at most {positions}."
            )
        if max_tokens and limit is not None and limit > max_tokens:
            raise ValueError(
                f"--{name} {limit} keeps pairs longer than --max_tokens {max_tokens}, which fit in no "
                f"batch; lower --{name} to at most {max_tokens}, or raise --max_tokens."
            )


def steps_to_run(training_args, data_args: DataArguments) -> tuple[bool, bool, bool]:
    """(train, evaluate, predict): the --do_* flags, or when none is given, train, and evaluate when
    validation data is given."""
    if training_args.do_train or training_args.do_eval or training_args.do_predict:
        return training_args.do_train, training_args.do_eval, training_args.do_predict
    return True, bool(validation_given(data_args)), False


def validation_given(data_args: DataArguments) -> bool:
    """Whether the flags name validation data: files, a Hub split, or pairs held out of the training data."""
    return bool(
        data_args.validation_source_file
        or data_args.validation_file
        or data_args.validation_split
        or data_args.validation_size
    )


CONFIG_FIELDS = tuple(field.name for field in dataclasses.fields(VanillaTransformerConfig))


def parse_overrides(text: str | None) -> dict:
    """``"d_model=256,dropout=0.3,activation_function=relu"`` -> typed dict (JSON values or Python's True, False
    and None, else strings; the config refuses a string where it wants another type).

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
            raise ValueError(
                f"--config_overrides {key}={value}: the config has no field {key!r}"
                f"{did_you_mean(key, CONFIG_FIELDS, most=3)}. The fields "
                "are those of VanillaTransformerConfig, e.g. d_model, encoder_layers, dropout."
            )
        if key in overrides:
            raise ValueError(f"--config_overrides sets {key} twice; give it once.")
        value = value.strip()
        if value in PYTHON_LITERALS:  # Python's spelling of JSON's true, false and null
            overrides[key] = PYTHON_LITERALS[value]
            continue
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


PYTHON_LITERALS = {"True": True, "False": False, "None": None}


def model_config(
    preset: str = "base", config_overrides: str | dict | None = None, tokenizer=None
) -> VanillaTransformerConfig:
    """The config of a new model: the preset, the tokenizer's size and special ids, then the overrides (a dict,
    or ``"d_model=256,dropout=0.3"`` as --config_overrides takes them).

    Without a tokenizer (to check the flags before the tokenizer exists) the preset's ids stand in.
    """
    overrides = config_overrides if isinstance(config_overrides, dict) else parse_overrides(config_overrides)
    special = (
        {}
        if tokenizer is None
        else {
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "decoder_start_token_id": tokenizer.bos_token_id,
        }
    )
    try:
        return VanillaTransformerConfig.from_preset(preset, **{**special, **overrides})
    except (ValueError, TypeError, StrictDataclassError) as error:  # the config's own message, from the flags
        raise ValueError(
            f"--preset {preset} with --config_overrides {config_overrides!r} "
            f"gives an invalid config: {error.__cause__ or error}"
        ) from None


def refuse_overrides_of_a_checkpoint(config_overrides: str | dict | None) -> None:
    """--config_overrides builds a new model; a checkpoint's architecture is its own."""
    if config_overrides:
        raise ValueError(
            "--config_overrides applies to a new model; a checkpoint (--model_name_or_path) keeps its architecture."
        )


def check_steps_have_data(
    model_args, data_args, do_train, do_eval, do_predict, eval_strategy="no", from_recipe=frozenset()
) -> None:
    """Each step asked for has its data (and evaluation alone has a model), from the flags alone; a step that
    the recipe turned on (``from_recipe``: the flags it gave) is said to be the recipe's."""
    given = {
        "train": data_args.train_source_file or data_args.train_file or data_args.dataset_name,
        "validation": validation_given(data_args),
        "test": data_args.test_source_file or data_args.test_file or data_args.test_split,
    }
    strategy = getattr(eval_strategy, "value", eval_strategy)
    if do_train and strategy != "no" and not given["validation"]:
        raise ValueError(
            f"--eval_strategy {strategy} evaluates during training and needs validation data: give "
            "--validation_source_file/--validation_target_file, --validation_file, --validation_split of a Hub "
            "dataset or --validation_size N; or --eval_strategy no."
        )
    if do_train and not given["train"]:
        raise ValueError(
            "Give training data: --train_source_file/--train_target_file, --train_file (.tsv/.jsonl), or "
            "--dataset_name (a Hub dataset); or, to evaluate or predict only, --do_eval/--do_predict with "
            "--model_name_or_path."
        )
    steps = (("validation", do_eval, "do_eval", "evaluation"), ("test", do_predict, "do_predict", "prediction"))
    for role, needed, name, step in steps:
        if needed and not given[role]:
            recipe = f" (the recipe sets {name}: true)" if name in from_recipe else ""
            raise ValueError(
                f"--{name} needs {role} data: give --{role}_source_file/--{role}_target_file, "
                f"--{role}_file or --{role}_split of a Hub dataset; or --{name} false to leave {step} out{recipe}."
            )
    if not do_train and not model_args.model_name_or_path:
        raise ValueError("Without training, --do_eval/--do_predict need the model: give --model_name_or_path.")
    if data_args.validation_size and not do_eval:
        raise ValueError(
            f"--validation_size {data_args.validation_size} holds training pairs out for evaluation, but none runs "
            "(--do_eval false): add --do_eval true, or leave --validation_size out to train on every pair."
        )
