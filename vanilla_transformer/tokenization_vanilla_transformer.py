"""The joint BPE tokenizer of the Transformer, and a function and command line to train one.

§5.1 of the paper: "Sentences were encoded using byte-pair encoding, which has a shared
source-target vocabulary of about 37000 tokens." `train_tokenizer` learns such a vocabulary over
source and target text together, and `VanillaTransformerTokenizer` wraps it as a fast transformers
tokenizer (``tokenizer.json`` + ``tokenizer_config.json``).

Why byte-level BPE: its base alphabet is the 256 byte values, so every Unicode string has an
encoding (``<unk>`` never appears, whatever the script or emoji) and the ByteLevel decoder inverts
it exactly, spaces, tabs and newlines included. BPE with ``byte_fallback`` also avoids ``<unk>``,
but needs the Metaspace pre-tokenizer, whose decoder drops a leading space, so that round trip is
not exact. The only change made to text is NFKC normalisation (e.g. "ﬁ" -> "fi").

Special tokens get fixed ids, the defaults of `VanillaTransformerConfig`: ``<pad>`` 0, ``<unk>`` 1,
``<s>`` 2 (the decoder's start token) and ``</s>`` 3, which is appended to every sequence, source
and target alike. Written as text, ``<s>`` and ``</s>`` are plain characters (an HTML ``<s>`` tag
must not become a start token), so ``split_special_tokens`` is on. That setting is saved in
``tokenizer_config.json``, not ``tokenizer.json``: users of the bare ``tokenizers`` library set
``encode_special_tokens = True`` to get the same ids.

This file is also copied next to saved weights and loaded as Hub remote code
(``trust_remote_code=True``) where the package is not installed, so it imports only the standard
library, ``tokenizers`` and ``transformers``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib
import io
import json
import os
import re
import sys
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import TokenizersBackend
from transformers.utils import logging

logger = logging.get_logger(__name__)

PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, EOS_TOKEN = "<pad>", "<unk>", "<s>", "</s>"
# The trainer gives special tokens the first ids in this order; VanillaTransformerConfig's defaults
# (pad_token_id=0, bos_token_id=decoder_start_token_id=2, eos_token_id=3) rely on it.
SPECIAL_TOKENS = [PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, EOS_TOKEN]
BYTE_ALPHABET = pre_tokenizers.ByteLevel.alphabet()
MIN_VOCAB_SIZE = len(BYTE_ALPHABET) + len(SPECIAL_TOKENS)
DEFAULT_VOCAB_SIZE = 37000  # §5.1, WMT 2014 English-German
# The longest input (in tokens) that `truncation=True` keeps: VanillaTransformerConfig's default
# max_position_embeddings. Set it to the model's when that differs (train.py does).
DEFAULT_MODEL_MAX_LENGTH = 1024
GZIP_MAGIC = b"\x1f\x8b"
# What other compressed files start with: refused by name, not read as text that is "not valid UTF-8"
# Each kind's magic bytes at the start of a file; bzip2's "BZh" is followed by a level and a block's (or the end's)
# magic, so that text starting "BZh" is still read as text.
OTHER_COMPRESSIONS = {
    re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)"): "bzip2",
    re.compile(re.escape(b"\xfd7zXZ\x00")): "xz",
    re.compile(re.escape(b"\x28\xb5\x2f\xfd")): "zstd",
    re.compile(re.escape(b"PK\x03\x04")): "zip",
}
# What holds pairs rather than one sentence a line: `vanilla-transformer train --train_file` reads these.
PAIR_FILE_SUFFIXES = (".jsonl", ".json", ".tsv")


class VanillaTransformerTokenizer(TokenizersBackend):
    """Fast byte-level BPE tokenizer with a joint source-target vocabulary (§5.1).

    Create one with `train_tokenizer` and reload it with ``AutoTokenizer.from_pretrained``.
    ``tokenizer(source, text_target=target)`` returns ``input_ids`` and ``labels``, both ending in
    ``</s>``; pad batches of labels with `transformers.DataCollatorForSeq2Seq` (-100).

    Class attributes only, no ``__init__``: a subclass with its own ``__init__`` is rebuilt by
    ``from_pretrained`` from vocab and merges, and can lose the pre-tokenizer without a word; without
    one, ``tokenizer.json`` loads exactly as saved. Its post-processor appends ``</s>``; the
    ``add_eos_token`` property does not show that (transformers 5 does not save it next to a
    ``tokenizer.json``) and setting ``add_bos_token`` or ``add_eos_token`` replaces that
    post-processor.
    """

    padding_side = "right"
    model_input_names = ["input_ids", "attention_mask"]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """The saved tokenizer, its ``model_max_length`` lowered to the ``max_position_embeddings`` of the
        model saved in the same folder, if smaller: so that ``truncation=True`` keeps inputs the model
        accepts, whoever saved the folder (a Trainer saves the tokenizer as it was given)."""
        folder = pretrained_model_name_or_path
        given = kwargs.get("tokenizer_file") is not None or kwargs.get("tokenizer_object") is not None  # elsewhere
        if isinstance(folder, str | os.PathLike) and os.path.isdir(folder) and not given:
            if not os.path.isfile(os.path.join(folder, kwargs.get("subfolder") or "", "tokenizer.json")):
                raise FileNotFoundError(  # transformers would blame a missing sentencepiece or tiktoken
                    f"{folder} has no tokenizer.json, which holds this tokenizer's whole vocabulary: copy it from "
                    "where the tokenizer was saved (tokenizer.save_pretrained writes it)."
                )
        tokenizer = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        positions = _positions_saved_with(pretrained_model_name_or_path, kwargs)
        if positions is not None and tokenizer.model_max_length > positions:
            tokenizer.model_max_length = positions
        return tokenizer

    def add_special_tokens(self, special_tokens_dict, *args, **kwargs):
        """`add_special_tokens`, saying that a new special token is not matched in text: special tokens are
        split there (``split_special_tokens=True``, so that a "</s>" typed in a sentence stays text), so a tag
        such as "<2de>" in a sentence is read as its bytes. ``tokenizer.add_tokens(["<2de>"])`` matches it."""
        added = super().add_special_tokens(special_tokens_dict, *args, **kwargs)
        values = [
            v for value in special_tokens_dict.values() for v in (value if isinstance(value, list | tuple) else [value])
        ]
        if self.split_special_tokens and (new := sorted({str(v) for v in values} - set(SPECIAL_TOKENS))):
            logger.warning(
                f"{', '.join(new)}: special tokens of this tokenizer are not matched in text "
                "(split_special_tokens=True, so that '</s>' in a sentence stays text); to match a tag in text, "
                "add it with tokenizer.add_tokens([...]) instead."
            )
        return added


def _positions_saved_with(name_or_path, kwargs: dict) -> int | None:
    """``max_position_embeddings`` of the config.json beside the tokenizer (a folder, or a Hub repo in the
    cache or reachable), or None where there is none."""
    from transformers.utils import cached_file

    hub = {
        key: kwargs[key] for key in ("cache_dir", "revision", "token", "local_files_only", "subfolder") if key in kwargs
    }
    try:
        path = cached_file(
            name_or_path,
            "config.json",
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
            **hub,
        )
    except OSError:
        return None
    if path is None:
        return None
    with open(path, encoding="utf-8") as file:
        positions = json.load(file).get("max_position_embeddings")
    return positions if isinstance(positions, int) else None


def train_tokenizer(
    texts_or_files: Iterable[str] | list[str | os.PathLike],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_frequency: int = 2,
    show_progress: bool = False,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
) -> VanillaTransformerTokenizer:
    """Learn one BPE vocabulary over all the given text (source and target together).

    Args:
        texts_or_files: training sentences (any iterable of ``str``, read once), or a list of paths
            of UTF-8 text files with one sentence per line, plain or gzip-compressed. A list or
            tuple is read as files when any item is a ``pathlib.Path`` or names an existing file;
            one whose every item looks like a file's name (no spaces; a suffix such as ``.gz``,
            ``.txt`` or ``.en``) but names none is refused (mistyped paths). Pass texts as
            an iterator (``iter(texts)``) to rule both out.
        vocab_size: the most tokens the vocabulary gets, special tokens included; at least
            `MIN_VOCAB_SIZE` (256 bytes + 4 special tokens). Training stops earlier when no pair
            of symbols occurs ``min_frequency`` times any more; size the model with
            ``len(tokenizer)``.
        min_frequency: a pair of symbols must occur this often to be merged.
        show_progress: show the trainer's progress bar.
        model_max_length: the longest input ``truncation=True`` keeps (and pipelines cut to); the
            model's ``max_position_embeddings`` (1024 for every preset).
    """
    _check_training_sizes(vocab_size, min_frequency)
    texts = _TextStream(_training_texts(texts_or_files))
    backend = _untrained_backend()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=BYTE_ALPHABET,  # all 256 bytes, seen in training or not: no <unk>, ever
        show_progress=show_progress,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    if not texts.has_text:
        raise NoTrainingText(
            "texts_or_files contains no text (no items, or only empty or whitespace lines); "
            "pass at least one non-empty sentence or a file that has one."
        )
    backend.post_processor = _eos_template(backend)
    if backend.get_vocab_size() < vocab_size:
        logger.warning(
            f"The trained vocabulary has {backend.get_vocab_size()} tokens, fewer than vocab_size="
            f"{vocab_size}: no pair of symbols is frequent enough (min_frequency={min_frequency}) for "
            "another merge. A model for it needs vocab_size=len(tokenizer) (vanilla-transformer train sizes its new model so)."
        )
    return VanillaTransformerTokenizer(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,  # it deletes spaces before punctuation: not a round trip
        split_special_tokens=True,
        model_max_length=model_max_length,
    )


class NoTrainingText(ValueError):
    """What `train_tokenizer` was given holds no sentence."""


def _check_training_sizes(vocab_size, min_frequency) -> None:
    for name, value in (("vocab_size", vocab_size), ("min_frequency", min_frequency)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r}).")
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} cannot hold the {len(BYTE_ALPHABET)} byte-level symbols plus the "
            f"{len(SPECIAL_TOKENS)} special tokens {SPECIAL_TOKENS}; use vocab_size >= {MIN_VOCAB_SIZE} "
            f"(the paper used {DEFAULT_VOCAB_SIZE})."
        )
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be at least 1, got {min_frequency}.")


def _untrained_backend() -> Tokenizer:
    backend = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    backend.normalizer = normalizers.NFKC()
    # add_prefix_space=False: a prefix space would come back from decode, breaking the round trip.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def _eos_template(backend: Tokenizer) -> processors.TemplateProcessing:
    """Append </s> to every sequence; no <s> on the source (the decoder gets it as its start token)."""
    return processors.TemplateProcessing(
        single=f"$A:0 {EOS_TOKEN}:0",
        pair=f"$A:0 {EOS_TOKEN}:0 $B:1 {EOS_TOKEN}:1",
        special_tokens=[(EOS_TOKEN, backend.token_to_id(EOS_TOKEN))],
    )


class _TextStream:
    """Passes texts through to the trainer and records whether any of them had content."""

    def __init__(self, texts: Iterator[str]):
        self._texts = texts
        self.has_text = False

    def __iter__(self) -> Iterator[str]:
        for text in self._texts:
            self.has_text = self.has_text or bool(text.strip())
            yield text


def _training_texts(texts_or_files) -> Iterator[str]:
    """Training sentences from either form of `train_tokenizer`'s first argument."""
    if isinstance(texts_or_files, (str, bytes, os.PathLike)):
        raise TypeError(
            f"texts_or_files must be a list of texts or of file paths, not a single "
            f"{type(texts_or_files).__name__}; wrap it in a list: [{texts_or_files!r}]."
        )
    if not isinstance(texts_or_files, Iterable):
        raise TypeError(
            f"texts_or_files must be an iterable of str or a list of file paths, got {type(texts_or_files).__name__}."
        )
    if isinstance(texts_or_files, (list, tuple)) and _names_files(texts_or_files):
        return _lines_of_files(_checked_paths(texts_or_files))
    if isinstance(texts_or_files, (list, tuple)) and texts_or_files and all(map(_looks_like_a_path, texts_or_files)):
        raise FileNotFoundError(  # else the file names would be the training text: a vocabulary of bytes
            f"texts_or_files looks like a list of file paths, but no such file exists: {texts_or_files[0]!r} (item "
            "0), in the current folder " + repr(os.getcwd()) + ". Give the files' paths; to train on these strings "
            "as text, pass them as an iterator (iter([...]))."
        )
    return _checked_texts(texts_or_files)


