"""Drafting settings: a draft keeps them in its `generation_config.json`; `generate`'s values win, then the draft's,
then (older checkpoints) its `config.json`, then `DraftingSettings`' defaults. Resolved once by the dispatch."""

from __future__ import annotations

import ast
import itertools
import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import assert_drafted, make_tiny_draft, make_tiny_target, tiny_prompts
from transformers import GenerationConfig

import domino_hf.modeling as modeling
from domino_hf import DominoConfigError, DominoDraftModel
from domino_hf.modeling import DraftingSettings, batch_domino, cost_domino, generation_domino, tree_domino
from domino_hf.modeling.configuration_domino import DRAFTING_FIELDS, DominoConfig
from domino_hf.modeling.dispatch_domino import make_candidate_generator, profile_drafting, resolve_drafting_settings

pytestmark = pytest.mark.usefixtures("single_thread")

# A value other than the default for every setting a draft can carry.
NON_DEFAULT = {
    "draft_confidence_threshold": 0.3,
    "max_draft_tokens": 2,
    "context_lookup_tokens": 3,
    "context_lookup_ngram": 1,
    "draft_backoff": False,
    "measure_verify_cost": True,
    "cut_lookup_spans": True,
    "use_suffix_cache": False,
    "suffix_cache_max_span": 8,
    "suffix_cache_size": 5000,
    "use_draft_tree": True,
}


def shipped(draft):
    """`draft` with the shipped drafting defaults (the test drafts of conftest turn the suffix cache off)."""
    vars(draft.generation_config).pop("use_suffix_cache", None)
    return draft


def test_every_setting_has_a_non_default_case():
    assert set(NON_DEFAULT) == set(DRAFTING_FIELDS)
    defaults = DraftingSettings()
    assert all(getattr(defaults, name) != value for name, value in NON_DEFAULT.items())


@pytest.fixture
def steady_clock(monkeypatch):
    """The generator's clock advances 1 ms per reading: `measure_verify_cost` then measures the same costs on
    every run, so its choices (and the per-step sources) are reproducible."""
    ticks = itertools.count()
    clock = SimpleNamespace(perf_counter=lambda: next(ticks) * 1e-3)
    for module in (generation_domino, batch_domino, tree_domino):  # the chain's generator and the verify loop
        monkeypatch.setattr(module, "time", clock)


def _layouts(tmp_path, draft, settings):
    """The same draft saved in the current layout (settings in generation_config.json) and in the older one
    (settings in config.json, no generation_config.json)."""
    new, old = tmp_path / "new", tmp_path / "old"
    for name, value in settings.items():
        setattr(draft.generation_config, name, value)
    draft.save_pretrained(new)
    shutil.copytree(new, old)
    generation = json.loads((new / "generation_config.json").read_text())
    config = json.loads((old / "config.json").read_text())
    config.update({name: generation[name] for name in DRAFTING_FIELDS})
    (old / "config.json").write_text(json.dumps(config, indent=2))
    (old / "generation_config.json").unlink()
    return new, old


@pytest.mark.parametrize("settings", [{name: value} for name, value in NON_DEFAULT.items()] + [NON_DEFAULT],
                         ids=[*NON_DEFAULT, "all"])
def test_old_and_new_layouts_draft_identically(tmp_path, fitted_pair, steady_clock, caplog, settings, monkeypatch):
    target, draft, prompts = fitted_pair("llama")
    new, old = _layouts(tmp_path, shipped(draft), settings)
    assert not set(DRAFTING_FIELDS) & set(json.loads((new / "config.json").read_text()))
    with caplog.at_level(logging.DEBUG, logger="domino_hf"):
        drafts = {name: DominoDraftModel.from_pretrained(path).eval() for name, path in (("new", new), ("old", old))}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([r for r in caplog.records if "read from config.json" in r.getMessage()]) == 1  # the old one only
    expected = DraftingSettings(**{**vars(DraftingSettings()), **settings})
    per_call = target.generation_config  # nothing set per call: the draft's settings apply
    for loaded in drafts.values():
        resolved = resolve_drafting_settings(loaded, per_call)
        assert {name: getattr(resolved, name) for name in settings} == settings
        assert resolved == DraftingSettings(**{**vars(expected), "max_draft_tokens": resolved.max_draft_tokens})
    for ids in prompts[:3] + tiny_prompts(2, seed=7):
        reference = target.generate(ids, do_sample=False, max_new_tokens=24)
        runs = {}
        for name, loaded in drafts.items():
            # each call from the prior: the verify loop keeps measured costs across calls (`VERIFY_COSTS`)
            cost_domino.VERIFY_COSTS.clear()
            output = target.generate(ids, do_sample=False, max_new_tokens=24, assistant_model=loaded)
            assert output.tolist() == reference.tolist(), name
            stats = loaded.last_generation_stats
            runs[name] = (stats.drafted, stats.accepted, stats.sources, stats.draft_runs)
        assert runs["new"] == runs["old"]


