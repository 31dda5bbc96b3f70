"""A training run with the paper's recipe, from flags to a Hub folder: what ``vanilla-transformer train`` runs.

`main` reads as transformers' ``run_translation.py`` does, top to bottom: parse the flags (`options`),
check them, read the data (`data.load_text_datasets`), load or train the tokenizer (`prepare_tokenizer`),
build or load the model (`prepare_model`), tokenise (`data.tokenize_pairs`), make the trainer (all of
that is `build_trainer`, for a script that wants a ready trainer), then train, evaluate, predict and
save. Each step is a function with plain parameters, usable from a script of your own. The flags
follow ``run_translation.py`` where they mean the same (``--source_lang``, ``--train_file``,
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
import os
import shutil
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from accelerate import PartialState
from packaging.version import Version
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    GenerationConfig,
    Seq2SeqTrainer,
    TrainerCallback,
    TrainerState,
    set_seed,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .. import VanillaTransformerForConditionalGeneration, check_tokenizer_matches_model, train_tokenizer
from ..checkpoint_files import (
    check_has_tokenizer,
    check_model_folder,
    from_pretrained_named,
    has_tokenizer,
    same_tokenizer_json,
    tokenizer_definition,
    warn_if_an_average_is_beside,
    written_tokenizer,
)
from ..command_line import exit_with_usage_error
from ..generation_vanilla_transformer import LENGTH_PENALTY_FORMULA, MAX_NEW_TOKENS_BEYOND_INPUT
from ..private_api import require
from .arguments import pads_to_buckets, refuse_data_parallel, refuse_processes_left_alone, schedule_name
from .averaging import MEAN_NAMES, architecture, average_checkpoints
from .averaging import named as named_checkpoint
from .caches import usable_tokenizer_cache
from .checkpointing import (
    RESUME_HINT,
    TRAINER_STATE_NAME,
    TrainingInterrupted,
    ctrl_c_stops_the_run,
    forget_continuation,
    ignore_further_sigterms,
    of_another_folder,
    record_continuation,
    resolve_checkpoint,
    run_checkpoints,
    sigterm_ends_the_run,
    stop_with_parent,
    stopped_by_ctrl_c,
)
from .data import (
    ROLES,
    TOKENIZER_SAMPLE_VERSION,
    load_text_datasets,
    numbered_lines,
    pairs_format,
    tokenize_pairs,
    tokenizer_cache_dir,
    tokenizer_training_texts,
)
from .divergence import TrainingDiverged
from .memory_check import MemoryCheckError
from .metrics import TranslationMetrics, score
from .moving_average import check_checkpoint as check_moving_average
from .options import (  # noqa: F401 (imported from here)
    FINE_TUNING_LEARNING_RATE,
    build_parser,
    check_arguments,
    check_output_dir,
    check_steps_have_data,
    check_training_arguments,
    flags_from,
    model_config,
    parse_arguments,
    parse_overrides,
    refuse_overrides_of_a_checkpoint,
    steps_to_run,
)
from .run_lock import hold_output_dir
from .trainer import TooFewBatches, TransformerTrainer, noam_learning_rate
from .translation import STATIC_CACHE_MULTIPLE, as_lines, inputs_too_long, translate, where_too_long

# A new model with a chosen attention implementation is made through this (private: checked at import)
require("transformers.PreTrainedModel._from_config")

logger = logging.getLogger("vanilla_transformer.train")

PREDICTIONS_FILE = "generated_predictions.txt"  # run_translation.py's name
# From this release the Trainer's train_loss and train_*_per_second of a resumed run are those of the updates
# trained since the resume; before it, train_loss divided their loss by the whole run's updates.
TRAIN_METRICS_OF_THE_RESUMED_UPDATES = Version("5.20.0")


def main(
    argv: list[str] | None = None, prog: str = "vanilla-transformer train", exit_on_bad_input: bool = False
) -> dict:
    """``vanilla-transformer train``: train (or fine-tune), evaluate and predict as the flags say; the metrics.

    Every check runs before training starts; its error is raised, or with ``exit_on_bad_input`` (the
    command line) printed as one line naming the flag, exiting with status 2. Under several
    processes it ends by closing the process group, as a script's last line should: a process that
    exits with gloo's threads still running is aborted at shutdown ("terminate called without an
    active exception", exit code -6) after a run that succeeded."""
    lock, stage = None, Stage()

    def last_words() -> None:  # a SIGTERM outside training, before the process ends as by default
        if lock is not None:  # first: a line written from a signal handler can fail (`SignalSafeLog`)
            lock.release()
        logger.warning(f"stopped by SIGTERM {stage.said()}")

    with sigterm_ends_the_run(last_words), ctrl_c_stops_the_run():
        stop_with_parent()  # a table3 row's process: stops with the command that started it
        try:
            try:
                model_args, data_args, training_args = parse_arguments(argv, prog)
                logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
                refuse_processes_left_alone(training_args)  # before the lock that its siblings would fight for
                lock = hold_output_dir(training_args)  # one run per --output_dir, before any data is read
                if model_args.tokenizer_only:
                    save_tokenizer_only(model_args, data_args, training_args)
                    return {}
                run = build_trainer(model_args, data_args, training_args)  # data, tokenizer, model, trainer
            except (ValueError, OSError) as error:
                if not exit_on_bad_input or stopped_by_ctrl_c(error):
                    raise
                exit_with_usage_error(prog, error)
            try:
                return _train_evaluate_predict(
                    run, model_args, data_args, training_args, stage, prog, exit_on_bad_input
                )
            except TrainingDiverged as error:  # the command line: its message, not a traceback (status 1)
                if not exit_on_bad_input:
                    raise
                print(f"{prog}: error: {error}", file=sys.stderr)
                raise SystemExit(1) from None
        except BaseException as error:  # TrainingInterrupted (a KeyboardInterrupt) is answered where it is raised
            if not stopped_by_ctrl_c(error):
                raise
            logger.warning(f"stopped by Ctrl-C {stage.said()}")
            raise SystemExit(128 + signal.SIGINT) from None
        finally:
            if lock is not None:
                lock.release()
            close_process_group()


@dataclass
class Stage:
    """Where `main` is, for the line that a Ctrl-C or a SIGTERM outside training ends the run with."""

    doing: str = "before training started"
    output_dir: str | None = None  # set once training has ended
    final_checkpoint: Path | None = None  # of the last update, where saved: a run resumed from it trains no more

    def said(self) -> str:
        if self.doing == "as the run ended":
            return f"{self.doing}, after all its steps: nothing is lost"
        if self.output_dir is None:
            if self.doing == "during training":  # a second Ctrl-C, or a signal before or after the training loop
                return (
                    f"during training, without saving a checkpoint: {RESUME_HINT} continues from the last one saved "
                    "(where there is none, run the command again)"
                )
            return f"{self.doing}: nothing was saved; run the command again"
        again = (
            f"; the same command with {RESUME_HINT} takes {self.final_checkpoint} and trains no more"
            if self.final_checkpoint is not None
            else ""
        )
        if self.doing == "while saving the final model":
            return f"after training, while saving the final model: {self.output_dir} may be incomplete{again}"
        return (
            f"after training, {self.doing}: the model is saved in {self.output_dir} (evaluate it, or translate the "
            f"test set, with --model_name_or_path {self.output_dir} --do_eval or --do_predict){again}"
        )


