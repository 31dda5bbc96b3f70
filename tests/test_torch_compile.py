"""torch.compile over token batches: one graph per bucket shape, counted with torch's own CompileCounter.

Shapes are what makes a compiled model recompile (with ``dynamic=False``, as `TransformerTrainer` sets
for ``--torch_compile``): batches padded to the sampler's buckets bring at most one compilation per
shape, however many batches there are. Traced with the "eager" backend: the recompilation decisions
are dynamo's, the same as with inductor, without its code generation."""

import numpy as np
import pytest
import torch
from datasets import Dataset
from torch._dynamo.testing import CompileCounter

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.training import levers
from vanilla_transformer.training.batching import PadToBucket, TokenBatchSampler, allow_recompiles
from vanilla_transformer.training.trainer import (
    TransformerTrainer,
    TransformerTrainingArguments,
    pads_to_buckets,
)

VOCAB = 50


def random_batch(lengths: np.ndarray, generator: torch.Generator):
    def collate(indices):
        source, target = torch.as_tensor(lengths[indices, 0]), torch.as_tensor(lengths[indices, 1])
        attention_mask = torch.arange(int(source.max())) < source[:, None]
        labels = torch.randint(4, VOCAB, (len(indices), int(target.max())), generator=generator)
        return {
            "input_ids": torch.randint(4, VOCAB, attention_mask.shape, generator=generator).masked_fill(
                ~attention_mask, 0
            ),
            "attention_mask": attention_mask.long(),
            "labels": labels.masked_fill(torch.arange(labels.shape[1]) >= target[:, None], -100),
        }

    return collate


def compiles_over_an_epoch(lengths: np.ndarray, bucket_width: int = 8, dynamic: bool = False) -> tuple[int, int, int]:
    """(frames dynamo compiled, distinct batch shapes, buckets of the sampler) over one epoch."""
    sampler = TokenBatchSampler(
        lengths, max_tokens=256, shuffle=True, seed=0, pad_to_buckets=True, bucket_width=bucket_width
    )
    collate = random_batch(lengths, torch.Generator().manual_seed(0))
    collate = PadToBucket(collate, pad_token_id=0, max_tokens=256, bucket_width=bucket_width)
    batches = [collate(indices) for indices in sampler]
    shapes = {(*batch["input_ids"].shape, batch["labels"].shape[1]) for batch in batches}
    return compiled_frames(batches, dynamic), len(shapes), len(np.unique(sampler.shapes, axis=0))


def compiled_frames(batches: list[dict], dynamic: bool = False) -> int:
    """How many graphs dynamo hands to the compiler running a tiny model (static shapes, or ``dynamic``) over
    ``batches``: the compilations inductor would make."""
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=VOCAB, encoder_layers=1, decoder_layers=1)
    model = VanillaTransformerForConditionalGeneration._from_config(config).eval()
    allow_recompiles(len(batches))
    torch._dynamo.reset()
    counter = CompileCounter()  # the "eager" backend, counting its calls
    compiled = torch.compile(model, backend=counter, dynamic=dynamic)
    with torch.no_grad():
        for batch in batches:
            compiled(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=model.prepare_decoder_input_ids_from_labels(batch["labels"]),
            )
    return counter.frame_count


# Cells (8, 8) and (16, 16): batches of 32 and 16 rows, and the last pairs in a batch of their own.
LENGTHS = np.array([(3, 4), (5, 6), (7, 7), (12, 10), (14, 15), (10, 13)] * 36)


def test_compiled_model_compiles_once_per_bucket_shape_over_many_batches():
    frames, shapes, buckets = compiles_over_an_epoch(LENGTHS)
    assert shapes == buckets == 3
    assert 1 <= frames <= buckets  # 16 batches, 3 shapes: at most 3 compilations (one frame per shape)


def test_the_counter_sees_a_compilation_at_every_new_shape():
    """The count can fail: batches whose lengths are all different (no buckets) compile once each."""
    lengths = np.array([(length, length + 1) for length in (5, 6, 7)] * 2)
    collate = random_batch(lengths, torch.Generator().manual_seed(0))
    batches = [collate([index, index + 3]) for index in range(3)]  # 3 batches of 2 rows, 3 shapes
    assert compiled_frames(batches) == 3


