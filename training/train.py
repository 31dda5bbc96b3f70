"""Train (or fine-tune) a Transformer with the paper's recipe on Seq2SeqTrainer.

Data -> tokenizer -> model -> Trainer -> Hub folder, one step a function:

    python training/train.py --train_source_file train.en.gz --train_target_file train.de.gz \\
        --validation_source_file val.en --validation_target_file val.de \\
        --preset base --output_dir runs/en-de --max_tokens 4096 --gradient_accumulation_steps 6
    python training/train.py my-run.yaml [--any_flag value ...]     # the same arguments from YAML/JSON
    torchrun --nproc_per_node 2 training/train.py ...               # data parallel (each process: own batches)

The recipe of §5, each a flag whose default is the paper's value:
  Adam(0.9, 0.98, eps 1e-9)       --adam_beta1 --adam_beta2 --adam_epsilon
  lr = s * d^-0.5 * min(n^-0.5, n * warmup^-1.5)   --lr_scale s (1.0) --warmup_steps (4000);
                                  or --learning_rate PEAK (the rate reached at the end of warm-up)
  label smoothing 0.1             --label_smoothing_factor, applied per target token over the whole
                                  accumulated batch (fairseq's normalisation, not per micro-batch)
  token-count batches             --max_tokens N (padded tokens per batch and side, fairseq --max-tokens);
                                  --gradient_accumulation_steps is fairseq's --update-freq: the paper's
                                  ~25k tokens per update = max_tokens x accumulation x processes
  dropout                         from the model config (--config_overrides dropout=0.3 for big)
  checkpoint averaging            --average_checkpoints 5 saves the mean of the last 5 checkpoints (§6.1)

Everything else is a Seq2SeqTrainingArguments flag as usual (--bf16, --max_grad_norm,
--save_steps, --resume_from_checkpoint, --report_to tensorboard, --eval_strategy steps, ...).
Evaluation decodes with `generate()` (the model's generation config: 4 beams, length penalty 0.6)
and scores with sacreBLEU and chrF offline; the validation loss is the unsmoothed per-token
negative log-likelihood, so ``exp(eval_loss)`` is the perplexity.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import sacrebleu
import torch
from torch.utils.data import DataLoader
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

import vanilla_transformer
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data as data_utils  # noqa: E402
from average_checkpoints import average_checkpoints  # noqa: E402

logger = logging.getLogger("vanilla_transformer.train")


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
    source_column: str | None = field(
        default=None,
        metadata={"help": "TSV: 0-based column (default 0); JSONL/Hub: key, dotted for nesting "
                  "(default: the language code, or translation.<lang> when records have 'translation')"},
    )
    target_column: str | None = field(default=None, metadata={"help": "as --source_column (TSV default 1)"})
    dataset_name: str | None = field(default=None, metadata={"help": "a Hub dataset (downloaded only when given)"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "e.g. de-en for wmt14"})
    train_split: str = field(default="train")
    validation_split: str | None = field(default=None, metadata={"help": "Hub split for validation, e.g. validation"})
    validation_size: int = field(
        default=0, metadata={"help": "hold out this many training pairs for validation when no validation data is given"}
    )
    max_source_length: int | None = field(
        default=None, metadata={"help": "drop (and count) longer pairs; default: the model's max_position_embeddings"}
    )
    max_target_length: int | None = field(default=None, metadata={"help": "as --max_source_length, target side"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training pairs"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "evaluate on the first N validation pairs"})
    sacrebleu_tokenize: str | None = field(default=None, metadata={"help": "sacreBLEU tokenizer (default: 13a)"})


@dataclass
class ModelArguments:
    """A new model from a preset, or an existing checkpoint to fine-tune; a tokenizer to load or train."""

    model_name_or_path: str | None = field(default=None, metadata={"help": "checkpoint to fine-tune (folder or Hub id)"})
    preset: str = field(default="base", metadata={"help": f"new model from a preset: {', '.join(vanilla_transformer.PRESETS)}"})
    config_overrides: str | None = field(
        default=None, metadata={"help": "comma-separated config fields for a new model, e.g. d_model=256,encoder_layers=3"}
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "tokenizer to load; default: the checkpoint's, or train a joint BPE on the data"}
    )
    tokenizer_vocab_size: int = field(default=37000, metadata={"help": "joint BPE vocabulary size when training one (§5.1)"})
    tokenizer_min_frequency: int = field(default=2)
    attn_implementation: str | None = field(default=None, metadata={"help": "eager, sdpa or flex_attention"})


@dataclass
class TransformerTrainingArguments(Seq2SeqTrainingArguments):
    """Seq2SeqTrainingArguments with the paper's values as defaults (§5.3, §5.4) and token batching."""

    adam_beta2: float = field(default=0.98, metadata={"help": "Adam beta2 (paper: 0.98)"})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam epsilon (paper: 1e-9)"})
    learning_rate: float | None = field(
        default=None, metadata={"help": "peak learning rate; default lr_scale * d_model^-0.5 * warmup_steps^-0.5 (§5.3)"}
    )
    lr_scale: float = field(default=1.0, metadata={"help": "multiplies the paper's learning-rate formula"})
    lr_scheduler_type: str = field(
        default="inverse_sqrt", metadata={"help": "inverse_sqrt with warm-up is the paper's schedule"}
    )
    warmup_steps: float = field(default=4000, metadata={"help": "warm-up steps (paper: 4000)"})
    label_smoothing_factor: float = field(default=0.1, metadata={"help": "label smoothing (paper: 0.1)"})
    weight_decay: float = field(default=0.0)
    max_tokens: int | None = field(
        default=4096, metadata={"help": "padded tokens per batch and side (fairseq --max-tokens); 0: sentence batches"}
    )
    average_checkpoints: int = field(
        default=0, metadata={"help": "save the mean of the last N checkpoints as the final model (paper: 5 base, 20 big)"}
    )
    predict_with_generate: bool = field(default=True, metadata={"help": "evaluate BLEU/chrF by decoding"})
    save_safetensors: bool = field(default=True)


