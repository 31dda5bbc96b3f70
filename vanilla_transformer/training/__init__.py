"""The paper's training recipe as a library (needs the ``train`` extra: datasets, accelerate, evaluate, sacrebleu).

Each piece works on its own in a script of yours, on `Seq2SeqTrainer`'s terms:

- `data`: text files or Hub datasets into Arrow, tokenised with ``datasets.map`` and cached; the length
  filter that counts what it drops (`parallel_text_dataset`, `tokenize_dataset`, `drop_unusable`, ...);
  a run's data from its flags (`load_text_datasets`, `tokenize_pairs`).
- `batching`: `TokenBatchSampler`, batches of at most ``max_tokens`` padded tokens (§5.1, fairseq's --max-tokens),
  optionally in a few bucket shapes, `PadToBucket`, the collator wrapper that pads a batch to its shape, and
  `LengthSortedSampler`, the order in which evaluation decodes (by length, results back in input order).
- `arguments`: `TransformerTrainingArguments`, the Trainer's arguments with the paper's defaults, and
  every check of their ranges.
- `trainer`: `TransformerTrainer`: token batches, per-token label smoothing over the accumulated batch
  (§5.4), eq. (3) as the learning-rate schedule (§5.3).
- `averaging`: `average_checkpoints` (§6.1).
- `checkpointing`: checkpoints written whole or not at all; a signal stops training after saving one, with
  `TrainingInterrupted`.
- `divergence`: a non-finite loss or gradient stops training with `TrainingDiverged`, saving nothing of it;
  `caches`: damaged Arrow and tokenizer caches are rebuilt, with a warning naming them.
- `moving_average`: `ExponentialMovingAverage`, a moving average of the weights at every update
  (``--ema_decay``), a callback for any Trainer.
- `metrics`: sacreBLEU and chrF through `evaluate`, offline (`load_translation_metric`, `score`,
  `TranslationMetrics` for ``compute_metrics``).
- `translation`: `translate`, batched beam search in input order.
- `options`: the flags of a run, argument files and packaged recipes, and every check of them.
- `progress`: progress by the clock for a budget in minutes, throughput in target tokens/s.
- `run_lock`: one run per output folder (`RunLock`, `hold_output_dir`); `memory_check`: the largest batches
  tried before the first update (`check_largest_batches_fit`), ``--skip_oom_batches`` (`SkipOutOfMemoryBatches`).
- `levers`: GPU speed levers of training (``--compile_layers``, ``--fuse_projections``, ``--fused_loss``,
  ``--cuda_graphs``, ``--sync_free_step``, ``--fp8``, ``--training_attention``), each off by default.
- `run`: a whole training run from flags (``vanilla-transformer train``, `main`, which reads top to
  bottom), its steps with plain parameters (`data.load_text_datasets`, `prepare_tokenizer`,
  `prepare_model`, `data.tokenize_pairs`, `set_decoding`, `predict`) and `build_trainer`, `main` up to a
  ready trainer.
"""

# ruff: noqa: E402 (the extra is checked before the modules that need it are imported)
from ..command_line import require_extra

# what the modules import (evaluate only when scoring, with its own message: `metrics.load_translation_metric`)
require_extra("train", ("datasets", "accelerate", "sacrebleu"), "vanilla_transformer.training")

from .arguments import TransformerTrainingArguments
from .averaging import average_checkpoints
from .batching import LengthSortedSampler, PadToBucket, TokenBatchSampler
from .checkpointing import TrainingInterrupted
from .data import (
    drop_unusable,
    example_lengths,
    hub_dataset,
    jsonl_dataset,
    parallel_text_dataset,
    read_lines,
    read_parallel,
    tokenize_dataset,
    tsv_dataset,
)
from .divergence import TrainingDiverged
from .metrics import TranslationMetrics, load_translation_metric, score
from .moving_average import ExponentialMovingAverage
from .trainer import TransformerTrainer, noam_learning_rate, noam_schedule
from .translation import translate

__all__ = [
    "ExponentialMovingAverage",
    "LengthSortedSampler",
    "PadToBucket",
    "TokenBatchSampler",
    "TrainingDiverged",
    "TrainingInterrupted",
    "TransformerTrainer",
    "TransformerTrainingArguments",
    "TranslationMetrics",
    "average_checkpoints",
    "drop_unusable",
    "example_lengths",
    "hub_dataset",
    "jsonl_dataset",
    "load_translation_metric",
    "noam_learning_rate",
    "noam_schedule",
    "parallel_text_dataset",
    "read_lines",
    "read_parallel",
    "score",
    "tokenize_dataset",
    "translate",
    "tsv_dataset",
]
