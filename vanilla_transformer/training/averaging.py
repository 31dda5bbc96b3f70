"""Average the weights of several checkpoints into one model (Vaswani et al., 2017, §6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints, which
were written at 10-minute intervals. For the big models, we averaged the last 20 checkpoints."
Averaging the parameters of the last checkpoints of one run smooths out the noise of the final
updates and is free at inference time: the result is one ordinary model.

Each checkpoint is a Hub-format folder (``config.json`` + ``model.safetensors``) as written by
``save_pretrained`` or the Trainer. The tensors are read with safetensors, summed in float64 one
checkpoint at a time (memory: one float64 copy of the model, however many checkpoints) and cast
back to their stored dtype, so each result is the arithmetic mean. Integer and bool tensors are not
averaged: they must be equal in every checkpoint. The averaged tensors are loaded into the newest
checkpoint's model with the library's ``from_pretrained`` and written with ``save_pretrained``, so
the output is a complete Hub folder (tied weights stored once and tied again on load, remote-code
files, generation settings, tokenizer files of the newest checkpoint).

    python training/average_checkpoints.py --checkpoint-root runs/base --last 5 --output-dir runs/base/averaged
    python training/average_checkpoints.py --inputs ckpt-a ckpt-b ckpt-c --output-dir averaged
    average_checkpoints(["runs/base/checkpoint-9000", "runs/base/checkpoint-10000"], "averaged")  # in Python
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForSeq2SeqLM


WEIGHTS_NAME = "model.safetensors"
GENERATION_CONFIG_NAME = "generation_config.json"
# Copied byte for byte from the newest checkpoint when present, with any tokenizer remote code.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt",
)
TOKENIZER_CODE_GLOB = "tokenization_*.py"
# Config fields that may differ between checkpoints of one architecture: bookkeeping and
# training-only settings. Everything else (d_model, heads, layers, ...) must match.
CONFIG_FIELDS_ALLOWED_TO_DIFFER = frozenset({
    "transformers_version", "_name_or_path", "_commit_hash", "use_cache",
    "dropout", "attention_dropout", "activation_dropout",
})
CHECKPOINT_DIR = re.compile(r"checkpoint-(\d+)")


# ---------------------------------------------------------------------------------------------
# Finding and checking the checkpoints
# ---------------------------------------------------------------------------------------------


def last_checkpoints(root: str | Path, last: int) -> list[Path]:
    """The `last` ``checkpoint-<step>`` folders of a Trainer output dir, oldest first, by integer step."""
    root = Path(root)
    if last < 1:
        raise ValueError(f"--last must be at least 1, got {last}.")
    found = sorted(
        (int(match.group(1)), path)
        for path in (root.iterdir() if root.is_dir() else [])
        if path.is_dir() and (match := CHECKPOINT_DIR.fullmatch(path.name))
    )
    if last > len(found):
        raise ValueError(
            f"--last {last} asks for more checkpoints than {root} holds: it has {len(found)} "
            f"checkpoint-<step> folder(s){' (' + ', '.join(p.name for _, p in found) + ')' if found else ''}. "
            f"Pass --last {len(found)} or fewer, or point --checkpoint-root at the Trainer's output_dir."
        )
    return [path for _, path in found[len(found) - last:]]


def check_folders(checkpoints: list[Path]) -> None:
    if not checkpoints:
        raise ValueError("No checkpoints to average: give at least one checkpoint folder.")
    for folder in checkpoints:
        if not (folder / WEIGHTS_NAME).is_file():
            raise ValueError(
                f"Checkpoint {folder} has no {WEIGHTS_NAME}. Give Hub-format folders written by "
                f"save_pretrained or the Trainer (save_safetensors, one shard)."
            )


def architecture(folder: Path) -> dict:
    config = AutoConfig.from_pretrained(folder).to_dict()
    return {key: value for key, value in config.items() if key not in CONFIG_FIELDS_ALLOWED_TO_DIFFER}


def check_same_architecture(checkpoints: list[Path]) -> None:
    reference = architecture(checkpoints[0])
    for folder in checkpoints[1:]:
        config = architecture(folder)
        differing = sorted(key for key in reference.keys() | config.keys() if reference.get(key) != config.get(key))
        if differing:
            details = ", ".join(f"{key}: {reference.get(key)!r} vs {config.get(key)!r}" for key in differing)
            raise ValueError(
                f"Checkpoint {folder} has a different model architecture from {checkpoints[0]} ({details}). "
                f"Only checkpoints of one model (one training run) can be averaged."
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


def average_tensors(checkpoints: list[Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of each stored tensor, summed in float64, in its stored dtype."""
    first = checkpoints[0]
    reference = load_file(first / WEIGHTS_NAME)
    sums = {name: tensor.double() for name, tensor in reference.items() if tensor.is_floating_point()}
    for folder in checkpoints[1:]:
        tensors = load_file(folder / WEIGHTS_NAME)
        check_same_names(set(tensors), set(reference), folder, first)
        for name, tensor in tensors.items():
            check_compatible(name, tensor, reference[name], folder, first)
            if name in sums:
                sums[name] += tensor.double()
    return {
        name: (sums[name] / len(checkpoints)).to(tensor.dtype) if name in sums else tensor
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


def copy_side_files(newest: Path, output_dir: Path) -> None:
    """Generation settings and tokenizer files of the newest checkpoint, byte for byte."""
    names = [*TOKENIZER_FILES, GENERATION_CONFIG_NAME]
    files = [newest / name for name in names if (newest / name).is_file()]
    files += sorted(newest.glob(TOKENIZER_CODE_GLOB))
    for path in files:
        shutil.copy2(path, output_dir / path.name)


def average_checkpoints(checkpoints: list[str | Path], output_dir: str | Path) -> Path:
    """Average the weights of `checkpoints` (oldest first) into a Hub-format folder `output_dir`.

    Config, generation settings and tokenizer are taken from the last (newest) checkpoint. Raises
    ValueError when there is nothing to average or the checkpoints are not of one model.
    """
    checkpoints = [Path(folder) for folder in checkpoints]
    output_dir = Path(output_dir)
    check_folders(checkpoints)
    if any(output_dir.resolve() == folder.resolve() for folder in checkpoints):
        raise ValueError(f"--output-dir {output_dir} is one of the inputs; choose a new folder.")
    check_same_architecture(checkpoints)
    model = load_averaged_model(checkpoints[-1], average_tensors(checkpoints))
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    copy_side_files(checkpoints[-1], output_dir)
    return output_dir


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--inputs", nargs="+", metavar="DIR", help="checkpoint folders to average, oldest first")
    source.add_argument(
        "--checkpoint-root", metavar="DIR", help="a Trainer output_dir holding checkpoint-<step> folders"
    )
    parser.add_argument(
        "--last", type=int, metavar="N",
        help="with --checkpoint-root: average the N highest steps (paper: 5 base, 20 big)",
    )
    parser.add_argument("--output-dir", required=True, help="where the averaged model is saved")
    args = parser.parse_args(argv)
    if (args.checkpoint_root is None) != (args.last is None):
        parser.error("--checkpoint-root and --last go together")
    return args


def main(argv=None) -> Path:
    args = parse_args(argv)
    checkpoints = args.inputs or last_checkpoints(args.checkpoint_root, args.last)
    output_dir = average_checkpoints(checkpoints, args.output_dir)
    names = ", ".join(Path(folder).name for folder in checkpoints)
    print(f"averaged {len(checkpoints)} checkpoint(s) ({names}) into {output_dir}")
    return output_dir


if __name__ == "__main__":
    main()
