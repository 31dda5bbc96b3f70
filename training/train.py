"""Train (or fine-tune) a Transformer with the paper's recipe (§5) on Seq2SeqTrainer.

    python training/train.py --train_source_file train.en.gz --train_target_file train.de.gz \\
        --validation_source_file val.en --validation_target_file val.de \\
        --preset base --output_dir runs/en-de --max_tokens 4096 --gradient_accumulation_steps 6
    python training/train.py training/recipes/wmt14-en-de-base.yaml [--any_flag value ...]
    accelerate launch --config_file training/accelerate/ddp.yaml training/train.py ...   # several GPUs

`python training/train.py --help` lists every flag; the run itself is
`vanilla_transformer.training.run.main`, usable from Python too.
"""

from vanilla_transformer.training.run import main

if __name__ == "__main__":
    main()
