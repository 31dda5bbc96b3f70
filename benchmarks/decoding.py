"""Decoding speed of the model itself: ours vs MarianMT on the same weights, and vs CTranslate2.

    python benchmarks/decoding.py [--data-dir ../shared/data/multi30k] [--marian-model DIR]
        [--sentences 256] [--repeats 3] [--processor NAME=VALUE ...] [--levers [--lever NAME ...]] [--floor]
        [--no-compile] [--no-ctranslate2] [--threads N] [--cpu-time]

One MarianMT model is decoded by MarianMTModel.generate(), by our model holding its weights
(`vanilla_transformer.convert.from_marian`, whose outputs equal Marian's) through plain generate(),
and by CTranslate2 (float32 and int8) after `vanilla_transformer.convert.to_ctranslate2`; beam 4 (length
penalty 0.6, early stopping, as §6.1) and greedy, batches of 1 and 32 test_2016_flickr sentences
(sorted by length, the same batches for every system). Printed: sentences/s and target tokens/s
(generated tokens with </s>), the speed relative to MarianMT (median over repeats, systems
alternating; the CTranslate2 translators are timed after the torch systems, and deleted before the next
configuration, because while one exists its idle threads slow torch's decoding in the same process
by about 1.6x on a 2-core AMD EPYC), BLEU for a trained model, and whether the hypotheses equal MarianMT's token for token:
ours and CTranslate2 float32 must; int8 is reported as the share of identical hypotheses.

The model, and what makes the comparison honest:
- ``--marian-model DIR``: a trained MarianMTModel with its tokenizer (e.g. runs/multi30k/marian from
  ``benchmarks/multi30k.py --systems marian --marian-setup paper``). Outputs have their real lengths:
  sentences end at different steps, which is where leaving finished sentences out of the batch pays.
  The length limit is the paper's source + 50 for every system.
- default: MarianMT with random weights and the benchmark's dimensions (d_model 256, 3+3 layers, 4 heads,
  FFN 1024, ReLU, embeddings scaled by sqrt(d_model), a 10k BPE vocabulary learned here from the train
  split), and a final_logits_bias of -10^4 on </s> (folded exactly into our and CTranslate2's output
  projection), so that no system ever ends a hypothesis: every one decodes the batch's longest reference
  length (``max_new_tokens``), every beam alive to the end. (``min_new_tokens`` would do it too, but its
  logits processor copies the (B x beams, V) scores every step, a quarter of a step here.) That measures the
  cost of a step and gives no credit for sentences that end early. BLEU is not reported.

``--floor`` profiles ours once at beam 4 x 32 and sums the time of what every implementation must
compute (matrix products and attention, layer norm, residual adds, ReLU, embedding, the log-softmax over
the vocabulary): MarianMT's time over that sum bounds what any faster search could reach with the same
arithmetic, and the rest is what such a search could still save.

``--processor NAME=VALUE`` (repeatable) adds a generate() setting that makes a logits processor
(``min_new_tokens=5``, ``no_repeat_ngram_size=3``, ``repetition_penalty=1.2``) to every torch system: the
search's general step instead of the paper's lean one (CTranslate2 is then left out).

``--levers`` times our model (beam 4, batch 32, alternating with the shipped model) with transformers' own
beam search (what a call that returns a dict gets), dynamic int8 quantisation of the linear layers
(torch.ao.quantization.quantize_dynamic), bfloat16 weights, the opt-in prepacked weights
(`vanilla_transformer.cpu_decoding.prepack_for_cpu_decoding`), and the static cache under torch.compile, each
through public entry points only; ``--lever NAME`` (repeatable) keeps only the named rows. Without
the data folder it says so and exits 0.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import AutoTokenizer, MarianMTModel

from common import (
    MULTI30K_SHAPE,
    add_data_dir,
    add_timing_flags,
    alternate,
    argument_parser,
    clock_of,
    ctranslate2_translator,
    joint_bpe,
    marian_config,
    multi30k_folder,
    read_split,
    speed_ratio,
)
from vanilla_transformer.convert import from_marian
from vanilla_transformer.cpu_decoding import prepack_for_cpu_decoding
from vanilla_transformer.generation_vanilla_transformer import pad_after_end_of_sequence


def parse_args(argv=None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    add_data_dir(parser)
    parser.add_argument("--marian-model", help="a trained MarianMTModel folder with its tokenizer (default: random)")
    parser.add_argument("--sentences", type=int, default=256, help="test sentences decoded in batches of 32")
    parser.add_argument("--sentences-batch-1", type=int, default=32, help="test sentences decoded one at a time")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per system (median)")
    add_timing_flags(parser)  # --threads: CTranslate2's too
    parser.add_argument(
        "--configurations",
        default="4x32,4x1,1x32,1x1",
        help="comma-separated BEAMxBATCH to compare the systems on ('' for none)",
    )
    parser.add_argument(
        "--processor",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a generate() setting that adds a logits processor, for every system (repeatable), "
        "e.g. min_new_tokens=5, no_repeat_ngram_size=3, repetition_penalty=1.2",
    )
    parser.add_argument("--levers", action="store_true", help="also time our model with each lever")
    parser.add_argument(
        "--lever",
        action="append",
        metavar="NAME",
        help=f"with --levers: only this one (repeat for more); one of: {'; '.join(LEVERS)}",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the static cache + torch.compile lever")
    parser.add_argument("--no-ctranslate2", action="store_true", help="skip the CTranslate2 rows")
    parser.add_argument(
        "--output", help="also write the timings to this JSON file and the tables it prints beside it (.md)"
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="profile ours at beam 4 x 32: the time of the work any implementation must do, and "
        "the most a faster search could gain over MarianMT with it",
    )
    args = parser.parse_args(argv)
    args.configurations = [configuration(text, parser) for text in filter(None, args.configurations.split(","))]
    if args.lever and not args.levers:
        parser.error("--lever chooses among the rows of --levers: add --levers")
    unknown = [name for name in args.lever or [] if name not in LEVERS]
    if unknown:
        parser.error(f"--lever {unknown[0]!r} is not a lever; choose among: {'; '.join(LEVERS)}")
    args.processors = dict(processor_setting(text, parser) for text in args.processor)
    if args.floor and (4, 32) not in args.configurations:
        parser.error("--floor compares with MarianMT's time at beam 4 x 32: keep 4x32 in --configurations")
    return args


PROCESSOR_SETTINGS = {"min_new_tokens": int, "no_repeat_ngram_size": int, "repetition_penalty": float}


def processor_setting(text: str, parser: argparse.ArgumentParser) -> tuple[str, int | float]:
    """'NAME=VALUE' -> (name, value) for one of `PROCESSOR_SETTINGS`, or an error naming the flag."""
    name, _, value = text.partition("=")
    kind = PROCESSOR_SETTINGS.get(name.strip())
    try:
        return name.strip(), kind(value)
    except (TypeError, ValueError):
        parser.error(f"--processor {text!r}: give NAME=VALUE with NAME one of {', '.join(PROCESSOR_SETTINGS)}")


def configuration(text: str, parser: argparse.ArgumentParser) -> tuple[int, int]:
    """'BEAMxBATCH' -> (beam, batch), or an error naming the flag and the form it takes."""
    beam, _, batch = text.strip().partition("x")
    if not (beam.isdigit() and batch.isdigit() and int(beam) > 0 and int(batch) > 0):
        parser.error(f"--configurations: {text!r} is not BEAMxBATCH with positive numbers, e.g. 4x32")
    return int(beam), int(batch)


# ---------------------------------------------------------------------------------------------
# Data, model, batches
# ---------------------------------------------------------------------------------------------


def load_models(args, data_dir: Path):
    """(MarianMT, ours with its weights, tokenizer, trained?)."""
    if args.marian_model:
        marian = MarianMTModel.from_pretrained(args.marian_model).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.marian_model)
    else:
        tokenizer = joint_bpe(read_split(data_dir, "train"))
        torch.manual_seed(0)
        marian = MarianMTModel(marian_config(tokenizer, forced_eos_token_id=None, **MULTI30K_SHAPE)).eval()
        with torch.no_grad():  # never </s>: every system decodes exactly max_new_tokens
            marian.final_logits_bias[0, tokenizer.eos_token_id] = -1e4
    return marian, from_marian(marian), tokenizer, bool(args.marian_model)


def make_batches(tokenizer, pairs, batch_size: int, trained: bool) -> list[dict]:
    """Length-sorted batches with the generate() settings of each: beam-independent parts only."""
    sources = [source for source, _ in pairs]
    order = sorted(range(len(sources)), key=lambda i: len(tokenizer(sources[i])["input_ids"]))
    batches = []
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        inputs = tokenizer([sources[i] for i in indices], return_tensors="pt", padding=True)
        if trained:  # the paper's limit (§6.1), spelled out for MarianMT
            length = dict(max_new_tokens=inputs["input_ids"].shape[1] + 50)
        else:  # random weights that never emit </s>: the longest reference's length, for every system
            length = dict(
                max_new_tokens=max(len(ids) for ids in tokenizer([pairs[i][1] for i in indices])["input_ids"])
            )
        batches.append({"indices": indices, "inputs": dict(inputs), "length": length})
    return batches


def beam_settings(beam: int) -> dict:
    return dict(num_beams=4, length_penalty=0.6, early_stopping=True) if beam > 1 else dict(num_beams=1)


# ---------------------------------------------------------------------------------------------
# Decoders: each returns the hypotheses' token ids (through </s>) in test-set order
# ---------------------------------------------------------------------------------------------


def transformers_decoder(
    model, tokenizer, batches, beam: int, settings: dict | None = None
) -> Callable[[], list[list[int]]]:
    """generate() over the batches, with the beam's settings, ``settings`` (e.g. logits processors) added."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def decode():
        hypotheses = {}
        for batch in batches:
            with torch.inference_mode():
                output = model.generate(**batch["inputs"], **batch["length"], **beam_settings(beam), **(settings or {}))
            output = output if torch.is_tensor(output) else output.sequences
            output = pad_after_end_of_sequence(output, eos, pad)[:, 1:]  # MarianMT fills with </s>
            for index, row in zip(batch["indices"], output.tolist()):
                hypotheses[index] = [token for token in row if token != pad]
        return [hypotheses[i] for i in range(len(hypotheses))]

    return decode