@pytest.mark.parametrize("pad_to_buckets", ["auto", "never"])
def test_torch_compile_flag_compiles_static_shapes_of_buckets(tmp_path, pad_to_buckets):
    """Static shapes where batches come in a few bucket shapes; without buckets, batches of hundreds of shapes
    an epoch (WMT) would each be compiled: torch's default then, symbolic lengths after a second shape."""
    args = TransformerTrainingArguments(
        output_dir=str(tmp_path), torch_compile=True, use_cpu=True, report_to="none", max_tokens=256,
        pad_to_buckets=pad_to_buckets,
    )  # fmt: skip
    model = VanillaTransformerForConditionalGeneration._from_config(VanillaTransformerConfig.from_preset("tiny"))
    trainer = TransformerTrainer(model=model, args=args)
    assert trainer.accelerator.state.dynamo_plugin.dynamic is (False if pad_to_buckets == "auto" else None)
    allow_recompiles(100)
    assert torch._dynamo.config.recompile_limit >= 108


def test_cuda_graphs_compile_once_over_the_bucket_shapes_of_an_epoch():
    """--cuda_graphs compiles with dynamic shapes (`levers.CUDA_GRAPHS`): the epoch's bucket shapes cost one
    compilation, or two where the first batch's sizes are equal (dynamo guards on that equality), where static
    shapes cost one per bucket shape (the tests above). CUDA graphs themselves (recorded per shape) need a GPU."""
    lengths = np.array([(n, n) for n in range(3, 31)] * 4 + [(n, n + 7) for n in range(3, 24)] * 4)  # some equal
    compilations, shapes, _ = compiles_over_an_epoch(lengths, bucket_width=4, dynamic=levers.CUDA_GRAPHS["dynamic"])
    assert shapes >= 10 and 1 <= compilations <= 2, f"{compilations} compilations over {shapes} bucket shapes"


@pytest.mark.parametrize("max_tokens", [256, 0])
def test_cuda_graphs_flag_compiles_dynamic_shapes(tmp_path, max_tokens):
    """With token batches and with sentence batches (--max_tokens 0)."""
    args = TransformerTrainingArguments(
        output_dir=str(tmp_path), torch_compile=True, use_cpu=True, report_to="none", max_tokens=max_tokens
    )
    args.cuda_graphs, args.torch_compile_mode = True, "reduce-overhead"  # as check_levers sets them on a GPU
    model = VanillaTransformerForConditionalGeneration._from_config(VanillaTransformerConfig.from_preset("tiny"))
    plugin = TransformerTrainer(model=model, args=args).accelerator.state.dynamo_plugin
    assert (plugin.dynamic, plugin.mode) == (True, "reduce-overhead")


def pad_to_longest(features: list[dict]) -> dict:
    """What DataCollatorForSeq2Seq does: each side padded to the batch's longest (ids 0, labels -100)."""

    def pad(key, fill):
        width = max(len(f[key]) for f in features)
        return torch.tensor([f[key] + [fill] * (width - len(f[key])) for f in features])

    input_ids = pad("input_ids", 0)
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": pad("labels", -100)}


@pytest.mark.parametrize(
    "torch_compile, pad_to_buckets, expected",
    [
        (True, "auto", True),
        (False, "auto", False),
        (False, "always", True),
        (True, "never", False),
    ],
)
def test_batches_are_padded_to_buckets_where_a_graph_is_compiled_per_shape(
    tmp_path, torch_compile, pad_to_buckets, expected
):
    """--pad_to_buckets auto: bucket shapes only under --torch_compile (static shapes); without it they only
    cost real tokens (tests/test_data.py -k short_sentences). The trainer's loader pads to them or not."""
    args = TransformerTrainingArguments(
        output_dir=str(tmp_path),
        torch_compile=torch_compile,
        use_cpu=True,
        report_to="none",
        max_tokens=64,
        pad_to_buckets=pad_to_buckets,
    )
    assert pads_to_buckets(args) is expected
    model = VanillaTransformerForConditionalGeneration._from_config(VanillaTransformerConfig.from_preset("tiny"))
    lengths = [(3, 5), (5, 3), (9, 9), (10, 11)] * 4
    dataset = Dataset.from_list([{"input_ids": [5] * source, "labels": [6] * target} for source, target in lengths])
    trainer = TransformerTrainer(model=model, args=args, train_dataset=dataset, data_collator=pad_to_longest)
    for batch in trainer.get_train_dataloader():
        longest = (batch["attention_mask"].sum(1).max().item(), (batch["labels"] != -100).sum(1).max().item())
        widths = (batch["input_ids"].shape[1], batch["labels"].shape[1])
        if expected:
            assert all(width % 8 == 0 and width >= length for width, length in zip(widths, longest))
        else:
            assert widths == longest


