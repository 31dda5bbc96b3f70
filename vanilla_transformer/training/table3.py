"""Table 3 of the paper in one command: the base model and each of its variations, trained and scored alike.

"To evaluate the importance of different components of the Transformer, we varied our base model in
different ways, measuring the change in performance on English-to-German translation on the development
set, newstest2013. We used beam search as described in the previous section, but no checkpoint
averaging." (§6.2). Rows (A) vary the heads at constant computation, (B) shrink d_k, (C) change N,
d_model and d_ff, (D) dropout and label smoothing, (E) learned positional embeddings; ``big`` is the big
model (not run unless named).

Each row is the paper's change applied to the recipe's base model, scaled to it: every listed value
keeps its ratio to the paper's base (N 2 of 6 is a third of the recipe's layers, d_ff 1024 of 2048 half
its d_ff, P_drop 0.2 twice its dropout, h 1 of 8 an eighth of its heads), rounded to a whole number of
at least 1 where it counts something; d_k follows d_model / h where the paper's row keeps h d_k = d_model
(A, and C's d_model rows). At the paper's base this gives the paper's settings, but for d_v in rows B (the
config's one head_dim is d_k = d_v). Positions are the base's in every row but (E).

Every row is an ordinary run of ``vanilla-transformer train`` (`run.main` with a list of flags) in
``OUTPUT/ROW/seed-S``: the same updates (``--max-steps``), data and tokenizer (trained once, in
``OUTPUT/tokenizer``), the model's §6.1 beam search, no averaging, scored on the validation set only.
A row whose folder holds its result is not run again; one with checkpoints resumes from the last; a
failed row is reported and the others go on. The table (``table3.md``, paper's layout, the paper's
numbers and each row's change from base beside ours), ``table3.json`` and ``table3.png`` (the change in
BLEU per row, with the seed spread) go to ``OUTPUT``.

    vanilla-transformer table3 multi30k --max-steps 20000 --seeds 3 --output-dir runs/table3
    vanilla-transformer table3 multi30k --max-steps 20000 --rows A,B1,E --devices 0,1,2,3 \\
        --dataset_name none --train_source_file train.en --train_target_file train.de \\
        --validation_source_file val.en --validation_target_file val.de
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import hashlib
import json
import logging
import math
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from ..checkpoint_files import MODEL_WEIGHTS
from ..command_line import PROG, did_you_mean, install_command, with_dashes
from . import run
from .checkpointing import PARENT_PID_VARIABLE, RESUME_HINT, checkpoint_folders
from .options import (
    ARGUMENT_FILE_SUFFIXES,
    TRAIN_LOGGER,
    check_arguments,
    check_steps_have_data,
    model_config,
    parse_arguments,
    parse_overrides,
    read_argument_file,
    recipe_or_error,
    steps_to_run,
    validation_given,
)

RESULT_FILE = "table3_row.json"  # in a row's run folder once it is trained and scored: the row is finished
FLAGS_FILE = "table3_flags.json"  # in a row's run folder from its start: a later run must have the same flags
LOG_FILE = "train.log"  # a row's output when it runs in a process of its own (--devices)


# ---------------------------------------------------------------------------------------------
# The paper's Table 3 (Vaswani et al., 2017): listed values only; None is "identical to the base model"
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PaperRow:
    """One row of Table 3 as printed: the values it lists, and the paper's results (dev = newstest2013)."""

    name: str
    ppl: float  # per wordpiece
    bleu: float
    params: int | None = None  # x10^6, where the paper lists them
    N: int | None = None
    d_model: int | None = None
    d_ff: int | None = None
    h: int | None = None
    d_k: int | None = None
    d_v: int | None = None
    dropout: float | None = None  # P_drop
    label_smoothing: float | None = None  # epsilon_ls
    positions: str | None = None  # "learned": row (E), "positional embedding instead of sinusoids"
    train_steps: int | None = None

    @property
    def group(self) -> str:
        return self.name.rstrip("0123456789")


PAPER_BASE = PaperRow(
    "base",
    4.92,
    25.8,
    65,
    N=6,
    d_model=512,
    d_ff=2048,
    h=8,
    d_k=64,
    d_v=64,
    dropout=0.1,
    label_smoothing=0.1,
    positions="sinusoidal",
    train_steps=100_000,
)
PAPER_ROWS = {
    row.name: row
    for row in (
        PAPER_BASE,
        PaperRow("A1", 5.29, 24.9, h=1, d_k=512, d_v=512),
        PaperRow("A2", 5.00, 25.5, h=4, d_k=128, d_v=128),
        PaperRow("A3", 4.91, 25.8, h=16, d_k=32, d_v=32),
        PaperRow("A4", 5.01, 25.4, h=32, d_k=16, d_v=16),
        PaperRow("B1", 5.16, 25.1, 58, d_k=16),
        PaperRow("B2", 5.01, 25.4, 60, d_k=32),
        PaperRow("C1", 6.11, 23.7, 36, N=2),
        PaperRow("C2", 5.19, 25.3, 50, N=4),
        PaperRow("C3", 4.88, 25.5, 80, N=8),
        PaperRow("C4", 5.75, 24.5, 28, d_model=256, d_k=32, d_v=32),
        PaperRow("C5", 4.66, 26.0, 168, d_model=1024, d_k=128, d_v=128),
        PaperRow("C6", 5.12, 25.4, 53, d_ff=1024),
        PaperRow("C7", 4.75, 26.2, 90, d_ff=4096),
        PaperRow("D1", 5.77, 24.6, dropout=0.0),
        PaperRow("D2", 4.95, 25.5, dropout=0.2),
        PaperRow("D3", 4.67, 25.3, label_smoothing=0.0),
        PaperRow("D4", 5.47, 25.7, label_smoothing=0.2),
        PaperRow("E", 4.92, 25.7, positions="learned"),
        PaperRow("big", 4.33, 26.4, 213, N=6, d_model=1024, d_ff=4096, h=16, dropout=0.3, train_steps=300_000),
    )
}
DEFAULT_ROWS = [name for name in PAPER_ROWS if name != "big"]  # the big model: only when named (3x the budget)


# ---------------------------------------------------------------------------------------------
# A row applied to the recipe's base model
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variation:
    """What a row changes in a run: config fields (as --config_overrides takes them) and training flags."""

    config: dict
    label_smoothing: float
    max_steps: int


def _count(base: int, ratio: Fraction) -> int:
    """A size kept at the paper's ratio, rounded half up to a whole number of at least 1."""
    return max(1, math.floor(base * ratio + Fraction(1, 2)))


