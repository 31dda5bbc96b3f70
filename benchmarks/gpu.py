"""Training and decoding speed of the paper's models on one GPU: tokens/s, MFU, beam-4 sentences/s, levers.

    python benchmarks/gpu.py              # everything, most telling first, within --budget-minutes 7.5
    python benchmarks/gpu.py --levers     # each training lever against the plain step and MarianMTModel
    python benchmarks/gpu.py --recipe     # the Multi30k recipe's train.py run, plain and with each launch lever
    python benchmarks/gpu.py --profile    # torch.profiler: top kernels, launches, idle time of an update
    python benchmarks/gpu.py --presets big --modes compiled --max-tokens 16384 --output gpu.json
    python benchmarks/gpu.py --device cpu --presets tiny --dtype float32 --steps 2   # a smoke run anywhere
    python benchmarks/gpu.py --shapes-only [--pairs 4500000 --max-tokens 12288]   # the batch shapes of an epoch
    python benchmarks/gpu.py --no-decode --no-loop --presets big --train-run-minutes 2   # train.py only
    python benchmarks/gpu.py --loop --device cpu --presets tiny --dtype float32 --max-tokens 1024   # loop overhead
    python benchmarks/gpu.py --presets "" --no-decode --no-loop --no-profile   # train's evaluation, both orders

Budget: a run keeps to ``--budget-minutes`` (7.5; 0: none). Each measurement has an estimate (`ESTIMATE_SECONDS`);
one whose estimate does not fit in what is left is skipped and named, and one that runs past the budget is
stopped (`time_limit`) and named, as is one far past its own estimate (3x, `RUNAWAY_FACTOR`); the rows so far
are kept. The run writes three files: ``--output`` (JSON, by default gpu-results/gpu.json; with --levers,
--recipe or --profile levers.json, recipe.json or profile.json there), the markdown table beside it, and ``*.rows.jsonl``: the machine's row (card, versions)
at the start, then each lever's and recipe variant's row as soon as it is measured (a run killed inside a job keeps
them). The JSON is written at the start too, and again after each job. On a lent machine, point ``--output`` where the
files come back from.

Sizes: the synthetic batches have a 37,000-word vocabulary and 12,288 padded tokens a side, 20 of them per lever pass
(`SIZES`); on a CPU (``--device cpu``), 1,000 words, 1,024 tokens and 4 batches, so that a tiny preset finishes.

Levers (``--levers``): for each preset (big and the Multi30k shape), each lever of `LEVERS` (train.py's
``--compile_layers``, ``--fuse_projections``, ``--sync_free_step``, ``--bf16_weights``, ``--fused_loss``,
``--training_attention``, ``--fp8``, ``--cuda_graphs``, and the whole model under torch.compile) against the plain
step (ours, eager) and MarianMTModel (its own first pass, warm-up and memory in a row of its own),
on the same ``--lever-steps`` batches, alternating (all padded to bucket shapes, which the compiled rows need), two
passes: first-pass and steady target tokens/s, warm-up seconds, the peak memory of one step, and the loss after
the same updates against the plain step's (lever and plain start from the same weights). A lever the device
cannot run is a row with its one-line refusal.

Recipe (``--recipe``; in the full run after big's training step and in ``--levers`` after big's rows, unless
``--no-recipe``): the Multi30k recipe (``train multi30k``), whose update (1,024 tokens, d_model 256) waits on kernel
launches on a GPU, as train.py runs it for ``--recipe-minutes`` on ``--recipe-pairs`` synthetic pairs of Multi30k's
lengths, batches padded to bucket shapes in every variant: plain and ``--cuda_graphs`` (``--recipe-variants``;
``compile_layers`` too on request), one after the other; updates/s over each run (its own log, compilation included)
and at steady state (its second half), and the first update's seconds. Where an update goes: the host's mean
milliseconds per update between the Trainer's callback events at steady state (logging and the next batch, forward
and backward, the optimizer, after it), and over 20 updates profiled early in the run, the kernels and their
milliseconds per update (a CUDA graph's replay counts the kernels it runs): an update whose kernels fill a small
share of it waits on the host. ``--levers`` keeps what the recipe needs and shares the rest between the presets.

Profile (``--profile``, and in the full run on CUDA): torch.profiler over one training update and one beam-4
decoding step: the top CUDA kernels by time (on a CPU, operators), kernel launches, and the GPU's idle time.

Shapes: ``--shapes-only`` packs an epoch of ``--pairs`` synthetic WMT-like length pairs (lengths only, no
text) with `TokenBatchSampler` into bucket shapes (``--pad_to_buckets always``) and prints one JSON line: ``batches``, ``distinct_shapes`` (rows, source
length, target length) and ``padding_fraction`` (padded tokens that are not real ones, both sides).

Training: the step a `TransformerTrainer --bf16` run takes (autocast to bfloat16 over float32
weights; forward, the package's label-smoothed loss over the batch's target tokens, backward, fused
AdamW (0.9, 0.98, 1e-9)) on token-count batches of ``--max-tokens`` padded tokens per side built by
`TokenBatchSampler` from synthetic pairs with WMT14-like lengths (a 37k vocabulary; mean about 28
tokens a side), each padded to its own longest sentences as train.py pads them by default. "compiled" wraps
the model and the loss in ``torch.compile`` with static shapes over batches padded to bucket shapes (one
graph per bucket shape, as ``train.py --torch_compile``). Ours and a MarianMTModel of the same shape
step alternately on the same batches: first over ``--steps`` batches whose shapes no step has seen
(the first-pass cost: attention plans, compilation), then over the same batches again (steady state).
Reported for both models and both passes: target tokens/s and source + target tokens/s, median and
worst step, the model FLOPs utilisation (MFU: `training_flops` of the pairs in the timed batches,
padding excluded, per second over the GPU's dense bf16 peak, --peak-tflops, by default the
datasheet's 989 for H100/H200); the per-batch ratio Marian time / ours with its quartiles; peak memory.

Decoding: beam 4 (length penalty 0.6) with ``generate()`` over ``--decode-batch`` sentences of the same
synthetic lengths, exactly ``--decode-tokens`` new tokens each (random weights never stop on their
own), for base, big and the Multi30k recipe's shape: ours holding the weights of a MarianMTModel
(`vanilla_transformer.convert.from_marian`) against that MarianMTModel, alternating, with the dynamic
cache ("eager") and with a static cache under ``torch.compile`` ("compiled": ours on CUDA as a user of
``cache_implementation="static"`` gets it, ``generate()`` compiling its beam search's step itself with CUDA graphs;
MarianMTModel's forward compiled before, as its user must, transformers' beam search compiling nothing; on a CPU
both compiled before). With the eager rows, where
ctranslate2 imports and runs on the device, CTranslate2 too: ours exported with `to_ctranslate2` and
loaded as float16 where its wheel has float16 on the device (CUDA), else float32 (the CPU wheels have
float32 and int8; the row names the compute type), decoding the same sentences the same way (beam 4,
length penalty 0.6, exactly ``--decode-tokens`` tokens), in the same alternation; reported: its
sentences/s and how many of its hypotheses equal ours token for token (in float32 on a CPU all of
them; in float16 against bfloat16 some differ). Otherwise the row says why it was skipped.

Loop: ``--loop`` runs the real training loop (`build_trainer` of train.py, as a user's run goes: token
batches, the moving average of the weights, a budget in minutes, logging every 50 updates) on
synthetic WMT-like text, and after each update times the raw step (forward, loss, backward, optimizer)
on the batch the loop just took, with the same model and optimizer. It reports the medians of both and
their ratio: what the loop costs beyond the model's arithmetic.

Train run: train.py itself (`vanilla_transformer.training.run.main`, what ``vanilla-transformer train``
calls) for ``--train-run-minutes`` (``--max_train_minutes``) on ``--train-run-pairs`` synthetic pairs of
WMT-like lengths written as text, with a BPE of ``--train-run-vocab`` tokens trained by the run, ``--bf16``
where the device has it, no checkpoints. Reported: the target tokens/s of the run's own end-of-training
metrics (``all_results.json``: the target tokens it trained on over ``train_runtime``, start-up and first
shapes included), its updates, and MFU: those tokens/s times the training FLOPs per target token of the
pairs as the run's tokenizer cut them; and the seconds of each phase, timed inside the run (`PhaseClock`).

Evaluation: train's evaluation (`TransformerTrainer.evaluate()`, beam 4, the paper's length rule, BLEU and
chrF) of a random ``--eval-preset`` model (the Multi30k recipe's shape, its sentences ~13 tokens) on
``--eval-sentences`` synthetic sentences in batches of ``--eval-batch``, with ``--eval_order input`` and
``--eval_order length``, and sorted in batches of ``--eval-larger-batch``, alternating (benchmarks/
evaluation_order.py): sentences/s of each and their ratios, the measurement that decides ``--eval_order auto`` and
the evaluation batch on a GPU. A random model ends no hypothesis, so each batch runs
to its longest source + 50 tokens.

The weights are random: speed does not depend on them. Prints one JSON line per measurement and a
markdown table, and writes them to --output (JSON) and the same name with .md.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.command_line import install_command
from vanilla_transformer.training.batching import PadToBucket, TokenBatchSampler, allow_recompiles
from vanilla_transformer.training.flops import training_flops
from vanilla_transformer.training.table3 import cuda_visible
from vanilla_transformer.training_kernels import label_smoothed_cross_entropy

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Dense bf16 peak by the vendors' datasheets (TFLOP/s), for MFU.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


# The sizes of the synthetic batches: the paper's on a GPU; on a CPU, what a tiny preset measures in a minute
SIZES = {
    "gpu": {"vocab_size": 37000, "max_tokens": 12288, "lever_steps": 20},
    "cpu": {"vocab_size": 1000, "max_tokens": 1024, "lever_steps": 4},
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--presets", help="comma-separated training presets (default: big,base; with --levers big,multi30k)"
    )
    parser.add_argument(
        "--modes",
        default="eager",
        help="comma-separated training modes: eager, compiled (torch.compile of the whole model, static shapes)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="autocast dtype")
    parser.add_argument("--vocab-size", type=int, help="the synthetic batches' vocabulary (37000; on a CPU 1000)")
    parser.add_argument(
        "--max-tokens", type=int, help="padded tokens per batch and side (12288; on a CPU 1024, sized to finish)"
    )
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (compilation happens here)")
    parser.add_argument("--steps", type=int, default=30, help="timed training steps")
    parser.add_argument("--no-decode", action="store_true", help="skip the decoding measurements")
    parser.add_argument("--decode-presets", default="big,multi30k", help="comma-separated: presets, multi30k")
    parser.add_argument(
        "--decode-modes",
        default="eager,compiled",
        help="comma-separated: eager (dynamic cache), compiled (static cache, torch.compile), buckets (translate "
        "--static-cache: sorted batches of varied lengths padded to a multiple of 16 tokens, a graph per shape)",
    )
    parser.add_argument("--decode-batches", type=int, default=8, help="the buckets mode's batches (sorted by length)")
    parser.add_argument("--no-loop", action="store_true", help="skip timing train.py's loop")
    parser.add_argument("--no-eval", action="store_true", help="skip train's evaluation in each --eval_order")
    parser.add_argument("--eval-preset", default="multi30k", help="the model shape of the evaluation row")
    parser.add_argument("--eval-sentences", type=int, default=512, help="sentences the evaluation row decodes")
    parser.add_argument("--eval-batch", type=int, default=64, help="its --per_device_eval_batch_size")
    parser.add_argument("--eval-repeats", type=int, default=2, help="its timed passes of each order")
    parser.add_argument(
        "--eval-larger-batch", type=int, default=256, help="also sorted in batches of this many sentences (0: not)"
    )
    parser.add_argument(
        "--eval-static-cache",
        action="store_true",
        help="the evaluation row also sorted with --static_cache_decoding (its compilations in the untimed pass)",
    )
    parser.add_argument("--decode-batch", type=int, default=128, help="sentences per generate() call")
    parser.add_argument("--decode-tokens", type=int, default=30, help="new tokens per sentence")
    parser.add_argument("--decode-repeats", type=int, default=3, help="timed generate() calls (median)")
    parser.add_argument("--peak-tflops", type=float, help="dense peak of the GPU for MFU (default: by its name)")
    parser.add_argument(
        "--output",
        help="write the results as JSON here and as markdown beside it (default: gpu-results/gpu.json; with "
        "--levers, --recipe or --profile gpu-results/levers.json, recipe.json or profile.json)",
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=7.5,
        help="stop starting measurements that would not end within this many minutes from the "
        "start, and stop one that runs past it; each skipped one is named (0: no budget)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shapes-only", action="store_true", help="only count the batch shapes of an epoch")
    parser.add_argument("--pairs", type=int, default=4_500_000, help="with --shapes-only: pairs in the epoch")
    parser.add_argument("--loop", action="store_true", help="only time train.py's loop against the raw step")
    parser.add_argument("--loop-steps", type=int, default=80, help="with --loop: updates (the first 10 warm up)")
    parser.add_argument("--no-train-run", action="store_true", help="skip the timed train.py run")
    parser.add_argument("--train-run-minutes", type=float, default=0.75, help="train.py's --max_train_minutes")
    parser.add_argument("--train-run-pairs", type=int, default=40000, help="synthetic sentence pairs it trains on")
    parser.add_argument("--train-run-vocab", type=int, help="its tokenizer's vocabulary (default: --vocab-size)")
    parser.add_argument(
        "--levers", action="store_true", help="compare every training lever against the plain step and MarianMTModel"
    )
    parser.add_argument("--lever-steps", type=int, help="with --levers: batches per pass, two passes (20; on a CPU 4)")
    parser.add_argument(
        "--lever-rows",
        help="with --levers: comma-separated rows to measure, in this order, after the plain step (default: every "
        "row, in the table's order); a name with spaces in quotes, e.g. 'fused_loss chunked'",
    )
    parser.add_argument(
        "--compile-backend",
        default="inductor",
        choices=("inductor", "aot_eager", "eager"),
        help="with --levers: torch.compile's backend in the compiled rows but CUDA graphs' (inductor, as train.py; "
        "aot_eager traces the same graphs without generating code, eager only captures them: their counts and "
        "losses in seconds on a CPU)",
    )
    parser.add_argument(
        "--recipe", action="store_true", help="only train the Multi30k recipe, plain and with each --recipe-variants"
    )
    parser.add_argument("--no-recipe", action="store_true", help="leave the Multi30k recipe's train.py runs out")
    parser.add_argument(
        "--recipe-variants",
        default=RECIPE_DEFAULT_VARIANTS,
        help=f"comma-separated, of {', '.join(RECIPE_VARIANTS)}: the recipe's runs (each its train.py flags)",
    )
    parser.add_argument(
        "--recipe-minutes", type=float, default=1.0, help="each recipe run's --max_train_minutes (compilation included)"
    )
    parser.add_argument("--recipe-pairs", type=int, default=29000, help="its synthetic pairs (Multi30k has 29,000)")
    parser.add_argument(
        "--profile", action="store_true", help="only profile one training update and one decoding step (torch.profiler)"
    )
    parser.add_argument("--no-profile", action="store_true", help="leave the profile out of the full run")
    args = parser.parse_args(argv)
    for name, value in SIZES["cpu" if args.device == "cpu" and not args.shapes_only else "gpu"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.presets is None:
        args.presets = "big,multi30k" if args.levers else "big,base"
    if args.output is None:
        # each kind of run its own files, so that one run does not overwrite another's
        kind = "recipe" if args.recipe else "levers" if args.levers else "profile" if args.profile else "gpu"
        args.output = f"gpu-results/{kind}.json"
    if unknown := sorted(set(args.recipe_variants.split(",")) - set(RECIPE_VARIANTS) - {""}):
        parser.error(f"--recipe-variants: unknown {', '.join(unknown)}; choose from {', '.join(RECIPE_VARIANTS)}")
    if args.lever_rows is not None and (unknown := [name for name in lever_rows(args) if name not in LEVERS]):
        parser.error(f"--lever-rows: unknown {', '.join(unknown)}; choose from {', '.join(LEVERS)}")
    if args.device.startswith("cuda") and not args.shapes_only and (one_gpu := one_gpu_refusal(args.device)):
        parser.error(one_gpu)
    return args


def one_gpu_refusal(device: str) -> str | None:
    """Why ``device`` cannot be measured here, where this process sees several GPUs or is asked for another than
    the first: the synchronisations and memory statistics read the current GPU, and train.py's runs (the
    recipe, the evaluation) train on the first one, or refuse several (torch's DataParallel). None where it can."""
    try:
        index, count = torch.device(device).index, torch.cuda.device_count()
    except RuntimeError as error:
        return f"--device {device}: {error}"
    if index not in (None, 0):
        gpu = cuda_visible(str(index))  # the machine's number, where CUDA_VISIBLE_DEVICES renumbers them
        return (
            f"--device {device}: gpu.py measures the first GPU it sees (its timings, memory statistics and train.py's "
            f"runs use that one); run it with CUDA_VISIBLE_DEVICES={gpu} python benchmarks/gpu.py ... --device cuda."
        )
    if count > 1:
        return (
            f"--device {device}: gpu.py measures one GPU and sees {count} (train.py's runs refuse several); run it "
            f"with one visible: CUDA_VISIBLE_DEVICES={cuda_visible('0')} python benchmarks/gpu.py ..."
        )
    return None


def synthetic_lengths(count: int, seed: int) -> np.ndarray:
    """(source, target) token counts shaped like WMT14 en-de after BPE: log-normal, mean about 28."""
    rng = np.random.default_rng(seed)
    source = np.clip(np.rint(rng.lognormal(mean=3.15, sigma=0.55, size=count)), 2, 250).astype(np.int64)
    target = np.clip(np.rint(source * rng.uniform(0.8, 1.25, size=count)), 2, 250).astype(np.int64)
    return np.stack([source, target], axis=1)


def shape_statistics(lengths: np.ndarray, max_tokens: int, pad_to_buckets: bool = True) -> dict:
    """The batches of one epoch as `TokenBatchSampler` packs them: how many, how many shapes, how much padding."""
    started = time.perf_counter()
    sampler = TokenBatchSampler(lengths, max_tokens, shuffle=False, pad_to_buckets=pad_to_buckets)
    shapes = sampler.shapes  # (batches, 3): rows, source length, target length
    padded = int((shapes[:, 0] * (shapes[:, 1] + shapes[:, 2])).sum())
    return {
        "what": "shapes",
        "pad_to_buckets": pad_to_buckets,
        "pairs": len(lengths),
        "max_tokens": max_tokens,
        "batches": sampler.num_batches,
        "distinct_shapes": len(np.unique(shapes, axis=0)),
        "padding_fraction": round(1 - int(lengths.sum()) / padded, 4),
        "real_tokens_per_batch_and_side": round(int(lengths.sum()) / 2 / sampler.num_batches, 1),
        "seconds": round(time.perf_counter() - started, 2),
    }


def make_batches(
    lengths: np.ndarray,
    max_tokens: int,
    vocab_size: int,
    count: int,
    device,
    seed: int,
    epoch: int = 0,
    pad_to_buckets: bool = True,
) -> list[dict]:
    """``count`` token batches as TokenBatchSampler packs them (epoch ``epoch``'s order), random ids padded
    to the batch's shape (its bucket's with ``pad_to_buckets``, by `PadToBucket`), as the Trainer's data
    loader pads them."""
    sampler = TokenBatchSampler(lengths, max_tokens, shuffle=True, seed=seed, pad_to_buckets=pad_to_buckets)
    sampler.set_epoch(epoch)
    generator = torch.Generator().manual_seed(seed + epoch)

    def collate(indices: list[int]) -> dict:
        source, target = torch.as_tensor(lengths[indices, 0]), torch.as_tensor(lengths[indices, 1])
        attention_mask = torch.arange(int(source.max())) < source[:, None]
        labels = torch.randint(4, vocab_size, (len(indices), int(target.max())), generator=generator)
        input_ids = torch.randint(4, vocab_size, attention_mask.shape, generator=generator)
        return {
            "input_ids": input_ids.masked_fill(~attention_mask, 0),
            "attention_mask": attention_mask.long(),
            "labels": labels.masked_fill(torch.arange(labels.shape[1]) >= target[:, None], -100),
        }

    pad = PadToBucket(collate, pad_token_id=0, max_tokens=max_tokens) if pad_to_buckets else collate
    batches = []
    for _, indices in zip(range(count), sampler):
        batch = {key: value.to(device) for key, value in pad(indices).items()}
        batch["lengths"] = (lengths[indices, 0].tolist(), lengths[indices, 1].tolist())
        batches.append(batch)
    return batches


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_tflops(args) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops
    if args.device.startswith("cuda"):
        name = torch.cuda.get_device_name()
        return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)
    return None


