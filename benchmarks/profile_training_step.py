"""One training step of ours vs MarianMT on one identical batch: time, fraction of peak FLOP/s, profile.

    python benchmarks/profile_training_step.py [--data-dir ../shared/data/multi30k] [--tokenizer DIR]
        [--steps 10] [--levers] [--bf16] [--no-compile] [--profile ours|marian]

Both models have the benchmark's dimensions (d_model 256, 3+3 layers, 4 heads, FFN 1024, ReLU, embeddings
scaled by sqrt(d_model), dropout 0.3) and the same weights (ours is `from_marian` of the MarianMT), and take
the same batch (200 Multi30k sentence pairs of similar length). A step is what each trainer does:
forward, the label-smoothed loss (0.1) over the batch's target tokens, backward, Adam, zero_grad. Ours:
`TransformerTrainer`'s `label_smoothed_cross_entropy`; MarianMT: `Seq2SeqTrainer`'s `LabelSmoother`.
Steps alternate between the systems (ABAB...) and the medians are reported, with the ratio's spread over
the pairs. Before timing, the script checks that both compute the same loss and gradient norm on this
batch (dropout off).

Reported per row: median step, target tokens/s, model FLOP/s (`training_flops`: the matrix multiplies of
forward and backward, padding excluded) and its fraction of this CPU's fp32 matmul peak, measured here
as the best of a few large square matrix products. ``--levers`` adds a row per lever with the lever
undone (the previous loss, nn.Dropout's masks, separate q/k/v projections), each against the shipped
model in its own ABAB series; "compiled" is the model under ``torch.compile`` (compilation untimed).
Without the data folder it says so and exits 0.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import types
from collections.abc import Callable

import torch
from torch import nn
from transformers import AutoTokenizer, DataCollatorForSeq2Seq, MarianMTModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.trainer_pt_utils import LabelSmoother

from common import (
    MULTI30K_SHAPE,
    add_data_dir,
    add_timing_flags,
    alternate,
    argument_parser,
    clock_of,
    joint_bpe,
    marian_config,
    multi30k_folder,
    read_split,
    speed_ratio,
)
from vanilla_transformer.convert import from_marian
from vanilla_transformer.modeling_vanilla_transformer import VanillaTransformerAttention, eager_attention_forward
from vanilla_transformer.training.flops import matmul_flops_per_second, training_flops
from vanilla_transformer.training_kernels import label_smoothed_cross_entropy

LABEL_SMOOTHING = 0.1


def parse_args(argv=None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    add_data_dir(parser)
    parser.add_argument("--tokenizer", help="a tokenizer folder; default: a 10k BPE learned here from the train split")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per system and series")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation happens here)")
    add_timing_flags(parser)
    parser.add_argument("--levers", action="store_true", help="also time the model with each lever undone")
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="also time both systems under CPU bfloat16 autocast (the Trainer's --bf16), same series",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    parser.add_argument("--profile", choices=["ours", "marian"], help="print torch.profiler's table of 3 steps")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# The batch and the two models
# ---------------------------------------------------------------------------------------------


def load_tokenizer(args, train_pairs):
    if args.tokenizer:
        return AutoTokenizer.from_pretrained(args.tokenizer)
    return joint_bpe(train_pairs)


def make_batch(tokenizer, train_pairs) -> dict:
    """200 pairs of similar length from the train split (as a length-grouped batch looks), padded."""
    pairs = train_pairs[:3000]
    encoded = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs])
    examples = sorted(
        ({"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])),
        key=lambda e: max(len(e["input_ids"]), len(e["labels"])),
    )[1200:1400]
    return dict(DataCollatorForSeq2Seq(tokenizer)(examples))


def build_models(tokenizer):
    """MarianMT with the paper's architecture, and ours with its very weights."""
    torch.manual_seed(0)
    marian = MarianMTModel(marian_config(tokenizer, dropout=0.3, **MULTI30K_SHAPE))
    return from_marian(marian), marian


def ours_loss(model, batch) -> torch.Tensor:
    """TransformerTrainer.compute_loss: logits, then the per-token label-smoothed loss."""
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
    ).logits
    return label_smoothed_cross_entropy(logits, batch["labels"], None, LABEL_SMOOTHING)


