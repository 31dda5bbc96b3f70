"""Share a model on the Hub: the model folder's own files, never the training run around them.

A run's output folder holds the model (weights, config, generation config, tokenizer, card, and the
code that loads it without the package) next to what only training needs: ``checkpoint-*/`` folders
(weights, optimizer state and moving average, several times the model's size each), a second copy of
the tokenizer in ``tokenizer/``, ``trainer_state.json``, ``*_results.json``, TensorBoard logs.
`publish` uploads the first kind, in one commit, and names every file it leaves out in the log.

All or nothing: the files go up as one commit, so a reader of the repository sees the model before or
after it, never weights without their config. A connection that breaks off is retried (`retries`
times, waiting 1, 2, 4, ... seconds; huggingface_hub retries its own preparatory requests, not the
commit); a retry, or running the command again after it gave up, completes the repository, and a
commit whose answer was lost is not made twice (huggingface_hub leaves out files the repository
already holds, and commits nothing when that is all of them). Weight files of an earlier publish
that this one does not replace (``model.safetensors`` where the weights now come in shards) are
deleted in the same commit: from_pretrained would otherwise read them with the new config; so are the
training files a Trainer's pushes during training left there (training_args.bin, ``runs/``, ``tokenizer/``),
and an earlier card where the folder has none.

The card goes up naming the task and this package in its metadata (`card_to_publish`), whoever wrote
it: ``Seq2SeqTrainer.create_model_card``, as transformers' run_translation.py calls it, writes the
model's tags only when it pushes to the Hub itself.

    vanilla-transformer publish runs/en-de --repo-id you/transformer-en-de [--private]

    from vanilla_transformer.publish import publish
    publish("runs/en-de", "you/transformer-en-de")
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from fnmatch import fnmatch
from pathlib import Path

from .checkpoint_files import (
    TOKENIZER_FILES,
    check_has_tokenizer,
    check_model_folder,
    warn_if_an_average_is_beside,
    weight_files,
)
from .command_line import CommandParser
from .pipeline_vanilla_transformer import check_tokenizer_matches_model

logger = logging.getLogger(__name__)

# What from_pretrained reads: the model, its decoding settings, the tokenizer (ours, or a converted
# MarianMT's sentencepiece files), the card.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    *TOKENIZER_FILES,
    "README.md",
)
RETRIES = 5  # after the first try: waits of 1, 2, 4, 8, 16 seconds, about half a minute in all
RETRY_STATUS = (408, 429, 500, 502, 503, 504)  # the answers huggingface_hub's own retries take as passing


def model_files(folder: str | Path) -> list[str]:
    """The files of ``folder`` that make up the model: `MODEL_FILES` and weight shards where present, and
    the Python files its ``auto_map`` and ``custom_pipelines`` name and the files they import (the code
    that loads it without the package). Top level only: nothing of ``checkpoint-*/`` or ``tokenizer/``."""
    folder = Path(folder)
    names = {name for name in MODEL_FILES if (folder / name).is_file()}
    names |= {path.name for path in folder.glob("model-*-of-*.safetensors")}
    names |= {path.name for path in weight_files(folder)}  # the weights from_pretrained reads (pytorch_model.bin)
    return sorted(names | {f"{module}.py" for module in _code_modules(folder)})


def _code_modules(folder: Path) -> set[str]:
    """Modules named by the config's and the tokenizer's ``auto_map`` and the config's pipelines."""
    references = []
    for name in ("config.json", "tokenizer_config.json"):
        if (folder / name).is_file():
            saved = json.loads((folder / name).read_text(encoding="utf-8"))
            for value in saved.get("auto_map", {}).values():
                references += value if isinstance(value, list) else [value]
            references += [task.get("impl") for task in saved.get("custom_pipelines", {}).values()]
    modules = {reference.split("--")[-1].rsplit(".", 1)[0] for reference in references if reference}
    modules = {module for module in modules if (folder / f"{module}.py").is_file()}
    # and the files those import relatively (the generation module, attention_backends.py...), as
    # from_pretrained(trust_remote_code=True) will fetch them
    from transformers.dynamic_module_utils import get_relative_import_files

    for module in list(modules):
        modules |= {Path(path).stem for path in get_relative_import_files(str(folder / f"{module}.py"))}
    return modules