def marian_of(config: VanillaTransformerConfig):
    """A MarianMTModel of the same shape (post-LN, sinusoidal positions, one shared vocabulary)."""
    from transformers import MarianConfig, MarianMTModel

    return MarianMTModel(
        MarianConfig(
            vocab_size=config.vocab_size,
            d_model=config.d_model,
            encoder_layers=config.encoder_layers,
            decoder_layers=config.decoder_layers,
            encoder_attention_heads=config.encoder_attention_heads,
            decoder_attention_heads=config.decoder_attention_heads,
            encoder_ffn_dim=config.encoder_ffn_dim,
            decoder_ffn_dim=config.decoder_ffn_dim,
            activation_function="relu",
            dropout=config.dropout,
            attention_dropout=0.0,
            activation_dropout=0.0,
            max_position_embeddings=1024,
            scale_embedding=True,
            pad_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=0,
            forced_eos_token_id=None,
        )
    )


class Trainee:
    """One model with its optimizer and (in "compiled" mode) compiled forward, stepping as --bf16 training does."""

    def __init__(self, model, mode: str, args):
        self.model, self.args = model.to(args.device).train(), args
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=1e-4,
            betas=(0.9, 0.98),
            eps=1e-9,
            weight_decay=0.0,
            fused=args.device.startswith("cuda"),
        )
        self.forward = torch.compile(self.model, dynamic=False) if mode == "compiled" else self.model

    def step(self, batch: dict) -> float:
        """Seconds of one step: forward, the package's label-smoothed loss, backward, optimizer."""
        synchronize(self.args.device)
        started = time.perf_counter()
        decoder_input_ids = self.model.prepare_decoder_input_ids_from_labels(batch["labels"])
        with torch.autocast(
            device_type=self.args.device.split(":")[0],
            dtype=DTYPES[self.args.dtype],
            enabled=self.args.dtype != "float32",
        ):
            logits = self.forward(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=decoder_input_ids,
                use_cache=False,  # as train.py's step: no key/value cache built in training (MarianMTModel's is)
            ).logits
            loss = label_smoothed_cross_entropy(logits, batch["labels"], (batch["labels"] != -100).sum(), 0.1)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        synchronize(self.args.device)
        return time.perf_counter() - started


def measure_training(preset: str, mode: str, args) -> dict:
    """Ours and MarianMTModel of the same shape, alternating on the same batches: a first pass over
    batches of shapes never seen (in "compiled" mode, compilation included), then the same batches again."""
    torch.manual_seed(args.seed)
    config = config_of(preset, args)
    if mode == "compiled":
        allow_recompiles(args.warmup + args.steps)  # static shapes, one graph per bucket shape (as --torch_compile)
    models = {
        "ours": Trainee(VanillaTransformerForConditionalGeneration(config), mode, args),
        "marian": Trainee(marian_of(config), mode, args),
    }
    # train.py's batches: padded to bucket shapes under torch.compile only (--pad_to_buckets auto)
    batches = make_batches(
        synthetic_lengths(200_000, args.seed),
        args.max_tokens,
        args.vocab_size,
        args.warmup + args.steps,
        args.device,
        args.seed,
        pad_to_buckets=mode == "compiled",
    )
    for batch in batches[: args.warmup]:  # lazy initialisation, and the shapes these batches bring
        for model in models.values():
            model.step(batch)
    timed = batches[args.warmup :]
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = {(name, phase): [] for name in models for phase in ("unseen", "steady")}
    for phase in ("unseen", "steady"):  # the second pass sees every shape again
        for index, batch in enumerate(timed):
            for name in ("ours", "marian") if index % 2 == 0 else ("marian", "ours"):  # alternating
                times[name, phase].append(models[name].step(batch))
    source_tokens = sum(sum(b["lengths"][0]) for b in timed)
    target_tokens = sum(sum(b["lengths"][1]) for b in timed)
    flops = sum(training_flops(config, *b["lengths"]) for b in timed)
    peak = peak_tflops(args)
    result = {
        "what": "training",
        "preset": preset,
        "mode": mode,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "parameters": models["ours"].model.num_parameters(),
        "steps": len(timed),
        "distinct_shapes": len({(*b["input_ids"].shape, b["labels"].shape[1]) for b in timed}),
        "padding_fraction": 1
        - (source_tokens + target_tokens) / sum(b["input_ids"].numel() + b["labels"].numel() for b in timed),
    }
    for (name, phase), seconds in times.items():
        total = sum(seconds)
        result[f"{name}_{phase}"] = {
            "target_tokens_per_second": target_tokens / total,
            "tokens_per_second": (source_tokens + target_tokens) / total,
            "median_step_seconds": statistics.median(seconds),
            "worst_step_seconds": max(seconds),
            "mfu": flops / total / (peak * 1e12) if peak else None,
        }
    ratios = sorted(m / o for m, o in zip(times["marian", "steady"], times["ours", "steady"]))
    result["marian_over_ours_steady"] = {
        "median": statistics.median(ratios),
        "quartiles": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]],
    }
    result["unseen_over_steady_ours"] = sum(times["ours", "unseen"]) / sum(times["ours", "steady"])
    # kept for readers of earlier results: ours at steady state
    result["target_tokens_per_second"] = result["ours_steady"]["target_tokens_per_second"]
    result["tokens_per_second"] = result["ours_steady"]["tokens_per_second"]
    result["mfu"] = result["ours_steady"]["mfu"]
    result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None
    return result


# The levers of training (vanilla_transformer.training.levers), each a row of --levers: what each changes in the
# step, and the train.py flags that turn it on. Those no GPU has measured first, the likeliest to pay for big first
# (float8 matrix multiplies, compiled layers); then the attention kernels (an H100 measured them on the Multi30k
# shape, 2026-11-27; flash leads the default table, so it has no row); the rows that compile per bucket shape last,
# as each takes whatever time it is given (`LEVER_ROW_SECONDS` caps it).
LEVERS = {
    "fp8 + compile_layers": dict(fp8=True, compile="layers", flags=["--fp8", "--compile_layers"]),
    # --fp8 alone, as train.py runs it: torchao's casts to float8 unfused around each product
    "fp8": dict(fp8=True, flags=["--fp8"], presets=("big", "base", "tiny"), shapes="the paper's models"),
    "compile_layers": dict(compile="layers", flags=["--compile_layers"]),
    "fuse_projections": dict(fuse=True, flags=["--fuse_projections"]),
    # what it saves, the host waiting for the GPU, shows only where the host may run ahead: its row also times a
    # pass of each without a synchronisation per step (`unsynchronized_pass`), as train.py runs
    "sync_free_step": dict(sync_free=True, flags=["--sync_free_step"], unsynchronized=True),
    "bf16_weights": dict(bf16_weights=True, flags=["--bf16_weights"]),
    "cuda_graphs": dict(
        compile="cuda_graphs", flags=["--cuda_graphs"], presets=("multi30k", "tiny"), shapes="small models"
    ),
    "fused_loss chunked": dict(loss="chunked", flags=["--fused_loss chunked"]),
    "compile_layers + fused_loss chunked": dict(
        compile="layers", loss="chunked", flags=["--compile_layers", "--fused_loss chunked"]
    ),
    "fused_loss liger": dict(loss="liger", flags=["--fused_loss liger"]),
    "training_attention cudnn": dict(
        attention="cudnn", flags=["--training_attention cudnn"], refused_as="--training_attention"
    ),
    "training_attention efficient": dict(
        attention="efficient", flags=["--training_attention efficient"], refused_as="--training_attention"
    ),
    "cuda_graphs, static shapes": dict(  # a compilation per bucket shape
        compile="cuda_graphs static",
        flags=["--torch_compile", "--torch_compile_mode reduce-overhead"],
        refused_as="--cuda_graphs",  # CUDA only
        presets=("multi30k", "tiny"),
        shapes="small models",
    ),
    "torch_compile (whole model, static shapes)": dict(compile="model", flags=["--torch_compile"]),
}
LEVER_ROW_SECONDS = 90  # the most one row may take: its compilations, two passes, its losses and memory