def test_a_setting_changes_what_is_proposed(fitted_pair):
    """The settings reach the generator: a cap of 1 proposes single tokens, no lookup proposes no spans."""
    target, draft, prompts = fitted_pair("llama")
    draft.generation_config.max_draft_tokens = 1
    draft.generation_config.context_lookup_tokens = 0
    draft.generation_config.draft_backoff = False
    target.generate(prompts[0], do_sample=False, max_new_tokens=16, assistant_model=draft)
    stats = draft.last_generation_stats
    assert_drafted(stats)
    assert max(stats.drafted) == 1 and "lookup" not in stats.sources


def test_precedence_call_then_draft_then_config_then_defaults():
    target = make_tiny_target("llama")
    draft = shipped(make_tiny_draft(target))
    assert resolve_drafting_settings(draft, GenerationConfig()) == DraftingSettings()
    vars(draft.config).update(context_lookup_tokens=5, draft_backoff=False)  # keys an older config.json carried
    draft.generation_config.context_lookup_tokens = 7
    resolved = resolve_drafting_settings(draft, GenerationConfig())
    assert (resolved.context_lookup_tokens, resolved.draft_backoff) == (7, False)
    per_call = GenerationConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=2, num_assistant_tokens=3,
                                num_assistant_tokens_schedule="heuristic", assistant_confidence_threshold=0.2,
                                draft_backoff=True, cut_lookup_spans=True)
    resolved = resolve_drafting_settings(draft, per_call)
    assert resolved == DraftingSettings(draft_confidence_threshold=0.2, max_draft_tokens=3, context_lookup_tokens=2,
                                        context_lookup_ngram=2, num_assistant_tokens_schedule="heuristic",
                                        draft_backoff=True, cut_lookup_spans=True)
    # transformers' own default threshold (0.4, filled in by generate) reads as unset; the caps combine.
    draft.generation_config.max_draft_tokens = 2
    resolved = resolve_drafting_settings(draft, GenerationConfig(assistant_confidence_threshold=0.4,
                                                                 num_assistant_tokens=20))
    assert (resolved.draft_confidence_threshold, resolved.max_draft_tokens) == (0.0, 2)


def test_settings_object_is_frozen_and_checked():
    settings = DraftingSettings()
    with pytest.raises(AttributeError):
        settings.draft_backoff = False
    cases = [
        ("draft_confidence_threshold", 1.5, r"draft_confidence_threshold must be a probability in \[0, 1\]"),
        ("max_draft_tokens", 0, r"max_draft_tokens must be None \(no cap\) or an integer >= 1"),
        ("context_lookup_tokens", -1, r"context_lookup_tokens must be an integer >= 0"),
        ("context_lookup_ngram", 0, r"context_lookup_ngram must be an integer >= 1"),
        ("draft_backoff", "no", r"draft_backoff must be True or False"),
        ("num_assistant_tokens_schedule", "fast", r"num_assistant_tokens_schedule must be one of"),
    ]
    for name, value, message in cases:
        with pytest.raises(DominoConfigError, match=rf"^DraftingSettings\.{message}"):
            DraftingSettings(**{name: value})


def test_bad_values_are_named_wherever_they_come_from(tmp_path):
    target = make_tiny_target("llama")
    draft = make_tiny_draft(target)
    draft.save_pretrained(tmp_path)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({**generation, "context_lookup_tokens": -2}))
    with pytest.raises(DominoConfigError, match=r"generation_config\.context_lookup_tokens must be an integer >= 0"):
        DominoDraftModel.from_pretrained(tmp_path)
    with pytest.raises(DominoConfigError, match=r"DominoConfig\.draft_backoff must be True or False"):
        DominoConfig(draft_backoff="yes")
    with pytest.raises(DominoConfigError, match=r"max_draft_tokens must be None \(no cap\) or an integer >= 1"):
        target.generate(tiny_prompts(1)[0], max_new_tokens=4, assistant_model=draft,
                        generation_config=GenerationConfig(max_draft_tokens=0))


