"""What the ``vanilla-transformer`` command and the library share, on the standard library alone: the
program's name, the packaged recipes and accelerate configs by name, ``--version``'s answer, the packaged
help screens (``help_screens.json``) and the one-line usage error (``PROG: error: MESSAGE``, exit status 2).

The console script (`vanilla_transformer_command`, beside the package) loads this file without importing
the package, whose ``__init__`` imports torch and registers the model (seconds), so that
``vanilla-transformer config ddp``, which ``accelerate launch --config_file $(vanilla-transformer config ddp)``
runs before every launch, answers at once. Hence no imports from the package here, and the files are
found beside this one rather than through ``importlib.resources`` (which would import the package).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

PROG = "vanilla-transformer"
# kind -> (folder in the package, what it holds)
PACKAGED = {"recipe": ("training/recipes", "recipe"), "config": ("training/accelerate_configs", "accelerate config")}
HELP_SCREENS = (
    Path(__file__).resolve().parent / "help_screens.json"
)  # written by `vanilla_transformer.cli.help_screens`
HELP_COLUMNS = 80  # the width the packaged screens and docs/cli.md are rendered at (argparse reads COLUMNS)
# whose versions the help screens depend on: the Trainer's flags (transformers, its defaults from accelerate,
# huggingface_hub, torch); Python's argparse formats them
HELP_DEPENDS_ON = ("torch", "transformers", "accelerate", "huggingface_hub")


def unwritable_folder(folder: str | Path, flag: str) -> str | None:
    """Why ``folder`` (to be created where missing) cannot hold a command's output, or None: asked before the
    work (a tokenizer trained for hours, an average), not when it is saved."""
    folder = Path(folder).expanduser()
    existing = next(path for path in (folder.absolute(), *folder.absolute().parents) if path.exists())
    if not existing.is_dir():
        where = "is a file" if existing == folder.absolute() else f"lies under {existing}, a file"
        return f"{flag} {folder} {where}; give a folder."
    if not os.access(existing, os.W_OK):
        return f"{flag} {folder}: {existing} cannot be written; choose a writable place."
    return None


def did_you_mean(word: str, choices, quoted: bool = True, most: int = 1) -> str:
    """`` (did you mean 'x'?)`` for the ``most`` closest of ``choices`` to a misspelt ``word`` (``'x' or 'y'``
    for more), or "" where none is close: the one wording of every "no such name" error of the package."""
    import difflib  # only for these errors

    close = difflib.get_close_matches(word, list(choices), n=most)
    names = " or ".join(repr(name) if quoted else name for name in close)
    return f" (did you mean {names}?)" if close else ""


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, refusing a flag it does not have with the closest one it has (as train's flags and every
    other name of the command are), before it would ask for a required flag the misspelt one meant. Flags are
    whole words (no abbreviations, which a new flag would make ambiguous), as train's are."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        asks_for_help = any(token in ("-h", "--help") for token in args[: args.index("--") if "--" in args else None])
        if not subcommand_parsers(self) and not asks_for_help:  # a subcommand's parser checks its own flags
            flags = [option for option in self._option_string_actions if option.startswith("--")]
            for token in args:
                if token == "--":  # what follows is positional
                    break
                if " " in token.split("=", 1)[0]:  # a value, for argparse too (--commit-message "--- draft")
                    continue
                if token.startswith("--") and (flag := token.split("=", 1)[0]) not in self._option_string_actions:
                    close = did_you_mean(flag, flags, quoted=False)
                    exit_with_usage_error(
                        self.prog, f"{flag} is not a flag of {self.prog}{close}; see {self.prog} --help."
                    )
        return super().parse_known_args(args, namespace)


def packaged(kind: str) -> dict[str, Path]:
    """The package's files of ``kind`` (recipe, config) by name, in the order of the names."""
    folder = Path(__file__).resolve().parent / PACKAGED[kind][0]
    return dict(sorted((path.stem, path) for path in folder.glob("*.yaml")))


def packaged_path(kind: str, name: str) -> Path:
    """The packaged file of ``kind`` named ``name`` (``.yaml`` optional); ValueError names the closest and all."""
    files = packaged(kind)
    stem = name.removesuffix(".yaml")
    if stem not in files:
        raise ValueError(
            f"There is no {PACKAGED[kind][1]} named {name!r}{did_you_mean(stem, files)}; the package has "
            f"{', '.join(files)}."
        )
    return files[stem]


def packaged_text(kind: str, name: str | None = None) -> str:
    """What ``recipe [NAME]`` and ``config [NAME]`` print: each file's name and path a line; with ``name``,
    its path alone."""
    if name is not None:
        return f"{packaged_path(kind, name)}\n"
    return "".join(f"{each}\t{path}\n" for each, path in packaged(kind).items())


def packaged_usage(kind: str) -> str:
    """What ``recipe --help`` and ``config --help`` print: the usage, what each form prints, and the names."""
    what = PACKAGED[kind][1]
    return (
        f"usage: {PROG} {kind} [NAME]\n\n"
        f"Without NAME: each packaged {what}'s name and path, a line each (tab between them).\n"
        f"With NAME (.yaml optional): that {what}'s path alone.\n\n"
        f"names: {', '.join(packaged(kind))}\n"
    )