LEVER_ROW_KEYS = ("flags", "presets", "shapes", "refused_as", "unsynchronized")  # the row's, not LeverTrainee's


def declined_uses(trainee: LeverTrainee, batch: dict) -> list[str]:
    """The uses of attention in training that the row's kernel alone does not take on ``batch``, each with torch's
    reason: with the kernel first, torch falls back to the next for them without a word, so the row times a mix.
    Each use is tried with the kernel as its only backend (torch raises "No available kernel" where it declines);
    nothing is trained (the gradients are dropped)."""
    from vanilla_transformer import attention_backends

    declined = []
    for use in (attention_backends.ENCODER, attention_backends.DECODER, attention_backends.CROSS):
        try:
            attention_backends.BACKENDS[True, use] = (attention_backends.KERNELS[trainee.attention],)
            trainee.loss(batch).backward()
        except RuntimeError as error:
            declined.append(f"{use} ({str(error).strip().splitlines()[0]})")
        finally:
            attention_backends.prefer_in_training("default")
            trainee.model.zero_grad(set_to_none=True)
    return declined


def lever_rows(args) -> list[str]:
    """The rows of `LEVERS` that ``--lever-rows`` names, in its order; every row without it."""
    if args.lever_rows is None:
        return list(LEVERS)
    return [name.strip() for name in args.lever_rows.split(",") if name.strip()]


LEVER_GRACE_SECONDS = 10  # a lever row stops this long before the budget ends, so that the rows so far are kept


def expected_seconds(lever: dict, rows: list[dict]) -> float:
    """What a lever row will take, judged by the rows so far: a compiled one as the quickest compiled row of its
    kind measured (its warm-up dominates: an eager row's seconds would start it where it can only be stopped),
    any other as the quickest row measured; 0 before any row."""
    measured = [row for row in rows if "seconds" in row]
    kind = lever.get("compile")
    similar = [row["seconds"] for row in measured if kind and LEVERS.get(row["lever"], {}).get("compile") == kind]
    quickest = [row["seconds"] for row in measured]
    return min(similar) if similar else min(quickest) if quickest else 0.0


class LeverTrainee(Trainee):
    """A Trainee whose step takes a lever: compiled layers or model, CUDA graphs, fused projections, a fused loss,
    float8 linears, the attention kernel of training, bfloat16 weights with float32 masters (no autocast); the
    same loss as train.py's (`levers.training_loss`)."""

    def __init__(
        self,
        model,
        args,
        compile: str | None = None,
        loss: str = "none",
        fp8: bool = False,
        attention: str = "default",
        fuse: bool = False,
        sync_free: bool = False,
        bf16_weights: bool = False,
        flags=(),
    ):
        from vanilla_transformer.training import levers

        self.levers, self.loss_kind, self.attention, self.compile = levers, loss, attention, compile
        model = model.to(args.device)
        self.bf16_weights = bf16_weights
        if bf16_weights:  # the weights in bfloat16, no autocast; the optimizer's float32 masters below
            levers.bfloat16_weights(model)
        if fp8:
            levers.convert_to_fp8(model)
        if fuse:
            levers.fuse_projections(model)
        if sync_free:
            levers.sync_free_step(model)
        self.sync_free = sync_free
        super().__init__(model, "eager", args)
        if bf16_weights:
            levers.keep_float32_masters(self.optimizer)
        target = self.model if loss == "none" else self.model.model
        self.forward = None
        if compile == "layers":
            levers.compile_layers(self.model, backend=args.compile_backend)
        elif compile == "cuda_graphs":  # train.py's --cuda_graphs: dynamic shapes, a graph recorded per shape
            self.forward = torch.compile(target, **levers.CUDA_GRAPHS)
        elif compile in ("model", "cuda_graphs static"):  # one compilation per bucket shape
            allow_recompiles(4 * args.lever_steps)
            if compile == "model":
                self.forward = torch.compile(target, dynamic=False, backend=args.compile_backend)
            else:
                self.forward = torch.compile(target, dynamic=False, mode="reduce-overhead")

    def step(self, batch: dict, wait: bool = True) -> float:
        """One update's seconds, the GPU idle before it and done after it; ``wait=False``: neither (the seconds
        then say only how long the host took to queue it)."""
        from vanilla_transformer import attention_backends

        if wait:
            synchronize(self.args.device)
        started = time.perf_counter()
        if self.compile in ("cuda_graphs", "cuda_graphs static"):
            torch.compiler.cudagraph_mark_step_begin()
        attention_backends.prefer_in_training(self.attention)
        try:
            self.last_loss = self.loss(batch)
            self.last_loss.backward()
        finally:
            attention_backends.prefer_in_training("default")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if wait:
            synchronize(self.args.device)
        return time.perf_counter() - started

    def unsynchronized_pass(self, batches: list[dict], seed: int) -> float:
        """Seconds for one pass over ``batches`` with one synchronisation, at its end: the host queues each
        update while the GPU still runs the one before, where nothing in the step waits for the GPU."""
        self.model.train()
        synchronize(self.args.device)
        started = time.perf_counter()
        for index, batch in enumerate(batches):
            torch.manual_seed(seed + index)
            self.step(batch, wait=False)
        synchronize(self.args.device)
        return time.perf_counter() - started

    def loss(self, batch: dict, training: bool = True) -> torch.Tensor:
        inputs = {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["attention_mask"],
            "decoder_input_ids": self.model.prepare_decoder_input_ids_from_labels(batch["labels"]),
        }
        with torch.autocast(
            device_type=self.args.device.split(":")[0],
            dtype=DTYPES[self.args.dtype],
            enabled=self.args.dtype != "float32" and not self.bf16_weights,
        ):
            return self.levers.training_loss(
                self.model,
                inputs,
                batch["labels"],
                None,
                0.1,
                self.loss_kind if training else "none",
                self.forward if training else None,
                always_scale=self.sync_free,
            )


def measure_levers(preset: str, args, limit: float = math.inf) -> dict:
    """Each lever of `LEVERS` against the plain step (ours, eager, the reference loss) and MarianMTModel, on
    the same ``--lever-steps`` batches, alternating: a first pass (the lever's warm-up: compilation, plans)
    and the same batches again (steady). Lever and plain start from the same weights; after both passes,
    each one's loss on the first batch (eval mode, the plain loss) says whether the lever trains alike.
    A lever the device cannot run, or one that would not end within the budget, is named with the reason."""
    from vanilla_transformer.training import levers

    started = time.perf_counter()
    torch.manual_seed(args.seed)
    config = config_of(preset, args)
    template = VanillaTransformerForConditionalGeneration(config)  # every row starts from these weights
    marian = Trainee(marian_of(config), "eager", args)
    batches = make_batches(
        synthetic_lengths(200_000, args.seed),
        args.max_tokens,
        args.vocab_size,
        args.lever_steps,
        args.device,
        args.seed,
    )
    target_tokens = sum(sum(b["lengths"][1]) for b in batches)
    # MarianMTModel's own first pass over the batches (its warm-up), then its memory; its steady rate is taken
    # in each row, beside the lever's and the plain step's
    marian_first = [marian.step(batch) for batch in batches]
    marian_row = {
        "first_pass_target_tokens_per_second": target_tokens / sum(marian_first),
        "first_pass_seconds": sum(marian_first),
        "step_peak_gib": step_peak_gib(marian, batches, args),
    }
    rows, plain_row = [], None
    for name, lever in [("plain", {"flags": []}), *((name, LEVERS[name]) for name in lever_rows(args))]:
        reasons = [levers.refusal(flag, args.device) for flag in [lever.get("refused_as"), *lever["flags"]] if flag]
        reasons = [reason for reason in reasons if reason]
        if preset not in lever.get("presets", (preset,)):
            reasons.append(f"a lever for {lever['shapes']}: measured with --presets {','.join(lever['presets'])}")
        if reasons:
            rows.append({"lever": name, "skipped": reasons[0]})
            continue
        spent = time.perf_counter() - started
        if spent + expected_seconds(lever, rows) + LEVER_GRACE_SECONDS > limit:  # it would be stopped part-way
            rows.append({"lever": name, "skipped": f"not started: {max(limit - spent, 0):.0f} s of the budget left"})
            continue
        row_started = time.perf_counter()
        torch._dynamo.reset()  # each row compiles afresh, whatever an earlier one left (a stopped compilation)
        counted = compile_counters()
        try:
            budget_left = limit - spent - LEVER_GRACE_SECONDS
            cap = (budget_left, "at the end of --budget-minutes")
            if LEVER_ROW_SECONDS < budget_left:
                cap = (LEVER_ROW_SECONDS, f"at the {LEVER_ROW_SECONDS} s that one lever row may take")
            with time_limit(*cap):  # the rows so far stay
                plain = LeverTrainee(copy.deepcopy(template), args)
                trainee = LeverTrainee(
                    copy.deepcopy(template), args, **{k: v for k, v in lever.items() if k not in LEVER_ROW_KEYS}
                )
                declined = declined_uses(trainee, batches[0]) if lever.get("attention", "default") != "default" else []
                times = {
                    key: [] for key in ("lever first", "lever steady", "plain first", "plain steady", "marian steady")
                }
                for phase in ("first", "steady"):
                    for index, batch in enumerate(batches):
                        order = [("lever", trainee), ("plain", plain), ("marian", marian)]
                        for who, model in order if index % 2 == 0 else order[::-1]:
                            if who != "marian" or phase == "steady":
                                torch.manual_seed(args.seed + index)  # the same dropout for lever and plain
                                times[f"{who} {phase}"].append(model.step(batch))
                # eager (compiled layers run as written: no recompilation for eval mode) and without gradients
                with torch.no_grad(), torch.compiler.set_stance("force_eager"):
                    trainee.model.eval(), plain.model.eval()
                    losses = [float(model.loss(batches[0], training=False)) for model in (trainee, plain)]
                memory = {
                    who: step_peak_gib(model, batches, args) for who, model in (("lever", trainee), ("plain", plain))
                }
                unsynchronized = None
                if lever.get("unsynchronized"):  # after the loss and memory: two more passes each, alternating
                    passes = {"plain": [], "lever": []}
                    for who, model in [("plain", plain), ("lever", trainee)] * 2:
                        passes[who].append(model.unsynchronized_pass(batches, args.seed))
                    unsynchronized = {
                        "lever_target_tokens_per_second": target_tokens / min(passes["lever"]),
                        "plain_target_tokens_per_second": target_tokens / min(passes["plain"]),
                        "lever_time_over_plain": min(passes["lever"]) / min(passes["plain"]),
                    }
        except Exception as error:
            if out_of_time(error):
                rows.append(
                    {
                        "lever": name,
                        "skipped": str(out_of_time(error)),
                        "seconds": round(time.perf_counter() - row_started, 1),
                    }
                )
                emit_row({"what": "levers", "preset": preset, **rows[-1]})
                continue
            rows.append(
                {
                    "lever": name,
                    "error": f"{type(error).__name__}: {error}",
                    "seconds": round(time.perf_counter() - row_started, 1),
                }
            )
            emit_row({"what": "levers", "preset": preset, **rows[-1]})
            continue
        finally:
            trainee = plain = None
        ratios = sorted(lever / plain for lever, plain in zip(times["lever steady"], times["plain steady"]))
        row = {
            "lever": name,
            "flags": lever["flags"],
            "seconds": round(time.perf_counter() - row_started, 1),
            "first_pass_target_tokens_per_second": target_tokens / sum(times["lever first"]),
            "steady_target_tokens_per_second": target_tokens / sum(times["lever steady"]),
            "warmup_seconds": sum(times["lever first"]) - sum(times["lever steady"]),
            "plain_steady_target_tokens_per_second": target_tokens / sum(times["plain steady"]),
            "marian_steady_target_tokens_per_second": target_tokens / sum(times["marian steady"]),
            "lever_time_over_plain": {
                "median": statistics.median(ratios),
                "quartiles": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]],
            },
            "loss_after": losses[0],
            "plain_loss_after": losses[1],
            "updates": 2 * len(batches),
            "step_peak_gib": memory["lever"],
            "plain_step_peak_gib": memory["plain"],
            "compile_counters": counted_since(counted),  # the row's compilation: recompiles, breaks, graphs skipped
        }
        if declined:  # the row's kernel leads, but torch falls back in silence for these uses
            row["declined_uses"] = declined
        if unsynchronized is not None:  # the faster of two passes each, without a synchronisation per step
            row["unsynchronized_pass"] = unsynchronized
        if name == "plain":
            plain_row = row
            marian_row["steady_target_tokens_per_second"] = row["marian_steady_target_tokens_per_second"]
            marian_row["warmup_seconds"] = (
                marian_row["first_pass_seconds"] - target_tokens / (marian_row["steady_target_tokens_per_second"])
            )
        rows.append(row)
        emit_row({"what": "levers", "preset": preset, **row})
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return {
        "what": "levers",
        "preset": preset,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "compile_backend": args.compile_backend,
        "batches": len(batches),
        "distinct_shapes": len({(*b["input_ids"].shape, b["labels"].shape[1]) for b in batches}),
        "plain": plain_row,
        "marian": marian_row,
        "rows": rows,
    }


def step_peak_gib(trainee, batches: list[dict], args) -> float | None:
    """The most memory one step (on the largest batch) holds beyond what the models held before it, GiB
    (CUDA's allocator; None elsewhere, and for CUDA graphs: a replay takes its memory from the graph's private
    pool, held since it was recorded, and allocates nothing the peak would show)."""
    if not args.device.startswith("cuda") or getattr(trainee, "compile", None) in ("cuda_graphs", "cuda_graphs static"):
        return None
    largest = max(batches, key=lambda b: b["input_ids"].numel() + b["labels"].numel())
    trainee.model.train()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    trainee.step(largest)
    return (torch.cuda.max_memory_allocated() - before) / 2**30


DECODING_SHAPES = {
    "multi30k": (
        "base",
        dict(
            d_model=256,
            encoder_layers=3,
            decoder_layers=3,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=1024,
            decoder_ffn_dim=1024,
        ),
    )
}


