"""Greedy `target.generate(assistant_model=domino_draft)` must return exactly what the target returns alone.

Tiny random fp32 targets of five architectures; random drafts (little acceptance) and drafts fitted in a few
Adam steps to the target's greedy continuations (real acceptance: τ > 1), so that both the rejection and the
acceptance paths of every feature are exercised.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    TINY_ARCHS,
    assert_drafted,
    greedy_both,
    make_tiny_draft,
    make_tiny_target,
    never_right_draft,
    tiny_prompts,
)
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from domino_hf import DominoCandidateGenerator, DominoTargetHead
from domino_hf.modeling import DraftingSettings

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def record_candidates(monkeypatch):
    """A list that receives `(input_len, drafted ids list)` for every drafting step of the next generate calls."""
    records = []
    original = DominoCandidateGenerator.get_candidates

    def spy(self, input_ids, *args, **kwargs):
        candidates, logits = original(self, input_ids, *args, **kwargs)
        if candidates.shape[1] > input_ids.shape[1]:
            records.append((input_ids.shape[1], candidates[0, input_ids.shape[1] :].tolist()))
        return candidates, logits

    monkeypatch.setattr(DominoCandidateGenerator, "get_candidates", spy)
    return records


# ------------------------------------------------------------------------------------------ architectures
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_random_draft_is_lossless(arch):
    target = make_tiny_target(arch)
    draft = make_tiny_draft(target)
    for length in (1, 5, 13):  # a one-token prompt leaves a single context position
        ids = tiny_prompts(1, length=length, seed=length)[0]
        output, stats = greedy_both(target, draft, ids, max_new_tokens=20)
        assert output.shape[1] == length + 20
        assert_drafted(stats)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_fitted_draft_is_lossless_and_accepts(arch, fitted_pair):
    target, draft, prompts = fitted_pair(arch)
    accepted = drafted = steps = 0
    for ids in prompts[:3] + tiny_prompts(2, length=9, seed=7):  # fitted prompts, then unseen ones
        _, stats = greedy_both(target, draft, ids, max_new_tokens=24)
        assert_drafted(stats)
        accepted, drafted, steps = accepted + sum(stats.accepted), drafted + sum(stats.drafted), steps + stats.num_steps
    assert accepted > 0 and (accepted + steps) / steps > 1.5, (arch, accepted, drafted, steps)  # τ > 1.5


def test_gemma3_head_applies_embedding_scale_and_softcap():
    target = make_tiny_target("gemma3")
    draft = make_tiny_draft(target)
    head = DominoTargetHead(target, draft.config)
    ids = torch.tensor([3, 5])
    expected = target.model.embed_tokens.weight[ids] * target.config.hidden_size**0.5
    torch.testing.assert_close(head.embed(ids), expected)
    assert head.softcap == 3.0
    logits = head.logits(torch.randn(4, 32) * 100)
    assert logits.abs().max() <= 3.0


# ----------------------------------------------------------------------------------- block boundaries, EOS
def test_eos_accepted_inside_a_block(fitted_pair, record_candidates):
    """EOS drafted and accepted in the middle of a block: tokens drafted after it must be dropped."""
    target, draft, prompts = fitted_pair("llama")
    hits = 0
    for ids in prompts[:4]:
        continuation = target.generate(ids, do_sample=False, max_new_tokens=24)[0, ids.shape[1] :].tolist()
        for eos in dict.fromkeys(continuation[2:12]):
            record_candidates.clear()
            output, _ = greedy_both(target, draft, ids, max_new_tokens=24, eos_token_id=eos, pad_token_id=eos)
            end = output.shape[1]
            assert output[0, -1].item() == eos and end < ids.shape[1] + 24
            # the block that produced EOS drafted it before its last slot, and the target accepted it
            hits += any(
                start + j + 1 == end and j + 1 < len(block) and tok == eos
                for start, block in record_candidates
                for j, tok in enumerate(block)
            )
        if hits:
            break
    assert hits, "no EOS was accepted mid-block: the fitted draft no longer drafts across EOS"


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 4, 5])
def test_max_new_tokens_shorter_than_a_block(fitted_pair, max_new_tokens):
    target, draft, prompts = fitted_pair("llama")  # block 4: 4 drafted tokens per step
    output, stats = greedy_both(target, draft, prompts[0], max_new_tokens=max_new_tokens)
    assert output.shape[1] == prompts[0].shape[1] + max_new_tokens
    assert all(n <= max_new_tokens - 1 for n in stats.drafted)
    if max_new_tokens >= 3:
        assert_drafted(stats)


def test_block_longer_than_generation():
    target = make_tiny_target("qwen3")
    draft = make_tiny_draft(target, block_size=8)
    greedy_both(target, draft, tiny_prompts(1)[0], max_new_tokens=3)


# ---------------------------------------------------------------------------------- head, shift, vocabulary
def test_head_on_and_off(fitted_pair, monkeypatch):
    target, draft, prompts = fitted_pair("llama")
    calls = []
    original = type(draft).correction_from_parts
    monkeypatch.setattr(type(draft), "correction_from_parts", lambda self, *a: calls.append(1) or original(self, *a))
    _, stats = greedy_both(target, draft, prompts[0], max_new_tokens=16)
    assert calls and stats.tau > 1
    calls.clear()
    draft.config.use_domino_head = False  # runtime switch: base logits only
    assert not draft.has_domino_head
    for ids in prompts[:2]:
        _, stats = greedy_both(target, draft, ids, max_new_tokens=16)
        assert_drafted(stats)
    assert not calls


@pytest.mark.parametrize("shift_label", [True, False])
@pytest.mark.parametrize("pure_draft_prefix_len", [0, 1])
def test_shift_label_and_pure_prefix(fitted_pair, shift_label, pure_draft_prefix_len):
    target, draft, prompts = fitted_pair("llama", shift_label=shift_label, pure_draft_prefix_len=pure_draft_prefix_len)
    assert draft.config.num_draft_tokens == (4 if shift_label else 3)
    taus = []
    for ids in prompts[:3]:
        draft.config.context_lookup_tokens = 0  # the Domino block alone
        _, stats = greedy_both(target, draft, ids, max_new_tokens=20)
        assert max(stats.drafted) == draft.config.num_draft_tokens
        taus.append(stats.tau)
    assert max(taus) > 1.5


def _produced_tokens(target, prompts):
    """Sorted token ids of the target's greedy continuations of `prompts` (prompt tokens excluded)."""
    tokens = set()
    for ids in prompts:
        tokens.update(target.generate(ids, do_sample=False, max_new_tokens=24)[0, ids.shape[1] :].tolist())
    return sorted(tokens)