def _train_evaluate_predict(
    run, model_args, data_args, training_args, stage: Stage, prog: str, exit_on_bad_input: bool
) -> dict:
    """`main` from a built trainer: train, save, evaluate, predict, as the --do_* flags say; the metrics."""
    trainer, tokenizer = run.trainer, run.tokenizer
    do_train, do_eval, do_predict = steps_to_run(training_args, data_args)
    log_the_run(trainer, run.datasets["train"])
    metrics: dict = {}
    if do_train:
        stage.doing = "during training"
        resumed_at = updates_in(run.resume) if run.resume is not None else None  # (a signal's checkpoint goes)
        try:
            result = trainer.train(resume_from_checkpoint=str(run.resume) if run.resume else None)
        except TrainingInterrupted as interrupted:  # Ctrl-C or SIGTERM, after saving a checkpoint
            ignore_further_sigterms()  # stopping: see `StopOnSignal`'s second SIGTERM
            logger.warning(str(interrupted))
            raise SystemExit(128 + interrupted.signal_number) from None
        except (MemoryCheckError, TooFewBatches) as error:  # found before the first update
            if not exit_on_bad_input:
                raise
            exit_with_usage_error(prog, error)
        stage.doing, stage.output_dir = "while saving the final model", training_args.output_dir
        final = Path(training_args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
        stage.final_checkpoint = final if final.is_dir() else None
        metrics.update(result.metrics)
        if (
            resumed_at is not None
            and resumed_at < trainer.state.global_step
            and trainer.is_world_process_zero()
            and (Version(transformers.__version__) >= TRAIN_METRICS_OF_THE_RESUMED_UPDATES)
        ):
            logger.info(  # (a finished run requeued trains none and keeps the train_* metrics it found)
                f"train_loss, train_runtime and train_*_per_second cover updates {resumed_at + 1}-"
                f"{trainer.state.global_step}, trained since resuming from {run.resume}; the whole run's logged "
                "losses are in trainer_state.json"
            )
        trainer.save_state()  # trainer_state.json: the logged loss curve, next to the model
        save_final_model(trainer, tokenizer, training_args.average_checkpoints, training_args.average_weights)
    if do_eval:
        stage.doing = "while evaluating"
        evaluation = (do_train and evaluated_at_the_end(trainer, training_args)) or trainer.evaluate(
            metric_key_prefix="eval"
        )
        evaluation["eval_perplexity"] = math.exp(min(evaluation["eval_loss"], 50.0))
        metrics.update(evaluation)
    if do_predict:
        stage.doing = "while translating the test set"
        metrics.update(
            predict(
                trainer,
                tokenizer,
                run.text["test"],
                data_args.sacrebleu_tokenize,
                data_args.target_lang if data_args.compound_split_bleu else None,
            )
        )
    stage.doing = "while writing the metrics and the model card"
    trainer.save_metrics("all", metrics if do_train else with_earlier_results(trainer, metrics))
    if do_train and trainer.is_world_process_zero():
        write_card(Path(training_args.output_dir), trainer, model_args, data_args, metrics)
        logger.info(f"saved the model, tokenizer and generation config to {training_args.output_dir}")
    if do_train and training_args.push_to_hub:  # the folder as saved, its card included
        stage.doing = "while pushing the model to the Hub"
        push_final_model(trainer, Path(training_args.output_dir))
    if trainer.is_world_process_zero():
        logger.info(
            "metrics: " + json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()})
        )
    trainer.accelerator.wait_for_everyone()  # leave together: no process exits mid-collective
    stage.doing = "as the run ended"
    return metrics


def evaluated_at_the_end(trainer, training_args) -> dict | None:
    """The evaluation during training at the last update (--eval_strategy steps or epoch), where the final model
    is the weights it evaluated: no averaging of checkpoints, no moving average, no best checkpoint loaded.
    Evaluating again would decode the whole validation set for the same scores."""
    if training_args.average_checkpoints or training_args.ema_decay or training_args.load_best_model_at_end:
        return None
    last = next((entry for entry in reversed(trainer.state.log_history) if "eval_loss" in entry), None)
    if last is None or last.get("step") != trainer.state.global_step:
        return None
    logger.info(f"the final model is the one evaluated at update {trainer.state.global_step}: its scores are those")
    return {name: value for name, value in last.items() if name != "step"}


ALL_RESULTS = "all_results.json"  # the Trainer's save_metrics("all")


def with_earlier_results(trainer, metrics: dict) -> dict:
    """The metrics of a run that did not train, added to those its --output_dir's all_results.json holds (the
    training's, an earlier evaluation's): the Trainer's save_metrics("all") would replace them."""
    path = Path(trainer.args.output_dir) / ALL_RESULTS
    if not trainer.is_world_process_zero() or not path.is_file():
        return metrics
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        logger.warning(f"{path} is not readable JSON ({error}): replaced by this run's metrics")
        return metrics
    return {**earlier, **metrics} if isinstance(earlier, dict) else metrics


def updates_in(checkpoint: Path) -> int:
    """The updates a checkpoint was saved after (its trainer state's global_step)."""
    return TrainerState.load_from_json(str(Path(checkpoint) / TRAINER_STATE_NAME)).global_step


