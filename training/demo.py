"""The main job: train a tokenizer and a small Transformer with training/train.py, then translate.

    python training/demo.py [--output-dir runs/demo] [--max-steps 1000]        # the generated task
    python training/demo.py --train_source_file my.en --train_target_file my.de \\
        [--validation_source_file ... --validation_target_file ...] [any train.py flag]
    python training/demo.py --dataset_name wmt14 --dataset_config_name de-en      # a Hub dataset, on request

By default the task is generated here (no download): English number words to German number
words, which needs reordering ("twenty-one" -> "einundzwanzig"). The demo writes it as TSV files,
trains through train.py with the paper's recipe (joint BPE, token-count batches, Adam 0.9/0.98/1e-9,
warm-up then inverse square root, label smoothing 0.1), saves the model in the Hub format, reloads
it with the Auto classes, reports exact match and BLEU on held-out data and prints beam-search
translations of sentences it never saw. Any flag the demo does not know goes to train.py.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import shutil
import time
from pathlib import Path

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from vanilla_transformer.command_line import exit_with_usage_error
from vanilla_transformer.training import run, score, translate
from vanilla_transformer.training.data import check_data_files
from vanilla_transformer.training.number_words import make_splits

# A 3+3-layer d=128 model on ~1k-token batches learns the task in ~1000 updates on 2 CPU cores. The
# paper's peak rate (d^-0.5 * 4000^-0.5) is tuned for 25k-token batches; for small batches a peak
# of 1e-3 with a short warm-up learns, the paper's collapses to one constant output.
DEMO_MODEL = "d_model=128,encoder_ffn_dim=512,decoder_ffn_dim=512,encoder_layers=3,decoder_layers=3,dropout=0.1"
USER_DATA_FLAGS = ("--train_source_file", "--train_file", "--dataset_name")


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Any other flag goes to `vanilla-transformer train` (its --help lists them): e.g. your own data with "
        "--train_source_file F --train_target_file F [--validation_source_file F --validation_target_file F].",
    )
    parser.add_argument(
        "--output-dir", "--output_dir", dest="output_dir", default="runs/demo", help="where the trained model is saved"
    )
    parser.add_argument("--train-size", type=int, default=6000, help="generated training pairs")
    parser.add_argument("--test-size", type=int, default=200, help="generated held-out pairs")
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=1024, help="padded tokens per batch and side")
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="peak learning rate, after warm-up")
    parser.add_argument("--warmup-steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_known_args(argv)


DEMO_MARK = ".made_by_demo"  # in the demo's run folder: a later demo replaces it (train.py keeps other models)


def start_afresh(output_dir: Path, replace: bool = True) -> None:
    """The run folder of an earlier demo is replaced (train.py refuses to train over a model), unless not to
    ``replace`` it (a resumed run); a new or empty folder is marked as the demo's; any other is left to train.py's
    checks."""
    if replace and (output_dir / DEMO_MARK).is_file():
        print(f"replacing the earlier demo's run in {output_dir}")
        shutil.rmtree(output_dir)
    if output_dir.is_dir() and any(output_dir.iterdir()):  # not the demo's: never marked for replacing
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / DEMO_MARK).write_text("made by training/demo.py, which replaces this folder when run again\n")


def write_number_words(folder: Path, args) -> tuple[Path, Path, list[tuple[str, str]]]:
    """The generated task as train/test TSV files; returns their paths and the held-out pairs."""
    train_pairs, test_pairs = make_splits(args.train_size, args.test_size, seed=args.seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, pairs in (("train", train_pairs), ("test", test_pairs)):
        path = folder / f"{name}.tsv"
        path.write_text("".join(f"{source}\t{target}\n" for source, target in pairs), encoding="utf-8")
        paths.append(path)
    print(f"data: {len(train_pairs)} training pairs, {len(test_pairs)} held-out, e.g. {train_pairs[0]}")
    return paths[0], paths[1], test_pairs


def train_arguments(args, extra: list[str], data_flags: list[str]) -> list[str]:
    """train.py flags: the demo's defaults first, so that the user's flags (later) win."""
    return [
        "--output_dir",
        args.output_dir,
        *data_flags,
        "--preset",
        "tiny",
        "--config_overrides",
        DEMO_MODEL,
        "--tokenizer_vocab_size",
        "400",
        "--max_steps",
        str(args.max_steps),
        "--max_tokens",
        str(args.max_tokens),
        "--learning_rate",
        str(args.learning_rate),
        "--warmup_steps",
        str(args.warmup_steps),
        "--max_grad_norm",
        "1.0",
        "--logging_steps",
        "100",
        "--save_strategy",
        "no",
        "--eval_strategy",
        "no",
        "--report_to",
        "none",
        "--seed",
        str(args.seed),
        "--use_cpu",
        *extra,
    ]


def report(model, tokenizer, pairs, exact_match: bool) -> None:
    """BLEU (and exact match for the generated task) of beam-search translations of held-out pairs."""
    sources, references = [list(side) for side in zip(*pairs)]
    hypotheses = translate(model, tokenizer, sources)
    scores = score(hypotheses, references, tokenize="char" if exact_match else None)
    if exact_match:
        exact = sum(h == r for h, r in zip(hypotheses, references)) / len(references)
        print(f"held-out exact match: {exact:.1%} on {len(references)} numbers never seen in training")
        print(f"held-out character BLEU: {scores['bleu']:.1f}  ({scores['bleu_signature']})")
    else:
        print(f"held-out BLEU: {scores['bleu']:.2f}  ({scores['bleu_signature']})")
    print(f"held-out chrF: {scores['chrf']:.1f}")
    print("beam-search translations of held-out sentences:")
    for source, reference, hypothesis in list(zip(sources, references, hypotheses))[:8]:
        mark = "ok" if hypothesis == reference else f"expected {reference}"
        print(f"  {source:45s} -> {hypothesis}   [{mark}]")


@contextlib.contextmanager
def quiet_logs():
    """No log line (warnings included) while the block runs; then the level that was disabled before."""
    before = logging.root.manager.disable
    logging.disable(max(before, logging.WARNING))
    try:
        yield
    finally:
        logging.disable(before)


def main(argv=None) -> None:
    started = time.time()
    args, extra = parse_args(argv)
    given = {a.split("=", 1)[0].replace("-", "_").replace("__", "--", 1) for a in extra if a.startswith("--")}
    user_data = bool(given & set(USER_DATA_FLAGS))  # either spelling: --train-source-file as --train_source_file
    data = Path(args.output_dir) / "data"
    argv_train = train_arguments(args, extra, [] if user_data else ["--train_file", str(data / "train.tsv")])
    try:  # a mistyped flag or a wrong file: refused before anything is replaced
        with quiet_logs():  # train parses and checks the flags again, and says what it warns of then
            model_args, data_args, training_args = run.parse_arguments(argv_train)
            run.check_arguments(model_args, data_args, training_args)  # every check that needs only the flags
        # every file the user named (the generated task's own is written below)
        check_data_files(data_args if user_data else dataclasses.replace(data_args, train_file=None))
    except (ValueError, OSError) as error:
        exit_with_usage_error("training/demo.py", error)
    # resuming continues the earlier demo's run, in its folder
    start_afresh(Path(args.output_dir), replace=not run.asks_to_resume(training_args.resume_from_checkpoint))
    test_pairs = None if user_data else write_number_words(data, args)[2]
    run.main(argv_train, exit_on_bad_input=True)

    output_dir = Path(args.output_dir)
    saved = sorted(p.name for p in output_dir.iterdir() if p.is_file() and p.name != DEMO_MARK)
    print(f"saved to {output_dir} ({', '.join(saved)})")
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(output_dir), AutoTokenizer.from_pretrained(output_dir)
    print(f"reloaded with the Auto classes: {type(model).__name__}, {type(tokenizer).__name__}")
    if test_pairs is None:  # the user's data: their validation set, if they gave one
        validation = run.load_text_datasets(data_args, seed=args.seed)["validation"]
        test_pairs = None if validation is None else list(zip(validation["source"], validation["target"]))
    if test_pairs:
        report(model, tokenizer, test_pairs, exact_match=not user_data)
    else:
        print("no validation data given (--validation_source_file/--validation_target_file): nothing held out to score")
    print(f"done in {time.time() - started:.0f}s")


if __name__ == "__main__":
    main()