def config_of(preset: str, args) -> VanillaTransformerConfig:
    """A preset's config, or the Multi30k recipe's shape ("multi30k"), with ``--vocab-size`` words."""
    base, overrides = DECODING_SHAPES.get(preset, (preset, {}))
    return VanillaTransformerConfig.from_preset(base, vocab_size=args.vocab_size, **overrides)


def beam_settings(args) -> dict:
    """generate()'s settings of the decoding rows: beam 4, the paper's length penalty, exactly ``--decode-tokens``
    new tokens a sentence (random weights never stop on their own; every model does the same work)."""
    return dict(
        num_beams=4,
        length_penalty=0.6,
        max_new_tokens=args.decode_tokens,
        min_new_tokens=args.decode_tokens,
        early_stopping=True,
    )


@contextmanager
def cudnn_first_outside_training():
    """`attention_backends.BACKENDS` with cuDNN's attention first for every use outside training (as torch's own
    order has it on Hopper with a recent cuDNN), while the block runs: the decoding row that decides whether
    ``generate()`` leaves it out (only training's choice is measured, docs/benchmarks/gpu.md)."""
    from vanilla_transformer import attention_backends

    saved = dict(attention_backends.BACKENDS)
    for (training, use), backends in saved.items():
        if not training:
            rest = tuple(backend for backend in backends if backend != attention_backends.CUDNN)
            attention_backends.BACKENDS[training, use] = (attention_backends.CUDNN, *rest)
    try:
        yield
    finally:
        attention_backends.BACKENDS.update(saved)


def measure_decoding(preset: str, mode: str, args) -> dict:
    """Beam 4 with ``generate()``: ours and the MarianMTModel whose weights ours holds (`from_marian`),
    alternating on the same sentences, the same number of new tokens each; with the eager rows on CUDA, ours
    with cuDNN's attention first too (`cudnn_first_outside_training`), and CTranslate2 holding the same weights
    (`to_ctranslate2`), where its wheel runs. Each run's first call (untimed in the median: cuDNN's plans,
    compilation) is reported apart."""
    import tempfile

    from vanilla_transformer.convert import from_marian

    torch.manual_seed(args.seed)
    config = config_of(preset, args)
    dtype = DTYPES[args.dtype]
    marian = marian_of(config).eval()
    ours = from_marian(marian).eval()
    lengths = synthetic_lengths(args.decode_batch, args.seed + 1)[:, 0]
    source = torch.randint(4, args.vocab_size, (len(lengths), int(lengths.max())))
    attention_mask = (torch.arange(source.shape[1]) < torch.as_tensor(lengths)[:, None]).long()
    sources = [row[:length].tolist() for row, length in zip(source, lengths)]  # unpadded, for CTranslate2
    with tempfile.TemporaryDirectory() as folder:
        ctranslate2 = ctranslate2_decoder(ours, sources, args, Path(folder)) if mode == "eager" else None
        models = {"ours": ours.to(args.device, dtype), "marian": marian.to(args.device, dtype)}
        inputs = {
            "input_ids": source.masked_fill(attention_mask == 0, 0).to(args.device),
            "attention_mask": attention_mask.to(args.device),
        }
        settings = beam_settings(args)
        compiled_by = None
        if mode == "compiled":  # a static cache under torch.compile, each model as its best user gets it
            settings["cache_implementation"] = "static"
            by_hand = "torch.compile(forward, fullgraph=True)"
            # ours: on CUDA generate() compiles its beam search's step itself (CompileConfig's defaults: CUDA graphs,
            # `_compiled_forward`); MarianMTModel: transformers' beam search compiles nothing (5.24), so its user
            # compiles the forward (inductor, no CUDA graphs: its cache's reorder makes new tensors each step)
            compiled_by = {
                "ours": "generate(): CUDA graphs (reduce-overhead)" if args.device.startswith("cuda") else by_hand,
                "marian": by_hand,
            }
            for name, model in models.items():
                if compiled_by[name] == by_hand:
                    model.forward = torch.compile(model.forward, fullgraph=True)
        counted = compile_counters()
        runs = {name: (lambda model=model: model.generate(**inputs, **settings)) for name, model in models.items()}
        if mode == "eager" and args.device.startswith("cuda"):  # the attention table applies on CUDA only

            def ours_cudnn_first():
                with cudnn_first_outside_training():
                    return models["ours"].generate(**inputs, **settings)

            runs["ours, cuDNN first"] = ours_cudnn_first
        if ctranslate2 and "translate" in ctranslate2:
            runs["ctranslate2"] = ctranslate2.pop("translate")
        times, outputs, first_calls, failed = {name: [] for name in runs}, {}, {}, {}
        with torch.inference_mode():
            for repeat in range(args.decode_repeats + 1):  # the first call compiles / warms up
                for name in list(runs) if repeat % 2 == 0 else list(reversed(runs)):  # alternating
                    synchronize(args.device)
                    started = time.perf_counter()
                    try:
                        outputs[name] = runs[name]()
                        synchronize(args.device)  # where a kernel's error shows
                    except Exception as error:  # a variant's failure keeps ours and MarianMTModel's row
                        if name in ("ours", "marian"):
                            raise
                        failed[name] = f"{type(error).__name__}: {error}"[:500]
                        del runs[name], times[name]
                        outputs.pop(name, None)
                        first_calls.pop(name, None)
                        continue
                    if repeat:
                        times[name].append(time.perf_counter() - started)
                    else:
                        first_calls[name] = round(time.perf_counter() - started, 3)
    seconds = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "what": "decoding",
        "preset": preset,
        "mode": mode,
        "dtype": args.dtype,
        "beams": 4,
        "sentences": len(lengths),
        "new_tokens": outputs["ours"].shape[1] - 1,
        "seconds": seconds["ours"],
        "sentences_per_second": len(lengths) / seconds["ours"],
        "target_tokens_per_second": len(lengths) * args.decode_tokens / seconds["ours"],
        "marian_sentences_per_second": len(lengths) / seconds["marian"],
        "ours_over_marian": seconds["marian"] / seconds["ours"],
        "compiled_by": compiled_by,
        "first_call_seconds": first_calls,
        # ours and MarianMTModel together, over every call: recompiles, breaks, CUDA graphs skipped
        "compile_counters": counted_since(counted) if mode == "compiled" else None,
    }
    if "ours, cuDNN first" in failed:
        result["cudnn_first"] = {"error": failed["ours, cuDNN first"]}
    if "ours, cuDNN first" in seconds:
        result["cudnn_first"] = {
            "sentences_per_second": len(lengths) / seconds["ours, cuDNN first"],
            "over_default": seconds["ours"] / seconds["ours, cuDNN first"],
            "same_hypotheses": bool(torch.equal(outputs["ours, cuDNN first"], outputs["ours"])),
        }
    if ctranslate2 is not None:
        if "ctranslate2" in failed:
            ctranslate2.pop("ids")
            ctranslate2["error"] = failed["ctranslate2"]
        if "ctranslate2" in seconds:
            hypotheses = ctranslate2.pop("ids")(outputs["ctranslate2"])
            ctranslate2.update(
                sentences_per_second=len(lengths) / seconds["ctranslate2"],
                ours_over_ctranslate2=seconds["ctranslate2"] / seconds["ours"],
                equal_to_ours=sum(h == o for h, o in zip(hypotheses, outputs["ours"][:, 1:].tolist())),
                sentences=len(lengths),
            )
        result["ctranslate2"] = ctranslate2
    return result


def measure_bucketed_decoding(preset: str, args) -> dict:
    """What ``translate --static-cache`` decodes: ``--decode-batches`` batches of ``--decode-batch`` sentences of
    WMT-like lengths, sorted by length as translate sorts them, each padded to a multiple of 16 tokens
    (`translation.padded_to_multiple`); beam 4, exactly ``--decode-tokens`` new tokens each. Ours and the
    MarianMTModel whose weights it holds, each with a static cache (ours compiled by generate() on CUDA, a graph per
    batch shape; MarianMTModel's not, as transformers' beam search compiles nothing) and with the default dynamic
    cache, alternating: the first pass over the batches (the compilations) and the second, in sentences/s."""
    from vanilla_transformer.convert import from_marian
    from vanilla_transformer.training.translation import STATIC_CACHE_MULTIPLE, padded_to_multiple

    torch.manual_seed(args.seed)
    config = config_of(preset, args)
    dtype = DTYPES[args.dtype]
    marian = marian_of(config).eval()
    ours = from_marian(marian).eval()
    models = {"ours": ours.to(args.device, dtype), "marian": marian.to(args.device, dtype)}
    count = args.decode_batches * args.decode_batch
    lengths = np.sort(synthetic_lengths(count, args.seed + 2)[:, 0])
    limit = config.max_position_embeddings
    batches, widths = [], set()
    for start in range(0, count, args.decode_batch):
        chunk = torch.as_tensor(np.minimum(lengths[start : start + args.decode_batch], limit))
        mask = (torch.arange(int(chunk.max())) < chunk[:, None]).long()
        ids = torch.randint(4, args.vocab_size, mask.shape).masked_fill(mask == 0, config.pad_token_id)
        batch = padded_to_multiple(
            {"input_ids": ids, "attention_mask": mask}, STATIC_CACHE_MULTIPLE, limit, config.pad_token_id
        )
        widths.add(tuple(batch["input_ids"].shape))
        batches.append({name: tensor.to(args.device) for name, tensor in batch.items()})
    allow_recompiles(len(widths))  # a graph per batch shape, as translate --static-cache allows
    settings = beam_settings(args)
    variants = {f"{name}, {cache}": (model, cache) for cache in ("static", "dynamic") for name, model in models.items()}
    seconds = {name: [] for name in variants}
    counted = compile_counters()
    with torch.inference_mode():
        for repeat in range(2):  # the first pass compiles a graph per shape (static, on CUDA); the second reuses them
            order = list(variants) if repeat == 0 else list(reversed(variants))
            for name in order:
                model, cache = variants[name]
                synchronize(args.device)
                started = time.perf_counter()
                for batch in batches:
                    model.generate(
                        **batch, **settings, **({"cache_implementation": "static"} if cache == "static" else {})
                    )
                synchronize(args.device)
                seconds[name].append(time.perf_counter() - started)
    rates = {name: {"first_pass": count / times[0], "second_pass": count / times[1]} for name, times in seconds.items()}
    return {
        "what": "decoding buckets",
        "preset": preset,
        "dtype": args.dtype,
        "beams": 4,
        "sentences": count,
        "batches": len(batches),
        "shapes": len(widths),
        "new_tokens": args.decode_tokens,
        "sentences_per_second": rates,
        "compiled": args.device.startswith("cuda"),  # ours: generate() compiles a static cache's step on CUDA only
        "compile_counters": counted_since(counted),
    }


COMPILE_COUNTERS = (  # (group, name) of torch._dynamo.utils.counters: what a compiled row really ran
    ("stats", "unique_graphs"),  # graphs compiled (a recompilation adds one)
    ("graph_break", None),  # graph breaks, all reasons
    ("inductor", "cudagraph_skips"),  # CUDA graphs not used (mutated inputs, CPU tensors, dynamic shapes...)
    ("inductor", "cudagraph_recorded_non_static_inputs"),  # re-recorded for inputs whose address moved
)


def compile_counters() -> dict[str, int]:
    """The running totals of `COMPILE_COUNTERS`; the difference over a measurement says whether its compiled
    model recompiled, broke its graph or skipped CUDA graphs (a row's ``compiled_by`` says only what was asked)."""
    from torch._dynamo.utils import counters

    totals = {}
    for group, name in COMPILE_COUNTERS:
        totals[name or group] = int(sum(counters[group].values()) if name is None else counters[group][name])
    return totals


def counted_since(before: dict[str, int]) -> dict[str, int]:
    return {name: value - before.get(name, 0) for name, value in compile_counters().items()}


def ctranslate2_decoder(model, sources: list[list[int]], args, folder: Path) -> dict:
    """CTranslate2 with our model's weights on the same device, decoding as ``generate()`` does (beam 4,
    length penalty 0.6, exactly ``--decode-tokens`` tokens): float16 where its wheel has it on the
    device, else float32 (CPU wheels: float32 and int8 only). ``translate`` runs it on ``sources``,
    ``ids`` turns its results into token ids; or ``skipped`` says why it cannot run here."""
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    try:
        import ctranslate2
    except ImportError as error:
        return {"skipped": f"ctranslate2 is not importable ({error}): {install_command('ctranslate2')}"}
    try:
        supported = ctranslate2.get_supported_compute_types(device)
    except Exception as error:  # e.g. a wheel built without CUDA
        return {
            "skipped": f"ctranslate2 {ctranslate2.__version__} does not run on {device}: "
            f"{type(error).__name__}: {error}"
        }
    compute_type = "float16" if "float16" in supported else "float32"
    try:
        from vanilla_transformer.convert import to_ctranslate2

        tokenizer = word_level_tokenizer(model.config.vocab_size)
        to_ctranslate2(model, folder / "ctranslate2", tokenizer=tokenizer)
        translator = ctranslate2.Translator(
            str(folder / "ctranslate2"),
            device=device,
            compute_type=compute_type,
            **({"intra_threads": torch.get_num_threads()} if device == "cpu" else {}),
        )
    except Exception as error:
        return {
            "skipped": f"export to or loading in CTranslate2 failed: {type(error).__name__}: {error}",
            "compute_type": compute_type,
        }
    pieces = [tokenizer.convert_ids_to_tokens(ids) for ids in sources]
    settings = dict(
        beam_size=4,
        length_penalty=0.6,
        max_decoding_length=args.decode_tokens,
        min_decoding_length=args.decode_tokens,
        return_end_token=True,
    )
    return {
        "compute_type": compute_type,
        "version": ctranslate2.__version__,
        "translate": lambda: translator.translate_batch(pieces, **settings),
        "ids": lambda results: [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in results],
    }


MULTI30K_LENGTH_SCALE = 13 / 28  # Multi30k's sentences are about 13 tokens, WMT14's (synthetic_lengths) about 28


