"""GPU speed levers of training: each an option, off by default, until a GPU measurement decides it.

``python benchmarks/gpu.py --levers`` compares each against the plain step and MarianMTModel on the same
batches, and docs/benchmarks/gpu.md records what a card decided. On an H100 (2026-11-27), on the Multi30k
shape only: `compile_layers` 0.99x the plain step's time after 35 s of warm-up, the chunked loss 4.7x less
memory for 1.06x the time, no attention kernel faster than the default; the rest, and big, "not measured". Each lever is correct by a CPU test (tests/test_levers.py) or, where it
needs CUDA, by a test marked ``gpu`` (``make test-gpu``).

- `compile_layers`: regional compilation (``torch.compile`` of the repeated encoder and decoder layer,
  dynamic shapes), so that the batch shapes of a run cost a few graphs, not one each.
- ``cuda_graphs``: the Trainer's ``torch.compile`` with `CUDA_GRAPHS` (mode "reduce-overhead", dynamic shapes:
  one compilation over symbolic lengths, then a CUDA graph recorded per bucket shape), for small models whose
  update is bound by kernel launches. CUDA only.
- `chunked_linear_cross_entropy`: the pre-softmax projection (§3.4) and the label-smoothed loss (§5.4)
  a chunk of rows at a time, never holding the (tokens, vocabulary) logits; ``liger``: liger-kernel's
  fused linear cross-entropy (CUDA only, the ``liger`` extra).
- `fuse_projections`: the attention projections that read the same input as one matrix product (q, k, v of
  self-attention; k, v of the encoder output): fewer and larger kernels, the same parameters.
- `sync_free_step`: a training step that reads nothing back from the GPU: every batch keeps its attention
  masks (transformers' builder reads each mask on the host to drop an unpadded batch's) and the loss's backward
  multiplies its gradient by the incoming one without asking whether that is 1: three host reads an update
  fewer, for one multiply over the logits' gradient.
- `convert_to_fp8`: the big model's linear layers in float8 (torchao's float8 training; Hopper or newer).
- `bfloat16_weights` and `keep_float32_masters`: the weights themselves in bfloat16, no autocast (none of its
  casts of weights, activations and their gradients), float32 copies of them in the optimizer (fairseq's
  ``--bf16``).
- the attention kernel of training (`attention_backends.prefer_in_training`).
"""

from __future__ import annotations

import inspect
import logging
import os

import torch
from transformers import masking_utils

from .. import attention_backends
from ..command_line import install_command
from ..private_api import require
from ..training_kernels import check_label_smoothing, label_smoothed_cross_entropy

require("torch._foreach_copy_")  # --bf16_weights (keep_float32_masters)

logger = logging.getLogger(__name__)

FUSED_LOSSES = ("none", "chunked", "liger")
TRAINING_ATTENTION = ("default", *attention_backends.KERNELS)
# --cuda_graphs: torch.compile's options. Dynamic shapes, so that the bucket shapes of a run cost one compilation
# (two where the first batch's lengths happen to be equal: torch guards on that equality, "duck sizing") and a
# cheap CUDA graph recording each; with static shapes each bucket shape is compiled anew (the Multi30k shape's 13
# ran past 81 s on an H100, 2026-11-27). Which pays on a GPU is not measured: gpu.py --levers has both rows.
CUDA_GRAPHS = {"mode": "reduce-overhead", "dynamic": True}
FP8_INSTALL_HINT = "pip install torchao (float8 training needs a CUDA GPU of compute capability 8.9 or more)"


# ---------------------------------------------------------------------------------------------
# Checks: a lever the device cannot run is refused in one line naming its flag
# ---------------------------------------------------------------------------------------------


