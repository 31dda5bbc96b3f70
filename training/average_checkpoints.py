"""Average the weights of the last checkpoints of a run into one model (§6.1).

    python training/average_checkpoints.py --checkpoint-root runs/en-de --last 5 --output-dir runs/en-de/averaged
    python training/average_checkpoints.py --inputs ckpt-a ckpt-b --output-dir averaged

The work is `vanilla_transformer.training.averaging.average_checkpoints`.
"""

from vanilla_transformer.training.averaging import main

if __name__ == "__main__":
    main()