def ctranslate2_decoder(model, tokenizer, batches, beam: int, quantization: str, work_dir: Path):
    """CTranslate2 holding our model's weights, stored and computing in ``quantization``, over the batches."""
    translator = ctranslate2_translator(
        model, work_dir / quantization, tokenizer, quantization, quantization=quantization
    )

    def decode():
        hypotheses = {}
        for batch in batches:
            tokens = [
                tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist())
                for ids, mask in zip(batch["inputs"]["input_ids"], batch["inputs"]["attention_mask"])
            ]
            length = batch["length"]
            results = translator.translate_batch(
                tokens,
                max_batch_size=len(tokens),
                beam_size=beam,
                length_penalty=0.6,
                return_end_token=True,
                min_decoding_length=0,
                max_decoding_length=length["max_new_tokens"],
            )
            for index, result in zip(batch["indices"], results):
                hypotheses[index] = tokenizer.convert_tokens_to_ids(result.hypotheses[0])
        return [hypotheses[i] for i in range(len(hypotheses))]

    return decode


# ---------------------------------------------------------------------------------------------
# Levers, each reached through generate()'s public arguments or a public model transformation
# ---------------------------------------------------------------------------------------------

STOCK_SEARCH = "transformers' beam search on our model (return_dict_in_generate)"
INT8 = "ours, int8 dynamic quantisation (linear layers)"
BF16 = "ours, bfloat16 weights (model.to(torch.bfloat16))"
PREPACKED = "ours + prepack_for_cpu_decoding (opt-in oneDNN weights)"