def build_trainer(model_args, data_args, training_args) -> Run:
    """`main` up to a ready trainer, for a script of yours. Flags, the checkpoint to resume from and any model
    or tokenizer to load are checked before the data is read. In several processes, the first one reads and
    tokenises the data (and trains the tokenizer) while the others wait, then they memory-map its cache."""
    check_arguments(model_args, data_args, training_args)
    refuse_data_parallel(training_args)  # not in check_arguments: table3 --devices checks its rows in a parent
    refuse_processes_left_alone(training_args)
    set_seed(training_args.seed)
    do_train, do_eval, do_predict = steps_to_run(training_args, data_args)
    from_recipe = flags_from(training_args, "recipe") or frozenset()
    if not do_train and asks_to_resume(value := training_args.resume_from_checkpoint):
        folder = "CHECKPOINT" if str(value).lower() in {"last", "true"} else value
        raise ValueError(
            f"--resume_from_checkpoint {value} continues training, but this run does not train: to evaluate or "
            f"translate with a checkpoint, give it as --model_name_or_path {folder}; or add --do_train to train on."
        )
    check_steps_have_data(
        model_args, data_args, do_train, do_eval, do_predict, training_args.eval_strategy, from_recipe
    )
    resume = resolve_resume(training_args.resume_from_checkpoint, training_args.output_dir) if do_train else None
    if resume is not None:
        check_moving_average(resume, training_args.ema_decay)  # before the data is read
        compare_with_checkpoint(resume, training_args)
    if do_train:
        check_output_dir(training_args, resuming=resume or False)
    if model_args.model_name_or_path:
        check_model_folder(model_args.model_name_or_path, f"--model_name_or_path {model_args.model_name_or_path}")

    tokenizer_source = dict(
        name_or_path=model_args.tokenizer_name_or_path or model_args.model_name_or_path,
        flag="--tokenizer_name_or_path" if model_args.tokenizer_name_or_path else "--model_name_or_path",
        checkpoint=resume,
        output_dir=training_args.output_dir,
        **new_tokenizer_settings(model_args, data_args, training_args),
        main_process_first=training_args.main_process_first,
        process_index=training_args.process_index,
    )

    def model_for(tokenizer):
        model = prepare_model(
            tokenizer,
            checkpoint=model_args.model_name_or_path,
            preset=model_args.preset,
            config_overrides=model_args.config_overrides,
            attn_implementation=model_args.attn_implementation,
            resume=resume,
        )
        if resume is not None:
            given = tokenizer_source["name_or_path"]
            check_resume_matches(resume, model, tokenizer, f"{tokenizer_source['flag']} {given}" if given else None)
        elif model_args.model_name_or_path and model_args.tokenizer_name_or_path:  # a fine-tune, another tokenizer
            refuse_another_tokenizer(
                model_args.model_name_or_path,
                tokenizer,
                f"--tokenizer_name_or_path {model_args.tokenizer_name_or_path} holds another tokenizer than "
                f"--model_name_or_path {model_args.model_name_or_path} was trained with (each token id would be read "
                "as another token); leave --tokenizer_name_or_path out to fine-tune with the model's own.",
            )
        return model

    # a tokenizer to load (always so when resuming) and its model are loaded and checked before the data is read
    loads_tokenizer = tokenizer_source["name_or_path"] or resume
    if not loads_tokenizer:
        refuse_tokenizer_training_on_several_machines(training_args.world_size)
    tokenizer = prepare_tokenizer(**tokenizer_source) if loads_tokenizer else None
    model = model_for(tokenizer) if tokenizer is not None else None
    if do_predict or (do_eval and training_args.predict_with_generate):  # (a new model's: the preset's, one)
        check_one_translation_each(training_args.generation_config, model, model_args.model_name_or_path, resume)
    continues_elsewhere = of_another_folder(resume, training_args.output_dir)
    if continues_elsewhere and training_args.process_index == 0:  # a run continued in a new folder: its tokenizer too
        if not has_tokenizer(tokenizer_dir := Path(training_args.output_dir) / "tokenizer"):
            tokenizer.save_pretrained(tokenizer_dir)
    if continues_elsewhere and training_args.should_save:  # `last` there resumes from it until a save (a crash)
        record_continuation(training_args.output_dir, resume)
    with training_args.main_process_first(desc="reading the data"):  # the training pairs only where needed
        text = load_text_datasets(data_args, train=do_train or tokenizer is None)
    if tokenizer is None:  # trained on the data, then the model sized to it
        tokenizer = prepare_tokenizer(text["train"], **tokenizer_source)
        model = model_for(tokenizer)
    tokenizer.model_max_length = model.config.max_position_embeddings  # so that truncation=True means something
    if do_predict and text["test"] is not None:
        check_test_sources_fit(text["test"], tokenizer, model, data_args)

    wanted = {"train": do_train, "validation": do_eval, "test": False}  # the test set is translated from its text
    with training_args.main_process_first(desc="tokenizing"):
        datasets = {
            role: tokenize_pairs(
                text[role],
                tokenizer,
                model.config,
                role,
                max_source_length=data_args.max_source_length,
                max_target_length=data_args.max_target_length,
                max_tokens=training_args.max_tokens if role == "train" else None,  # eval: sentences
                num_proc=data_args.preprocessing_num_workers,
            )
            if wanted[role] and text[role] is not None
            else None
            for role in ROLES
        }

    trainer = TransformerTrainer(
        model=model,
        args=training_args,
        train_dataset=datasets["train"],
        eval_dataset=datasets["validation"],
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        compute_metrics=(
            TranslationMetrics(tokenizer, text["validation"]["target"], tokenize=data_args.sacrebleu_tokenize)
            if datasets["validation"] is not None and training_args.predict_with_generate
            else None
        ),
        callbacks=[SaveLastStep()] if training_args.average_checkpoints else None,
    )
    # after the Trainer, which replaces the model's generation config with --generation_config's
    set_decoding(trainer.model, model_args.length_penalty, model_args.length_penalty_formula)
    if training_args.generation_config is not None:
        keep_the_files_length(trainer.model.generation_config)
    return Run(trainer, tokenizer, datasets, text, resume)


def warmup_words(warmup_steps: float) -> str:
    """--warmup_steps as words: a number of updates, or (below 1) a share of the updates the run plans."""
    return (
        f"{warmup_steps:g} warm-up updates" if warmup_steps >= 1 else f"a warm-up of {warmup_steps:.0%} of the updates"
    )


def log_the_run(trainer, train_dataset) -> None:
    """Who runs what: the process, the model's size; where it trains, the learning-rate schedule and the pairs."""
    args, model = trainer.args, trainer.accelerator.unwrap_model(trainer.model)
    logger.info(f"process {args.process_index} of {args.world_size}")
    if train_dataset is None:  # an evaluation or a prediction alone follows no schedule
        logger.info(f"model: {model.num_parameters():,} parameters; no training")
        return
    logger.info(
        f"model: {model.num_parameters():,} parameters; schedule: {schedule_name(args)}, peak learning rate "
        f"{args.learning_rate:.3g} after {warmup_words(args.warmup_steps)}; {len(train_dataset)} training pairs"
    )
    if getattr(args, "bf16_weights", False):
        logger.info("--bf16_weights: the weights in bfloat16 without autocast, float32 copies in the optimizer")


# ---------------------------------------------------------------------------------------------
# The steps, with plain parameters
# ---------------------------------------------------------------------------------------------


def new_tokenizer_settings(model_args, data_args, training_args) -> dict:
    """`prepare_tokenizer`'s arguments for a tokenizer trained on the data, from a run's flags: its size, the
    sample it is trained on and where it is kept (one mapping for `build_trainer`, --tokenizer_only, table3)."""
    return {
        "vocab_size": model_args.tokenizer_vocab_size,
        "min_frequency": model_args.tokenizer_min_frequency,
        "train_pairs": model_args.tokenizer_train_pairs,
        "seed": training_args.seed,
        "cache_dir": data_args.cache_dir,
    }


