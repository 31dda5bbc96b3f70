"""The GPU speed levers of training (vanilla_transformer.training.levers): each correct on the CPU
against the plain step; those that need CUDA refused elsewhere in one line, and checked by the tests
marked ``gpu`` (`make test-gpu`) where a GPU is at hand."""

import sys

import pytest
import torch

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, attention_backends
from vanilla_transformer.training import levers
from vanilla_transformer.training.moving_average import ExponentialMovingAverage
from vanilla_transformer.training_kernels import label_smoothed_cross_entropy

CUDA = torch.cuda.is_available()


def reference_and_chunked(hidden, weight, labels, smoothing, count=None, chunk_rows=7):
    """Loss and gradients of (hidden, weight) by the full logits + `label_smoothed_cross_entropy`, and chunked."""
    results = []
    for chunked in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if chunked:
            loss = levers.chunked_linear_cross_entropy(h, w, labels, count, smoothing, chunk_rows=chunk_rows)
        else:
            loss = label_smoothed_cross_entropy(h @ w.T, labels, count, smoothing)
        loss.backward()
        results.append((loss.detach(), h.grad, w.grad))
    return results


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_chunked_loss_equals_the_reference_and_its_gradients(smoothing):
    torch.manual_seed(0)
    hidden, weight = torch.randn(3, 11, 16, dtype=torch.float64), torch.randn(50, 16, dtype=torch.float64)
    labels = torch.randint(0, 50, (3, 11))
    labels[0, 5:] = -100  # padding
    (loss, grad_h, grad_w), (chunked, chunked_h, chunked_w) = reference_and_chunked(hidden, weight, labels, smoothing)
    torch.testing.assert_close(chunked, loss)
    torch.testing.assert_close(chunked_h, grad_h)
    torch.testing.assert_close(chunked_w, grad_w)


def test_chunked_loss_divides_by_the_count_of_the_whole_batch():
    torch.manual_seed(1)
    hidden, weight, labels = (
        torch.randn(4, 8, dtype=torch.float64),
        torch.randn(9, 8, dtype=torch.float64),
        torch.arange(4),
    )
    (loss, grad_h, _), (chunked, chunked_h, _) = reference_and_chunked(
        hidden, weight, labels, 0.1, count=torch.tensor(10)
    )
    torch.testing.assert_close(chunked, loss)
    torch.testing.assert_close(chunked_h, grad_h)
    assert loss < label_smoothed_cross_entropy(hidden @ weight.T, labels, None, 0.1)  # 4 tokens over 10


def test_chunked_loss_under_bfloat16_autocast_equals_the_autocast_reference_with_its_gradients():
    """Under autocast the chunked loss multiplies in bfloat16 and sums in float32, as the plain step does: the
    reference is the full logits made under the same autocast, smoothed in float32. Labels the model mostly
    predicts, so that smoothing moves the loss (by far more than the tolerance: a path that drops it fails)."""
    torch.manual_seed(2)
    hidden, weight = torch.randn(64, 32), torch.randn(300, 32) / 2
    labels = (hidden @ weight.T).argmax(-1)
    labels[::4] = torch.randint(0, 300, (16,))  # and some it does not
    labels[5] = -100

    def loss_and_gradients(loss_of, smoothing=0.1):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(h, w, smoothing)
        (3 * loss).backward()  # a scaled loss scales the gradients
        return loss, h.grad, w.grad

    def reference(h, w, smoothing):
        return label_smoothed_cross_entropy((h @ w.T).float(), labels, None, smoothing)

    def chunked(h, w, smoothing):
        return levers.chunked_linear_cross_entropy(h, w, labels, None, smoothing, chunk_rows=16)

    loss, grad_h, grad_w = loss_and_gradients(chunked)
    expected, expected_h, expected_w = loss_and_gradients(reference)
    assert loss.dtype == torch.float32 and grad_h.dtype == grad_w.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=1e-3, atol=0)
    assert abs(loss_and_gradients(reference, smoothing=0.0)[0] - expected) > 20 * 1e-3 * expected
    for gradient, reference_gradient in ((grad_h, expected_h), (grad_w, expected_w)):  # bfloat16 products
        assert (gradient - reference_gradient).norm() <= 2e-2 * reference_gradient.norm()


