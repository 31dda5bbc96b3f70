"""vanilla-transformer: the Transformer of "Attention Is All You Need" as a transformers 5.x model.

Importing the package registers its classes with the Auto API (AutoConfig, AutoModel,
AutoModelForSeq2SeqLM, AutoTokenizer) and marks them for `save_pretrained` to copy their source
files next to the weights, so that saved folders also load with ``trust_remote_code=True``. It also
registers the ``"vanilla-translation"`` pipeline task (see `pipeline_vanilla_transformer`).
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.pipelines import PIPELINE_REGISTRY

from .configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from .model_card import write_model_card
from .modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
)
from .pipeline_vanilla_transformer import TASK as TRANSLATION_TASK
from .pipeline_vanilla_transformer import VanillaTranslationPipeline, check_tokenizer_matches_model
from .tokenization_vanilla_transformer import VanillaTransformerTokenizer, train_tokenizer

__version__ = "0.1.0"

AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)
AutoTokenizer.register(VanillaTransformerConfig, fast_tokenizer_class=VanillaTransformerTokenizer, exist_ok=True)

VanillaTransformerConfig.register_for_auto_class()
VanillaTransformerModel.register_for_auto_class("AutoModel")
VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
VanillaTransformerTokenizer.register_for_auto_class("AutoTokenizer")

PIPELINE_REGISTRY.register_pipeline(
    TRANSLATION_TASK, pipeline_class=VanillaTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
)

__all__ = [
    "PRESETS",
    "TRANSLATION_TASK",
    "VanillaTransformerConfig",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "VanillaTransformerTokenizer",
    "VanillaTranslationPipeline",
    "check_tokenizer_matches_model",
    "train_tokenizer",
    "write_model_card",
]