def prepare_tokenizer(
    train_text=None,
    *,
    name_or_path: str | None = None,
    flag: str = "--tokenizer_name_or_path",
    checkpoint: Path | None = None,
    output_dir: str | Path | None = None,
    vocab_size: int = 37000,
    min_frequency: int = 2,
    train_pairs: int = 1_000_000,
    seed: int = 42,
    cache_dir: str | None = None,
    main_process_first=None,
    process_index: int = 0,
):
    """Load the tokenizer ``name_or_path`` (``flag`` names it in errors); when resuming, the checkpoint's (or
    ``output_dir/tokenizer``'s); otherwise train a joint BPE (§5.1) on a sample of ``train_text``, an Arrow
    dataset of (source, target), kept under ``cache_dir`` for the next run on the same data with the same
    settings and saved in ``output_dir/tokenizer``. Several processes: pass the Trainer arguments'
    ``main_process_first`` and ``process_index``, and the first process trains it while the others wait."""
    main_process_first = main_process_first or (lambda desc: contextlib.nullcontext())
    if name_or_path:
        check_has_tokenizer(name_or_path, flag, "Give --tokenizer_name_or_path with the tokenizer it was trained with.")
        return from_pretrained_named(AutoTokenizer.from_pretrained, name_or_path, f"{flag} {name_or_path}")
    tokenizer_dir = None if output_dir is None else Path(output_dir) / "tokenizer"
    if checkpoint is not None:  # never a new tokenizer for a model trained with another
        # the checkpoint's own, its run folder's (a run continued in a new folder), or this folder's
        checkpoint = Path(checkpoint)
        places = [checkpoint, checkpoint.parent / "tokenizer", checkpoint.resolve().parent / "tokenizer", tokenizer_dir]
        places = [place for place in dict.fromkeys(places) if place is not None]
        saved = next((place for place in places if has_tokenizer(place)), None)
        if saved is None:
            raise FileNotFoundError(
                f"Resuming from {checkpoint}: none of {', '.join(map(str, places))} holds the tokenizer "
                "the run was trained with; give it with --tokenizer_name_or_path."
            )
        logger.info(f"resuming: using the tokenizer trained before, {saved}")
        return AutoTokenizer.from_pretrained(saved)
    if train_text is None:
        raise ValueError(
            "No tokenizer to load and no training data to train one on: give --tokenizer_name_or_path "
            "or --model_name_or_path."
        )
    settings = {"vocab_size": vocab_size, "min_frequency": min_frequency, "pairs": train_pairs, "seed": seed}
    settings["sample"] = TOKENIZER_SAMPLE_VERSION  # a tokenizer trained on another sample of the data is not reused
    cached = tokenizer_cache_dir(train_text, settings, cache_dir)
    with main_process_first(desc="training the tokenizer"):  # once; the other processes load it
        if usable_tokenizer_cache(cached):  # a damaged one is deleted (with a warning) and trained again
            logger.info(f"using the tokenizer trained before on the same data with the same settings, {cached}")
            tokenizer = AutoTokenizer.from_pretrained(cached)
        elif process_index == 0:
            logger.info(
                f"training a joint BPE tokenizer on {min(train_pairs, len(train_text))} of {len(train_text)} "
                "training pairs (--tokenizer_train_pairs)"
            )
            tokenizer = train_tokenizer(
                tokenizer_training_texts(train_text, train_pairs, seed),
                vocab_size=vocab_size,
                min_frequency=min_frequency,
            )
            logger.info(f"trained a joint BPE tokenizer of {len(tokenizer)} tokens")
            # complete or absent, never half-written; a folder of this process's own: runs started together on
            # the same data (a sweep) train the same tokenizer at once, and the first to finish puts it in place
            partial = cached.with_name(f"{cached.name}.{socket.gethostname()}-{os.getpid()}.partial")
            tokenizer.save_pretrained(partial)
            try:
                partial.replace(cached)
            except OSError:
                shutil.rmtree(partial, ignore_errors=True)
                if not usable_tokenizer_cache(cached):
                    raise
                logger.info(f"another run cached the same tokenizer first, {cached}: this run's copy is not kept")
        else:
            tokenizer = AutoTokenizer.from_pretrained(cached)
    if process_index == 0 and tokenizer_dir is not None:
        tokenizer.save_pretrained(tokenizer_dir)
    return tokenizer


def prepare_model(
    tokenizer,
    *,
    checkpoint: str | None = None,
    preset: str = "base",
    config_overrides: str | dict | None = None,
    attn_implementation: str | None = None,
    resume: Path | None = None,
) -> VanillaTransformerForConditionalGeneration:
    """A new model from ``preset`` (and ``config_overrides``) sized to the tokenizer, or ``checkpoint`` to
    fine-tune; resuming (``resume``, a checkpoint folder), with the generation config that run saved. Its
    decoding settings (length penalty) are `set_decoding`'s, once the trainer is made."""
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if checkpoint:
        refuse_overrides_of_a_checkpoint(config_overrides)
        # float32 whatever it was saved in (a --bf16_weights run saves bfloat16, which transformers would keep):
        # autocast and --bf16_weights start from float32 weights
        model = from_pretrained_named(
            AutoModelForSeq2SeqLM.from_pretrained,
            checkpoint,
            f"--model_name_or_path {checkpoint}",
            dtype=torch.float32,
            **extra,
        )
        check_tokenizer_matches_model(
            tokenizer,
            model.config,
            fix=f"Give the tokenizer {checkpoint} was trained with (--tokenizer_name_or_path), or leave "
            "--tokenizer_name_or_path out where the checkpoint holds it.",
        )
        warn_if_an_average_is_beside(checkpoint, "--model_name_or_path")
    else:
        config = model_config(preset, config_overrides, tokenizer)
        check_tokenizer_matches_model(
            tokenizer,
            config,
            fix="A new model takes its size and special ids from the tokenizer: leave vocab_size and the *_token_id "
            "fields out of --config_overrides.",
        )
        model = VanillaTransformerForConditionalGeneration._from_config(config, **extra)
    if resume is not None and (resume / "generation_config.json").is_file():  # the Trainer restores weights only
        model.generation_config = GenerationConfig.from_pretrained(resume)
    return model


def set_decoding(model, length_penalty: float | None = None, length_penalty_formula: str | None = None) -> None:
    """The length penalty (alpha, §6.1) and its formula, where given, into the model's generation config (saved
    with the model, read by evaluation, prediction and generate() later). After making a `Seq2SeqTrainer`, whose
    ``generation_config`` argument replaces the model's."""
    if length_penalty is not None:
        model.generation_config.length_penalty = length_penalty
    if length_penalty_formula is not None:
        setattr(model.generation_config, LENGTH_PENALTY_FORMULA, length_penalty_formula)


def check_test_sources_fit(test, tokenizer, model, data_args) -> None:
    """--do_predict translates every test source: one longer than the model accepts is refused before training
    (naming its file and line), not after it. The test set is scored whole, so none is dropped or cut."""
    sources = list(test["source"])
    limit, lengths, too_long = inputs_too_long(model, tokenizer, sources)
    if not too_long:
        return
    line_numbers = None
    if data_args.test_source_file or data_args.test_file:
        flag = "--test_source_file" if data_args.test_source_file else "--test_file"
        lines_of = f"{flag} {data_args.test_source_file or data_args.test_file}"
        if data_args.test_file and pairs_format(data_args.test_file) == ".jsonl":  # its blank lines hold no pair
            line_numbers = [n for n, text in numbered_lines(data_args.test_file, flag) if text.strip()]
    else:
        lines_of = None
    where = where_too_long(too_long, lengths, lines_of, line_numbers)
    name = "" if lines_of else f" (--dataset_name {data_args.dataset_name}, split {data_args.test_split})"
    raise ValueError(
        f"--do_predict: {len(too_long)} test source(s) are longer than the {limit} tokens the model accepts{name}: "
        f"{where}. Shorten or remove them, or translate the file after training with `vanilla-transformer "
        "translate --skip-long` (or --truncate)."
    )


def check_one_translation_each(generation_config, model=None, checkpoint: str | None = None, resume=None) -> None:
    """Evaluation and --do_predict score one translation a sentence: a generation config that asks for several
    (num_return_sequences) failed once they ran, after training ("16 hypotheses but 8 references"). The one they
    decode with: ``generation_config`` (--generation_config, which replaces the model's), else the loaded
    ``model``'s (the checkpoint's, or when resuming (``resume``) its checkpoint's)."""
    if generation_config is not None:
        config, source = Seq2SeqTrainer.load_generation_config(generation_config), "--generation_config"
        source = f"{source} {generation_config}" if not isinstance(generation_config, GenerationConfig) else source
    elif model is not None:
        config = model.generation_config
        source = f"--resume_from_checkpoint {resume}" if resume is not None else f"--model_name_or_path {checkpoint}"
        source = f"the generation config of {source}"
    else:
        return
    if (config.num_return_sequences or 1) > 1:
        raise ValueError(
            f"{source} sets num_return_sequences {config.num_return_sequences}: evaluation and --do_predict score "
            "one translation a sentence; set it to 1 there (for several a sentence, call generate() on the model "
            "later)."
        )