def measure_evaluation(preset: str, args) -> dict:
    """train's evaluation (`TransformerTrainer.evaluate()`: the model's generation config, beam 4 and the
    paper's length rule; BLEU and chrF) of a random ``preset`` model on ``--eval-sentences`` synthetic
    sentences, in the input order and sorted by length (``--eval_order``), alternating: benchmarks/
    evaluation_order.py's `evaluation_speed`. A random model ends no hypothesis, so every batch decodes
    to its longest source + 50 tokens: sorting saves padding and steps, as it does for a trained model's
    unfinished ones."""
    from evaluation_order import evaluation_speed

    torch.manual_seed(args.seed)
    config = config_of(preset, args)
    model = VanillaTransformerForConditionalGeneration(config)
    lengths = synthetic_lengths(args.eval_sentences, args.seed + 2)
    if preset == "multi30k":
        lengths = np.rint(lengths * MULTI30K_LENGTH_SCALE).astype(np.int64)
    rng = np.random.default_rng(args.seed)

    def words(count: int) -> str:  # count tokens with </s>
        return " ".join(f"t{index}" for index in rng.integers(4, config.vocab_size, size=max(count, 2) - 1))

    pairs = [(words(source), words(target)) for source, target in lengths.tolist()]
    tokenizer = numbered_tokenizer(config.vocab_size)
    result = evaluation_speed(
        model,
        tokenizer,
        pairs,
        batch_size=args.eval_batch,
        device=args.device,
        repeats=args.eval_repeats,
        bf16=bf16_supported(args),
        larger_batch=args.eval_larger_batch or None,
        static_cache=args.eval_static_cache,
    )
    return {"what": "evaluation", "preset": preset, "mode": "eager", **result}


def numbered_tokenizer(size: int):
    """Words t4 ... t{size - 1} with the package's special ids (pad 0, unk 1, <s> 2, </s> 3) and </s> after
    each sentence, as the package's tokenizer encodes: a tokenizer for a random model, without training one."""
    return word_level_tokenizer(size, specials=("<pad>", "<unk>", "<s>", "</s>"), end_with_eos=True)


def word_level_tokenizer(size: int, specials=("<pad>", "<unk>", "</s>"), end_with_eos: bool = False):
    """``size`` word pieces (t3, t4, ... after the specials, by default MarianMT's ids pad 0, unk 1, eos 2),
    split at white space: CTranslate2 names tokens by piece. ``end_with_eos``: </s> after each sentence."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(specials)}
    vocab |= {f"t{index}": index for index in range(len(specials), size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if end_with_eos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A </s>", special_tokens=[("</s>", vocab["</s>"])]
        )
    names = dict(pad_token="<pad>", unk_token="<unk>", eos_token="</s>", bos_token="<s>" if "<s>" in vocab else None)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **names)


WORDS = [f"w{index}" for index in range(3000)]


def letter_words(count: int) -> list[str]:
    """``count`` distinct words of letters (ba, bb, ... bfr): the byte-level BPE splits digits from letters."""
    words = []
    for index in range(26, 26 + count):
        word = ""
        while index:
            index, letter = divmod(index, 26)
            word = chr(ord("a") + letter) + word
        words.append(word)
    return words


def run_flags(args) -> list[str]:
    """train.py's flags common to the benchmark's runs: no checkpoints, no reports or bars, the seed, the device,
    bf16 where asked for and the device has it."""
    return [
        "--save_strategy",
        "no",
        "--save_minutes",  # the recipe's timed checkpoints off too: a save inside a 1-minute run is not training
        "0",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--seed",
        str(args.seed),
        *(["--use_cpu"] if args.device == "cpu" else []),
        *(["--bf16", "true"] if bf16_supported(args) else []),
    ]


def write_synthetic_text(
    folder: Path, pairs: int, seed: int, words: list[str] = WORDS, length_scale: float = 1.0
) -> list[str]:
    """train.src/train.tgt of ``pairs`` lines of random words with WMT-like lengths (times ``length_scale``);
    train.py's flags for them.

    One draw of word indices for all lines of a side (not one `rng.choice` per line): 80,000 lines in
    well under a second."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(np.rint(synthetic_lengths(pairs, seed) * length_scale).astype(np.int64), 2)
    vocabulary = np.asarray(words, dtype=object)
    for side, name in ((0, "train.src"), (1, "train.tgt")):
        counts = lengths[:, side] - 1  # + </s>
        drawn = vocabulary[rng.integers(0, len(vocabulary), size=int(counts.sum()))]
        ends = np.cumsum(counts)
        lines = (" ".join(drawn[end - count : end]) for count, end in zip(counts.tolist(), ends.tolist()))
        (folder / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return ["--train_source_file", str(folder / "train.src"), "--train_target_file", str(folder / "train.tgt")]


class RawStepTimer:
    """A callback that, after each update of the loop, times the raw step on the batch the loop just took.

    ``loop`` holds the seconds between the ends of consecutive updates (everything the loop does per
    update: loading, collating, the step, the schedule, callbacks, logging), the raw step's own time
    excluded; ``raw`` the seconds of forward, loss, backward and optimizer step alone."""

    def __init__(self, trainer, batches: list[dict], warmup: int):
        self.trainer, self.batches, self.warmup = trainer, batches, warmup
        self.loop, self.raw, self.last = [], [], None

    def __getattr__(self, name):  # every other TrainerCallback event: nothing to do
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        synchronize(args.device.type)
        now = time.perf_counter()
        if self.last is not None and state.global_step > self.warmup:
            self.loop.append(now - self.last)
        if state.global_step > self.warmup:
            self.raw.append(self.raw_step(model, optimizer.optimizer, self.batches[state.global_step - 1], args))
        self.last = time.perf_counter()

    def raw_step(self, model, optimizer, batch: dict, args) -> float:
        started = time.perf_counter()
        labels = batch["labels"]
        with self.trainer.autocast_smart_context_manager():
            logits = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=batch["decoder_input_ids"],
            ).logits
            loss = label_smoothed_cross_entropy(logits, labels, (labels != -100).sum(), args.label_smoothing_factor)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(args.device.type)
        return time.perf_counter() - started


def measure_loop(preset: str, args) -> dict:
    """train.py's loop per update against the raw step on the same batches (medians, alternating)."""
    import tempfile

    from vanilla_transformer.training.run import build_trainer, parse_arguments

    with tempfile.TemporaryDirectory() as folder:
        # Enough pairs for --loop-steps batches of --max-tokens (about 30 padded tokens a sentence; 25 leaves room).
        pairs = max(4000, math.ceil(args.loop_steps * args.max_tokens / 25))
        flags = write_synthetic_text(Path(folder), pairs=pairs, seed=args.seed) + [
            "--preset",
            preset,
            "--tokenizer_vocab_size",
            "4000",
            "--output_dir",
            str(Path(folder) / "run"),
            "--max_tokens",
            str(args.max_tokens),
            "--max_steps",
            str(args.loop_steps),
            "--ema_decay",
            "0.998",
            "--max_train_minutes",
            "60",
            "--logging_steps",
            "50",
            *run_flags(args),
        ]
        run = build_trainer(*parse_arguments(flags))
        trainer = run.trainer
        loader = trainer.get_train_dataloader()  # epoch 0: the batches the loop will take, in its order
        batches = [batch for _, batch in zip(range(args.loop_steps), loader)]
        if len(batches) < args.loop_steps:
            raise ValueError(f"--loop-steps {args.loop_steps} is more than the {len(batches)} batches of an epoch.")
        timer = RawStepTimer(trainer, batches, warmup=min(10, args.loop_steps // 4))
        trainer.add_callback(timer)
        trainer.train()
    loop, raw = statistics.median(timer.loop), statistics.median(timer.raw)
    ratios = sorted(looped / raw for looped, raw in zip(timer.loop, timer.raw))
    return {
        "what": "loop",
        "preset": preset,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "updates": len(timer.loop),
        "loop_seconds_per_update": loop,
        "raw_step_seconds": raw,
        "loop_over_raw": loop / raw,
        "loop_over_raw_quartiles": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]],
    }


