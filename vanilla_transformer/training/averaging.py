"""Average the weights of several checkpoints into one model (Vaswani et al., 2017, §6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints, which
were written at 10-minute intervals. For the big models, we averaged the last 20 checkpoints."
Averaging the parameters of the last checkpoints of one run smooths out the noise of the final
updates and is free at inference time: the result is one ordinary model.

Each checkpoint is a Hub-format folder (``config.json`` + ``model.safetensors``) as written by
``save_pretrained`` or the Trainer. The tensors are read with safetensors, summed in float64 one
checkpoint at a time (memory: one float64 copy of the model, however many checkpoints) and cast
back to their stored dtype, so each result is the arithmetic mean (``weights="uniform"``, the
paper's), or with ``weights="linear"`` a weighted mean in which the k-th of N checkpoints, oldest
first, weighs k: the newest counts N times the oldest (polynomial-decay averaging with eta = 1, Shamir
& Zhang 2013, over the last checkpoints). When the last updates still move the model, as in a short
run at a high learning rate, older checkpoints are further from where training ended; on Multi30k the
linear weights of the last 10 scored at least their mean on val in six runs of six, +0.27 BLEU on
average (docs/benchmarks/multi30k.md). Integer and bool tensors are not averaged: they must be equal in every
checkpoint. The averaged tensors are loaded into the newest
checkpoint's model with the library's ``from_pretrained`` and written with ``save_pretrained``, so
the output is a complete Hub folder (tied weights stored once and tied again on load, remote-code
files, generation settings, tokenizer files of the newest checkpoint).

    python training/average_checkpoints.py --checkpoint-root runs/base --last 5 --output-dir runs/base/averaged
    python training/average_checkpoints.py --inputs ckpt-a ckpt-b ckpt-c --output-dir averaged --weights linear
    average_checkpoints(["runs/base/checkpoint-9000", "runs/base/checkpoint-10000"], "averaged")  # in Python
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from ..checkpoint_files import CHECKPOINT_NAME, TOKENIZER_FILES, check_json, check_safetensors, tokenizer_difference
from ..command_line import CommandParser, unwritable_folder
from .checkpointing import TRAINER_STATE_NAME, checkpoint_folders, recorded_run_folders, run_checkpoints

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
GENERATION_CONFIG_NAME = "generation_config.json"
# The tokenizer's files (`TOKENIZER_FILES`) are copied byte for byte from the newest checkpoint when present,
# with any tokenizer remote code.
TOKENIZER_CODE_GLOB = "tokenization_*.py"
# Config fields that may differ between checkpoints of one architecture: bookkeeping and
# training-only settings. Everything else (d_model, heads, layers, ...) must match.
CONFIG_FIELDS_ALLOWED_TO_DIFFER = frozenset(
    {
        "transformers_version",
        "_name_or_path",
        "_commit_hash",
        "use_cache",
        "architectures",
        "dtype",
        "dropout",
        "attention_dropout",
        "activation_dropout",
    }
)
# How the checkpoints (oldest first) are weighted, and what the result is called: "uniform" is §6.1's
# mean; "linear" weighs the k-th k.
MEAN_NAMES = {"uniform": "mean", "linear": "linearly weighted mean"}
AVERAGING_WEIGHTS = tuple(MEAN_NAMES)


# ---------------------------------------------------------------------------------------------
# Finding and checking the checkpoints
# ---------------------------------------------------------------------------------------------


def last_checkpoints(root: str | Path, last: int) -> list[Path]:
    """The `last` complete ``checkpoint-<step>`` folders of a Trainer output dir, oldest first, by integer step;
    for a run continued there from another folder, that folder's too, up to the one it was resumed from (as its
    checkpoints record them, `recorded_run_folders`).

    Incomplete ones (e.g. of a run killed while it saved, by an older version) are skipped and
    named in the log, so that a half-written checkpoint is never averaged.
    """
    root = Path(root)
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise ValueError(f"--last must be at least 1 (a number of checkpoints), got {last!r}.")
    if not root.is_dir():
        raise FileNotFoundError(
            f"--checkpoint-root {root} {'is not a folder' if root.exists() else 'does not exist'}; "
            "give the Trainer's output_dir, which holds the checkpoint-<step> folders."
        )
    found = run_checkpoints(root, recorded_run_folders(root))
    if last > len(found):
        skipped = len(checkpoint_folders(root)) - sum(path.parent == root for path in found)
        elsewhere = " and the folders its run continued from" if any(path.parent != root for path in found) else ""
        if not found and CHECKPOINT_NAME.fullmatch(root.name):  # a checkpoint given instead of its run
            fix = (
                f"{root} is itself a checkpoint: give its run folder, --checkpoint-root {root.parent}, or average "
                "chosen checkpoints with --inputs."
            )
        elif not found and skipped:
            fix = "None of them can be averaged; give complete checkpoints with --inputs."
        elif not found:
            fix = "Point --checkpoint-root at the Trainer's output_dir, the folder that holds them."
        else:
            fix = f"Pass --last {len(found)} or fewer, or point --checkpoint-root at the Trainer's output_dir."
        raise ValueError(
            f"--last {last} asks for more checkpoints than {root}"
            f"{f'{elsewhere} hold: there are' if elsewhere else ' holds: it has'} {len(found)} "
            f"checkpoint-<step> folder(s){' (' + ', '.join(named(p, root) for p in found) + ')' if found else ''}"
            f"{f' and {skipped} incomplete one(s), see the log' if skipped else ''}. {fix}"
        )
    return found[len(found) - last :]


def named(checkpoint: Path, root: Path) -> str:
    """A checkpoint by its name in ``root``, by its path elsewhere (one of a folder its run continued from)."""
    return checkpoint.name if checkpoint.parent == Path(root) else str(checkpoint)


def check_folders(checkpoints: list[Path]) -> None:
    """Each checkpoint a folder with a config and complete weights, none given twice."""
    if not checkpoints:
        raise ValueError("No checkpoints to average: give at least one checkpoint folder.")
    for folder in checkpoints:
        if not folder.is_dir():
            raise FileNotFoundError(
                f"Checkpoint {folder} {'is not a folder' if folder.exists() else 'does not exist'}."
            )
        if not (folder / WEIGHTS_NAME).is_file():
            raise ValueError(
                f"Checkpoint {folder} has no {WEIGHTS_NAME}. Give Hub-format folders written by "
                f"save_pretrained or the Trainer (save_safetensors, one shard)."
            )
        if not (folder / "config.json").is_file():
            raise ValueError(
                f"Checkpoint {folder} has no config.json. Give Hub-format folders written by "
                "save_pretrained or the Trainer."
            )
        remedy = "Leave this checkpoint out of the average."
        check_json(folder / "config.json", f"Checkpoint {folder}", remedy)
        check_safetensors(folder / WEIGHTS_NAME, f"Checkpoint {folder}", remedy)
    resolved = [folder.resolve() for folder in checkpoints]
    if duplicates := sorted({str(folder) for folder in checkpoints if resolved.count(folder.resolve()) > 1}):
        raise ValueError(
            f"Checkpoint(s) {', '.join(duplicates)} given more than once: each would count twice in "
            "the mean. Give each checkpoint once."
        )


def _trainer_state(folder: Path) -> dict:
    try:
        state = json.loads((folder / TRAINER_STATE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def logged_losses(folder: Path) -> dict[int, float]:
    """The training loss its run logged at each update until ``folder`` was saved (its ``trainer_state.json``):
    two checkpoints of one run logged the same ones at the updates both saw."""
    history = _trainer_state(folder).get("log_history")
    entries = history if isinstance(history, list) else []
    return {e["step"]: e["loss"] for e in entries if isinstance(e, dict) and "loss" in e and "step" in e}


def checkpoint_step(folder: Path) -> int | None:
    """The update a checkpoint was saved at: its ``trainer_state.json``'s ``global_step``, else the step in
    its ``checkpoint-<step>`` name; None for a folder with neither (a model saved by ``save_pretrained``)."""
    step = _trainer_state(folder).get("global_step")
    if isinstance(step, int) and not isinstance(step, bool):
        return step
    match = CHECKPOINT_NAME.fullmatch(folder.name)
    return int(match.group(1)) if match else None


def _same_loss(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


TWO_RUNS = (
    "§6.1 averages the last checkpoints of one run, whose weights stay close; the mean of separately trained models "
    "may not translate at all."
)


def check_oldest_first(checkpoints: list[Path]) -> None:
    """Checkpoints whose update is known come in the order of their updates: the newest (last) gives the
    config, tokenizer and generation settings, and linear weights follow the order. A shell glob puts
    ``checkpoint-10000`` before ``checkpoint-9000``; that order is refused, with the right one to paste. Two
    runs' checkpoints (their runs logged other losses at an update both saw) and one update given twice (a run's
    folder and its last checkpoint) are said in a warning."""
    stepped = [(step, folder) for folder in checkpoints if (step := checkpoint_step(folder)) is not None]
    for (step, folder), (next_step, next_folder) in zip(stepped, stepped[1:], strict=False):
        losses, next_losses = logged_losses(folder), logged_losses(next_folder)
        shared = sorted(losses.keys() & next_losses.keys())
        if differing := [each for each in shared if not _same_loss(losses[each], next_losses[each])]:
            first = differing[0]
            logger.warning(
                f"{folder} and {next_folder} are checkpoints of two runs: their runs logged different losses at "
                f"update {first} ({losses[first]:g} and {next_losses[first]:g}). {TWO_RUNS}"
            )
        elif next_step == step and shared:
            logger.warning(
                f"{folder} and {next_folder} are the same update ({step}) of one run (a run's folder holds its final "
                "model, the same as its last checkpoint unless averaged): the mean counts it twice. Leave one out."
            )
        elif next_step == step:
            logger.warning(f"{folder} and {next_folder} are both at update {step}: checkpoints of two runs? {TWO_RUNS}")
        if next_step < step:
            in_order = " ".join(str(each) for _, each in sorted(stepped, key=lambda pair: pair[0]))
            raise ValueError(
                f"Checkpoints are averaged oldest first (the last one gives the config, tokenizer and generation "
                f"settings; linear weights follow the order), but {folder} (update {step}) comes before "
                f"{next_folder} (update {next_step}). Give them in the order of their updates: --inputs {in_order}"
            )


def architecture(config: dict) -> dict:
    """The fields of a config (``to_dict()``) that define the model: all but bookkeeping and dropouts."""
    return {key: value for key, value in config.items() if key not in CONFIG_FIELDS_ALLOWED_TO_DIFFER}


def check_same_architecture(checkpoints: list[Path]) -> None:
    reference = architecture(AutoConfig.from_pretrained(checkpoints[0]).to_dict())
    for folder in checkpoints[1:]:
        config = architecture(AutoConfig.from_pretrained(folder).to_dict())
        differing = sorted(key for key in reference.keys() | config.keys() if reference.get(key) != config.get(key))
        if differing:
            details = ", ".join(f"{key}: {reference.get(key)!r} vs {config.get(key)!r}" for key in differing)
            raise ValueError(
                f"Checkpoint {folder} has a different model architecture from {checkpoints[0]} ({details}). "
                f"Only checkpoints of one model (one training run) can be averaged."
            )


def check_same_tokenizer(checkpoints: list[Path]) -> None:
    """Checkpoints of one run share the tokenizer; the same shapes with another vocabulary would
    average embeddings of different tokens."""
    for folder in checkpoints[:-1]:
        if difference := tokenizer_difference(folder, checkpoints[-1]):
            raise ValueError(
                f"Checkpoint {folder} was trained with another tokenizer than {checkpoints[-1]} ({difference}). "
                "Only checkpoints of one model (one training run) can be averaged."
            )


def check_compatible(name: str, tensor: torch.Tensor, reference: torch.Tensor, folder: Path, first: Path) -> None:
    """`tensor` (from `folder`) can be averaged with `reference` (from `first`)."""
    if tensor.shape != reference.shape:
        raise ValueError(
            f"Tensor {name!r} has shape {tuple(tensor.shape)} in checkpoint {folder} but {tuple(reference.shape)} "
            f"in {first}. Only checkpoints of one model (one training run) can be averaged."
        )
    if tensor.dtype != reference.dtype:
        raise ValueError(
            f"Tensor {name!r} is stored as {tensor.dtype} in checkpoint {folder} but as {reference.dtype} in "
            f"{first}. Save all checkpoints in one dtype."
        )
    if not tensor.is_floating_point() and not torch.equal(tensor, reference):
        raise ValueError(
            f"Integer/bool tensor {name!r} differs between checkpoint {folder} and {first}; such tensors "
            f"cannot be averaged and must be equal in every checkpoint."
        )


def check_same_names(names: set[str], reference: set[str], folder: Path, first: Path) -> None:
    if names != reference:
        differences = [
            f"{label} {sorted(difference)}"
            for label, difference in (("lacks", reference - names), ("has extra", names - reference))
            if difference
        ]
        raise ValueError(
            f"Checkpoint {folder} has different tensors from {first}: it {' and '.join(differences)}. "
            f"Only checkpoints of one model (one training run) can be averaged."
        )


# ---------------------------------------------------------------------------------------------
# Averaging
# ---------------------------------------------------------------------------------------------


def checkpoint_weights(count: int, weights: str = "uniform") -> list[int]:
    """The relative weight of each of ``count`` checkpoints, oldest first: all 1, or 1, 2, ..., count."""
    if weights not in AVERAGING_WEIGHTS:
        raise ValueError(f"Unknown averaging weights {weights!r}; choose one of {', '.join(AVERAGING_WEIGHTS)}.")
    return [1] * count if weights == "uniform" else list(range(1, count + 1))


def average_tensors(checkpoints: list[Path], weights: str = "uniform") -> dict[str, torch.Tensor]:
    """The element-wise (weighted) mean of each stored tensor, summed in float64, in its stored dtype."""
    share = checkpoint_weights(len(checkpoints), weights)
    first = checkpoints[0]
    reference = load_file(first / WEIGHTS_NAME)
    sums = {name: tensor.double() * share[0] for name, tensor in reference.items() if tensor.is_floating_point()}
    for folder, part in zip(checkpoints[1:], share[1:]):
        tensors = load_file(folder / WEIGHTS_NAME)
        check_same_names(set(tensors), set(reference), folder, first)
        for name, tensor in tensors.items():
            check_compatible(name, tensor, reference[name], folder, first)
            if name in sums:
                sums[name] += tensor.double() * part
    return {
        name: (sums[name] / sum(share)).to(tensor.dtype) if name in sums else tensor
        for name, tensor in reference.items()
    }


def load_averaged_model(newest: Path, averaged: dict[str, torch.Tensor]):
    """The newest checkpoint's model with the averaged weights loaded into it."""
    model = AutoModelForSeq2SeqLM.from_pretrained(newest, dtype="auto")
    result = model.load_state_dict(averaged, strict=False)
    untied_missing = [name for name in result.missing_keys if not loaded_through_a_tie(model, name, averaged)]
    if untied_missing or result.unexpected_keys:
        raise ValueError(
            f"The weights of {newest} do not fit its model class {type(model).__name__}: missing "
            f"{sorted(untied_missing)}, unexpected {sorted(result.unexpected_keys)}."
        )
    return model


