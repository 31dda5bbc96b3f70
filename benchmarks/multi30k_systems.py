"""The two systems of `multi30k.py`, each trained under the same wall-clock budget and then decoded and scored:
ours as the recipe (`training/recipes/multi30k.yaml`) through train.py's run, MarianMT through `Seq2SeqTrainer`
as a careful user sets it up; `run_system` is what each run's child process executes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from common import (
    PAIRS,
    REPO,
    cpu_seconds,
    machine_load,
    marian_config,
    matmul_gflops,
    peak_memory_mib,
    read_split,
    split_files,
)

RECIPE = REPO / "training" / "recipes" / "multi30k.yaml"
# Stands for a folder that train_ours fills first: the Metaspace BPE the MarianMT baseline trains.
MARIAN_TOKENIZER = "<the MarianMT baseline's Metaspace BPE, trained in the run folder>"
# bfloat16 autocast over float32 weights (the Trainer's --bf16), for CPUs that multiply bfloat16 natively
# (AVX512-BF16, AMX); transformers takes --bf16 on a CPU only with --use_cpu.
BF16_FLAGS = ["--bf16", "true", "--use_cpu", "true"]
# Both length penalties are scored on every model of ours (one training, two decodings).
OTHER_FORMULA = {"gnmt": "length", "length": "gnmt"}


class TokenCounter:
    """Wraps a collator and counts the target tokens (labels != -100) of every batch it builds."""

    def __init__(self, collator):
        self.collator, self.target_tokens = collator, 0

    def __call__(self, features):
        batch = self.collator(features)
        self.target_tokens += int((batch["labels"] != -100).sum())
        return batch


# ---------------------------------------------------------------------------------------------
# Ours: the recipe through train.py's run
# ---------------------------------------------------------------------------------------------


def recipe_overrides() -> str:
    import yaml

    return yaml.safe_load(RECIPE.read_text())["config_overrides"]


def merged_overrides(*texts: str) -> str:
    """Several ``--config_overrides`` strings as one, later values winning."""
    from vanilla_transformer.training.run import parse_overrides

    merged = {}
    for text in texts:
        merged.update(parse_overrides(text))
    return ",".join(
        f"{key}={json.dumps(value) if not isinstance(value, str) else value}" for key, value in merged.items()
    )


def ours_arguments(args, data_dir: Path, run_dir: Path, lever: tuple[list[str], str]) -> list[str]:
    flags, config = lever
    source, target = PAIRS[args.pair]
    files = {split: split_files(data_dir, split, source, target) for split in ("train", "val")}
    overrides = [recipe_overrides()]
    if args.dimensions:  # smoke runs: a smaller model
        d = args.dims
        overrides.append(
            f"d_model={d['d_model']},encoder_layers={d['layers']},decoder_layers={d['layers']},"
            f"encoder_attention_heads={d['heads']},decoder_attention_heads={d['heads']},"
            f"encoder_ffn_dim={d['ffn']},decoder_ffn_dim={d['ffn']}"
        )
    return [
        str(RECIPE),
        "--output_dir",
        str(run_dir),
        "--source_lang",
        source,
        "--target_lang",
        target,
        "--dataset_name",
        "none",
        "--do_predict",
        "false",  # local files; the test set is decoded below
        "--train_source_file",
        str(files["train"][0]),
        "--train_target_file",
        str(files["train"][1]),
        "--validation_source_file",
        str(files["val"][0]),
        "--validation_target_file",
        str(files["val"][1]),
        "--config_overrides",
        merged_overrides(*overrides, config),
        "--max_train_minutes",
        str(args.budget_minutes),
        "--seed",
        str(args.seed),
        "--disable_tqdm",
        "true",
        *args.recipe_flag,
        *(BF16_FLAGS if args.bf16 else []),
        *flags,
    ]


def final_weights(training_args) -> str:
    """What train.py saves as the final model, in words."""
    from vanilla_transformer.training import averaging

    if training_args.ema_decay:
        return f"moving average of every update, decay {training_args.ema_decay:g}"
    if training_args.average_checkpoints:
        return (
            f"{averaging.MEAN_NAMES[training_args.average_weights]} of the last "
            f"{training_args.average_checkpoints} checkpoints"
        )
    return "last"


def train_ours(args, data_dir: Path, run_dir: Path, lever: tuple[list[str], str]) -> dict:
    """The recipe under the budget, then the final model as train.py saves it (the moving average of
    the weights, or the mean of the last checkpoints, when the recipe averages)."""
    from vanilla_transformer.training import run

    flags, config = lever
    if MARIAN_TOKENIZER in flags:  # the baseline's tokenizer, trained as train_marian trains it
        folder = run_dir / "metaspace-tokenizer"
        pairs = read_split(data_dir, "train", args.pair)
        metaspace_tokenizer((text for pair in pairs for text in pair), args.marian_vocab_size).save_pretrained(folder)
        lever = ([str(folder) if flag == MARIAN_TOKENIZER else flag for flag in flags], config)
    model_args, data_args, training_args = run.parse_arguments(ours_arguments(args, data_dir, run_dir, lever))
    prepared = run.build_trainer(model_args, data_args, training_args)
    trainer = prepared.trainer
    counter = trainer.data_collator = TokenCounter(trainer.data_collator)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    result = {
        "steps": trainer.state.global_step,
        "train_seconds": seconds,
        "target_tokens": counter.target_tokens,
        "target_tokens_per_second": counter.target_tokens / seconds,
        "parameters": trainer.model.num_parameters(),
        "model_dir": str(run_dir),
        "train_peak_memory_mib": peak_memory_mib(),
        "vocabulary": len(prepared.tokenizer),
        "final_weights": final_weights(training_args),
    }
    run.save_final_model(trainer, prepared.tokenizer, training_args.average_checkpoints, training_args.average_weights)
    return result


# ---------------------------------------------------------------------------------------------
# MarianMT
# ---------------------------------------------------------------------------------------------


def metaspace_tokenizer(texts, vocab_size: int):
    """A joint BPE with sentencepiece-style spaces (Metaspace), the tokenizer most Marian users train, as
    a `PreTrainedTokenizerFast` that appends </s>."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.normalizer = normalizers.NFKC()
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<unk>", "<s>", "</s>"])
    )
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", backend.token_to_id("</s>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        clean_up_tokenization_spaces=False,
    )


