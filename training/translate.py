"""Translate a file (or stdin) with batched beam search; optionally score against references.

    python training/translate.py --model runs/en-de --input test.en [--output hyp.de] [--references test.de]
    echo "A dog runs." | python training/translate.py --model runs/en-de

`python training/translate.py --help` lists the flags; the work is `vanilla_transformer.training.translation`.
"""

from vanilla_transformer.training.translation import main

if __name__ == "__main__":
    main()