def _rate(base: float, ratio: Fraction) -> float:
    return float(Fraction(str(base)) * ratio)


def variation(row: PaperRow, config, label_smoothing: float, max_steps: int) -> Variation:
    """``row`` applied to a base model (its ``config``, label smoothing and updates), each listed value at the
    paper's ratio to its base (see the module's docstring); unlisted values stay the base's."""
    paper, changes = PAPER_BASE, {}
    if row.N is not None:
        for side in ("encoder_layers", "decoder_layers"):
            changes[side] = _count(getattr(config, side), Fraction(row.N, paper.N))
    if row.d_model is not None:
        changes["d_model"] = _count(config.d_model, Fraction(row.d_model, paper.d_model))
    if row.d_ff is not None:
        for side in ("encoder_ffn_dim", "decoder_ffn_dim"):
            changes[side] = _count(getattr(config, side), Fraction(row.d_ff, paper.d_ff))
    if row.h is not None:
        for side in ("encoder_attention_heads", "decoder_attention_heads"):
            changes[side] = _count(getattr(config, side), Fraction(row.h, paper.h))
    if row.d_k is not None and not (config.head_dim is None and _keeps_computation(row)):
        # (B), or a base with its own head_dim: d_k at the paper's ratio (the config's head_dim is d_k = d_v)
        base_head_dim = config.head_dim or config.d_model // config.encoder_attention_heads
        changes["head_dim"] = _count(base_head_dim, Fraction(row.d_k, paper.d_k))
    if row.dropout is not None:
        changes["dropout"] = _rate(config.dropout, Fraction(str(row.dropout)) / Fraction(str(paper.dropout)))
    if row.positions not in (None, paper.positions, config.position_embedding_type):  # (E); others keep the base's
        changes["position_embedding_type"] = row.positions
    smoothing = (
        label_smoothing
        if row.label_smoothing is None
        else _rate(label_smoothing, Fraction(str(row.label_smoothing)) / Fraction(str(paper.label_smoothing)))
    )
    steps = max_steps if row.train_steps is None else _count(max_steps, Fraction(row.train_steps, paper.train_steps))
    return Variation(changes, smoothing, steps)


def _keeps_computation(row: PaperRow) -> bool:
    """Whether the row's d_k is d_model / h (rows A and C's d_model rows), so that head_dim follows by itself."""
    return row.d_k * (row.h or PAPER_BASE.h) == (row.d_model or PAPER_BASE.d_model)


def select_rows(text: str | None) -> list[str]:
    """``--rows``: row names (A1, C4, big, ...) and groups (A ... E), base always first, in the paper's order."""
    if text is None:
        return DEFAULT_ROWS
    groups = {row.group for row in PAPER_ROWS.values() if row.group not in {"base", "big"}}
    wanted = {"base"}
    for name in filter(None, (part.strip() for part in text.split(","))):
        if name in PAPER_ROWS:
            wanted.add(name)
        elif name.upper() in groups:
            wanted |= {row for row in PAPER_ROWS if PAPER_ROWS[row].group == name.upper()}
        else:
            raise ValueError(
                f"--rows {name!r} is not a row of Table 3{did_you_mean(name, [*PAPER_ROWS, *sorted(groups)])}; "
                f"the rows are {', '.join(PAPER_ROWS)}, and the groups {', '.join(sorted(groups))}."
            )
    return [name for name in PAPER_ROWS if name in wanted]


# ---------------------------------------------------------------------------------------------
# The plan: the recipe as every row trains it, and each row's flags
# ---------------------------------------------------------------------------------------------

# Flags of `train` that Table 3 sets itself, and why.
OWN_FLAGS = {
    "max_train_minutes": "every row trains --max-steps updates (Table 3 compares rows at equal updates)",
    "cooldown_minutes": "every row trains --max-steps updates (Table 3 compares rows at equal updates)",
    "ema_decay": "Table 3 uses no averaging of weights (§6.2)",
    "average_checkpoints": "Table 3 uses no checkpoint averaging (§6.2)",
    "average_weights": "Table 3 uses no checkpoint averaging (§6.2)",
    "do_train": "every row is trained, then scored on the validation set",
    "do_eval": "every row is trained, then scored on the validation set",
    "do_predict": "rows are scored on the validation set, never on the test set",
    "test_file": "rows are scored on the validation set, never on the test set",
    "test_source_file": "rows are scored on the validation set, never on the test set",
    "test_target_file": "rows are scored on the validation set, never on the test set",
    "test_split": "rows are scored on the validation set, never on the test set",
    "resume_from_checkpoint": "a row with checkpoints resumes from the last one by itself",
    "model_name_or_path": "every row is a new model from the recipe's base",
    "load_best_model_at_end": "each row is scored with its last weights, not a checkpoint chosen on the same set",
    "max_eval_samples": "each row is scored on the whole validation set",
    "tokenizer_only": "table3 trains the one tokenizer every row loads itself, in OUTPUT/tokenizer",
}
# Of those, what a recipe file may not set either (table3 leaves out or sets the others itself).
REFUSED_IN_RECIPE = ("resume_from_checkpoint", "model_name_or_path", "tokenizer_only")
# Keys of the recipe that the rows leave out or set (the row's own flags come after).
RECIPE_SETTINGS = {
    "ema_decay": 0.0,
    "average_checkpoints": 0,
    "do_train": True,
    "do_eval": True,
    "do_predict": False,
    "eval_strategy": "no",
    "load_best_model_at_end": False,
}
# What a row's scores depend on that its flags only name: the data files (their size and modification time,
# as the data caches key them), and for the shared tokenizer also the flags that choose its training text.
DATA_FILES = (
    "train_source_file",
    "train_target_file",
    "train_file",
    "validation_source_file",
    "validation_target_file",
    "validation_file",
)
TOKENIZER_TEXT = (
    "dataset_name",
    "dataset_config_name",
    "train_split",
    "train_file",
    "train_source_file",
    "train_target_file",
    "source_column",
    "target_column",
    "source_lang",
    "target_lang",
    "max_train_samples",
    "validation_size",
)
TOKENIZER_RECORD = "table3_tokenizer.json"  # in OUTPUT/tokenizer: the settings and data it was trained with
RECIPE_DROPPED = (
    "max_train_minutes",
    "cooldown_minutes",
    "output_dir",
    "test_file",
    "test_source_file",
    "test_target_file",
    "test_split",
    "max_predict_samples",
    "max_eval_samples",
    "average_weights",
)