def parse_arguments(argv: list[str] | None = None):
    """Parse flags; a first argument ending in .yaml/.yml/.json supplies defaults that later flags override."""
    parser = HfArgumentParser((ModelArguments, DataArguments, TransformerTrainingArguments))
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and Path(argv[0]).suffix in {".yaml", ".yml", ".json"}:
        path = Path(argv.pop(0))
        values = _read_argument_file(path)
        known = {action.dest for action in parser._actions}
        if unknown := sorted(set(values) - known):
            raise ValueError(f"{str(path)!r} has unknown argument(s) {unknown}; see `train.py --help` for the names.")
        parser.set_defaults(**values)
    return parser.parse_args_into_dataclasses(args=argv)


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


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def _default_key(lang: str, record_keys) -> str:
    return f"translation.{lang}" if "translation" in record_keys else lang


def read_local_pairs(source_file, target_file, pairs_file, args: DataArguments, role: str) -> list[tuple[str, str]] | None:
    """Pairs from two aligned files or one TSV/JSONL file; None when none is given."""
    if (source_file is None) != (target_file is None):
        raise ValueError(f"Give both --{role}_source_file and --{role}_target_file, or neither.")
    if source_file and pairs_file:
        raise ValueError(f"Give --{role}_source_file/--{role}_target_file or --{role}_file, not both.")
    if source_file:
        return data_utils.read_parallel(source_file, target_file)
    if not pairs_file:
        return None
    suffixes = [s for s in Path(pairs_file).suffixes if s != ".gz"]
    if suffixes and suffixes[-1] == ".tsv":
        return data_utils.read_tsv(pairs_file, int(args.source_column or 0), int(args.target_column or 1))
    if suffixes and suffixes[-1] in {".jsonl", ".json"}:
        with data_utils.open_text(pairs_file) as file:
            first = next((line for line in file if line.strip()), "{}")
        keys = json.loads(first) if first.strip().startswith("{") else {}
        source_key = args.source_column or _default_key(args.source_lang, keys)
        target_key = args.target_column or _default_key(args.target_lang, keys)
        return data_utils.read_jsonl(pairs_file, source_key, target_key)
    raise ValueError(f"--{role}_file {pairs_file!r}: use a .tsv or .jsonl file (optionally .gz).")


