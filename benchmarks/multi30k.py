"""Multi30k side by side: this package's Transformer with the paper's recipe vs HF MarianMT as a
transformers user trains it today, same tokenizer, same dimensions, same CPU time budget.

    python benchmarks/multi30k.py --data-dir ../shared/data/multi30k [--pair en-de] [--budget-minutes 25]

Each system trains in its own child process (so peak memory is its own) for the same wall-clock
budget, then decodes test_2016_flickr with beam 4, length penalty 0.6, at most source + 50 tokens.

- ours: training/train.py's TransformerTrainer: token-count batches (fairseq --max-tokens), Adam
  (0.9, 0.98, 1e-9), warm-up then inverse square root, per-token label smoothing 0.1, checkpoints
  every few minutes and the mean of the last ones (§6.1); decoding with training/translate.py
  (batches sorted by length, the paper's generation config).
- MarianMT: `MarianMTModel(MarianConfig(...))` on Seq2SeqTrainer, inverse_sqrt schedule with the same
  peak and warm-up, label_smoothing_factor 0.1, length-grouped batches of sentences holding about as
  many tokens as ours; decoding `generate(num_beams=4, length_penalty=0.6, max_new_tokens=src+50)`
  over the test set in its order.
- CTranslate2 (float32 and int8): our trained model exported with vanilla_transformer.convert,
  decoded with the same beam settings.

Writes results.json and results.md (a Markdown table) into --output-dir. Without the data folder it
says so and exits 0 (a user's clone has no ../shared).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PAIRS = {"en-de": ("en", "de"), "de-en": ("de", "en"), "en-fr": ("en", "fr")}
_MARIAN_COMMON = (
    "the same peak learning rate, warm-up and label smoothing, sentence batches grouped by length; decoded in "
    "input order with beam 4, length penalty 0.6, at most source + 50 tokens."
)
MARIAN_SETUPS = {
    "user": "MarianMT runs as a transformers user gets it: MarianConfig defaults apart from the dimensions and "
    "dropout (GELU, unscaled embeddings, init std 0.02), the Trainer's Adam (0.9, 0.999, 1e-8), " + _MARIAN_COMMON,
    "paper": "MarianMT runs with the paper's model and optimizer settings: ReLU, embeddings scaled by "
    "sqrt(d_model), Adam (0.9, 0.98, 1e-9) (init std 0.02, MarianConfig's), " + _MARIAN_COMMON,
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--pair", choices=sorted(PAIRS), default="en-de")
    parser.add_argument("--budget-minutes", type=float, default=25.0, help="training wall-clock budget per system")
    parser.add_argument("--output-dir", default="runs/multi30k")
    parser.add_argument("--systems", default="ours,marian", help="comma-separated: ours, marian")
    parser.add_argument("--vocab-size", type=int, default=10000, help="joint BPE vocabulary")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--dropout", type=float, default=0.3, help="Multi30k is small: the big model's 0.3")
    parser.add_argument("--max-tokens", type=int, default=2048, help="ours: padded tokens per batch and side")
    parser.add_argument("--peak-lr", type=float, default=7e-4)
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--checkpoint-minutes", type=float, default=1.0, help="ours: save this often, average the last")
    parser.add_argument("--average", type=int, default=5, help="ours: number of last checkpoints averaged")
    parser.add_argument("--decode-batch-size", type=int, default=64)
    parser.add_argument("--test-limit", type=int, help="decode only the first N test sentences (smoke runs)")
    parser.add_argument("--no-ctranslate2", action="store_true", help="skip the CTranslate2 decoding columns")
    parser.add_argument(
        "--marian-setup", choices=["user", "paper"], default="user",
        help="user: MarianConfig and Trainer defaults; paper: ReLU, embeddings scaled by sqrt(d_model), "
             "Adam (0.9, 0.98, 1e-9) -- the paper's model and optimizer in MarianMT's code",
    )
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Shared set-up: data and the one tokenizer both systems use
# ---------------------------------------------------------------------------------------------


def split_files(data_dir: Path, split: str, source: str, target: str) -> tuple[Path, Path]:
    return data_dir / f"{split}.{source}.gz", data_dir / f"{split}.{target}.gz"


def read_split(data_dir: Path, split: str, source: str, target: str) -> list[tuple[str, str]]:
    from vanilla_transformer.training import read_parallel

    return read_parallel(*split_files(data_dir, split, source, target))


def prepare_tokenizer(train_pairs, output_dir: Path, vocab_size: int) -> Path:
    import vanilla_transformer

    folder = output_dir / "tokenizer"
    tokenizer = vanilla_transformer.train_tokenizer((t for pair in train_pairs for t in pair), vocab_size=vocab_size)
    tokenizer.save_pretrained(folder)
    return folder


# ---------------------------------------------------------------------------------------------
# Training under a wall-clock budget
# ---------------------------------------------------------------------------------------------


def budget_callback(seconds: float, checkpoint_seconds: float | None):
    """Stops training when the budget is spent; optionally asks for a checkpoint every few minutes."""
    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()
            self.next_save = checkpoint_seconds

        def on_step_end(self, args, state, control, **kwargs):
            elapsed = time.perf_counter() - self.start
            if checkpoint_seconds and elapsed >= self.next_save:
                control.should_save = True
                self.next_save += checkpoint_seconds
            if elapsed >= seconds:
                control.should_training_stop = True
                control.should_save = bool(checkpoint_seconds)
            return control

    return TimeBudget()


class TokenCounter:
    """Wraps a collator and counts the target tokens (labels != -100) of every batch it builds."""

    def __init__(self, collator):
        self.collator, self.target_tokens = collator, 0

    def __call__(self, features):
        batch = self.collator(features)
        self.target_tokens += int((batch["labels"] != -100).sum())
        return batch


def peak_memory_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def validation_nll(trainer, dataset) -> float:
    """Per-token negative log-likelihood (no smoothing) on the validation set."""
    return trainer.evaluate(eval_dataset=dataset, metric_key_prefix="validation")["validation_loss"]


def choose_final_weights(prepared, args) -> dict:
    """Save the last weights, then the mean of the last checkpoints (§6.1) if it is better on validation.

    After a short budget the model is still improving fast, and a mean over checkpoints minutes apart
    can trail the last weights; the validation set (never the test set) decides.
    """
    from vanilla_transformer.training.run import save_final_model

    trainer, tokenizer, validation = prepared.trainer, prepared.tokenizer, prepared.datasets["validation"]
    save_final_model(trainer, tokenizer)
    if not args.average:
        return {"kind": "last"}
    trainer.args.prediction_loss_only = True  # validation loss only: no decoding needed here
    last_nll = validation_nll(trainer, validation)
    last_state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    save_final_model(trainer, tokenizer, average=args.average)  # writes the mean, loads it into the model
    averaged_nll = validation_nll(trainer, validation)
    if averaged_nll <= last_nll:
        return {"kind": f"mean of last {args.average} checkpoints", "validation_nll": averaged_nll, "last_nll": last_nll}
    trainer.model.load_state_dict(last_state)
    save_final_model(trainer, tokenizer)
    return {"kind": "last", "validation_nll": last_nll, "averaged_nll": averaged_nll}


def train_ours(args, tokenizer_dir: Path, data_dir: Path, run_dir: Path) -> dict:
    """train.py's run (`vanilla_transformer.training.run`) under the wall-clock budget."""
    import torch

    from vanilla_transformer.training import run

    source, target = PAIRS[args.pair]
    (train_source, train_target), (valid_source, valid_target) = (
        split_files(data_dir, split, source, target) for split in ("train", "val"))
    argv = [
        "--output_dir", str(run_dir), "--tokenizer_name_or_path", str(tokenizer_dir), "--preset", "base",
        "--train_source_file", str(train_source), "--train_target_file", str(train_target),
        "--validation_source_file", str(valid_source), "--validation_target_file", str(valid_target),
        "--config_overrides",
        f"d_model={args.d_model},encoder_layers={args.layers},decoder_layers={args.layers},"
        f"encoder_attention_heads={args.heads},decoder_attention_heads={args.heads},"
        f"encoder_ffn_dim={args.ffn},decoder_ffn_dim={args.ffn},dropout={args.dropout}",
        "--max_tokens", str(args.max_tokens), "--learning_rate", str(args.peak_lr),
        "--warmup_steps", str(args.warmup_steps), "--max_steps", "1000000",
        # saves come from the budget callback (every few minutes), not from a step count
        "--save_strategy", "steps", "--save_steps", str(10**9),
        "--save_total_limit", str(max(args.average, 1)), "--logging_steps", "50", "--report_to", "none",
        "--use_cpu", "--seed", str(args.seed), "--disable_tqdm", "true", "--eval_strategy", "no",
        "--per_device_eval_batch_size", "64",
    ]
    prepared = run.build_trainer(*run.parse_arguments(argv))
    trainer = prepared.trainer
    counter = trainer.data_collator = TokenCounter(trainer.data_collator)
    trainer.add_callback(budget_callback(args.budget_minutes * 60, args.checkpoint_minutes * 60))
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    result = {
        "steps": trainer.state.global_step, "train_seconds": seconds, "target_tokens": counter.target_tokens,
        "target_tokens_per_second": counter.target_tokens / seconds, "parameters": trainer.model.num_parameters(),
        "model_dir": str(run_dir), "train_peak_memory_mib": peak_memory_mib(),
    }  # measured before choose_final_weights' evaluations and averaging
    result["final_weights"] = choose_final_weights(prepared, args)
    return result