@dataclass
class Job:
    """One seed of one row: its flags for ``vanilla-transformer train`` and its run folder."""

    row: str
    seed: int
    folder: Path
    flags: list[str]
    variation: Variation
    data: dict | None = None  # `data_files`: None where unknown (records of earlier releases)


def refuse_own_flags(train_flags: list[str]) -> None:
    for token in train_flags:
        name = token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") else None
        if name in OWN_FLAGS:
            raise ValueError(f"--{name} is set by table3 for every row: {OWN_FLAGS[name]}; leave it out.")


def data_files(data_args, names=DATA_FILES) -> dict:
    """``{flag: [path, bytes, modified (ns)]}`` of each data file the flags name (a missing one: train names it)."""
    files = {}
    for name in names:  # of the flags that choose the text, the ones naming a file (not a count, a column)
        if isinstance(path := getattr(data_args, name, None), str) and path and Path(path).is_file():
            stat = os.stat(path)
            files[f"--{name}"] = [str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns]
    return files


@functools.cache
def content_hash(path: str, size: int, modified: int) -> str:
    """SHA-256 of a data file (once per file and version in a process): recorded with a row, so that a file
    whose modification time alone changed (copied, touched, extracted again) is known to be the same."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def recorded(files: dict) -> dict:
    """`data_files` as a record holds them: with each file's content hash."""
    return {flag: [*entry[:3], content_hash(*entry[:3])] for flag, entry in files.items()}


def _same_file(saved: list | None, now: list | None) -> bool:
    if saved is None or now is None:
        return saved is now
    if saved[:2] != now[:2]:  # another path or size
        return False
    return saved[2] == now[2] or (len(saved) > 3 and saved[3] == content_hash(*now[:3]))


def same_data(saved: dict, now: dict) -> bool:
    return all(_same_file(saved.get(flag), now.get(flag)) for flag in {*saved, *now})


def _changed_files(saved: dict, now: dict) -> str:
    """What differs between two `data_files` records, in words."""

    def said(entry) -> str:
        if entry is None:
            return "none"
        modified = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry[2] / 1e9))
        return f"{entry[0]} ({entry[1]:,} bytes, modified {modified})"

    return "; ".join(
        f"{flag} {said(saved.get(flag))}, now {said(now.get(flag))}"
        for flag in dict.fromkeys([*saved, *now])
        if not _same_file(saved.get(flag), now.get(flag))
    )


def write_recipe(recipe: str, output_dir: Path, max_steps: int) -> Path:
    """OUTPUT/recipe-HASH.yaml: ``recipe`` (a packaged name or a file) without its time budget, averaging and test
    set, to train ``max_steps`` updates then score the validation set."""
    import yaml

    path = Path(recipe) if Path(recipe).suffix in ARGUMENT_FILE_SUFFIXES else recipe_or_error(recipe)
    values = read_argument_file(path)
    for key in REFUSED_IN_RECIPE:
        if key in values:
            raise ValueError(f"{path} sets {key}: {OWN_FLAGS[key]}; give table3 a copy of the file without it.")
    values = {key: value for key, value in values.items() if key not in RECIPE_DROPPED}
    values |= RECIPE_SETTINGS | {"max_steps": max_steps}
    body = yaml.safe_dump(values, sort_keys=False)
    text = f"# {recipe} as every row of `vanilla-transformer table3` trains it (written by it).\n" + body
    # named by its values (not by how the recipe was spelled): a row trained from another recipe has other
    # flags, and is not taken as finished
    target = output_dir / f"recipe-{hashlib.sha256(body.encode()).hexdigest()[:10]}.yaml"
    output_dir.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target


def plan(
    recipe_file: Path, train_flags: list[str], rows: list[str], seeds: int, output_dir: Path, prog: str
) -> list[Job]:
    """Every (row, seed) as a run of ``train``, each checked as ``train`` checks its flags, before any training.
    Every row trains with one tokenizer: --tokenizer_name_or_path, else OUTPUT/tokenizer (`shared_tokenizer`)."""
    model_args, data_args, training_args = parse_arguments([str(recipe_file), *train_flags], prog)
    if not training_args.predict_with_generate or training_args.prediction_loss_only:
        raise ValueError(
            "every row is scored by decoding the validation set (BLEU, chrF): leave out --predict_with_generate "
            "false (--no_predict_with_generate) and --prediction_loss_only, or their values in the recipe."
        )
    if not validation_given(data_args):
        raise ValueError(
            "every row is scored on the validation set: give --validation_source_file/--validation_target_file, "
            "--validation_file, --validation_split of a Hub dataset, or --validation_size N (pairs held out of "
            "the training data)."
        )
    check_steps_have_data(model_args, data_args, *steps_to_run(training_args, data_args))  # the training data
    if getattr(training_args.save_strategy, "value", training_args.save_strategy) == "no":
        raise ValueError(
            "--save_strategy no: a row stopped or failed after training would have nothing to resume from or to "
            "score again, and is refused on the next run; leave it out (--save_total_limit keeps fewer "
            "checkpoints)."
        )
    data = data_files(data_args)
    tokenizer = model_args.tokenizer_name_or_path or str(output_dir / "tokenizer")
    base_config = model_config(model_args.preset, model_args.config_overrides)
    base_overrides = parse_overrides(model_args.config_overrides)
    jobs = []
    for row in rows:
        change = variation(PAPER_ROWS[row], base_config, training_args.label_smoothing_factor, training_args.max_steps)
        overrides = ",".join(f"{key}={json.dumps(value)}" for key, value in {**base_overrides, **change.config}.items())
        for seed in range(training_args.seed, training_args.seed + seeds):
            folder = output_dir / row / f"seed-{seed}"
            flags = [
                str(recipe_file),
                *train_flags,
                "--output_dir",
                str(folder),
                "--seed",
                str(seed),
                "--config_overrides",
                overrides,
                "--label_smoothing_factor",
                str(change.label_smoothing),
                "--max_steps",
                str(change.max_steps),
                "--tokenizer_name_or_path",
                tokenizer,
            ]
            try:
                check_arguments(*parse_arguments(list(flags), prog))
            except ValueError as error:
                raise ValueError(
                    f"row {row} at this recipe's scale ({_describe(change)}): {error} Leave the row out with --rows."
                ) from None
            jobs.append(Job(row, seed, folder, flags, change, data))
    return jobs


def _describe(change: Variation) -> str:
    return ", ".join(
        [
            *(f"{key}={value}" for key, value in change.config.items()),
            f"label smoothing {change.label_smoothing:g}",
            f"{change.max_steps} updates",
        ]
    )


