"""The training levers on a CUDA GPU (`make test-gpu`; the goal: under 3 minutes on one GPU; 64 s for the 11
tests of eab1ee5 on an H100, 2026-11-27, the rest not timed yet): each lever's loss and gradients against the
plain step, compiled layers, the whole model and CUDA graphs against eager, the float8 and fused kernels running,
generate()'s compiled static cache against the dynamic cache, --tf32 false under accelerate's compiled state
(last: where the call's time runs out, it is the one lost). Every test here is marked ``gpu`` and skips without CUDA; their CPU counterparts are
in tests/test_levers.py."""

import math
import warnings
from pathlib import Path

import pytest
import torch

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, attention_backends
from vanilla_transformer.training import levers
from vanilla_transformer.training_kernels import label_smoothed_cross_entropy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", autouse=True)
def profiler_started_before_any_cuda_graph():
    """A CUDA graph captured before the profiler's first start crashes or hangs it (pytorch issues 75504,
    135003), and the last test profiles after the CUDA graphs' tests: started once first, as gpu.py does."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
        pass


def model_of(**overrides):
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=512, dropout=0.0, **overrides)
    return VanillaTransformerForConditionalGeneration(config).cuda().train()


def batch_of(rows: int, source: int, target: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 512, (rows, source), generator=generator)
    labels = torch.randint(4, 512, (rows, target), generator=generator)
    labels[0, target // 2 :] = -100
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, source // 2 :] = 0
    return input_ids.cuda(), attention_mask.cuda(), labels.cuda()


def loss_and_grads(model, batch, fused_loss="none", forward=None, dtype=torch.bfloat16):
    input_ids, attention_mask, labels = batch
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels),
    }
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):  # None: no autocast
        loss = levers.training_loss(model, inputs, labels, None, 0.1, fused_loss, forward)
    loss.backward()
    return loss.detach().float(), {name: p.grad.detach().float().clone() for name, p in model.named_parameters()}


def assert_same_training(a, b, rtol=2e-2, atol=2e-3, gradient_tolerance=2e-2):
    """Equal loss, and the gradients equal up to bfloat16 rounding: the whole within 2% of the reference's norm,
    and each parameter's within 2% of its own norm. Element by element, bfloat16 products summed in another order
    (another kernel, a compiled graph) differ by more than 2% on a few small entries (an H100, 2026-11-27); a
    wrong lever (a lost mask, a missing term) moves the whole gradient. A parameter whose gradient is rounding
    noise is left to the whole's check: k_proj.bias (softmax ignores a constant added to every key, so its true
    gradient is 0; about 1e-5 of the largest gradient's norm, where every other is above 1e-3: the tiny model on
    the CPU), where another summation order differs by 50% and more."""
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    torch.testing.assert_close(loss_a, loss_b, rtol=rtol, atol=atol)
    whole = torch.cat([(grads_a[name] - grads_b[name]).flatten() for name in grads_b]).norm()
    reference = torch.cat([gradient.flatten() for gradient in grads_b.values()]).norm()
    assert whole <= gradient_tolerance * reference, f"the gradients differ by {whole / reference:.2%} of their norm"
    largest = max(gradient.norm() for gradient in grads_b.values())
    for name in grads_a:
        if grads_b[name].norm() <= 1e-3 * largest:  # rounding noise
            continue
        error = (grads_a[name] - grads_b[name]).norm() / grads_b[name].norm()
        assert error <= gradient_tolerance, f"{name}: gradients differ by {error:.2%} of their norm"


@pytest.mark.parametrize("fused_loss", ["chunked", "liger"])
def test_fused_losses_equal_the_plain_step(fused_loss):
    if fused_loss == "liger":
        pytest.importorskip("liger_kernel")
    model, batch = model_of(), batch_of(8, 24, 20)
    assert_same_training(loss_and_grads(model, batch, fused_loss), loss_and_grads(model, batch))


def test_chunked_loss_holds_less_memory_than_the_full_logits():
    hidden = torch.randn(16384, 512, device="cuda", requires_grad=True)
    weight = torch.randn(32000, 512, device="cuda", requires_grad=True)
    labels = torch.randint(0, 32000, (16384,), device="cuda")
    peaks = {}
    for chunked in (True, False):
        hidden.grad = weight.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = (
                levers.chunked_linear_cross_entropy(hidden, weight, labels, None, 0.1)
                if chunked
                else label_smoothed_cross_entropy(hidden @ weight.T, labels, None, 0.1)
            )
        loss.backward()
        peaks[chunked] = torch.cuda.max_memory_allocated() - before
    logits_bytes = 16384 * 32000 * 4
    assert peaks[True] < logits_bytes / 2 < peaks[False]


def test_compiled_layers_train_like_eager_over_bucket_shapes():
    """Graphs counted as dynamo counts them (unique_graphs): its frame count also counts a trace restarted
    once sdpa fixes a float attribute (dropout, scaling) that dynamic shapes had made symbolic, 5 frames for
    3 graphs when forced through the CUDA attention path on the CPU."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager, compiled = model_of(), model_of()
    levers.compile_layers(compiled, backend="inductor")
    for index, shape in enumerate([(8, 16, 16), (4, 32, 24), (16, 8, 8), (6, 40, 32)]):
        batch = batch_of(*shape, seed=index)
        assert_same_training(loss_and_grads(compiled, batch), loss_and_grads(eager, batch))
    assert 0 < counters["stats"]["unique_graphs"] <= 4