# a text file's name: a corpus suffix or a language code, alone or before a compression suffix; or any file in a
# folder (a drive letter allowed)
TEXT_FILE = r"[^\s@:/\\]+\.((txt|tsv|csv|jsonl?|src|tgt|tok|bpe|sgm|xml|[a-z]{2,3})(\.(gz|xz|bz2|zst))?|gz|xz|bz2|zst)"
PATH_LIKE = re.compile(rf"{TEXT_FILE}|([A-Za-z]:)?[^\s@:]*[/\\]([^\s@:/\\]+\.[A-Za-z0-9]{{1,5}}|{TEXT_FILE})")


def _looks_like_a_path(item) -> bool:
    """A string without spaces or "@" named as a text file is (``train.en.gz``, ``train.src``) or as a file in a
    folder (``data/news.txt``, ``C:\\corpus\\a.en``): not a sentence, a URL or an e-mail address."""
    return isinstance(item, str) and PATH_LIKE.fullmatch(item) is not None


def _names_files(items: list | tuple) -> bool:
    return any(isinstance(item, os.PathLike) or isinstance(item, str) and os.path.isfile(item) for item in items)


def _checked_texts(texts: Iterable) -> Iterator[str]:
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(
                f"item {index} of texts_or_files is a {type(text).__name__}, not a str; pass decoded "
                "text (e.g. line.decode('utf-8')) or a list of file paths."
            )
        yield text