def peak_bytes(function) -> int:
    """Peak bytes that torch's CPU allocator holds beyond what it held before, while ``function`` runs: its
    memory profiler's allocation (+) and free (-) events, summed in the order they happened."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        function()
    events = [e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return peak


def test_chunked_loss_never_holds_the_full_logits():
    """8,192 tokens x 4,096 words: the float32 logits alone are 128 MiB. The chunked loss and its gradients,
    256 rows a chunk, peak below a quarter of that (a few chunks of logits, the gradients of hidden and
    weight); the reference holds the logits and more."""
    torch.manual_seed(3)
    hidden, weight = torch.randn(8192, 64), torch.randn(4096, 64)
    labels = torch.randint(0, 4096, (8192,))
    logits_bytes = 8192 * 4096 * 4

    def run(chunked: bool):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if chunked:
            loss = levers.chunked_linear_cross_entropy(h, w, labels, None, 0.1, chunk_rows=256)
        else:
            loss = label_smoothed_cross_entropy(h @ w.T, labels, None, 0.1)
        loss.backward()

    chunked, reference = peak_bytes(lambda: run(True)), peak_bytes(lambda: run(False))
    assert chunked < logits_bytes / 4 < reference


def tiny_model(**overrides):
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=97, dropout=0.0, **overrides)
    return VanillaTransformerForConditionalGeneration(config)


def batch(rows: int, source: int, target: int, seed: int = 0) -> tuple[dict, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 97, (rows, source), generator=generator)
    labels = torch.randint(4, 97, (rows, target), generator=generator)
    labels[0, target // 2 :] = -100
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, source // 2 :] = 0
    return input_ids, attention_mask, labels


def inputs_of(model, input_ids, attention_mask, labels) -> dict:
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels),
    }


def test_training_loss_with_the_chunked_loss_equals_the_plain_step():
    """The loss and every parameter's gradient of the whole model (tied pre-softmax projection included)."""
    plain, chunked = tiny_model(), tiny_model()
    input_ids, attention_mask, labels = batch(3, 9, 7)
    for model, fused in ((plain, "none"), (chunked, "chunked")):
        model.train()
        loss = levers.training_loss(
            model, inputs_of(model, input_ids, attention_mask, labels), labels, None, 0.1, fused
        )
        loss.backward()
        model.loss_ = loss.detach()
    torch.testing.assert_close(chunked.loss_, plain.loss_)
    for (name, p), (_, q) in zip(plain.named_parameters(), chunked.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name, rtol=1e-4, atol=1e-6)


def test_fused_projections_train_like_the_separate_ones_with_fewer_products():
    """--fuse_projections: the loss and every gradient equal the separate projections' (float64: the same sums),
    the state dict is unchanged, and a training forward runs fewer products: each self-attention's q, k, v one
    instead of three (2 fewer), each cross-attention's k, v one instead of two (1 fewer)."""
    from helpers import counted_kernels

    plain, fused = tiny_model().double(), tiny_model().double()
    levers.fuse_projections(fused)
    input_ids, attention_mask, labels = batch(3, 9, 7)
    products = {}
    for name, model in (("plain", plain), ("fused", fused)):
        model.train()
        with counted_kernels() as counts:
            loss = levers.training_loss(model, inputs_of(model, input_ids, attention_mask, labels), labels, None, 0.1)
        loss.backward()
        model.loss_, products[name] = loss.detach(), counts["aten::linear"]
    torch.testing.assert_close(fused.loss_, plain.loss_)
    for (name, p), (_, q) in zip(plain.named_parameters(), fused.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    config = plain.config
    saved = config.encoder_layers * 2 + config.decoder_layers * (2 + 1)  # q,k,v -> one; cross k,v -> one
    assert products["plain"] - products["fused"] == saved, products
    assert list(fused.state_dict()) == list(plain.state_dict())


def test_fused_projections_leave_decoding_with_a_cache_as_it_was():
    """With a cache (generate()), each projection runs alone: the same hypotheses with the lever on; without a
    cache (a teacher-forced forward in eval mode), the same logits."""
    plain, fused = tiny_model().eval(), tiny_model().eval()
    levers.fuse_projections(fused)
    input_ids, attention_mask, labels = batch(3, 9, 7)
    generated = [
        model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=2, max_new_tokens=6)
        for model in (plain, fused)
    ]
    torch.testing.assert_close(generated[1], generated[0])
    with torch.no_grad():
        logits = [model(**inputs_of(model, input_ids, attention_mask, labels)).logits for model in (plain, fused)]
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)


def host_reads_of(step) -> int:
    """How often ``step()`` reads a tensor's value on the host (each read waits for a GPU)."""
    reads, names = [], ("__bool__", "item", "tolist", "__int__", "__float__")
    originals = {name: getattr(torch.Tensor, name) for name in names}

    def counting(original):
        def read(*args, **kwargs):
            reads.append(original)
            return original(*args, **kwargs)

        return read

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, counting(original))
        step()
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return len(reads)


@pytest.mark.parametrize("padded", [True, False], ids=["padded batch", "unpadded batch"])
def test_the_sync_free_step_reads_nothing_back_and_trains_like_the_plain_step(padded):
    """--sync_free_step: forward, the label-smoothed loss and backward read no tensor on the host, where the plain
    step reads the encoder's and the cross-attention's masks (transformers' check for an unpadded batch) and the
    loss's incoming gradient; the loss and every gradient equal the plain step's (an unpadded batch: the plain
    step attends without a mask, the lever with one of all ones)."""
    plain, sync_free = tiny_model(), tiny_model()
    levers.sync_free_step(sync_free)
    input_ids, attention_mask, labels = batch(3, 9, 7)
    if not padded:
        attention_mask = torch.ones_like(attention_mask)
    reads = {}
    for name, model in (("plain", plain), ("sync free", sync_free)):
        model.train()

        def step(model=model):
            inputs = inputs_of(model, input_ids, attention_mask, labels)
            count = (labels != -100).sum()
            loss = levers.training_loss(model, inputs, labels, count, 0.1, always_scale=model is sync_free)
            loss.backward()
            model.loss_ = loss.detach()

        reads[name] = host_reads_of(step)
    assert reads == {"plain": 3, "sync free": 0}
    torch.testing.assert_close(sync_free.loss_, plain.loss_, rtol=0 if padded else 1e-6, atol=0 if padded else 1e-6)
    for (name, p), (_, q) in zip(plain.named_parameters(), sync_free.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name, **({} if padded else {"rtol": 1e-5, "atol": 1e-6}))