def test_compiled_layers_with_the_chunked_loss_train_like_the_plain_step():
    """gpu.py's row "compile_layers + fused_loss chunked": the compiled layers under the chunked loss (which calls
    the model past its lm_head) give the plain step's loss and gradients."""
    torch._dynamo.reset()
    plain, compiled = model_of(), model_of()
    levers.compile_layers(compiled, backend="inductor")
    for index, shape in enumerate([(8, 16, 16), (4, 24, 16)]):
        batch = batch_of(*shape, seed=index)
        assert_same_training(loss_and_grads(compiled, batch, "chunked"), loss_and_grads(plain, batch))


def test_the_whole_model_compiled_with_static_shapes_trains_like_eager():
    """gpu.py's row "torch_compile (whole model, static shapes)", as train.py --torch_compile compiles token batches:
    a graph of inductor's per batch shape, the same training as eager (the CPU's counterpart compiles by
    aot_eager: tests/test_levers.py)."""
    torch._dynamo.reset()
    eager, compiled = model_of(), model_of()
    forward = torch.compile(compiled, dynamic=False)
    for index, shape in enumerate([(8, 16, 16), (4, 24, 16)]):
        batch = batch_of(*shape, seed=index)
        assert_same_training(loss_and_grads(compiled, batch, forward=forward), loss_and_grads(eager, batch))