def refusal(flag: str, device: str | torch.device) -> str | None:
    """Why ``flag`` cannot run on ``device`` (one line naming it), or None where it can."""
    device = torch.device(device)
    if flag in ("--cuda_graphs", "--training_attention") and device.type != "cuda":
        return f"{flag} needs a CUDA GPU (the device is {device.type}); leave it out."
    if flag == "--fused_loss liger":
        if device.type != "cuda":
            return f"{flag} needs a CUDA GPU (the device is {device.type}); use --fused_loss chunked."
        try:
            import liger_kernel  # noqa: F401
        except ImportError:
            return f"{flag} needs liger-kernel (CUDA only): {install_command('liger')}; or use --fused_loss chunked."
        except Exception as error:  # installed but not importable here (a torch or triton it was not built for)
            return f"{flag}: liger-kernel fails to import ({type(error).__name__}: {error}); use --fused_loss chunked."
    if (
        flag == "--sync_free_step"
        and "allow_is_bidirectional_skip" not in inspect.signature(masking_utils.create_bidirectional_mask).parameters
    ):
        import transformers

        return (
            f"{flag} needs transformers 5.15 or newer (its mask builder's allow_is_bidirectional_skip), not "
            f"{transformers.__version__}; pip install 'transformers>=5.15', or leave it out."
        )
    if flag == "--bf16_weights" and device.type == "cuda" and not torch.cuda.is_bf16_supported(False):
        return (
            f"--bf16_weights: {torch.cuda.get_device_name(device)} has no bfloat16 (compute capability 8.0+); "
            "leave it out (--fp16 true trains in float16 autocast)."
        )
    if flag == "--fp8":
        if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
            return (
                f"--fp8 needs a GPU with float8 matrix multiplies (compute capability 8.9+), not {name}; leave it out."
            )
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            return f"--fp8 needs torchao: {FP8_INSTALL_HINT}."
        except Exception as error:  # installed but not importable here (a torch it was not built for)
            return f"--fp8: torchao fails to import ({type(error).__name__}: {error}); leave --fp8 out."
    return None


def requested(args) -> list[str]:
    """The levers that ``args`` (TransformerTrainingArguments) turn on, as their flags."""
    flags = []
    if getattr(args, "cuda_graphs", False):
        flags.append("--cuda_graphs")
    if getattr(args, "fused_loss", "none") == "liger":
        flags.append("--fused_loss liger")
    if getattr(args, "fp8", False):
        flags.append("--fp8")
    if getattr(args, "sync_free_step", False):
        flags.append("--sync_free_step")
    if getattr(args, "bf16_weights", False):
        flags.append("--bf16_weights")
    if getattr(args, "training_attention", "default") != "default":
        flags.append("--training_attention")
    return flags


def _bfloat16_weights_refusal(args) -> str | None:
    """Why --bf16_weights cannot run with these arguments, or None (the device: `refusal`)."""
    if getattr(args, "fp16", False):
        return "--bf16_weights with --fp16: the weights in bfloat16 leave no place for float16 autocast; give one."
    if getattr(args, "fp8", False):
        return "--bf16_weights with --fp8: float8 training is measured over float32 weights only; leave one out."
    launched = {
        name: os.environ.get(f"ACCELERATE_USE_{name.upper()}", "false").lower() == "true"
        for name in ("fsdp", "deepspeed")
    }  # accelerate launch --config_file with FSDP or DeepSpeed
    for name in ("fsdp", "deepspeed"):
        if getattr(args, name, None) or launched[name]:
            which = f"--{name}" if getattr(args, name, None) else f"an accelerate config with {name}"
            return (
                f"--bf16_weights with {which}: the float32 masters live in a plain optimizer (one process, or one "
                "per GPU with DDP), not in a sharded one; leave one out (it has mixed precision of its own)."
            )
    precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if precision not in ("no", ""):
        return (
            f"--bf16_weights with accelerate's mixed precision {precision} (accelerate launch --mixed_precision, or "
            "its config): the weights in bfloat16 run without autocast; launch with --mixed_precision no."
        )
    optim = str(getattr(getattr(args, "optim", ""), "value", getattr(args, "optim", "")))
    if optim.startswith("schedule_free") or "lomo" in optim or optim.endswith("layerwise"):
        return (
            f"--bf16_weights with --optim {optim}: it updates the weights outside its step() (in the backward pass, "
            "or swaps them for evaluation), where the float32 masters are not; choose an optimizer such as "
            "adamw_torch_fused."
        )
    return None