def test_the_sync_free_step_needs_a_mask_builder_that_can_keep_masks(monkeypatch):
    """transformers before 5.15 has no allow_is_bidirectional_skip: the lever would silently keep its host reads."""
    from transformers import masking_utils

    from vanilla_transformer.training import TransformerTrainingArguments

    monkeypatch.setattr(masking_utils, "create_bidirectional_mask", lambda config, inputs_embeds, attention_mask: None)
    with pytest.raises(ValueError, match=r"^--sync_free_step needs transformers 5.15 or newer"):
        TransformerTrainingArguments(output_dir="unused", use_cpu=True, sync_free_step=True)
    with pytest.raises(ValueError, match=r"^--sync_free_step needs transformers 5.15 or newer"):
        levers.sync_free_step(tiny_model())


def test_the_sync_free_step_in_the_trainer_reads_nothing_back_and_gives_the_plain_runs_losses(tmp_path):
    """`train --sync_free_step true`: the Trainer's loss (compute_loss) and its backward read nothing on the host,
    and two updates log the losses of the same run without the lever."""
    from test_train import build, reverse_pairs, write_pairs

    write_pairs(tmp_path, "train", reverse_pairs(60, seed=1))
    losses = {}
    for flag in ("false", "true"):
        flags = ["--max_steps", "2", "--max_tokens", "200", "--logging_steps", "1", "--sync_free_step", flag]
        trainer = build(tmp_path, tmp_path / f"out-{flag}", *flags).trainer
        trainer.train()
        losses[flag] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses["true"] == losses["false"] and len(losses["true"]) == 2
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert not model.model.encoder.drops_unpadded_masks and not model.model.decoder.drops_unpadded_masks
    batch = next(iter(trainer.get_train_dataloader()))
    count = (batch["labels"] != -100).sum()
    assert host_reads_of(lambda: trainer.compute_loss(model.train(), batch, num_items_in_batch=count).backward()) == 0


def test_train_flags_reach_the_model(tmp_path):
    """`train --fuse_projections true` (apply_levers, as the Trainer starts): the trained model's attention
    modules compute fused products in the Trainer's own loss (`compute_loss`, with the config's ``use_cache``
    on, as a user's model has it: teacher forcing runs without a cache, where the fused path applies), and
    training runs."""
    from helpers import counted_kernels
    from test_train import build, reverse_pairs, write_pairs

    write_pairs(tmp_path, "train", reverse_pairs(60, seed=1))
    run = build(tmp_path, tmp_path / "out", "--max_steps", "2", "--max_tokens", "200", "--fuse_projections", "true")
    model = run.trainer.accelerator.unwrap_model(run.trainer.model)
    attention = [module for module in model.modules() if hasattr(type(module), "fused_projections")]
    assert len(attention) == model.config.encoder_layers + 2 * model.config.decoder_layers  # self; self, cross
    assert all(module.fused_projections for module in attention)
    model.config.use_cache = True
    batch = next(iter(run.trainer.get_train_dataloader()))
    products = {}
    for fused in (False, True):
        levers.fuse_projections(model, fused)
        with counted_kernels() as counts:
            run.trainer.compute_loss(model, batch)
        products[fused] = counts["aten::linear"]
    assert products[False] - products[True] == 2 * model.config.encoder_layers + 3 * model.config.decoder_layers
    assert torch.isfinite(torch.tensor(run.trainer.train().training_loss))


@pytest.mark.parametrize("fused_loss", ["none", "chunked"])
def test_the_fused_loss_trains_under_the_bf16_autocast_as_the_plain_step(fused_loss, tmp_path):
    """`train --bf16 true`: accelerate puts the autocast around the prepared model's forward; the fused loss calls
    the model past it (``model.model``), and must run under the same autocast: the layers' products in bfloat16."""
    from test_train import build, reverse_pairs, write_pairs

    write_pairs(tmp_path, "train", reverse_pairs(60, seed=1))
    run = build(
        tmp_path,
        tmp_path / "out",
        "--max_steps",
        "1",
        "--max_tokens",
        "200",
        "--bf16",
        "true",
        "--fused_loss",
        fused_loss,
    )
    model = run.trainer.accelerator.unwrap_model(run.trainer.model)
    dtypes = []
    model.model.encoder.layers[0].feed_forward.fc1.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    run.trainer.train()
    assert dtypes == [torch.bfloat16], dtypes