def test_generate_with_a_static_cache_compiles_itself_and_decodes_as_the_dynamic_cache():
    """What gpu.py's compiled decoding rows time: on CUDA, generate() with cache_implementation="static" compiles
    the forward itself (CUDA graphs), and its beam-4 hypotheses are the dynamic cache's (float32; the CPU's
    counterpart compiles the forward by hand: tests/test_speed_levers.py). Inductor's kernels sum in another
    order, which may flip a near-tie of a random model: 7 sentences of 8 at least, token for token."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = model_of().eval()
    input_ids, attention_mask, _ = batch_of(8, 12, 4)
    settings = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=4, max_new_tokens=8)
    with torch.inference_mode():
        dynamic = model.generate(**settings, min_new_tokens=8)
        for _ in range(2):  # the first call records the graphs, the second replays them
            static = model.generate(**settings, min_new_tokens=8, cache_implementation="static")
    compiled_without_cudagraph_skips()  # generate() compiled the steps, and replayed CUDA graphs of them
    assert static.shape == dynamic.shape
    assert sum(torch.equal(a, b) for a, b in zip(static, dynamic)) >= 7, (static, dynamic)


def test_compiled_training_keeps_the_attention_kernel_choice_without_a_graph_break():
    """On this GPU's torch: a compiled layer in training traces `sdpa_kernel` (the table of
    attention_backends) into its graph, without a break, so a compiled lever differs from eager by its
    compilation alone (the CPU test checks the tracing on the torch of the test suite)."""
    import torch._dynamo

    torch._dynamo.reset()
    model = model_of()
    layer = model.model.encoder.layers[0]
    hidden = torch.randn(4, 16, model.config.d_model, device="cuda")
    mask = torch.zeros(4, 1, 16, 16, device="cuda")
    explained = torch._dynamo.explain(layer)(hidden, mask)
    assert explained.graph_break_count == 0, [str(reason.reason) for reason in explained.break_reasons]
    assert any("_sdpa_kernel" in graph.code for graph in explained.graphs)


def test_fused_projections_train_like_the_plain_step():
    plain, fused = model_of(), model_of()
    levers.fuse_projections(fused)
    for index, shape in enumerate([(8, 16, 16), (4, 24, 20)]):
        batch = batch_of(*shape, seed=index)
        assert_same_training(loss_and_grads(fused, batch), loss_and_grads(plain, batch))


def test_the_sync_free_step_makes_no_synchronisation():
    """--sync_free_step on CUDA under ``torch.cuda.set_sync_debug_mode("error")``: forward, loss and backward wait
    for the GPU nowhere (the CPU test counts Tensor reads; this sees every synchronisation, nonzero and copies to
    the host included), where the plain step does (so the check is on); the same training as the plain step."""
    plain, sync_free = model_of(), model_of()
    levers.sync_free_step(sync_free)
    input_ids, attention_mask, labels = batch_of(8, 16, 16)
    count = (labels != -100).sum()  # the Trainer's token count, made before the step

    def step(model, always_scale: bool):
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels),
        }
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = levers.training_loss(model, inputs, labels, count, 0.1, always_scale=always_scale)
        loss.backward()
        return loss.detach().float(), {name: p.grad.detach().float().clone() for name, p in model.named_parameters()}

    step(sync_free, True), step(plain, False)  # the first calls' lazy set-up (cuBLAS handles) may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        trained = step(sync_free, True)
        with pytest.raises(RuntimeError, match="synchroniz"):
            step(plain, False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_same_training(trained, step(plain, False))


def test_a_sync_free_run_copies_its_batches_to_the_gpu_without_waiting(tmp_path):
    """train.py's batches come from pinned memory; accelerate copies them with ``non_blocking=False`` unless told,
    and a blocking copy waits for the GPU: with --sync_free_step, asynchronous (the plain run's as it was)."""
    from vanilla_transformer.training.options import parse_arguments

    flags = ["--train_file", "t.tsv", "--preset", "tiny", "--output_dir", str(tmp_path), "--report_to", "none"]
    _, _, sync_free = parse_arguments([*flags, "--sync_free_step", "true"])
    _, _, plain = parse_arguments(flags)
    assert sync_free.accelerator_config.non_blocking and sync_free.dataloader_pin_memory
    assert not plain.accelerator_config.non_blocking


def compiled_without_cudagraph_skips() -> None:
    """Something was compiled, and inductor skipped CUDA graphs nowhere (it falls back to plain kernels, with a
    warning, for mutated inputs, CPU tensors and the like: the lever would then do nothing)."""
    from torch._dynamo.utils import counters

    assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])
    assert counters["inductor"]["cudagraph_skips"] == 0, "CUDA graphs skipped: see the cudagraphs warnings above"