def read_hub_pairs(args: DataArguments, split: str) -> list[tuple[str, str]]:
    """Pairs from a Hub dataset split (downloaded by `datasets`, only because the user named it)."""
    from datasets import load_dataset

    dataset = load_dataset(args.dataset_name, args.dataset_config_name, split=split)
    source_key = args.source_column or _default_key(args.source_lang, dataset.column_names)
    target_key = args.target_column or _default_key(args.target_lang, dataset.column_names)
    where = f"dataset {args.dataset_name!r} split {split!r}"
    return [
        (data_utils.json_field(row, source_key, where), data_utils.json_field(row, target_key, where))
        for row in dataset
    ]


def load_pairs(args: DataArguments, seed: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]] | None]:
    """(training pairs, validation pairs or None)."""
    local_train = read_local_pairs(args.train_source_file, args.train_target_file, args.train_file, args, "train")
    if (local_train is None) == (args.dataset_name is None):
        raise ValueError(
            "Give training data: --train_source_file/--train_target_file, --train_file (.tsv/.jsonl), "
            "or --dataset_name (a Hub dataset) — exactly one of them."
        )
    if local_train is not None:
        train = local_train
    else:  # read only what is asked for
        train = read_hub_pairs(args, args.train_split + (f"[:{args.max_train_samples}]" if args.max_train_samples else ""))
    validation = read_local_pairs(
        args.validation_source_file, args.validation_target_file, args.validation_file, args, "validation"
    )
    if validation is not None and args.validation_size:
        raise ValueError("Give validation data or --validation_size (held out from training), not both.")
    if validation is None and args.dataset_name and args.validation_split:
        if args.validation_size:
            raise ValueError("Give --validation_split or --validation_size (held out from training), not both.")
        validation = read_hub_pairs(args, args.validation_split)
    if args.max_train_samples is not None:
        train = train[: args.max_train_samples]
    if validation is None and args.validation_size > 0:
        if args.validation_size >= len(train):
            raise ValueError(f"--validation_size {args.validation_size} leaves no training data ({len(train)} pairs).")
        shuffled = train[:]
        random.Random(seed).shuffle(shuffled)
        validation, train = shuffled[: args.validation_size], shuffled[args.validation_size:]
    if validation is not None and args.max_eval_samples is not None:
        validation = validation[: args.max_eval_samples]
    return train, validation


def prepare_examples(pairs, tokenizer, config, args: DataArguments, role: str) -> list[dict]:
    """Tokenise and length-filter; the number dropped is logged (never silent)."""
    examples = data_utils.tokenize_pairs(pairs, tokenizer)
    kept, dropped = data_utils.filter_by_length(
        examples,
        args.max_source_length or config.max_position_embeddings,
        args.max_target_length or config.max_position_embeddings,
        tokenizer.all_special_ids,
    )
    logger.info(f"{role}: {len(kept)} examples kept, {dropped} dropped by the length filter")
    if not kept:
        raise ValueError(f"No {role} examples left after the length filter ({dropped} dropped).")
    return kept


# ---------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------


def build_tokenizer(model_args: ModelArguments, train_pairs, training_args, output_dir: Path):
    """Load the given (or the checkpoint's) tokenizer, or train a joint BPE on both sides of the data."""
    name = model_args.tokenizer_name_or_path or model_args.model_name_or_path
    if name:
        return AutoTokenizer.from_pretrained(name)
    tokenizer_dir = output_dir / "tokenizer"
    if training_args.resume_from_checkpoint and (tokenizer_dir / "tokenizer.json").is_file():
        logger.info(f"resuming: using the tokenizer trained before, {tokenizer_dir}")
        return AutoTokenizer.from_pretrained(tokenizer_dir)
    # Train once (main process), the other processes load the result.
    with training_args.main_process_first(desc="training the tokenizer"):
        if training_args.process_index == 0:
            tokenizer = vanilla_transformer.train_tokenizer(
                (text for pair in train_pairs for text in pair),
                vocab_size=model_args.tokenizer_vocab_size,
                min_frequency=model_args.tokenizer_min_frequency,
            )
            tokenizer.save_pretrained(tokenizer_dir)
            logger.info(f"trained a joint BPE tokenizer of {len(tokenizer)} tokens on the training data")
        else:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return tokenizer


