"""Average the weights of the last checkpoints of a run into one model (§6.1): ``vanilla-transformer average``.

    python training/average_checkpoints.py --checkpoint-root runs/en-de --last 5 --output-dir runs/en-de/averaged
    python training/average_checkpoints.py --inputs ckpt-a ckpt-b --output-dir averaged

The work is `vanilla_transformer.training.averaging.average_checkpoints`.
"""

import sys

from vanilla_transformer.cli import run_command

if __name__ == "__main__":
    run_command("average", sys.argv[1:], prog="average_checkpoints.py")