def train_marian(args, tokenizer_dir: Path, data_dir: Path, run_dir: Path) -> dict:
    import torch
    from transformers import (
        AutoTokenizer, DataCollatorForSeq2Seq, MarianConfig, MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments,
    )

    import vanilla_transformer  # noqa: F401  (the shared tokenizer's class)

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = MarianConfig(
        vocab_size=len(tokenizer), decoder_vocab_size=len(tokenizer), d_model=args.d_model,
        encoder_layers=args.layers, decoder_layers=args.layers, encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads, encoder_ffn_dim=args.ffn, decoder_ffn_dim=args.ffn,
        dropout=args.dropout, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id, forced_eos_token_id=None,
        **({"activation_function": "relu", "scale_embedding": True} if args.marian_setup == "paper" else {}),
    )
    torch.manual_seed(args.seed)
    model = MarianMTModel(config)
    train_pairs = read_split(data_dir, "train", *PAIRS[args.pair])
    encoded = tokenizer([s for s, _ in train_pairs], text_target=[t for _, t in train_pairs])
    examples = [{"input_ids": i, "labels": l} for i, l in zip(encoded["input_ids"], encoded["labels"])]
    mean_length = statistics.mean(max(len(e["input_ids"]), len(e["labels"])) for e in examples)
    batch_size = max(1, int(args.max_tokens / (mean_length * 1.1)))  # about as many tokens as ours
    training_args = Seq2SeqTrainingArguments(
        output_dir=str(run_dir), max_steps=1_000_000, per_device_train_batch_size=batch_size,
        learning_rate=args.peak_lr, lr_scheduler_type="inverse_sqrt", warmup_steps=args.warmup_steps,
        label_smoothing_factor=0.1, train_sampling_strategy="group_by_length", save_strategy="no",
        logging_steps=50, report_to="none", use_cpu=True, seed=args.seed, disable_tqdm=True,
        **({"adam_beta2": 0.98, "adam_epsilon": 1e-9} if args.marian_setup == "paper" else {}),
    )
    counter = TokenCounter(DataCollatorForSeq2Seq(tokenizer, model=model))
    trainer = Seq2SeqTrainer(
        model=model, args=training_args, train_dataset=examples, data_collator=counter, processing_class=tokenizer,
        callbacks=[budget_callback(args.budget_minutes * 60, None)],
    )
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    result = {
        "steps": trainer.state.global_step, "train_seconds": seconds, "target_tokens": counter.target_tokens,
        "target_tokens_per_second": counter.target_tokens / seconds, "parameters": model.num_parameters(),
        "model_dir": str(run_dir), "sentences_per_batch": batch_size, "train_peak_memory_mib": peak_memory_mib(),
    }
    model.save_pretrained(run_dir)
    tokenizer.save_pretrained(run_dir)
    return result