TF32_CHECK = """
import json, os, sys
import torch
import transformers.training_args
from vanilla_transformer.training.arguments import TransformerTrainingArguments

transformers.training_args.is_torch_tf32_available = lambda: True  # as on a GPU since Ampere
matmul = torch.backends.cuda.matmul
for case, setting in json.loads(sys.argv[2]).items():  # each in a child with the flags as torch starts them
    if os.fork() == 0:
        exec(setting)  # the user's own setting, if any
        read = []
        for tf32 in (None, False):  # transformers' choice for a compiled run, then a run that turns TF32 off
            TransformerTrainingArguments(
                output_dir=sys.argv[1], use_cpu=True, torch_compile=True, tf32=tf32, report_to="none"
            )
            read += [matmul.fp32_precision, str(matmul.allow_tf32), torch.get_float32_matmul_precision()]
        print(json.dumps({case: read}), flush=True)
        os._exit(0)
    os.wait()
"""

# the user's setting before the arguments -> (CUDA's matmul precision, the legacy flag, the legacy precision) after
# each of the two runs: TF32 as transformers chose it where the user chose nothing, the user's own where they did
TF32_CASES = {
    "nothing": ("", ["tf32", "True", "high", "ieee", "False", "highest"]),
    "the new API's tf32": ("matmul.fp32_precision = 'tf32'", ["tf32", "True", "high"] * 2),
    "the legacy flag off": ("matmul.allow_tf32 = False", ["ieee", "False", "highest"] * 2),
}