def quantized(ours) -> nn.Module:
    """Dynamic int8 quantisation of every linear layer, the documented one-liner."""
    return torch.ao.quantization.quantize_dynamic(copy.deepcopy(ours), {nn.Linear}, dtype=torch.qint8)


def bfloat16(ours) -> nn.Module:
    """Every weight in bfloat16 (the beam scores stay float32: the search takes log-softmax in float32).
    Fast where the CPU multiplies bfloat16 natively (AVX512-BF16, AMX), slow elsewhere."""
    return copy.deepcopy(ours).to(torch.bfloat16)


def prepacked(ours) -> nn.Module:
    """The opt-in switch of `vanilla_transformer.cpu_decoding`: decoder FFN and output projection weights
    reordered for oneDNN."""
    return prepack_for_cpu_decoding(copy.deepcopy(ours))


# lever name -> (a copy of our model with it, generate() settings it adds)
LEVERS = {
    # generate() leaves a call that returns a dict to transformers' own loop (our `_reorder_cache` still serves it)
    STOCK_SEARCH: (copy.deepcopy, {"return_dict_in_generate": True}),
    INT8: (quantized, {}),
    BF16: (bfloat16, {}),
    PREPACKED: (prepacked, {}),
}


def lever_variants(ours, names: list[str] | None = None) -> dict[str, tuple[nn.Module, dict]]:
    """Our model and generate() settings for each lever of `LEVERS`, or for the ``names`` among them."""
    return {name: (make(ours), settings) for name, (make, settings) in LEVERS.items() if names is None or name in names}