def keep_the_files_length(generation_config) -> None:
    """A ``--generation_config`` file that sets ``max_length`` and says nothing of the paper's length rule (a
    file written by hand, or by another model's ``save_pretrained``) decodes to that length: generate() applies
    the rule (source + 50) only where ``max_new_tokens_beyond_input`` says so, or where no length is set."""
    if generation_config.max_length is not None and not hasattr(generation_config, MAX_NEW_TOKENS_BEYOND_INPUT):
        setattr(generation_config, MAX_NEW_TOKENS_BEYOND_INPUT, None)


def check_resume_matches(checkpoint: Path, model, tokenizer, tokenizer_flag: str | None = None) -> None:
    """Resuming continues one model with one tokenizer: flags that build another architecture, or another
    tokenizer, would load the checkpoint's weights into a model that reads them differently. ``tokenizer_flag``:
    the flag the tokenizer came from, with its value (``--model_name_or_path M``), where one did."""
    saved = architecture(AutoConfig.from_pretrained(checkpoint).to_dict())
    current = architecture(model.config.to_dict())
    if differing := sorted(key for key in saved.keys() | current.keys() if saved.get(key) != current.get(key)):
        details = ", ".join(f"{key}: {saved.get(key)!r} there, {current.get(key)!r} now" for key in differing)
        raise ValueError(
            f"--resume_from_checkpoint {checkpoint} holds another architecture than the flags build "
            f"({details}); resume with the flags the run started with."
        )
    if tokenizer_flag is None:
        given, fix = "the one found for it", f"give its own with --tokenizer_name_or_path {checkpoint}"
    elif tokenizer_flag.startswith("--tokenizer_name_or_path"):
        given, fix = f"{tokenizer_flag} gives", "leave --tokenizer_name_or_path out to use the checkpoint's"
    else:  # the checkpoint to fine-tune brings the tokenizer
        given = f"{tokenizer_flag} brings"
        fix = (
            "resume with the flags the run started with (the --model_name_or_path it fine-tuned, or none), or give "
            f"--tokenizer_name_or_path {checkpoint} to use the checkpoint's"
        )
    refuse_another_tokenizer(
        checkpoint,
        tokenizer,
        f"--resume_from_checkpoint {checkpoint} was trained with another tokenizer than {given}; {fix}.",
    )


def refuse_another_tokenizer(folder: str | Path, tokenizer, message: str) -> None:
    """ValueError(``message``) where the local ``folder`` holds a tokenizer (tokenizer.json) that is not
    ``tokenizer``: its model's weights read token ids as that one does (`same_tokenizer_json`). A Hub id, or a
    tokenizer without a tokenizers backend (SentencePiece), is not compared."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not Path(folder).is_dir():
        return
    saved = tokenizer_definition(folder).get("tokenizer.json")
    if saved is not None and not same_tokenizer_json(saved, written_tokenizer(backend)):
        raise ValueError(message)


def save_tokenizer_only(model_args, data_args, training_args) -> Path:
    """``--tokenizer_only``: the tokenizer `build_trainer` would train for these flags (the same sample of the
    same training pairs, the same cache), saved in ``<output_dir>/tokenizer``, and nothing else: trained once,
    by one process, for a run of several machines to load with --tokenizer_name_or_path."""
    loaded = model_args.tokenizer_name_or_path or model_args.model_name_or_path
    if loaded:
        flag = "--tokenizer_name_or_path" if model_args.tokenizer_name_or_path else "--model_name_or_path"
        raise ValueError(f"--tokenizer_only trains a tokenizer, and {flag} {loaded} gives one: leave one out.")
    if training_args.resume_from_checkpoint:
        raise ValueError(
            f"--tokenizer_only trains a new tokenizer; --resume_from_checkpoint {training_args.resume_from_checkpoint} "
            "continues a run with the tokenizer it was trained with (its checkpoint's, or <output_dir>/tokenizer): "
            "leave one out."
        )
    if training_args.world_size > 1:
        raise ValueError(
            f"--tokenizer_only runs as one process, not {training_args.world_size}: run it with "
            "`vanilla-transformer train`, without accelerate launch or torchrun."
        )
    check_arguments(model_args, data_args, training_args)
    _, do_eval, do_predict = steps_to_run(training_args, data_args)  # as the run the tokenizer is for checks them
    check_steps_have_data(
        model_args, data_args, True, do_eval, do_predict, from_recipe=flags_from(training_args, "recipe") or frozenset()
    )
    check_output_dir(training_args, resuming=False, tokenizer_only=True)
    text = load_text_datasets(data_args, train=True)
    tokenizer = prepare_tokenizer(
        text["train"],
        output_dir=training_args.output_dir,
        **new_tokenizer_settings(model_args, data_args, training_args),
    )
    folder = Path(training_args.output_dir) / "tokenizer"
    logger.info(
        f"saved a tokenizer of {len(tokenizer)} tokens to {folder}; give it to the run with --tokenizer_name_or_path "
        f"{folder}"
    )
    return folder


def refuse_tokenizer_training_on_several_machines(world_size: int) -> None:
    """The tokenizer is trained by the first process of each machine (`main_process_first` is per machine) and
    loaded by the others from a cache the first one of the whole run writes: on a second machine they would
    look for it before it exists, or train another. Refused before the data is read; the launcher's
    LOCAL_WORLD_SIZE (torchrun, accelerate) tells how many processes run on this machine."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if world_size > local:
        raise ValueError(
            f"This run has {world_size} processes on {world_size // max(local, 1)} machines and would train its "
            "tokenizer: train it once first, with the same command as one process (vanilla-transformer train ...) "
            "and --tokenizer_only true, which saves <output_dir>/tokenizer; then give --tokenizer_name_or_path "
            "<output_dir>/tokenizer here."
        )


# What decides the batches of an epoch and which of them a resumed run skips (`skip_first_batches`)
BATCHING = {
    "max_tokens": "--max_tokens",
    "per_device_train_batch_size": "--per_device_train_batch_size",
    "gradient_accumulation_steps": "--gradient_accumulation_steps",
    "world_size": "processes",
    "seed": "--seed",
}


# What a resumed run takes from its checkpoint whatever the flags say: the scheduler's state holds the peak
# learning rate (a new warm-up or schedule type would bend the curve around that old peak: neither schedule),
# the optimizer's state Adam's settings, and trainer_state.json how often the run logs, evaluates and saves.
SCHEDULE = ("learning_rate", "lr_scale", "warmup_steps", "lr_scheduler_type")
OPTIMIZER = ("adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay")
# The optimizer's flags, which its saved state decides: torch's load_state_dict takes the saved parameter groups
# (adamw_torch's fused=False into adamw_torch_fused's optimizer too), and another optimizer's state fails at the
# resumed run's first update (torch's KeyError: 'momentum', 'beta1', 'square_avg').
OPTIMIZER_CHOICE = ("optim", "optim_args", "optim_target_modules")
INTERVALS = {"logging_steps": "logging_strategy", "eval_steps": "eval_strategy", "save_steps": "save_strategy"}