def _checked_paths(items: list | tuple) -> list[Path]:
    """Check every training file before training starts, so that a bad path fails fast."""
    paths = []
    for index, item in enumerate(items):
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(
                f"item {index} of texts_or_files is a {type(item).__name__}; a list of training files "
                "may hold only str or pathlib.Path paths."
            )
        path = Path(item)
        where = f"training file {str(path)!r} (item {index} of texts_or_files)"
        if not path.exists():
            raise FileNotFoundError(
                f"{where} does not exist; fix the path. (A list is read as files when any item is a "
                "pathlib.Path or names an existing file; to train on texts, pass iter(texts).)"
            )
        if path.is_dir():
            raise IsADirectoryError(
                f"{where} is a directory; pass the text files in it, e.g. sorted(Path({str(path)!r}).glob('*.gz'))."
            )
        if not os.access(path, os.R_OK):
            raise PermissionError(f"{where} is not readable; give the current user read permission.")
        if problem := _pair_file_problem(path):
            raise ValueError(f"{where}: {problem}")
        paths.append(path)
    return paths


def decoded_lines(lines, name: str) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of raw byte lines (a file, or standard input): the text without its "\\n" or
    "\\r\\n" (a lone "\\r" stays), a byte-order mark at the start dropped; invalid UTF-8 is an error naming
    ``name`` and the line. The rules every reader of text in the package follows (training/data.py too)."""
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            if number == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16's byte-order mark
                raise ValueError(
                    f"{name} is UTF-16 text (it starts with UTF-16's byte-order mark), as Windows PowerShell "
                    "writes it; convert it to UTF-8 (e.g. iconv -f utf-16 -t utf-8)."
                ) from None
            raise ValueError(
                f"{name}, line {number}: not valid UTF-8 ({error.reason} at byte {error.start} of the line); "
                "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)."
            ) from None
        if number == 1:
            text = text.removeprefix("\ufeff")
        yield number, text.removesuffix("\n").removesuffix("\r")


def _lines_of_files(paths: list[Path]) -> Iterator[str]:
    for path in paths:
        name = f"training file {str(path)!r}"
        try:
            with open_text_bytes(path, name) as lines:
                for _, text in decoded_lines(lines, name):
                    yield text
        except (OSError, EOFError, zlib.error) as error:
            raise ValueError(
                f"cannot read {name}: {error}. Training files hold UTF-8 text, one sentence per line, plain or "
                "gzip-compressed."
            ) from error


@contextlib.contextmanager
def open_text_bytes(path: str | os.PathLike, name: str):
    """A plain or gzip-compressed file's byte lines, told apart by content, not suffix; another compression is
    an error naming ``name``. The file is opened once: a pipe (``<(zcat train.en.gz)``) cannot be read again,
    so the bytes read to tell are put back in front. The one opener of text files in the package."""
    with open(path, "rb") as file:
        head = file.read(10)
        for magic, kind in OTHER_COMPRESSIONS.items():
            if magic.match(head):
                raise ValueError(f"{name} is {kind}-compressed; decompress it, or recompress it with gzip.")
        stream = io.BufferedReader(_Prefixed(head, file))
        suffix_gz = str(path).endswith(".gz")
        if head.startswith(GZIP_MAGIC):
            if not suffix_gz:
                logger.info(f"{name} is gzip-compressed (read as such, whatever its suffix)")
            with gzip.GzipFile(fileobj=stream, mode="rb") as unzipped:
                yield unzipped
        else:
            if suffix_gz:
                logger.warning(f"{name} ends in .gz but is not gzip-compressed: reading it as plain text")
            yield stream


class _Prefixed(io.RawIOBase):
    """``head`` (bytes already read), then the rest of ``file``."""

    def __init__(self, head: bytes, file):
        self.head, self.file = head, file

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.head:
            count = min(len(buffer), len(self.head))
            buffer[:count], self.head = self.head[:count], self.head[count:]
            return count
        return self.file.readinto(buffer)


def build_parser(prog: str = "vanilla-transformer tokenizer") -> argparse.ArgumentParser:
    # the package's parser (run installed, never as remote code): a misspelt or abbreviated flag is refused with
    # the closest one, as every other command's
    parser = importlib.import_module("vanilla_transformer.command_line").CommandParser(
        prog=prog,
        description="Train the joint source-target byte-level BPE vocabulary of the Transformer (§5.1).",
        epilog="Every flag is also accepted with underscores (--vocab_size).",
    )
    parser.add_argument(
        "files",
        nargs="+",
        type=Path,
        help="text files, one sentence per line, plain or .gz; give source and target files together",
    )
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="most tokens (default: %(default)s)")
    parser.add_argument(
        "--min-frequency", type=int, default=2, help="fewest occurrences of a merged pair (default: %(default)s)"
    )
    parser.add_argument("--output-dir", type=Path, required=True, help="folder to save the tokenizer in")
    parser.add_argument(
        "--force", action="store_true", help="replace a tokenizer already in --output-dir (a model's too)"
    )
    return parser


def _command_line_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in its own words (flags, not `train_tokenizer`'s arguments)."""
    # (importlib: a model file imports nothing of the package's but model files, and the command runs installed)
    if problem := importlib.import_module("vanilla_transformer.command_line").unwritable_folder(
        args.output_dir, "--output-dir"
    ):
        return problem
    held = [
        name
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json")
        if (args.output_dir / name).is_file()
    ]
    if held and not args.force:
        what = "a model, whose weights need the tokenizer saved with it" if "config.json" in held else "a tokenizer"
        return (
            f"--output-dir {args.output_dir} already holds {what} ({', '.join(held)}); give a new folder, or --force "
            "to replace it."
        )
    if args.vocab_size < MIN_VOCAB_SIZE:
        return (
            f"--vocab-size {args.vocab_size} cannot hold the {len(BYTE_ALPHABET)} byte-level symbols and the "
            f"{len(SPECIAL_TOKENS)} special tokens; give --vocab-size {MIN_VOCAB_SIZE} or more (the paper: "
            f"{DEFAULT_VOCAB_SIZE})."
        )
    if args.min_frequency < 1:
        return f"--min-frequency must be 1 or more, got {args.min_frequency}."
    for path in args.files:
        if not path.exists():
            return f"{path} does not exist; fix the path."
        if path.is_dir():
            return f"{path} is a folder; give the text files in it (e.g. {path}/*.gz)."
        if not os.access(path, os.R_OK):
            return f"{path} is not readable; give the current user read permission."
        if problem := _pair_file_problem(path):
            return f"{path}: {problem}"
    return None


