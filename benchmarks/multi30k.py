"""Multi30k: the paper's model with this package's small-data recipe vs the best-configured MarianMT,
same data, same dimensions, same CPU time budget, several runs.

    python benchmarks/multi30k.py --data-dir ../shared/data/multi30k [--pair en-de] [--runs 3] [--budget-minutes 25]
    python benchmarks/multi30k.py --data-dir ../shared/data/multi30k --levers      # ours alone, scored on val
    python benchmarks/multi30k.py --data-dir ../shared/data/multi30k --levers --lever "dropout 0.3" \
        --recipe-from runs/multi30k/results.json                                 # the recipe's row from a run
    python benchmarks/multi30k.py --data-dir ../shared/data/multi30k --averaging runs/levers6/lever-1
                                                          # no training: val for the mean of the last k checkpoints
                                                          # and for the run's own moving average at each of them
    python benchmarks/multi30k.py --data-dir ../shared/data/multi30k --length-penalties runs/multi30k/ours-1
                                                          # no training: val for each length penalty alpha
                                                          # (a MarianMT run's folder too: |Y|^alpha only)
    python benchmarks/multi30k.py --data-dir ../shared/data/multi30k --redecode runs/multi30k
                                                          # no training: that comparison's models of ours decoded
                                                          # again with the recipe's decoding, medians vs MarianMT's

Each system trains in its own child process (so peak memory is its own) for the same wall-clock
budget; the runs alternate between the systems so that slow drifts of the machine hit both. Each run
records how fast the machine multiplied float32 matrices before and after training and what share of
its CPUs other processes and the hypervisor took meanwhile (`machine_load`); the tables say when runs
compared across sessions had a slower or faster machine, and name a run that was disturbed.

- ours: ``training/train.py training/recipes/multi30k.yaml`` (`vanilla_transformer.training.run`),
  the recipe a user runs with one command: token-count batches, Adam (0.9, 0.98, 1e-9), eq. (3), per-
  token label smoothing 0.2, a moving average of the weights over every update as the final model
  (§6.1's checkpoint averaging at every update; ``--averaging`` scores the checkpoint means, and the
  average as it was at each checkpoint, so that runs that made different numbers of updates compare
  at an equal number); its own byte-level BPE; decoded with the model's generation config as the recipe sets it (§6.1's beam 4,
  GNMT's length penalty with alpha 0.6, at most source + 50 tokens), batches sorted by length.
- MarianMT ``--marian-setup tuned`` (the default): `MarianMTModel` as a careful transformers user
  configures it for this data: ReLU, scaled and tied embeddings, dropout 0.1, attention and activation
  dropout 0, a joint 8k BPE (``tokenizers``, Metaspace), sentence batches of 64 grouped by length, Adam
  (0.9, 0.98, 1e-9), peak learning rate 1e-3 after 800 warm-up steps then inverse square root, label
  smoothing 0.1, `Seq2SeqTrainer`. ``paper``: the paper's model and optimizer with our recipe's batch
  size and schedule; ``user``: MarianConfig's and the Trainer's defaults. Decoded with beam 4, length
  penalty 0.6 (transformers' |Y|^0.6), at most source + 50 tokens, batches sorted by length.

Scores: sacreBLEU and chrF on test_2016_flickr (and on val), through the package's one scorer.
``--levers`` trains ours once per recipe change (`LEVERS`) and scores val only: the recipe is tuned
on val, never on the test set. Writes results.json and results.md into --output-dir. Without the
data folder it says so and exits 0 (a user's clone has no ../shared).

This file holds the command line, what makes runs comparable, the sweeps without training and one function per
mode; `multi30k_systems.py` trains, decodes and scores each system, `multi30k_report.py` writes the tables.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import multi30k_systems
from common import PAIRS, add_data_dir, argument_parser, machine, multi30k_folder, read_split, run_in_child
from multi30k_report import (
    MARIAN_SETUPS,
    averaging_markdown,
    finished,
    length_penalty_markdown,
    levers_markdown,
    markdown,
    median,
    summary,
)
from multi30k_systems import BF16_FLAGS, MARIAN_TOKENIZER, OTHER_FORMULA, RECIPE

DIMENSIONS = dict(d_model=256, layers=3, heads=4, ffn=1024)
NO_EMA = ["--ema_decay", "0"]  # the recipe's moving average of the weights off
# One recipe change each, measured by --levers against the recipe as it is: (train.py flags, which
# override the YAML; config fields added to the recipe's --config_overrides).
LEVERS = {
    "recipe": ([], ""),
    "dropout 0.3": ([], "dropout=0.3"),
    "dropout 0.2": ([], "dropout=0.2"),
    "dropout 0.05": ([], "dropout=0.05"),
    "dropout 0": ([], "dropout=0.0"),
    "2048-token batches": (["--max_tokens", "2048"], ""),
    "512-token batches": (["--max_tokens", "512"], ""),
    "peak lr 1e-3": (["--learning_rate", "1e-3"], ""),
    "peak lr 3e-3": (["--learning_rate", "3e-3"], ""),
    "warm-up 400": (["--warmup_steps", "400"], ""),
    "warm-up 4000": (["--warmup_steps", "4000"], ""),
    "no checkpoint averaging": (NO_EMA + ["--average_checkpoints", "0"], ""),  # the last weights alone
    "moving average decay 0.999": (["--ema_decay", "0.999"], ""),
    "moving average decay 0.995": (["--ema_decay", "0.995"], ""),
    # §6.1's checkpoint means instead of the moving average (one checkpoint a minute, the last 10 kept)
    "checkpoints instead: linear weights over the last 10": (
        NO_EMA + ["--average_checkpoints", "10", "--average_weights", "linear"],
        "",
    ),
    "uniform weights: the mean of the last 10 (the paper's)": (NO_EMA + ["--average_checkpoints", "10"], ""),
    "average the last 5": (NO_EMA + ["--average_checkpoints", "5", "--save_total_limit", "5"], ""),
    "average the last 20": (NO_EMA + ["--average_checkpoints", "20", "--save_total_limit", "20"], ""),
    "a checkpoint every 30 s": (NO_EMA + ["--average_checkpoints", "10", "--save_minutes", "0.5"], ""),
    "gradient clipping 1.0": (["--max_grad_norm", "1.0"], ""),
    # §5.4's epsilon_ls = 0.1; the recipe's 0.2 (a lever against recipes before it, with --recipe-flag); more; none
    "label smoothing 0.1 (the paper's)": (["--label_smoothing_factor", "0.1"], ""),
    "label smoothing 0.2": (["--label_smoothing_factor", "0.2"], ""),
    "label smoothing 0.3": (["--label_smoothing_factor", "0.3"], ""),
    "label smoothing 0": (["--label_smoothing_factor", "0"], ""),
    # warm-up, stable, decay (Hägele et al., 2024): eq. (3), then linearly to 0 over the budget's last 5 minutes
    "cooldown: the last 5 minutes decay to 0": (["--cooldown_minutes", "5"], ""),
    "bf16 autocast": (BF16_FLAGS, ""),
    "vocabulary 16k": (["--tokenizer_vocab_size", "16000"], ""),
    "vocabulary 4k": (["--tokenizer_vocab_size", "4000"], ""),
    "Metaspace BPE 8k, MarianMT's tokenizer": (["--tokenizer_name_or_path", MARIAN_TOKENIZER], ""),
}
LENGTH_PENALTIES = (
    0.0,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    1.2,
    1.4,
    1.6,
    1.8,
    2.0,
    2.5,
    3.0,
    3.5,
    4.0,
    5.0,
)  # the paper's 0.6 and up


def parse_args(argv=None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    add_data_dir(parser)
    parser.add_argument("--pair", choices=sorted(PAIRS), default="en-de")
    parser.add_argument("--budget-minutes", type=float, default=25.0, help="training wall-clock budget per system")
    parser.add_argument("--runs", type=int, default=1, help="runs of each system (medians over them)")
    parser.add_argument("--output-dir", default="runs/multi30k")
    parser.add_argument("--systems", default="ours,marian", help="comma-separated: ours, marian")
    parser.add_argument("--marian-setup", choices=sorted(MARIAN_SETUPS), default="tuned")
    parser.add_argument("--marian-vocab-size", type=int, default=8000, help="MarianMT's joint Metaspace BPE")
    parser.add_argument("--levers", action="store_true", help="ours alone, once per recipe change in LEVERS, on val")
    parser.add_argument("--lever", action="append", help="with --levers: only these (names of LEVERS)")
    parser.add_argument(
        "--recipe-from",
        help="with --levers: the recipe's row from this comparison run's results.json "
        "(its ours run with --seed, else the one with the median val BLEU) instead of training it again",
    )
    parser.add_argument("--recipe-flag", action="append", default=[], help="extra train.py flag for ours (repeat)")
    parser.add_argument(
        "--averaging",
        metavar="RUN_DIR",
        help="no training: score val with the mean of the last k checkpoints of this run of ours, "
        "for every k it kept, uniform and linearly weighted (how many to average, and how, "
        "measured on one training trajectory)",
    )
    parser.add_argument(
        "--length-penalties",
        metavar="MODEL_DIR",
        help="no training: score val with this trained model of ours decoded at each length penalty "
        f"alpha in {LENGTH_PENALTIES}, under GNMT's formula and under transformers' |Y|^alpha "
        "(a MarianMT model of this benchmark: |Y|^alpha, the only one it has)",
    )
    parser.add_argument(
        "--redecode",
        metavar="RUN_DIR",
        help="no training: decode val and test again with each model of ours in this comparison "
        "(its results.json), with the decoding the recipe (and --recipe-flag) now sets, and "
        "compare the medians with its MarianMT runs as they were (training never decodes, so "
        "a decoding setting changes nothing else)",
    )
    parser.add_argument(
        "--marian-from",
        metavar="RESULTS_JSON",
        help="take MarianMT's runs from this comparison's results.json instead of training them again "
        "(refused unless MarianMT's settings, seeds included, are this run's; our recipe may differ)",
    )
    parser.add_argument("--decode-batch-size", type=int, default=64)
    parser.add_argument("--test-limit", type=int, help="decode only the first N sentences of val and test (smoke runs)")
    parser.add_argument(
        "--dimensions", default=None, help="smoke runs: d_model,layers,heads,ffn instead of 256,3,4,1024"
    )
    parser.add_argument("--seed", type=int, default=1, help="run i (from 1) trains with seed + i - 1")
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="both systems train under bfloat16 autocast (the Trainer's --bf16; weights, checkpoint "
        "averaging and decoding stay float32), for CPUs that multiply bfloat16 natively",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the comparison in --output-dir: keep its finished runs, train the missing ones "
        "(refused on another machine, torch or transformers than its own)",
    )
    parser.add_argument(
        "--redo",
        action="append",
        default=[],
        metavar="SYSTEM-RUN",
        help="with --resume: train this finished run again (e.g. ours-1, after the machine was "
        "disturbed during it); its old result and folder are kept under replaced",
    )
    args = parser.parse_args(argv)
    for name in ("budget_minutes", "runs", "marian_vocab_size", "decode_batch_size"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    unknown = sorted(set(args.lever or []) - set(LEVERS))
    if unknown:
        parser.error(f"unknown --lever {unknown}; choose from {sorted(LEVERS)}")
    if args.recipe_from and not (args.levers and Path(args.recipe_from).is_file()):
        parser.error(
            f"--recipe-from {args.recipe_from}: give it with --levers and the results.json of a run of "
            "this benchmark (e.g. runs/multi30k/results.json)"
        )
    for name in args.redo:
        system, _, run = name.rpartition("-")
        if not (args.resume and system in ("ours", "marian") and run.isdigit() and 1 <= int(run) <= args.runs):
            parser.error(f"--redo {name}: give it with --resume, as ours-N or marian-N with N from 1 to --runs")
    if args.marian_from and (
        args.levers or "marian" not in args.systems.split(",") or not Path(args.marian_from).is_file()
    ):
        parser.error(
            f"--marian-from {args.marian_from}: give it for a comparison that includes marian (not --levers), "
            "naming the results.json of an earlier comparison"
        )
    if args.averaging:
        from vanilla_transformer.training.checkpointing import checkpoint_folders

        if args.levers or args.marian_from or args.resume:
            parser.error("--averaging trains nothing: give it without --levers, --marian-from and --resume")
        if not checkpoint_folders(args.averaging):
            parser.error(
                f"--averaging {args.averaging}: give the folder of a run of ours that kept its checkpoint-<step> "
                "folders (e.g. runs/levers6/lever-1)"
            )
    if args.length_penalties:
        if args.levers or args.marian_from or args.resume or args.averaging:
            parser.error(
                "--length-penalties trains nothing: give it without --levers, --averaging, --marian-from and --resume"
            )
        if not (Path(args.length_penalties) / "config.json").is_file():
            parser.error(
                f"--length-penalties {args.length_penalties}: give the folder of a model this benchmark "
                "trained (e.g. runs/multi30k/ours-1 or marian-1, which hold config.json)"
            )
    if args.redecode:
        if args.levers or args.marian_from or args.resume or args.averaging or args.length_penalties:
            parser.error(
                "--redecode trains nothing: give it without --levers, --averaging, --length-penalties, "
                "--marian-from and --resume"
            )
        if not (Path(args.redecode) / "results.json").is_file():
            parser.error(
                f"--redecode {args.redecode}: give the --output-dir of a comparison run of this benchmark "
                "(it holds results.json); redecoded-<its settings>.json and .md go there"
            )
        earlier = json.loads((Path(args.redecode) / "results.json").read_text(encoding="utf-8"))
        missing = [
            run["model_dir"]
            for run in earlier.get("runs", {}).get("ours", [])
            if run is not None and not (Path(run["model_dir"]) / "config.json").is_file()
        ]
        if missing:  # folders are recorded relative to where the comparison ran
            parser.error(
                f"--redecode {args.redecode}: no model in {', '.join(missing)}; run from the folder the "
                "comparison ran in (its model folders are recorded relative to it)"
            )
    if args.resume and args.levers:
        parser.error("--resume continues a comparison run; --levers runs are repeated per --lever instead")
    args.dims = DIMENSIONS if args.dimensions is None else dict(zip(DIMENSIONS, map(int, args.dimensions.split(","))))
    return args


# ---------------------------------------------------------------------------------------------
# What makes runs comparable, and what a comparison keeps
# ---------------------------------------------------------------------------------------------


def refuse_unless_comparable(flag: str, path, earlier: dict, mine: dict, keys) -> None:
    """Runs from ``path`` join this run's only if they were trained here and with this run's ``keys`` of
    `settings`; refused, naming what differs, before any training. A time budget buys another number of
    updates on another CPU (or under another torch or transformers), so runs that mixed machines would
    compare the machines."""
    here = machine()
    if earlier.get("machine") != here:
        raise SystemExit(
            f"{flag} {path}: its runs were trained on {earlier.get('machine') or 'an unrecorded machine'}; "
            f"this is {here}. Under a time budget they do not compare: train them all on one "
            "machine (another --output-dir here, or finish the comparison where it began)"
        )
    theirs = earlier.get("settings", {})
    changed = sorted(key for key in keys if theirs.get(key) != mine.get(key))
    if changed:
        raise SystemExit(
            f"{flag} {path}: it was run with other settings ({', '.join(changed)}: "
            f"{ {key: theirs.get(key) for key in changed} }); give the same flags or another --output-dir"
        )


def settings(args) -> dict:
    """What must be equal for two runs to belong to one comparison (the recipe file by its hash)."""
    import hashlib

    return {
        "pair": args.pair,
        "budget_minutes": args.budget_minutes,
        "marian_setup": args.marian_setup,
        "marian_vocab_size": args.marian_vocab_size,
        "recipe_flag": args.recipe_flag,
        "dims": args.dims,
        "seed": args.seed,
        "test_limit": args.test_limit,
        "decode_batch_size": args.decode_batch_size,
        "recipe_sha256": hashlib.sha256(RECIPE.read_bytes()).hexdigest(),
        **({"bf16": True} if args.bf16 else {}),
    }  # absent when off: earlier results.json files have no such key


# What MarianMT's runs depend on: all the settings but our recipe (its flags and file).
MARIAN_SETTINGS = (
    "pair",
    "budget_minutes",
    "marian_setup",
    "marian_vocab_size",
    "dims",
    "seed",
    "test_limit",
    "decode_batch_size",
    "bf16",
)
# What a run of ours depends on, the seed aside (--levers picks the run of its own seed, or the median run).
OURS_SETTINGS = (
    "pair",
    "budget_minutes",
    "dims",
    "test_limit",
    "decode_batch_size",
    "bf16",
    "recipe_flag",
    "recipe_sha256",
)


def marian_runs_from(path: str, args) -> list[dict]:
    """MarianMT's runs of an earlier comparison, for a comparison that changes only our recipe: the baseline
    does not depend on it, and run i of each trains with seed + i - 1, so they are the runs this one would
    train. Refused when a MarianMT setting differs or the file holds fewer runs than --runs."""
    earlier = json.loads(Path(path).read_text(encoding="utf-8"))
    refuse_unless_comparable("--marian-from", path, earlier, settings(args), MARIAN_SETTINGS)
    runs = [run for run in earlier.get("runs", {}).get("marian", []) if run is not None]
    if len(runs) < args.runs:
        raise SystemExit(
            f"--marian-from {path}: it holds {len(runs)} MarianMT run(s); this comparison needs {args.runs}"
        )
    return [{**run, "from": path} for run in runs[: args.runs]]


def recipe_from(path: str, args) -> dict:
    """The recipe's lever row from an earlier comparison run: its ours run trained with ``args.seed``, the
    levers' seed, where it has one, else its run with the median val BLEU; refused when its runs of ours
    were trained otherwise (`OURS_SETTINGS`: its score would not compare).

    Training is deterministic for a seed (initialisation, data order, dropout masks), so a lever that
    leaves training alone (averaging, decoding) meets the very trajectory it is compared with, and any
    other lever differs from its recipe row in that lever only, not in the draw of a seed."""
    earlier = json.loads(Path(path).read_text(encoding="utf-8"))
    runs = [run for run in earlier.get("runs", {}).get("ours", []) if run is not None]
    refuse_unless_comparable("--recipe-from", path, earlier, settings(args), OURS_SETTINGS)
    if not runs:
        raise SystemExit(f"--recipe-from {path}: it holds no finished run of ours")
    same_seed = [run for run in runs if run.get("seed") == args.seed]
    chosen = same_seed[0] if same_seed else sorted(runs, key=lambda run: run["val"]["bleu"])[(len(runs) - 1) // 2]
    return {**chosen, "from": f"{path} ({chosen['model_dir']})"}


def earlier_runs(args, path: Path, systems: list[str]) -> tuple[dict[str, list[dict]], list[dict]]:
    """The runs already in --output-dir's results.json and those --redo replaced before: kept with
    --resume, refused without it (a finished comparison is hours of CPU; never overwritten silently)."""
    if not path.is_file():
        return {name: [] for name in systems}, []
    earlier = json.loads(path.read_text(encoding="utf-8"))
    if not args.resume:
        raise SystemExit(f"{path} already holds a comparison: give --resume to continue it, or another --output-dir")
    mine = settings(args)
    refuse_unless_comparable("--resume", path, earlier, mine, {*mine, *earlier.get("settings", {})})
    return {name: earlier.get("runs", {}).get(name, []) for name in systems}, earlier.get("replaced", [])


def replace_runs(redo: list[str], runs: dict[str, list], replaced: list[dict], output_dir: Path) -> list[dict]:
    """Empty the slots of the runs named by --redo, keeping each old result (appended to ``replaced``,
    results.json's "replaced") and its folder (renamed NAME.replaced-N): nothing measured is deleted."""
    for name in redo:
        system, _, run = name.rpartition("-")
        index = int(run) - 1
        if len(runs.get(system, [])) <= index or runs[system][index] is None:
            raise SystemExit(f"--redo {name}: {output_dir / 'results.json'} has no finished {name} to train again")
        folder = output_dir / name
        kept = output_dir / f"{name}.replaced-{len(replaced) + 1}"
        if folder.exists():
            folder.rename(kept)
        replaced.append(
            {**runs[system][index], "run": name, "folder_now": str(kept), "replaced": time.strftime("%Y-%m-%d %H:%M")}
        )
        runs[system][index] = None
    return replaced


def set_aside(run_dir: Path) -> Path:
    """A run's folder, empty: one left by a run that was stopped is renamed NAME.incomplete-N, never
    trained into (its checkpoints would join the new run's checkpoint average)."""
    if run_dir.exists():
        number = 1 + sum(1 for _ in run_dir.parent.glob(f"{run_dir.name}.incomplete-*"))
        run_dir.rename(run_dir.with_name(f"{run_dir.name}.incomplete-{number}"))
    return run_dir


# ---------------------------------------------------------------------------------------------
# Without training: sweeps over one run's checkpoints or one model's decoding
# ---------------------------------------------------------------------------------------------


def averaging_sweep(args, data_dir: Path) -> dict:
    """Val BLEU and chrF of the mean of the last k checkpoints of one run, k = 1 .. all it kept (§6.1
    averages the last 5 or 20), with uniform weights (the paper's) and linear ones (the k-th weighs k).
    One trajectory, so the rows differ in the averaging alone."""
    import tempfile

    from vanilla_transformer.training import average_checkpoints
    from vanilla_transformer.training.averaging import AVERAGING_WEIGHTS
    from vanilla_transformer.training.checkpointing import CHECKPOINT_NAME, complete_checkpoints
    from vanilla_transformer.training.moving_average import EMA_FILE

    def step(folder: Path) -> int:
        return int(CHECKPOINT_NAME.fullmatch(folder.name).group(1))

    run_dir = Path(args.averaging)
    checkpoints = complete_checkpoints(run_dir)  # oldest first; incomplete ones are named in the log
    if not checkpoints:
        raise SystemExit(f"--averaging {run_dir}: none of its checkpoint-<step> folders holds a complete model")
    pairs = read_split(data_dir, "val", args.pair, args.test_limit)
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for last in range(1, len(checkpoints) + 1):
            chosen = checkpoints[-last:]
            rows[last] = {"first_step": step(chosen[0])}
            for weights in AVERAGING_WEIGHTS if last > 1 else AVERAGING_WEIGHTS[:1]:  # one checkpoint: one model
                model_dir = average_checkpoints(chosen, Path(folder) / f"last-{last}-{weights}", weights)
                scored = without_examples(
                    multi30k_systems.decode_and_score("ours", str(model_dir), pairs, args.decode_batch_size)
                )
                rows[last]["val" if weights == "uniform" else f"val, {weights} weights"] = scored
                print(
                    f"last {last} (from step {rows[last]['first_step']}), {weights} weights: val BLEU "
                    f"{scored['bleu']:.2f}",
                    flush=True,
                )
            if (chosen[0] / EMA_FILE).is_file():  # the run's own moving average at that checkpoint's update
                model_dir = moving_average_model(chosen[0], Path(folder) / f"moving-average-{last}")
                scored = without_examples(
                    multi30k_systems.decode_and_score("ours", str(model_dir), pairs, args.decode_batch_size)
                )
                rows[last]["val, moving average"] = scored
                print(
                    f"the moving average at step {rows[last]['first_step']}: val BLEU {scored['bleu']:.2f}", flush=True
                )
    return {"run": str(run_dir), "pair": args.pair, "last_step": step(checkpoints[-1]), "rows": rows}


def moving_average_model(checkpoint: Path, folder: Path) -> Path:
    """A model folder holding the moving average of the weights that ``checkpoint`` saved (`--ema_decay`),
    with the checkpoint's tokenizer and generation config: the final model the run would have had, had it
    stopped at that update."""
    from transformers import AutoModelForSeq2SeqLM

    from vanilla_transformer.training import ExponentialMovingAverage
    from vanilla_transformer.training.averaging import copy_side_files

    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
    ExponentialMovingAverage.from_checkpoint(checkpoint).copy_to(model)
    model.save_pretrained(folder)
    copy_side_files(checkpoint, folder)  # tokenizer and generation settings, byte for byte
    return folder


def length_penalty_sweep(args, data_dir: Path) -> dict:
    """Val BLEU and chrF of one trained model decoded at each length penalty alpha (beam 4, as its generation
    config), under GNMT's ((5 + |Y|) / 6)^alpha (§6.1's, citing Wu et al. 2016) and transformers' |Y|^alpha.
    One model, so the rows differ in the penalty alone; alpha 0 is the same search under both."""
    model_dir = str(args.length_penalties)
    pairs = read_split(data_dir, "val", args.pair, args.test_limit)
    system = (
        "marian" if json.loads((Path(model_dir) / "config.json").read_text()).get("model_type") == "marian" else "ours"
    )
    rows = {}
    for formula in OTHER_FORMULA if system == "ours" else ["length"]:  # MarianMT has transformers' penalty only
        for alpha in LENGTH_PENALTIES:
            formula_setting = {"length_penalty_formula": formula} if system == "ours" else {}
            scored = multi30k_systems.decode_and_score(
                system, model_dir, pairs, args.decode_batch_size, length_penalty=alpha, **formula_setting
            )
            rows[f"{formula} {alpha}"] = {"formula": formula, "alpha": alpha, "val": without_examples(scored)}
            print(f"{formula} alpha {alpha}: val BLEU {scored['bleu']:.2f}, chrF {scored['chrf']:.2f}", flush=True)
    return {"model": model_dir, "system": system, "pair": args.pair, "rows": rows}


def recipe_decoding(args) -> dict:
    """The decoding settings train.py saves in the model's generation config with the recipe and --recipe-flag
    (``--length_penalty``, ``--length_penalty_formula``); absent: the model's own (§6.1's)."""
    from vanilla_transformer.training.run import parse_arguments

    model_args = parse_arguments([str(RECIPE), *args.recipe_flag])[0]
    return {
        name: getattr(model_args, name)
        for name in ("length_penalty", "length_penalty_formula")
        if getattr(model_args, name) is not None
    }


def redecode(args, data_dir: Path) -> dict:
    """An earlier comparison with its models of ours decoded again under `recipe_decoding` (val and test,
    and the other formula at the same alpha, as `run_system` decodes); its MarianMT runs and everything
    the runs of ours measured in training stay as they were."""
    earlier = json.loads((Path(args.redecode) / "results.json").read_text(encoding="utf-8"))
    decoding = recipe_decoding(args)
    runs = {"ours": [], "marian": earlier["runs"].get("marian", [])}
    for run in finished(earlier["runs"])["ours"]:
        again = {key: value for key, value in run.items() if not (key.startswith("val") or key.startswith("test"))}
        for key, split in (("val", "val"), ("test", "test_2016_flickr")):
            pairs = read_split(data_dir, split, earlier["pair"], earlier["settings"]["test_limit"])
            scored = multi30k_systems.decode_ours(key, run["model_dir"], pairs, args.decode_batch_size, **decoding)
            again.update({name: without_examples(result) for name, result in scored.items()})
            print(f"{run['model_dir']} {key}: BLEU {again[key]['bleu']:.2f} (was {run[key]['bleu']:.2f})", flush=True)
        runs["ours"].append({**again, "decoding": decoding, "decoded_before": {k: run[k] for k in ("val", "test")}})
    return {
        **earlier,
        "runs": runs,
        "medians": summary(runs),
        "redecoded": {
            "from": str(args.redecode),
            "decoding": decoding,
            "date": time.strftime("%Y-%m-%d"),
            "machine": machine(),
        },
    }


def write_sweep(output_dir: Path, kind: str, folder: str, sweep: dict, markdown_of) -> dict:
    """A sweep without training as KIND-PARENT-NAME.json and .md in the output folder; the table printed."""
    name = f"{kind}-{Path(folder).parent.name}-{Path(folder).name}"
    (output_dir / f"{name}.json").write_text(json.dumps(sweep, indent=2) + "\n", encoding="utf-8")
    (output_dir / f"{name}.md").write_text(markdown_of(sweep), encoding="utf-8")
    print(markdown_of(sweep))
    return sweep


def without_examples(result: dict) -> dict:
    return {k: without_examples(v) if isinstance(v, dict) else v for k, v in result.items() if k != "examples"}


# ---------------------------------------------------------------------------------------------
# The modes
# ---------------------------------------------------------------------------------------------


def write_results(output_dir: Path, name: str, results: dict) -> None:
    (output_dir / f"{name}.json").write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")


def averaging(args, data_dir: Path, output_dir: Path) -> dict:
    """--averaging: val of the last k checkpoints of one run averaged."""
    return write_sweep(output_dir, "averaging", args.averaging, averaging_sweep(args, data_dir), averaging_markdown)


def length_penalties(args, data_dir: Path, output_dir: Path) -> dict:
    """--length-penalties: val of one model at each length penalty."""
    return write_sweep(
        output_dir,
        "length-penalties",
        args.length_penalties,
        length_penalty_sweep(args, data_dir),
        length_penalty_markdown,
    )


def redecoded(args, data_dir: Path, output_dir: Path) -> dict:
    """--redecode: a comparison's models of ours decoded again, beside its MarianMT runs; written into its folder."""
    results, folder = redecode(args, data_dir), Path(args.redecode)
    before = median([run["decoded_before"]["test"]["bleu"] for run in results["runs"]["ours"]])
    text = markdown(results) + (
        f"\nModels of ours from {folder}, decoded again with the recipe's "
        f"{results['redecoded']['decoding'] or 'generation config (unchanged)'} "
        f"({results['redecoded']['date']}; their test median was {before:.2f}); training "
        "never decodes, so nothing else about them differs.\n"
    )
    decoding = results["redecoded"]["decoding"]
    name = "redecoded-" + ("-".join(str(decoding[key]) for key in sorted(decoding)) or "generation-config")
    write_results(folder, name, results)
    (folder / f"{name}.md").write_text(text, encoding="utf-8")
    print(text)
    return results


def levers(args, data_dir: Path, output_dir: Path) -> dict:
    """--levers: ours once per recipe change, scored on val; levers.json after each, levers.md at the end."""
    results = {**header(args, data_dir), "levers": {}}
    if args.recipe_from:
        results["levers"]["recipe"] = recipe_from(args.recipe_from, args)
    for name in [name for name in args.lever or LEVERS if name not in results["levers"]]:
        print(f"[{time.strftime('%H:%M:%S')}] lever {name!r}: {LEVERS[name]}", flush=True)
        run_dir = output_dir / f"lever-{len(results['levers'])}"
        results["levers"][name] = run_in_child(
            multi30k_systems.run_system, "ours", args, data_dir, run_dir, LEVERS[name]
        )
        print(json.dumps(without_examples(results["levers"][name]), default=str), flush=True)
        write_results(output_dir, "levers", results)
    (output_dir / "levers.md").write_text(levers_markdown(results), encoding="utf-8")
    print(levers_markdown(results))
    return results


def comparison(args, data_dir: Path, output_dir: Path) -> dict:
    """The default: each system --runs times, alternating which trains first; results.json after each run
    (what --resume continues), results.md at the end."""
    systems = args.systems.split(",")
    results = {**header(args, data_dir), "settings": settings(args)}
    results["runs"], replaced = earlier_runs(args, output_dir / "results.json", systems)
    if args.marian_from:
        results["runs"]["marian"] = marian_runs_from(args.marian_from, args)
    results["replaced"] = replace_runs(args.redo, results["runs"], replaced, output_dir)
    results["medians"] = summary(results["runs"])
    if args.redo:  # the emptied slots and the kept results, on disk before any training
        write_results(output_dir, "results", results)
    for index in range(args.runs):
        order = systems if index % 2 == 0 else systems[::-1]  # alternate who trains first
        for name in order:
            if len(results["runs"][name]) > index and results["runs"][name][index] is not None:
                continue  # finished in an earlier invocation (--resume)
            print(f"[{time.strftime('%H:%M:%S')}] run {index + 1}: {name}, {args.budget_minutes:g} min", flush=True)
            run_args = argparse.Namespace(**{**vars(args), "seed": args.seed + index})  # runs differ in seed
            run_dir = set_aside(output_dir / f"{name}-{index + 1}")
            result = run_in_child(multi30k_systems.run_system, name, run_args, data_dir, run_dir, LEVERS["recipe"])
            result.update(seed=run_args.seed, finished=time.strftime("%Y-%m-%d %H:%M"))
            if len(results["runs"][name]) > index:  # the slot --redo emptied
                results["runs"][name][index] = result
            else:
                results["runs"][name].append(result)
            print(json.dumps(without_examples(result), default=str), flush=True)
            results["medians"] = summary(results["runs"])
            write_results(output_dir, "results", results)
    (output_dir / "results.md").write_text(markdown(results), encoding="utf-8")
    print(markdown(results))
    return results


def header(args, data_dir: Path) -> dict:
    """What every results file of a training mode begins with."""
    return {
        "pair": args.pair,
        "budget_minutes": args.budget_minutes,
        "marian_setup": args.marian_setup,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "arguments": vars(args),
        "test_sentences": len(read_split(data_dir, "test_2016_flickr", args.pair, args.test_limit)),
    }


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    data_dir = multi30k_folder(args.data_dir)
    if data_dir is None:
        return None
    output_dir = Path(args.output_dir)
    if not args.redecode:  # --redecode writes into the comparison's own folder
        output_dir.mkdir(parents=True, exist_ok=True)
    mode = (
        averaging
        if args.averaging
        else length_penalties
        if args.length_penalties
        else redecoded
        if args.redecode
        else levers
        if args.levers
        else comparison
    )
    return mode(args, data_dir, output_dir)


if __name__ == "__main__":
    main()
