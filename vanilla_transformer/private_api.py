"""Every private member of transformers, accelerate and torch that this package uses, in one list.

The libraries may rename or drop these between releases without notice. Each entry names the member, the
releases it was found in (read from the released wheels on 2026-11-26; the test suite checks the installed
ones, in the newest environment and in the floor one of ``make test``), what uses it, and what happens
where it is missing. `require` turns a missing member into an ``ImportError`` that names the package, the
installed version and the tested range, at import time, instead of an ``AttributeError`` deep in a call.

Every module that uses a member without a fallback calls `require` for it at import, right after its
imports (``tests/test_private_api.py`` checks this against a scan of the source): a model file as
``from .private_api import require`` (this file is flat and transformers-free, and is copied next to the
weights with the model files), the training code as ``from ..private_api import require``. A member with a
fallback is not required: where it is missing, the package does what ``fallback`` says.

Hooks that transformers looks for on the model and does without (``_reorder_cache``: without it, beam search
reorders the whole cache through the cache's own ``reorder_cache``) are defined by the package, not used from
transformers, and not listed.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

# The oldest and the newest release of each package that the test suite runs against (`make test`).
TESTED = {
    "transformers": ("5.10.1", "5.24.0"),
    "accelerate": ("1.3.0", "1.15.0"),
    "torch": ("2.7.0", "2.13.0"),
}


@dataclass(frozen=True)
class PrivateMember:
    """``path``: module, class, member (``"transformers.Trainer._save"``). A member that instances get in a
    method (``self._models = ...``) is checked in that method's source, named by ``set_in``."""

    path: str
    known_in: str  # the releases it was found in
    used_by: str
    fallback: str  # what the package does where it is missing
    set_in: str | None = None

    @property
    def package(self) -> str:
        return self.path.split(".")[0]

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[1]

    def exists(self) -> bool:
        owner_path, name = self.path.rsplit(".", 1)
        try:
            if self.set_in is not None:
                return f"{name} " in inspect.getsource(_resolve(self.set_in)).replace("=", " ").replace('"', " ")
            return hasattr(_resolve(owner_path), name)
        except (ImportError, AttributeError, OSError, TypeError):
            return False


def _resolve(path: str):
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            target = getattr(target, attribute)
        return target
    raise ImportError(path)


NO_FALLBACK = "none: the feature fails with require()'s message"
T5 = "transformers 5.0.0 - 5.24.0"