def test_the_compiled_runs_tf32_flags_stay_readable(tmp_path):
    """With --torch_compile on a GPU, transformers turns TF32 on through torch's global fp32_precision setting only;
    torch then refused to read the legacy flags (a RuntimeError, "mix of the legacy and new APIs"), which inductor
    reads while compiling a matrix product on torch 2.9-2.10. Read either way, the precision stays what transformers
    or the user chose, and a second run's --tf32 false still turns transformers' off. A fresh process (forked for
    each case): the flags are process-wide."""
    import json
    import subprocess
    import sys

    if not hasattr(torch.backends, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has the legacy TF32 flags only (fp32_precision came in 2.9)")
    settings = json.dumps({case: setting for case, (setting, _) in TF32_CASES.items()})
    done = subprocess.run(
        [sys.executable, "-c", TF32_CHECK, str(tmp_path / "run"), settings], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    read = {case: value for line in done.stdout.splitlines() for case, value in json.loads(line).items()}
    assert read == {case: expected for case, (_, expected) in TF32_CASES.items()}, done.stderr[-2000:]


ACCELERATE_TF32_CHECK = """
import json, os, sys
import torch
import transformers.training_args
from accelerate.state import AcceleratorState
from accelerate.utils import DynamoBackend
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.training import TransformerTrainer, TransformerTrainingArguments

transformers.training_args.is_torch_tf32_available = lambda: True  # as on a GPU since Ampere
matmul = torch.backends.cuda.matmul
built = AcceleratorState.__init__


def as_on_cuda(self, *args, **kwargs):  # accelerate's AcceleratorState on a CUDA device (accelerate/state.py)
    built(self, *args, **kwargs)
    if self.dynamo_plugin.backend != DynamoBackend.NO and self._mixed_precision == "no":
        matmul.allow_tf32 = True
        turned_on.append(True)


AcceleratorState.__init__ = as_on_cuda
turned_on = []
for case, (setting, runs) in json.loads(sys.argv[2]).items():  # each in a fresh child: the flags are process-wide
    if os.fork() == 0:
        exec(setting)  # the user's own setting, if any
        for tf32 in runs:  # one run after another in the same process (a notebook, table3's rows)
            args = TransformerTrainingArguments(
                output_dir=sys.argv[1], use_cpu=True, torch_compile=True, tf32=tf32, report_to="none"
            )
            model = VanillaTransformerForConditionalGeneration._from_config(VanillaTransformerConfig.from_preset("tiny"))
            TransformerTrainer(model=model, args=args)
        print(json.dumps({case: [matmul.fp32_precision, str(matmul.allow_tf32), len(turned_on)]}), flush=True)
        os._exit(0)
    os.wait()
"""

# the user's setting and each run's --tf32 -> (CUDA's matmul precision, the legacy flag) once the last run's trainer
# is built: what the arguments left, whatever accelerate does
ACCELERATE_TF32_CASES = {
    "--tf32 false": ("", [False], ["ieee", "False"]),
    "the user's ieee, no --tf32": ("matmul.fp32_precision = 'ieee'", [None], ["ieee", "False"]),
    "no setting, no --tf32": ("", [None], ["tf32", "True"]),  # transformers' TF32 for a compiled run
    "no --tf32, then --tf32 false": ("", [None, False], ["ieee", "False"]),  # the first run's TF32 is not kept
    "--tf32 false, no --tf32, --tf32 false": ("", [False, None, False], ["ieee", "False"]),
    "the user's ieee, --tf32 false, then no --tf32": (
        "matmul.fp32_precision = 'ieee'",
        [False, None],
        ["ieee", "False"],
    ),
}


def test_tf32_stays_as_the_arguments_set_it_when_accelerate_builds_its_state(tmp_path):
    """accelerate turns CUDA's TF32 matmul on when it builds the state of a compiled float32 run on CUDA
    (``AcceleratorState``: ``matmul.allow_tf32 = True``), after transformers applied --tf32. Simulated here as it
    does it on CUDA: --tf32 false, and a setting of the user's own, still hold once the trainer is built."""
    import json
    import subprocess
    import sys

    if not hasattr(torch.backends, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has the legacy TF32 flags only (fp32_precision came in 2.9)")
    cases = json.dumps({case: (setting, runs) for case, (setting, runs, _) in ACCELERATE_TF32_CASES.items()})
    done = subprocess.run(
        [sys.executable, "-c", ACCELERATE_TF32_CHECK, str(tmp_path / "run"), cases],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    read = {case: value for line in done.stdout.splitlines() for case, value in json.loads(line).items()}
    # accelerate's TF32 was turned on at every trainer built: else the case would prove nothing
    assert read == {case: [*expected, len(runs)] for case, (_, runs, expected) in ACCELERATE_TF32_CASES.items()}, (
        done.stderr[-2000:]
    )


@pytest.mark.floor  # torch before 2.9 (the floor's) has the legacy flag only: the bool branch runs there
@pytest.mark.parametrize("own", [False, True], ids=["own setting off", "own setting on"])
def test_the_tf32_snapshot_puts_back_a_setting_accelerate_turned_on(own):
    """`cuda_matmul_tf32_setting` then `restore_cuda_matmul_tf32_setting` around what accelerate does for a compiled
    float32 run on CUDA (``matmul.allow_tf32 = True``): the user's setting, read through the legacy flag that
    every supported torch has, is back, and the restore says whether accelerate had changed it."""
    from vanilla_transformer.training.arguments import cuda_matmul_tf32_setting, restore_cuda_matmul_tf32_setting

    matmul = torch.backends.cuda.matmul
    before = cuda_matmul_tf32_setting()
    try:
        matmul.allow_tf32 = own
        setting = cuda_matmul_tf32_setting()
        assert isinstance(setting, bool) != hasattr(torch.backends, "fp32_precision")  # the branch of this torch
        matmul.allow_tf32 = True  # accelerate's AcceleratorState
        assert restore_cuda_matmul_tf32_setting(setting) is (not own)
        assert matmul.allow_tf32 is own
        assert restore_cuda_matmul_tf32_setting(setting) is False  # nothing left to put back
    finally:
        restore_cuda_matmul_tf32_setting(before)