def check_levers(args) -> None:
    """Refuse, before anything runs, a lever the device cannot run; turn --cuda_graphs into the Trainer's
    ``torch_compile_mode="reduce-overhead"`` (TransformerTrainer makes its shapes dynamic, `CUDA_GRAPHS`).
    Called from TransformerTrainingArguments.__post_init__."""
    if getattr(args, "fused_loss", "none") not in FUSED_LOSSES:
        raise ValueError(f"--fused_loss must be one of {', '.join(FUSED_LOSSES)}, got {args.fused_loss!r}.")
    if getattr(args, "training_attention", "default") not in TRAINING_ATTENTION:
        raise ValueError(
            f"--training_attention must be one of {', '.join(TRAINING_ATTENTION)}, got {args.training_attention!r}."
        )
    if getattr(args, "fused_loss", "none") != "none" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(
            f"--fused_loss {args.fused_loss} runs in one process only (it calls the model past its "
            "DDP/FSDP wrapper); leave it out with several processes."
        )
    if getattr(args, "fused_loss", "none") != "none" and getattr(args, "fp16", False):
        raise ValueError(
            f"--fused_loss {args.fused_loss} with --fp16: the fused loss makes its gradient in the forward pass, "
            "before --fp16's loss scaler scales it, and in float16 most of it rounds to 0; use --bf16, or leave "
            "--fused_loss out."
        )
    compiled = getattr(args, "torch_compile", False) or getattr(args, "cuda_graphs", False)
    if getattr(args, "fused_loss", "none") != "none" and compiled:
        flag = "--cuda_graphs" if getattr(args, "cuda_graphs", False) else "--torch_compile"
        raise ValueError(
            f"--fused_loss {args.fused_loss} with {flag}: the fused loss calls the model past its compiled "
            "wrapper, so it would train uncompiled; use --compile_layers to compile with it, or leave one out."
        )
    if getattr(args, "fuse_projections", False) and getattr(args, "fp8", False):
        raise ValueError(
            "--fuse_projections with --fp8: the fused products bypass the float8 linear layers; leave one out."
        )
    device = "cpu" if args.use_cpu or not torch.cuda.is_available() else "cuda"
    for flag in requested(args):
        reason = refusal(flag, device)
        if reason:
            raise ValueError(reason)
    if getattr(args, "bf16_weights", False):
        if reason := _bfloat16_weights_refusal(args):
            raise ValueError(reason)
        args.bf16 = False  # the model computes in bfloat16 itself: no autocast around it
    if getattr(args, "cuda_graphs", False):
        args.torch_compile, args.torch_compile_mode = True, CUDA_GRAPHS["mode"]


def apply_levers(model, args) -> None:
    """What the levers change on the model before training: bfloat16 weights, float8 linears, fused projections,
    compiled layers, the attention kernel of training. Called by TransformerTrainer.__init__ (before the optimizer exists)."""
    if getattr(args, "bf16_weights", False):
        bfloat16_weights(model)
    if getattr(args, "fp8", False):
        convert_to_fp8(model)
    if getattr(args, "fuse_projections", False):
        fuse_projections(model)
    if getattr(args, "compile_layers", False):
        compile_layers(model)
    if getattr(args, "sync_free_step", False):
        sync_free_step(model)
    if getattr(args, "training_attention", "default") != "default":
        attention_backends.prefer_in_training(args.training_attention)


# ---------------------------------------------------------------------------------------------
# One product for the projections of one input
# ---------------------------------------------------------------------------------------------