def test_the_fused_loss_is_refused_with_the_whole_model_compiled():
    """The fused loss calls the model past the Trainer's compiled wrapper: with --torch_compile or --cuda_graphs it
    would train uncompiled, so the pair is refused in one line naming both flags."""
    from vanilla_transformer.training.trainer import TransformerTrainingArguments

    with pytest.raises(ValueError, match=r"^--fused_loss chunked with --torch_compile: .* --compile_layers"):
        TransformerTrainingArguments(output_dir="unused", use_cpu=True, fused_loss="chunked", torch_compile=True)
    with pytest.raises(ValueError, match=r"^--fused_loss chunked with --cuda_graphs"):
        TransformerTrainingArguments(output_dir="unused", use_cpu=True, fused_loss="chunked", cuda_graphs=True)
    args = TransformerTrainingArguments(output_dir="unused", use_cpu=True, fused_loss="chunked", compile_layers=True)
    assert args.fused_loss == "chunked" and args.compile_layers


def test_the_fused_loss_is_refused_under_float16s_loss_scaler():
    """The chunked loss makes its gradient in the forward pass, before the loss scaler multiplies the loss: in
    float16 its entries ((softmax - eps / V) / tokens, ~1e-9 at WMT's size) round to 0, where autocast's float32
    cross_entropy keeps them (the reference: the rows of the output matrix that get a gradient each way)."""
    from vanilla_transformer.training.trainer import TransformerTrainingArguments

    torch.manual_seed(0)
    hidden, labels = torch.randn(16, 32), torch.randint(0, 32000, (16,))
    weight = (torch.randn(32000, 32) * 0.05).requires_grad_()
    with torch.autocast("cpu", dtype=torch.float16):
        (levers.chunked_linear_cross_entropy(hidden, weight, labels, 25_000, 0.1) * 65536).backward()
    ours = (weight.grad != 0).any(dim=-1).float().mean().item()
    weight.grad = None
    logits = hidden @ weight.T
    (
        torch.nn.functional.cross_entropy(logits, labels, reduction="sum", label_smoothing=0.1) / 25_000 * 65536
    ).backward()
    assert (weight.grad != 0).any(dim=-1).all() and ours < 0.01  # every row learns; in float16 the labels' alone
    with pytest.raises(ValueError, match=r"^--fused_loss chunked with --fp16: .* --bf16"):
        TransformerTrainingArguments(output_dir="unused", use_cpu=True, fused_loss="chunked", fp16=True)


def test_fused_projections_refuse_float8_and_a_model_without_attention():
    from vanilla_transformer.training.trainer import TransformerTrainingArguments

    with pytest.raises(ValueError, match=r"^--fuse_projections with --fp8"):
        TransformerTrainingArguments(output_dir="unused", use_cpu=True, fuse_projections=True, fp8=True)
    assert TransformerTrainingArguments(output_dir="unused", use_cpu=True, fuse_projections=True).fuse_projections
    with pytest.raises(ValueError, match=r"^--fuse_projections: Linear has no"):
        levers.fuse_projections(torch.nn.Linear(2, 2))
    model = tiny_model()
    model.model.encoder.layers[0].self_attention.k_proj = torch.nn.Identity()  # as float8 replaces them
    with pytest.raises(ValueError, match=r"^--fuse_projections: the projections are Identity"):
        levers.fuse_projections(model)


@pytest.mark.parametrize("flag", ["--cuda_graphs", "--training_attention", "--fused_loss liger", "--fp8"])
def test_levers_that_need_cuda_are_refused_on_the_cpu_in_one_line_naming_the_flag(flag):
    reason = levers.refusal(flag, "cpu")
    assert reason.startswith(flag) and "\n" not in reason


def test_levers_a_cuda_card_cannot_run_are_refused_in_one_line_naming_the_card(monkeypatch):
    """On CUDA, --fp8 needs float8 matrix multiplies (compute capability 8.9+: Ada, Hopper) and --bf16_weights a
    card with bfloat16 (8.0+); an A100 and a V100 stand in for such cards (torch.cuda's answers replaced)."""
    cards = {"NVIDIA A100-SXM4-80GB": ((8, 0), True), "Tesla V100-SXM2-16GB": ((7, 0), False)}
    card = ["NVIDIA A100-SXM4-80GB"]
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: card[0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cards[card[0]][0])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: cards[card[0]][1])
    reason = levers.refusal("--fp8", "cuda")
    assert reason == (
        "--fp8 needs a GPU with float8 matrix multiplies (compute capability 8.9+), not NVIDIA A100-SXM4-80GB; "
        "leave it out."
    )
    assert levers.refusal("--bf16_weights", "cuda") is None  # an A100 has bfloat16
    card[0] = "Tesla V100-SXM2-16GB"
    reason = levers.refusal("--bf16_weights", "cuda")
    assert reason.startswith("--bf16_weights: Tesla V100-SXM2-16GB has no bfloat16") and "\n" not in reason
    assert levers.refusal("--fp8", "cuda").endswith("not Tesla V100-SXM2-16GB; leave it out.")
    cards["NVIDIA H100 80GB HBM3"], card[0] = ((9, 0), True), "NVIDIA H100 80GB HBM3"  # a card with float8
    monkeypatch.setitem(sys.modules, "torchao", None)  # torchao not installed: how to install it
    assert levers.refusal("--fp8", "cuda") == f"--fp8 needs torchao: {levers.FP8_INSTALL_HINT}."


