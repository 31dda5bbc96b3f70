"""A training run with the paper's recipe, from flags to a Hub folder: what ``vanilla-transformer train`` runs.

Flags (`options`) -> data (Arrow) -> tokenizer -> model -> `TransformerTrainer` -> Hub folder, one
step a function, each usable from a script of your own (`load_text_datasets`, `build_tokenizer`,
`build_model`, `build_trainer`, `save_final_model`, `predict`). The flags follow transformers'
``run_translation.py`` where they mean the same (``--source_lang``, ``--train_file``,
``--do_train/--do_eval/--do_predict``, ``--test_file``, ``--max_source_length``,
``--preprocessing_num_workers``, ``--predict_with_generate``, every `Seq2SeqTrainingArguments` flag);
those of its flags that mean something else here are refused with the flag to use instead.

Which steps run: ``--do_train``, ``--do_eval`` (validation set), ``--do_predict`` (test set: the
hypotheses in input order in ``generated_predictions.txt``, scores in ``predict_results.json``).
Without any of them: train, then evaluate when there is validation data.

Before any data is read, every flag is checked (ranges, names with the closest match, the first
record of each data file for its columns or keys), and so are the checkpoint to resume from and any
model or tokenizer to load; a problem is an error naming the flag, file and line (`options`).
Ctrl-C saves a checkpoint and exits with the command to continue (see `checkpointing`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import (AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, GenerationConfig,
                          TrainerCallback, set_seed)

from .. import VanillaTransformerForConditionalGeneration, check_tokenizer_matches_model, train_tokenizer
from ..cli import exit_with_usage_error
from ..checkpoint_files import (check_has_tokenizer, check_model_folder, has_tokenizer, tokenizer_definition,
                                without_runtime_settings)
from ..modeling_vanilla_transformer import LENGTH_PENALTY_FORMULA
from . import data
from .averaging import MEAN_NAMES, architecture, average_checkpoints
from .caches import dataset_cache_folder, rebuilt_if_damaged, usable_tokenizer_cache
from .checkpointing import TrainingInterrupted, complete_checkpoints, resolve_checkpoint
from .metrics import TranslationMetrics, score
from .moving_average import check_checkpoint as check_moving_average
from .options import (FINE_TUNING_LEARNING_RATE, FINE_TUNING_WARMUP_RATIO, ROLES, DataArguments,  # noqa: F401
                      ModelArguments, _pairs_format, _refuse_overrides_of_a_checkpoint, _tsv_column, build_parser,
                      check_arguments, check_data_arguments, check_output_dir, check_steps_have_data,
                      check_training_arguments, model_config, new_model_config, parse_arguments, parse_overrides,
                      steps_to_run)
from .arguments import schedule_name
from .trainer import TransformerTrainer
from .translation import translate

logger = logging.getLogger("vanilla_transformer.train")

PREDICTIONS_FILE = "generated_predictions.txt"  # run_translation.py's name


# ---------------------------------------------------------------------------------------------
# Data: text -> Arrow, for each role
# ---------------------------------------------------------------------------------------------


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
    """`tokenize_pairs` with the data flags."""
    return tokenize_pairs(dataset, tokenizer, config, role, max_source_length=args.max_source_length,
                          max_target_length=args.max_target_length, max_tokens=max_tokens,
                          num_proc=args.preprocessing_num_workers)


def tokenize_pairs(dataset, tokenizer, config, role: str = "train", *, max_source_length: int | None = None,
                   max_target_length: int | None = None, max_tokens: int | None = None, num_proc: int | None = None):
    """Token ids of one role's (source, target) pairs, without the empty and too-long ones (counted in the log).

    Too long: beyond ``max_source_length``/``max_target_length``, by default the model's positions, or
    ``max_tokens`` (the batch size) when that is smaller, since such a pair fits in no batch.
    """
    limits = []
    for name, given in (("max_source_length", max_source_length), ("max_target_length", max_target_length)):
        if given is not None and given > config.max_position_embeddings:
            raise ValueError(f"--{name} {given} is more than the model's {config.max_position_embeddings} positions "
                             f"(max_position_embeddings); give at most {config.max_position_embeddings}.")
        limits.append(given or min(config.max_position_embeddings, max_tokens or config.max_position_embeddings))
    ids = data.tokenize_dataset(dataset, tokenizer, num_proc, desc=f"tokenizing {role}")
    kept, _ = data.drop_unusable(ids, *limits, role)
    return kept


# ---------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------


def build_tokenizer(model_args: ModelArguments, training_args, train_text, seed: int, checkpoint: Path | None = None,
                    cache_dir: str | None = None):
    """`prepare_tokenizer` with the model and training flags."""
    return prepare_tokenizer(
        train_text, name_or_path=model_args.tokenizer_name_or_path or model_args.model_name_or_path,
        flag="--tokenizer_name_or_path" if model_args.tokenizer_name_or_path else "--model_name_or_path",
        checkpoint=checkpoint, output_dir=training_args.output_dir, vocab_size=model_args.tokenizer_vocab_size,
        min_frequency=model_args.tokenizer_min_frequency, train_pairs=model_args.tokenizer_train_pairs, seed=seed,
        cache_dir=cache_dir, main_process_first=training_args.main_process_first,
        process_index=training_args.process_index)


def prepare_tokenizer(train_text=None, *, name_or_path: str | None = None, flag: str = "--tokenizer_name_or_path",
                      checkpoint: Path | None = None, output_dir: str | Path | None = None, vocab_size: int = 37000,
                      min_frequency: int = 2, train_pairs: int = 1_000_000, seed: int = 42,
                      cache_dir: str | None = None, main_process_first=None, process_index: int = 0):
    """Load the tokenizer ``name_or_path`` (``flag`` names it in errors); when resuming, the checkpoint's (or
    ``output_dir/tokenizer``'s); otherwise train a joint BPE (§5.1) on a sample of ``train_text``, an Arrow
    dataset of (source, target), kept under ``cache_dir`` for the next run on the same data with the same
    settings and saved in ``output_dir/tokenizer``. Several processes: pass the Trainer arguments'
    ``main_process_first`` and ``process_index``, and the first process trains it while the others wait."""
    main_process_first = main_process_first or (lambda desc: contextlib.nullcontext())
    if name_or_path:
        check_has_tokenizer(name_or_path, flag, "Give --tokenizer_name_or_path with the tokenizer it was trained with.")
        return AutoTokenizer.from_pretrained(name_or_path)
    tokenizer_dir = None if output_dir is None else Path(output_dir) / "tokenizer"
    if checkpoint is not None:  # never a new tokenizer for a model trained with another
        saved = checkpoint if has_tokenizer(checkpoint) or tokenizer_dir is None else tokenizer_dir
        if not has_tokenizer(saved):
            raise FileNotFoundError(f"Resuming from {checkpoint}: neither it nor {tokenizer_dir} holds the tokenizer "
                                    "the run was trained with; give it with --tokenizer_name_or_path.")
        logger.info(f"resuming: using the tokenizer trained before, {saved}")
        return AutoTokenizer.from_pretrained(saved)
    if train_text is None:
        raise ValueError("No tokenizer to load and no training data to train one on: give --tokenizer_name_or_path "
                         "or --model_name_or_path.")
    settings = {"vocab_size": vocab_size, "min_frequency": min_frequency, "pairs": train_pairs, "seed": seed}
    cached = data.tokenizer_cache_dir(train_text, settings, cache_dir)
    with main_process_first(desc="training the tokenizer"):  # once; the other processes load it
        if usable_tokenizer_cache(cached):  # a damaged one is deleted (with a warning) and trained again
            logger.info(f"using the tokenizer trained before on the same data with the same settings, {cached}")
            tokenizer = AutoTokenizer.from_pretrained(cached)
        elif process_index == 0:
            logger.info(f"training a joint BPE tokenizer on {min(train_pairs, len(train_text))} of {len(train_text)} "
                        "training pairs (--tokenizer_train_pairs)")
            tokenizer = train_tokenizer(data.tokenizer_training_texts(train_text, train_pairs, seed),
                                        vocab_size=vocab_size, min_frequency=min_frequency)
            logger.info(f"trained a joint BPE tokenizer of {len(tokenizer)} tokens")
            partial = cached.with_name(cached.name + ".partial")
            tokenizer.save_pretrained(partial)
            partial.replace(cached)  # complete or absent, never half-written
        else:
            tokenizer = AutoTokenizer.from_pretrained(cached)
    if process_index == 0 and tokenizer_dir is not None:
        tokenizer.save_pretrained(tokenizer_dir)
    return tokenizer


def build_model(model_args: ModelArguments, tokenizer, resume: Path | None = None
                ) -> VanillaTransformerForConditionalGeneration:
    """`prepare_model` with the model flags."""
    if model_args.model_name_or_path:
        _refuse_overrides_of_a_checkpoint(model_args)
    return prepare_model(tokenizer, checkpoint=model_args.model_name_or_path, preset=model_args.preset,
                         config_overrides=model_args.config_overrides,
                         attn_implementation=model_args.attn_implementation, length_penalty=model_args.length_penalty,
                         length_penalty_formula=model_args.length_penalty_formula, resume=resume)


def prepare_model(tokenizer, *, checkpoint: str | None = None, preset: str = "base",
                  config_overrides: str | dict | None = None, attn_implementation: str | None = None,
                  length_penalty: float | None = None, length_penalty_formula: str | None = None,
                  resume: Path | None = None) -> VanillaTransformerForConditionalGeneration:
    """A new model from ``preset`` (and ``config_overrides``) sized to the tokenizer, or ``checkpoint`` to
    fine-tune; resuming (``resume``, a checkpoint folder), the generation config that run saved; the length
    penalty and its formula, where given, set in it (saved with the model)."""
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if checkpoint:
        model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint, **extra)
        check_tokenizer_matches_model(tokenizer, model.config)
    else:
        config = model_config(preset, config_overrides, tokenizer)
        check_tokenizer_matches_model(tokenizer, config)
        model = VanillaTransformerForConditionalGeneration._from_config(config, **extra)
    if resume is not None and (resume / "generation_config.json").is_file():  # the Trainer restores weights only
        model.generation_config = GenerationConfig.from_pretrained(resume)
    set_decoding(model, length_penalty, length_penalty_formula)
    return model


def set_decoding(model, length_penalty: float | None = None, length_penalty_formula: str | None = None) -> None:
    """The length penalty (alpha, §6.1) and its formula, where given, into the model's generation config."""
    if length_penalty is not None:
        model.generation_config.length_penalty = length_penalty
    if length_penalty_formula is not None:
        setattr(model.generation_config, LENGTH_PENALTY_FORMULA, length_penalty_formula)


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
    # again: --generation_config replaced the model's in the Trainer
    set_decoding(trainer.model, model_args.length_penalty, model_args.length_penalty_formula)
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


def main(argv: list[str] | None = None, prog: str = "vanilla-transformer train", exit_on_bad_input: bool = False
         ) -> dict:
    """``vanilla-transformer train``: train (or fine-tune), evaluate and predict as the flags say; the metrics.

    Every check runs before training starts; its error is raised, or with ``exit_on_bad_input`` (the
    command line) printed as one line naming the flag, exiting with status 2. Under several
    processes it ends by closing the process group, as a script's last line should: a process that
    exits with gloo's threads still running is aborted at shutdown ("terminate called without an
    active exception", exit code -6) after a run that succeeded. Call the steps yourself
    (`build_trainer`, `run_steps`) to keep the group open."""
    try:
        try:
            model_args, data_args, training_args = parse_arguments(argv, prog)
            logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
            run = build_trainer(model_args, data_args, training_args)
        except (ValueError, OSError) as error:
            if not exit_on_bad_input:
                raise
            exit_with_usage_error(prog, error)
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


if __name__ == "__main__":
    from vanilla_transformer.cli import run_command

    run_command("train", sys.argv[1:])