def tokenizer_record(model_args, data_args, training_args) -> dict:
    """What the shared tokenizer is trained from: its settings, the flags choosing its text, the files' identity."""
    settings = run.new_tokenizer_settings(model_args, data_args, training_args)
    settings.pop("cache_dir")  # where it is kept, not what it is
    text = {name: getattr(data_args, name) for name in TOKENIZER_TEXT}
    for name in ("train_file", "train_source_file", "train_target_file"):  # the same file however it is spelled
        text[name] = text[name] and str(Path(text[name]).resolve())
    return {"settings": settings, "text": text, "files": data_files(data_args, TOKENIZER_TEXT)}


def check_shared_tokenizer(recipe_file: Path, train_flags: list[str], output_dir: Path, prog: str) -> None:
    """OUTPUT/tokenizer, where present, was trained with these tokenizer settings on this data: rows deleted to
    train them again with other ones would otherwise load it, and the table would say the new settings."""
    model_args, data_args, training_args = parse_arguments([str(recipe_file), *train_flags], prog)
    folder = output_dir / "tokenizer"
    if model_args.tokenizer_name_or_path or not (folder / TOKENIZER_RECORD).is_file():
        return  # none trained yet, or one of an earlier release (which recorded nothing)
    saved, now = read_record(folder / TOKENIZER_RECORD), tokenizer_record(model_args, data_args, training_args)
    # rows of other seeds share it (--validation_size's held-out pairs are the same for every seed)
    saved["settings"].pop("seed", None), now["settings"].pop("seed")
    if (saved["settings"], saved["text"]) == (now["settings"], now["text"]) and same_data(saved["files"], now["files"]):
        return
    changes = [
        f"{'--tokenizer_' + key if key != 'seed' else '--seed'} {saved['settings'].get(key)}, now {value}"
        for key, value in now["settings"].items()
        if saved["settings"].get(key) != value
    ]
    changes += [
        f"--{key} {saved['text'].get(key)}, now {value}"
        for key, value in now["text"].items()
        if saved["text"].get(key) != value
    ]
    if files := _changed_files(saved["files"], now["files"]):
        changes.append(files)
    raise ValueError(
        f"{folder}, the tokenizer every row of this table loads, was trained with other settings or data "
        f"({'; '.join(changes)}): give another --output-dir, or delete {folder} and the rows trained with it."
    )


def shared_tokenizer(recipe_file: Path, train_flags: list[str], output_dir: Path, prog: str) -> None:
    """Without --tokenizer_name_or_path, the tokenizer every row trains with: one joint BPE (§5.1) trained once
    on the training data with the recipe's settings, in OUTPUT/tokenizer, with what it was trained from."""
    model_args, data_args, training_args = parse_arguments([str(recipe_file), *train_flags], prog)
    folder = output_dir / "tokenizer"
    if not model_args.tokenizer_name_or_path and not (folder / "tokenizer.json").is_file():
        text = run.load_text_datasets(data_args)
        tokenizer = run.prepare_tokenizer(
            text["train"], **run.new_tokenizer_settings(model_args, data_args, training_args)
        )
        partial = folder.with_name("tokenizer.partial")
        tokenizer.save_pretrained(partial)
        record = tokenizer_record(model_args, data_args, training_args)
        write_record(partial / TOKENIZER_RECORD, {**record, "files": recorded(record["files"])})
        partial.replace(folder)  # complete or absent: a later run never trains rows with half a tokenizer


# ---------------------------------------------------------------------------------------------
# Running the rows: in this process one after another, or one process per GPU (--devices)
# ---------------------------------------------------------------------------------------------


def write_record(path: Path, record: dict) -> None:
    """A row's flags or result as JSON, whole or not at all (a stopped run or a full disk leaves no half file)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)


def read_record(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path} is not valid JSON ({error}): delete it, and table3 trains its row again, resuming from the "
            "row's last checkpoint."
        ) from None


def finished(job: Job) -> dict | None:
    """The job's result when its folder holds one; an error when the folder's run started with other flags."""
    saved = {
        name: read_record(job.folder / name) for name in (FLAGS_FILE, RESULT_FILE) if (job.folder / name).is_file()
    }
    if RESULT_FILE not in saved and not trained_anything(job.folder):
        return None  # a row that failed before its first checkpoint (a flag train refused): these flags start it
    for record in saved.values():
        if not same_flags(record.get("flags", []), job.flags):
            raise ValueError(
                f"{job.folder} holds row {job.row} (seed {job.seed}) trained with other flags than these "
                f"({_changed_flags(record.get('flags', []), job.flags)}); give another --output-dir, or delete the "
                "folder to train it again."
            )
        if record.get("data") is not None and job.data is not None and not same_data(record["data"], job.data):
            raise ValueError(
                f"{job.folder} holds row {job.row} (seed {job.seed}) trained on data changed since "
                f"({_changed_files(record['data'], job.data)}); give another --output-dir, or delete the folder "
                "to train it again."
            )
    return saved.get(RESULT_FILE)


def trained_anything(folder: Path) -> bool:
    """Whether a row's folder holds training to keep: a checkpoint (complete or not) or a saved model."""
    return bool(checkpoint_folders(folder)) or any((folder / name).is_file() for name in MODEL_WEIGHTS)


def _flag_values(flags: list[str]) -> dict[str, list[str]]:
    """``{flag: [values]}`` of a row's flags (the recipe file first, as RECIPE), each name as train reads it
    (``--config-overrides`` is ``--config_overrides``, ``--seed=4`` is ``--seed 4``), the last of a repeated flag
    winning as in argparse: two commands that say the same in another order or spelling have the same values."""
    values, index = {}, 0
    if flags and not flags[0].startswith("--"):
        values["RECIPE"], index = [flags[0]], 1
    while index < len(flags):
        name, equals, value = flags[index][2:].partition("=")
        index += 1
        given = [value] if equals else []
        while not equals and index < len(flags) and not flags[index].startswith("--"):
            given.append(flags[index])
            index += 1
        values["--" + name.replace("-", "_")] = given
    return values


def _changed_flags(saved: list[str], flags: list[str]) -> str:
    """What differs between two rows' flags, in words: each flag's value then and now."""
    before, now = _flag_values(saved), _flag_values(flags)

    def said(values: list[str] | None) -> str:
        return "(not given)" if values is None else " ".join(values) or "(given without a value)"

    changes = []
    for name in dict.fromkeys([*before, *now]):
        if not _same_values(before.get(name), now.get(name), recipe=name == "RECIPE"):
            what = "the recipe" if name == "RECIPE" else name
            changes.append(f"{what} {said(before.get(name))}, now {said(now.get(name))}")
    return "; ".join(changes) or " ".join(saved)