def measure_train_run(preset: str, args) -> dict:
    """train.py as a user runs it (`run.main`), for ``--train-run-minutes`` on synthetic WMT-like text: its
    own end-of-training metrics (target tokens/s), and the MFU those tokens/s make."""
    import tempfile

    from transformers import AutoTokenizer

    from vanilla_transformer.training import run

    vocab = args.train_run_vocab or args.vocab_size
    with tempfile.TemporaryDirectory() as folder:
        words = letter_words(vocab // 2)  # the BPE learns them whole: about a token a word, as WMT's lengths say
        started = time.perf_counter()
        flags = write_synthetic_text(Path(folder), pairs=args.train_run_pairs, seed=args.seed, words=words)
        text_seconds = time.perf_counter() - started
        flags += [
            "--preset",
            preset,
            "--tokenizer_vocab_size",
            str(vocab),
            "--output_dir",
            str(Path(folder) / "run"),
            "--max_tokens",
            str(args.max_tokens),
            "--max_train_minutes",
            str(args.train_run_minutes),
            "--max_steps",
            "1000000",
            "--logging_steps",
            "50",
            *run_flags(args),
        ]
        with PhaseClock(run) as clock:
            run.main(flags)
        output = Path(folder) / "run"
        metrics = json.loads((output / "all_results.json").read_text(encoding="utf-8"))  # the run's own record
        updates = json.loads((output / "trainer_state.json").read_text(encoding="utf-8"))["global_step"]
        config = VanillaTransformerConfig.from_pretrained(output)
        # The FLOPs per target token of the pairs it trained on, as the run's tokenizer cut them.
        tokenizer = AutoTokenizer.from_pretrained(output)
        sources = (Path(folder) / "train.src").read_text(encoding="utf-8").splitlines()
        targets = (Path(folder) / "train.tgt").read_text(encoding="utf-8").splitlines()
        encoded = tokenizer(sources, text_target=targets, truncation=False)
        source_lengths = [len(ids) for ids in encoded["input_ids"]]
        target_lengths = [len(ids) for ids in encoded["labels"]]
    flops_per_target_token = training_flops(config, source_lengths, target_lengths) / sum(target_lengths)
    tokens_per_second = metrics["train_target_tokens_per_second"]
    peak = peak_tflops(args)
    return {
        "what": "train_run",
        "preset": preset,
        "dtype": "bfloat16" if bf16_supported(args) else "float32",
        "max_tokens": args.max_tokens,
        "minutes": args.train_run_minutes,
        "pairs": args.train_run_pairs,
        "vocab_size": config.vocab_size,
        "updates": updates,
        "train_runtime": metrics["train_runtime"],
        "train_target_tokens": metrics["train_target_tokens"],
        "target_tokens_per_second": tokens_per_second,
        "flops_per_target_token": flops_per_target_token,
        "mean_source_tokens": sum(source_lengths) / len(source_lengths),
        "mean_target_tokens": sum(target_lengths) / len(target_lengths),
        "mfu": tokens_per_second * flops_per_target_token / (peak * 1e12) if peak else None,
        "phase_seconds": clock.seconds(),
        "text_seconds": text_seconds,
    }


# The Multi30k recipe's update is launch-bound on a GPU (1,024 tokens a batch, d_model 256): the levers for that.
RECIPE_VARIANTS = {
    "plain": [],
    "cuda_graphs": ["--cuda_graphs", "true"],
    "compile_layers": ["--compile_layers", "true"],  # 0.99x the plain step on an H100 (2026-11-27): not by default
    "bf16_weights": ["--bf16_weights", "true"],  # 0.62x the operators of an update (operator_count.py)
    "sync_free_step": ["--sync_free_step", "true"],  # no host read in an update
}
RECIPE_DEFAULT_VARIANTS = "plain,cuda_graphs"
RECIPE_OVERHEAD_SECONDS = 20  # a variant's data, tokenizer, model and final save around its training minutes
PROFILED_UPDATES = {True: 20, False: 3}  # the recipe's profiled window: on CUDA, on a CPU


def recipe_variants(args) -> list[str]:
    return [name for name in args.recipe_variants.split(",") if name]


def measure_recipe(preset: str, args, limit: float = math.inf) -> dict:
    """The Multi30k recipe (`train multi30k`, training/recipes/multi30k.yaml) as a user's first GPU run: train.py
    (`run.main`) for ``--recipe-minutes`` on ``--recipe-pairs`` synthetic pairs of Multi30k's lengths (about 13
    tokens a side), plain and with each launch-bound lever of ``--recipe-variants``, one after the other: updates/s
    over the run (its own log, compilation included) and at steady state (the second half of training), the first
    update's seconds. A variant the device cannot run, or that does not fit the budget, is named with the reason."""
    import tempfile

    from vanilla_transformer.training import levers, run

    started, rows, cuda = time.perf_counter(), [], args.device.startswith("cuda")
    variants = recipe_variants(args)
    need = 60 * args.recipe_minutes + RECIPE_OVERHEAD_SECONDS  # one variant's run
    with tempfile.TemporaryDirectory() as folder:
        words = letter_words(4000)  # half the recipe's 8,000 BPE tokens: about a token a word
        files = write_synthetic_text(
            Path(folder), args.recipe_pairs, args.seed, words=words, length_scale=MULTI30K_LENGTH_SCALE
        )
        for number, name in enumerate(variants):
            flags = RECIPE_VARIANTS[name]
            reason = levers.refusal(flags[0], args.device) if flags else None
            # what is left, less what the variants after this one need: the first ones are the comparison's base
            share = limit - (time.perf_counter() - started) - need * (len(variants) - number - 1)
            if reason:
                rows.append({"variant": name, "flags": flags, "skipped": reason})
                continue
            if need > share:
                rows.append({"variant": name, "flags": flags, "skipped": f"not started: {share:.0f} s of the budget"})
                continue
            output = Path(folder) / name
            argv = [
                "multi30k",
                "--dataset_name",
                "none",
                *files,
                "--do_eval",
                "false",
                "--do_predict",
                "false",
                "--output_dir",
                str(output),
                "--max_train_minutes",
                str(args.recipe_minutes),
                "--pad_to_buckets",  # the same batches for every variant (--cuda_graphs pads them to buckets)
                "always",
                *run_flags(args),
                *flags,
            ]
            row_started = time.perf_counter()
            torch._dynamo.reset()
            try:
                # a window of updates profiled early in the run (20 on a GPU, where an update takes milliseconds),
                # which the steady rate and the breakdown leave out
                window = dict(
                    profile_after=0.2 * 60 * args.recipe_minutes,
                    profile_by=0.5 * 60 * args.recipe_minutes,
                    profile_updates=PROFILED_UPDATES[cuda],
                )
                with time_limit(share), PhaseClock(run, **window) as clock:
                    run.main(argv)
            except Exception as error:
                stopped = out_of_time(error)
                outcome = {"skipped": str(stopped)} if stopped else {"error": f"{type(error).__name__}: {error}"}
                rows.append(
                    {"variant": name, "flags": flags, **outcome, "seconds": round(time.perf_counter() - row_started, 1)}
                )
                emit_row({"what": "recipe", "preset": preset, **rows[-1]})
                continue
            metrics = json.loads((output / "all_results.json").read_text(encoding="utf-8"))
            updates = json.loads((output / "trainer_state.json").read_text(encoding="utf-8"))["global_step"]
            phases = clock.seconds()
            rows.append(
                {
                    "variant": name,
                    "flags": flags,
                    "updates": updates,
                    "train_runtime": metrics["train_runtime"],
                    "updates_per_second": updates / metrics["train_runtime"],
                    "steady_updates_per_second": clock.steady_updates_per_second(),
                    "first_update_seconds": phases["first update"],
                    "phase_seconds": phases,
                    "target_tokens_per_second": metrics["train_target_tokens_per_second"],
                    "update_breakdown": clock.update_breakdown(),
                    "profile": clock.profile,
                    "seconds": round(time.perf_counter() - row_started, 1),
                }
            )
            emit_row({"what": "recipe", "preset": preset, **rows[-1]})
    return {
        "what": "recipe",
        "preset": preset,
        "mode": "eager",
        "dtype": "bfloat16" if bf16_supported(args) else "float32",
        "minutes": args.recipe_minutes,
        "pairs": args.recipe_pairs,
        "rows": rows,
    }


class PhaseClock:
    """The seconds each phase of a train.py run (`run.main`) took, timed inside the run: the run module's own
    steps (reading the data, the tokenizer, tokenising, the model, saving the final model) are wrapped with
    a clock while the run lasts, and a callback on its trainer times the first update and the rest of
    training. A phase whose step the run module no longer has by that name is reported as missing, not guessed."""

    STEPS = {  # phase: the function of the run module that does it, or (another module, its function)
        "data": "load_text_datasets",
        "tokenizer": "prepare_tokenizer",
        "tokenization": "tokenize_pairs",
        "model": "prepare_model",
        "memory probe": ("vanilla_transformer.training.trainer", "check_largest_batches_fit"),  # --memory_probe
        "save": "save_final_model",
    }
    PHASES = ("data", "tokenizer", "tokenization", "model", "memory probe", "first update", "training", "save")

    # Where an update's host time goes, between the Trainer's callback events (`update_breakdown`): from the end
    # of the last update to this one's first forward (logging, the next batch: collation and the copy to the
    # device), forward and backward, the optimizer, and after it (schedule, zero_grad, the moving average).
    UPDATE_PHASES = ("logging and the next batch", "forward and backward", "optimizer", "after the optimizer")

    def __init__(
        self, module, profile_after: float | None = None, profile_updates: int = 20, profile_by: float | None = None
    ):
        self.module, self.spent, self.saved, self.marks, self.step_ends = module, {}, {}, {}, []
        self.events = []  # per update: (begin, before the optimizer, after it, end), host seconds
        self.profile_after, self.profile_updates = profile_after, profile_updates
        self.profile_by = profile_by  # seconds after training began by which the window starts in any case
        self.profiler, self.profile = None, None

    def __enter__(self):
        import importlib

        self.started = time.perf_counter()
        for phase, step in self.STEPS.items():
            module, name = (self.module, step) if isinstance(step, str) else (importlib.import_module(step[0]), step[1])
            if self.module is not None and callable(getattr(module, name, None)):
                self.saved[module, name] = getattr(module, name)
                setattr(module, name, self._timed(phase, self.saved[module, name]))
        if callable(getattr(self.module, "build_trainer", None)):
            self.saved[self.module, "build_trainer"] = build_trainer = self.module.build_trainer

            def with_callback(*args, **kwargs):
                built = build_trainer(*args, **kwargs)
                built.trainer.add_callback(self)
                return built

            self.module.build_trainer = with_callback
        return self

    def __exit__(self, *exc):
        for (module, name), function in self.saved.items():
            setattr(module, name, function)
        if self.profiler is not None:  # the run stopped inside the profiled window (out of time, an error)
            self.profiler.__exit__(None, None, None)
            self.profiler = None
        self.total = time.perf_counter() - self.started

    def _timed(self, phase: str, function):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - started

        return timed

    def __getattr__(self, name):  # the TrainerCallback events this clock does not use
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_train_begin(self, args, state, control, **kwargs):
        self.marks["begin"] = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self._profile_starts(now):
            self._start_profile(args.device.type)
            now = time.perf_counter()
        self._update = [now]

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._update.append(time.perf_counter())

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._update.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        if "first" not in self.marks:
            synchronize(args.device.type)
            self.marks["first"] = time.perf_counter()
        now = time.perf_counter()
        self.step_ends.append(now)
        if len(getattr(self, "_update", ())) == 3:  # begin, before and after the optimizer: a whole update
            self.events.append((*self._update, now))
        self._update = []
        if self.profiler is not None:
            self._window.append(now)
            if len(self._window) > self.profile_updates:
                self._stop_profile(args.device.type)

    def _profile_starts(self, now: float) -> bool:
        """Whether the profiled window of updates starts now: ``profile_after`` seconds after the first update, or
        ``profile_by`` seconds after training began, whichever comes first (a first update slow enough, on a
        loaded machine, left no time for the window before the run's minutes ran out)."""
        late = self.profile_by is not None and "begin" in self.marks and now - self.marks["begin"] >= self.profile_by
        return (
            self.profile_after is not None
            and self.profile is None
            and self.profiler is None
            and "first" in self.marks
            and (now - self.marks["first"] >= self.profile_after or late)
        )

    def _start_profile(self, device: str) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        synchronize(device)
        self.profiler = profile(activities=activities)
        self.profiler.__enter__()
        self._window = [time.perf_counter()]  # the window's start, then each profiled update's end

    def _stop_profile(self, device: str, run_ended: bool = False) -> None:
        synchronize(device)
        seconds = time.perf_counter() - self._window[0]
        self.profiler.__exit__(None, None, None)
        updates = len(self._window) - 1
        summary = profile_summary(self.profiler, device == "cuda", seconds, top=8)
        busy, launches = summary.get("device_busy_seconds"), summary["kernel_launches"]
        self.profile = {
            "updates": updates,
            "window_cut_by_the_run_end": run_ended,  # fewer updates than profile_updates: the run stopped first
            "seconds_per_update": seconds / updates,  # profiled: the profiler's own host time included
            "kernel_launches_per_update": None if launches is None else launches / updates,
            "device_busy_seconds_per_update": None if busy is None else busy / updates,
            "top": summary["top"],
            "ranked_by": summary["ranked_by"],
        }
        self.profiler = None
        self.profiled_span = (self._window[0], time.perf_counter())  # these updates are left out of the breakdown

    def update_breakdown(self, fraction: float = 0.5) -> dict | None:
        """The mean host milliseconds per update of each of `UPDATE_PHASES` over the last ``fraction`` of
        training, and the mean update (the phases add up to it); the profiled window's updates, and the one
        after it, are left out (all updates after the first where that leaves none, as
        `steady_updates_per_second`). No device reads are added, so on a GPU the host waits for the device only
        where the run itself waits (a logging step, a full launch queue), and that wait counts in the phase it
        falls in."""
        if "end" not in self.marks or len(self.events) < 3:
            return None
        start, stop = getattr(self, "profiled_span", (math.inf, math.inf))
        for share in (fraction, 1.0):
            since = self.marks["end"] - share * (self.marks["end"] - self.events[0][3])
            rows = [
                (begin - previous[3], before - begin, after - before, end - after)
                for previous, (begin, before, after, end) in zip(self.events, self.events[1:])
                if begin >= since and not (end > start and previous[3] < stop)
            ]
            if rows:
                break
        else:
            return None
        means = [1e3 * sum(column) / len(rows) for column in zip(*rows)]
        return {"updates": len(rows), "update_ms": sum(means), **dict(zip(self.UPDATE_PHASES, means))}

    def steady_updates_per_second(self, fraction: float = 0.5) -> float | None:
        """Updates per second over the last ``fraction`` of training (compilation and first shapes behind), the
        profiled window's updates left out; over all updates after the first where that leaves none (a run
        too short for the profile to end early)."""
        if "end" not in self.marks or len(self.step_ends) < 3:
            return None
        start, stop = getattr(self, "profiled_span", (math.inf, math.inf))
        for share in (fraction, 1.0):
            since = self.marks["end"] - share * (self.marks["end"] - self.step_ends[0])
            gaps = [
                end - previous
                for previous, end in zip(self.step_ends, self.step_ends[1:])
                if previous >= since and not (end > start and previous < stop)
            ]
            if gaps and sum(gaps) > 0:
                return len(gaps) / sum(gaps)
        return None

    def on_train_end(self, args, state, control, **kwargs):
        self.marks["end"] = time.perf_counter()
        if self.profiler is not None:  # training ended inside the profiled window: the updates it had
            if len(self._window) > 1:
                self._stop_profile(args.device.type, run_ended=True)
            else:
                self.profiler.__exit__(None, None, None)
                self.profiler = None

    def seconds(self) -> dict:
        """{phase: seconds, or None where the run did not reach it or the step is not found}, and the total."""
        spent = dict(self.spent)
        if {"begin", "first"} <= self.marks.keys():
            spent["first update"] = self.marks["first"] - self.marks["begin"]
        if {"first", "end"} <= self.marks.keys():
            spent["training"] = self.marks["end"] - self.marks["first"]
        result = {phase: (round(spent[phase], 2) if phase in spent else None) for phase in self.PHASES}
        result["total"] = round(getattr(self, "total", time.perf_counter() - self.started), 2)
        return result


def measure_profile(preset: str, args, top: int = 12) -> dict:
    """torch.profiler over one training update of ``preset`` (ours, eager, --bf16 as train.py runs it, on
    the largest of a few token batches, after two untimed updates) and one beam-4 decoding step (a
    cached forward of one new token for ``--decode-batch`` x 4 rows): the top kernels by device time
    (on a CPU, the top operators by CPU time), the kernel launches of the update, and the device's idle
    time within it (the update's wall time not covered by any kernel)."""
    from torch.profiler import ProfilerActivity, profile
    from transformers.modeling_outputs import BaseModelOutput

    from vanilla_transformer.generation_vanilla_transformer import CACHE

    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    torch.manual_seed(args.seed)
    config = config_of(preset, args)
    trainee = LeverTrainee(VanillaTransformerForConditionalGeneration(config), args)
    batches = make_batches(
        synthetic_lengths(20_000, args.seed), args.max_tokens, args.vocab_size, 6, args.device, args.seed
    )
    largest = max(batches, key=lambda b: b["input_ids"].numel() + b["labels"].numel())
    for batch in (largest, largest):
        trainee.step(batch)
    with profile(activities=activities) as update:
        update_seconds = trainee.step(largest)
    result = {
        "what": "profile",
        "preset": preset,
        "dtype": args.dtype,
        "device": args.device,
        "update": {
            "batch_shape": [*largest["input_ids"].shape, largest["labels"].shape[1]],
            "seconds": update_seconds,
            **profile_summary(update, cuda, update_seconds, top),
        },
    }

    model = trainee.model.eval()
    rows = args.decode_batch * 4  # beam 4
    source = batches[0]["input_ids"][:1].repeat(rows, 1)
    mask = batches[0]["attention_mask"][:1].repeat(rows, 1)
    start = torch.full((rows, 1), config.decoder_start_token_id, device=args.device)
    with (
        torch.inference_mode(),
        torch.autocast(
            device_type=args.device.split(":")[0], dtype=DTYPES[args.dtype], enabled=args.dtype != "float32"
        ),
    ):
        first = model(input_ids=source, attention_mask=mask, decoder_input_ids=start, use_cache=True)
        encoder = BaseModelOutput(last_hidden_state=first.encoder_last_hidden_state)
        cache = getattr(first, CACHE)
        step = dict(encoder_outputs=encoder, attention_mask=mask, decoder_input_ids=start + 4, use_cache=True)
        model(**step, **{CACHE: cache})  # a warm second step
        synchronize(args.device)
        with profile(activities=activities) as decode:
            began = time.perf_counter()
            model(**step, **{CACHE: cache})
            synchronize(args.device)
            decode_seconds = time.perf_counter() - began
    result["decoding_step"] = {
        "rows": rows,
        "cached_positions": 2,
        "seconds": decode_seconds,
        **profile_summary(decode, cuda, decode_seconds, top),
    }
    return result


def profile_summary(profiler, cuda: bool, seconds: float, top: int) -> dict:
    """The top kernels (CUDA) or operators (CPU) by self time, the kernel launches, the device's idle time."""
    averages = profiler.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    if cuda:  # the device's own events (kernels), not the CPU operators that launched them
        averages = [a for a in averages if getattr(a, "device_type", None) == torch.autograd.DeviceType.CUDA]
    ranked = sorted(averages, key=lambda a: getattr(a, key), reverse=True)[:top]
    summary = {
        "top": [{"name": a.key[:90], "calls": a.count, "ms": getattr(a, key) / 1e3} for a in ranked],
        "ranked_by": "CUDA kernel self time" if cuda else "CPU operator self time",
        "kernel_launches": None,
        "device_idle_seconds": None,
    }
    if cuda and not averages:  # said, not replaced by the CPU's operators under a kernel's heading
        summary["ranked_by"] = "nothing: the profiler collected no CUDA kernel events"
    elif cuda:
        kernels = [e for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        summary["kernel_launches"] = sum(1 for e in kernels if not e.name.startswith(("Memcpy", "Memset")))
        intervals = sorted((e.time_range.start, e.time_range.end) for e in kernels)  # microseconds
        busy, end = 0.0, -math.inf
        for begin, finish in intervals:  # the union of the kernels' intervals
            if begin > end:
                busy, end = busy + finish - begin, finish
            elif finish > end:
                busy, end = busy + finish - end, finish
        summary["device_busy_seconds"] = busy / 1e6
        summary["device_idle_seconds"] = max(seconds - busy / 1e6, 0.0)
    return summary


def bf16_supported(args) -> bool:
    """Whether train.py runs with --bf16: asked for (--dtype bfloat16) and the device has it."""
    if args.dtype != "bfloat16":
        return False
    return torch.cuda.is_bf16_supported() if args.device.startswith("cuda") else True


MEASURED_PACKAGES = ("transformers", "accelerate", "datasets", "torchao", "liger-kernel", "ctranslate2")


def machine(args) -> dict:
    """The card, the commit (where the tree is a git checkout) and the versions that a recorded table names."""
    from importlib.metadata import PackageNotFoundError, version

    info = {"torch": torch.__version__, "python": platform.python_version(), "device": args.device}
    if args.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"], info["capability"] = torch.version.cuda, ".".join(map(str, torch.cuda.get_device_capability()))
    for name in MEASURED_PACKAGES:
        try:
            info[name] = version(name)
        except PackageNotFoundError:
            info[name] = None
    given = os.environ.get(COMMIT_VARIABLE, "")
    # a commit id (a placeholder left unedited, "COMMIT", is not one: git's answer, or none, instead)
    info["commit"] = given if re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", given) else checkout_commit()
    return info


COMMIT_VARIABLE = "VANILLA_TRANSFORMER_COMMIT"  # the commit of a copy of the tree without .git (a lent machine's)


def checkout_commit() -> str | None:
    """The commit of the clone this file is in, with ``-dirty`` where tracked files have changes not committed;
    None without git, or where this folder is not the root of its own checkout."""
    root = Path(__file__).resolve().parents[1]

    def git(*words: str) -> str | None:
        try:
            done = subprocess.run(["git", *words], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):  # no git there
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root:  # a copy inside another repository: not ours
        return None
    commit, changes = git("rev-parse", "--short=7", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    return commit and commit + ("-dirty" if changes else "")


# Seconds each measurement is expected to take for the big model on one H100 (guesses scaled from the H200
# run of 2026-11-27); other models scale by SIZE. A measurement starts only where its estimate fits in what
# is left of --budget-minutes, and is stopped where it runs past the budget (`time_limit`).
ESTIMATE_SECONDS = {
    "training": 45,
    "training compiled": 200,
    "decoding": 40,  # ours, Marian and, on CUDA, ours with cuDNN first: 30 s without it on an H100 (2026-11-27)
    "decoding compiled": 120,
    "decoding buckets": 240,  # a compilation per batch shape, ours and Marian: a guess, not yet timed on a GPU
    "loop": 45,
    "profile": 30,
    "evaluation": 125,  # nine passes (a warm-up, two timed, of each variant) of 512 sentences; not yet timed on a GPU
    "levers": 60,  # a lever row stops itself at its share of the budget: 60 s is enough for the plain step and a lever
}
SIZE = {"big": 1.0, "base": 0.6, "multi30k": 0.4}
RUNAWAY_FACTOR = 3  # a measurement (but the levers', which keep to their share, and the last) stops at 3x its estimate
RUNAWAY_MIN_SECONDS = 60.0  # ... or after a minute, where that is more


def estimate_seconds(what: str, preset: str, mode: str, args) -> float:
    if what == "train_run":
        return 60 * args.train_run_minutes + 60 * SIZE.get(preset, 0.2)
    if what == "recipe":  # every variant's run
        return len(recipe_variants(args)) * (60 * args.recipe_minutes + RECIPE_OVERHEAD_SECONDS)
    key = f"{what} {mode}" if f"{what} {mode}" in ESTIMATE_SECONDS else what
    return ESTIMATE_SECONDS[key] * SIZE.get(preset, 0.2)


class OutOfTime(Exception):
    """A measurement ran past the time it was given (`time_limit`)."""


def out_of_time(error: BaseException | None) -> OutOfTime | None:
    """The `OutOfTime` behind ``error``, where a library wrapped it (torch.compile raises BackendCompilerFailed)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OutOfTime):
            return error
        seen.add(id(error))
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return None


REPEAT_SECONDS = 5.0  # a time limit's alarm comes again this often until its measurement stops


LIMITS: list[tuple[float, str]] = []  # (deadline on perf_counter, reason) of each `time_limit` in force


@contextmanager
def time_limit(seconds: float, reason: str = "at the end of --budget-minutes"):
    """Raise `OutOfTime` in the measurement once ``seconds`` have passed, or an enclosing limit's time, whichever
    comes first, naming the limit that ran out (SIGALRM: Python code, compilation included, stops at its next
    bytecode; a running kernel first finishes), and again every `REPEAT_SECONDS` after, should code that catches
    every exception swallow one. No limit where infinite or where no alarm can be set (another thread, Windows)."""
    if (
        not math.isfinite(seconds)
        or not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    started = time.perf_counter()

    def stop(signum, frame):
        raise OutOfTime(f"stopped after {time.perf_counter() - started:.0f} s, {min(LIMITS)[1]}")

    def arm() -> None:  # the alarm at the nearest deadline of the limits in force
        signal.setitimer(signal.ITIMER_REAL, max(min(LIMITS)[0] - time.perf_counter(), 0.001), REPEAT_SECONDS)

    LIMITS.append((started + seconds, reason))
    previous = signal.signal(signal.SIGALRM, stop)
    arm()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        LIMITS.remove((started + seconds, reason))
        if LIMITS:
            arm()


def jobs_of(args) -> list[tuple[str, str, str]]:
    """(what, preset, mode) of each measurement, the most telling first: the training step of the first preset
    against MarianMTModel; then what no GPU has measured yet and a goal waits on: the Multi30k recipe's train.py
    run (updates/s, plain and with --cuda_graphs) and train's evaluation (sentences/s); eager decoding, compiled
    decoding of the first decoding preset; then the other presets' training steps, the profile, train.py's run
    of WMT-like text, the loop, and the rest."""
    presets = [preset for preset in args.presets.split(",") if preset]  # "": no training rows
    modes = [mode for mode in args.modes.split(",") if mode]
    recipe = [] if args.no_recipe else [("recipe", "multi30k", "eager")]
    if args.recipe:
        return [("recipe", "multi30k", "eager")]
    if args.levers:  # big's levers, the Multi30k recipe's launch-bound levers in train.py, the Multi30k shape's
        jobs = [("levers", preset, "eager") for preset in presets]
        return jobs[:1] + recipe + jobs[1:]
    if args.profile:
        return [("profile", preset, "eager") for preset in presets[:1] or ["big"]]
    decode_presets = [] if args.no_decode else [p for p in args.decode_presets.split(",") if p]
    decode_modes = [mode for mode in args.decode_modes.split(",") if mode]
    eager = [("training", p, m) for p in presets for m in modes if m == "eager"]
    first, later = eager[:1] + recipe, eager[1:] + [("training", p, m) for p in presets for m in modes if m != "eager"]
    if not args.no_eval:
        first.append(("evaluation", args.eval_preset, "eager"))
    first += [("decoding", p, m) for m in decode_modes[:1] for p in decode_presets]
    first += [("decoding", p, m) for m in decode_modes[1:] for p in decode_presets[:1]]
    if not args.no_profile and presets and args.device.startswith("cuda"):  # on a CPU: --profile alone
        later.append(("profile", presets[0], "eager"))
    if not args.no_train_run:
        later += [("train_run", p, "eager") for p in presets]
    if not args.no_loop:
        later += [("loop", p, "eager") for p in presets]
    later += [("decoding", p, m) for m in decode_modes[1:] for p in decode_presets[1:]]
    return first + later


MEASURES = {}  # what -> measure(preset, mode, args), filled below the measurements
ROWS_FILE: list[Path] = []  # where `emit_row` also appends (set by `main`): rows of a job not yet ended


def emit_row(row: dict) -> None:
    """A lever's or a recipe variant's row as soon as it is measured: printed, and appended to ``*.rows.jsonl``
    beside the results, so that a run killed in the middle of a job (a device's time limit) keeps its rows."""
    line = json.dumps(row)
    print(line, flush=True)
    for path in ROWS_FILE:
        with path.open("a", encoding="utf-8") as rows:
            rows.write(line + "\n")


def seconds_since_start() -> float:
    """How long this process has run, its imports included (Linux's /proc; 0 where that is not there)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # after the command's name
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)  # field 22: the start, in ticks
    except (OSError, ValueError, IndexError):
        return 0.0


def main(argv=None, started: float | None = None) -> list[dict]:
    """Every measurement ``argv`` asks for, within --budget-minutes counted from ``started`` (a perf_counter
    time; by default now: the command line passes the process's start, so that the budget holds its imports)."""
    args = parse_args(argv)
    if args.shapes_only:  # with buckets (--pad_to_buckets always), then without (each batch its own shape)
        lengths = synthetic_lengths(args.pairs, args.seed)
        results = [shape_statistics(lengths, args.max_tokens, buckets) for buckets in (True, False)]
        for result in results:
            print(json.dumps(result), flush=True)
        return results
    if args.loop:
        results = [{"what": "machine", **machine(args)}] + [
            measure_loop(preset, args) for preset in args.presets.split(",")
        ]
        for result in results:
            print(json.dumps(result), flush=True)
        return results
    started = time.perf_counter() if started is None else started
    budget = 60 * args.budget_minutes if args.budget_minutes else math.inf
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        # CUDA graphs captured before the profiler's first start crash or hang it (pytorch issues 75504, 135003),
        # and every run profiles something (the recipe's window, even with --no-profile): started once here, as
        # torch.profiler._utils._init_for_cuda_graphs does
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
            pass
    results = [{"what": "machine", **machine(args), "budget_minutes": args.budget_minutes or None}]
    rows_file = Path(args.output).with_suffix(".rows.jsonl")
    rows_file.parent.mkdir(parents=True, exist_ok=True)
    rows_file.write_text("", encoding="utf-8")
    ROWS_FILE[:] = [rows_file]
    emit_row(results[0])  # the card and versions, kept even where the machine is taken back in the first job
    write_results(results, args.output)
    jobs = jobs_of(args)
    for number, (what, preset, mode) in enumerate(jobs):
        left = budget - (time.perf_counter() - started)
        if what == "levers":
            left = lever_share(jobs, number, left, args)
        estimate = estimate_seconds(what, preset, mode, args)
        if estimate > left:
            result = {
                "what": what,
                "preset": preset,
                "mode": mode,
                "skipped": f"expected to take {estimate:.0f} s, {max(left, 0):.0f} s of the budget left",
            }
        else:
            job_started = time.perf_counter()
            reason, cap = "at the end of --budget-minutes", max(RUNAWAY_FACTOR * estimate, RUNAWAY_MIN_SECONDS)
            # within a budget, a job far past its estimate leaves the rest their time (not the levers', which keep
            # to their share, nor the last); without one (--budget-minutes 0) every job runs to its end
            if what != "levers" and number < len(jobs) - 1 and math.isfinite(left) and cap < left:
                left, reason = cap, f"at {RUNAWAY_FACTOR}x its estimate of {estimate:.0f} s"
            try:
                with time_limit(left, reason):
                    result = MEASURES[what](preset, mode, args, left)
            except Exception as error:  # one failed measurement must not lose the others
                result = {"what": what, "preset": preset, "mode": mode, "error": f"{type(error).__name__}: {error}"}
                if out_of_time(error):
                    result = {"what": what, "preset": preset, "mode": mode, "skipped": str(out_of_time(error))}
            result["seconds_taken"] = round(time.perf_counter() - job_started, 1)
        results.append(result)
        print(json.dumps(result), flush=True)
        write_results(results, args.output)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    ROWS_FILE.clear()  # a measurement called on its own later writes to no run's file
    results[0]["seconds"] = round(time.perf_counter() - started, 1)
    write_results(results, args.output)
    print(markdown_table(results), flush=True)
    return results


def lever_share(jobs: list[tuple[str, str, str]], number: int, left: float, args) -> float:
    """What lever job ``number`` may take of the ``left`` seconds: the lever jobs still to run share them alike,
    after what the recipe's runs need where each share then still covers the largest lever estimate; where it
    does not, the levers (big's rows, the most telling) take it all and the recipe is skipped for the budget."""
    later = jobs[number:]
    levers = [job for job in later if job[0] == "levers"]
    recipe = sum(estimate_seconds(*job, args) for job in later if job[0] == "recipe")
    if (left - recipe) / len(levers) >= max(estimate_seconds(*job, args) for job in levers):  # each gets its share
        left -= recipe
    return left / len(levers)


def write_results(results: list[dict], output: str) -> None:
    """The JSON and, beside it, the markdown table (with ``*.rows.jsonl``, the files a run writes)."""
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(markdown_table(results), encoding="utf-8")


MEASURES.update(
    {
        "training": lambda preset, mode, args, limit: measure_training(preset, mode, args),
        "decoding": lambda preset, mode, args, limit: (
            measure_bucketed_decoding(preset, args) if mode == "buckets" else measure_decoding(preset, mode, args)
        ),
        "loop": lambda preset, mode, args, limit: measure_loop(preset, args),
        "train_run": lambda preset, mode, args, limit: measure_train_run(preset, args),
        "profile": lambda preset, mode, args, limit: measure_profile(preset, args),
        "levers": lambda preset, mode, args, limit: measure_levers(preset, args, limit),
        "evaluation": lambda preset, mode, args, limit: measure_evaluation(preset, args),
        "recipe": lambda preset, mode, args, limit: measure_recipe(preset, args, limit),
    }
)


def markdown_table(results: list[dict]) -> str:
    """The results as one markdown table: a row per measurement, ours next to MarianMTModel."""
    machine = results[0]
    budget = f"; budget {machine['budget_minutes']:g} min" if machine.get("budget_minutes") else ""
    took = f", took {machine['seconds']:.0f} s" if machine.get("seconds") is not None else ""
    extra = "".join(
        f", {name} {machine[name]}" for name in MEASURED_PACKAGES[1:] if machine.get(name)
    )  # (read back from an older JSON: absent)
    commit = f", commit {machine['commit']}" if machine.get("commit") else ""
    lines = [
        f"{machine.get('gpu', machine['device'])}, torch {machine['torch']}, transformers "
        f"{machine['transformers']}{extra}{commit}{budget}{took}",
        "",
        "| measurement | ours | MarianMTModel | Marian time / ours (median, quartiles) |",
        "|---|---|---|---|",
    ]
    profiles, lever_tables = [], []

    def tokens(entry):
        mfu = f", MFU {entry['mfu']:.1%}" if entry.get("mfu") is not None else ""
        return (
            f"{entry['target_tokens_per_second']:,.0f} target tok/s (median step {entry['median_step_seconds'] * 1e3:.0f} ms, "
            f"worst {entry['worst_step_seconds'] * 1e3:.0f} ms{mfu})"
        )

    for r in results[1:]:
        name = f"{r['what']} {r.get('preset')} {r.get('mode', '')}".strip()
        if "skipped" in r or "error" in r:
            lines.append(f"| {name} | {outcome_cell(r)} | | |")
        elif r["what"] == "levers":  # a row here, its table of levers after this one
            lines.append(
                f"| levers {r['preset']} ({r['batches']} batches, {r['distinct_shapes']} shapes, two passes"
                f"{'' if r.get('compile_backend', 'inductor') == 'inductor' else ', compiled by ' + r['compile_backend']}"
                f"{'' if r.get('compile_backend', 'inductor') == 'inductor' else ' (CUDA graphs: inductor)'}"
                ") | see below | | |"
            )
            lever_tables.append(r)
        elif r["what"] == "recipe":
            lines += recipe_lines(r)
        elif r["what"] == "profile":
            profiles.append(r)
        elif r["what"] == "training":
            ratio = r["marian_over_ours_steady"]
            lines.append(f"| {name}, shapes never seen | {tokens(r['ours_unseen'])} | {tokens(r['marian_unseen'])} | |")
            lines.append(
                f"| {name}, steady state | {tokens(r['ours_steady'])} | {tokens(r['marian_steady'])} | "
                f"{ratio['median']:.2f} [{ratio['quartiles'][0]:.2f}, {ratio['quartiles'][1]:.2f}] |"
            )
            if r.get("peak_memory_gib") is not None:
                lines.append(f"| {name}, peak memory | {r['peak_memory_gib']:.1f} GiB (both models) | | |")
        elif r["what"] == "decoding":
            lines.append(
                f"| {name}, beam 4 | {r['sentences_per_second']:.1f} sentences/s | "
                f"{r['marian_sentences_per_second']:.1f} sentences/s | {r['ours_over_marian']:.2f} |"
            )
            first = r.get("first_call_seconds") or {}
            if first.get("ours") is not None and first.get("marian") is not None:
                lines.append(f"| {name}, beam 4, first call | {first['ours']:.2f} s | {first['marian']:.2f} s | |")
            cudnn = r.get("cudnn_first")
            if cudnn and "error" in cudnn:
                lines.append(f"| {name}, beam 4, cuDNN attention first | {cell(cudnn['error'])} | | |")
            elif cudnn:
                same = "the same hypotheses" if cudnn["same_hypotheses"] else "other hypotheses"
                lines.append(
                    f"| {name}, beam 4, cuDNN attention first | {cudnn['sentences_per_second']:.1f} sentences/s, "
                    f"first call {first.get('ours, cuDNN first', float('nan')):.2f} s, {same} | | "
                    f"default / cuDNN first {cudnn['over_default']:.2f} |"
                )
            ct2 = r.get("ctranslate2")
            if ct2 and "skipped" in ct2:
                lines.append(f"| {name}, beam 4, CTranslate2 | skipped: {cell(ct2['skipped'])} | | |")
            elif ct2 and "error" in ct2:
                lines.append(f"| {name}, beam 4, CTranslate2 | {cell(ct2['error'])} | | |")
            elif ct2:
                lines.append(
                    f"| {name}, beam 4, CTranslate2 {ct2['version']} {ct2['compute_type']} | "
                    f"{ct2['sentences_per_second']:.1f} sentences/s, "
                    f"{ct2['equal_to_ours']}/{ct2['sentences']} "
                    f"hypotheses equal ours; its time / ours {ct2['ours_over_ctranslate2']:.2f} | | |"
                )
        elif r["what"] == "decoding buckets":
            rates = r["sentences_per_second"]
            cells = "; ".join(
                f"{cache} {rates[f'ours, {cache}']['first_pass']:.1f} first pass, "
                f"{rates[f'ours, {cache}']['second_pass']:.1f} second"
                for cache in ("static", "dynamic")
            )
            marian = "; ".join(
                f"{cache} {rates[f'marian, {cache}']['second_pass']:.1f}" for cache in ("static", "dynamic")
            )
            compiled = "compiled" if r["compiled"] else "not compiled (CPU)"
            lines.append(
                f"| {name}, beam 4, {r['batches']} sorted batches in {r['shapes']} shapes (translate --static-cache; "
                f"static cache {compiled}) | {cells} sentences/s | {marian} (second pass) | |"
            )
        elif r["what"] == "evaluation":
            low, high = r["length_over_input_range"]
            lines.append(
                f"| train's evaluation {r['preset']}, beam {r['num_beams']}, {r['sentences']} sentences of a random "
                f"model, batch {r['batch_size']} | `--eval_order length` {r['length']['sentences_per_second']:.1f} "
                f"sentences/s; `input` {r['input']['sentences_per_second']:.1f} | | length / input "
                f"{r['length_over_input']:.2f} [{low:.2f}, {high:.2f}] |"
            )
            larger = r.get("length, larger batch")
            if larger:
                low, high = r["larger_over_length_range"]
                lines.append(
                    f"| train's evaluation {r['preset']}, sorted, batch {larger['batch_size']} | "
                    f"{larger['sentences_per_second']:.1f} sentences/s | | batch {larger['batch_size']} / "
                    f"{r['batch_size']} {r['larger_over_length']:.2f} [{low:.2f}, {high:.2f}] |"
                )
            static = r.get("length, static cache")
            if static:
                low, high = r["static_over_length_range"]
                lines.append(
                    f"| train's evaluation {r['preset']}, sorted, `--static_cache_decoding` | "
                    f"{static['sentences_per_second']:.1f} sentences/s | | static / dynamic cache "
                    f"{r['static_over_length']:.2f} [{low:.2f}, {high:.2f}] |"
                )
        elif r["what"] == "loop":
            lines.append(
                f"| train.py loop {r['preset']} | {r['loop_seconds_per_update'] * 1e3:.1f} ms an update, "
                f"{r['loop_over_raw']:.2f}x the raw step ({r['raw_step_seconds'] * 1e3:.1f} ms) | | |"
            )
        elif r["what"] == "train_run":
            mfu = f", MFU {r['mfu']:.1%}" if r.get("mfu") is not None else ""
            lines.append(
                f"| train.py {r['preset']} {r['dtype']}, {r['minutes']:g} min on synthetic WMT-like text | "
                f"{r['target_tokens_per_second']:,.0f} target tok/s (its own log){mfu}, {r['updates']} "
                f"updates | | |"
            )
            if r.get("phase_seconds"):
                phases = phase_cell(r["phase_seconds"])
                lines.append(
                    f"| train.py {r['preset']}, phases | writing the text {r['text_seconds']:.1f} s; {phases} | | |"
                )
    for r in lever_tables:
        lines += ["", *lever_lines(r)]
    for r in profiles:
        lines += profile_lines(r)
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    """An error or a reason as one table cell: its first line, at most 300 characters, no column bar."""
    first = str(text).strip().splitlines()[0] if str(text).strip() else ""
    first = first.replace("|", "\\|")
    return first if len(first) <= 300 else first[:297] + "..."


def outcome_cell(row: dict) -> str:
    return "skipped: " + cell(row["skipped"]) if row.get("skipped") else cell(row["error"])


def lever_lines(r: dict) -> list[str]:
    """A table row per lever: first pass and steady target tok/s, warm-up, peak memory, loss vs the plain step."""
    lines = [
        f"Levers, {r['preset']} (ours; the plain step and MarianMTModel on the same batches, alternating):",
        "",
        "| lever | first pass tok/s | steady tok/s | warm-up s | lever time / plain | plain steady | "
        f"Marian steady | step peak GiB (plain) | loss after {updates_of(r)} updates (plain) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    marian = r.get("marian")
    if marian and "steady_target_tokens_per_second" in marian:  # MarianMTModel's own row, as a lever's
        memory = "" if marian["step_peak_gib"] is None else f"{marian['step_peak_gib']:.1f}"
        lines.append(
            f"| MarianMTModel (the peer) | {marian['first_pass_target_tokens_per_second']:,.0f} | "
            f"{marian['steady_target_tokens_per_second']:,.0f} | {marian['warmup_seconds']:.1f} | | | | {memory} | |"
        )
    for row in r["rows"]:
        if "skipped" in row or "error" in row:
            lines.append(f"| {row['lever']} | {outcome_cell(row)} | | | | | | | |")
            continue
        ratio = row["lever_time_over_plain"]
        memory = (
            f"{row['step_peak_gib']:.1f} ({row['plain_step_peak_gib']:.1f})"
            if row["step_peak_gib"] is not None
            else f"n/a, graph pool ({row['plain_step_peak_gib']:.1f})"
            if row["plain_step_peak_gib"] is not None
            else ""
        )
        name = row["lever"] + (
            f" (falls back for: {'; '.join(row['declined_uses'])})" if "declined_uses" in row else ""
        )
        lines.append(
            f"| {cell(name)} | {row['first_pass_target_tokens_per_second']:,.0f} | "
            f"{row['steady_target_tokens_per_second']:,.0f} | {row['warmup_seconds']:.1f} | "
            f"{ratio['median']:.2f} [{ratio['quartiles'][0]:.2f}, {ratio['quartiles'][1]:.2f}] | "
            f"{row['plain_steady_target_tokens_per_second']:,.0f} | "
            f"{row['marian_steady_target_tokens_per_second']:,.0f} | {memory} | "
            f"{row['loss_after']:.4f} ({row['plain_loss_after']:.4f}) |"
        )
    for row in r["rows"]:
        if passes := row.get("unsynchronized_pass"):
            lines += [
                "",
                f"{row['lever']}, a pass each without a synchronisation per step (the faster of two; the host "
                f"may run ahead, as in train.py): {passes['lever_target_tokens_per_second']:,.0f} target tok/s, "
                f"plain {passes['plain_target_tokens_per_second']:,.0f}; lever time / plain "
                f"{passes['lever_time_over_plain']:.2f}.",
            ]
    return lines + [""]


def updates_of(r: dict) -> str:
    """The updates each measured lever row made before its loss was taken (two passes over the batches)."""
    counts = {row["updates"] for row in r["rows"] if "updates" in row}
    return str(counts.pop()) if len(counts) == 1 else "N"


def recipe_lines(r: dict) -> list[str]:
    """A row per variant of the Multi30k recipe's train.py run: updates/s over the run and at steady state."""
    lines = []
    for row in r["rows"]:
        name = f"train.py multi30k recipe {r['dtype']}, {r['minutes']:g} min, {' '.join(row['flags']) or 'plain'}"
        if "skipped" in row or "error" in row:
            lines.append(f"| {name} | {outcome_cell(row)} | | |")
            continue
        steady, first = row["steady_updates_per_second"], row["first_update_seconds"]
        lines.append(
            f"| {name} | {row['updates_per_second']:.1f} updates/s over the run ({row['updates']} updates, "
            f"{row['target_tokens_per_second']:,.0f} target tok/s), "
            f"{'?' if steady is None else f'{steady:.1f}'} at steady state; first update "
            f"{'?' if first is None else f'{first:.1f}'} s | | |"
        )
        if row.get("phase_seconds"):
            lines.append(f"| {row['variant']}: phases | {phase_cell(row['phase_seconds'])} | | |")
        lines += update_lines(row)
    return lines


def phase_cell(phases: dict) -> str:
    """The seconds of each phase of a train.py run (`PhaseClock.seconds`), in the order it ran."""
    return ", ".join(f"{phase} {'not found' if value is None else f'{value:.1f} s'}" for phase, value in phases.items())


def update_lines(row: dict) -> list[str]:
    """Where a recipe run's update went: the host's mean milliseconds per phase at steady state, and the profiled
    window's kernel launches and device time per update (the device busy that share of the update)."""
    parts, breakdown, profile = [], row.get("update_breakdown"), row.get("profile")
    if breakdown:
        phases = ", ".join(f"{phase} {breakdown[phase]:.2f}" for phase in PhaseClock.UPDATE_PHASES)
        parts.append(f"host ms per update {breakdown['update_ms']:.2f} ({phases})")
    if profile and profile["device_busy_seconds_per_update"] is not None:
        busy = 1e3 * profile["device_busy_seconds_per_update"]
        share = f", {busy / breakdown['update_ms']:.0%} of the update" if breakdown else ""
        parts.append(f"{profile['kernel_launches_per_update']:.0f} kernels taking {busy:.2f} ms per update{share}")
    elif profile and profile["top"]:
        top = ", ".join(f"{k['name']} {k['ms'] / profile['updates']:.2f}" for k in profile["top"][:4])
        parts.append(f"top operators, ms per update: {top}")
    elif profile:
        parts.append(f"profiled: {profile['ranked_by']}")
    if profile and profile.get("window_cut_by_the_run_end"):
        parts.append(f"profiled {profile['updates']} update(s): the run ended inside the window")
    return [f"| {row['variant']}: where an update goes | {'; '.join(parts)} | | |"] if parts else []


def profile_lines(r: dict) -> list[str]:
    """The profile: top kernels of one update and one decoding step, launches, device idle time."""
    lines = ["", f"Profile, {r['preset']} {r['dtype']} on {r['device']} (torch.profiler):"]
    for part, title in (("update", "one training update"), ("decoding_step", "one beam-4 decoding step")):
        entry = r[part]
        idle = (
            ""
            if entry["device_idle_seconds"] is None
            else f"; {entry['kernel_launches']} kernel launches; device idle {entry['device_idle_seconds'] * 1e3:.1f} ms "
            f"of {entry['seconds'] * 1e3:.1f} ms"
        )
        lines += [
            "",
            f"{title} ({entry['seconds'] * 1e3:.1f} ms{idle}), top by {entry['ranked_by']}:",
            "",
            "| kernel | calls | ms |",
            "|---|---|---|",
        ]
        lines += [f"| `{k['name']}` | {k['calls']} | {k['ms']:.2f} |" for k in entry["top"]]
    return lines


if __name__ == "__main__":
    main(started=time.perf_counter() - seconds_since_start())
