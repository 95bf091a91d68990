"""The architecture's rules (docs/architecture.md), checked on the source: who may import whom, and the target
interface that owns the draft's conventions about the target."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_draft, make_tiny_target

ROOT = Path(__file__).resolve().parent.parent


def imports_of(path: Path) -> set[str]:
    """Absolute names imported anywhere in `path` (function bodies included); relative imports as `.name`."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def package_imports(package: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): imports_of(p) for p in sorted((ROOT / package).rglob("*.py"))}


def test_remote_code_imports_only_torch_and_transformers():
    allowed = {"torch", "transformers", *sys.stdlib_module_names}
    for path, names in package_imports("modeling").items():
        foreign = {n for n in names if not n.startswith(".") and n.split(".")[0] not in allowed}
        # The one exception: push_to_hub uses domino-hf's card when installed, guarded by an ImportError.
        if path.endswith("modeling_domino.py"):
            foreign.discard("domino_hf.training.export")
        assert not foreign, f"{path} imports {foreign}: remote code may import only torch and transformers"


def test_the_model_file_imports_no_generation_code():
    names = imports_of(ROOT / "modeling" / "modeling_domino.py")
    assert not {n for n in names if "generation_domino" in n}


@pytest.mark.parametrize("package, forbidden", [("training", "bench"), ("bench", "training")])
def test_training_and_bench_never_import_each_other(package, forbidden):
    for path, names in package_imports(f"domino_hf/{package}").items():
        crossing = {n for n in names if n in (f"..{forbidden}", f"domino_hf.{forbidden}")
                    or n.startswith((f"..{forbidden}.", f"domino_hf.{forbidden}."))}
        assert not crossing, f"{path} imports {crossing}"


def test_offsets_are_written_only_in_the_target_interface():
    """The hidden-state offset (entry i + 1 holds layer i) and the slot offset (`0 if shift_label else 1`) are
    written once, in target_domino.py; everyone else calls it."""
    import re

    offsets = re.compile(r"hidden_states\[|if \S*shift_label else|\+ 1 for \w+ in \S*layer_ids")
    sources = [*ROOT.glob("domino_hf/**/*.py"), *ROOT.glob("modeling/*.py"), *ROOT.glob("examples/*.py"),
               ROOT / "tests" / "conftest.py"]
    for path in sources:
        if path.name not in ("target_domino.py", "configuration_domino.py"):  # the owner; the fields' definitions
            assert not offsets.search(path.read_text(encoding="utf-8")), path


# ------------------------------------------------------------------------------------------ target interface
def test_context_features_are_the_target_layers_outputs():
    from domino_hf.modeling.target_domino import hidden_state_indices, target_context_features

    target = make_tiny_target("qwen3")
    ids = torch.randint(0, 16, (2, 5))
    layers = [0, 3]
    assert hidden_state_indices(layers) == [1, 4]  # entry 0 is the embedding output
    with torch.no_grad():
        outputs = [target.model.layers[i] for i in layers]
        seen = []
        hooks = [layer.register_forward_hook(lambda m, a, out: seen.append(out[0] if isinstance(out, tuple) else out))
                 for layer in outputs]
        features = target_context_features(target, ids, None, layers)
        for hook in hooks:
            hook.remove()
    assert features.shape == (2, 5, 2 * target.config.hidden_size)
    torch.testing.assert_close(features, torch.cat(seen[-2:], dim=-1))


@pytest.mark.parametrize("shift_label", [True, False])
def test_block_layout(shift_label):
    from domino_hf import DominoTargetHead
    from domino_hf.modeling.target_domino import block_position_ids, block_token_ids, draft_slots

    target = make_tiny_target("llama")
    config = make_tiny_draft(target, shift_label=shift_label).config
    anchors = torch.tensor([[3, 7]])
    block = block_token_ids(anchors, config)
    assert block.tolist() == [[[3] + [config.mask_token_id] * 3, [7] + [config.mask_token_id] * 3]]
    assert block_position_ids(anchors, config.block_size).tolist() == [[[3, 4, 5, 6], [7, 8, 9, 10]]]
    slots = draft_slots(torch.arange(4.0)[:, None], config)  # slot k holds the value k
    assert slots[:, 0].tolist() == ([0.0, 1.0, 2.0, 3.0] if shift_label else [1.0, 2.0, 3.0])
    head = DominoTargetHead(target, config)
    torch.testing.assert_close(head.block_embeds(anchors), target.get_input_embeddings()(block))


def test_vocabulary_map_round_trips():
    from domino_hf import DominoTargetHead

    target = make_tiny_target("llama")
    config = make_tiny_draft(target, draft_vocab_ids=[1, 4, 9]).config
    head = DominoTargetHead(target, config)
    assert head.to_draft_index(torch.tensor([4, 9, 2, 1])).tolist() == [1, 2, -1, 0]
    assert head.to_target_ids(torch.tensor([0, 2])).tolist() == [1, 9]


def calls_in(path: Path) -> set[str]:
    """What `path` calls: each call's function name (`f(…)`, `x.f(…)`) and `kw:name` for each keyword it passes."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            found.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
            found.update(f"kw:{keyword.arg}" for keyword in node.keywords if keyword.arg)
    return found


def functions_in(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


# Each step of drafting and verifying, by the calls that do it, and the remote-code files allowed to make them:
# the proposer drafts for every loop, acceptance_domino accepts for every loop (modeling_domino.py defines the
# head's math, and runs it teacher-forced for training).
ONE_OWNER = {
    "the draft's forward over blocks (backbone)": ({"kw:block_embeds"}, {"proposer_domino.py"}),
    "the head's rollout (GRU steps, corrections)": ({"gru_step", "correction_from_parts"},
                                                    {"proposer_domino.py", "modeling_domino.py"}),
    "random draws (the draft's tokens, acceptance)": ({"multinomial", "rand", "rand_like", "bernoulli", "exponential_"},
                                                      {"proposer_domino.py", "acceptance_domino.py"}),
    "span finding": ({"ContextLookup", "SuffixLookup", "lookup"}, {"proposer_domino.py", "hybrid_domino.py"}),
    "cutting a proposal at a stop": ({"probe_copy"}, {"proposer_domino.py"}),
}


@pytest.mark.parametrize("step", ONE_OWNER)
def test_each_step_is_implemented_by_one_module(step):
    """No two modules implement the same step: the calls that do it appear only in its owner's file."""
    names, owners = ONE_OWNER[step]
    for path in sorted((ROOT / "modeling").glob("*.py")):
        if path.name not in owners:
            assert not calls_in(path) & names, f"{path.name} implements {step} ({calls_in(path) & names})"


def test_acceptance_is_written_once():
    """Greedy match, speculative sampling and the tree walk are functions of acceptance_domino.py alone, and the
    loops call them (the single-prompt chain is accepted by transformers' own loop)."""
    rules = {"greedy_match", "accept_chain", "accept_tree"}
    for path in sorted((ROOT / "modeling").glob("*.py")):
        defined = functions_in(path)
        if path.name == "acceptance_domino.py":
            assert rules <= defined
        else:
            assert not defined & rules and not {n for n in defined if "speculative" in n}, path.name
    assert "accept_chain" in calls_in(ROOT / "modeling" / "batch_domino.py")
    assert "accept_tree" in calls_in(ROOT / "modeling" / "tree_domino.py")