def same_flags(saved: list[str], flags: list[str]) -> bool:
    """The same flags, however ordered or spelt (`_flag_values`), where a path may be spelt another way
    (relative or absolute, ``./``) for the same file, and the recipe is the same when its values are."""
    before, now = _flag_values(saved), _flag_values(flags)
    return all(_same_values(before.get(name), now.get(name), name == "RECIPE") for name in {*before, *now})


def _same_values(a: list[str] | None, b: list[str] | None, recipe: bool = False) -> bool:
    if a is None or b is None or len(a) != len(b):
        return a is b
    return all(_same_value(x, y) or (recipe and _same_recipe(x, y)) for x, y in zip(a, b, strict=True))


def _same_value(a: str, b: str) -> bool:
    """One flag's value, where a path may be spelled another way for the same file."""
    return a == b or Path(a).resolve() == Path(b).resolve()


def _same_recipe(a: str, b: str) -> bool:
    """Two recipe files table3 wrote (`write_recipe`) with the same values: an earlier release named them by a
    hash of their text, comment included."""
    import yaml

    try:
        return yaml.safe_load(Path(a).read_text(encoding="utf-8")) == yaml.safe_load(
            Path(b).read_text(encoding="utf-8")
        )
    except (OSError, yaml.YAMLError):
        return False


def check_devices(devices: list[str], use_cpu: bool) -> None:
    """--devices are numbers of GPUs this process sees; without a GPU, only with --use_cpu (rows as processes on
    the CPU), which trains them on the CPU and says so."""
    if use_cpu:
        return
    if not torch.cuda.is_available():
        raise ValueError(
            f"--devices {','.join(devices)}: no CUDA GPU is visible here; leave --devices out to train the rows one "
            "after another in this process (or add --use_cpu true to train them as processes on the CPU)."
        )
    count = torch.cuda.device_count()
    if wrong := [device for device in devices if not device.isdigit() or int(device) >= count]:
        raise ValueError(
            f"--devices {','.join(devices)}: {', '.join(wrong)} is not a GPU here; this process sees {count} "
            f"(0-{count - 1}{', of CUDA_VISIBLE_DEVICES' if os.environ.get('CUDA_VISIBLE_DEVICES') else ''})."
        )


def cuda_visible(device: str) -> str:
    """The CUDA_VISIBLE_DEVICES of a row's process on GPU ``device`` of those this process sees: where this
    process has a CUDA_VISIBLE_DEVICES (a scheduler's), GPU 0 is its first entry, not the machine's GPU 0."""
    visible = [entry.strip() for entry in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    return visible[int(device)] if visible and device.isdigit() and int(device) < len(visible) else device


def device_name(device: str) -> str:
    return f"GPU {device}" if torch.cuda.is_available() else "the CPU, in a process of its own"


class Processes:
    """The rows' processes (--devices), each in a session of its own: every Ctrl-C (SIGINT) or SIGTERM the command
    gets, from a terminal, a scheduler or `kill` to its pid alone, is passed on to them. The first stops each row
    after it saves a checkpoint; a second Ctrl-C stops them at once, without saving, as it does train alone (train
    takes a second SIGTERM as the first). After either signal no row starts. A row whose command is gone (SIGKILL,
    a closed terminal) stops as on SIGTERM by itself (`checkpointing.stop_with_parent`)."""

    def __init__(self):
        self.running, self.lock, self.stopped_by = set(), threading.Lock(), None

    def start(self, command: list[str], **kwargs) -> subprocess.Popen:
        with self.lock:
            if self.stopped_by is not None:
                raise RowsStopped(self.stopped_by)
            environment = {**(kwargs.pop("env", None) or os.environ), PARENT_PID_VARIABLE: str(os.getpid())}
            process = subprocess.Popen(command, env=environment, **{"start_new_session": True, **kwargs})
            self.running.add(process)
        return process

    def wait(self, process: subprocess.Popen) -> int:
        code = process.wait()
        with self.lock:
            self.running.discard(process)
        return code

    def stop(self, number: int, frame=None) -> None:  # a signal handler
        with self.lock:
            self.stopped_by = self.stopped_by or number
            for process in self.running:
                process.send_signal(number)

    @contextlib.contextmanager
    def passing_signals_on(self):
        previous = {number: signal.signal(number, self.stop) for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)


class RowsStopped(Exception):
    """A signal stopped the rows (--devices): each running row saved a checkpoint, no other started."""

    def __init__(self, number: int):
        self.number = number
        super().__init__(f"stopped by {signal.Signals(number).name}")


def row_error(log: Path, offset: int) -> str:
    """The line of a row's log that says why its process failed: train's one-line error, else the last line of
    what this run wrote (not a progress bar's, which ends in carriage returns)."""
    with open(log, "rb") as file:
        file.seek(offset)
        text = file.read().decode("utf-8", errors="replace")
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(f"{PROG} train: error:")]
    plain = [line for line in lines if not PROGRESS_BAR.search(line)]
    return (errors or plain or lines or [""])[-1]


PROGRESS_BAR = re.compile(r"\d+%\|")  # tqdm's "27%|██▊   | 27/100 [...]"