def loaded_through_a_tie(model, name: str, loaded: dict[str, torch.Tensor]) -> bool:
    """`name` is the same tensor object as a loaded one (a tied weight, stored once by save_pretrained)."""
    tensors = model.state_dict(keep_vars=True)
    return any(tensors[name] is tensors[other] for other in loaded if other in tensors)


CARD_NAME = "README.md"  # the model card train writes next to its final model


def copy_side_files(newest: Path, output_dir: Path) -> None:
    """Generation settings and tokenizer files of the newest checkpoint, byte for byte."""
    names = [*TOKENIZER_FILES, GENERATION_CONFIG_NAME]
    files = [newest / name for name in names if (newest / name).is_file()]
    files += sorted(newest.glob(TOKENIZER_CODE_GLOB))
    for path in files:
        shutil.copy2(path, output_dir / path.name)


def average_checkpoints(
    checkpoints: list[str | Path], output_dir: str | Path, weights: str = "uniform", force: bool = False
) -> Path:
    """Average the weights of `checkpoints` (oldest first) into a Hub-format folder `output_dir`.

    ``weights``: "uniform" (the mean, §6.1) or "linear" (the k-th checkpoint weighs k). Config,
    generation settings and tokenizer are taken from the last (newest) checkpoint. Raises
    ValueError when there is nothing to average or the checkpoints are not of one model, and
    FileExistsError where `output_dir` holds a model already, unless ``force``.
    """
    checkpoint_weights(1, weights)  # an unknown name is refused before any file is read
    checkpoints = [Path(folder) for folder in checkpoints]
    output_dir = Path(output_dir)
    check_folders(checkpoints)
    check_oldest_first(checkpoints)
    if any(output_dir.resolve() == folder.resolve() for folder in checkpoints):
        raise ValueError(f"--output-dir {output_dir} is one of the inputs; choose a new folder.")
    check_output_dir(output_dir, force, flags=("output_dir", "force=True"))
    check_same_architecture(checkpoints)
    check_same_tokenizer(checkpoints)
    model = load_averaged_model(checkpoints[-1], average_tensors(checkpoints, weights))
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    copy_side_files(checkpoints[-1], output_dir)
    if (card := output_dir / CARD_NAME).is_file():  # a model replaced (--force): its card's scores were its own
        card.unlink()
        logger.warning(
            f"removed {card}: it described the model replaced, whose scores it holds; score the average "
            "(vanilla-transformer translate --references, or train --do_eval) before its card is written"
        )
    return output_dir


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def build_parser(prog: str = "vanilla-transformer average") -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        epilog="Every flag is also accepted with underscores (--output_dir).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--inputs", nargs="+", metavar="DIR", help="checkpoint folders to average, oldest first")
    source.add_argument(
        "--checkpoint-root", metavar="DIR", help="a Trainer output_dir holding checkpoint-<step> folders"
    )
    parser.add_argument(
        "--last",
        type=int,
        metavar="N",
        help="with --checkpoint-root: average the N highest steps (paper: 5 base, 20 big)",
    )
    parser.add_argument("--output-dir", required=True, help="where the averaged model is saved")
    parser.add_argument(
        "--weights",
        choices=AVERAGING_WEIGHTS,
        default="uniform",
        help="uniform: the mean (paper); linear: the k-th checkpoint, oldest first, weighs k",
    )
    parser.add_argument("--force", action="store_true", help="replace a model already saved in --output-dir")
    return parser