def parse_overrides(text: str | None) -> dict:
    """``"d_model=256,dropout=0.3,activation_function=relu"`` -> typed dict (JSON values, else strings)."""
    overrides = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--config_overrides item {item!r} is not key=value (e.g. d_model=256).")
        try:
            overrides[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key.strip()] = value.strip()
    return overrides


def build_model(model_args: ModelArguments, tokenizer) -> VanillaTransformerForConditionalGeneration:
    """A new model from a preset sized to the tokenizer, or the checkpoint to fine-tune."""
    extra = {"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}
    if model_args.model_name_or_path:
        if model_args.config_overrides:
            raise ValueError("--config_overrides applies to a new model; a checkpoint keeps its architecture.")
        model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, **extra)
        vanilla_transformer.check_tokenizer_matches_model(tokenizer, model.config)
        return model
    overrides = parse_overrides(model_args.config_overrides)
    special = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": tokenizer.bos_token_id,
    }
    config = VanillaTransformerConfig.from_preset(model_args.preset, **{**special, **overrides})
    vanilla_transformer.check_tokenizer_matches_model(tokenizer, config)
    return VanillaTransformerForConditionalGeneration._from_config(config, **extra)


# ---------------------------------------------------------------------------------------------
# Trainer: token-count batches and a label-smoothed loss normalised over the accumulated batch
# ---------------------------------------------------------------------------------------------


def label_smoothed_loss(logits, labels, num_items_in_batch=None, smoothing: float = 0.0) -> torch.Tensor:
    """Sum of per-token label-smoothed cross-entropy (§5.4) / number of target tokens.

    (1 - eps) * NLL + eps * mean over the vocabulary of -log p (Szegedy et al. 2016), the same as
    fairseq's and `torch.nn.functional.cross_entropy(label_smoothing=eps)`. Divided by
    ``num_items_in_batch`` (tokens in the whole accumulated, all-process batch) when given, so every
    token weighs the same however the tokens fall into micro-batches.
    """
    labels = labels.to(logits.device)
    total = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum", label_smoothing=smoothing
    )
    count = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum().clamp(min=1)
    return total / (count.to(total.device) if torch.is_tensor(count) else count)


class TransformerTrainer(Seq2SeqTrainer):
    """Seq2SeqTrainer with fairseq-style token batches and per-token label smoothing."""

    loss_is_scaled_for_ga = True  # compute_loss divides by the tokens of the whole accumulated batch

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # compute_loss smooths itself; Seq2SeqTrainer's evaluation would otherwise report a smoothed
        # eval_loss through the Trainer's LabelSmoother.
        self.label_smoother = None
        # Always count the target tokens of each accumulated batch: compute_loss normalises by them.
        self.model_accepts_loss_kwargs = True

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """Seq2SeqTrainer's, without its side effect on the model's generation config.

        Seq2SeqTrainer writes its fallback ``max_length=20`` into ``model.generation_config``; that
        would cut every later translation (and the saved generation_config.json) at 20 tokens
        instead of the paper's source length + 50.
        """
        unwrapped = self.accelerator.unwrap_model(model)
        saved = copy.deepcopy(unwrapped.generation_config)
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            unwrapped.generation_config = saved

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        if "decoder_input_ids" not in inputs:
            inputs["decoder_input_ids"] = self.accelerator.unwrap_model(model).prepare_decoder_input_ids_from_labels(
                labels
            )
        outputs = model(**inputs)
        smoothing = self.args.label_smoothing_factor if model.training else 0.0  # eval: plain NLL -> perplexity
        loss = label_smoothed_loss(outputs.logits, labels, num_items_in_batch, smoothing)
        if num_items_in_batch is not None and self.args.average_tokens_across_devices:
            loss = loss * self.accelerator.num_processes  # DDP averages gradients over processes
        return (loss, outputs) if return_outputs else loss

    def get_train_dataloader(self) -> DataLoader:
        if not self.args.max_tokens:
            return super().get_train_dataloader()
        lengths = [(len(e["input_ids"]), len(e["labels"])) for e in self.train_dataset]
        # One process's view of all batches; accelerate deals them out to the processes (disjoint).
        sampler = data_utils.TokenBatchSampler(lengths, self.args.max_tokens, shuffle=True, seed=self.args.seed)
        loader = DataLoader(
            self.train_dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)


