"""training/train.py as a test launches it on CPU processes (the same `run_command`), leaving as `launched.leave`.

accelerate launch --config_file training/accelerate/ddp.yaml tests/train_launched.py TRAIN_PY_ARGS
"""

import sys

import launched
from vanilla_transformer.cli import run_command

if __name__ == "__main__":
    run_command("train", sys.argv[1:], prog="train.py")
    launched.leave()
