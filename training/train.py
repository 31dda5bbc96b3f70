"""Train (or fine-tune) a Transformer with the paper's recipe (§5): ``vanilla-transformer train``, for a clone.

    python training/train.py multi30k --dataset_name none --train_source_file train.en ... --output_dir run
    python training/train.py --train_source_file train.en.gz --train_target_file train.de.gz \\
        --validation_source_file val.en --validation_target_file val.de --output_dir runs/en-de
    accelerate launch --config_file training/accelerate/ddp.yaml training/train.py ...   # several GPUs

`python training/train.py --help` lists every flag; the run itself is
`vanilla_transformer.training.run.main`, usable from Python too.
"""

import sys

from vanilla_transformer.cli import run_command

if __name__ == "__main__":
    run_command("train", sys.argv[1:], prog="train.py")