def compiled_static(ours) -> nn.Module:
    """A static cache (transformers' beam search then) with the forward under torch.compile."""
    model = copy.deepcopy(ours)
    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward, fullgraph=True)
    return model


# ---------------------------------------------------------------------------------------------
# Timing and the table
# ---------------------------------------------------------------------------------------------


def ratio_text(slower: list[float], faster: list[float]) -> str:
    """How many times faster ``faster`` ran than ``slower``: ratio of medians (range over the repeats)."""
    return "{:.2f}x ({:.2f}-{:.2f})".format(*speed_ratio(slower, faster))


def bleu_text(tokenizer, hypotheses, references, trained: bool) -> str:
    if not trained:
        return "-"
    from vanilla_transformer.training import score

    texts = tokenizer.batch_decode(hypotheses, skip_special_tokens=True)
    return f"{score(texts, references)['bleu']:.2f}"


def same_text(hypotheses, reference) -> str:
    same = sum(a == b for a, b in zip(hypotheses, reference))
    return "identical" if same == len(reference) else f"{same}/{len(reference)} identical"


def table(seconds, outputs, tokenizer, references, trained, sentences, levers: bool = False) -> str:
    """Systems: speed relative to the first row (MarianMT). Levers: how much faster the first row (our
    shipped model) is than the row, i.e. what the row's lever is worth."""
    first = next(iter(seconds))
    speed = "shipped vs this (range over repeats)" if levers else f"speed vs {first} (range over repeats)"
    lines = [
        f"| {'ours with this lever' if levers else 'system'} | sentences/s | target tokens/s | {speed} "
        f"| BLEU | hypotheses vs {first} |",
        "|---|---|---|---|---|---|",
    ]
    for name in seconds:
        median = statistics.median(seconds[name])
        tokens = sum(len(h) for h in outputs[name])
        relative = ratio_text(seconds[name], seconds[first]) if levers else ratio_text(seconds[first], seconds[name])
        lines.append(
            f"| {name} | {sentences / median:.1f} | {tokens / median:.0f} | {relative} | "
            f"{bleu_text(tokenizer, outputs[name], references, trained)} | {same_text(outputs[name], outputs[first])} |"
        )
    return "\n".join(lines)