def card_to_publish(folder: str | Path, repo_id: str | None = None) -> bytes | None:
    """``README.md`` of ``folder`` with the package's tags (`MODEL_TAGS`: the task, the package, custom code)
    added to its metadata, and, given the ``repo_id`` it goes to, that id in the usage examples and the
    model-index name where `write_model_card` wrote the folder's (``<user>/FOLDER``, ``FOLDER``); None when it
    needs neither (it is uploaded as it is) or there is no card. A card whose metadata does not parse is refused
    naming the file.

    transformers' ``Trainer.create_model_card`` takes tags from its ``tags`` argument only, and scripts
    such as run_translation.py give none: the model's ``model_tags`` reach the card only through
    ``push_to_hub``. The folder's own file is left as it is."""
    from huggingface_hub import ModelCard

    from .modeling_vanilla_transformer import MODEL_TAGS

    path = Path(folder) / "README.md"
    if not path.is_file():
        return None
    written = text = path.read_text(encoding="utf-8")
    name = Path(folder).resolve().name
    if repo_id is not None:  # the examples a reader copies load the repository, not a placeholder
        text = text.replace(f"<user>/{name}", repo_id)
    try:
        card = ModelCard(text)
    except Exception as error:  # yaml's errors, or huggingface_hub's ValueError for metadata that is no mapping
        raise ValueError(
            f"{path}: its metadata (the YAML between the --- lines at the top) does not parse "
            f"({_one_line(error)}); fix it, or delete the file to publish without a card."
        ) from None
    changed = text != written
    if repo_id is not None and card.data.model_name == name and name != repo_id.rsplit("/", 1)[-1]:
        card.data.model_name = repo_id.rsplit("/", 1)[-1]  # the model-index entry, as the Hub lists it
        card.text = card.text.replace(f"# {name}\n", f"# {card.data.model_name}\n", 1)
        changed = True
    tags = list(card.data.tags or [])
    if not changed and all(tag in tags for tag in MODEL_TAGS):
        return None
    card.data.tags = tags + [tag for tag in MODEL_TAGS if tag not in tags]
    return str(card).encode("utf-8")


def check_publishable(folder: str | Path) -> list[str]:
    """The files `publish` would upload; an error naming the fix when the folder is no complete model."""
    what = f"MODEL_DIR {folder}"
    if not Path(folder).is_dir():  # publish uploads a folder on this disk: a name is never a Hub id here
        raise FileNotFoundError(f"{what} is not a folder; give the folder a training run saved its final model in.")
    check_model_folder(folder, what, remedy="Give the folder a training run saved its final model in.")
    check_has_tokenizer(
        folder,
        what,
        "Save the tokenizer next to the model (tokenizer.save_pretrained(MODEL_DIR)); "
        "a run's own output folder has it.",
    )
    check_tokenizer_belongs(folder, what)
    card_to_publish(folder)  # a card whose metadata does not parse: refused now, not after the upload began
    warn_if_an_average_is_beside(folder, "MODEL_DIR", done="published")
    return model_files(folder)


def check_tokenizer_belongs(folder: str | Path, what: str) -> None:
    """A tokenizer of the ``tokenizers`` library (tokenizer.json: ours and most) that loads and that the model can
    read (`check_tokenizer_matches_model`). Sentencepiece tokenizers (a converted MarianMT's) are left to their
    library, which the package does not need."""
    if not (Path(folder) / "tokenizer.json").is_file():
        return
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer, config = AutoTokenizer.from_pretrained(folder), AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise ValueError(f"{what}: its tokenizer or config does not load ({error}); save them again.") from None
    try:
        check_tokenizer_matches_model(tokenizer, config)
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None


def check_repo_id(repo_id: str) -> None:
    """A name the Hub can hold, checked by huggingface_hub's own rule before anything is read or sent."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ValueError(
            f"--repo-id {repo_id!r} is not a Hub repository name: give OWNER/NAME (or NAME, in your own namespace), "
            "each of letters, digits, '-', '_' and '.', not starting or ending in '-' or '.', at most 96 "
            "characters, and not ending in '.git'."
        ) from None


def publish(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str = "Upload model",
    token: str | None = None,
    retries: int = RETRIES,
) -> str:
    """Upload the model files of ``folder`` (`model_files`) to ``repo_id`` in one commit, creating the
    repository if needed; the URL of the commit. The rest of the folder stays where it is. A broken
    connection is retried up to ``retries`` times; then a `ConnectionError` says to run it again."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, constants

    folder = Path(folder)
    files = check_publishable(folder)
    if constants.HF_HUB_OFFLINE:  # chosen, not a connection that broke: nothing to retry
        raise ConnectionError(
            f"HF_HUB_OFFLINE is set, so nothing can be uploaded to {repo_id}: publish where the Hub is reachable, "
            "with HF_HUB_OFFLINE unset."
        )
    left_out = sorted(path.name + ("/" if path.is_dir() else "") for path in folder.iterdir() if path.name not in files)
    if left_out:
        logger.info(f"not uploaded (training state and duplicates): {', '.join(left_out)}")
    contents: dict[str, Path | bytes] = {name: folder / name for name in files}
    if (card := card_to_publish(folder, repo_id)) is not None:
        contents["README.md"] = card
        logger.info(f"README.md: the card names {repo_id} and the tags of the task and the package")
    api = HfApi(token=token)
    for attempt in range(retries + 1):
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            if private and not api.repo_info(repo_id).private:  # create_repo leaves an existing repo as it is
                raise ValueError(
                    f"--private: {repo_id} exists and is public, and publishing does not change that; make it "
                    "private in its settings on the Hub first, or leave --private out to publish it publicly."
                )
            if revision is not None and not revision.startswith("refs/pr/"):  # a commit goes to an existing
                api.create_branch(repo_id, branch=revision, exist_ok=True)  # branch only: made from main if new
            in_repository = api.list_repo_files(repo_id, revision=revision)
            stale = stale_weights(in_repository, contents) + stale_files(in_repository, contents, left_out)
            commit = api.create_commit(  # new operations each time: a commit marks its own as used
                repo_id,
                [CommitOperationAdd(path_in_repo=name, path_or_fileobj=content) for name, content in contents.items()]
                + [CommitOperationDelete(path_in_repo=name, is_folder=False) for name in stale],
                commit_message=commit_message,
                revision=revision,
            )
            return commit.commit_url
        except Exception as error:
            if not connection_broke(error):
                raise
            if attempt == retries:
                raise ConnectionError(
                    f"uploading to {repo_id} broke off {retries + 1} times (last: {_one_line(error)}); a publish "
                    "commits all its files or none, so run the same command again to complete it."
                ) from error
            logger.warning(
                f"uploading to {repo_id} broke off ({_one_line(error)}); retry {attempt + 1} of {retries} "
                f"in {2**attempt} s"
            )
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


