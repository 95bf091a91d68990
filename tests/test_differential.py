"""Property-based differential test: greedy `generate` with a Domino draft gives, token for token, what plain greedy
`generate` gives with the same settings, whatever the settings.

Hypothesis draws the settings on tiny targets of the five test architectures: batch size 1-4 with left padding and
prompts of different lengths, `max_new_tokens` 1-40, chain or draft tree, logits processors, stop strings, EOS ids,
the suffix cache off, empty or filled, proposal caps, the context lookup on or off, and the times the loops measure
(a fake clock). The draft is fitted to the targets' greedy continuations so that proposals are accepted some of the
time: prompts are prefixes of those continuations (drafts mostly accepted) or random tokens (mostly rejected). The
examples are derandomized and bounded, so CI runs the same cases every time; every failure found becomes an
`@example` below.

The same runs on the length-invariant CPU kernels in bf16 (`optimize_for_cpu(kernels="invariant")`, where this CPU
has them): the output must equal plain bf16 decoding on the same optimized target.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import types
from unittest import mock

import pytest
import torch
from conftest import TINY_ARCHS
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_generation import _letter_tokenizer

from domino_hf import SuffixCache, exact_kernels, optimize_for_cpu
from domino_hf.modeling import batch_domino, cost_domino, generation_domino, tree_domino

pytestmark = [pytest.mark.usefixtures("single_thread"),
              pytest.mark.filterwarnings("ignore:Unfeasible length constraints")]  # min_new_tokens past the limit

VOCAB = 16  # fitted_pair's vocabulary: the tiny tokenizer's first 16 tokens ("<unk>" … "system", "w0" … "w8")
FITTED_TOKENS = 24  # greedy continuation of each fitted prompt the prompts here are cut from
LETTERS = "abcdefghijklmnop"  # the text of tokens 0-15 (`_letter_tokenizer`): a stop string may span tokens

BF16_REASON = exact_kernels.unavailable_reason(torch.bfloat16)

TOKENIZER = _letter_tokenizer(VOCAB)
_PAIRS: dict = {}


def pair(fitted_pair, arch: str, optimized: bool = False):
    """`(target, draft, sequences)` of one architecture, built once per session: the fitted pair (on the
    length-invariant kernels in bf16 with `optimized`) and each fitted prompt's greedy continuation."""
    key = (arch, optimized)
    if key not in _PAIRS:
        target, draft, prompts = fitted_pair(arch)
        if optimized:
            target = optimize_for_cpu(copy.deepcopy(target).to(torch.bfloat16), kernels="invariant")
            draft = optimize_for_cpu(draft.to(torch.bfloat16))
        sequences = [target.generate(p, do_sample=False, max_new_tokens=FITTED_TOKENS)[0].tolist() for p in prompts]
        _PAIRS[key] = target, draft, sequences
    return _PAIRS[key]


# A row of the batch: a prefix of a fitted sequence (index, length), or random tokens.
fitted_row = st.tuples(st.integers(0, 5), st.integers(1, 14))
random_row = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12)
token = st.integers(0, VOCAB - 1)


@st.composite
def cases(draw):
    """One `generate` call's settings, as plain data (so failures print, and become `@example`s, as they are)."""
    batch = draw(st.integers(1, 4))
    case = {
        "rows": draw(st.lists(st.one_of(fitted_row, random_row), min_size=batch, max_size=batch)),
        "max_new_tokens": draw(st.integers(1, 40)),
        "tree": batch == 1 and draw(st.booleans()),
        "suffix": draw(st.sampled_from(["off", "empty", "filled"])),
        "clock": draw(st.integers(0, 2**16)),
        "drafting": draw(st.fixed_dictionaries({}, optional={
            "max_draft_tokens": st.integers(1, 6),
            "context_lookup_tokens": st.just(0),
            "num_assistant_tokens_schedule": st.just("heuristic"),
            "draft_confidence_threshold": st.sampled_from([0.0, 0.3, 0.9]),
            "cut_lookup_spans": st.booleans(),
            "draft_backoff": st.booleans(),
        })),
        "processors": draw(st.fixed_dictionaries({}, optional={
            "repetition_penalty": st.sampled_from([0.7, 1.5, 3.0]),
            "no_repeat_ngram_size": st.integers(1, 3),
            "bad_words_ids": st.lists(st.lists(token, min_size=1, max_size=2), min_size=1, max_size=2),
            "min_new_tokens": st.integers(1, 12),
            "suppress_tokens": st.lists(token, min_size=1, max_size=2),
        })),
        "eos": draw(st.one_of(st.none(), st.lists(token, min_size=1, max_size=2, unique=True))),
        "stop_strings": draw(st.one_of(st.none(), st.lists(st.text(LETTERS, min_size=1, max_size=3), min_size=1,
                                                          max_size=2, unique=True))),
    }
    return case


def inputs(case, sequences):
    """The case's left-padded (B, L) prompts and their mask."""
    rows = [sequences[r[0]][: r[1]] if isinstance(r, tuple) else r for r in case["rows"]]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):], mask[i, width - len(row):] = torch.tensor(row), 1
    return ids, mask


@contextlib.contextmanager
def drafting_clock(seed: int):
    """Timings drawn from `seed`: the drafting loops steer by measured times (verify cost, back-off), which must
    never change a token; a fake clock makes those choices, and so each case, repeatable. The verify cost
    measured in earlier cases is forgotten."""
    rng = random.Random(seed)
    now = [0.0]

    def perf_counter():
        now[0] += rng.choice([1e-5, 1e-4, 1e-3]) * rng.uniform(0.5, 2.0)
        return now[0]

    clock = types.SimpleNamespace(perf_counter=perf_counter)
    with contextlib.ExitStack() as stack:
        for module in (batch_domino, generation_domino, tree_domino):
            stack.enter_context(mock.patch.object(module, "time", clock))
        cost_domino.VERIFY_COSTS.clear()
        yield