def test_cuda_graphs_train_like_eager():
    """--cuda_graphs' compilation (`levers.CUDA_GRAPHS`, dynamic shapes): a graph recorded per shape, replayed
    when the shape comes again; the same training as eager throughout."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager, graphed = model_of(), model_of()
    forward = torch.compile(graphed, **levers.CUDA_GRAPHS)
    for index, shape in enumerate([(8, 16, 16), (4, 24, 16), (8, 16, 16), (4, 24, 16)]):  # recorded, replayed
        batch = batch_of(*shape, seed=index)
        torch.compiler.cudagraph_mark_step_begin()
        assert_same_training(loss_and_grads(graphed, batch, forward=forward), loss_and_grads(eager, batch))
    compiled_without_cudagraph_skips()


@pytest.mark.parametrize("kernel", ["cudnn", "efficient", "math"])  # flash leads the default already
def test_each_attention_kernel_trains_like_the_default(kernel):
    model, batch = model_of(), batch_of(8, 24, 20)
    reference = loss_and_grads(model, batch)
    try:
        attention_backends.prefer_in_training(kernel)
        chosen = loss_and_grads(model, batch)
    finally:
        attention_backends.prefer_in_training("default")
    assert_same_training(chosen, reference)


@pytest.mark.parametrize("kernel", ["cudnn", "efficient"])
def test_each_attention_kernel_runs_where_chosen(kernel):
    """`--training_attention KERNEL` is a lever only where the kernel takes the call: torch falls back to the
    next backend in silence otherwise. Each use of attention in training is tried with the kernel alone
    (torch raises "No available kernel" where it declines); the uses it declines are named in a warning, and
    a kernel that takes none of them fails."""
    model, batch = model_of(), batch_of(8, 24, 20)
    uses = (attention_backends.ENCODER, attention_backends.DECODER, attention_backends.CROSS)
    declined = []
    for use in uses:
        try:
            attention_backends.BACKENDS[True, use] = (attention_backends.KERNELS[kernel],)
            loss_and_grads(model, batch)
        except RuntimeError as error:
            declined.append(f"{use} ({str(error).splitlines()[0]})")
        finally:
            attention_backends.prefer_in_training("default")
    assert len(declined) < len(uses), f"{kernel} took no use of attention in training: {declined}"
    if declined:
        warnings.warn(f"--training_attention {kernel} falls back for: {'; '.join(declined)}", stacklevel=1)


def test_fp8_trains_and_stays_near_bfloat16():
    reason = levers.refusal("--fp8", "cuda")
    if reason:
        pytest.skip(reason)
    overrides = dict(d_model=256, encoder_ffn_dim=1024, decoder_ffn_dim=1024)
    plain, fp8 = model_of(**overrides), model_of(**overrides)
    levers.convert_to_fp8(fp8)
    assert any("Float8" in type(module).__name__ for module in fp8.modules())
    batch = batch_of(16, 32, 32)
    (loss, _), (loss_fp8, grads) = loss_and_grads(plain, batch), loss_and_grads(fp8, batch)
    assert torch.isfinite(loss_fp8) and all(torch.isfinite(g).all() for g in grads.values())
    torch.testing.assert_close(loss_fp8, loss, rtol=0.05, atol=0.05)


def test_fp8_compiled_layers_take_token_counts_not_a_multiple_of_16():
    reason = levers.refusal("--fp8", "cuda")
    if reason:
        pytest.skip(reason)
    overrides = dict(d_model=256, encoder_ffn_dim=1024, decoder_ffn_dim=1024)
    torch._dynamo.reset()
    plain, fp8 = model_of(**overrides), model_of(**overrides)
    levers.convert_to_fp8(fp8)
    levers.compile_layers(fp8)
    for index, shape in enumerate([(3, 7, 5), (5, 13, 11), (16, 32, 32)]):  # 21, 65 and 512 source tokens
        (loss, _), (loss_fp8, grads) = (
            loss_and_grads(plain, batch_of(*shape, seed=index)),
            loss_and_grads(fp8, batch_of(*shape, seed=index)),
        )
        assert torch.isfinite(loss_fp8) and all(torch.isfinite(g).all() for g in grads.values())
        torch.testing.assert_close(loss_fp8, loss, rtol=0.05, atol=0.05)


def test_training_arguments_take_cuda_graphs_on_a_gpu():
    from vanilla_transformer.training.trainer import TransformerTrainingArguments

    args = TransformerTrainingArguments(output_dir="unused", cuda_graphs=True)
    assert args.torch_compile and args.torch_compile_mode == "reduce-overhead"


def test_bfloat16_weights_train_like_the_autocast_step_with_fewer_kernels():
    """--bf16_weights on CUDA: the model in bfloat16 without autocast trains like the plain step under bfloat16
    autocast (loss and gradients within bfloat16's rounding: layer norms and the residual stream in bfloat16 differ
    from autocast's float32 ones), launches fewer kernels (no casts of weights and activations), and the fused
    AdamW steps its float32 masters."""
    from torch.profiler import ProfilerActivity, profile

    plain, weights = model_of(), model_of()
    levers.bfloat16_weights(weights)
    batch = batch_of(8, 16, 16)
    (loss, grads), (plain_loss, plain_grads) = loss_and_grads(weights, batch, dtype=None), loss_and_grads(plain, batch)
    torch.testing.assert_close(loss, plain_loss, rtol=1e-2, atol=1e-3)
    # the whole gradient within 5% of its norm (the CPU, tiny model: 2.8%); each parameter's within 15%, but for
    # those whose gradient is rounding noise (k_proj.bias: softmax ignores a constant added to every key)
    total = torch.cat([(grads[name] - plain_grads[name]).flatten() for name in grads]).norm()
    assert total <= 0.05 * torch.cat([gradient.flatten() for gradient in plain_grads.values()]).norm()
    largest = max(gradient.norm() for gradient in plain_grads.values())
    for name, gradient in plain_grads.items():
        if gradient.norm() > 1e-3 * largest:
            assert (grads[name] - gradient).norm() <= 0.15 * gradient.norm(), name

    def kernels(model, dtype):
        loss_and_grads(model, batch, dtype=dtype)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as profiled:
            loss_and_grads(model, batch, dtype=dtype)
            torch.cuda.synchronize()
        return sum(event.count for event in profiled.key_averages() if event.device_type.name == "CUDA")

    assert kernels(weights, None) < kernels(plain, torch.bfloat16)
    optimizer = torch.optim.AdamW(weights.parameters(), lr=1e-3, fused=True)
    levers.keep_float32_masters(optimizer)
    before = [master.detach().clone() for _, master in optimizer.float32_masters]
    loss_and_grads(weights, batch, dtype=None)
    optimizer.step()
    for (parameter, master), old in zip(optimizer.float32_masters, before):
        assert master.dtype == torch.float32 and not torch.equal(master, old)
        assert torch.equal(parameter, master.to(torch.bfloat16))


# train.py's levers in its own loop, each against the plain run on the same batches (--pad_to_buckets always).
# Last in the file: the longest tests (a Trainer run each, --cuda_graphs compiling), so that a call cut by its
# timeout (docs/benchmarks/gpu.md) has run the kernel-level checks first.
TRAINER_LEVERS = {
    "cuda_graphs": ("--cuda_graphs", "true"),
    "fp8": ("--fp8", "true"),
    "liger": ("--fused_loss", "liger"),
    "chunked": ("--fused_loss", "chunked"),
}


def trainer_losses(folder: Path, *flags: str) -> list[float]:
    """The losses train.py logs over 30 updates of bucket-padded batches of several shapes, with ``flags``."""
    from torch._dynamo.utils import counters

    from test_train import reverse_pairs, tiny_args, write_pairs
    from vanilla_transformer.training import run as train

    write_pairs(folder, "train", reverse_pairs(400, seed=1))
    arguments = tiny_args(
        folder, folder / "run", "--max_steps", "30", "--max_tokens", "300", "--bf16", "true", "--warmup_steps", "5"
    )
    arguments.remove("--use_cpu")
    arguments += ["--pad_to_buckets", "always", "--ema_decay", "0.99", *flags]  # the same batches for each
    torch._dynamo.reset()
    counters.clear()
    trainer = train.build_trainer(*train.parse_arguments(arguments)).trainer
    if "--fp8" in flags:  # the tiny model's layers (64, 128) are multiples of 16: all taken
        assert any("Float8" in type(module).__name__ for module in trainer.model.modules())
    trainer.train()
    if "--cuda_graphs" in flags:  # the Trainer compiled the model and replayed CUDA graphs
        compiled_without_cudagraph_skips()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(math.isfinite(loss) for loss in losses), (flags, losses)
    return losses


@pytest.fixture(scope="module")
def plain_trainer_losses(tmp_path_factory) -> list[float]:
    return trainer_losses(tmp_path_factory.mktemp("plain"))


@pytest.mark.parametrize("lever", TRAINER_LEVERS)
def test_train_runs_with_each_lever(lever, plain_trainer_losses, tmp_path):
    """train.py's own loop (the Trainer, accelerate's torch.compile with `levers.CUDA_GRAPHS`, torchao's float8
    layers, liger-kernel's or the chunked loss, the moving average) over batches of several bucket shapes: the
    loss is finite and falls as the plain run's does on the same batches (on the CPU, --cuda_graphs with the
    Trainer compiling through aot_eager instead, 6.26 -> 3.43 in 30 updates for both, 2026-11-28). The kernels
    alone against the plain step: the tests above; --fuse_projections in the Trainer: tests/test_levers.py."""
    flags = TRAINER_LEVERS[lever]
    reason = levers.refusal(" ".join(flags) if lever == "liger" else flags[0], "cuda")
    if reason:
        pytest.skip(reason)
    losses, plain = trainer_losses(tmp_path, *flags), plain_trainer_losses
    # other kernels (inductor's dropout masks, float8 rounding, another summation order) part the runs' ways: the
    # last five updates' mean, not one
    assert sum(losses[-5:]) < 5 * losses[0], losses
    assert sum(losses[-5:]) / 5 == pytest.approx(sum(plain[-5:]) / 5, rel=0.15), (losses, plain)


TF32_ON_CUDA = """
import json, sys
import torch
from accelerate.state import AcceleratorState
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.training import TransformerTrainer, TransformerTrainingArguments