def marian_setup(setup: str, tokenizer, dims: dict):
    """MarianMT's config in the set-up ``--marian-setup`` names (`MARIAN_SETUPS`), at ``dims``, with one shared and
    tied vocabulary."""
    shape = dict(
        d_model=dims["d_model"],
        encoder_layers=dims["layers"],
        decoder_layers=dims["layers"],
        encoder_attention_heads=dims["heads"],
        decoder_attention_heads=dims["heads"],
        encoder_ffn_dim=dims["ffn"],
        decoder_ffn_dim=dims["ffn"],
    )
    paper = dict(activation_function="relu", scale_embedding=True)
    settings = {
        "tuned": {**paper, "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0},
        "paper": {**paper, "dropout": 0.3},
        "user": {},
    }[setup]
    return marian_config(
        tokenizer,
        forced_eos_token_id=None,
        tie_word_embeddings=True,
        share_encoder_decoder_embeddings=True,
        **shape,
        **settings,
    )


def train_marian(args, data_dir: Path, run_dir: Path) -> dict:
    import torch
    from transformers import DataCollatorForSeq2Seq, MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments

    from vanilla_transformer.training.trainer import WallClock  # the same budget as ours

    train_pairs = read_split(data_dir, "train", args.pair)
    tokenizer = metaspace_tokenizer((text for pair in train_pairs for text in pair), args.marian_vocab_size)
    torch.manual_seed(args.seed)
    model = MarianMTModel(marian_setup(args.marian_setup, tokenizer, args.dims))
    encoded = tokenizer([s for s, _ in train_pairs], text_target=[t for _, t in train_pairs])
    examples = [{"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])]
    paper_optimizer = {"adam_beta2": 0.98, "adam_epsilon": 1e-9} if args.marian_setup != "user" else {}
    training_args = Seq2SeqTrainingArguments(
        output_dir=str(run_dir),
        max_steps=1_000_000,
        per_device_train_batch_size=64,
        learning_rate=1e-3,
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=800,
        label_smoothing_factor=0.1,
        train_sampling_strategy="group_by_length",
        save_strategy="no",
        logging_steps=50,
        report_to="none",
        use_cpu=True,
        bf16=args.bf16,
        seed=args.seed,
        disable_tqdm=True,
        **paper_optimizer,
    )
    counter = TokenCounter(DataCollatorForSeq2Seq(tokenizer, model=model))
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=examples,
        data_collator=counter,
        processing_class=tokenizer,
        callbacks=[WallClock(max_minutes=args.budget_minutes)],
    )
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    model.save_pretrained(run_dir)
    tokenizer.save_pretrained(run_dir)
    return {
        "steps": trainer.state.global_step,
        "train_seconds": seconds,
        "target_tokens": counter.target_tokens,
        "target_tokens_per_second": counter.target_tokens / seconds,
        "parameters": model.num_parameters(),
        "model_dir": str(run_dir),
        "train_peak_memory_mib": peak_memory_mib(),
        "vocabulary": len(tokenizer),
        "final_weights": "last",
    }


# ---------------------------------------------------------------------------------------------
# Decoding and scoring
# ---------------------------------------------------------------------------------------------


def decode_and_score(name: str, model_dir: str, pairs, batch_size: int, **settings) -> dict:
    """Translate with batches sorted by length (`translate`) and score with sacreBLEU/chrF."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from vanilla_transformer.training import score, translate

    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)
    sources, references = [list(side) for side in zip(*pairs)]
    if name == "marian":  # ours decodes with its own generation config; MarianMT gets the same settings spelled out
        settings = {
            "num_beams": 4,
            "length_penalty": 0.6,
            "early_stopping": True,
            "max_new_tokens": max(len(ids) for ids in tokenizer(sources)["input_ids"]) + 50,
            **settings,
        }
    started = time.perf_counter()
    hypotheses = translate(model, tokenizer, sources, batch_size=batch_size, **settings)
    seconds = time.perf_counter() - started
    words = sum(len(text.split()) for text in hypotheses) / sum(len(text.split()) for text in references)
    return {
        **score(hypotheses, references),
        "length_ratio": words,
        "decode_seconds": seconds,
        "sentences_per_second": len(sources) / seconds,
        "examples": hypotheses[:3],
    }


def decode_ours(key: str, model_dir: str, pairs, batch_size: int, **decoding) -> dict:
    """``key``: ours scored with its generation config (``decoding`` over it); ``key with <other> penalty``: the
    same alpha under the other formula (one model, two decodings)."""
    from transformers import GenerationConfig

    from vanilla_transformer.generation_vanilla_transformer import penalty_formula_of

    formula = decoding.get("length_penalty_formula") or penalty_formula_of(GenerationConfig.from_pretrained(model_dir))
    other = OTHER_FORMULA[formula]
    return {
        key: decode_and_score("ours", model_dir, pairs, batch_size, **decoding),
        f"{key} with {other} penalty": decode_and_score(
            "ours", model_dir, pairs, batch_size, **{**decoding, "length_penalty_formula": other}
        ),
    }


def run_system(name: str, args, data_dir: Path, run_dir: Path, lever: tuple[list[str], str]) -> dict:
    """Train, then decode val and test; runs in its own process (peak memory = this system's)."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    gflops, before = matmul_gflops(), cpu_seconds()
    result = train_ours(args, data_dir, run_dir, lever) if name == "ours" else train_marian(args, data_dir, run_dir)
    result["machine_load"] = machine_load(gflops, before, cpu_seconds(), matmul_gflops())
    splits = {"val": "val"} if args.levers else {"val": "val", "test": "test_2016_flickr"}
    for key, split in splits.items():
        pairs = read_split(data_dir, split, args.pair, args.test_limit)
        if name == "ours":
            result.update(decode_ours(key, result["model_dir"], pairs, args.decode_batch_size))
        else:
            result[key] = decode_and_score(name, result["model_dir"], pairs, args.decode_batch_size)
    result["peak_memory_mib"] = peak_memory_mib()
    return result