class TranslationMetrics:
    """compute_metrics for the Trainer: sacreBLEU and chrF with sacrebleu itself (offline, unlike
    ``evaluate.load("sacrebleu")``); keeps the signatures of the last evaluation for the model card."""

    def __init__(self, tokenizer, sacrebleu_tokenize: str | None = None):
        self.tokenizer, self.sacrebleu_tokenize = tokenizer, sacrebleu_tokenize
        self.signatures: dict[str, str] = {}

    def __call__(self, prediction) -> dict:
        predictions = [[t for t in row if t >= 0] for row in prediction.predictions.tolist()]
        labels = [[t for t in row if t != -100] for row in prediction.label_ids.tolist()]
        hypotheses = self.tokenizer.batch_decode(predictions, skip_special_tokens=True)
        references = self.tokenizer.batch_decode(labels, skip_special_tokens=True)
        bleu, chrf = sacrebleu.metrics.BLEU(tokenize=self.sacrebleu_tokenize), sacrebleu.metrics.CHRF()
        scores = {"bleu": bleu.corpus_score(hypotheses, [references]).score,
                  "chrf": chrf.corpus_score(hypotheses, [references]).score}
        self.signatures = {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())}
        return scores


def set_learning_rate(training_args: TransformerTrainingArguments, d_model: int) -> None:
    """Resolve the peak learning rate so that inverse_sqrt equals the paper's formula (§5.3)."""
    if training_args.learning_rate is not None:
        if training_args.lr_scale != 1.0:
            raise ValueError("Give --learning_rate (the peak) or --lr_scale (a multiple of the paper's), not both.")
        return
    warmup = training_args.warmup_steps
    if training_args.lr_scheduler_type != "inverse_sqrt" or not (isinstance(warmup, int) or float(warmup).is_integer()) or warmup < 1:
        raise ValueError(
            "The paper's learning rate needs --lr_scheduler_type inverse_sqrt and an integer --warmup_steps >= 1; "
            "with another schedule give --learning_rate."
        )
    training_args.learning_rate = noam_learning_rate(int(warmup), d_model, int(warmup), training_args.lr_scale)


def noam_learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), equation (3) of §5.3."""
    if step == 0:
        return 0.0
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


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


class SaveLastStep(TrainerCallback):
    """Save a checkpoint at the last step, so that averaging the last N includes the final weights."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps:
            control.should_save = True
        return control


def build_trainer(model_args, data_args, training_args):
    """Everything up to a ready Trainer: (trainer, tokenizer, train examples, validation examples)."""
    check_training_arguments(training_args)
    set_seed(training_args.seed)
    output_dir = Path(training_args.output_dir)
    train_pairs, validation_pairs = load_pairs(data_args, training_args.seed)
    logger.info(f"data: {len(train_pairs)} training pairs, {len(validation_pairs or [])} validation pairs")
    tokenizer = build_tokenizer(model_args, train_pairs, training_args, output_dir)
    model = build_model(model_args, tokenizer)
    set_learning_rate(training_args, model.config.d_model)
    train_examples = prepare_examples(train_pairs, tokenizer, model.config, data_args, "train")
    validation_examples = (
        prepare_examples(validation_pairs, tokenizer, model.config, data_args, "validation") if validation_pairs else None
    )
    trainer = TransformerTrainer(
        model=model,
        args=training_args,
        train_dataset=train_examples,
        eval_dataset=validation_examples,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        compute_metrics=TranslationMetrics(tokenizer, data_args.sacrebleu_tokenize) if validation_examples else None,
        callbacks=[SaveLastStep()] if training_args.average_checkpoints else None,
    )
    return trainer, tokenizer, train_examples, validation_examples


