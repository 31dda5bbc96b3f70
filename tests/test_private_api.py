"""The list of private transformers/accelerate/torch members the package uses: complete, and present.

Runs in both environments of `make test` (newest and floor versions): each listed member must exist in
the installed packages. The completeness check reads the package's source independently of the list.
"""

import ast
import importlib.util
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import transformers

from vanilla_transformer import private_api
from vanilla_transformer.private_api import DUCK_TYPED, PRIVATE_MEMBERS, TESTED, PrivateMember, missing, require

pytestmark = pytest.mark.floor

PACKAGE = Path(private_api.__file__).parent
# argparse's: the parser's actions and option table (cli.py, training/options.py), the sub-command action
# class, and the HelpFormatter methods argparse documents as the ones to override for a custom formatter.
STANDARD_LIBRARY = {
    "_actions",
    "_option_string_actions",
    "_SubParsersAction",
    "_get_help_string",
    "_format_action_invocation",
    "_format_args",
}


def test_every_listed_private_member_exists_in_the_installed_packages():
    assert [member.path for member in missing()] == []


def private_uses() -> dict[str, set[str]]:
    """Private names the package reads from objects it does not define, or reaches through super() or a
    class it imports; each with the places (file:line) that use it."""
    trees = {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}
    defined = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    defined.update(
                        t.id if isinstance(t, ast.Name) else t.attr
                        for t in ast.walk(target)
                        if isinstance(t, (ast.Name, ast.Attribute))
                    )
    uses = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            owner = node.value
            through_base = (isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super") or (
                isinstance(owner, ast.Name) and owner.id[:1].isupper() and owner.id not in defined
            )
            if through_base or node.attr not in defined:
                uses.setdefault(node.attr, set()).add(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return uses


def test_every_private_member_the_package_reaches_is_listed():
    listed = {member.name for member in PRIVATE_MEMBERS} | set(DUCK_TYPED) | STANDARD_LIBRARY
    unlisted = {name: sorted(places) for name, places in private_uses().items() if name not in listed}
    assert unlisted == {}, "add these to vanilla_transformer/private_api.py (PRIVATE_MEMBERS)"


def test_the_scan_finds_the_known_uses():
    """The completeness check above sees private uses of each kind (a test of the test)."""
    uses = private_uses()
    assert "training/checkpointing.py" in str(uses["_save_checkpoint"])  # super()._save_checkpoint
    assert "_check_early_stop_heuristic" in uses  # GenerationMixin._check_early_stop_heuristic, also overridden
    assert "_linear_pointwise" in uses and "_models" in uses  # torch.ops.mkldnn..., self.accelerator._models
    assert "_writing_checkpoint" not in uses  # the package's own


def test_a_missing_member_fails_at_require_naming_the_package_and_the_versions(monkeypatch):
    ghost = PrivateMember(
        "transformers.Trainer._not_a_member", "transformers 5.0.0 - 5.24.0", "a test", private_api.NO_FALLBACK
    )
    monkeypatch.setitem(private_api._BY_PATH, ghost.path, ghost)
    floor, newest = TESTED["transformers"]
    with pytest.raises(ImportError) as raised:
        require("transformers.Trainer._save_checkpoint", ghost.path)
    message = str(raised.value)
    assert ghost.path in message and "_save_checkpoint" not in message
    assert f"transformers {version('transformers')}" in message
    assert f"transformers {floor} - {newest}" in message and f"'transformers>={floor},<={newest}'" in message


def test_an_instance_member_is_found_in_the_method_that_sets_it():
    present = PrivateMember("accelerate.Accelerator._models", "", "", "", set_in="accelerate.Accelerator.__init__")
    absent = PrivateMember("accelerate.Accelerator._no_models", "", "", "", set_in="accelerate.Accelerator.__init__")
    assert present.exists() and not absent.exists()


def test_require_refuses_a_member_that_is_not_listed():
    with pytest.raises(KeyError, match="PRIVATE_MEMBERS"):
        require("transformers.Trainer._not_listed")


def test_every_listed_member_is_still_used_or_overridden():
    """The list shrinks with the code: a member nothing reads or overrides any more is not a dependency."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        if path.name == "private_api.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)  # getattr(x, "_name", default)
    stale = [member.path for member in PRIVATE_MEMBERS if member.name not in names]
    stale += [name for name in DUCK_TYPED if name not in names]
    assert stale == [], "remove these from vanilla_transformer/private_api.py: the package no longer uses them"


def required_at_import(tree: ast.Module) -> set[str]:
    """The paths a module passes to `require()` in its top-level statements, which run when it is imported."""
    return {
        argument.value
        for node in tree.body
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == "require"
        for argument in node.value.args
        if isinstance(argument, ast.Constant)
    }


def test_every_member_without_a_fallback_is_required_at_import_by_each_module_that_uses_it():
    """A renamed member then fails as require()'s ImportError when the module is imported (before any
    generate() or training starts), not as an AttributeError in the middle of a call."""
    without_fallback = {member.name for member in PRIVATE_MEMBERS if member.fallback == private_api.NO_FALLBACK}
    used_by_file = {}
    for name, places in private_uses().items():
        for place in places:
            used_by_file.setdefault(place.split(":")[0], set()).add(name)
    unchecked = {}
    for file, names in sorted(used_by_file.items()):
        required = {path.rsplit(".", 1)[1] for path in required_at_import(ast.parse((PACKAGE / file).read_text()))}
        if (names & without_fallback) - required:
            unchecked[file] = sorted((names & without_fallback) - required)
    assert unchecked == {}, "add require(...) for these after the imports of each file"
    assert {"generation_vanilla_transformer.py", "modeling_vanilla_transformer.py"} <= set(used_by_file)


def test_the_generation_module_uses_only_the_listed_private_members_of_transformers_search():
    """The search goes through the cache's public reorder_cache and the generation config's public token ids;
    of transformers' beam search it uses the routing, the two scoring steps the GNMT penalty rescales and the first
    step of a compiled beam search over a static cache (`_prefill`; its criteria and default configuration are
    read with a fallback, by getattr)."""
    uses = {
        name
        for name, places in private_uses().items()
        if any(place.startswith("generation_vanilla_transformer.py:") for place in places)
    }
    assert uses == {
        *("_beam_search", "_update_finished_beams", "_check_early_stop_heuristic", "_attn_implementation", "_prefill")
    }


def reimport(module: str) -> None:
    """Run a package module's file again as a new module of the same package (its relative imports resolve)."""
    path = PACKAGE / (module.replace(".", "/") + ".py")
    package = "vanilla_transformer" + ("." + module.rsplit(".", 1)[0] if "." in module else "")
    spec = importlib.util.spec_from_file_location(f"{package}._reimported_{path.stem}", path)
    sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # as an import registers it while it runs
    try:
        spec.loader.exec_module(sys.modules[spec.name])
    finally:
        del sys.modules[spec.name]


@pytest.mark.parametrize(
    ("module", "owner", "name"),
    [
        ("generation_vanilla_transformer", transformers.GenerationMixin, "_update_finished_beams"),
        ("generation_vanilla_transformer", transformers.GenerationMixin, "_beam_search"),
        ("modeling_vanilla_transformer", transformers.PreTrainedModel, "_get_resized_lm_head"),
        ("training.run", transformers.PreTrainedModel, "_from_config"),
    ],
)
def test_a_member_missing_from_transformers_fails_the_import_naming_it_and_the_tested_range(
    module, owner, name, monkeypatch
):
    reimport(module)  # imports cleanly with the member
    monkeypatch.delattr(owner, name)
    with pytest.raises(ImportError) as raised:
        reimport(module)
    floor, newest = TESTED["transformers"]
    message = str(raised.value)
    assert f"transformers.{owner.__name__}.{name}" in message
    assert f"Tested: transformers {floor} - {newest}" in message and f"'transformers>={floor},<={newest}'" in message