def marian_loss(model, batch) -> torch.Tensor:
    """Seq2SeqTrainer.compute_loss with label_smoothing_factor: the labels go to its LabelSmoother."""
    outputs = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
    )
    return LabelSmoother(epsilon=LABEL_SMOOTHING)(outputs, batch["labels"])


def check_same_computation(ours, marian, batch) -> str:
    """Same loss and gradient norm (norms do not see from_marian's permutation of d_model), dropout off."""
    results = []
    for model, loss_function in ((ours, ours_loss), (marian, marian_loss)):
        model.eval()
        model.zero_grad(set_to_none=True)
        loss = loss_function(model, batch)
        loss.backward()
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
        results.append((loss.item(), norm.item()))
        model.zero_grad(set_to_none=True)
        model.train()
    (loss_a, norm_a), (loss_b, norm_b) = results
    if abs(loss_a - loss_b) > 1e-5 * abs(loss_b) or abs(norm_a - norm_b) > 1e-4 * norm_b:
        raise RuntimeError(
            f"ours and MarianMT disagree on this batch: loss {loss_a} vs {loss_b}, gradient norm {norm_a} vs {norm_b}"
        )
    return f"loss {loss_a:.6f} vs {loss_b:.6f}, gradient norm {norm_a:.6f} vs {norm_b:.6f}"


# ---------------------------------------------------------------------------------------------
# Levers undone: what the model did before each one
# ---------------------------------------------------------------------------------------------


def previous_loss(logits, labels, num_items_in_batch=None, label_smoothing=0.0):
    """label_smoothed_cross_entropy before commit e8ee040: PyTorch's cross_entropy on a float copy of the logits."""
    total = nn.functional.cross_entropy(
        logits.float().flatten(0, 1),
        labels.flatten(),
        ignore_index=-100,
        reduction="sum",
        label_smoothing=label_smoothing,
    )
    return total / (labels != -100).sum()


def with_plain_dropout(model):
    """Every dropout back to nn.Dropout (F.dropout's bernoulli_ masks)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Dropout):
                setattr(module, name, nn.Dropout(child.p))
    return model


def with_fused_projections(model):
    """Self-attention's q, k, v as one matrix product over the three weights concatenated at run time
    (state-dict keys unchanged). Measured, not shipped: see docs/benchmarks/speed.md's lever table."""
    for module in model.modules():
        if isinstance(module, VanillaTransformerAttention) and not module.is_cross_attention:
            module.forward = types.MethodType(_fused_self_attention, module)
    return model