# ---------------------------------------------------------------------------------------------
# Decoding test_2016_flickr
# ---------------------------------------------------------------------------------------------


def timed_and_scored(translate_all, test_pairs) -> dict:
    """Time ``translate_all(sources) -> hypotheses`` over the test set and score it with sacreBLEU/chrF."""
    from vanilla_transformer.training import score

    sources, references = [list(side) for side in zip(*test_pairs)]
    started = time.perf_counter()
    hypotheses = translate_all(sources)
    seconds = time.perf_counter() - started
    return {**score(hypotheses, references), "decode_seconds": seconds, "sentences_per_second": len(sources) / seconds,
            "examples": hypotheses[:5]}


def paper_decoding(tokenizer, sources) -> dict:
    """generate() settings of our generation config, spelled out for a model that lacks it (MarianMT)."""
    longest = max(len(ids) for ids in tokenizer(sources)["input_ids"])
    return {"num_beams": 4, "length_penalty": 0.6, "early_stopping": True, "max_new_tokens": longest + 50}


def load_marian(model_dir: str):
    from transformers import AutoTokenizer, MarianMTModel

    import vanilla_transformer  # noqa: F401  (the shared tokenizer's class)

    return MarianMTModel.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def decode_ours(model_dir: str, test_pairs, batch_size: int) -> dict:
    """Our model through training/translate.py with its own generation config."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from vanilla_transformer.training import translate

    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    return timed_and_scored(lambda sources: translate(model, tokenizer, sources, batch_size=batch_size), test_pairs)


def decode_marian(model_dir: str, test_pairs, batch_size: int) -> dict:
    """MarianMT as a user decodes a test set: batches in input order, beam 4, lp 0.6, source + 50."""
    import torch

    model, tokenizer = load_marian(model_dir)

    def in_input_order(sources):
        hypotheses = []
        for start in range(0, len(sources), batch_size):
            batch = tokenizer(sources[start:start + batch_size], return_tensors="pt", padding=True)
            with torch.inference_mode():
                generated = model.generate(
                    **batch, num_beams=4, length_penalty=0.6, max_new_tokens=batch["input_ids"].shape[1] + 50
                )
            hypotheses += tokenizer.batch_decode(generated, skip_special_tokens=True)
        return hypotheses

    return timed_and_scored(in_input_order, test_pairs)


def decode_marian_sorted(model_dir: str, test_pairs, batch_size: int) -> dict:
    """MarianMT through training/translate.py: sorted batches, early stopping, source + 50."""
    from vanilla_transformer.training import translate

    model, tokenizer = load_marian(model_dir)
    return timed_and_scored(
        lambda sources: translate(model, tokenizer, sources, batch_size, **paper_decoding(tokenizer, sources)),
        test_pairs,
    )


def decode_same_weights(marian_dir: str, test_pairs, batch_size: int) -> dict:
    """The trained MarianMT weights imported into our model (vanilla_transformer.convert.from_marian) and
    decoded by both implementations the same way: any speed difference is the implementation's."""
    from vanilla_transformer.training import translate
    from vanilla_transformer.convert import from_marian

    marian, tokenizer = load_marian(marian_dir)
    result, outputs = {}, {}
    for name, model in (("marian", marian), ("ours", from_marian(marian_dir))):

        def translate_all(sources, model=model, name=name):
            outputs[name] = translate(model, tokenizer, sources, batch_size, **paper_decoding(tokenizer, sources))
            return outputs[name]

        result[name] = timed_and_scored(translate_all, test_pairs)
    result["identical_output"] = outputs["ours"] == outputs["marian"]
    return result