def test_training_arguments_refuse_a_cuda_lever_on_the_cpu():
    from vanilla_transformer.training.trainer import TransformerTrainingArguments

    with pytest.raises(ValueError, match=r"^--cuda_graphs needs a CUDA GPU"):
        TransformerTrainingArguments(output_dir="unused", use_cpu=True, cuda_graphs=True)
    with pytest.raises(ValueError, match=r"^--fp8 needs a GPU with float8"):
        TransformerTrainingArguments(output_dir="unused", use_cpu=True, fp8=True)
    args = TransformerTrainingArguments(output_dir="unused", use_cpu=True)  # every lever off by default
    assert (args.compile_layers, args.cuda_graphs, args.fused_loss, args.fp8, args.training_attention) == (
        False,
        False,
        "none",
        False,
        "default",
    ) and not (args.torch_compile or args.fuse_projections)


def test_the_attention_kernel_of_training_is_chosen_by_name_and_restored():
    before = dict(attention_backends.BACKENDS)
    try:
        attention_backends.prefer_in_training("cudnn")
        for (training, use), backends in attention_backends.BACKENDS.items():
            if training:
                assert backends[0] == attention_backends.CUDNN and backends[-1] == attention_backends.MATH
                assert len(set(backends)) == len(backends)
            else:
                assert backends == before[training, use]  # decoding and evaluation keep theirs
        attention_backends.prefer_in_training("default")
        assert attention_backends.BACKENDS == before
        with pytest.raises(ValueError, match="unknown attention kernel 'fast'"):
            attention_backends.prefer_in_training("fast")
    finally:
        attention_backends.BACKENDS.update(before)


def test_compiled_layers_take_few_graphs_over_all_bucket_shapes():
    """Regional compilation with dynamic shapes: over six batch shapes (rows, source, target), the encoder
    layer and the decoder layer compile once each (a few graphs at most, however many shapes and layers),
    and the compiled layers train to the same loss and gradients as the eager ones."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    eager, compiled = tiny_model(), tiny_model()
    counter = CompileCounter()
    levers.compile_layers(compiled, backend=counter)
    shapes = [(4, 8, 8), (4, 16, 8), (2, 16, 24), (8, 8, 16), (3, 24, 24), (6, 12, 10)]
    for index, (rows, source, target) in enumerate(shapes):
        input_ids, attention_mask, labels = batch(rows, source, target, seed=index)
        for model in (eager, compiled):
            model.zero_grad()
            loss = levers.training_loss(model, inputs_of(model, input_ids, attention_mask, labels), labels, None, 0.1)
            loss.backward()
            model.loss_ = loss.detach()
        torch.testing.assert_close(compiled.loss_, eager.loss_)
    for (name, p), (_, q) in zip(eager.named_parameters(), compiled.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name, rtol=1e-4, atol=1e-6)
    assert 2 <= counter.frame_count <= 4, f"{counter.frame_count} graphs for {len(shapes)} shapes"
    assert set(compiled.state_dict()) == set(eager.state_dict())  # Module.compile keeps the names


@pytest.mark.slow  # CUDA_GRAPHS' compilations: test_torch_compile.py; compiled gradients: compile_layers' test
def test_the_whole_model_compiled_as_cuda_graphs_compiles_it_trains_like_eager():
    """--cuda_graphs' compilation (`levers.CUDA_GRAPHS`: dynamic shapes; the CUDA graphs need a GPU, test_gpu_levers)
    through AOT autograd on the CPU: over six batch shapes, equal lengths among them, one compilation of the forward
    and backward where the first batch's lengths differ (a second where they are equal: dynamo guards on the
    equality, test_torch_compile), and the same losses and gradients as eager."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager, compiled = tiny_model(), tiny_model()
    options = {key: value for key, value in levers.CUDA_GRAPHS.items() if key != "mode"}  # mode: inductor's
    forward = torch.compile(compiled, backend="aot_eager", **options)
    shapes = [(4, 16, 8), (4, 8, 8), (2, 16, 24), (8, 8, 16), (3, 24, 24), (6, 12, 10)]
    for index, (rows, source, target) in enumerate(shapes):
        input_ids, attention_mask, labels = batch(rows, source, target, seed=index)
        for model, stand_in in ((eager, None), (compiled, forward)):
            model.zero_grad()
            inputs = inputs_of(model, input_ids, attention_mask, labels)
            loss = levers.training_loss(model, inputs, labels, None, 0.1, "none", stand_in)
            loss.backward()
            model.loss_ = loss.detach()
        torch.testing.assert_close(compiled.loss_, eager.loss_)
        for (name, p), (_, q) in zip(eager.named_parameters(), compiled.named_parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=name, rtol=1e-4, atol=1e-6)
    graphs = counters["stats"]["unique_graphs"]  # what dynamo traced and handed to the compiler
    assert graphs == 1, f"{graphs} compilations for {len(shapes)} shapes"