def run_job(job: Job, device: str | None, processes: Processes | None = None) -> dict:
    """Train and score one row (resuming from its last checkpoint when it has one); its result, also saved.
    With a device, in a process of its own that sees only that GPU (``processes`` holds it)."""
    flags = job.flags + (RESUME_HINT.split() if checkpoint_folders(job.folder) else [])
    job.folder.mkdir(parents=True, exist_ok=True)
    data = None if job.data is None else recorded(job.data)
    write_record(job.folder / FLAGS_FILE, {"flags": job.flags, "data": data})
    start = time.monotonic()
    if device is None:
        # a row compiles from nothing (--torch_compile, --cuda_graphs): the rows before it neither hold its CUDA
        # graphs' memory nor count towards its recompilation limit (process-wide: a script calling table3 compiles
        # its own functions again after it)
        torch.compiler.reset()
        try:
            run.main(flags)
        finally:  # the next row starts with the memory this one held
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    else:
        processes = processes or Processes()
        environment = {**os.environ, "CUDA_VISIBLE_DEVICES": cuda_visible(device)}
        with open(job.folder / LOG_FILE, "a", encoding="utf-8") as log:
            offset = log.tell()
            process = processes.start(
                # the console script's module: a Ctrl-C passed on while the row still imports torch ends it in one
                # line ("stopped by Ctrl-C", 130) in its train.log, not a KeyboardInterrupt traceback
                [sys.executable, "-m", "vanilla_transformer_command", "train", *flags],
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            code = processes.wait(process)
        if code and processes.stopped_by is not None:
            raise RowsStopped(processes.stopped_by)
        if code:
            raise RuntimeError(
                f"exit status {code}: {row_error(job.folder / LOG_FILE, offset)} (see {job.folder / LOG_FILE})"
            )
    result = {
        "row": job.row,
        "seed": job.seed,
        "flags": job.flags,
        "data": data,
        "wall_seconds": time.monotonic() - start,
        **trained_run(job.folder),
    }
    write_record(job.folder / RESULT_FILE, result)
    return result


def run_jobs(jobs: list[Job], devices: list[str] | None, report=print) -> tuple[dict, dict]:
    """Every job not finished before: ``({(row, seed): result}, {(row, seed): error})``; a failure stops only
    its job. A Ctrl-C or SIGTERM stops them all (`Processes`; in this process, train's `StopOnSignal`) and ends
    in one line saying how to continue."""
    results, failures, to_run = {}, {}, []
    for job in jobs:
        if (result := finished(job)) is not None:
            results[job.row, job.seed] = result
            report(f"{job.row} seed {job.seed}: finished before, in {job.folder}")
        else:
            to_run.append(job)
    free = queue.Queue()
    for device in devices or [None]:
        free.put(device)
    lock, processes = threading.Lock(), Processes()

    def one(job: Job) -> None:
        device = free.get()
        try:
            if processes.stopped_by is not None:
                return
            report(
                f"{job.row} seed {job.seed}: training in {job.folder}"
                + (f" on {device_name(device)}" if device else "")
            )
            result = run_job(job, device, processes)
        except RowsStopped:
            return
        except Exception as error:  # noqa: BLE001 - any failure of one row is reported, the others go on
            with lock:
                failures[job.row, job.seed] = f"{type(error).__name__}: {error}"
            report(f"{job.row} seed {job.seed}: FAILED: {error}")
        else:
            with lock:
                results[job.row, job.seed] = result
            report(
                f"{job.row} seed {job.seed}: BLEU {result['bleu']:.2f}, perplexity {result['perplexity']:.2f}, "
                f"{result['wall_seconds'] / 60:.1f} min"
            )
        finally:
            free.put(device)

    stopped = None
    if devices:
        with processes.passing_signals_on(), ThreadPoolExecutor(len(devices)) as pool:
            list(pool.map(one, to_run))
        stopped = processes.stopped_by
    else:
        for job in to_run:
            try:
                one(job)
            except SystemExit as exit:  # train stopped by a signal, after saving what it could, and said so
                if exit.code not in (128 + signal.SIGINT, 128 + signal.SIGTERM):
                    raise
                stopped = exit.code - 128
                break
    if stopped is not None:
        print(
            f"{PROG} table3: stopped by {signal.Signals(stopped).name}: to continue, run the same table3 command "
            "again (finished rows are kept, a row with a checkpoint resumes from it by itself: table3 refuses "
            "--resume_from_checkpoint and --model_name_or_path).",
            file=sys.stderr,
        )
        raise SystemExit(128 + stopped)
    return results, failures


# ---------------------------------------------------------------------------------------------
# What a run folder holds: the model it trained (config.json), its training flags and its scores
# ---------------------------------------------------------------------------------------------


def trained_run(folder: Path) -> dict:
    """The setting and scores of a finished run, each read from what the run saved: config.json (the model),
    training_args.bin (label smoothing), trainer_state.json (updates) and all_results.json (validation)."""
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):  # the architecture's parameters, without their values
        parameters = AutoModelForSeq2SeqLM.from_config(config).num_parameters()
    arguments = torch.load(folder / "training_args.bin", weights_only=False)
    state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
    scores = json.loads((folder / "all_results.json").read_text(encoding="utf-8"))
    return {
        "N": _pair(config.encoder_layers, config.decoder_layers),
        "d_model": config.d_model,
        "d_ff": _pair(config.encoder_ffn_dim, config.decoder_ffn_dim),
        "h": _pair(config.encoder_attention_heads, config.decoder_attention_heads),
        "d_k": config.head_dim or config.d_model // config.encoder_attention_heads,
        "d_v": config.head_dim or config.d_model // config.encoder_attention_heads,  # one head_dim: d_v = d_k
        "dropout": config.dropout,
        "label_smoothing": arguments.label_smoothing_factor,
        "positions": config.position_embedding_type,
        "train_steps": state["global_step"],
        "parameters": parameters,
        # eval_loss is the NLL per target token (BPE token, </s> included) without label smoothing
        "perplexity": scores["eval_perplexity"],
        "bleu": scores["eval_bleu"],
        "chrf": scores["eval_chrf"],
        "train_seconds": scores.get("train_runtime"),
    }


def _pair(encoder, decoder):
    return encoder if encoder == decoder else f"{encoder}+{decoder}"


# ---------------------------------------------------------------------------------------------
# The table: ours beside the paper's, each row's change from base
# ---------------------------------------------------------------------------------------------

SETTING = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "dropout", "label_smoothing", "positions", "train_steps")
SCORES = ("perplexity", "bleu", "chrf")


def summarize(rows: list[str], results: dict, failures: dict) -> dict:
    """Per row: the setting trained, the mean and spread over seeds of each score, its change from base
    (the mean over seeds of row minus base, paired by seed, and their spread), and the paper's numbers."""
    base = {seed: result for (row, seed), result in results.items() if row == "base"}
    summary = {}
    for row in rows:
        runs = {seed: result for (name, seed), result in sorted(results.items()) if name == row}
        paper = PAPER_ROWS[row]
        entry = {
            "paper": {
                "ppl": paper.ppl,
                "bleu": paper.bleu,
                "params_millions": paper.params,
                "delta_ppl": round(paper.ppl - PAPER_BASE.ppl, 2),
                "delta_bleu": round(paper.bleu - PAPER_BASE.bleu, 2),
            },
            "seeds": sorted(runs),
            "failed": {seed: error for (name, seed), error in failures.items() if name == row},
        }
        if runs:
            first = next(iter(runs.values()))
            entry["setting"] = {key: first[key] for key in SETTING}
            entry["parameters"] = first["parameters"]
            entry["wall_seconds"] = statistics.fmean(run["wall_seconds"] for run in runs.values())
            entry["runs"] = {
                seed: {key: run[key] for key in (*SCORES, "train_steps", "wall_seconds")} for seed, run in runs.items()
            }
            for key in SCORES:
                entry[key] = _spread([run[key] for run in runs.values()])
                paired = [runs[seed][key] - base[seed][key] for seed in runs if seed in base]
                entry[f"delta_{key}"] = _spread(paired) if paired else None
        summary[row] = entry
    return summary