def decode_ctranslate2(model_dir: str, test_pairs, batch_size: int, quantization: str | None, work_dir: Path) -> dict:
    import ctranslate2
    from transformers import AutoTokenizer

    from vanilla_transformer.convert import to_ctranslate2

    export_dir = work_dir / f"ctranslate2-{quantization or 'float32'}"
    to_ctranslate2(model_dir, export_dir, quantization=quantization, force=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    translator = ctranslate2.Translator(str(export_dir), device="cpu", compute_type=quantization or "float32",
                                        inter_threads=1, intra_threads=os.cpu_count() or 1)

    def translate_all(sources):
        tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(sources)["input_ids"]]
        results = translator.translate_batch(
            tokens, max_batch_size=batch_size, beam_size=4, length_penalty=0.6, return_end_token=True,
            min_decoding_length=0, max_decoding_length=max(map(len, tokens)) + 50,
        )
        return [tokenizer.decode(tokenizer.convert_tokens_to_ids(r.hypotheses[0]), skip_special_tokens=True)
                for r in results]

    return timed_and_scored(translate_all, test_pairs)


# ---------------------------------------------------------------------------------------------
# One child process per system
# ---------------------------------------------------------------------------------------------


def run_system(name, args, tokenizer_dir: Path, data_dir: Path, test_pairs, output_dir: Path) -> dict:
    """Train then decode one system; runs in its own process (peak memory = this system's)."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    run_dir = output_dir / name
    trainer = {"ours": train_ours, "marian": train_marian}[name]
    result = trainer(args, tokenizer_dir, data_dir, run_dir)
    decoder = {"ours": decode_ours, "marian": decode_marian}[name]
    result["decode"] = decoder(result["model_dir"], test_pairs, args.decode_batch_size)
    result["peak_memory_mib"] = peak_memory_mib()
    if name == "marian":  # the same model decoded like ours: length-sorted batches, early stopping
        result["decode_sorted"] = decode_marian_sorted(result["model_dir"], test_pairs, args.decode_batch_size)
        result["same_weights"] = decode_same_weights(result["model_dir"], test_pairs, args.decode_batch_size)
    if name == "ours" and not args.no_ctranslate2:
        for quantization in (None, "int8"):
            key = f"ctranslate2_{quantization or 'float32'}"
            result[key] = decode_ctranslate2(result["model_dir"], test_pairs, args.decode_batch_size, quantization, output_dir)
    if name == "ours":
        write_card(result, args)
    return result


def write_card(result: dict, args) -> None:
    """The trained model's README.md: Hub metadata with the measured scores, the recipe, how to load it."""
    from vanilla_transformer.model_card import write_model_card

    source, target = PAIRS[args.pair]
    decode = result["decode"]
    metrics = [
        {"name": name, "type": kind, "value": round(decode[kind], 2), "dataset": "multi30k", "dataset_name": "Multi30k",
         "split": "test_2016_flickr", "signature": decode[f"{kind}_signature"]}
        for name, kind in (("sacreBLEU", "bleu"), ("chrF", "chrf"))
    ]
    write_model_card(
        result["model_dir"], languages=(source, target), model_name=f"vanilla-transformer Multi30k {args.pair}",
        datasets=["multi30k"], metrics=metrics,
        training_hyperparameters={
            "training time": f"{args.budget_minutes:g} min on {os.cpu_count()} CPU cores",
            "steps": result["steps"], "tokens per batch (max, padded)": args.max_tokens,
            "peak learning rate": args.peak_lr, "warm-up steps": args.warmup_steps, "dropout": args.dropout,
            "label smoothing": 0.1, "Adam": "(0.9, 0.98, 1e-9)", "final weights": result["final_weights"]["kind"],
        },
    )