def test_forward_and_loss_have_no_graph_break():
    """The whole training forward and the label-smoothed loss trace as one graph (torch._dynamo.explain)."""
    model = tiny_model().train()
    input_ids, attention_mask, labels = batch(2, 6, 5)
    inputs = inputs_of(model, input_ids, attention_mask, labels)

    def forward_and_loss(inputs, labels):
        return label_smoothed_cross_entropy(model(**inputs).logits, labels, None, 0.1)

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(forward_and_loss)(inputs, labels)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--cuda_graphs", "true"], "--cuda_graphs"),
        (["--fp8", "true"], "--fp8"),
        (["--training_attention", "cudnn"], "--training_attention"),
        (["--fused_loss", "liger"], "--fused_loss liger"),
    ],
)
def test_train_refuses_a_cuda_lever_on_the_cpu_in_one_line_with_status_2(flags, named, capsys, tmp_path):
    from vanilla_transformer.training import run

    argv = [
        "--train_file",
        str(tmp_path / "absent.jsonl"),
        "--preset",
        "tiny",
        "--output_dir",
        str(tmp_path / "out"),
        "--report_to",
        "none",
        "--use_cpu",
        *flags,
    ]
    with pytest.raises(SystemExit) as exit:
        run.main(argv, exit_on_bad_input=True)
    assert exit.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and named in error and "Traceback" not in error, error


@pytest.mark.parametrize("fused_loss", ["none", "chunked"])
def test_training_loss_takes_a_compiled_stand_in_for_the_model(fused_loss):
    """``forward``: the whole model (or, with a fused loss, the encoder-decoder) under torch.compile, as the
    Trainer's --torch_compile and --cuda_graphs run it; the same loss as eager."""
    torch._dynamo.reset()
    model = tiny_model().train()
    input_ids, attention_mask, labels = batch(2, 6, 5)
    inputs = inputs_of(model, input_ids, attention_mask, labels)
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()  # the eager backend computes what eager does: the count shows the stand-in ran
    compiled = torch.compile(model if fused_loss == "none" else model.model, backend=counter, dynamic=False)
    eager = levers.training_loss(model, inputs, labels, None, 0.1, fused_loss)
    torch.testing.assert_close(levers.training_loss(model, inputs, labels, None, 0.1, fused_loss, compiled), eager)
    assert counter.frame_count >= 1


