"""train.py under FSDP on CPU processes (gloo), for tests/test_distributed.py.

    accelerate launch --config_file training/accelerate/fsdp.yaml tests/fsdp_on_cpu.py TRAIN_PY_ARGS --use_cpu

accelerate 1.15 never selects FSDP on the CPU: `AcceleratorState` promotes a launch with an FSDP
config to FSDP only for GPU-like process groups, so CPU processes stay MULTI_CPU (plain DDP). This
script lifts that one restriction, with the plugin the launcher configured from the FSDP_* variables
it set from the YAML file; everything else (fully_shard per the file's wrap policy, gloo collectives,
the Trainer's FULL_STATE_DICT saves, train.py) is the real code.
"""

import os
import sys
from pathlib import Path

import torch
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

import launched

_initialise = AcceleratorState.__init__


def _initialise_with_fsdp_on_cpu(self, *args, **kwargs):
    _initialise(self, *args, **kwargs)
    if self.distributed_type == DistributedType.MULTI_CPU:
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = kwargs.get("fsdp_plugin") or FullyShardedDataParallelPlugin()


AcceleratorState.__init__ = _initialise_with_fsdp_on_cpu

if __name__ == "__main__":
    from vanilla_transformer.training.run import main

    main(sys.argv[1:])
    # For the test: main() must return with the process group closed, or gloo's threads can abort
    # this process at exit after a run that succeeded.
    output_dir = Path(sys.argv[sys.argv.index("--output_dir") + 1])
    (output_dir / f"process_group_open_after_main.rank{os.environ['RANK']}").write_text(
        str(torch.distributed.is_initialized())
    )
    launched.leave()
