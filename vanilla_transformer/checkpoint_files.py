"""What a saved model folder must hold, checked before any long work starts.

A write cut short (``kill -9``, a full disk, an interrupted copy or download) leaves files that
fail much later, with errors that name neither the folder nor the file: a truncated
``model.safetensors`` when the weights are read, a truncated ``optimizer.pt`` only after a resumed
run has read and tokenised its data. These checks read headers and sizes (and the checksums of
torch's zip archives), so they cost little next to loading, and they say which folder, which file,
and what to do. A folder that is not on this machine (a Hub id) is not checked here: the Hub client
verifies what it downloads.

Used by ``translate.py``, ``average_checkpoints.py``, ``train.py --resume_from_checkpoint`` and
``python -m vanilla_transformer.convert``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import zipfile
from pathlib import Path

from tokenizers import Tokenizer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX_NAME = "model.safetensors.index.json"
CHECKPOINT_NAME = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)")  # the Trainer's checkpoint-<step> folders
LEFT_OUT_NAME = "left_out.json"  # what a checkpoint saved after SIGTERM had no time for, and why
EMA_FILE = "ema.safetensors"  # a checkpoint's moving average of the weights (--ema_decay)
TORCH_WEIGHTS_NAME = "pytorch_model.bin"  # older checkpoints (e.g. opus-mt), a torch zip archive
MODEL_WEIGHTS = (SAFETENSORS_NAME, SAFETENSORS_INDEX_NAME, TORCH_WEIGHTS_NAME)  # a saved model's weights
# Any one of these makes AutoTokenizer.from_pretrained find a tokenizer in a folder.
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "source.spm", "spiece.model")
# What decides a saved tokenizer's ids: ours (tokenizer.json), a byte-level BPE's vocabulary and merges, a
# sentencepiece model (MarianTokenizer's source.spm, target.spm and target_vocab.json; T5's spiece.model)
TOKENIZER_VOCABULARY_FILES = (
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
    "source.spm",
    "target.spm",
    "target_vocab.json",
    "spiece.model",
)
# A saved tokenizer's files, each loaded by from_pretrained where present: copied and published together
TOKENIZER_FILES = (*TOKENIZER_VOCABULARY_FILES, "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


logger = logging.getLogger(__name__)


def warn_if_an_average_is_beside(folder: str | Path, flag: str, done: str = "loaded") -> None:
    """A checkpoint of an --ema_decay run holds the trained weights (model.safetensors) and their moving average
    (ema.safetensors); from_pretrained loads the first. Said where such a folder is loaded to fine-tune, evaluate
    or translate (or ``done`` otherwise: published), with where the average is a model of its own: the run's
    final folder."""
    path = Path(folder)
    if (path / EMA_FILE).is_file():
        logger.warning(
            f"{flag} {folder}: a checkpoint of a run with --ema_decay; its trained weights (model.safetensors) are "
            f"{done}, not their moving average ({EMA_FILE}), which the run's final model in {path.parent} holds "
            "once that run has finished."
        )


class DamagedFileError(ValueError):
    """A file that exists but cannot be what it claims to be (truncated, corrupt, not parseable)."""


def _damaged(path: Path, what: str, detail: str, remedy: str) -> DamagedFileError:
    return DamagedFileError(
        f"{what}: {path} is truncated or corrupt ({detail}), e.g. by an interrupted save, copy or download. {remedy}"
    )


def check_safetensors(
    path: str | os.PathLike, what: str = "weights", remedy: str = "Save or download it again."
) -> None:
    """A .safetensors file whose header parses and whose tensors end exactly where the file ends.

    The format is an 8-byte little-endian header length, a JSON header with each tensor's
    ``data_offsets``, then the data: a file cut short, or grown by garbage, no longer adds up.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        if size < 8 or length > size - 8:
            raise _damaged(path, what, f"{size} bytes, shorter than its own header says", remedy)
        try:
            header = json.loads(file.read(length))
            end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise _damaged(path, what, "its header is not valid safetensors JSON", remedy) from None
    if 8 + length + end != size:
        raise _damaged(path, what, f"{size} bytes where its header describes {8 + length + end}", remedy)