def parse_args(argv=None, prog: str = "vanilla-transformer average") -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if (args.checkpoint_root is None) != (args.last is None):
        parser.error("--checkpoint-root and --last go together")
    if args.last is not None and args.last < 1:
        parser.error(f"--last must be at least 1 (a number of checkpoints), got {args.last}")
    return args


def check_output_dir(output_dir: Path, force: bool, flags: tuple[str, str] = ("--output-dir", "--force")) -> None:
    """Never overwrite a saved model unasked: it may be the only copy of an earlier average. ``flags``: how the
    caller names the folder and the permission (the command line's, or the Python arguments)."""
    if problem := unwritable_folder(output_dir, flags[0]):
        raise ValueError(problem)
    if (output_dir / WEIGHTS_NAME).exists() and not force:
        raise FileExistsError(
            f"{flags[0]} {output_dir} already holds a model ({WEIGHTS_NAME}); choose a new "
            f"folder, or pass {flags[1]} to replace it."
        )


def main(argv=None, prog: str = "vanilla-transformer average") -> Path:
    """``vanilla-transformer average``: the folder the averaged model was saved in."""
    args = parse_args(argv, prog)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    check_output_dir(Path(args.output_dir), args.force)
    checkpoints = args.inputs or last_checkpoints(args.checkpoint_root, args.last)
    output_dir = average_checkpoints(checkpoints, args.output_dir, args.weights, force=args.force)
    root = Path(args.checkpoint_root) if not args.inputs else None
    names = ", ".join(named(Path(folder), root) if root else Path(folder).name for folder in checkpoints)
    print(f"averaged {len(checkpoints)} checkpoint(s) ({names}, {args.weights} weights) into {output_dir}")
    return output_dir


if __name__ == "__main__":
    from vanilla_transformer.cli import run_command

    run_command("average", sys.argv[1:])