# The operations of a decoding step that every implementation of the model does, with the same weights
# and hypotheses (torch.profiler's names; the attention kernel's by its prefix, which names the backend):
# the matrix products of the linear layers and the output projection with the attention kernels; the
# model's element-wise layers; and the log-softmax over the vocabulary that beam scores need. Everything
# else is search, cache and framework overhead.
REQUIRED = {
    "matrix products and attention": {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::_softmax",
        "mkldnn::_linear_pointwise",
    },
    "layer norm, residual adds, ReLU, embedding": {
        "aten::native_layer_norm",
        "aten::add",
        "aten::clamp_min",
        "aten::relu",
        "aten::embedding",
    },
    "log-softmax over the vocabulary": {"aten::_log_softmax"},
}
ATTENTION_KERNELS = "aten::_scaled_dot_product_"  # _flash_attention_for_cpu, _attention_math, ...


def required_group(name: str) -> str | None:
    """The REQUIRED group an operation belongs to, by its exact name (aten::add is not aten::addmm)."""
    if name.startswith(ATTENTION_KERNELS):
        return "matrix products and attention"
    return next((group for group, names in REQUIRED.items() if name in names), None)


def required_seconds(decode: Callable[[], list]) -> tuple[float, dict[str, float]]:
    """One decoding pass under torch.profiler: its wall time, and the self CPU seconds of each REQUIRED
    group in it (the profiler's own overhead lands in the rest). ``aten::add`` also counts the search's
    few additions of beam scores, which makes the bound below a little generous to any faster search."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        started = time.perf_counter()
        decode()
        wall = time.perf_counter() - started
    seconds = dict.fromkeys(REQUIRED, 0.0)
    for event in profiler.key_averages():
        if group := required_group(event.key):
            seconds[group] += event.self_cpu_time_total / 1e6
    return wall, seconds


def floor(marian_seconds: list[float], ours_seconds: list[float], profiled: tuple[float, dict]) -> dict:
    """How fast ours could be with nothing but the required work (a bound, not a measurement of a system):
    the medians of both, ours' profiled pass ("profiled": its wall time, "required": the seconds of each
    `REQUIRED` group, "rest": ours' median minus their sum), ours' speed over MarianMT's and the bound (MarianMT's
    time over the required work's). Self CPU time of an operation is the wall time it ran, its threads together."""
    marian, ours = statistics.median(marian_seconds), statistics.median(ours_seconds)
    wall, seconds = profiled
    needed = sum(seconds.values())
    return {
        "marian": marian,
        "ours": ours,
        "profiled": wall,
        "required": seconds,
        "rest": ours - needed,
        "speed": marian / ours,
        "bound": marian / needed,
    }