def check_torch_archive(path: str | os.PathLike, what: str, remedy: str) -> None:
    """A file written by ``torch.save`` (a zip archive): complete, and every member's checksum right."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise _damaged(path, what, str(error), remedy) from None
    if bad is not None:
        raise _damaged(path, what, f"member {bad} fails its checksum", remedy)


def check_json(path: str | os.PathLike, what: str, remedy: str) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise _damaged(path, what, f"not valid JSON: {error}", remedy) from None


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a saved model: one safetensors file, the shards its index names, or an
    older ``pytorch_model.bin``."""
    if (folder / SAFETENSORS_NAME).is_file():
        return [folder / SAFETENSORS_NAME]
    index = folder / SAFETENSORS_INDEX_NAME
    if index.is_file():
        shards = check_json(index, f"The weights index of {folder}", "Save the model again.").get("weight_map", {})
        return [folder / name for name in sorted(set(shards.values()))]
    return [folder / TORCH_WEIGHTS_NAME] if (folder / TORCH_WEIGHTS_NAME).is_file() else []


def is_local(name: str | os.PathLike) -> bool:
    """A path that exists here, or one that is clearly meant as a path (not a Hub id ``owner/name``)."""
    text = str(name)
    return Path(text).exists() or text.startswith((".", "/", "~")) or text.count("/") > 1


def from_pretrained_named(load, name: str | os.PathLike, what: str, **kwargs):
    """``load(name, **kwargs)`` (a ``from_pretrained``). A name that is neither a folder here nor loadable
    from the Hub is said so in one line that starts with ``what``, not in the Hub client's many lines."""
    try:
        return load(name, **kwargs)
    except OSError as error:
        if is_local(name):
            raise
        reason = " ".join(str(error).split())
        raise OSError(f"{what}: no such folder here, and not loadable as a Hub model ({reason})") from error


def check_model_folder(
    folder: str | os.PathLike, what: str, remedy: str = "Save or download the model again.", weights: bool = True
) -> None:
    """A local model folder: a directory with a readable config.json and (``weights``) complete weights.

    ``what`` names where the folder came from (e.g. ``"--model runs/en-de"``). Hub ids pass unchecked.
    """
    if not is_local(folder):
        return
    folder = Path(folder).expanduser()
    if not folder.exists():
        raise FileNotFoundError(f"{what}: the folder {folder} does not exist; check the path.")
    if not folder.is_dir():
        raise NotADirectoryError(f"{what}: {folder} is a file; give the folder saved with save_pretrained.")
    if not (folder / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"{what}: {folder} has no {CONFIG_NAME}; give a folder saved with save_pretrained.")
    check_json(folder / CONFIG_NAME, what, remedy)
    if not weights:
        return
    files = weight_files(folder)
    if not files:
        raise FileNotFoundError(
            f"{what}: {folder} has no {SAFETENSORS_NAME} (nor a sharded {SAFETENSORS_INDEX_NAME}); give a folder "
            "saved with save_pretrained."
        )
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"{what}: {path}, named by {folder / SAFETENSORS_INDEX_NAME}, is missing. {remedy}")
        if path.suffix == ".bin":
            check_torch_archive(path, what, remedy)
        else:
            check_safetensors(path, what, remedy)


def has_tokenizer(folder: str | os.PathLike) -> bool:
    return any((Path(folder) / name).is_file() for name in TOKENIZER_MARKERS)


def check_has_tokenizer(folder: str | os.PathLike, what: str, how_to_fix: str) -> None:
    """A local folder that AutoTokenizer can load a tokenizer from (Hub ids pass unchecked)."""
    if not is_local(folder):
        return
    if not Path(folder).exists():
        raise FileNotFoundError(f"{what}: the folder {folder} does not exist; check the path.")
    if not Path(folder).is_dir():
        raise NotADirectoryError(f"{what}: {folder} is a file; give the folder the tokenizer was saved in.")
    if not has_tokenizer(folder):
        raise FileNotFoundError(
            f"{what}: {folder} has no tokenizer (none of {', '.join(TOKENIZER_MARKERS)}). {how_to_fix}"
        )
    if needs_tokenizer_json(folder):
        raise FileNotFoundError(
            f"{what}: {folder} has a tokenizer_config.json for VanillaTransformerTokenizer but no tokenizer.json, "
            f"which holds its vocabulary; copy tokenizer.json from where the tokenizer was saved. {how_to_fix}"
        )


