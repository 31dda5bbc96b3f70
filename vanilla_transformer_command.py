"""The ``vanilla-transformer`` console script: what needs no model answered here, everything else by the package.

Python runs a package's ``__init__`` before any module in it, and ``import vanilla_transformer``
registers the model with the Auto API, which needs torch and transformers' modeling code (seconds);
``train --help`` also lists the Trainer's flags of the installed transformers (seconds more). So the
command starts here, outside the package (installed beside it), and answers without importing it:

- ``--version``, and ``recipe [NAME]`` / ``config [NAME]``, the paths of the packaged recipes and
  launch configs (``accelerate launch --config_file $(vanilla-transformer config ddp)`` runs this
  before every launch), through `vanilla_transformer.command_line` (standard library only), loaded
  from the package's folder without importing the package. `vanilla_transformer.cli` uses the same
  module; anything else about these (an unknown name, a flag, more names) goes to it, so its errors
  are the command's;
- ``--help`` and ``TOOL --help``: the screen `vanilla_transformer.cli.help_text` rendered before, as
  long as nothing it was rendered from has changed: this package's files (code, recipes), the
  versions of Python, torch, transformers, accelerate and huggingface_hub, and how it is shown (the
  terminal's width, colour settings). The first time, or after any such change, the package renders
  the screen and it is stored.

Every other command goes straight to `vanilla_transformer.cli.main`. Nothing imports this module: it is
the entry point only.

The screens live in ``$HF_HOME/vanilla-transformer/help/`` (``HF_HOME`` defaults to
``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``), one JSON file per command, Python
environment and display. A file that is unreadable, not JSON, from other sources, or whose text does
not match its checksum is rendered again and replaced; a folder that cannot be written costs only
the speed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from importlib import util  # importlib.metadata (~20 ms) only where versions are read
from pathlib import Path

HELP_FLAGS = ("-h", "--help")
VERSIONED = ("torch", "transformers", "accelerate", "huggingface_hub")  # whose values the help screens list
PACKAGE_FILES = ("*.py", "*.yaml")  # the package's code and its recipes and launch configs


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    answer = quick_answer(argv)
    if answer is not None:
        sys.stdout.write(answer)
        return
    command = help_request(argv)
    if command is None:
        from vanilla_transformer.cli import main as run

        return run(argv)
    cached = HelpScreen(command)
    text = cached.read()
    if text is None:
        from vanilla_transformer import cli

        text = cli.help_text(argv)
        if text is None:  # not a command the package knows: its own error
            return cli.main(argv)
        cached.write(text)
    sys.stdout.write(text)


def quick_answer(argv: list[str]) -> str | None:
    """What ``--version``, ``recipe [NAME]`` or ``config [NAME]`` print; None for anything else, an unknown
    name included (the package answers those, with its errors)."""
    if argv == ["--version"]:
        return shared().version_text()
    if argv and argv[0] in shared().PACKAGED and len(argv) <= 2 and not argv[-1].startswith("-"):
        with contextlib.suppress(ValueError):
            return shared().packaged_text(*argv)
    return None


def shared():
    """`vanilla_transformer.command_line`, loaded from the package's folder without importing the package
    (``import vanilla_transformer`` imports torch and registers the model: seconds). The package's own
    imports of it then find this module."""
    name = "vanilla_transformer.command_line"
    if name not in sys.modules:
        spec = util.spec_from_file_location(name, package_folder() / "command_line.py")
        module = util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def package_folder() -> Path:
    """The installed package's folder, found and not imported."""
    return Path(util.find_spec("vanilla_transformer").origin).resolve().parent


def help_request(argv: list[str]) -> str | None:
    """The command whose help ``argv`` asks for ("" for the command list), or None for anything else."""
    if not argv or argv in ([flag] for flag in HELP_FLAGS):
        return ""
    if len(argv) == 2 and argv[1] in HELP_FLAGS and not argv[0].startswith("-"):
        return argv[0]
    return None


def cache_folder() -> Path:
    """Where huggingface_hub keeps its caches (``HF_HOME``, ``XDG_CACHE_HOME``), in a folder of ours."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return Path(home).expanduser() / "vanilla-transformer" / "help"


def sources() -> dict:
    """What a help screen is rendered from: the package's files (hashed), the versions it lists."""
    package = package_folder()
    digest = hashlib.sha256()
    for path in sorted(path for pattern in PACKAGE_FILES for path in package.rglob(pattern)):
        digest.update(f"{path.relative_to(package)}\0".encode() + path.read_bytes() + b"\0")
    return {"package": str(package), "files": digest.hexdigest(), "python": sys.version,
            **{name: _version(name) for name in VERSIONED}}


def display() -> dict:
    """How the screen is shown: argparse wraps at the terminal's width (and Python 3.14 colours a terminal)."""
    return {"columns": shutil.get_terminal_size().columns, "tty": sys.stdout.isatty(),
            **{name: os.environ.get(name) for name in ("NO_COLOR", "FORCE_COLOR", "PYTHON_COLORS", "TERM")}}


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


class HelpScreen:
    """One command's help screen in the cache: read back only when its sources are today's."""

    def __init__(self, command: str, folder: Path | None = None):
        self.command, self.sources = command, sources()
        where = json.dumps([command, sys.prefix, display()], sort_keys=True)
        self.path = (folder or cache_folder()) / f"{hashlib.sha256(where.encode()).hexdigest()[:20]}.json"

    def read(self) -> str | None:
        try:
            stored = json.loads(self.path.read_text(encoding="utf-8"))
            text = stored["text"]
            fresh = stored["command"] == self.command and stored["sources"] == self.sources
            intact = stored["sha256"] == hashlib.sha256(text.encode()).hexdigest()
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError):
            return None
        return text if fresh and intact else None

    def write(self, text: str) -> None:
        record = {"command": self.command, "sources": self.sources, "text": text,
                  "sha256": hashlib.sha256(text.encode()).hexdigest()}
        temporary = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=self.path.parent, suffix=".tmp",
                                             delete=False) as file:
                temporary = file.name
                json.dump(record, file)
            os.replace(temporary, self.path)  # whole or not at all, whoever else writes it at the same time
        except OSError:  # a read-only or full cache costs only the speed
            if temporary is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)


if __name__ == "__main__":
    main()
