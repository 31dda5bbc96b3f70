"""sacreBLEU and chrF in one `evaluate` metric that loads offline.

``evaluate.load("sacrebleu")`` fetches its script from the Hub, so it fails without a network.
This file is a complete `evaluate` metric module; `evaluate.load` accepts it by path, and
`vanilla_transformer.training.metrics.load_translation_metric()` does that for you::

    metric = evaluate.load(".../vanilla_transformer/training/bleu_chrf.py")
    metric.compute(predictions=["Ein Hund rennt."], references=["Ein Hund läuft."])
    # {"bleu": ..., "chrf": ..., "bleu_signature": "nrefs:1|case:mixed|...", "chrf_signature": ...}

References: one string per prediction, or a list of strings (several references). With
``compound_split_bleu=True`` it also reports ``tokenized_bleu``, BLEU as the paper was scored
(tensor2tensor's ``get_ende_bleu.sh``): hypotheses and references Moses-tokenized (sacremoses,
``escape=False``), hyphenated compounds split as ``a ##AT##-##AT## b``, then corpus BLEU on those
tokens (sacreBLEU with ``tokenize="none"`` and no smoothing, the computation of ``multi-bleu.perl``). Only that
number is comparable with the paper's 27.3 / 28.4; report sacreBLEU for everything else.

`evaluate` copies this file into its module cache and imports it there, so it imports nothing
from the package.
"""

import re

import datasets
import evaluate
import sacrebleu

_DESCRIPTION = "Corpus sacreBLEU and chrF with their signatures (and, on request, the paper's tokenized BLEU)."
_KWARGS_DESCRIPTION = """
Args:
    predictions: list of hypotheses (str).
    references: list of references, one str or a list of str per prediction.
    tokenize: sacreBLEU tokenizer (default "13a"; "intl", "zh", "ja-mecab", "char", ...).
    lowercase: case-insensitive BLEU.
    compound_split_bleu: also compute "tokenized_bleu" as the paper did (Moses tokenizer + ##AT## splits).
    language: language of the hypotheses, for the Moses tokenizer (default "de").
Returns:
    bleu, chrf: corpus scores (0-100); bleu_signature, chrf_signature: how they were computed;
    tokenized_bleu: with compound_split_bleu=True.
"""
_CITATION = """@inproceedings{post-2018-call, title = "A Call for Clarity in Reporting {BLEU} Scores",
author = "Post, Matt", booktitle = "Proceedings of the Third Conference on Machine Translation", year = "2018"}"""

COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(text: str, moses_tokenizer) -> str:
    """tensor2tensor's get_ende_bleu.sh: Moses tokenization, then ``a-b`` -> ``a ##AT##-##AT## b``."""
    tokenized = moses_tokenizer.tokenize(text, return_str=True, escape=False)
    # One pass, as perl's s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g: matches do not overlap, so "a-b-c" keeps its
    # second hyphen. (Repeating until nothing matches never ends: the "#-#" it writes matches again.)
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class BleuChrf(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
                ),
            ],
            reference_urls=["https://github.com/mjpost/sacrebleu"],
        )

    def _compute(
        self, predictions, references, tokenize=None, lowercase=False, compound_split_bleu=False, language="de"
    ):
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} references: they must align.")
        references = [[r] if isinstance(r, str) else list(r) for r in references]
        counts = {len(r) for r in references}
        if len(counts) > 1:
            raise ValueError(f"Every prediction needs the same number of references, got {sorted(counts)}.")
        streams = [list(stream) for stream in zip(*references)]  # sacreBLEU: one list per reference set
        bleu, chrf = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase), sacrebleu.metrics.CHRF()
        result = {
            "bleu": bleu.corpus_score(predictions, streams).score,
            "chrf": chrf.corpus_score(predictions, streams).score,
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()),
        }
        if compound_split_bleu:
            from sacremoses import MosesTokenizer

            moses = MosesTokenizer(lang=language)
            split = [split_compounds(p, moses) for p in predictions]
            split_streams = [[split_compounds(r, moses) for r in stream] for stream in streams]
            # multi-bleu.perl smooths nothing (an n-gram order without a match gives 0; sacreBLEU's default
            # "exp" smoothing gave small sets a positive score) and lowercases with -lc
            paper = sacrebleu.metrics.BLEU(tokenize="none", force=True, smooth_method="none", lowercase=lowercase)
            result["tokenized_bleu"] = paper.corpus_score(split, split_streams).score
        return result
