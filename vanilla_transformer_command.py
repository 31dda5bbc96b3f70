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
- ``--help`` and ``TOOL --help``: the screen shipped in the package (``help_screens.json``, rendered by
  `vanilla_transformer.cli.help_screens` at 80 columns, like docs/cli.md), as long as the installed
  versions of Python, torch, transformers, accelerate and huggingface_hub are those it was rendered
  with; otherwise the package's parsers render it (seconds, but the installed Trainer's flags).

Every other command goes straight to `vanilla_transformer.cli.main`. Nothing imports this module: it is
the entry point only.
"""

from __future__ import annotations

import contextlib
import sys
from importlib import util
from pathlib import Path

HELP_FLAGS = ("-h", "--help")


def main(argv: list[str] | None = None) -> None:
    try:
        answer(argv)
    except KeyboardInterrupt:  # Ctrl-C in the seconds of importing torch, or in a tool that has no line of its own
        sys.stderr.write("vanilla-transformer: stopped by Ctrl-C\n")
        raise SystemExit(130) from None


def answer(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    answer = quick_answer(argv)
    if answer is not None:
        sys.stdout.write(answer)
        return
    command = help_request(argv)
    text = None if command is None else shared().packaged_help(command)
    if text is None:
        from vanilla_transformer import cli

        text = cli.help_text(argv)
        if text is None:  # no help request, or not a command the package knows: its own answer or error
            return cli.main(argv)
    sys.stdout.write(text)


def quick_answer(argv: list[str]) -> str | None:
    """What ``--version``, ``recipe [NAME]`` or ``config [NAME]`` (or their ``--help``) print; None for anything else, an unknown
    name included (the package answers those, with its errors)."""
    if argv == ["--version"]:
        return shared().version_text()
    if len(argv) == 2 and argv[0] in shared().PACKAGED and argv[1] in HELP_FLAGS:
        return shared().packaged_usage(argv[0])
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


if __name__ == "__main__":
    main()