def check_against_plain_decoding(target, draft, sequences, case):
    ids, mask = inputs(case, sequences)
    common = dict(attention_mask=mask, do_sample=False, max_new_tokens=case["max_new_tokens"],
                  pad_token_id=1, **case["processors"])
    if case["eos"] is not None:
        common["eos_token_id"] = case["eos"]
    if case["stop_strings"] is not None:
        common.update(stop_strings=case["stop_strings"], tokenizer=TOKENIZER)
    domino = dict(case["drafting"], use_draft_tree=case["tree"], use_suffix_cache=case["suffix"] != "off")
    if case["suffix"] != "off":
        store = SuffixCache(max_tokens=4096)
        if case["suffix"] == "filled":  # the fitted continuations, and two sequences that mislead
            for sequence in sequences + [list(range(VOCAB)), [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]:
                store.add(sequence)
        domino["suffix_cache"] = store
    reference = target.generate(ids, **common)
    with drafting_clock(case["clock"]):
        output = target.generate(ids, assistant_model=draft, **common, **domino)
    assert output.tolist() == reference.tolist()
    stats = draft.last_generation_stats  # what each row kept is counted once, never negative
    assert min(stats.accepted, default=0) >= 0 and sum(stats.accepted) <= sum(stats.drafted)
    assert sum(sum(row.accepted) for row in stats.per_row) == sum(stats.accepted)


# CI draws the same 25 cases per architecture every run (8 in bf16). A longer hunt for failures draws N fresh ones:
# DOMINO_DIFFERENTIAL_EXAMPLES=N pytest tests/test_differential.py
HUNT = os.environ.get("DOMINO_DIFFERENTIAL_EXAMPLES")
EXAMPLES = settings(max_examples=int(HUNT or 25), derandomize=HUNT is None, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def case(rows, max_new_tokens, tree=False, suffix="off", clock=0, drafting=None, processors=None, eos=None,
         stop_strings=None):
    """A case for `@example`, as `cases()` draws them."""
    return dict(rows=rows, max_new_tokens=max_new_tokens, tree=tree, suffix=suffix, clock=clock,
                drafting=drafting or {}, processors=processors or {}, eos=eos, stop_strings=stop_strings)


@pytest.mark.parametrize("arch", TINY_ARCHS)
@EXAMPLES
@given(case=cases())
# Two rows reach a stop string (no EOS) at the same column, the second one last: the batch ended there, but the
# second row kept the rest of its accepted tokens, one column past plain decoding's output.
@example(case=case([(0, 1), (0, 1)], 12, processors={"no_repeat_ngram_size": 2}, stop_strings=["a"]))
# A stop string ended the batch at the column of the last row flagged, though a row without one ran on to the
# length limit (mistral): outputs one column short.
@example(case=case([(0, 5), (2, 1)], 5, stop_strings=["a"]))
# A row's stop ended the batch while a row after it in the step was already past that column: the later row kept
# its step's tokens, one column too many, and then counted -1 tokens kept for it (qwen3).
@example(case=case([[0], (0, 9)], 21, stop_strings=["a"]))
def test_greedy_output_is_plain_decodings(fitted_pair, arch, case):
    check_against_plain_decoding(*pair(fitted_pair, arch), case)


@pytest.mark.skipif(BF16_REASON is not None, reason=f"no length-invariant bf16 kernels here: {BF16_REASON}")
@pytest.mark.parametrize("arch", TINY_ARCHS)
@settings(EXAMPLES, max_examples=max(8, EXAMPLES.max_examples // 3))
@given(case=cases())
def test_bf16_on_length_invariant_kernels_is_plain_decodings(fitted_pair, arch, case):
    check_against_plain_decoding(*pair(fitted_pair, arch, optimized=True), case)


def test_a_loop_that_accepts_wrong_drafts_is_caught(fitted_pair):
    """Negative control: the batched loop accepting every proposed token fails the same check."""
    target, draft, sequences = pair(fitted_pair, "llama")
    accept = batch_domino.accept_chain

    def accept_all(target_logits, step_ids, proposed, draft_logits=None, do_sample=False):
        tokens, _ = accept(target_logits, step_ids, proposed, draft_logits, do_sample)
        return tokens, proposed

    bad = case([(0, 6), [3, 3, 9]], 20)
    check_against_plain_decoding(target, draft, sequences, bad)
    with mock.patch.object(batch_domino, "accept_chain", accept_all):
        with pytest.raises(AssertionError):
            check_against_plain_decoding(target, draft, sequences, bad)


def test_a_tree_walk_that_accepts_wrong_nodes_is_caught(fitted_pair):
    """Negative control for the tree path: a walk that keeps the likeliest child whatever the target chose fails
    the same check."""
    target, draft, sequences = pair(fitted_pair, "llama")
    accept = tree_domino.accept_tree

    def accept_first_child(tokens, parents, target_logits, do_sample=False):
        path, bonus = accept(tokens, parents, target_logits, do_sample)
        children = [i for i, parent in enumerate(parents.tolist()) if parent == -1]
        if not path and children:  # the target rejected every child: keep the first anyway
            path = [children[0]]
            bonus = int(target_logits[children[0] + 1].argmax())
        return path, bonus

    bad = case([[3, 3, 9]], 20, tree=True, drafting={"draft_backoff": False})
    check_against_plain_decoding(target, draft, sequences, bad)
    with mock.patch.object(tree_domino, "accept_tree", accept_first_child):
        with pytest.raises(AssertionError):
            check_against_plain_decoding(target, draft, sequences, bad)