def recipe_names() -> list[str]:
    return list(packaged("recipe"))


def recipe_path(name: str) -> Path:
    """The packaged recipe ``name`` (``multi30k``, ``wmt14-en-de-base``, ...): its YAML file of flags."""
    return packaged_path("recipe", name)


def accelerate_config_names() -> list[str]:
    return list(packaged("config"))


def accelerate_config_path(name: str) -> Path:
    """The packaged accelerate config ``name`` (``single``, ``ddp``, ``fsdp``) for ``accelerate launch --config_file``."""
    return packaged_path("config", name)


def version_text() -> str:
    """``vanilla-transformer X.Y.Z``, from the installed distribution's metadata; a one-line error without one."""
    from importlib import metadata  # ~20 ms, only here

    try:
        return f"{PROG} {metadata.version(PROG)}\n"
    except metadata.PackageNotFoundError:
        exit_with_usage_error(
            PROG,
            f"the {PROG} distribution is not installed, so it has no version: run "
            "`pip install -e .` in the clone (or `pip install vanilla-transformer`)",
        )


def help_rendered_with() -> dict[str, str | None]:
    """The versions a help screen rendered now depends on: Python's (major.minor) and the installed
    distributions' (release, without a local label such as ``+cpu``), read from metadata, not imported."""
    from importlib import metadata

    def release(distribution: str) -> str | None:
        try:
            return metadata.version(distribution).split("+")[0]
        except metadata.PackageNotFoundError:
            return None

    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        **{name: release(name) for name in HELP_DEPENDS_ON},
    }


def packaged_help(command: str) -> str | None:
    """The packaged ``--help`` screen of ``command`` ("" for the command list), or None when the installed
    versions are not those it was rendered with (or there is none): then the parsers must render it."""
    import json

    try:
        packaged_screens = json.loads(HELP_SCREENS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if packaged_screens.get("rendered_with") != help_rendered_with():
        return None
    return packaged_screens.get("screens", {}).get(command)


def install_command(extra: str) -> str:
    """The ``pip install`` that adds the optional dependencies ``extra`` (of pyproject.toml) to this install:
    from the source tree the package runs from (a clone, ``pip install -e .``) or was installed from, where the
    extra is found until the package is on PyPI; else by the package's name."""
    import json
    import shlex
    from importlib.metadata import distributions
    from urllib.parse import unquote, urlparse

    tree = Path(__file__).resolve().parent.parent
    if 'name = "vanilla-transformer"' in _text_or_empty(tree / "pyproject.toml"):
        return f"pip install -e {shlex.quote(f'{tree}[{extra}]')}"
    for distribution in distributions(name="vanilla-transformer"):
        try:
            origin = json.loads(distribution.read_text("direct_url.json") or "{}")
        except ValueError:
            continue
        url = origin.get("url", "") if isinstance(origin, dict) else ""
        if url.startswith("file://") and isinstance(origin.get("dir_info"), dict):
            editable = "-e " if origin["dir_info"].get("editable") else ""
            return f"pip install {editable}{shlex.quote(f'{unquote(urlparse(url).path)}[{extra}]')}"
    return f"pip install 'vanilla-transformer[{extra}]'"


def _text_or_empty(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


class MissingExtra(ImportError):
    """A part of the package whose optional dependencies (an extra of pyproject.toml) are not installed."""


def require_extra(extra: str, modules: tuple[str, ...], needed_by: str) -> None:
    """Raise `MissingExtra` naming ``needed_by``, the modules missing and the ``pip install`` that adds them,
    unless every module in ``modules`` is installed (found, not imported: some are imported only when used)."""
    from importlib import util

    def installed(name: str) -> bool:
        try:
            return util.find_spec(name) is not None
        except (ImportError, ValueError, AttributeError):  # a module set to None in sys.modules: blocked
            return False

    missing = [name for name in modules if not installed(name)]
    if missing:
        raise MissingExtra(
            f"{needed_by} needs the {extra!r} extra, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {install_command(extra)}"
        )


def exit_with_usage_error(prog: str, error: BaseException | str) -> NoReturn:
    """One line on stderr, ``PROG: error: MESSAGE``, and exit status 2 (argparse's convention)."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    raise SystemExit(2)


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands' parsers."""
    return set(parser._option_string_actions).union(*map(option_strings, subcommand_parsers(parser)))


def subcommand_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [
        subparser
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for subparser in action.choices.values()
    ]


def with_dashes(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``--num_beams 4`` as ``--num-beams 4`` for a parser that spells its flags with dashes."""
    known = option_strings(parser)
    spelt = []
    for token in argv:
        flag, equals, value = token.partition("=")
        dashed = "--" + flag[2:].replace("_", "-")
        spelt.append(
            dashed + equals + value if token.startswith("--") and flag not in known and dashed in known else token
        )
    return spelt