def _spread(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "n": len(values),
    }


HEADER = [
    "",
    "N",
    "d_model",
    "d_ff",
    "h",
    "d_k",
    "d_v",
    "P_drop",
    "ε_ls",
    "positions",
    "train steps",
    "PPL (dev)",
    "BLEU (dev)",
    "chrF (dev)",
    "params ×10⁶",
    "ΔPPL",
    "ΔBLEU",
    "paper PPL",
    "paper BLEU",
    "paper params ×10⁶",
    "paper ΔPPL",
    "paper ΔBLEU",
    "wall (min)",
]


def markdown(summary: dict, notes: list[str]) -> str:
    """The table in the paper's layout: the base row in full, other rows only where they differ from it."""
    base = summary["base"].get("setting", {})
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row, entry in summary.items():
        setting = entry.get("setting")
        cells = [row]
        if setting is None:
            cells += [""] * len(SETTING) + ["failed"] * 4 + [""] * 2
        else:
            cells += [_cell(setting[key]) if row == "base" or setting[key] != base.get(key) else "" for key in SETTING]
            changes = (
                ["", ""]
                if row == "base"
                else [_paired_change(entry, "delta_perplexity"), _paired_change(entry, "delta_bleu")]
            )
            cells += [
                _mean(entry["perplexity"]),
                _mean(entry["bleu"]),
                _mean(entry["chrf"]),
                f"{entry['parameters'] / 1e6:.3g}",
                *changes,
            ]
        paper = entry["paper"]
        cells += [
            f"{paper['ppl']:.2f}",
            f"{paper['bleu']:.1f}",
            "" if paper["params_millions"] is None else str(paper["params_millions"]),
        ]
        cells += ["", ""] if row == "base" else [f"{paper['delta_ppl']:+.2f}", f"{paper['delta_bleu']:+.1f}"]
        cells += ["" if setting is None else f"{entry['wall_seconds'] / 60:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    failed = [
        f"- {row} seed {seed}: {error}" for row, entry in summary.items() for seed, error in entry["failed"].items()
    ]
    if any("(n=" in line for line in lines[2:]):
        failed.append("- ΔPPL/ΔBLEU marked (n=K) are paired over the K seeds whose base run finished")
    return "\n".join([*notes, "", *lines, *(["", "Failed:", *failed] if failed else [])]) + "\n"


def _paired_change(entry: dict, key: str) -> str:
    """A change from base, with the number of seeds it is paired over where base finished fewer than the row."""
    spread = entry[key]
    text = _mean(spread, sign=True)
    return text if spread is None or spread["n"] == len(entry["seeds"]) else f"{text} (n={spread['n']})"


