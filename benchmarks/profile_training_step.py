"""Time (and optionally profile) one training step of ours vs MarianMT on one identical batch.

    python benchmarks/profile_training_step.py --system ours --tokenizer runs/multi30k/tokenizer \\
        [--data-dir ../shared/data/multi30k] [--profile]

Same dimensions as benchmarks/multi30k.py (d_model 256, 3+3 layers, 4 heads, FFN 1024, dropout 0.3)
and the same batch for both systems (200 Multi30k sentences of similar length), so the difference
is the implementation's, not the batching's. Prints the median of 8 steps (forward, backward, Adam).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, DataCollatorForSeq2Seq, MarianConfig, MarianMTModel

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration  # registers the tokenizer

from vanilla_transformer.training import read_parallel

REPO = Path(__file__).resolve().parents[1]

DIMENSIONS = dict(d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
                  encoder_ffn_dim=1024, decoder_ffn_dim=1024, dropout=0.3)


def build(system: str, tokenizer):
    if system == "ours":
        return VanillaTransformerForConditionalGeneration(
            VanillaTransformerConfig.from_preset("base", vocab_size=len(tokenizer), **DIMENSIONS))
    return MarianMTModel(MarianConfig(vocab_size=len(tokenizer), decoder_vocab_size=len(tokenizer), pad_token_id=0,
                                      eos_token_id=3, decoder_start_token_id=0, **DIMENSIONS))


def main(argv=None) -> float | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", choices=["ours", "marian"], required=True)
    parser.add_argument("--tokenizer", required=True, help="e.g. the tokenizer folder a multi30k.py run wrote")
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--profile", action="store_true", help="also print torch.profiler's table of 3 steps")
    args = parser.parse_args(argv)
    if not Path(args.data_dir).is_dir():
        print(f"Multi30k not found at {args.data_dir} (give --data-dir): nothing to profile.")
        return None
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    pairs = read_parallel(Path(args.data_dir) / "train.en.gz", Path(args.data_dir) / "train.de.gz")[:3000]
    encoded = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs])
    examples = sorted(({"input_ids": i, "labels": l} for i, l in zip(encoded["input_ids"], encoded["labels"])),
                      key=lambda e: max(len(e["input_ids"]), len(e["labels"])))[1200:1400]
    torch.manual_seed(0)
    model = build(args.system, tokenizer).train()
    batch = DataCollatorForSeq2Seq(tokenizer, model=model)(examples)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(2):  # warm-up
        step()
    times = []
    for _ in range(8):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    print(f"{args.system}: batch {tuple(batch['input_ids'].shape)} -> {tuple(batch['labels'].shape)}, "
          f"median step {median:.3f} s over 8 steps")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(3):
                step()
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return median


if __name__ == "__main__":
    main()