def floor_text(found: dict) -> str:
    """`floor` as a table of where ours' time goes, in seconds and as shares of MarianMT's."""
    marian = found["marian"]
    return "\n".join(
        [
            f"\nfloor: beam 4, batch 32; ours profiled once ({found['profiled']:.2f} s under the profiler, "
            f"{found['ours']:.2f} s without)",
            f"| part of ours' decoding | seconds | of MarianMT's {marian:.2f} s |",
            "|---|---|---|",
            *(f"| {name} | {value:.2f} | {value / marian:.0%} |" for name, value in found["required"].items()),
            f"| the rest (search, cache, indexing, copies, Python) | {found['rest']:.2f} | {found['rest'] / marian:.0%} |",
            f"ours is {found['speed']:.2f}x MarianMT; with nothing but the required work it would be {found['bound']:.2f}x",
        ]
    )


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    data_dir = multi30k_folder(args.data_dir)
    if data_dir is None:
        return None
    clock = clock_of(args)
    printed = []

    def say(text: str) -> None:  # printed, and kept for --output's markdown
        print(text)
        printed.append(text)

    marian, ours, tokenizer, trained = load_models(args, data_dir)
    test = read_split(data_dir, "test_2016_flickr")
    say(
        f"{'trained' if trained else 'random-weight'} MarianMT, {torch.get_num_threads()} threads, "
        f"{args.repeats} repeats; {'lengths as decoded' if trained else 'fixed output lengths'}"
    )
    with tempfile.TemporaryDirectory(prefix="decoding-benchmark-") as folder:  # CTranslate2's converted models
        work_dir = Path(folder)
        results = {}
        for beam, batch_size in args.configurations:
            pairs = test[: args.sentences if batch_size > 1 else args.sentences_batch_1]
            batches = make_batches(tokenizer, pairs, batch_size, trained)
            decoders = {
                "MarianMT": transformers_decoder(marian, tokenizer, batches, beam, args.processors),
                "ours": transformers_decoder(ours, tokenizer, batches, beam, args.processors),
            }
            seconds, outputs = alternate(decoders, args.repeats, clock=clock)
            if (
                not args.no_ctranslate2 and not args.processors
            ):  # after, not alternating: a live Translator's threads slow torch here ~1.6x
                translators = {
                    f"CTranslate2 {quantization}": ctranslate2_decoder(
                        ours, tokenizer, batches, beam, quantization, work_dir
                    )
                    for quantization in ("float32", "int8")
                }
                more_seconds, more_outputs = alternate(translators, args.repeats, clock=clock)
                del translators  # their threads end with them
                gc.collect()
                seconds, outputs = {**seconds, **more_seconds}, {**outputs, **more_outputs}
            references = [reference for _, reference in pairs]
            say(f"\nbeam {beam}, batch {batch_size}, {len(pairs)} sentences")
            say(table(seconds, outputs, tokenizer, references, trained, len(pairs)))
            results[(beam, batch_size)] = seconds
            if args.floor and (beam, batch_size) == (4, 32):
                results["floor"] = floor(seconds["MarianMT"], seconds["ours"], required_seconds(decoders["ours"]))
                say(floor_text(results["floor"]))
        if args.levers or not args.no_compile:
            pairs = test[: args.sentences]
            batches = make_batches(tokenizer, pairs, 32, trained)
            # the shipped model as a copy too: every row then decodes with weights copied alike (the
            # imported model itself decoded 1-2% slower than a copy of it on 2026-11-25, commit 0dccfd8)
            variants = {"ours (shipped)": (copy.deepcopy(ours), {})}
            if args.levers:
                variants.update(lever_variants(ours, args.lever))
            if not args.no_compile:
                variants["transformers' beam search, static cache + torch.compile"] = (compiled_static(ours), {})
            decoders = {
                name: transformers_decoder(model, tokenizer, batches, 4, {**args.processors, **settings})
                for name, (model, settings) in variants.items()
            }
            seconds, outputs = alternate(decoders, args.repeats, clock=clock)
            references = [reference for _, reference in pairs]
            say(f"\nlevers: beam 4, batch 32, {len(pairs)} sentences")
            say(table(seconds, outputs, tokenizer, references, trained, len(pairs), levers=True))
            results["levers"] = seconds
    if args.output:
        write_output(Path(args.output), results, "\n".join(printed))
    return results


def write_output(path: Path, results: dict, printed: str) -> None:
    """--output: each configuration's seconds per system and pass (``"BEAMxBATCH"``, ``"levers"``, ``"floor"``) as
    JSON, and the printed tables as markdown beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    named = {f"{key[0]}x{key[1]}" if isinstance(key, tuple) else key: value for key, value in results.items()}
    path.write_text(json.dumps(named, indent=2, default=str) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(printed + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