matmul, built, after_accelerate = torch.backends.cuda.matmul, AcceleratorState.__init__, []


def recorded(self, *args, **kwargs):  # what accelerate left, before the trainer puts the arguments' setting back
    built(self, *args, **kwargs)
    after_accelerate.append(matmul.fp32_precision)


AcceleratorState.__init__ = recorded
args = TransformerTrainingArguments(output_dir=sys.argv[1], torch_compile=True, tf32=False, report_to="none")
model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny")).cuda()
TransformerTrainer(model=model, args=args)
print(json.dumps({"after accelerate": after_accelerate, "now": [matmul.fp32_precision, str(matmul.allow_tf32)]}))
"""


def test_tf32_false_holds_in_a_compiled_float32_run(tmp_path):
    """accelerate turns TF32 on for a compiled float32 run on CUDA when it builds its state, after --tf32 false was
    applied (tests/test_torch_compile.py simulates it on the CPU); here the real one. A fresh process: the flags
    and accelerate's state are process-wide."""
    import json
    import subprocess
    import sys

    if not hasattr(torch.backends, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has the legacy TF32 flags only")
    done = subprocess.run(
        [sys.executable, "-c", TF32_ON_CUDA, str(tmp_path / "run")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    read = json.loads(done.stdout.splitlines()[-1])
    if read["after accelerate"] != ["tf32"]:  # nothing to put back: the test would prove nothing
        pytest.skip(f"accelerate left CUDA's matmul precision at {read['after accelerate']}, not TF32")
    assert read["now"] == ["ieee", "False"], read