def needs_tokenizer_json(folder: str | os.PathLike) -> bool:
    """A folder whose tokenizer_config.json names our tokenizer, which reads its vocabulary from
    tokenizer.json alone, and that has no tokenizer.json: AutoTokenizer would fail in its own words."""
    folder = Path(folder)
    config = folder / "tokenizer_config.json"
    if (folder / "tokenizer.json").is_file() or not config.is_file():
        return False
    saved = check_json(config, f"The tokenizer of {folder}", "Save the tokenizer again.")
    return isinstance(saved, dict) and saved.get("tokenizer_class") == "VanillaTransformerTokenizer"


def without_runtime_settings(tokenizer_json: dict) -> dict:
    """A parsed tokenizer.json without ``truncation``/``padding``, which are set at call time, not trained."""
    return {key: value for key, value in tokenizer_json.items() if key not in {"truncation", "padding"}}


def written_tokenizer(tokenizer: Tokenizer) -> dict:
    """A tokenizers ``Tokenizer`` as the installed library writes it, parsed, without runtime settings."""
    return without_runtime_settings(json.loads(tokenizer.to_str()))


def same_tokenizer_json(ours: dict, theirs: dict) -> bool:
    """Two parsed tokenizer.json (without runtime settings) give the same ids: equal as they are, or as the
    installed tokenizers library writes both out (a file a release before 0.20 wrote spells the merges as "a b"
    strings, later ones as pairs). A file that library cannot read is compared as it is only."""
    if ours == theirs:
        return True
    try:
        return written_tokenizer(Tokenizer.from_str(json.dumps(ours))) == written_tokenizer(
            Tokenizer.from_str(json.dumps(theirs))
        )
    except Exception:  # the tokenizers library's own error types: a file another release wrote
        return False


def tokenizer_definition(folder: str | os.PathLike) -> dict[str, object]:
    """What decides a saved tokenizer's ids, file by file, to compare two folders.

    ``tokenizer.json`` as parsed JSON without its runtime ``truncation``/``padding`` settings (compare two
    with `same_tokenizer_json`); other vocabulary files byte for byte. An empty dict: the folder has no tokenizer.
    """
    folder, definition = Path(folder), {}
    for name in TOKENIZER_VOCABULARY_FILES:
        path = folder / name
        if not path.is_file():
            continue
        if name == "tokenizer.json":
            content = check_json(path, f"The tokenizer of {folder}", "Save the tokenizer again.")
            definition[name] = without_runtime_settings(content)
        else:
            definition[name] = path.read_bytes()
    return definition


def tokenizer_difference(folder: Path, reference: Path) -> str | None:
    """Why the tokenizer saved in ``folder`` is not the one saved in ``reference``; None when they agree."""
    ours, theirs = tokenizer_definition(folder), tokenizer_definition(reference)
    if not ours or not theirs:
        return None  # nothing to compare on one side
    for name in sorted(ours.keys() | theirs.keys()):
        if name == "tokenizer.json" and name in ours and name in theirs:
            if same_tokenizer_json(ours[name], theirs[name]):
                continue
            parts = sorted(
                key for key in ours[name].keys() | theirs[name].keys() if ours[name].get(key) != theirs[name].get(key)
            )
            return f"their tokenizer.json files differ in {', '.join(parts)}"
        if ours.get(name) != theirs.get(name):
            return f"their {name} files differ"
    return None


def checkpoint_folders(root: str | os.PathLike) -> list[Path]:
    """The ``checkpoint-<step>`` folders of a Trainer output_dir, oldest first (by integer step)."""
    root = Path(root)
    found = [
        (int(match.group(1)), path)
        for path in (root.iterdir() if root.is_dir() else [])
        if path.is_dir() and (match := CHECKPOINT_NAME.fullmatch(path.name))
    ]
    return [path for _, path in sorted(found)]


def left_out(folder: str | os.PathLike) -> dict[str, str]:
    """The files a checkpoint was saved without for lack of time (after SIGTERM), each with why."""
    path = Path(folder) / LEFT_OUT_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
