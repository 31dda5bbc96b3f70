"""Operators and host reads per training update and per beam-search step, ours against MarianMTModel, on any device.

    python benchmarks/operator_count.py [--presets multi30k,big] [--rows 70 --source 14 --target 15] [--output ops.json]

On a GPU every operator that is not a view launches at least one kernel, and a small model's update waits on those
launches (the Multi30k recipe's, docs/benchmarks/gpu.md); every read of a tensor's value on the host (bool(),
.item(), .tolist(), int(), float(), nonzero) makes the host wait for the device. Both are counted here on the CPU
(or any device): each operator that reaches the dispatcher (a TorchDispatchMode) and each call of those Tensor
methods, so that a change's effect on launches and reads is known without a GPU. Kernel fusion below the
dispatcher (a fused optimizer's multi-tensor kernels, torch.compile) is not seen: this counts eager operators.
Dropout and the loss take another path on a CPU than on a GPU: on CUDA ``F.dropout`` is one fused kernel
(``native_dropout``), on a CPU four operators, and the package's own dropout (`UniformMaskDropout`) draws its mask
in three; the package's loss goes a cache-sized chunk of rows at a time on a CPU (`cache_sized_row_chunks`), in
one piece on a GPU. Both are counted as a GPU runs them, for ours and Marian alike, unless ``--cpu-paths``.

Training update, as ``train --bf16`` takes it: forward under bfloat16 autocast, the package's label-smoothed loss,
backward, fused AdamW. Operators per phase, dtype conversions (``aten._to_copy``: autocast's casts of weights,
activations and gradients, and the masks' conversions to bool) counted apart, for ours; ours with
``--bf16_weights`` (the weights in bfloat16, no autocast, float32 masters in the optimizer: two multi-tensor copies
an update); ours with ``--fuse_projections``, ours with ``--sync_free_step`` (no host read) and a MarianMTModel of the
same shape (`gpu.marian_of`), on one batch of ``--rows`` sentences of ``--source`` and ``--target`` tokens (the
Multi30k recipe's batch: about 70 sentences of 13-15 tokens), the last source positions of every third sentence
padded.

Beam search: ``generate()`` with beam 4 and the paper's length penalty over ``--decode-rows`` sentences, exactly
``--decode-tokens`` new tokens each: operators and host reads per decoding step (per decoder call), ours holding
the Marian model's weights (`from_marian`) against that model.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common import argument_parser, machine
from gpu import DTYPES, config_of, marian_of

# Operators that only make a new view of the same memory, read metadata or allocate: no kernel on a GPU.
VIEWS = {
    "aten.alias",
    "aten.as_strided",
    "aten.detach",
    "aten.expand",
    "aten.lift_fresh",
    "aten.permute",
    "aten.reshape",
    "aten.select",
    "aten.slice",
    "aten.split",
    "aten.split_with_sizes",
    "aten.squeeze",
    "aten.t",
    "aten.transpose",
    "aten.unbind",
    "aten.unsqueeze",
    "aten.view",
    "aten._unsafe_view",
    # allocations: the caching allocator's work on the host, no kernel
    "aten.empty",
    "aten.empty_like",
    "aten.empty_strided",
    "aten.new_empty",
    "aten.new_empty_strided",
}
HOST_READS = ("__bool__", "item", "tolist", "__int__", "__float__")  # plus the nonzero operator, counted as a read
CAST = "aten._to_copy"


def parse_args(argv=None):
    parser = argument_parser(__doc__)
    parser.add_argument("--presets", default="multi30k,big", help="comma-separated: multi30k, tiny, base, big")
    parser.add_argument("--vocab-size", type=int, default=8000, help="the Multi30k recipe's BPE vocabulary")
    parser.add_argument("--rows", type=int, default=70, help="sentences in the training batch")
    parser.add_argument("--source", type=int, default=14, help="source tokens a sentence (padded)")
    parser.add_argument("--target", type=int, default=15, help="target tokens a sentence (padded)")
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPES), help="autocast dtype (float32: none)")
    parser.add_argument("--decode-rows", type=int, default=16, help="sentences decoded with beam 4")
    parser.add_argument("--decode-tokens", type=int, default=12, help="new tokens a sentence")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--cpu-paths", action="store_true", help="count dropout and the loss as a CPU runs them, not as a GPU does"
    )
    parser.add_argument("--output", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if min(args.rows, args.source, args.target, args.decode_rows, args.decode_tokens) < 2:
        parser.error("--rows, --source, --target, --decode-rows and --decode-tokens must be at least 2")
    return args


class Count(TorchDispatchMode):
    """Each operator that reaches the dispatcher inside the block, by name."""

    def __init__(self):
        super().__init__()
        self.operators = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.operators[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    def kernels(self) -> int:
        """Operators that launch a kernel on a GPU: all but views."""
        return sum(count for name, count in self.operators.items() if name not in VIEWS)


@contextlib.contextmanager
def counted_reads(reads: list):
    """Appends to ``reads`` at each host read of a tensor's value (the methods of `HOST_READS`)."""
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counting(original):
        def read(*args, **kwargs):
            reads.append(1)
            return original(*args, **kwargs)

        return read

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, counting(original))
        yield reads
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@contextlib.contextmanager
def as_on_a_gpu(enabled: bool = True):
    """Dropout and the loss take the path they take on a GPU: ``F.dropout`` as CUDA runs it (one fused
    ``native_dropout``, where a CPU composes four operators), for the package's dropout too, and the loss in one
    chunk."""
    from torch import nn

    from vanilla_transformer import training_kernels

    def fused_dropout(input, p=0.5, training=True, inplace=False):  # aten::dropout's choice on CUDA
        return torch.native_dropout(input, p, training)[0] if training and 0 < p < 1 else input

    if not enabled:
        yield
        return
    saved = (
        training_kernels.cache_sized_row_chunks,
        training_kernels.UniformMaskDropout.forward,
        nn.functional.dropout,
    )
    try:
        training_kernels.cache_sized_row_chunks = lambda logits: [slice(0, logits.shape[0])]
        training_kernels.UniformMaskDropout.forward = nn.Dropout.forward
        nn.functional.dropout = fused_dropout
        yield
    finally:
        training_kernels.cache_sized_row_chunks, training_kernels.UniformMaskDropout.forward = saved[:2]
        nn.functional.dropout = saved[2]