def test_a_kernel_library_that_fails_to_import_refuses_its_lever_in_one_line(monkeypatch):
    """liger-kernel installed for another torch or triton can raise more than ImportError on import; the lever
    is refused naming the failure, so a benchmark skips its row instead of losing the rest."""
    import importlib.abc

    class Broken(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "liger_kernel":
                raise RuntimeError("triton 3.6.0 is not supported")
            return None

    for name in [name for name in sys.modules if name.split(".")[0] == "liger_kernel"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    assert levers.refusal("--fused_loss liger", "cuda") == (
        "--fused_loss liger: liger-kernel fails to import (RuntimeError: triton 3.6.0 is not supported); use "
        "--fused_loss chunked."
    )


# ---------------------------------------------------------------------------------------------
# --bf16_weights: the weights in bfloat16, float32 masters in the optimizer
# ---------------------------------------------------------------------------------------------


def test_float32_masters_step_as_adam_on_float32_copies_and_keep_updates_bfloat16_would_lose():
    """The reference: AdamW on float32 copies of the weights, given the bfloat16 gradients cast up, by hand; the
    model's weights are its masters rounded to bfloat16. An update below bfloat16's resolution of a weight,
    which AdamW over the bfloat16 weights themselves loses, accumulates in the masters."""
    model = tiny_model()
    levers.bfloat16_weights(model)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    reference = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    hyper = dict(lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01)
    optimizer = torch.optim.AdamW(model.parameters(), **hyper)
    levers.keep_float32_masters(optimizer)
    by_hand = torch.optim.AdamW(reference, **hyper)
    bare = [p.detach().clone().requires_grad_() for p in model.parameters()]  # bfloat16, no masters
    initial = [p.detach().clone() for p in model.parameters()]
    plain = torch.optim.AdamW(bare, **hyper)
    for step in range(3):
        input_ids, attention_mask, labels = batch(3, 7, 6, seed=step)
        loss = levers.training_loss(model, inputs_of(model, input_ids, attention_mask, labels), labels, None, 0.1)
        loss.backward()
        for p, r, b in zip(model.parameters(), reference, bare):
            r.grad, b.grad = p.grad.float(), p.grad.clone()
        optimizer.step()
        by_hand.step()
        plain.step()
        optimizer.zero_grad()  # a plain loop's idiom: the model's gradients go too, not only the masters'
        assert all(p.grad is None for p in model.parameters())
    masters = [master for _, master in optimizer.float32_masters]
    assert len(masters) == len(reference) and all(m.dtype == torch.float32 for m in masters)
    for master, r, p in zip(masters, reference, model.parameters()):
        assert torch.equal(master, r.detach())
        assert torch.equal(p.detach(), r.detach().to(torch.bfloat16))
    # AdamW over the bfloat16 weights themselves leaves many where they started (updates of ~lr below a weight's
    # resolution); the masters moved nearly all of them
    stayed = sum(int((b.detach() == start).sum()) for b, start in zip(bare, initial))
    moved = sum(int((m != start.float()).sum()) for m, start in zip(masters, initial))
    total = sum(m.numel() for m in masters)
    assert stayed > total // 4 and moved > 0.9 * total, (stayed, moved, total)


def stepped_with_float32_masters():
    """A bfloat16 model and its AdamW over float32 masters, one update made."""
    model = tiny_model()
    levers.bfloat16_weights(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    levers.keep_float32_masters(optimizer)
    input_ids, attention_mask, labels = batch(3, 7, 6)
    levers.training_loss(model, inputs_of(model, input_ids, attention_mask, labels), labels, None, 0.1).backward()
    optimizer.step()
    return model, optimizer


def test_float32_masters_travel_in_the_optimizer_state_and_refuse_a_state_without_them():
    model, optimizer = stepped_with_float32_masters()
    state = optimizer.state_dict()
    saved = state[levers.MASTER_WEIGHTS_KEY]
    assert [t.dtype for t in saved] == [torch.float32] * len(list(model.parameters()))
    other = tiny_model()  # new weights: loading the state gives it the masters and their rounding
    levers.bfloat16_weights(other)
    resumed = torch.optim.AdamW(other.parameters(), lr=1e-3)
    levers.keep_float32_masters(resumed)
    resumed.load_state_dict(state)
    for (p, m), (q, n) in zip(optimizer.float32_masters, resumed.float32_masters):
        assert torch.equal(m, n) and torch.equal(p, q)
    assert torch.equal(resumed.state_dict()["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
    without = torch.optim.AdamW(tiny_model().parameters(), lr=1e-3).state_dict()  # a float32 run's
    with pytest.raises(ValueError, match=r"^--bf16_weights: this optimizer state holds no float32 master weights"):
        resumed.load_state_dict(without)
    misshapen = {**state, levers.MASTER_WEIGHTS_KEY: [master[..., :1] for master in saved]}  # copy_ broadcasts
    with pytest.raises(ValueError, match=r"^--bf16_weights: this optimizer state holds no float32 master weights"):
        resumed.load_state_dict(misshapen)


def test_bf16_weights_in_the_trainer_resume_exactly_and_save_bfloat16_models(tmp_path):
    """`train --bf16_weights true`: the model trains in bfloat16 without autocast (--bf16's is turned off), its
    checkpoints hold the bfloat16 weights and the float32 masters (optimizer.pt), and a run resumed from one ends
    with the weights and masters of the run that went on: the reference is that uninterrupted run."""
    from safetensors.torch import load_file

    from test_train import build, reverse_pairs, write_pairs

    write_pairs(tmp_path, "train", reverse_pairs(60, seed=1))
    flags = ["--max_tokens", "200", "--bf16_weights", "true", "--save_strategy", "steps", "--save_steps", "2"]
    flags += ["--learning_rate", "0.003", "--warmup_steps", "1"]
    whole = build(tmp_path, tmp_path / "whole", *flags, "--max_steps", "4", "--bf16", "true").trainer
    assert whole.args.bf16 is False and whole.args.bf16_weights
    whole.train()
    model = whole.accelerator.unwrap_model(whole.model)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {t.dtype for t in load_file(tmp_path / "whole" / "checkpoint-4" / "model.safetensors").values()} == {
        torch.bfloat16
    }
    state = torch.load(tmp_path / "whole" / "checkpoint-4" / "optimizer.pt", weights_only=True)
    masters = state[levers.MASTER_WEIGHTS_KEY]
    assert masters[0].dtype == torch.float32
    stopped = build(tmp_path, tmp_path / "stopped", *flags, "--max_steps", "2").trainer
    stopped.train()
    resumed = build(tmp_path, tmp_path / "stopped", *flags, "--max_steps", "4", "--resume_from_checkpoint", "last")
    resumed.trainer.train(resume_from_checkpoint=str(resumed.resume))
    again = torch.load(tmp_path / "stopped" / "checkpoint-4" / "optimizer.pt", weights_only=True)
    assert all(torch.equal(a, b) for a, b in zip(again[levers.MASTER_WEIGHTS_KEY], masters))
    final = load_file(tmp_path / "stopped" / "checkpoint-4" / "model.safetensors")
    expected = load_file(tmp_path / "whole" / "checkpoint-4" / "model.safetensors")
    assert final.keys() == expected.keys() and all(torch.equal(final[k], expected[k]) for k in final)
    # the masters hold more than the model files: a resume from the bfloat16 weights alone would differ
    assert any(not torch.equal(m, m.to(torch.bfloat16).float()) for m in masters)


@pytest.mark.parametrize(
    ("given", "environment", "message"),
    [
        ({"fp16": True}, {}, r"^--bf16_weights with --fp16: "),
        ({"fsdp": "full_shard"}, {}, r"^--bf16_weights with --fsdp: "),
        ({}, {"ACCELERATE_USE_FSDP": "true"}, r"^--bf16_weights with an accelerate config with fsdp: "),
        ({}, {"ACCELERATE_USE_DEEPSPEED": "true"}, r"^--bf16_weights with an accelerate config with deepspeed: "),
        ({}, {"ACCELERATE_MIXED_PRECISION": "fp16"}, r"^--bf16_weights with accelerate's mixed precision fp16 "),
        ({"optim": "schedule_free_adamw"}, {}, r"^--bf16_weights with --optim schedule_free_adamw: "),
        ({"optim": "adalomo"}, {}, r"^--bf16_weights with --optim adalomo: "),
    ],
    ids=["fp16", "fsdp", "accelerate fsdp", "accelerate deepspeed", "accelerate fp16", "schedule-free", "lomo"],
)
def test_bf16_weights_refuse_what_they_cannot_combine_with(tmp_path, monkeypatch, given, environment, message):
    """Sharded optimizers (FSDP, DeepSpeed: by flag or by `accelerate launch --config_file`) would not hold the
    masters (FSDP 2 failed after tokenizing, swapping optimizer parameters for shards); accelerate's own mixed
    precision would put autocast back; some optimizers change the weights outside step()."""
    from vanilla_transformer.training.arguments import TransformerTrainingArguments

    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        TransformerTrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16_weights=True, **given)


def test_float32_masters_start_from_the_weights_at_the_first_step():
    """DDP broadcasts the first process's weights after the optimizer is made: the masters take the weights of
    the first step, not of the optimizer's creation."""
    model = tiny_model()
    levers.bfloat16_weights(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    levers.keep_float32_masters(optimizer)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)  # as a broadcast would change them
    broadcast = [parameter.detach().clone() for parameter in model.parameters()]
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    saved = optimizer.state_dict()[levers.MASTER_WEIGHTS_KEY]  # a checkpoint before the first step holds them too
    assert all(torch.equal(master, expected.float()) for master, expected in zip(saved, broadcast))
    optimizer.step()  # lr 0: the weights stay as the broadcast left them
    for (parameter, master), expected in zip(optimizer.float32_masters, broadcast):
        assert torch.equal(parameter, expected) and torch.equal(master, expected.float())


def test_a_bf16_weights_checkpoint_resumed_without_the_flag_goes_on_from_its_masters():
    """Resumed without --bf16_weights, the float32 model takes the saved float32 masters as its weights (not the
    bfloat16 weights of the model file), and its optimizer the moments."""
    model, optimizer = stepped_with_float32_masters()
    state = optimizer.state_dict()
    plain = tiny_model()  # float32
    resumed = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    levers.take_float32_masters(resumed)
    resumed.load_state_dict(state)
    for parameter, (_, master) in zip(plain.parameters(), optimizer.float32_masters):
        assert parameter.dtype == torch.float32 and torch.equal(parameter.detach(), master)
    assert torch.equal(resumed.state_dict()["state"][0]["exp_avg"], state["state"][0]["exp_avg"])


def test_bf16_weights_train_twice_on_one_trainer_and_a_fine_tune_of_their_model_loads_float32(tmp_path):
    """A second train() of the same trainer (the optimizer kept, inside accelerate's wrapper) goes on; the saved
    model (bfloat16, as its config says) is fine-tuned in float32, not in bfloat16 without masters."""
    from test_train import build, reverse_pairs, write_pairs

    write_pairs(tmp_path, "train", reverse_pairs(60, seed=1))
    flags = ["--max_tokens", "200", "--max_steps", "2", "--learning_rate", "0.003", "--warmup_steps", "1"]
    trainer = build(tmp_path, tmp_path / "run", *flags, "--bf16_weights", "true").trainer
    trainer.train()
    trainer.train()
    trainer.save_model(str(tmp_path / "model"))
    fine_tune = build(tmp_path, tmp_path / "fine", *flags, "--model_name_or_path", str(tmp_path / "model")).trainer
    model = fine_tune.accelerator.unwrap_model(fine_tune.model)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_the_memory_probe_reserves_the_masters_and_their_moments():
    """--memory_probe holds what the optimizer will: Adam's two moments of each weight, in the weights' dtype; with
    --bf16_weights, float32 moments and the float32 masters (12 bytes a weight, not 2 x 2); with --ema_decay, the
    moving average too."""
    from types import SimpleNamespace

    from vanilla_transformer.training.memory_check import _moment_bytes

    model = tiny_model()
    weights = sum(p.numel() for p in model.parameters())
    plain = SimpleNamespace(args=SimpleNamespace(optim="adamw_torch_fused", bf16_weights=False))
    lever = SimpleNamespace(args=SimpleNamespace(optim="adamw_torch_fused", bf16_weights=True))
    assert _moment_bytes(plain, model) == 8 * weights
    levers.bfloat16_weights(model)
    assert _moment_bytes(plain, model) == 4 * weights and _moment_bytes(lever, model) == 12 * weights
    # --ema_decay: the moving average as it is made at the first update, on top
    average = ExponentialMovingAverage(0.9)
    average.update(model)
    for trainer in (plain, lever):
        without = _moment_bytes(trainer, model)
        trainer.args.ema_decay = 0.9
        assert _moment_bytes(trainer, model) == without + sum(
            t.numel() * t.element_size() for t in average.average.values()
        )