def _child(queue, *arguments):
    try:
        queue.put(("ok", run_system(*arguments)))
    except BaseException as error:  # report to the parent instead of dying silently
        import traceback

        queue.put(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))


def run_in_child(*arguments) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(queue, *arguments))
    process.start()
    status, payload = queue.get()
    process.join()
    if status != "ok":
        raise RuntimeError(f"{arguments[0]} failed in its child process:\n{payload}")
    return payload


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    import torch
    import transformers

    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"Python {platform.python_version()}")


def markdown(results: dict) -> str:
    systems = results["systems"]
    rows = [
        "| | " + " | ".join(systems) + " |",
        "|---|" + "---|" * len(systems),
    ]

    def row(label, getter, fmt="{:.1f}"):
        cells = []
        for name in systems:
            try:
                cells.append(fmt.format(getter(systems[name])))
            except (KeyError, TypeError):
                cells.append("–")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    row("sacreBLEU (test_2016_flickr)", lambda r: r["decode"]["bleu"], "{:.2f}")
    row("chrF", lambda r: r["decode"]["chrf"], "{:.2f}")
    row("training steps", lambda r: r["steps"], "{:d}")
    row("target tokens / s (training)", lambda r: r["target_tokens_per_second"], "{:.0f}")
    row("beam-4 sentences / s (decoding)", lambda r: r["decode"]["sentences_per_second"], "{:.1f}")
    row("… decoded with translate.py (sorted, early stop): sentences / s", lambda r: r["decode_sorted"]["sentences_per_second"], "{:.1f}")
    row("… and its BLEU", lambda r: r["decode_sorted"]["bleu"], "{:.2f}")
    row("same weights (Marian's, imported): ours / Marian decoding speed",
        lambda r: r["same_weights"]["ours"]["sentences_per_second"] / r["same_weights"]["marian"]["sentences_per_second"],
        "{:.2f}")
    row("peak memory in training (MiB)", lambda r: r["train_peak_memory_mib"], "{:.0f}")
    row("peak memory overall (MiB)", lambda r: r["peak_memory_mib"], "{:.0f}")
    row("parameters", lambda r: r["parameters"], "{:,}")
    for key, label in (("ctranslate2_float32", "CTranslate2 float32"), ("ctranslate2_int8", "CTranslate2 int8")):
        if any(key in r for r in systems.values()):
            row(f"{label}: BLEU", lambda r, k=key: r[k]["bleu"], "{:.2f}")
            row(f"{label}: sentences / s", lambda r, k=key: r[k]["sentences_per_second"], "{:.1f}")
    signature = next(iter(systems.values()))["decode"]["bleu_signature"]
    lines = [
        f"Multi30k {results['pair']}, test_2016_flickr ({results['test_sentences']} sentences), "
        f"{results['budget_minutes']:g} min of training each, same tokenizer ({results['vocab_size']} joint BPE) "
        f"and dimensions (d_model {results['d_model']}, {results['layers']}+{results['layers']} layers, "
        f"{results['heads']} heads, FFN {results['ffn']}).",
        "",
        *rows,
        "",
        f"sacreBLEU signature: `{signature}`. Machine: {results['machine']}. Date: {results['date']}.",
        MARIAN_SETUPS[results["arguments"].get("marian_setup", "user")],
    ]
    if "ratios" in results:
        lines.append("Ratios (ours / MarianMT): " + ", ".join(f"{k} {v:.2f}" for k, v in results["ratios"].items()) + ".")
    return "\n".join(lines) + "\n"