def training_batch(args, device) -> dict:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, args.vocab_size, (args.rows, args.source), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[::3, -3:] = 0
    labels = torch.randint(4, args.vocab_size, (args.rows, args.target), generator=generator)
    labels[::4, -4:] = -100
    return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device), "labels": labels.to(device)}


def count_update(model, batch: dict, args, autocast: bool = True, sync_free: bool = False) -> dict:
    """Operators (all but views) of each phase of one update, autocast's casts among them, and host reads;
    without ``autocast``, the model as it is, with float32 masters in the optimizer where its weights are in
    bfloat16 (``--bf16_weights``); ``sync_free``: the step of ``--sync_free_step`` (its model's stacks keep every
    mask, the loss always scales)."""
    from vanilla_transformer.training import levers
    from vanilla_transformer.training_kernels import label_smoothed_cross_entropy

    model = model.to(args.device).train()
    autocast = autocast and args.dtype != "float32"
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=True
    )
    if next(model.parameters()).dtype == torch.bfloat16:
        levers.keep_float32_masters(optimizer)
    labels = batch["labels"]
    phases, reads = {}, []
    with counted_reads(reads):
        for _ in range(2):  # the first update allocates Adam's moments: the second is counted
            decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
            counts, before = {}, len(reads)
            with torch.autocast(args.device.split(":")[0], dtype=DTYPES[args.dtype], enabled=autocast):
                with Count() as counts["forward"]:
                    logits = model(
                        input_ids=batch["input_ids"],
                        attention_mask=batch["attention_mask"],
                        decoder_input_ids=decoder_input_ids,
                        use_cache=False,
                    ).logits
                with Count() as counts["loss"]:
                    loss = label_smoothed_cross_entropy(logits, labels, (labels != -100).sum(), 0.1, sync_free)
            with Count() as counts["backward"]:
                loss.backward()
            with Count() as counts["optimizer"]:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        for name, count in counts.items():
            phases[name] = {"operators": count.kernels(), "casts": count.operators[CAST]}
        phases["update"] = {key: sum(phase[key] for phase in phases.values()) for key in ("operators", "casts")}
        phases["update"]["host_reads"] = len(reads) - before + sum(c.operators["aten.nonzero"] for c in counts.values())
    return phases