def test_sub_vocabulary_covering_the_outputs(fitted_pair):
    produced = _produced_tokens(make_tiny_target("llama"), tiny_prompts(2))
    assert len(produced) <= 12, "the tiny target's outputs cover most of its vocabulary: pick another seed"
    target, draft, prompts = fitted_pair("llama", num_prompts=2, draft_vocab_ids=produced)
    assert draft.embed_proj[2].out_features == len(produced)
    accepted = 0
    for ids in prompts:
        _, stats = greedy_both(target, draft, ids, max_new_tokens=24)
        accepted += sum(stats.accepted)
        greedy_both(target, draft, ids, max_new_tokens=24, repetition_penalty=1.5)
    assert accepted > 0
    greedy_both(target, draft, tiny_prompts(1, seed=11)[0], max_new_tokens=24)  # outputs outside the sub-vocabulary


def test_sub_vocabulary_missing_the_outputs():
    target = make_tiny_target("llama")
    prompts = tiny_prompts(3)
    others = sorted(set(range(16)) - set(_produced_tokens(target, prompts)))
    assert others
    draft = make_tiny_draft(target, draft_vocab_ids=others)
    for ids in prompts:
        draft.config.context_lookup_tokens = 0  # the Domino block alone
        _, stats = greedy_both(target, draft, ids, max_new_tokens=24)
        assert_drafted(stats)
        assert sum(stats.accepted) == 0  # it can only propose tokens the target never chooses here