def without_examples(result: dict) -> dict:
    return {k: without_examples(v) if isinstance(v, dict) else v for k, v in result.items() if k != "examples"}


def ratios(systems: dict) -> dict:
    ours, marian = systems.get("ours"), systems.get("marian")
    if not ours or not marian:
        return {}
    return {
        "BLEU difference": ours["decode"]["bleu"] - marian["decode"]["bleu"],
        "training tokens/s": ours["target_tokens_per_second"] / marian["target_tokens_per_second"],
        "decoding sentences/s": ours["decode"]["sentences_per_second"] / marian["decode"]["sentences_per_second"],
    }


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        print(f"Multi30k not found at {data_dir} (give --data-dir): nothing to benchmark.")
        return None
    source, target = PAIRS[args.pair]
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    train_pairs = read_split(data_dir, "train", source, target)
    test_pairs = read_split(data_dir, "test_2016_flickr", source, target)[: args.test_limit]
    tokenizer_dir = prepare_tokenizer(train_pairs, output_dir, args.vocab_size)
    systems = {}
    for name in args.systems.split(","):
        print(f"[{time.strftime('%H:%M:%S')}] {name}: training for {args.budget_minutes:g} min, then decoding", flush=True)
        systems[name] = run_in_child(name, args, tokenizer_dir, data_dir, test_pairs, output_dir)
        print(json.dumps(without_examples(systems[name]), indent=1, default=str), flush=True)
    results = {
        "pair": args.pair, "budget_minutes": args.budget_minutes, "vocab_size": args.vocab_size,
        "d_model": args.d_model, "layers": args.layers, "heads": args.heads, "ffn": args.ffn,
        "test_sentences": len(test_pairs), "machine": machine(), "date": time.strftime("%Y-%m-%d"),
        "arguments": vars(args), "systems": systems,
    }
    results["ratios"] = ratios(systems)
    (output_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    (output_dir / "results.md").write_text(markdown(results), encoding="utf-8")
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