def compare_with_checkpoint(checkpoint: Path, training_args) -> None:
    """The flags of a resumed run against those its checkpoint was trained with (its training_args.bin and
    trainer_state.json), before the data is read.

    Batching (`BATCHING`): a run resumed in the middle of an epoch skips the batches its checkpoint trained,
    counted in this run's batches: with other batching flags (or another number of processes) the rest of that
    epoch is cut anew, so some of its pairs are trained twice and others not at all. Legitimate (a job requeued
    on fewer GPUs), so said, not refused; the epochs after are whole.

    What the checkpoint's state decides (`SCHEDULE`, `OPTIMIZER`, `INTERVALS`): another value given on the
    command line is refused; one that came from elsewhere (a recipe, a default) is replaced by the checkpoint's,
    said in the log, so that the run's log and model card show the schedule it follows.
    """
    saved = saved_arguments(checkpoint)
    given = flags_from(training_args, "command line")
    if saved is not None:
        changed = [
            f"{label} {getattr(saved, name)} there, {getattr(training_args, name)} now"
            for name, label in BATCHING.items()
            if hasattr(saved, name) and getattr(saved, name) != getattr(training_args, name)
        ]
        if hasattr(saved, "pad_to_buckets") and pads_to_buckets(saved) != pads_to_buckets(training_args):
            changed.append(
                "batches padded to bucket shapes "
                + ("there, not now" if pads_to_buckets(saved) else "now, not there")
                + " (--pad_to_buckets, --torch_compile)"
            )
        if changed:
            logger.warning(
                f"resuming {checkpoint} with other batching ({'; '.join(changed)}): "
                "the rest of its epoch is batched anew, so some of its pairs are trained twice and others not at all "
                "(the epochs after it are whole)"
            )
        _keep_the_checkpoints_schedule(checkpoint, saved, training_args, given)
        _keep_the_checkpoints_optimizer(checkpoint, saved, training_args, given)
    state = json.loads((checkpoint / TRAINER_STATE_NAME).read_text(encoding="utf-8"))
    for name, strategy in INTERVALS.items():
        value, kept = getattr(training_args, name), state.get(name)
        if given is None or name not in given or _value(getattr(training_args, strategy)) != "steps":
            continue
        if value < 1:  # a share of the planned updates: as the checkpoint's run gave it, or not
            same = saved is None or _same(value, getattr(saved, name, value))
        else:
            same = kept is None or _same(value, kept)
        if not same:
            raise ValueError(
                f"--{name} {_value(value)}: resuming {checkpoint} keeps its {TRAINER_STATE_NAME}'s {name}, {kept} "
                f"(transformers takes the checkpoint's, whatever the flags say); leave --{name} out."
            )


def _keep_the_checkpoints_schedule(checkpoint: Path, saved, training_args, given: frozenset | None) -> None:
    """`compare_with_checkpoint` for the learning-rate schedule and Adam's settings (``saved``: the checkpoint's
    arguments, whose learning_rate is the peak its scheduler runs to)."""
    fine_tune = f"--model_name_or_path {checkpoint} and a new --output_dir"
    for name in SCHEDULE + OPTIMIZER:
        if given is None or name not in given or not hasattr(saved, name):
            continue
        value, kept = getattr(training_args, name), getattr(saved, name)
        if _same(value, kept):
            continue
        if name == "lr_scale" and training_args.learning_rate is None and saved.learning_rate is not None:
            # the saved peak is scaled already (a checkpoint of a resumed run says lr_scale 1): compare the peaks
            if _same(_formula_peak(checkpoint, training_args.warmup_steps, value), saved.learning_rate):
                continue
        if name in SCHEDULE:
            peak = f"peak learning rate {saved.learning_rate:.3g} after " if saved.learning_rate is not None else ""
            kept_how = (
                "whose peak its saved scheduler state keeps whatever the flags say"
                if name in ("learning_rate", "lr_scale")
                else f"whose peak its saved scheduler state keeps: another --{name} would bend it into neither run's"
            )
            raise ValueError(
                f"--{name} {_value(value)}: resuming {checkpoint} continues its learning-rate schedule "
                f"({schedule_name(saved)}, {peak}{warmup_words(saved.warmup_steps)}; --{name} {_value(kept)} "
                f"there), {kept_how}; leave --{name} out, or to change the schedule, fine-tune from the checkpoint: "
                f"{fine_tune}."
            )
        raise ValueError(
            f"--{name} {_value(value)}: resuming {checkpoint} restores Adam's settings with its optimizer state "
            f"(--{name} {_value(kept)} there), whatever the flags say; leave --{name} out, or to train with other "
            f"settings, fine-tune from the checkpoint: {fine_tune}."
        )
    now = {name: getattr(training_args, name) for name in SCHEDULE + OPTIMIZER}
    if now["learning_rate"] is None:  # eq. (3)'s peak, as the flags say
        now["learning_rate"] = _formula_peak(checkpoint, now["warmup_steps"], now["lr_scale"])
    replaced = [
        f"{name} {_value(getattr(saved, name))} (not {_value(now[name])})"
        for name in SCHEDULE + OPTIMIZER
        if hasattr(saved, name)
        and now[name] is not None
        and not _same(now[name], getattr(saved, name))
        and not (name == "lr_scale" and saved.learning_rate is not None)  # the saved peak is scaled already
    ]
    for name in SCHEDULE + OPTIMIZER:
        if hasattr(saved, name):
            setattr(training_args, name, getattr(saved, name))
    if getattr(saved, "learning_rate", None) is not None:  # the peak itself, scaled already
        training_args.lr_scale = 1.0
    if replaced:
        logger.warning(
            f"resuming {checkpoint} with the learning-rate schedule and Adam's settings it was trained with, which "
            f"its saved state keeps: {', '.join(replaced)}"
        )


def _keep_the_checkpoints_optimizer(checkpoint: Path, saved, training_args, given: frozenset | None) -> None:
    """`compare_with_checkpoint` for --optim (and its --optim_args, --optim_target_modules): the checkpoint's
    optimizer.pt is that optimizer's state, which another cannot read, and whose parameter groups (AdamW's fused
    or not) replace the new optimizer's. Refused when given otherwise on the command line; the checkpoint's taken
    otherwise (another transformers' default, a recipe's), said in the log. A DeepSpeed configuration names its
    own optimizer: not compared."""
    if getattr(training_args, "deepspeed", None) or not hasattr(saved, "optim"):
        return
    changed = [
        name for name in OPTIMIZER_CHOICE if not _same(getattr(training_args, name, None), getattr(saved, name, None))
    ]
    if not changed:
        return
    kept = ", ".join(f"--{name} {_value(getattr(saved, name, None))}" for name in changed)
    if given is not None and (named := [name for name in changed if name in given]):
        raise ValueError(
            f"--{named[0]} {_value(getattr(training_args, named[0]))}: resuming {checkpoint} restores its optimizer "
            f"with its saved state ({kept} there), whatever the flags say; leave --{named[0]} out, or to train with "
            f"another optimizer, fine-tune from the checkpoint: --model_name_or_path {checkpoint} and a new "
            "--output_dir."
        )
    now = ", ".join(f"{_value(getattr(training_args, name, None))}" for name in changed)
    for name in changed:
        setattr(training_args, name, getattr(saved, name, None))
    logger.warning(f"resuming {checkpoint} with the optimizer its state was saved by: {kept} (not {now})")