def _fused_self_attention(self, hidden_states, attention_mask=None, encoder_hidden_states=None, cache=None, **kwargs):
    weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
    bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
    projected = nn.functional.linear(hidden_states, weight, bias)  # (B, T, 3 * H * D)
    query, key, value = (self._split_heads(part) for part in projected.chunk(3, dim=-1))
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
    output, weights = attention(
        self,
        query,
        key,
        value,
        attention_mask,
        scaling=self.scaling,
        dropout=self.attention_dropout if self.training else 0.0,
        **kwargs,
    )
    return self.out_proj(output.reshape(*hidden_states.shape[:-1], -1)), weights


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def trainer_step(model, batch, loss_function, bf16: bool = False) -> Callable[[], None]:
    """One update as a trainer makes it; ``bf16``: the forward and loss under CPU bfloat16 autocast, as
    the Trainer's ``--bf16`` runs them on the CPU (weights, gradients and Adam stay float32)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_function(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def peak_flops(clock, size: int = 2048, repeats: int = 5) -> float:
    """This CPU's fp32 matmul throughput, the best of a few square products: the peak for MFU (by ``clock``, the
    clock the steps are timed by)."""
    return max(matmul_flops_per_second(size, repeats, clock=clock))


def row(name: str, seconds: list[float], reference: list[float], flops: float, peak: float, tokens: int) -> str:
    """Median step, its speed relative to ``reference`` (ratio of medians, range over the ABAB pairs),
    target tokens/s, model GFLOP/s and the fraction of peak."""
    median = statistics.median(seconds)
    ratio, low, high = speed_ratio(reference, seconds)
    return (
        f"| {name} | {median * 1000:.0f} | {ratio:.2f}x ({low:.2f}-{high:.2f}) | {tokens / median:.0f} | "
        f"{flops / median / 1e9:.1f} | {flops / median / peak:.1%} |"
    )


def lever_variants(args, marian) -> dict[str, tuple[nn.Module, Callable]]:
    """Our model with one lever undone (or, for levers not shipped, done), each a fresh copy."""
    variants = {}
    if args.levers:
        variants["previous loss (cross_entropy on a float copy)"] = (from_marian(marian).train(), previous_loss_step)
        variants["nn.Dropout masks (bernoulli_)"] = (with_plain_dropout(from_marian(marian).train()), ours_loss)
        variants["+ fused q/k/v (not shipped)"] = (with_fused_projections(from_marian(marian).train()), ours_loss)
    if not args.no_compile:
        variants["+ torch.compile (not the default)"] = (torch.compile(from_marian(marian).train()), ours_loss)
    return variants


def previous_loss_step(model, batch) -> torch.Tensor:
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
    ).logits
    return previous_loss(logits, batch["labels"], label_smoothing=LABEL_SMOOTHING)


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    data_dir = multi30k_folder(args.data_dir, "nothing to profile")
    if data_dir is None:
        return None
    clock = clock_of(args)
    train_pairs = read_split(data_dir, "train")
    tokenizer = load_tokenizer(args, train_pairs)
    batch = make_batch(tokenizer, train_pairs)
    ours, marian = build_models(tokenizer)
    batch["decoder_input_ids"] = ours.prepare_decoder_input_ids_from_labels(batch["labels"])
    print(
        f"batch: {tuple(batch['input_ids'].shape)} -> {tuple(batch['labels'].shape)}; "
        f"same computation: {check_same_computation(ours, marian, batch)}"
    )
    source_lengths = batch["attention_mask"].sum(1).tolist()
    target_lengths = (batch["labels"] != -100).sum(1).tolist()
    flops, tokens, peak = (
        training_flops(ours.config, source_lengths, target_lengths),
        sum(target_lengths),
        peak_flops(clock),
    )
    print(
        f"threads {torch.get_num_threads()}, fp32 matmul peak {peak / 1e9:.0f} GFLOP/s, "
        f"{flops / 1e9:.1f} GFLOP per step, {args.steps} steps per system, alternating"
    )
    header = [
        "| step | median ms | speed vs first row (range over pairs) | target tokens/s | GFLOP/s | of fp32 peak |",
        "|---|---|---|---|---|---|",
    ]
    systems = {
        "MarianMT": trainer_step(marian.train(), batch, marian_loss),
        "ours": trainer_step(ours.train(), batch, ours_loss),
    }
    if args.bf16:  # fresh copies of the same weights; GFLOP/s and the fraction are still of the fp32 peak
        systems["MarianMT, bf16 autocast"] = trainer_step(copy.deepcopy(marian).train(), batch, marian_loss, bf16=True)
        systems["ours, bf16 autocast"] = trainer_step(from_marian(marian).train(), batch, ours_loss, bf16=True)
    series, _ = alternate(systems, args.steps, args.warmup, clock)
    print(
        "\n".join(
            header + [row(name, seconds, series["MarianMT"], flops, peak, tokens) for name, seconds in series.items()]
        )
    )
    levers = {}
    for name, (model, loss_function) in lever_variants(args, marian).items():
        levers[name], _ = alternate(
            {
                "ours": trainer_step(from_marian(marian).train(), batch, ours_loss),
                name: trainer_step(model, batch, loss_function),
            },
            args.steps,
            args.warmup,
            clock,
        )
    if levers:
        print("\nlevers: ours against ours with the lever undone (or done), alternating")
        lines = [
            row(f"{name}: ours", paired["ours"], paired["ours"], flops, peak, tokens)
            + "\n"
            + row(f"{name}: this", paired[name], paired["ours"], flops, peak, tokens)
            for name, paired in levers.items()
        ]
        print("\n".join(header + lines))
    if args.profile:
        model, loss_function = (ours, ours_loss) if args.profile == "ours" else (marian, marian_loss)
        _profile(trainer_step(model, batch, loss_function))
    return {"series": series, "levers": levers}


def _profile(step: Callable[[], None]) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(3):
            step()
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