def stale_weights(in_repository: list[str], uploading) -> list[str]:
    """Weight files of an earlier publish that this one does not replace (e.g. ``model.safetensors`` when
    the new weights come in shards): deleted in the same commit, since from_pretrained would read them
    with the new config."""
    weights = [
        name
        for name in in_repository
        if "/" not in name
        and (name in ("model.safetensors", "model.safetensors.index.json") or fnmatch(name, "model-*-of-*.safetensors"))
    ]
    return sorted(name for name in weights if name not in uploading)


def stale_files(in_repository: list[str], uploading, left_out: list[str]) -> list[str]:
    """Files of the repository that this folder holds but does not publish (``left_out``: training state and
    duplicates, such as training_args.bin, ``runs/``, ``tokenizer/``), which a Trainer's pushes during training
    (``--push_to_hub``) uploaded with the whole folder; and an earlier model's card where this folder has none
    (it would describe other weights). Deleted in the same commit. Checkpoint folders, which
    ``--hub_strategy checkpoint`` and ``all_checkpoints`` push on purpose, stay."""
    leftovers = {name.rstrip("/") for name in left_out if not fnmatch(name.rstrip("/"), "checkpoint-*")}
    stale = [name for name in in_repository if name.split("/", 1)[0] in leftovers and name not in uploading]
    if "README.md" in in_repository and "README.md" not in uploading:
        stale.append("README.md")
    return sorted(stale)


def connection_broke(error: BaseException) -> bool:
    """Whether ``error`` is a connection that failed or broke off, or an answer asking to try again: what
    huggingface_hub's own retries pass (its HTTP library's network, timeout and protocol errors)."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError):
        return error.response is not None and error.response.status_code in RETRY_STATUS
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    return any(
        kind.__name__ in {"NetworkError", "TimeoutException", "RemoteProtocolError"}
        and kind.__module__.split(".")[0].startswith("httpx")
        for kind in type(error).__mro__
    )


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def build_parser(prog: str = "vanilla-transformer publish") -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        epilog="Every flag is also accepted with underscores (--repo_id).",
    )
    parser.add_argument("model_dir", help="a model folder: a training run's --output_dir, or save_pretrained's")
    parser.add_argument("--repo-id", required=True, help="the Hub repository, e.g. you/transformer-en-de")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--revision", help="the branch to commit to, created from main if new (default: main)")
    parser.add_argument("--commit-message", default="Upload model", help="the commit's message")
    parser.add_argument("--dry-run", action="store_true", help="list the files that would be uploaded, upload nothing")
    parser.add_argument(
        "--retries",
        type=int,
        default=RETRIES,
        help="retry a broken connection this many times, waiting 1, 2, 4, ... s (default: %(default)s)",
    )
    return parser


def main(argv=None, prog: str = "vanilla-transformer publish") -> str:
    """``vanilla-transformer publish``: prints the files and the commit's URL (or, with --dry-run, the files)."""
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if args.retries < 0:
        raise ValueError(f"--retries must be 0 or more, got {args.retries}.")
    check_repo_id(args.repo_id)
    files = check_publishable(args.model_dir)
    if "README.md" not in files:  # e.g. an average: its Hub page would say nothing of what it is
        logger.warning(
            f"MODEL_DIR {args.model_dir} has no model card (README.md): its Hub page will name no languages, task "
            "or scores, and a card the repository holds (another model's) is deleted; write one first "
            "(vanilla_transformer.write_model_card, docs/hub.md)"
        )
    if args.dry_run:
        print("\n".join(files))
        return ""
    url = publish(
        args.model_dir,
        args.repo_id,
        private=args.private or None,
        revision=args.revision,
        commit_message=args.commit_message,
        retries=args.retries,
    )
    print(f"uploaded {len(files)} files ({', '.join(files)}) to {args.repo_id}: {url}")
    return url


if __name__ == "__main__":
    import sys

    from vanilla_transformer.cli import run_command

    run_command("publish", sys.argv[1:])
