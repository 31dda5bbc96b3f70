"""Training and decoding speed of the paper's models on one GPU: tokens/s, MFU, beam-4 sentences/s.

    python benchmarks/gpu.py                                   # base and big, bf16, eager and compiled
    python benchmarks/gpu.py --presets big --modes compiled --max-tokens 16384 --output gpu.json
    python benchmarks/gpu.py --device cpu --presets tiny --dtype float32 --steps 2   # a smoke run anywhere
    python benchmarks/gpu.py --shapes-only [--pairs 4500000 --max-tokens 12288]   # the batch shapes of an epoch
    python benchmarks/gpu.py --loop --device cpu --presets tiny --dtype float32 --max-tokens 1024   # loop overhead

Shapes: ``--shapes-only`` packs an epoch of ``--pairs`` synthetic WMT-like length pairs (lengths only, no
text) with `TokenBatchSampler` and prints one JSON line: ``batches``, ``distinct_shapes`` (rows, source
length, target length) and ``padding_fraction`` (padded tokens that are not real ones, both sides).

Training: the step a `TransformerTrainer --bf16` run takes (autocast to bfloat16 over float32
weights; forward, the package's label-smoothed loss over the batch's target tokens, backward, fused
AdamW (0.9, 0.98, 1e-9)) on token-count batches of ``--max-tokens`` padded tokens per side built by
`TokenBatchSampler` from synthetic pairs with WMT14-like lengths (a 37k vocabulary; mean about 28
tokens a side). "compiled" wraps the model and the loss in ``torch.compile`` with static shapes (one
graph per bucket shape, as ``train.py --torch_compile``); its warm-up time is the one-off compile cost.
Reported: target tokens/s and source + target tokens/s, and the model FLOPs utilisation (MFU): `training_flops` of the
pairs in the timed batches (padding excluded) per second over the GPU's dense bf16 peak (--peak-tflops,
by default the datasheet's 989 for H100/H200).

Decoding: beam 4 (length penalty 0.6) over ``--decode-batch`` sentences of the same synthetic lengths,
exactly ``--decode-tokens`` new tokens each (random weights never stop on their own), with the
dynamic cache ("eager") and with a static cache under ``torch.compile`` ("compiled").

Loop: ``--loop`` runs the real training loop (`build_trainer` of train.py, as a user's run goes: token
batches, the moving average of the weights, a budget in minutes, logging every 50 updates) on
synthetic WMT-like text, and after each update times the raw step (forward, loss, backward, optimizer)
on the batch the loop just took, with the same model and optimizer. It reports the medians of both and
their ratio: what the loop costs beyond the model's arithmetic.

The weights are random: speed does not depend on them. Prints one JSON line per measurement and
writes them all to --output.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.modeling_vanilla_transformer import label_smoothed_cross_entropy
from vanilla_transformer.training.batching import PadToBucket, TokenBatchSampler
from vanilla_transformer.training.flops import training_flops
from vanilla_transformer.training.trainer import allow_recompiles

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Dense bf16 peak by the vendors' datasheets (TFLOP/s), for MFU.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="base,big", help="comma-separated presets")
    parser.add_argument("--modes", default="eager,compiled", help="comma-separated: eager, compiled")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="autocast dtype")
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--max-tokens", type=int, default=12288, help="padded tokens per batch and side")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (compilation happens here)")
    parser.add_argument("--steps", type=int, default=30, help="timed training steps")
    parser.add_argument("--no-decode", action="store_true", help="skip the decoding measurements")
    parser.add_argument("--decode-batch", type=int, default=128, help="sentences per generate() call")
    parser.add_argument("--decode-tokens", type=int, default=30, help="new tokens per sentence")
    parser.add_argument("--decode-repeats", type=int, default=3, help="timed generate() calls (median)")
    parser.add_argument("--peak-tflops", type=float, help="dense peak of the GPU for MFU (default: by its name)")
    parser.add_argument("--output", help="write the results as JSON here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shapes-only", action="store_true", help="only count the batch shapes of an epoch")
    parser.add_argument("--pairs", type=int, default=4_500_000, help="with --shapes-only: pairs in the epoch")
    parser.add_argument("--loop", action="store_true", help="only time train.py's loop against the raw step")
    parser.add_argument("--loop-steps", type=int, default=80, help="with --loop: updates (the first 10 warm up)")
    return parser.parse_args(argv)


def synthetic_lengths(count: int, seed: int) -> np.ndarray:
    """(source, target) token counts shaped like WMT14 en-de after BPE: log-normal, mean about 28."""
    rng = np.random.default_rng(seed)
    source = np.clip(np.rint(rng.lognormal(mean=3.15, sigma=0.55, size=count)), 2, 250).astype(np.int64)
    target = np.clip(np.rint(source * rng.uniform(0.8, 1.25, size=count)), 2, 250).astype(np.int64)
    return np.stack([source, target], axis=1)


def shape_statistics(lengths: np.ndarray, max_tokens: int) -> dict:
    """The batches of one epoch as `TokenBatchSampler` packs them: how many, how many shapes, how much padding."""
    started = time.perf_counter()
    sampler = TokenBatchSampler(lengths, max_tokens, shuffle=False)
    shapes = sampler.shapes  # (batches, 3): rows, source length, target length
    padded = int((shapes[:, 0] * (shapes[:, 1] + shapes[:, 2])).sum())
    return {
        "what": "shapes", "pairs": len(lengths), "max_tokens": max_tokens, "batches": sampler.num_batches,
        "distinct_shapes": len(np.unique(shapes, axis=0)), "padding_fraction": round(1 - int(lengths.sum()) / padded, 4),
        "real_tokens_per_batch_and_side": round(int(lengths.sum()) / 2 / sampler.num_batches, 1),
        "seconds": round(time.perf_counter() - started, 2),
    }


def make_batches(lengths: np.ndarray, max_tokens: int, vocab_size: int, count: int, device, seed: int,
                 epoch: int = 0) -> list[dict]:
    """``count`` token batches as TokenBatchSampler packs them (epoch ``epoch``'s order), random ids padded
    to the batch's bucket shape by `PadToBucket`, as the Trainer's data loader pads them."""
    sampler = TokenBatchSampler(lengths, max_tokens, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    generator = torch.Generator().manual_seed(seed + epoch)

    def collate(indices: list[int]) -> dict:
        source, target = torch.as_tensor(lengths[indices, 0]), torch.as_tensor(lengths[indices, 1])
        attention_mask = torch.arange(int(source.max())) < source[:, None]
        labels = torch.randint(4, vocab_size, (len(indices), int(target.max())), generator=generator)
        input_ids = torch.randint(4, vocab_size, attention_mask.shape, generator=generator)
        return {"input_ids": input_ids.masked_fill(~attention_mask, 0), "attention_mask": attention_mask.long(),
                "labels": labels.masked_fill(torch.arange(labels.shape[1]) >= target[:, None], -100)}

    pad = PadToBucket(collate, pad_token_id=0, max_tokens=max_tokens)
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


def measure_training(preset: str, mode: str, args) -> dict:
    torch.manual_seed(args.seed)
    config = VanillaTransformerConfig.from_preset(preset, vocab_size=args.vocab_size)
    model = VanillaTransformerForConditionalGeneration(config).to(args.device).train()
    fused = args.device.startswith("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0,
                                  fused=fused)
    forward, loss_function = model, label_smoothed_cross_entropy
    if mode == "compiled":
        allow_recompiles(args.warmup + args.steps)  # static shapes, one graph per bucket shape (as --torch_compile)
        forward, loss_function = torch.compile(model, dynamic=False), torch.compile(label_smoothed_cross_entropy, dynamic=False)
    batches = make_batches(synthetic_lengths(200_000, args.seed), args.max_tokens, args.vocab_size,
                           args.warmup + args.steps, args.device, args.seed)

    def step(batch) -> None:
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
        with torch.autocast(device_type=args.device.split(":")[0], dtype=DTYPES[args.dtype],
                            enabled=args.dtype != "float32"):
            logits = forward(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             decoder_input_ids=decoder_input_ids).logits
            tokens = (batch["labels"] != -100).sum()
            loss = loss_function(logits, batch["labels"], tokens, 0.1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    for batch in batches[: args.warmup]:
        step(batch)
    synchronize(args.device)
    warmup_seconds = time.perf_counter() - started
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for batch in batches[args.warmup:]:
        step(batch)
    synchronize(args.device)
    seconds = time.perf_counter() - started
    timed = batches[args.warmup:]
    source_tokens = sum(sum(b["lengths"][0]) for b in timed)
    target_tokens = sum(sum(b["lengths"][1]) for b in timed)
    flops = sum(training_flops(config, *b["lengths"]) for b in timed)
    peak = peak_tflops(args)
    return {
        "what": "training", "preset": preset, "mode": mode, "dtype": args.dtype, "max_tokens": args.max_tokens,
        "parameters": model.num_parameters(), "steps": len(timed), "seconds": seconds,
        "warmup_seconds": warmup_seconds, "target_tokens_per_second": target_tokens / seconds,
        "tokens_per_second": (source_tokens + target_tokens) / seconds, "model_tflops": flops / seconds / 1e12,
        "mfu": flops / seconds / (peak * 1e12) if peak else None,
        "padding_fraction": 1 - (source_tokens + target_tokens) / sum(
            b["input_ids"].numel() + b["labels"].numel() for b in timed),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None,
    }


def measure_decoding(preset: str, mode: str, args) -> dict:
    torch.manual_seed(args.seed)
    config = VanillaTransformerConfig.from_preset(preset, vocab_size=args.vocab_size)
    dtype = DTYPES[args.dtype]
    model = VanillaTransformerForConditionalGeneration(config).to(args.device, dtype).eval()
    lengths = synthetic_lengths(args.decode_batch, args.seed + 1)[:, 0]
    source = torch.randint(4, args.vocab_size, (len(lengths), int(lengths.max())))
    attention_mask = (torch.arange(source.shape[1]) < torch.as_tensor(lengths)[:, None]).long()
    inputs = {"input_ids": source.masked_fill(attention_mask == 0, 0).to(args.device),
              "attention_mask": attention_mask.to(args.device)}
    settings = dict(num_beams=4, length_penalty=0.6, max_new_tokens=args.decode_tokens,
                    min_new_tokens=args.decode_tokens)
    if mode == "compiled":
        settings["cache_implementation"] = "static"
        model.forward = torch.compile(model.forward, fullgraph=True)
    times = []
    with torch.inference_mode():
        for repeat in range(args.decode_repeats + 1):  # the first call compiles / warms up
            synchronize(args.device)
            started = time.perf_counter()
            output = model.generate(**inputs, **settings)
            synchronize(args.device)
            if repeat:
                times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    return {
        "what": "decoding", "preset": preset, "mode": mode, "dtype": args.dtype, "beams": 4,
        "sentences": len(lengths), "new_tokens": output.shape[1] - 1, "seconds": seconds,
        "sentences_per_second": len(lengths) / seconds, "target_tokens_per_second": len(lengths) * args.decode_tokens / seconds,
    }


WORDS = [f"w{index}" for index in range(3000)]


def write_synthetic_text(folder: Path, pairs: int, seed: int) -> list[str]:
    """train.src/train.tgt of ``pairs`` lines of random words with WMT-like lengths; train.py's flags for them."""
    rng = np.random.default_rng(seed)
    lengths = synthetic_lengths(pairs, seed)
    for side, name in ((0, "train.src"), (1, "train.tgt")):
        lines = (" ".join(rng.choice(WORDS, size=int(length) - 1)) for length in lengths[:, side])  # + </s>
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
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           decoder_input_ids=batch["decoder_input_ids"]).logits
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
        flags = write_synthetic_text(Path(folder), pairs=4000, seed=args.seed) + [
            "--preset", preset, "--tokenizer_vocab_size", "4000", "--output_dir", str(Path(folder) / "run"),
            "--max_tokens", str(args.max_tokens), "--max_steps", str(args.loop_steps), "--ema_decay", "0.998",
            "--max_train_minutes", "60", "--logging_steps", "50", "--save_strategy", "no", "--report_to", "none",
            "--disable_tqdm", "true", "--seed", str(args.seed),
            *(["--use_cpu"] if args.device == "cpu" else []), *(["--bf16", "true"] if args.dtype == "bfloat16" else []),
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
    ratios = sorted(l / r for l, r in zip(timer.loop, timer.raw))
    return {
        "what": "loop", "preset": preset, "dtype": args.dtype, "max_tokens": args.max_tokens, "updates": len(timer.loop),
        "loop_seconds_per_update": loop, "raw_step_seconds": raw, "loop_over_raw": loop / raw,
        "loop_over_raw_quartiles": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]],
    }


def machine(args) -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version(), "device": args.device}
    if args.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
    import transformers

    info["transformers"] = transformers.__version__
    return info


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.shapes_only:
        result = shape_statistics(synthetic_lengths(args.pairs, args.seed), args.max_tokens)
        print(json.dumps(result), flush=True)
        return [result]
    if args.loop:
        results = [{"what": "machine", **machine(args)}] + [measure_loop(preset, args) for preset in args.presets.split(",")]
        for result in results:
            print(json.dumps(result), flush=True)
        return results
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    results = [{"what": "machine", **machine(args)}]
    print(json.dumps(results[0]), flush=True)
    presets, modes = args.presets.split(","), args.modes.split(",")
    jobs = [(measure_training, p, m) for p in presets for m in modes]
    if not args.no_decode:
        jobs += [(measure_decoding, p, m) for p in presets for m in modes]
    for measure, preset, mode in jobs:
        try:
            result = measure(preset, mode, args)
        except Exception as error:  # one failed measurement must not lose the others
            result = {"what": measure.__name__, "preset": preset, "mode": mode, "error": f"{type(error).__name__}: {error}"}
        results.append(result)
        print(json.dumps(result), flush=True)
        if args.output:
            Path(args.output).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return results


if __name__ == "__main__":
    main()