def count_decoding(model, args) -> dict:
    """Operators and host reads per decoder call of beam-4 ``generate()`` (the calls of one whole search)."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, args.vocab_size, (args.decode_rows, args.source), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[::3, -3:] = 0
    model = model.to(args.device).eval()
    calls, reads = [], []
    hook = model.get_decoder().register_forward_pre_hook(lambda *unused: calls.append(1))
    try:
        with torch.inference_mode(), counted_reads(reads), Count() as count:
            model.generate(
                input_ids=input_ids.to(args.device),
                attention_mask=attention_mask.to(args.device),
                num_beams=4,
                length_penalty=0.6,
                max_new_tokens=args.decode_tokens,
                min_new_tokens=args.decode_tokens,
                early_stopping=True,
            )
    finally:
        hook.remove()
    steps = len(calls)
    return {
        "decoder_calls": steps,
        "operators_per_step": count.kernels() / steps,
        "host_reads_per_step": (len(reads) + count.operators["aten.nonzero"]) / steps,
    }


def measure(preset: str, args) -> dict:
    from vanilla_transformer import VanillaTransformerForConditionalGeneration
    from vanilla_transformer.convert import from_marian
    from vanilla_transformer.training import levers

    torch.manual_seed(0)
    config = config_of(preset, args)
    batch = training_batch(args, args.device)
    ours = VanillaTransformerForConditionalGeneration(config)
    fused = VanillaTransformerForConditionalGeneration(config)
    levers.fuse_projections(fused)
    marian = marian_of(config)
    result = {
        "preset": preset,
        "batch": [args.rows, args.source, args.target],
        "dtype": args.dtype,
        "update": {
            "ours": count_update(ours, batch, args),
            "ours, --fuse_projections": count_update(fused, batch, args),
            "marian": count_update(marian, batch, args),
        },
    }
    if levers.refusal("--sync_free_step", args.device) is None:  # transformers 5.15+
        sync_free = VanillaTransformerForConditionalGeneration(config)
        levers.sync_free_step(sync_free)
        result["update"]["ours, --sync_free_step"] = count_update(sync_free, batch, args, sync_free=True)
    if args.dtype == "bfloat16":  # --bf16_weights: no autocast, float32 masters
        weights = VanillaTransformerForConditionalGeneration(config)
        levers.bfloat16_weights(weights)
        result["update"]["ours, --bf16_weights"] = count_update(weights, batch, args, autocast=False)
    marian = marian_of(config)
    result["decoding"] = {"ours": count_decoding(from_marian(marian), args), "marian": count_decoding(marian, args)}
    return result


def markdown(results: list[dict]) -> str:
    lines = []
    for r in results:
        rows, source, target = r["batch"]
        lines += [
            f"{r['preset']}: one update of {rows} x {source} + {target} tokens under {r['dtype']} autocast "
            f"(dropout and the loss as a {r['paths'].upper()} runs them); "
            "operators that launch a kernel on a GPU (of them dtype conversions, `aten._to_copy`):",
            "",
            "| model | forward | loss | backward | optimizer | update | host reads |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, phases in r["update"].items():
            cells = [f"{phases[p]['operators']} ({phases[p]['casts']})" for p in ("forward", "loss", "backward")]
            cells += [str(phases["optimizer"]["operators"]), f"{phases['update']['operators']}"]
            lines.append(f"| {name} | {' | '.join(cells)} | {phases['update']['host_reads']} |")
        lines += ["", "| beam 4 | decoder calls | operators a step | host reads a step |", "|---|---|---|---|"]
        for name, row in r["decoding"].items():
            lines.append(
                f"| {name} | {row['decoder_calls']} | {row['operators_per_step']:.1f} | {row['host_reads_per_step']:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    with as_on_a_gpu(not args.cpu_paths):
        results = [measure(preset, args) for preset in args.presets.split(",") if preset]
    for result in results:
        result["paths"] = "cpu" if args.cpu_paths else "gpu"
    print(machine())
    print(markdown(results))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            json.dump({"machine": machine(), "results": results}, file, indent=2)
    return results


if __name__ == "__main__":
    main()