def _formula_peak(checkpoint: Path, warmup, lr_scale: float) -> float | None:
    """Eq. (3)'s peak for the checkpoint's model (its d_model) after ``warmup`` whole updates, times ``lr_scale``."""
    if not (warmup >= 1 and float(warmup).is_integer()):
        return None
    d_model = json.loads((checkpoint / "config.json").read_text(encoding="utf-8")).get("d_model")
    return d_model and noam_learning_rate(int(warmup), d_model, int(warmup), lr_scale)


def saved_arguments(checkpoint: Path):
    """The training arguments a checkpoint was saved with (its training_args.bin); None where there are none
    to read (another version's class, or no Trainer's file)."""
    path = checkpoint / "training_args.bin"
    if not path.is_file():
        return None
    try:
        return torch.load(path, weights_only=False)
    except Exception:
        return None


def _value(value):
    """A flag's value as given: the Trainer turns some into enums (lr_scheduler_type); numbers as %g."""
    value = getattr(value, "value", value)
    return f"{value:g}" if isinstance(value, float) else value


def _same(a, b) -> bool:
    a, b = getattr(a, "value", a), getattr(b, "value", b)
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def asks_to_resume(value) -> bool:
    """Whether --resume_from_checkpoint ``value`` asks to resume: not for no value, 'false' or 'none'."""
    return value is not None and str(value).lower() not in {"false", "none", ""}


def resolve_resume(value, output_dir: str | Path) -> Path | None:
    """--resume_from_checkpoint ``value``: a PATH (checked to be complete), or 'last' / 'true' for the newest
    complete checkpoint in ``output_dir`` (incomplete ones, e.g. of a run killed while saving, are skipped and
    logged); None for no value, 'false' or 'none'."""
    if not asks_to_resume(value):
        return None
    checkpoint = True if str(value).lower() in {"last", "true"} else value
    return resolve_checkpoint(checkpoint, output_dir, "--resume_from_checkpoint")


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


def save_final_model(trainer, tokenizer, average: int = 0, weights: str = "uniform") -> Path:
    """The final model (or the mean of the last ``average`` checkpoints, §6.1, with ``weights`` as
    `average_checkpoints` takes them; with ``--ema_decay`` the model already holds the moving average) +
    tokenizer + generation config in ``output_dir``, Hub format; the trainer's model then holds what
    was saved."""
    if average < 0:
        raise ValueError(f"average must be 0 (no averaging) or a number of checkpoints, got {average}.")
    output_dir = Path(trainer.args.output_dir)
    trainer.save_model(str(output_dir), _internal_call=True)  # --push_to_hub: the final folder, once, by `main`
    trainer.averaged_checkpoints = []
    if average and trainer.is_world_process_zero():
        # oldest first, with those of the folders a resumed run continued from; incomplete ones named in the log
        continued = getattr(trainer, "continued_from", None)
        checkpoints = run_checkpoints(output_dir, continued.folders if continued is not None else None)
        chosen = checkpoints[max(0, len(checkpoints) - average) :]
        if len(chosen) < average:
            logger.warning(
                f"averaging {len(chosen)} checkpoints instead of {average}: the run left only {len(chosen)} complete "
                "(--save_steps or --save_minutes too far apart for its length, or --save_total_limit)"
            )
        average_checkpoints(chosen, output_dir, weights, force=True)  # replaces the last weights just saved
        # those of another folder by their path in the log, relative to this folder on the card (it is published)
        logger.info(
            f"final model = {MEAN_NAMES[weights]} of {', '.join(named_checkpoint(p, output_dir) for p in chosen)}"
        )
        trainer.averaged_checkpoints = [card_name(path, output_dir) for path in chosen]
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(output_dir)
    if trainer.args.should_save:  # the run's own model is here: `last` must not train it again from another folder
        forget_continuation(output_dir)
    trainer.accelerator.wait_for_everyone()
    if average:  # evaluate what was saved
        averaged = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
        trainer.load_full_weights(averaged.state_dict())
    return output_dir


def card_name(checkpoint: Path, output_dir: Path) -> str:
    """An averaged checkpoint as the card names it: by its name in ``output_dir``, else by its path relative to it
    (no absolute local path in a published card), else (another drive) by its run folder's name."""
    if checkpoint.parent == output_dir:
        return checkpoint.name
    try:
        return os.path.relpath(checkpoint, output_dir.resolve())
    except ValueError:
        return f"{checkpoint.parent.name}/{checkpoint.name}"


