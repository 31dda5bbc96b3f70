"""The end of a process that a test starts with `accelerate launch` on the CPU (gloo), for the scripts beside it.

Once in a while, on a loaded machine, gloo's threads abort a process at the interpreter's shutdown ("terminate
called without an active exception", SIGABRT, exit status -6) after its work was done, written and its process
group closed: seen in CI on 2026-11-28 (tests/ddp_disagreeing_clocks.py) and 2026-11-30
(tests/fsdp_evaluate_then_train.py). The tests check the work, not that shutdown: the scripts leave past it.

    python -m accelerate.commands.launch ... tests/train_launched.py TRAIN_PY_ARGS   # train.py's main, then this
"""

import os
import sys


def leave(status: int = 0) -> None:
    """Close the process group, flush, and exit with ``status`` without the interpreter's shutdown."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