PRIVATE_MEMBERS: tuple[PrivateMember, ...] = (
    # --- decoding (generation_vanilla_transformer.py): the paper's beam search on GenerationMixin's parts
    PrivateMember(
        "transformers.GenerationMixin._beam_search",
        T5,
        "generation: generate() routes beam search to the model's own search",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.GenerationMixin._check_early_stop_heuristic",
        T5,
        "generation: beam search, length penalty (GNMT)",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.GenerationMixin._update_finished_beams",
        T5,
        "generation: beam search, length penalty (GNMT)",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.GenerationMixin._valid_auto_compile_criteria",
        "transformers 5.10.1 - 5.24.0",
        "generation: beam search over a static cache compiles its step where transformers would for greedy search",
        "beam search over a static cache runs uncompiled, as transformers' own",
    ),
    PrivateMember(
        "transformers.GenerationMixin._prefill",
        "transformers 5.10.1 - 5.24.0",
        "generation: compiled beam search over a static cache, the first step left uncompiled (overridden)",
        "beam search over a static cache runs uncompiled, as transformers' own",
    ),
    PrivateMember(
        "transformers.PreTrainedModel._default_compile_config",
        "transformers 5.10.1 - 5.24.0",
        "generation: compiled beam search over a static cache, transformers' CompileConfig for the device",
        "CompileConfig()'s defaults (CUDA graphs)",
    ),
    PrivateMember(
        "transformers.GenerationConfig._get_default_generation_params",
        "transformers 5.24.0",
        "configuration: names the generation settings a model config drops",
        "no warning: the settings are dropped as transformers does",
    ),
    # --- the model (modeling_vanilla_transformer.py, visualization.py, training/run.py)
    PrivateMember(
        "transformers.PreTrainedModel._resize_token_embeddings",
        T5,
        "modeling: resize_token_embeddings with separate source and target vocabularies",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.PreTrainedModel._get_resized_embeddings",
        T5,
        "modeling: resize_token_embeddings with separate source and target vocabularies",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.PreTrainedModel._get_resized_lm_head",
        T5,
        "modeling: resize_token_embeddings with separate source and target vocabularies",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.PreTrainedModel._from_config",
        T5,
        "training/run.py: a new model with a chosen attention implementation",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.PretrainedConfig._attn_implementation",
        T5,
        "modeling, generation, attention_backends.py, visualization.py: the attention implementation in use",
        NO_FALLBACK,
    ),
    # --- training (training/trainer.py, training/checkpointing.py)
    PrivateMember(
        "transformers.Trainer._save_checkpoint",
        T5,
        "training/checkpointing.py: checkpoints written under a temporary name",
        NO_FALLBACK,
    ),
    PrivateMember("transformers.Trainer._get_output_dir", T5, "training/checkpointing.py", NO_FALLBACK),
    PrivateMember(
        "transformers.Trainer._push_from_checkpoint", T5, "training/checkpointing.py: push_to_hub", NO_FALLBACK
    ),
    PrivateMember(
        "transformers.Trainer._save",
        T5,
        "training/checkpointing.py: no non-finite weights; the final model under FSDP",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.Trainer._issue_warnings_after_load",
        T5,
        "training/trainer.py: a resumed checkpoint's tied weights are not called missing",
        "transformers warns that the tied aliases of the embedding matrix are missing (they are tied again)",
    ),
    PrivateMember(
        "transformers.Trainer._load_optimizer_and_scheduler",
        T5,
        "training/checkpointing.py: --ema_decay on resume",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.Trainer._remove_unused_columns", T5, "training/trainer.py: --max_tokens batches", NO_FALLBACK
    ),
    PrivateMember(
        "transformers.Trainer._get_collator_with_removed_columns",
        T5,
        "training/trainer.py: --max_tokens batches",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.Trainer._get_eval_sampler",
        T5,
        "training/trainer.py: evaluation and prediction decode the sentences sorted by length",
        "evaluation and prediction decode in the dataset's order (the same results, more padding)",
    ),
    PrivateMember(
        "transformers.Trainer._created_lr_scheduler",
        T5,
        "training/trainer.py: the paper's schedule (eq. 3) as the Trainer's own",
        NO_FALLBACK,
        set_in="transformers.Trainer.create_scheduler",
    ),
    PrivateMember(
        "transformers.Seq2SeqTrainer._gen_kwargs",
        T5,
        "training/trainer.py: evaluation with num_return_sequences",
        "read with getattr: without it, the model's generation_config decides",
        set_in="transformers.Seq2SeqTrainer.evaluate",
    ),
    PrivateMember(
        "accelerate.Accelerator._models",
        "accelerate 1.0.0 - 1.15.0",
        "training/trainer.py: evaluation without training under FSDP",
        NO_FALLBACK,
        set_in="accelerate.Accelerator.__init__",
    ),
    PrivateMember(
        "transformers.Trainer._load_callback_state",
        T5,
        "training/trainer.py: --restore_callback_states_from_checkpoint keeps the run's own callbacks and their order",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.Trainer._build_accelerator_args",
        "transformers 5.10.1 - 5.24.0",
        "training/trainer.py: --torch_compile with token batches compiles static shapes, --cuda_graphs dynamic ones",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.HfArgumentParser._parse_dataclass_field",
        "transformers 5.10.1 - 5.24.0",
        "training/options.py: train --help in groups",
        NO_FALLBACK,
    ),
    PrivateMember(
        "transformers.Trainer._get_grad_norm",
        "transformers 5.10.1 - 5.24.0",
        "training/divergence.py: the gradient norm of each update, checked for non-finite values",
        "none needed: without the hook, divergence is detected from the loss alone",
    ),
    PrivateMember(
        "torch._foreach_lerp_",
        "torch 2.7.0 - 2.13.0",
        "training/moving_average.py: the moving average's update, one fused call",
        NO_FALLBACK,
    ),
    PrivateMember(
        "torch._foreach_copy_",
        "torch 2.7.0 - 2.13.0",
        "training/levers.py: --bf16_weights' copies between the weights and their float32 masters, one fused call "
        "each way on CUDA",
        NO_FALLBACK,
    ),
    # --- torch (cpu_decoding.py): prepacked weights for decoding on the CPU, opt-in
    PrivateMember(
        "torch.ops.mkldnn._linear_pointwise",
        "torch 2.7.0 - 2.13.0",
        "cpu_decoding.py: prepacked weights",
        "checked once (onednn_linear_works): plain weights",
    ),
    PrivateMember(
        "torch.ops.mkldnn._reorder_linear_weight",
        "torch 2.7.0 - 2.13.0",
        "cpu_decoding.py: prepacked weights",
        "checked once (onednn_linear_works): plain weights",
    ),
    PrivateMember(
        "torch.Tensor._version",
        "torch 2.7.0 - 2.13.0",
        "cpu_decoding.py: a weight changed in place since it was packed is packed again",
        NO_FALLBACK,
    ),
)

# Private names of other objects, read with a default, that need no check: a cache's `_is_user_defined`
# (generation: a cache the caller passed is left to transformers' loop), a tokenizer's `_build_translation_inputs`
# (pipeline: src_lang/tgt_lang, refused with a ValueError where missing) and datasets' `Dataset._fingerprint`
# (training/data.py: cache keys, set on every Dataset since datasets 2).
DUCK_TYPED = ("_is_user_defined", "_build_translation_inputs", "_fingerprint")

_BY_PATH = {member.path: member for member in PRIVATE_MEMBERS}


def _installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def missing(members=PRIVATE_MEMBERS) -> list[PrivateMember]:
    """The listed members that the installed packages lack."""
    return [member for member in members if not member.exists()]


def require(*paths: str) -> None:
    """Raise ``ImportError`` unless every listed private member (by path) exists in the installed packages.

    The message names each missing member, the package's installed version and the tested range.
    """
    unknown = [path for path in paths if path not in _BY_PATH]
    if unknown:
        raise KeyError(f"not in vanilla_transformer.private_api.PRIVATE_MEMBERS: {unknown}; list them there first")
    absent = missing([_BY_PATH[path] for path in paths])
    if absent:
        lines = []
        for member in absent:
            floor, newest = TESTED.get(member.package, ("?", "?"))
            lines.append(
                f"{member.path} (found in {member.known_in}) is missing from {member.package} "
                f"{_installed(member.package)}; used by {member.used_by}. Tested: {member.package} {floor} - {newest}."
            )
        fixes = [
            f"'{package}>={TESTED[package][0]},<={TESTED[package][1]}'"
            for package in sorted({member.package for member in absent})
        ]
        raise ImportError(
            "vanilla-transformer needs private members that the installed packages do not have:\n  "
            + "\n  ".join(lines)
            + "\nInstall a tested version: pip install "
            + " ".join(fixes)
        )


__all__ = ["DUCK_TYPED", "PRIVATE_MEMBERS", "TESTED", "PrivateMember", "missing", "require"]
