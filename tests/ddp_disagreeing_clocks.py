"""A wall-clock budget with a cooldown on processes whose clocks disagree, for tests/test_train.py.

    accelerate launch --config_file training/accelerate/ddp.yaml tests/ddp_disagreeing_clocks.py TRAIN_PY_ARGS

Process r's clock says every update took 20 + 10 r seconds. Each process writes, to ``rank-R.json`` in the
output folder, the learning rate of each of its updates (read as the update starts), its update count and
the sum of its parameters after training.
"""

import json
import os
import sys
import types
from pathlib import Path

from transformers import TrainerCallback

import launched
from vanilla_transformer.training import run as train
from vanilla_transformer.training import trainer as trainer_module

RANK = int(os.environ["RANK"])
NOW = [0.0]
trainer_module.time = types.SimpleNamespace(monotonic=lambda: NOW[0])  # this module's clock only


class UpdateTakes(TrainerCallback):
    def __init__(self):
        self.rates = []

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        self.rates.append(optimizer.param_groups[0]["lr"])
        NOW[0] += 20.0 + 10.0 * RANK


if __name__ == "__main__":
    prepared = train.build_trainer(*train.parse_arguments(sys.argv[1:]))
    trainer = prepared.trainer
    clock = UpdateTakes()
    trainer.add_callback(clock)
    trainer.train()
    weights = sum(
        float(p.detach().double().sum()) for p in trainer.accelerator.unwrap_model(trainer.model).parameters()
    )
    Path(trainer.args.output_dir, f"rank-{RANK}.json").write_text(
        json.dumps({"rates": clock.rates, "steps": trainer.state.global_step, "weights": weights})
    )
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    launched.leave()