def _cell(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _mean(spread: dict | None, sign: bool = False) -> str:
    if spread is None:
        return ""
    text = f"{spread['mean']:{'+' if sign else ''}.2f}"
    return text if spread["std"] is None else f"{text} ± {spread['std']:.2f}"


def plot(summary: dict, path: Path) -> Path | None:
    """The change in BLEU from base per row, ours (error bars: the spread over seeds) beside the paper's;
    None when matplotlib (the ``plot`` extra) is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [row for row in summary if row != "base"]
    ours = [summary[row].get("delta_bleu") for row in rows]  # None: the row failed (no bar)
    figure, axes = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.5))
    positions = range(len(rows))
    axes.barh(
        [p - 0.2 for p in positions],
        [math.nan if d is None else d["mean"] for d in ours],
        height=0.4,
        label="ours",
        xerr=[0 if d is None or d["std"] is None else d["std"] for d in ours],
        capsize=2,
    )
    axes.barh(
        [p + 0.2 for p in positions],
        [summary[row]["paper"]["delta_bleu"] for row in rows],
        height=0.4,
        label="paper (newstest2013)",
    )
    axes.set_yticks(list(positions), [f"{row}  {_change(summary, row)}".rstrip() for row in rows])
    axes.invert_yaxis()
    axes.axvline(0, color="black", linewidth=0.8)
    axes.set_xlabel("BLEU (dev) minus the base model's")
    axes.set_title("Table 3: each variation's change from the base model")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _change(summary: dict, row: str) -> str:
    """What the row trained differently from our base, e.g. ``h 1, d_k 256``."""
    setting, base = summary[row].get("setting"), summary["base"].get("setting")
    if setting is None or base is None:
        return ""
    names = dict(zip(SETTING, HEADER[1:]))
    return ", ".join(
        f"{names[key]} {_cell(setting[key])}" for key in SETTING if key != "d_v" and setting[key] != base[key]
    )


def write_outputs(output_dir: Path, summary: dict, notes: list[str], report=print) -> None:
    (output_dir / "table3.md").write_text(markdown(summary, notes), encoding="utf-8")
    (output_dir / "table3.json").write_text(
        json.dumps({"notes": notes, "rows": summary}, indent=2) + "\n", encoding="utf-8"
    )
    report(f"wrote {output_dir / 'table3.md'} and {output_dir / 'table3.json'}")
    if plot(summary, output_dir / "table3.png") is None:
        report(f"no picture: matplotlib is not installed ({install_command('plot')})")
    else:
        report(f"wrote {output_dir / 'table3.png'}")


def repeats_of_the_base(jobs: list[Job]) -> list[str]:
    """The rows that change nothing at this base (D1-D4's rates on a base without dropout or label
    smoothing, E on a base with learned positions): they train the base again."""
    base = next((job.variation for job in jobs if job.row == "base"), None)
    if base is None:
        return []
    return sorted(
        {
            job.row
            for job in jobs
            if job.row != "base"
            and {**base.config, **job.variation.config} == base.config
            and (job.variation.label_smoothing, job.variation.max_steps) == (base.label_smoothing, base.max_steps)
        }
    )


def rates_above_half(jobs: list[Job]) -> list[str]:
    """Each row whose dropout or label smoothing, at the paper's ratio to this base's, is above 0.5 (D2 on a
    base with dropout 0.3: 0.6): more noise than signal, beyond any rate the paper trained."""
    said = {}
    for job in jobs:
        dropout, smoothing = job.variation.config.get("dropout"), job.variation.label_smoothing
        rates = [("dropout", dropout)] if dropout is not None and dropout > 0.5 else []
        rates += [("label smoothing", smoothing)] if smoothing > 0.5 else []
        if rates and job.row != "base":
            said[job.row] = f"{job.row}'s {' and '.join(f'{name} {rate:g}' for name, rate in rates)}"
    return [said[row] for row in sorted(said)]


def notes_for(recipe: str, jobs: list[Job], seeds: int) -> list[str]:
    base = next(job for job in jobs if job.row == "base")
    notes = [
        f"Table 3 (Vaswani et al., 2017) on the recipe `{recipe}`, written {time.strftime('%Y-%m-%d')}: "
        f"{base.variation.max_steps} updates a row, {seeds} seed(s) (mean ± spread over seeds; a change from "
        "base is paired by seed), validation set, the model's beam search (§6.1), no averaging.",
        "Rows are the paper's changes at their ratio to the recipe's base (sizes rounded to whole numbers); "
        "blank cells are the base's. Our d_v is d_k (the config has one head_dim): rows B change d_v too, "
        "where the paper changed d_k alone.",
        "PPL: exp of the validation NLL per target BPE token (</s> included), without label smoothing; the "
        "paper's is per wordpiece on newstest2013, so compare changes from base, not values.",
    ]
    if repeats := repeats_of_the_base(jobs):
        notes.append(
            f"Row(s) {', '.join(repeats)} change nothing at this base (a rate of 0 at the paper's ratio is 0; E's "
            "learned positions may be the base's): they train the base again."
        )
    if high := rates_above_half(jobs):
        notes.append(
            f"Rates above 0.5 at the paper's ratio to this base, beyond any the paper trained: {'; '.join(high)}."
        )
    return notes


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def build_parser(prog: str = "vanilla-transformer table3") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        usage=f"{prog} [RECIPE] --max-steps N [options] [train flags ...]",
        description="Train and score the base model and every variation of the paper's Table 3 on a recipe's "
        "base model (RECIPE: a packaged recipe or a .yaml/.json file of flags; default multi30k). "
        "Other flags go to `vanilla-transformer train` for every row (data files, --preset, "
        "--config_overrides and --label_smoothing_factor of the base).",
        epilog="Every flag is also accepted with underscores (--max_steps).",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        required=True,
        metavar="N",
        help="updates every row trains (the paper: 100000; big: three times as many)",
    )
    parser.add_argument(
        "--rows",
        metavar="ROWS",
        help=f"rows and groups, comma-separated (default: all but big): {', '.join(PAPER_ROWS)}; A-E",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="seeds a row (the recipe's --seed and the next ones): mean and spread",
    )
    parser.add_argument(
        "--devices",
        metavar="LIST",
        help="GPUs to train rows on at once, one process a row (e.g. 0,1,2,3); default: one row "
        "after another in this process",
    )
    parser.add_argument("--output-dir", metavar="DIR", help="where the runs and the table go (default: runs/table3)")
    return parser


def main(argv: list[str] | None = None, prog: str = "vanilla-transformer table3") -> dict:
    """``vanilla-transformer table3``: the summary of every row (also written as table3.md/.json/.png)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe = argv.pop(0) if argv and not argv[0].startswith("-") else "multi30k"
    parser = build_parser(prog)
    args, train_flags = parser.parse_known_args(with_dashes(argv, parser))  # --max_steps is ours: --max-steps
    rows = select_rows(args.rows)
    if args.max_steps < 1 or args.seeds < 1:
        raise ValueError(f"--max-steps and --seeds must be positive, got {args.max_steps} and {args.seeds}.")
    devices = [device.strip() for device in args.devices.split(",")] if args.devices else None
    if devices is not None and not all(devices):
        raise ValueError(f"--devices {args.devices!r}: give GPU numbers separated by commas, e.g. 0,1,2,3.")
    refuse_own_flags(train_flags)
    output_dir = Path(args.output_dir or "runs/table3")
    with SharedTokenizerUnsaid(output_dir / "tokenizer"):
        return _compare(recipe, args, train_flags, rows, devices, output_dir, prog)


class SharedTokenizerUnsaid(logging.Filter):
    """The tokenizer flags train the one tokenizer every row loads (`shared_tokenizer`), so train's line calling
    them ignored, because a row loads ``folder`` with --tokenizer_name_or_path, is left out while the block runs."""

    def __init__(self, folder: Path):
        super().__init__()
        self.line = f"the tokenizer is loaded from --tokenizer_name_or_path {folder}, not trained"

    def filter(self, record: logging.LogRecord) -> bool:
        return self.line not in record.getMessage()

    def __enter__(self):
        logging.getLogger(TRAIN_LOGGER).addFilter(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger(TRAIN_LOGGER).removeFilter(self)


def _compare(recipe, args, train_flags, rows, devices, output_dir: Path, prog: str) -> dict:
    """`main` once its own flags are read: plan and check every row, train what is not finished, summarize."""
    new_folder = not output_dir.exists()
    written_before = set(output_dir.glob("recipe-*.yaml"))
    recipe_file = write_recipe(recipe, output_dir, args.max_steps)
    new_recipe = recipe_file not in written_before
    try:
        jobs = plan(recipe_file, train_flags, rows, args.seeds, output_dir, prog)  # every row checked first
        for job in jobs:
            finished(job)  # a folder of another table is refused before anything runs
        check_shared_tokenizer(recipe_file, train_flags, output_dir, prog)
        if devices:
            check_devices(devices, parse_arguments([str(recipe_file), *train_flags], prog)[2].use_cpu)
    except (ValueError, SystemExit):  # refused (SystemExit: argparse's refusal of a value): nothing written
        if new_recipe:
            recipe_file.unlink(missing_ok=True)
        if new_folder and output_dir.is_dir() and not any(output_dir.iterdir()):
            output_dir.rmdir()
        raise
    if repeats := repeats_of_the_base(jobs):
        print(f"rows {', '.join(repeats)} change nothing at this base: they train the base again", file=sys.stderr)
    if high := rates_above_half(jobs):
        print(f"rates above 0.5 at the paper's ratio to this base: {'; '.join(high)}", file=sys.stderr)
    shared_tokenizer(recipe_file, train_flags, output_dir, prog)
    results, failures = run_jobs(jobs, devices)
    summary = summarize(rows, results, failures)
    write_outputs(output_dir, summary, notes_for(recipe, jobs, args.seeds))
    if failures:
        print(
            f"{len(failures)} run(s) failed: {', '.join(f'{row} seed {seed}' for row, seed in failures)}",
            file=sys.stderr,
        )
        raise SystemExit(1)
    return summary


if __name__ == "__main__":
    from vanilla_transformer.cli import run_command

    run_command("table3", sys.argv[1:])
