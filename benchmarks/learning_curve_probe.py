"""Training loss per update of ours vs MarianMT on the very same batches, with swappable initialisations.

    python benchmarks/learning_curve_probe.py --tokenizer runs/multi30k/tokenizer \\
        --variant ours:xavier --variant ours --variant ours:marian-init --variant marian

Isolates the model and its initialisation from everything else the benchmark varies (Trainer,
batching, sampling order): every variant sees the same Multi30k token batches in the same order,
the same label-smoothed loss (0.1), the same Adam (0.9, 0.98, 1e-9) and the same schedule (linear
warm-up to --peak-lr, then inverse square root), without gradient clipping, and training starts
from the same random state, so the variants of one system draw identical dropout masks (the two
systems call dropout in a different order). MarianMT is configured as in `multi30k.py
--marian-setup paper` (ReLU, embeddings scaled by sqrt(d_model), <pad> as decoder start token).

Initialisations (the part after ':'; biases always zero, the tied pre-softmax projection is the
embedding; d = d_model):
- default: the system's own (ours: small init; MarianMT: N(0, 0.02) everywhere).
- xavier: Xavier-uniform linears, embeddings N(0, d^-0.5) (fairseq's; ours until small init).
- small-init: linears N(0, sqrt(2 / (5 d))) (Nguyen & Salazar 2019), embeddings N(0, d^-0.5).
- marian-init: N(0, 0.02) for every linear and embedding weight.
- linears-0.02: linears N(0, 0.02), embeddings N(0, d^-0.5).
- xavier-embeddings-0.02: Xavier-uniform linears, embeddings N(0, 0.02).
- small-qk / small-rest: query and key projections / every other linear N(0, 0.02), the others
  Xavier-uniform; embeddings N(0, d^-0.5).
Prints the mean training loss of every 50 updates and writes them as JSON with --output.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path

import torch
from torch import nn
from transformers import AutoTokenizer, DataCollatorForSeq2Seq, MarianMTModel

from common import add_data_dir, argument_parser, marian_config, multi30k_folder, read_split
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.modeling_vanilla_transformer import shift_tokens_right
from vanilla_transformer.training import TokenBatchSampler, noam_learning_rate
from vanilla_transformer.training_kernels import label_smoothed_cross_entropy

DIMENSIONS = dict(
    d_model=256,
    encoder_layers=3,
    decoder_layers=3,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=1024,
    decoder_ffn_dim=1024,
    dropout=0.3,
)


XAVIER = None  # a linear's std of None means Xavier-uniform
QUERY_KEY = ("q_proj", "k_proj")
# name -> (std of the linear called `name` given d, std of the embeddings given d)
SCHEMES = {
    "xavier": (lambda name, d: XAVIER, lambda d: d**-0.5),
    "small-init": (lambda name, d: math.sqrt(2 / (5 * d)), lambda d: d**-0.5),
    "marian-init": (lambda name, d: 0.02, lambda d: 0.02),
    "linears-0.02": (lambda name, d: 0.02, lambda d: d**-0.5),
    "xavier-embeddings-0.02": (lambda name, d: XAVIER, lambda d: 0.02),
    "small-qk": (lambda name, d: 0.02 if name.endswith(QUERY_KEY) else XAVIER, lambda d: d**-0.5),
    "small-rest": (lambda name, d: XAVIER if name.endswith(QUERY_KEY) else 0.02, lambda d: d**-0.5),
}


def reinitialise(model: nn.Module, scheme: str, d_model: int) -> None:
    """Overwrite every linear and embedding weight as `scheme` says (see the module docstring)."""
    linear_std, embedding_std = SCHEMES[scheme]
    tied = model.get_input_embeddings().weight
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and module.weight is not tied:
                std = linear_std(name, d_model)
                if std is XAVIER:
                    nn.init.xavier_uniform_(module.weight)
                else:
                    module.weight.normal_(0.0, std)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding) and module.weight.requires_grad:  # not Marian's fixed positions
                module.weight.normal_(0.0, embedding_std(d_model))
                if module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()


def build(variant: str, tokenizer, seed: int) -> nn.Module:
    system, _, scheme = variant.partition(":")
    torch.manual_seed(seed)
    if system == "ours":
        model = VanillaTransformerForConditionalGeneration(
            VanillaTransformerConfig.from_preset(
                "base",
                vocab_size=len(tokenizer),
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id,
                decoder_start_token_id=tokenizer.bos_token_id,
                **DIMENSIONS,
            )
        )
    elif system == "marian":
        model = MarianMTModel(marian_config(tokenizer, activation_function="relu", scale_embedding=True, **DIMENSIONS))
    else:
        raise ValueError(f"Unknown system {system!r} in variant {variant!r}: use ours[:scheme] or marian[:scheme].")
    if scheme not in ("", "default", *SCHEMES):
        raise ValueError(f"Unknown initialisation {scheme!r} in {variant!r}: use one of default, {', '.join(SCHEMES)}.")
    if scheme not in ("", "default"):
        reinitialise(model, scheme, DIMENSIONS["d_model"])
    return model


def learning_rate(update: int, peak: float, warmup: int) -> float:
    """Eq. (3) (train.py's `noam_learning_rate`) rescaled so that it peaks at `peak` after `warmup` updates."""
    d_model = DIMENSIONS["d_model"]
    return noam_learning_rate(update, d_model, warmup, scale=peak * (d_model * warmup) ** 0.5)


def run(variant: str, batches, args) -> list[float]:
    model = build(variant, args.tokenizer_object, args.seed).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    torch.manual_seed(args.seed)  # the same random stream for dropout whatever the initialisation drew
    means, window = [], []
    started = time.perf_counter()
    for update, batch in enumerate(batches[: args.updates], start=1):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(update, args.peak_lr, args.warmup)
        # each system's own start token, as in multi30k.py: <s> for ours, <pad> for MarianMT
        decoder_input_ids = shift_tokens_right(
            batch["labels"], model.config.pad_token_id, model.config.decoder_start_token_id
        )
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids
        ).logits
        loss = label_smoothed_cross_entropy(logits, batch["labels"], label_smoothing=0.1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        window.append(loss.item())
        if update % 50 == 0:
            means.append(sum(window) / len(window))
            window = []
            print(
                f"{variant:>20} update {update:4d}: loss {means[-1]:.3f} ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    return means


def main(argv=None) -> dict | None:
    parser = argument_parser(__doc__)
    parser.add_argument("--tokenizer", required=True, help="e.g. the tokenizer folder a multi30k.py run wrote")
    add_data_dir(parser)
    parser.add_argument("--variant", action="append", required=True, help="system[:init], repeatable")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument("--peak-lr", type=float, default=7e-4)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", default=None, help="write {variant: [mean loss per 50 updates]} here")
    args = parser.parse_args(argv)
    data_dir = multi30k_folder(args.data_dir, "nothing to probe")
    if data_dir is None:
        return None
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = args.tokenizer_object = AutoTokenizer.from_pretrained(args.tokenizer)
    pairs = read_split(data_dir, "train")
    encoded = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs])
    examples = [{"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])]
    sampler = TokenBatchSampler(
        [(len(e["input_ids"]), len(e["labels"])) for e in examples], args.max_tokens, seed=args.seed
    )
    collate = DataCollatorForSeq2Seq(tokenizer)  # pads; run() builds each system's decoder inputs
    batches = []
    for epoch in range(args.updates):  # as many epochs as --updates needs, each reshuffled
        sampler.set_epoch(epoch)
        batches += [
            collate([examples[i] for i in indices])
            for indices in itertools.islice(sampler, args.updates - len(batches))
        ]
        if len(batches) == args.updates:
            break
    results = {variant: run(variant, batches, args) for variant in args.variant}
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