def fuse_projections(model, fused: bool = True) -> None:
    """Every attention module of ``model`` computes the projections that read the same input as one matrix
    product of their stacked weights (`VanillaTransformerAttention.fused_projections`): self-attention's q, k
    and v from one product, cross-attention's k and v of the encoder output from one; decoding with a cache
    keeps the separate ones. Three products become one (with one cast of the input under autocast, and one
    product each for the gradients of the input and of the weights), at the cost of stacking the weights (a
    copy of them) at every forward. The parameters and the state dict are unchanged."""
    attention_modules = [m for m in model.modules() if hasattr(type(m), "fused_projections")]
    if not attention_modules:
        raise ValueError(f"--fuse_projections: {type(model).__name__} has no VanillaTransformerAttention modules.")
    for module in attention_modules:  # the fused product reads the weights itself: plain linear layers only
        for projection in (module.q_proj, module.k_proj, module.v_proj):
            if type(projection) is not torch.nn.Linear:
                raise ValueError(
                    f"--fuse_projections: the projections are {type(projection).__name__} (float8?), not "
                    "torch.nn.Linear, whose weights the fused product would read past them; leave it out."
                )
    for module in attention_modules:
        module.fused_projections = fused


# ---------------------------------------------------------------------------------------------
# A step that reads nothing back from the GPU
# ---------------------------------------------------------------------------------------------


def sync_free_step(model, sync_free: bool = True) -> None:
    """The encoder and decoder of ``model`` keep every batch's attention masks
    (`VanillaTransformerStack.drops_unpadded_masks` cleared): transformers' mask builder no longer reads a mask
    on the host (``padding_mask.all()``, once for the encoder's mask and once for the cross-attention's) to
    attend without one where a batch has no padding. The loss's side, ``always_scale``, is `training_loss`'s
    argument. Token batches are almost never unpadded, so the masks are the ones the step used already."""
    reason = refusal("--sync_free_step", "cpu")
    if reason:
        raise ValueError(reason)
    stacks = [m for m in model.modules() if hasattr(type(m), "drops_unpadded_masks")]
    if not stacks:
        raise ValueError(f"--sync_free_step: {type(model).__name__} has no VanillaTransformer encoder or decoder.")
    for stack in stacks:
        stack.drops_unpadded_masks = not sync_free


# ---------------------------------------------------------------------------------------------
# torch.compile of the repeated layer
# ---------------------------------------------------------------------------------------------


def layers_of(model) -> list[torch.nn.Module]:
    """The N encoder and N decoder layers (§3.1) of a VanillaTransformerForConditionalGeneration."""
    inner = getattr(model, "model", model)
    return [*inner.encoder.layers, *inner.decoder.layers]


def compile_layers(model, dynamic: bool | None = True, backend: str = "inductor", mode: str | None = None) -> None:
    """Regional compilation: ``torch.compile`` each encoder and decoder layer in place (``Module.compile``:
    the state dict keeps its names). The layers of a stack share their code, so dynamo builds one graph for
    the encoder layer and one for the decoder layer, reused by every instance; with ``dynamic=True`` the
    batch and sequence lengths are symbolic, so new bucket shapes bring no new graphs."""
    for layer in layers_of(model):
        layer.compile(dynamic=dynamic, backend=backend, mode=mode)


