"""`trainer.evaluate()` and then `trainer.train()` in one TransformerTrainer under FSDP on CPU processes,
as a user's own script may do (a score before training), for tests/test_distributed.py.

    accelerate launch --config_file training/accelerate/fsdp.yaml tests/fsdp_evaluate_then_train.py TRAIN_PY_ARGS

Evaluating first prepares the model unsharded (FSDP 2 shards a model only with its optimizer); training
must then shard it as usual. Writes the evaluation's metrics to ``evaluation_before_training.json``.
"""

import json
import sys
from pathlib import Path

import fsdp_on_cpu  # noqa: F401  (lets accelerate run FSDP on CPU processes)
import launched
from vanilla_transformer.training import run as train

if __name__ == "__main__":
    prepared = train.build_trainer(*train.parse_arguments(sys.argv[1:]))
    trainer = prepared.trainer
    before = trainer.evaluate()
    trainer.train()
    trainer.save_state()
    if trainer.is_world_process_zero():
        Path(trainer.args.output_dir, "evaluation_before_training.json").write_text(json.dumps(before))
    # Leave together, and close the process group: a process that exits while the other still holds
    # gloo's threads can abort it at shutdown ("terminate called without an active exception").
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    launched.leave()  # past the interpreter's shutdown, where gloo's threads can abort a finished run