def predict(
    trainer, tokenizer, test, sacrebleu_tokenize: str | None = None, compound_split_language: str | None = None
) -> dict:
    """Translate the ``test`` sources (an Arrow dataset of (source, target)) in input order into
    ``generated_predictions.txt`` and score them against the targets: sacreBLEU (``sacrebleu_tokenize``) and
    chrF, and with ``compound_split_language`` also the paper's tokenized BLEU of that language."""
    output_dir = Path(trainer.args.output_dir)
    model = trainer.model_for_one_process()  # every process: a sharded model is gathered
    if not trainer.is_world_process_zero():
        trainer.accelerator.wait_for_everyone()
        return {}
    sources, references = test["source"], test["target"]
    args = trainer.args  # the decoding flags evaluation takes (Seq2SeqTrainer's), for the test set too
    settings = {"num_beams": args.generation_num_beams, "max_length": args.generation_max_length}
    if args.static_cache_decoding:
        settings["cache_implementation"] = "static"
    hypotheses = translate(
        model,
        tokenizer,
        list(sources),
        args.per_device_eval_batch_size,
        progress=not args.disable_tqdm,
        pad_to_multiple_of=STATIC_CACHE_MULTIPLE if args.static_cache_decoding else None,
        flags={"max_new_tokens": "--generation_max_length"},
        **{name: value for name, value in settings.items() if value is not None},
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    written = as_lines(hypotheses, str(output_dir / PREDICTIONS_FILE))
    (output_dir / PREDICTIONS_FILE).write_text(written, encoding="utf-8")
    scores = score(
        written.split("\n")[:-1],  # the lines as written: sacreBLEU's CLI on the file gives the same
        list(references),
        tokenize=sacrebleu_tokenize,
        **({"compound_split_bleu": True, "language": compound_split_language} if compound_split_language else {}),
    )
    results = {f"predict_{key}": value for key, value in scores.items()}
    results["predict_samples"] = len(hypotheses)
    trainer.save_metrics("predict", results)
    trainer.accelerator.wait_for_everyone()
    return results


CARD_SCORES = (("sacreBLEU", "bleu"), ("chrF", "chrf"), ("tokenized BLEU (as the paper)", "tokenized_bleu"))


# The flags that score the first N pairs of a role's data only
SAMPLE_LIMITS = {"validation": "max_eval_samples", "test": "max_predict_samples"}


def card_scores(metrics: dict, data_args, signatures: dict, scored_pairs: dict | None = None) -> list[dict]:
    """The model card's scores: the validation set's (``eval_*``; sacreBLEU's signatures from the last evaluation,
    ``signatures``) and the test set's (``predict_*``, with their own), each named by the data it was scored on,
    and, where --max_eval_samples/--max_predict_samples cut it, by how many of its pairs (``scored_pairs``)."""
    scores = []
    for prefix, role in (("eval", "validation"), ("predict", "test")):
        dataset, split = scored_data(data_args, role)
        shown = dataset
        if (limit := getattr(data_args, SAMPLE_LIMITS[role])) is not None:
            count = (scored_pairs or {}).get(role)  # at most the limit: the set may hold fewer
            scored = "" if count is None else f", {count} pairs scored"
            shown = f"{dataset}{scored} (--{SAMPLE_LIMITS[role]} {limit})"
        for name, kind in CARD_SCORES:
            if f"{prefix}_{kind}" in metrics:
                signature = signatures.get(kind) if prefix == "eval" else metrics.get(f"{prefix}_{kind}_signature")
                scores.append(
                    {
                        "name": name,
                        "type": kind,
                        "value": round(metrics[f"{prefix}_{kind}"], 2),
                        "dataset": dataset,
                        "dataset_name": shown,
                        "split": split,
                        "signature": signature,
                    }
                )
    return scores


def scored_data(data_args, role: str) -> tuple[str, str]:
    """(what the card calls the ``role`` data, its split): a Hub dataset's id and split, or local files by their
    names (not their folders, which are the trainer's machine's), or the pairs held out of the training data."""
    split = getattr(data_args, f"{role}_split", None)
    if data_args.dataset_name and split:
        return data_args.dataset_name, split
    if role == "validation" and data_args.validation_size:
        return f"{data_args.validation_size} pairs held out of the training data", role
    files = [getattr(data_args, f"{role}_source_file"), getattr(data_args, f"{role}_target_file")]
    names = [Path(file).name for file in (files if files[0] else [getattr(data_args, f"{role}_file")]) if file]
    return " and ".join(names) or "not recorded", role


def base_checkpoint_name(checkpoint: str) -> str:
    """A local base model as the card names it: its folder's name, with the run's folder for a checkpoint-N (not
    the whole path, which is the trainer's machine's)."""
    path = Path(checkpoint).resolve()
    return f"{path.parent.name}/{path.name}" if path.name.startswith(f"{PREFIX_CHECKPOINT_DIR}-") else path.name


def write_card(output_dir: Path, trainer, model_args, data_args, metrics: dict) -> Path:
    """README.md of the saved model: Hub metadata with the validation and test scores, the recipe, how to load it."""
    from ..model_card import write_model_card

    training_args = trainer.args
    # The Hub's base_model names a repo; a local folder is no such reference.
    checkpoint = model_args.model_name_or_path
    base_model = checkpoint if checkpoint and not Path(checkpoint).exists() else None
    signatures = trainer.compute_metrics.signatures if trainer.compute_metrics else {}
    scored = {"validation": len(trainer.eval_dataset) if trainer.eval_dataset is not None else None}
    scored["test"] = metrics.get("predict_samples")
    scores = card_scores(metrics, data_args, signatures, scored)
    return write_model_card(
        output_dir,
        repo_id=getattr(trainer, "hub_model_id", None) if training_args.push_to_hub else None,  # what loads it
        model=trainer.accelerator.unwrap_model(trainer.model),
        languages=(data_args.source_lang, data_args.target_lang),
        datasets=[data_args.dataset_name] if data_args.dataset_name else [],
        training_data=local_training_data(data_args, trainer.train_dataset),
        metrics=scores,
        base_model=base_model,
        local_base_model=base_checkpoint_name(checkpoint) if checkpoint and not base_model else None,
        training_hyperparameters={
            "steps": trainer.state.global_step,
            "tokens per batch (max, padded)": training_args.max_tokens or "sentence batches",
            "gradient accumulation": training_args.gradient_accumulation_steps,
            "processes": training_args.world_size,  # an update: tokens per batch x accumulation x processes
            "peak learning rate": trainer.args.learning_rate,  # eq. (3)'s peak is resolved by the trainer
            "warm-up": warmup_words(training_args.warmup_steps),
            "schedule": schedule_name(training_args),
            "label smoothing": training_args.label_smoothing_factor,
            "Adam": f"({training_args.adam_beta1}, {training_args.adam_beta2}, {training_args.adam_epsilon})",
            "checkpoints averaged": averaged_checkpoints_line(trainer),
            **(
                {"weights": f"exponential moving average, decay {training_args.ema_decay:g}"}
                if training_args.ema_decay
                else {}
            ),
            **best_and_scoring_lines(trainer, bool(scores)),
        },
    )


def local_training_data(data_args, train_dataset) -> str | None:
    """The card's words for training data read from local files: their names (not their folders, which are the
    trainer's machine's) and the pairs trained on; None for a Hub dataset, which the card names by its id."""
    if data_args.dataset_name:
        return None
    files = [data_args.train_source_file, data_args.train_target_file] if data_args.train_source_file else []
    names = [Path(file).name for file in (files or [data_args.train_file]) if file]
    if not names:
        return None
    words = f"local file{'s' if len(names) > 1 else ''} {' and '.join(f'`{name}`' for name in names)}"
    return f"{words} ({len(train_dataset):,} pairs)"


def best_and_scoring_lines(trainer, scored: bool) -> dict:
    """The card's lines where the saved weights or the scores are not what the rest of the card implies: the best
    checkpoint (--load_best_model_at_end) instead of the last update's, and scores decoded with
    --generation_num_beams / --generation_max_length instead of the generation config the card describes."""
    args, lines = trainer.args, {}
    if args.load_best_model_at_end and trainer.state.best_model_checkpoint:
        lines["weights from"] = f"the best checkpoint, {Path(trainer.state.best_model_checkpoint).name}"
    settings = [
        f"beam {args.generation_num_beams}" if args.generation_num_beams else "",
        f"at most {args.generation_max_length} tokens" if args.generation_max_length else "",
    ]
    if scored and any(settings):
        lines["scores decoded with"] = (
            ", ".join(filter(None, settings))
            + " (--generation_num_beams, --generation_max_length), not the decoding below"
        )
    return lines


def averaged_checkpoints_line(trainer) -> str:
    """The card's line for §6.1's averaging: how many checkpoints the final model is the mean of (fewer than
    --average_checkpoints where fewer were kept), which, and how weighted."""
    args, chosen = trainer.args, getattr(trainer, "averaged_checkpoints", None) or []
    if not args.average_checkpoints:
        return "none"
    if not chosen:  # this process did not average (another one did), or nothing was saved
        return f"{args.average_checkpoints} ({args.average_weights} weights)"
    fewer = f" of the {args.average_checkpoints} asked for" if len(chosen) < args.average_checkpoints else ""
    return f"{len(chosen)}{fewer} ({args.average_weights} weights): {', '.join(chosen)}"


def push_final_model(trainer, output_dir: Path) -> str | None:
    """--push_to_hub: the final folder (the averaged or moving-average weights, the tokenizer, the generation
    config, the project's card) in one commit after it is complete (`publish`); the Trainer's own pushes of
    checkpoints during training came before. The commit's URL (None on other processes)."""
    from ..publish import publish

    if not trainer.is_world_process_zero():
        return None
    args = trainer.args
    url = publish(
        output_dir,
        trainer.hub_model_id,
        private=args.hub_private_repo,
        revision=args.hub_revision,
        token=args.hub_token,
        commit_message="Final model and card",
    )
    logger.info(f"pushed the final model to {trainer.hub_model_id}: {url}")
    return url


def close_process_group() -> None:
    """Destroy the default process group if this process joined one (a no-op in a single process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        PartialState().destroy_process_group()


if __name__ == "__main__":  # python -m vanilla_transformer.training.run
    main(sys.argv[1:], exit_on_bad_input=True)
