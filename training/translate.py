"""Translate a file (or stdin) with batched beam search: ``vanilla-transformer translate``, for a clone.

    python training/translate.py --model runs/en-de --input test.en [--output hyp.de] [--references test.de]
    echo "A dog runs." | python training/translate.py --model runs/en-de

`python training/translate.py --help` lists the flags; the work is `vanilla_transformer.training.translation`.
"""

import sys

from vanilla_transformer.cli import run_command

if __name__ == "__main__":
    run_command("translate", sys.argv[1:], prog="translate.py")