def _pair_file_problem(path: Path) -> str | None:
    """A file of pairs (.jsonl, .json, .tsv, gzipped or not) given as one sentence a line: its JSON keys and
    escapes or both languages of a line would be trained on as text."""
    suffix = Path(path.name.removesuffix(".gz")).suffix.lower()
    if suffix not in PAIR_FILE_SUFFIXES:
        return None
    return (
        f"a {suffix} file holds pairs, not one sentence a line; train the tokenizer on its pairs with "
        f"`vanilla-transformer train --train_file {path} --tokenizer_only true --output_dir DIR`, or give text files."
    )


def main(argv: list[str] | None = None, prog: str = "vanilla-transformer-train-tokenizer") -> None:
    """Command line: train a tokenizer on text files and save it with ``save_pretrained``; bad input ends
    in one line, exit status 2."""
    parser = build_parser(prog)
    # the installed package's spellings (this function is not remote code): --vocab_size as --vocab-size
    with_dashes = importlib.import_module("vanilla_transformer.command_line").with_dashes
    args = parser.parse_args(with_dashes(list(sys.argv[1:] if argv is None else argv), parser))
    if problem := _command_line_problem(args):
        parser.exit(2, f"{parser.prog}: error: {problem}\n")
    try:
        tokenizer = train_tokenizer(
            args.files,
            vocab_size=args.vocab_size,
            min_frequency=args.min_frequency,
            show_progress=sys.stderr.isatty(),
        )
    except NoTrainingText:
        names = " ".join(str(path) for path in args.files)
        parser.exit(
            2, f"{parser.prog}: error: {names}: no sentence, only empty or blank lines; give files with text.\n"
        )
    except (TypeError, ValueError, OSError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    tokenizer.save_pretrained(args.output_dir)
    print(f"Saved a tokenizer with {len(tokenizer)} tokens to {args.output_dir}")


if __name__ == "__main__":
    # `python -m` runs this file as `__main__`, a second copy of the module whose class is not the
    # one the package registered for AutoTokenizer; the package's copy saves the `auto_map` and this
    # file along with the tokenizer. (importlib, not `import`: transformers scans this file's import
    # statements for packages that remote code needs.)
    importlib.import_module("vanilla_transformer.cli").run_command("tokenizer", sys.argv[1:])