# ---------------------------------------------------------------------------------------------
# The pre-softmax projection and the label-smoothed loss, a chunk of rows at a time
# ---------------------------------------------------------------------------------------------


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """``label_smoothed_cross_entropy(hidden @ weight.T, labels, count, eps)`` and its gradients, computed a
    chunk of rows at a time: the logits of a chunk are made, turned into the loss and into the gradient of
    ``hidden``'s rows and of ``weight``, and dropped. The (N, V) logits never exist, in float32 or at all.

    Per row, with x = h W^T and L = log sum_v exp(x_v): loss = L - (1 - eps) x_y - eps mean_v(x_v), and
    dloss/dx = softmax(x) - (1 - eps) onehot(y) - eps / V, divided by the token count; then dh = dx W and
    dW = dx^T h. Under autocast the matrix multiplies run in its dtype, the softmax in float32.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, smoothing: float, count, chunk_rows: int):
        dtype = hidden.dtype
        if torch.is_autocast_enabled(hidden.device.type):
            dtype = torch.get_autocast_dtype(hidden.device.type)
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            ignored = labels == -100
            targets = labels.masked_fill(ignored, 0)
            row_weight = (~ignored).float() / count
            needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
            grad_hidden = torch.empty_like(hidden) if needs_grad else None
            grad_weight = torch.zeros_like(weight, dtype=torch.float32) if needs_grad else None
            total = hidden.new_zeros((), dtype=torch.float32)
            for start in range(0, h.shape[0], chunk_rows):
                rows = slice(start, start + chunk_rows)
                x = (h[rows] @ w.T).float()  # (rows, V): the only logits alive
                maximum = x.amax(dim=-1, keepdim=True)
                exp = (x - maximum).exp_()
                normalizer = exp.sum(dim=-1, keepdim=True)
                target = x.gather(1, targets[rows, None])
                loss = maximum + normalizer.log() - (1 - smoothing) * target - smoothing * x.mean(dim=-1, keepdim=True)
                weight_rows = row_weight[rows, None]
                total += (loss * weight_rows).sum()
                if needs_grad:
                    exp.mul_(weight_rows / normalizer).sub_(weight_rows * (smoothing / x.shape[-1]))
                    exp.scatter_add_(1, targets[rows, None], weight_rows * (smoothing - 1))
                    grad_logits = exp.to(dtype)
                    grad_hidden[rows] = grad_logits @ w
                    grad_weight += (grad_logits.T @ h[rows]).float()
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype) if grad_weight is not None else None)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_total, grad_weight * grad_total, None, None, None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch=None,
    label_smoothing: float = 0.0,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """`label_smoothed_cross_entropy` of the logits ``hidden @ weight.T`` (hidden (..., d), weight (V, d),
    labels (...)), without the logits: `ChunkedLinearCrossEntropy`. ``chunk_rows`` defaults to about
    2^24 logits a chunk (64 MiB in float32)."""
    check_label_smoothing(label_smoothing)
    hidden, labels = hidden.flatten(0, -2), labels.to(hidden.device).flatten()
    count = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum().clamp(min=1)
    count = count.to(hidden.device) if torch.is_tensor(count) else count
    chunk_rows = chunk_rows or max(1, 2**24 // weight.shape[0])
    return ChunkedLinearCrossEntropy.apply(hidden, weight, labels, label_smoothing, count, chunk_rows)


def liger_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch=None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The same loss by liger-kernel's fused linear cross-entropy (Triton; CUDA only): its sum over the
    tokens, divided by the count as `label_smoothed_cross_entropy` divides it."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    check_label_smoothing(label_smoothing)
    hidden, labels = hidden.flatten(0, -2), labels.to(hidden.device).flatten()
    count = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum().clamp(min=1)
    total = liger_fused_linear_cross_entropy(
        hidden, weight, labels, ignore_index=-100, label_smoothing=label_smoothing, reduction="sum"
    )
    return total / count


def training_loss(
    model,
    inputs: dict,
    labels: torch.Tensor,
    num_items_in_batch,
    label_smoothing: float,
    fused_loss: str = "none",
    forward=None,
    always_scale: bool = False,
) -> torch.Tensor:
    """The training loss of ``model`` (unwrapped) on ``inputs`` (input_ids, attention_mask,
    decoder_input_ids): with ``fused_loss`` "none" the model's logits and `label_smoothed_cross_entropy`,
    else the decoder's last hidden states and the chunked or liger loss with the pre-softmax weight.
    ``forward``: a compiled stand-in for ``model`` ("none") or ``model.model`` (the others). ``always_scale``:
    `label_smoothed_cross_entropy`'s (--sync_free_step; the chunked loss always scales, liger-kernel's backward
    reads its incoming gradient on the host whatever this says)."""
    if fused_loss == "none":
        logits = (model if forward is None else forward)(**inputs, use_cache=False).logits
        return label_smoothed_cross_entropy(logits, labels, num_items_in_batch, label_smoothing, always_scale)
    hidden = (model.model if forward is None else forward)(**inputs, use_cache=False).last_hidden_state
    loss = chunked_linear_cross_entropy if fused_loss == "chunked" else liger_linear_cross_entropy
    return loss(hidden, model.lm_head.weight, labels, num_items_in_batch, label_smoothing)


# ---------------------------------------------------------------------------------------------
# float8 matrix multiplies (Hopper and newer)
# ---------------------------------------------------------------------------------------------


def convert_to_fp8(model) -> None:
    """torchao's float8 training on the linear layers of the encoder and decoder layers (dims multiples of
    16, as its kernels need); the pre-softmax projection, tied to the embedding, stays as it is. The token
    count of a batch (the inner dimension of the weight gradients' products) is padded to a multiple of 16
    by torchao (``pad_inner_dim``): without it, layers compiled with dynamic shapes failed on an H100
    (2026-11-27, "Expected self.size(1) to be divisible by 16"), and any batch of another token count would."""
    reason = refusal(
        "--fp8",
        next(model.parameters()).device
        if next(model.parameters()).is_cuda
        else ("cuda" if torch.cuda.is_available() else "cpu"),
    )
    if reason:
        raise ValueError(reason)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def takes(module, name: str) -> bool:
        return (
            isinstance(module, torch.nn.Linear)
            and ".layers." in f".{name}"
            and module.in_features % 16 == 0
            and module.out_features % 16 == 0
        )

    convert_to_float8_training(model, module_filter_fn=takes, config=Float8LinearConfig(pad_inner_dim=True))


# ---------------------------------------------------------------------------------------------
# Weights in bfloat16, float32 masters in the optimizer (fairseq's --bf16)
# ---------------------------------------------------------------------------------------------

MASTER_WEIGHTS_KEY = "float32_master_weights"  # in the optimizer's state dict (a checkpoint's optimizer.pt)


def bfloat16_weights(model) -> None:
    """``model``'s parameters and buffers in bfloat16: it computes in bfloat16 without autocast, which casts each
    weight, the activations around every float32 operator (layer norm, softmax) and their gradients back at every
    update (`operator_count.py`: 716 operators an update of the Multi30k shape under autocast, 441 this way). The
    optimizer keeps float32 masters (`keep_float32_masters`): an update smaller than bfloat16's resolution of a
    weight (2^-8 of it) would otherwise be lost."""
    model.to(torch.bfloat16)


def keep_float32_masters(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer``, built over a model's bfloat16 parameters and not stepped yet, updates float32 copies of them
    (masters) instead: before each step the gradients are copied up into the masters', after it the masters are
    rounded into the parameters; its ``zero_grad`` clears the parameters' gradients with the masters'. Its state
    dict holds the masters (`MASTER_WEIGHTS_KEY`), so that a run resumed from a checkpoint goes on from the float32
    values, not from the bfloat16 ones the model files hold; loading a state dict without them (a checkpoint
    trained without --bf16_weights) is refused. The learning-rate scheduler and gradient clipping see the
    optimizer and the parameters as ever."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer: the one it wraps
    if getattr(optimizer, "float32_masters", None) is not None:
        return
    if optimizer.state:
        raise ValueError("keep_float32_masters: the optimizer has stepped already; give it before its first step.")
    pairs = []  # (the model's bfloat16 parameter, its float32 master)
    for group in optimizer.param_groups:
        masters = []
        for parameter in group["params"]:
            if parameter.dtype == torch.float32:  # already float32: its own master
                masters.append(parameter)
                continue
            master = torch.nn.Parameter(parameter.detach().float(), requires_grad=parameter.requires_grad)
            pairs.append((parameter, master))
            masters.append(master)
        group["params"] = masters
    optimizer.float32_masters = pairs

    fresh = [True]  # the masters take the parameters' values at the first step, unless a state dict gave them:
    # after DDP's broadcast of the first process's weights, which follows the optimizer's creation

    # One multi-tensor copy each way: on CUDA torch._foreach_copy_ converts between dtypes in a few kernels where
    # every source shares a dtype and every destination another. The masters' gradients live for the step only.
    @torch.no_grad()
    def gradients_up(optimizer, args, kwargs) -> None:
        if fresh[0]:
            torch._foreach_copy_([master for _, master in pairs], [parameter for parameter, _ in pairs])
            fresh[0] = False
        sources, targets = [], []
        for parameter, master in pairs:
            if parameter.grad is not None:  # without one (left out of this update) the step skips the master
                master.grad = torch.empty_like(master)
                sources.append(parameter.grad)
                targets.append(master.grad)
        if targets:
            torch._foreach_copy_(targets, sources)

    @torch.no_grad()
    def weights_down(optimizer, args, kwargs) -> None:
        torch._foreach_copy_([parameter for parameter, _ in pairs], [master for _, master in pairs])  # rounded
        for _, master in pairs:
            master.grad = None

    @torch.no_grad()
    def save_masters(optimizer, state_dict: dict) -> dict:
        if fresh[0]:  # before the first step: the weights as they are now (a broadcast may have changed them)
            torch._foreach_copy_([master for _, master in pairs], [parameter for parameter, _ in pairs])
        state_dict[MASTER_WEIGHTS_KEY] = [master.detach() for _, master in pairs]
        return state_dict

    @torch.no_grad()
    def load_masters(optimizer, state_dict: dict) -> dict:
        state_dict = dict(state_dict)
        saved = state_dict.pop(MASTER_WEIGHTS_KEY, None)
        if (
            saved is None
            or len(saved) != len(pairs)
            or any(master.shape != values.shape for (_, master), values in zip(pairs, saved))
        ):
            raise ValueError(
                "--bf16_weights: this optimizer state holds no float32 master weights for the model's "
                f"{len(pairs)} bfloat16 parameters (it was saved by a run without --bf16_weights, or of another "
                "model): resume it as it was trained, or start from its weights with --model_name_or_path."
            )
        for (parameter, master), values in zip(pairs, saved):
            master.copy_(values)
            parameter.copy_(master)  # what the checkpoint's model file holds already, rounded alike
        fresh[0] = False
        return state_dict

    zero_masters = optimizer.zero_grad

    def zero_grad(set_to_none: bool = True) -> None:  # the idiom `optimizer.zero_grad()` clears the model's too
        zero_masters(set_to_none)
        for parameter, _ in pairs:
            if set_to_none:
                parameter.grad = None
            elif parameter.grad is not None:
                parameter.grad.detach_().zero_()

    optimizer.zero_grad = zero_grad
    optimizer.register_step_pre_hook(gradients_up)
    optimizer.register_step_post_hook(weights_down)
    optimizer.register_state_dict_post_hook(save_masters)
    optimizer.register_load_state_dict_pre_hook(load_masters)


def take_float32_masters(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer``, over float32 weights, loading the state of a --bf16_weights run (a checkpoint resumed without
    the flag): the float32 masters saved with it become the weights, so that training goes on from them rather
    than from the bfloat16 weights of the checkpoint's model file; said in the log."""
    optimizer = getattr(optimizer, "optimizer", optimizer)

    @torch.no_grad()
    def take(optimizer, state_dict: dict) -> dict | None:
        if MASTER_WEIGHTS_KEY not in state_dict:
            return None
        state_dict = dict(state_dict)
        saved = state_dict.pop(MASTER_WEIGHTS_KEY)
        parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
        if len(saved) != len(parameters) or any(p.shape != v.shape for p, v in zip(parameters, saved)):
            raise ValueError(
                f"this optimizer state holds float32 master weights of {len(saved)} tensors (a --bf16_weights run) "
                f"that do not match the model's {len(parameters)} parameters: resume it with the model it trained."
            )
        for parameter, values in zip(parameters, saved):
            parameter.copy_(values)
        logger.info(
            "resuming a --bf16_weights checkpoint without the flag: its float32 master weights are the weights "
            "now, and training goes on in float32"
        )
        return state_dict

    optimizer.register_load_state_dict_pre_hook(take)


__all__ = [
    "CUDA_GRAPHS",
    "FUSED_LOSSES",
    "TRAINING_ATTENTION",
    "ChunkedLinearCrossEntropy",
    "MASTER_WEIGHTS_KEY",
    "apply_levers",
    "bfloat16_weights",
    "check_levers",
    "chunked_linear_cross_entropy",
    "compile_layers",
    "convert_to_fp8",
    "fuse_projections",
    "keep_float32_masters",
    "layers_of",
    "liger_linear_cross_entropy",
    "refusal",
    "requested",
    "sync_free_step",
    "take_float32_masters",
    "training_loss",
]