# ------------------------------------------------------------------------------ processors, stops, streaming
@pytest.mark.parametrize(
    "processing",
    [
        dict(repetition_penalty=1.5),
        dict(no_repeat_ngram_size=2),
        dict(suppress_tokens=[5, 13]),
        dict(min_new_tokens=10, eos_token_id=3, pad_token_id=3),
    ],
    ids=["repetition_penalty", "no_repeat_ngram", "suppress_tokens", "min_new_tokens"],
)
def test_greedy_logits_processors(fitted_pair, processing):
    target, draft, prompts = fitted_pair("llama")
    for ids in prompts[:3]:
        _, stats = greedy_both(target, draft, ids, max_new_tokens=20, **processing)
        assert_drafted(stats)


class StopOnToken(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_custom_stopping_criteria(fitted_pair, monkeypatch):
    """A user criterion that stops on a token must stop where the target alone stops, even when the draft
    would have proposed it mid-block: without the rollout's check this test fails (shown at the end)."""
    target, draft, prompts = fitted_pair("llama")
    cases = []
    for ids in prompts[:4]:
        continuation = target.generate(ids, do_sample=False, max_new_tokens=24)[0, ids.shape[1] :].tolist()
        for token in dict.fromkeys(continuation[2:10]):
            stop = StoppingCriteriaList([StopOnToken(token)])
            output, _ = greedy_both(target, draft, ids, max_new_tokens=24, stopping_criteria=stop)
            assert output[0, -1].item() == token and output.shape[1] < ids.shape[1] + 24
            cases.append((ids, stop, output))

    # teeth: with the rollout's stop check removed, some case runs past the stop
    original_init = DominoCandidateGenerator.__init__

    def init_without_stops(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.proposer.stopping = []

    monkeypatch.setattr(DominoCandidateGenerator, "__init__", init_without_stops)
    overshoot = sum(
        target.generate(ids, do_sample=False, max_new_tokens=24, stopping_criteria=stop, assistant_model=draft).shape
        != output.shape
        for ids, stop, output in cases
    )
    assert overshoot > 0


class StopOnceSeen(StoppingCriteria):
    """A stateful criterion in the style of lm-evaluation-harness's stop sequences: a row, once it matched, stays
    done, and the answer is a plain bool."""

    def __init__(self, token, prompt_length):
        self.token, self.prompt_length = token, prompt_length
        self.done = [False]

    def __call__(self, input_ids, scores, **kwargs):
        self.done[0] = self.done[0] or bool((input_ids[0, self.prompt_length:] == self.token).any())
        return self.done[0]


def test_stateful_stopping_criteria_never_remember_a_proposal(fitted_pair):
    """Asking a stateful criterion about a draft's proposal must not change its state: a proposal the target
    rejects would otherwise end generation early. Every output equals plain decoding with a fresh criterion."""
    target, draft, prompts = fitted_pair("llama")
    wrong = never_right_draft(target, prompts[:4], max_new_tokens=24)  # proposes only tokens the target never says
    checked = 0
    for ids in prompts[:4]:
        continuation = target.generate(ids, do_sample=False, max_new_tokens=24)[0, ids.shape[1] :].tolist()
        cases = [(draft, t) for t in dict.fromkeys(continuation[2:12])]
        cases += [(wrong, t) for t in wrong.config.draft_vocab_ids]  # stop tokens that only a rejected draft says
        for assistant, token in cases:
            def stop():
                return StoppingCriteriaList([StopOnceSeen(token, ids.shape[1])])

            reference = target.generate(ids, do_sample=False, max_new_tokens=24, stopping_criteria=stop())
            output = target.generate(ids, do_sample=False, max_new_tokens=24, stopping_criteria=stop(),
                                     assistant_model=assistant)
            assert output.tolist() == reference.tolist()
            checked += 1
    assert checked > 4


def _letter_tokenizer(vocab_size=16):
    """Token i is the letter chr(97 + i); text splits into single letters and decodes without spaces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({chr(97 + i): i for i in range(vocab_size)}, unk_token="a"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_stop_strings(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    tokenizer = _letter_tokenizer()
    stopped = accepted = 0
    for ids in prompts[:3]:
        continuation = target.generate(ids, do_sample=False, max_new_tokens=24)[0, ids.shape[1] :].tolist()
        for k in (3, 7):  # a two-token stop string taken from the continuation
            text = tokenizer.decode(continuation[k : k + 2])
            output, stats = greedy_both(target, draft, ids, max_new_tokens=24, stop_strings=[text], tokenizer=tokenizer)
            stopped += output.shape[1] < ids.shape[1] + 24
            accepted += sum(stats.accepted)
    assert stopped and accepted


class CollectingStreamer(BaseStreamer):
    def __init__(self):
        self.chunks = []

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def test_streamer_receives_exactly_the_output(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    ids = prompts[0]
    reference = target.generate(ids, do_sample=False, max_new_tokens=20)
    streamer = CollectingStreamer()
    output = target.generate(ids, do_sample=False, max_new_tokens=20, streamer=streamer, assistant_model=draft)
    assert output.tolist() == reference.tolist() and draft.last_generation_stats.tau > 1
    assert streamer.ended and streamer.chunks[0] == ids[0].tolist()  # the prompt comes first
    assert sum(streamer.chunks[1:], []) == output[0, ids.shape[1] :].tolist()
    assert any(len(chunk) > 1 for chunk in streamer.chunks[1:])  # several tokens per verify step


def test_left_padded_prompt_and_dict_output_with_hidden_states(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    ids = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompts[1]], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(prompts[1])], dim=1)
    greedy_both(target, draft, ids, attention_mask=mask, max_new_tokens=16, pad_token_id=0)
    kwargs = dict(
        max_new_tokens=12, do_sample=False, return_dict_in_generate=True, output_scores=True, output_hidden_states=True
    )
    reference = target.generate(prompts[1], **kwargs)
    output = target.generate(prompts[1], assistant_model=draft, **kwargs)
    assert output.sequences.tolist() == reference.sequences.tolist() and len(output.scores) == 12
    assert draft.last_generation_stats.tau > 1
    # every layer of every step, as without the draft (the draft itself only needs a few layers)
    assert len(output.hidden_states) == len(reference.hidden_states) == 12
    for ours, theirs in zip(output.hidden_states, reference.hidden_states):
        assert len(ours) == len(theirs) == target.config.num_hidden_layers + 1
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("table_bytes", [0, 64 * 2**20])
@pytest.mark.parametrize("subvocab", [False, True])
def test_fast_rollout_equals_the_teacher_forced_head(fitted_pair, monkeypatch, table_bytes, subvocab):
    """The rollout (W1_H·H for all slots at once, gate lookup table, one GRU step per drafted token) gives
    exactly the logits of the teacher-forced path the trainer uses: GRU over [anchor, d_1 …] from zero, then
    W2·SiLU(W1·[H ; S])."""
    from transformers import GenerationConfig
    from transformers.generation.logits_process import LogitsProcessorList

    from domino_hf.modeling.generation_domino import DominoCandidateGenerator
    from domino_hf.modeling.target_domino import DominoHeadTables

    monkeypatch.setattr(DominoHeadTables, "MAX_TABLE_BYTES", table_bytes)
    import copy

    target, shared_draft, prompts = fitted_pair("llama")
    draft = copy.deepcopy(shared_draft)  # the fitted pair is shared by other tests
    if subvocab:
        draft.config.draft_vocab_ids = list(range(0, target.config.vocab_size, 2))
        draft.embed_proj[2] = torch.nn.Linear(
            draft.config.correction_rank, len(draft.config.draft_vocab_ids), bias=False,
        )
    config = GenerationConfig(do_sample=True, max_length=64)
    generator = DominoCandidateGenerator(draft, target, config, LogitsProcessorList(), prompts[0], DraftingSettings())
    n = draft.config.num_draft_tokens
    torch.manual_seed(0)
    slot_hidden = torch.randn(n, draft.config.hidden_size)
    with torch.no_grad():
        base = generator.head.logits(slot_hidden)
        ids, logits, _ = generator._rollout(slot_hidden, base, prompts[0])
        realised = torch.cat([prompts[0][0, -1:], ids[0, :-1]])  # [anchor, d_1 … d_{n-1}]
        states = draft.causal_states(generator.head.embed(realised)[None])[0]  # (n, Hg)
        expected = base + draft.correction(slot_hidden, states).float()
        expected[: draft.config.pure_draft_prefix_len] = base[: draft.config.pure_draft_prefix_len]
    assert ids.shape[1] == n
    assert torch.allclose(logits[0], generator.head.to_full_vocab(expected), atol=1e-5)


def test_adaptive_draft_length_proposes_fewer_tokens_and_stays_lossless(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    draft.generation_config.context_lookup_tokens = 0  # the Domino block alone
    full = [greedy_both(target, draft, ids, max_new_tokens=20)[1] for ids in prompts[:3]]
    draft.generation_config.draft_confidence_threshold = 0.6
    short = [greedy_both(target, draft, ids, max_new_tokens=20)[1] for ids in prompts[:3]]
    n = draft.config.num_draft_tokens
    assert all(max(s.drafted) == n for s in full)
    assert any(d < n for s in short for d in s.drafted)
    def rate(stats):
        return sum(sum(s.accepted) for s in stats) / sum(sum(s.drafted) for s in stats)

    assert rate(short) >= rate(full)  # the tail it skips is the unlikely part


def test_max_draft_tokens_caps_the_proposal_and_stays_lossless(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    draft.generation_config.max_draft_tokens = 2
    _, stats = greedy_both(target, draft, prompts[0], max_new_tokens=20)
    assert max(stats.drafted) == 2 and stats.num_steps > 0


@pytest.mark.parametrize("draft_vocab_ids", [None, "produced"])
def test_bf16_draft_for_an_fp32_target_stays_lossless(fitted_pair, draft_vocab_ids):
    """A draft in a cheaper precision than the target (the CPU bench's default where bf16 is native) only
    changes what is proposed: the fp32 target's verification keeps the output identical, and the fitted draft
    still gets accepted."""
    vocab = _produced_tokens(make_tiny_target("llama"), tiny_prompts(2)) if draft_vocab_ids else None
    pair = fitted_pair("llama", num_prompts=2, draft_vocab_ids=vocab) if vocab else fitted_pair("llama")
    target, draft, prompts = pair
    draft = draft.to(torch.bfloat16)
    settings = DraftingSettings()
    generator = DominoCandidateGenerator(draft, target, target.generation_config, None, prompts[0], settings)
    assert generator.head.weight.dtype == torch.bfloat16
    again = DominoCandidateGenerator(draft, target, target.generation_config, None, prompts[1], settings)
    assert again.head is generator.head  # cast once, reused by later generate calls
    accepted = 0
    for ids in prompts[:2] + tiny_prompts(1, seed=5):
        _, stats = greedy_both(target, draft, ids, max_new_tokens=24)
        assert_drafted(stats)
        accepted += sum(stats.accepted)
    assert accepted > 0



def test_generation_caches_never_keep_a_target_alive():
    """The per-(draft, target) caches (target head, head tables) are weak on both sides: neither the target
    nor the draft is kept alive by them."""
    import gc
    import weakref

    from domino_hf.modeling.target_domino import _GENERATION_CACHES

    target = make_tiny_target("llama")
    draft = make_tiny_draft(target)
    greedy_both(target, draft, tiny_prompts(1)[0], max_new_tokens=8)
    assert set(_GENERATION_CACHES[draft][target]) == {"target_head", "head_tables"}
    alive = weakref.ref(target)
    del target
    gc.collect()
    assert alive() is None and len(_GENERATION_CACHES[draft]) == 0
    target = make_tiny_target("llama")
    greedy_both(target, draft, tiny_prompts(1)[0], max_new_tokens=8)
    alive = weakref.ref(draft)
    del draft
    gc.collect()
    assert alive() is None


def test_float16_draft_projects_huge_target_states_without_overflow():
    """Target hidden states beyond float16's range (Gemma-3 reaches 3e5) stay finite in a float16 draft."""
    target = make_tiny_target("llama")
    draft = make_tiny_draft(target).to(torch.float16)
    states = torch.full((1, 3, draft.fc.in_features), 3e5)
    fused = draft.fuse_context(states)
    assert fused.dtype == torch.float16 and torch.isfinite(fused).all()