def resolve_resume(training_args) -> str | bool | None:
    """--resume_from_checkpoint PATH, or 'last' / 'true' for the newest checkpoint in output_dir."""
    value = training_args.resume_from_checkpoint
    if value is None or str(value).lower() not in {"last", "true"}:
        return value
    last = get_last_checkpoint(training_args.output_dir) if Path(training_args.output_dir).is_dir() else None
    if last is None:
        raise ValueError(f"--resume_from_checkpoint {value}: no checkpoint-* folder in {training_args.output_dir!r}.")
    return last


def save_final_model(trainer, tokenizer, training_args) -> Path:
    """The final model (or the mean of the last N checkpoints) + tokenizer + generation config, Hub format."""
    output_dir = Path(training_args.output_dir)
    trainer.save_model(str(output_dir))
    if training_args.average_checkpoints and trainer.is_world_process_zero():
        checkpoints = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[-1]))
        chosen = checkpoints[-training_args.average_checkpoints:]
        if len(chosen) < training_args.average_checkpoints:
            logger.warning(f"averaging {len(chosen)} checkpoints: only {len(chosen)} were kept")
        average_checkpoints(chosen, output_dir)
        logger.info(f"final model = mean of {', '.join(p.name for p in chosen)}")
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(output_dir)
    trainer.accelerator.wait_for_everyone()
    if training_args.average_checkpoints:  # evaluate what was saved
        averaged = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
        trainer.model.load_state_dict(averaged.state_dict())
    return output_dir


def write_card(output_dir: Path, trainer, model_args, data_args, metrics: dict) -> Path:
    """README.md of the saved model: Hub metadata with the validation scores, the recipe, how to load it."""
    from vanilla_transformer.model_card import write_model_card

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
        output_dir, model=trainer.model, languages=(data_args.source_lang, data_args.target_lang),
        datasets=[data_args.dataset_name] if data_args.dataset_name else [], metrics=scores,
        base_model=base_model, training_hyperparameters={
            "steps": trainer.state.global_step,
            "tokens per batch (max, padded)": training_args.max_tokens or "sentence batches",
            "gradient accumulation": training_args.gradient_accumulation_steps,
            "peak learning rate": training_args.learning_rate, "warm-up steps": training_args.warmup_steps,
            "schedule": training_args.lr_scheduler_type, "label smoothing": training_args.label_smoothing_factor,
            "Adam": f"({training_args.adam_beta1}, {training_args.adam_beta2}, {training_args.adam_epsilon})",
            "checkpoints averaged": training_args.average_checkpoints or "none",
        },
    )


def main(argv: list[str] | None = None) -> dict:
    model_args, data_args, training_args = parse_arguments(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    trainer, tokenizer, train_examples, validation_examples = build_trainer(model_args, data_args, training_args)
    model = trainer.model
    logger.info(f"process {training_args.process_index} of {training_args.world_size}")
    logger.info(
        f"model: {sum(p.numel() for p in model.parameters()):,} parameters; peak learning rate "
        f"{training_args.learning_rate:.3g}; {len(train_examples)} training examples"
    )
    result = trainer.train(resume_from_checkpoint=resolve_resume(training_args))
    metrics = dict(result.metrics)
    trainer.save_state()  # trainer_state.json: the logged loss curve, next to the model
    output_dir = save_final_model(trainer, tokenizer, training_args)
    if validation_examples:
        evaluation = trainer.evaluate(metric_key_prefix="eval")
        evaluation["eval_perplexity"] = math.exp(min(evaluation["eval_loss"], 50.0))
        metrics.update(evaluation)
    trainer.save_metrics("all", metrics)
    if trainer.is_world_process_zero():
        write_card(output_dir, trainer, model_args, data_args, metrics)
        logger.info(f"saved the model, tokenizer and generation config to {output_dir}")
        logger.info("metrics: " + json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}))
    return metrics


if __name__ == "__main__":
    main()