# Per-call values that were once clamped, rounded, read as unset or named after the setting they map to.
BAD_PER_CALL = [
    ("num_assistant_tokens", 0, "an integer >= 1"),
    ("num_assistant_tokens", -1, "an integer >= 1"),
    ("num_assistant_tokens", 2.5, "an integer >= 1"),
    ("num_assistant_tokens_schedule", "fast", "one of"),
    ("assistant_confidence_threshold", 1.5, r"a probability in \[0, 1\]"),
    ("assistant_confidence_threshold", -0.1, r"a probability in \[0, 1\]"),
    ("prompt_lookup_num_tokens", -1, "an integer >= 0"),
    ("prompt_lookup_num_tokens", 2.5, "an integer >= 0"),
    ("max_matching_ngram_size", 0, "an integer >= 1"),
    ("max_matching_ngram_size", 1.5, "an integer >= 1"),
    ("draft_confidence_threshold", 2, r"a probability in \[0, 1\]"),
    ("max_draft_tokens", 2.5, r"None \(no cap\) or an integer >= 1"),
    ("context_lookup_tokens", -1, "an integer >= 0"),
    ("context_lookup_ngram", 0, "an integer >= 1"),
    ("draft_backoff", "no", "True or False"),
    ("measure_verify_cost", 1, "True or False"),
    ("cut_lookup_spans", None, "True or False"),
    ("use_suffix_cache", "yes", r"None \(on when decoding greedily, off when sampling\), True or False"),
    ("suffix_cache_max_span", 0, "an integer >= 1"),
    ("suffix_cache_size", 10, "an integer >= 64"),
    ("use_draft_tree", "yes", "True or False"),
]


def test_every_per_call_setting_has_a_bad_case():
    from domino_hf.modeling.configuration_domino import CALL_FIELDS

    assert {name for name, _, _ in BAD_PER_CALL} == set(CALL_FIELDS) | set(DRAFTING_FIELDS)


@pytest.mark.parametrize("how", ["keyword", "generation_config"])
@pytest.mark.parametrize("name, value, allowed", BAD_PER_CALL, ids=[f"{n}={v!r}" for n, v, _ in BAD_PER_CALL])
def test_bad_per_call_values_are_refused_under_their_own_name(name, value, allowed, how):
    """A bad value given to `generate` (or on its GenerationConfig) is refused in one line naming the setting as
    the caller wrote it and its range, before anything is generated."""
    target = make_tiny_target("llama")
    draft = make_tiny_draft(target)
    ids = tiny_prompts(1)[0]
    call = {name: value} if how == "keyword" else {"generation_config": GenerationConfig(**{name: value})}
    with pytest.raises(DominoConfigError, match=rf"^{name} must be {allowed}.*, got {value!r} \(a generate\(\) "
                       r"keyword or a GenerationConfig field\)\.$") as error:
        target.generate(ids, max_new_tokens=4, assistant_model=draft, **call)
    assert "\n" not in str(error.value)


def test_transformers_defaults_and_good_per_call_values_still_work(fitted_pair):
    """The defaults `generate` fills in (num_assistant_tokens 20, schedule "constant", threshold 0.4) and values at
    the edges of each range are taken as they are."""
    target, draft, prompts = fitted_pair("llama")
    for call in ({}, dict(num_assistant_tokens=1, prompt_lookup_num_tokens=0, max_matching_ngram_size=1,
                          assistant_confidence_threshold=0.0, num_assistant_tokens_schedule="heuristic"),
                 dict(assistant_confidence_threshold=1, use_suffix_cache=None, max_draft_tokens=None)):
        reference = target.generate(prompts[0], do_sample=False, max_new_tokens=12)
        output = target.generate(prompts[0], do_sample=False, max_new_tokens=12, assistant_model=draft, **call)
        assert output.tolist() == reference.tolist()
    resolved = resolve_drafting_settings(draft, GenerationConfig(num_assistant_tokens=1, prompt_lookup_num_tokens=0,
                                                                 max_matching_ngram_size=1))
    assert (resolved.max_draft_tokens, resolved.context_lookup_tokens, resolved.context_lookup_ngram) == (1, 0, 1)


def test_new_folders_keep_the_architecture_apart(tmp_path):
    """`config.json` holds the architecture; `generation_config.json` every drafting setting. Keys a config
    still carries (a draft built from an older config file) move there on save, and the draft in memory is
    unchanged."""
    target = make_tiny_target("llama")
    draft = shipped(make_tiny_draft(target, context_lookup_tokens=4))  # `from_target` puts it in the generation config
    assert "context_lookup_tokens" not in vars(draft.config) and draft.generation_config.context_lookup_tokens == 4
    vars(draft.config)["measure_verify_cost"] = True
    draft.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert not set(DRAFTING_FIELDS) & set(config)
    assert {name: generation[name] for name in DRAFTING_FIELDS} == {
        **{name: value for name, value in vars(DraftingSettings()).items() if name in DRAFTING_FIELDS},
        "context_lookup_tokens": 4, "measure_verify_cost": True,
    }
    assert draft.config.measure_verify_cost is True  # still the in-memory draft's fallback
    loaded = DominoDraftModel.from_pretrained(tmp_path)
    assert resolve_drafting_settings(loaded, GenerationConfig()) == resolve_drafting_settings(draft, GenerationConfig())


def test_export_writes_the_settings_to_the_generation_config(tmp_path):
    """`domino export` of an older folder (settings in config.json) writes them to generation_config.json."""
    from domino_hf.training.export import export_draft

    target = make_tiny_target("llama")
    old = tmp_path / "old"
    make_tiny_draft(target).save_pretrained(old)
    config = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps({**config, "draft_confidence_threshold": 0.25, "draft_backoff": False}))
    (old / "generation_config.json").unlink()
    out = export_draft(old, tmp_path / "out", dtype="float32")
    assert not set(DRAFTING_FIELDS) & set(json.loads((out / "config.json").read_text()))
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["draft_confidence_threshold"], generation["draft_backoff"]) == (0.25, False)


def test_the_generator_owns_its_stats_and_timing(fitted_pair):
    """The generator writes nothing onto the draft: the dispatch hands it its stats (and makes them the draft's
    `last_generation_stats`); phase timing is switched on by `profile_drafting`, never by a draft attribute."""
    target, draft, prompts = fitted_pair("llama")
    ids = prompts[0]
    arguments = dict(target=target, generation_config=GenerationConfig(max_length=40), logits_processor=None,
                     input_ids=ids)
    stats = generation_domino.DominoGenerationStats()
    generator = generation_domino.DominoCandidateGenerator(draft=draft, settings=DraftingSettings(), stats=stats,
                                                           **arguments)
    assert generator.stats is stats and draft.last_generation_stats is None
    built = make_candidate_generator(draft, **arguments)
    assert draft.last_generation_stats is built.stats and built.settings == resolve_drafting_settings(
        draft, arguments["generation_config"])
    before = dict(vars(draft))
    target.generate(ids, do_sample=False, max_new_tokens=16, assistant_model=draft)
    assert set(vars(draft)) == set(before)  # no new attribute on the draft
    assert not any(draft.last_generation_stats.timings.values())
    with profile_drafting(draft):
        target.generate(ids, do_sample=False, max_new_tokens=16, assistant_model=draft)
    assert draft.last_generation_stats.timings["backbone"] > 0
    target.generate(ids, do_sample=False, max_new_tokens=16, assistant_model=draft)
    assert not any(draft.last_generation_stats.timings.values())  # switched off again on leaving the block


def _relative_imports(path: Path) -> set[str]:
    """Sibling modules a remote-code file imports, anywhere in it (functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names.add(node.module)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            assert not (module or "").startswith("domino_hf"), f"{path.name} imports {module}"
    return names


def test_remote_code_imports_flow_one_way():
    """No import cycle between the remote-code files (nor one hidden in a function), and none imports
    domino_hf: each runs where domino_hf is not installed."""
    folder = Path(modeling.__file__).parent
    graph = {path.stem: _relative_imports(path) for path in folder.glob("*_domino.py")}
    assert "generation_domino" in graph["dispatch_domino"] and "modeling_domino" not in graph["generation_domino"]

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in graph.get(start, ()))

    cycles = [name for name in graph if reaches(name, name)]
    assert not cycles


def test_remote_code_reads_the_generation_config(tmp_path, fitted_pair):
    """The checkpoint's own remote-code class (as `trust_remote_code=True` loads it where domino_hf is not
    imported) reads the draft's generation_config.json and drafts by it, as domino_hf's class does."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    target, draft, prompts = fitted_pair("llama")
    draft.generation_config.context_lookup_tokens = 0
    draft.generation_config.max_draft_tokens = 1
    draft.save_pretrained(tmp_path)
    remote = get_class_from_dynamic_module("modeling_domino.DominoDraftModel", str(tmp_path)).from_pretrained(tmp_path)
    assert type(remote) is not DominoDraftModel
    assert (remote.generation_config.context_lookup_tokens, remote.generation_config.max_draft_tokens) == (0, 1)
    for loaded in (remote.eval(), DominoDraftModel.from_pretrained(tmp_path).eval()):
        reference = target.generate(prompts[0], do_sample=False, max_new_tokens=16)
        output = target.generate(prompts[0], do_sample=False, max_new_tokens=16, assistant_model=loaded)
        stats = loaded.last_generation_stats
        assert output.tolist() == reference.tolist()
        assert_drafted(stats)
        assert max(stats.drafted) == 1 and "lookup" not in stats.sources
