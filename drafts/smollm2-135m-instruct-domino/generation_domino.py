# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""`target.generate(assistant_model=domino_draft)`: the candidate generator (dispatch: `dispatch_domino.py`).

Remote-code file (torch + transformers only). One speculative step, driven by transformers'
`_assisted_decoding`:

    target hidden states of the newly accepted positions ──► draft context cache (fc → K/V per layer)
    [anchor, MASK, …] ──► backbone (one forward) ──► H ──► target LM head (one call) ──► base logits
    for each draft slot j:  logits_j = base_j + W2·SiLU(W1·[H_j ; S])  →  token d_j  →  S = GRU(S, emb(d_j))
    transformers verifies [anchor, d_1 … d_k] in one target forward (exact match, or speculative sampling
    with our per-slot processed logits as q), appends the bonus token and crops its cache.
"""

from __future__ import annotations

import logging
import math
import time

import torch
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from .cost_domino import VerifyCost
from .hybrid_domino import (
    DraftBackoff,
    SourceChooser,
    Span,
    _Step,
    expected_accepted,
    shadow_accepted,
    store_history,
)
from .proposer_domino import DominoProposer, Proposal, span_sources
from .target_domino import DominoTargetHead, check_draft_fits_target, context_features, hidden_state_indices

logger = logging.getLogger(__name__)


def acceptance_length(accepted) -> float | None:
    """τ, the one definition (generation stats, benchmark, training probe): tokens produced per target verify
    forward, bonus token included, from the draft tokens accepted at each step; None without any step."""
    return (sum(accepted) + len(accepted)) / len(accepted) if len(accepted) else None


HEURISTIC_SCHEDULES = ("heuristic", "heuristic_transient")


def lap_timer(timings: dict, enabled: bool, sync=lambda: None):
    """`lap(phase)` adds the seconds since the last lap (or since this call) to `timings[phase]`, `sync()`ing a
    device first (a CUDA synchronize, so that queued work is counted); a no-op when not `enabled`."""
    if not enabled:
        return lambda phase: None
    sync()
    last = [time.perf_counter()]

    def lap(phase):
        sync()
        now = time.perf_counter()
        timings[phase] = timings.get(phase, 0.0) + now - last[0]
        last[0] = now

    return lap


class DominoContextCache:
    """Per-layer keys/values of the verified context, each (b, kv_heads, c, head_dim), that the generator keeps
    for the draft's forward (`past_key_values`). Only accepted positions are appended, so it is never cropped;
    the block's own keys/values are never stored."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def __len__(self) -> int:
        return 0 if not self.keys else self.keys[0].shape[2]

    def update(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor):
        if layer_idx == len(self.keys):
            self.keys.append(keys)
            self.values.append(values)
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], keys], dim=2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], values], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]


class DominoGenerationStats:
    """What one `generate` call did, per verify step (prefill excluded). The generator owns it; the draft shows
    the last call's as `draft.last_generation_stats`.

    Attributes:
        drafted (`list[int]`): tokens proposed at each step.
        accepted (`list[int]`): of those, tokens the target accepted (the bonus token not counted).
        sources (`list[str]`): where each proposal came from: `domino` (the draft's block), `lookup` (a span
            copied from the context), `cache` (a span from the suffix cache of earlier generations) or `none` (a
            plain target step).
        draft_runs (`list[bool]`): whether the draft's forward ran at each step (a span can go out without it).
        timings (`dict[str, float]`): seconds per drafting phase, filled only when profiling (`profile_drafting`).
        per_row (`list[DominoGenerationStats]`): each prompt's own steps, one entry per row of the call; for a
            single prompt decoded by transformers' loop, the call's stats themselves.
    """

    def __init__(self):
        self.drafted: list[int] = []
        self.accepted: list[int] = []
        self.sources: list[str] = []
        self.draft_runs: list[bool] = []
        self.timings = {"backbone": 0.0, "lm_head": 0.0, "head_rollout": 0.0}
        self._per_row: list | None = None

    @property
    def per_row(self) -> list:
        return [self] if self._per_row is None else self._per_row

    @per_row.setter
    def per_row(self, rows: list) -> None:
        self._per_row = rows

    def record(self, drafted: int, accepted: int, source: str, draft_ran: bool = False) -> None:
        self.drafted.append(drafted)
        self.accepted.append(accepted)
        self.sources.append(source)
        self.draft_runs.append(draft_ran)

    @property
    def num_steps(self) -> int:
        return len(self.accepted)

    @property
    def tau(self) -> float:
        """Mean acceptance length: tokens produced per target verify forward, bonus token included."""
        return acceptance_length(self.accepted) or 0.0

    def source_counts(self) -> dict[str, int]:
        return {source: self.sources.count(source) for source in ("domino", "lookup", "cache", "none")}

    def __repr__(self):
        return (
            f"DominoGenerationStats(steps={self.num_steps}, tau={self.tau:.3f}, sources={self.source_counts()}, "
            f"draft_runs={sum(self.draft_runs)})"
        )


class DominoCandidateGenerator(CandidateGenerator):
    """Proposes candidates for transformers' assisted decoding (batch size 1), one verify step at a time.

    Each step it has up to three proposals: the Domino block; when the sequence's last n-gram occurred before, the
    span that followed its most recent occurrence (`ContextLookup`); and, with a suffix cache, the continuation
    earlier generations most often had after the longest match of the sequence's last tokens (`SuffixLookup`).
    It keeps the one with more expected accepted tokens per unit of cost under the draft's own probabilities and
    the spans' history, calibrated by past acceptance (`SourceChooser`), all computed before any token is drawn
    (a choice that looked at a drawn token would bias speculative sampling); when a span is expected to win
    anyway, the draft does not run. A span is deterministic given the context and the cache, so its q is
    one-hot. When the draft's blocks keep being rejected it backs off to plain steps (`DraftBackoff`). The
    cache is only read while the call runs; `remember` adds the call's prompt and output when it returns.

    The dispatch (`make_candidate_generator` in `dispatch_domino.py`) builds it for each `generate` call.

    Args:
        draft ([`DominoDraftModel`]): the draft.
        target (`PreTrainedModel`): the target being decoded; the draft borrows its embedding and LM head.
        generation_config (`GenerationConfig`): the call's config (max length, sampling, hidden states asked).
        logits_processor (`LogitsProcessorList` or `None`): the target's processors, applied to the draft's
            logits too (sampling, and the draft's q in speculative sampling).
        input_ids (`torch.LongTensor` of shape `(1, prompt_length)`): the prompt; batch size 1 only.
        settings ([`DraftingSettings`]): the drafting policy of this call, resolved by the dispatch.
        suffix_cache ([`SuffixCache`], *optional*): the store of earlier generations this call reads and then
            adds to (`remember`); None drafts without one (`use_suffix_cache=False`).
        stopping_criteria (`StoppingCriteriaList`, *optional*): the call's criteria; those transformers does not
            check inside an accepted block (stop strings, user criteria) cut proposals here.
        stats ([`DominoGenerationStats`], *optional*): where the steps are recorded (a fresh one when omitted);
            the generator owns it as `stats`.
        profile_phases (`bool`, defaults to `False`): time the draft's phases into `stats.timings` (synchronising
            a CUDA device around each phase, which slows drafting down).
    """

    requires_model_outputs = True

    def __init__(self, draft, target, generation_config, logits_processor, input_ids, settings,
                 stopping_criteria=None, stats=None, profile_phases=False, suffix_cache=None):
        if input_ids.shape[0] != 1:
            raise ValueError(
                f"Domino speculative decoding supports batch size 1, got {input_ids.shape[0]} sequences. "
                "Call generate once per prompt (or drop `assistant_model` for batched decoding)."
            )
        check_draft_fits_target(draft.config, target)
        self.draft = draft
        self.config = draft.config
        # The draft may run in a cheaper precision than the target (e.g. bf16 draft, fp32 target): drafting
        # only proposes, the target's verification alone decides the output, so this stays lossless.
        self.head = DominoTargetHead.cached(draft, target)
        # Ask the target only for the hidden layers the draft reads, or for all of them when the caller collects
        # hidden states (`return_dict_in_generate` splits every layer).
        wanted = True if generation_config.output_hidden_states else hidden_state_indices(self.config.target_layer_ids)
        self.model_kwargs_overrides = {"output_hidden_states": wanted}
        self.cache = DominoContextCache()
        self.pending_context: list[torch.Tensor] = []  # (1, n, n_layers·H) verified, not yet in the cache
        self.max_length = generation_config.max_length
        self.do_sample = bool(generation_config.do_sample)
        self.logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
        # Criteria transformers does not enforce inside an accepted block (stop strings, user criteria).
        self.extra_stopping = [
            c for c in (stopping_criteria or []) if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))
        ]
        self.return_logits = self.do_sample or generation_config.assistant_ensemble_weight is not None
        self.settings = settings
        self.cap = math.inf if settings.max_draft_tokens is None else settings.max_draft_tokens
        self.schedule, self.threshold = settings.num_assistant_tokens_schedule, settings.draft_confidence_threshold
        self.suffix_cache = suffix_cache
        sources = span_sources(settings, suffix_cache, generation_config.eos_token_id, self.head.vocab_size,
                               self.logits_processor)
        self.proposer = DominoProposer(draft, target, self.extra_stopping, sources)
        # The draft's logits go through the processors when they are sampled from, handed over as q, or processed.
        self.processing = bool(self.logits_processor) or self.return_logits
        cost = VerifyCost.for_device(target.device, measure=settings.measure_verify_cost)
        proposed = self.config.num_draft_tokens + 1
        self.backoff = DraftBackoff(cost=cost, proposed=proposed) if settings.draft_backoff else None
        max_span = max(settings.context_lookup_tokens, settings.suffix_cache_max_span if suffix_cache else 0, 1)
        history = store_history(suffix_cache)  # None without a store, or for one that keeps no history
        self.chooser = SourceChooser(max_span, cost, cut_spans=settings.cut_lookup_spans, history=history)
        self._proposed_at = 0.0  # when the last proposal went to the target: its verify is timed from there
        self._span: Span | None = None  # the best span found at the step being proposed
        self._spans: tuple[Span, ...] = ()  # every span found at that step, the best first
        # Plain greedy drafting: the greedy scoring rollout already is the block to propose.
        self.scoring_is_the_proposal = not (
            self.do_sample or self.return_logits or self.threshold > 0 or self.extra_stopping or self.logits_processor
        )
        self.stats = stats if stats is not None else DominoGenerationStats()
        self._step: _Step | None = None  # the step awaiting verification
        self.profile = bool(profile_phases)
        self._sync = torch.cuda.synchronize if (self.profile and draft.device.type == "cuda") else (lambda: None)

    @property
    def num_drafting_tokens(self) -> int:
        """The longest verify forward a step can ask for (anchor + proposal); transformers ≥ 5.25 reads it to
        size what its cache records for a roll-back."""
        spans = [source.max_tokens for _, source in self.proposer.span_sources]
        return 1 + max([self.config.num_draft_tokens, *spans])

    @torch.no_grad()
    def get_candidates(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False, **kwargs):
        # The first call comes before the target's prefill: no hidden states yet, so no candidates.
        if is_first_iteration:
            return input_ids, None
        cur_len = input_ids.shape[1]
        self._span, self._spans = None, ()
        self._stash_context(model_outputs, cur_len)
        budget = min(self.cap, self.max_length - cur_len - 1)  # the target adds a bonus token
        if budget <= 0:
            return self._propose(input_ids, None)
        self._spans = self.proposer.find_spans(input_ids, budget, self.chooser.better_span)  # best first
        self._span = self._spans[0] if self._spans else None
        span = input_ids.new_tensor(self._span.tokens) if self._span else input_ids.new_zeros(0)  # (L,) target ids
        if self._span and self.chooser.span_first(self._span):
            return self._propose_lookup(input_ids, span)
        if self.backoff is not None and not self.backoff.should_draft():
            return self._propose_lookup(input_ids, span) if len(span) else self._propose(input_ids, None)

        n_draft = min(budget, self.config.num_draft_tokens)
        started = time.perf_counter()
        clock = self._clock()
        slot_hidden, base_logits = self._backbone(input_ids, model_kwargs, n_draft, clock)  # (n, H), (n, V')
        scored = predicted = None
        if len(span):  # choose before drawing anything: both scores are functions of the context only
            scored = self._rollout(slot_hidden, base_logits, input_ids, greedy=True)
            predicted = float(scored.expected[0, -1])  # what the block expects to gain (the proposer's estimate)
            lookup = 0.0
            if self.chooser.needs_lookup_score(predicted, n_draft, self._span):
                forced = self._rollout(slot_hidden, base_logits, input_ids, forced=span[:n_draft])
                lookup = expected_accepted(forced.probs[0].tolist(), len(span))  # the span, past the block too
            if self.chooser.choose(predicted, n_draft, lookup, self._span) != "domino":
                clock("head_rollout")
                self.chooser.observe_draft(time.perf_counter() - started)
                return self._propose_lookup(input_ids, span, lookup, shadow=scored.ids[0])
        if scored is not None and self.scoring_is_the_proposal:
            proposal = scored
        else:
            proposal = self._rollout(slot_hidden, base_logits, input_ids)
        clock("head_rollout")
        self.chooser.observe_draft(time.perf_counter() - started)
        return self._propose(input_ids, proposal, predicted)

    # ------------------------------------------------------------------------------------------- proposals
    def _propose(self, input_ids, proposal, predicted=None, shadow=None, draft_ran=None):
        """Record what is proposed (its source, the accepted tokens the choice expected of it when it weighed one
        against the other, and the block a span beat) and hand it to transformers: candidate ids
        (1, cur_len + k), and its q when sampling (else None). `proposal` None or empty: a plain step."""
        source = "none" if proposal is None or proposal.ids.shape[1] == 0 else proposal.source
        draft_ran = source == "domino" if draft_ran is None else draft_ran
        if source == "none":
            self._step = _Step(0, "none", None, None, draft_ran, self._spans)
            self._proposed_at = time.perf_counter()
            return input_ids, None
        self._step = _Step(proposal.ids.shape[1], source, predicted, shadow, draft_ran, self._spans)
        candidates = torch.cat([input_ids, proposal.ids.to(input_ids.device)], dim=1)
        self._proposed_at = time.perf_counter()
        return candidates, proposal.logits if self.return_logits else None

    def _propose_lookup(self, input_ids, span, predicted=None, shadow=None):
        """The step's best span (context or cache) as candidates; when sampling, q is one-hot: the span is fixed
        given the context and the cache. (What it expects to gain is the chooser's, from the span's history.)"""
        span = span[: self.chooser.span_length(self._span)].to(input_ids.device)
        proposal = self.proposer.span_proposal(span, self._span.source, self.return_logits)
        return self._propose(input_ids, proposal, predicted, shadow, draft_ran=shadow is not None)

    # ------------------------------------------------------------------------------------------- the draft
    def _stash_context(self, model_outputs, cur_len):
        """Keep the target hidden states of the positions verified since the last call (all but the new
        anchor); the next backbone forward appends them to the draft's context cache."""
        known = len(self.cache) + sum(t.shape[1] for t in self.pending_context)
        n_new = cur_len - 1 - known
        if n_new <= 0:
            return
        if model_outputs is None or getattr(model_outputs, "hidden_states", None) is None:
            raise ValueError("Domino drafting needs the target's hidden states from the previous forward.")
        self.pending_context.append(context_features(model_outputs.hidden_states, self.config.target_layer_ids, n_new))

    def _backbone(self, input_ids, model_kwargs, n_draft, lap=lambda phase: None):
        """The proposer's backbone forward over [anchor, MASK, …], absorbing the stashed context into the draft's
        context cache: slot states (n, H) and base logits (n, V')."""
        cur_len, device = input_ids.shape[1], self.draft.device
        context = torch.cat(self.pending_context, dim=1) if self.pending_context else None
        self.pending_context = []
        n_cached, n_new = len(self.cache), 0 if context is None else context.shape[1]
        slots, base = self.proposer.backbone(
            input_ids[:, -1], torch.tensor([cur_len - 1], device=device), context,
            torch.arange(n_cached, n_cached + n_new, device=device)[None], self._key_mask(model_kwargs, cur_len),
            self.cache, n_draft, lap,
        )
        return slots[0], base[0]

    def _clock(self):
        """A lap timer into `stats.timings` when profiling, else a no-op."""
        return lap_timer(self.stats.timings, self.profile, self._sync)

    def _key_mask(self, model_kwargs, cur_len):
        """Boolean (1, 1, 1, cur_len - 1 + B) key mask when the prompt has padding, else None."""
        mask = (model_kwargs or {}).get("attention_mask")
        if mask is None or bool(mask.all()):
            return None
        context = mask[:, : cur_len - 1].bool()
        block = torch.ones(1, self.config.block_size, dtype=torch.bool, device=mask.device)
        return torch.cat([context, block], dim=1)[:, None, None, :].to(self.draft.device)

    def _rollout(self, slot_hidden, base_logits, input_ids, forced=None, greedy=False) -> Proposal:
        """The proposer's rollout of this sequence's block ([`Proposal`], one row): ids (1, k), their processed
        logits (1, k, V) when sampling, the draft's probability of each chosen token and what the block expects
        to gain, when scored.

        `forced` (k,) teacher-forces the given tokens and `greedy` takes argmaxes even when sampling (scoring
        passes, free of random draws). Otherwise drafting stops early at a stop criterion, or when the draft's
        chain probability would fall below the confidence threshold (fewer candidates: still lossless)."""
        scoring = forced is not None or greedy
        mode = "greedy" if self.processing else "score"
        if not scoring and self.do_sample:
            mode = "sample"

        def process(full, ids):  # the processors see the sequence the slot's token would follow
            if ids is not None and self.logits_processor:
                return self.logits_processor(torch.cat([input_ids, ids.to(input_ids.device)], dim=1), full)
            return self.logits_processor(input_ids, full)

        def stop(ids):
            return self.proposer.stops(torch.cat([input_ids, ids.to(input_ids.device)], dim=1))

        return self.proposer.rollout(
            slot_hidden[None], base_logits[None], input_ids[:, -1], mode,
            forced=None if forced is None else forced[None], process=process,
            threshold=0.0 if scoring else self.threshold,
            stop=stop if not scoring and self.extra_stopping else None, with_probs=scoring,
        )

    def remember(self, sequences) -> None:
        """After the call: add its prompt and output (`sequences`, (1, L) ids) to the suffix cache, if any, and
        keep what its spans were worth in this call for the next one (`store_history`)."""
        if self.suffix_cache is None:
            return
        self.suffix_cache.add(sequences[0].tolist())
        history = store_history(self.suffix_cache)
        if history is not None:
            history.update(self.chooser.history("cache"))

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        if self._step is None:
            return
        step, accepted = self._step, int(num_matches)  # int() waits for the verify forward on any device
        self.chooser.cost.observe(step.proposed + 1, time.perf_counter() - self._proposed_at)
        proposed, source = step.proposed, step.source
        self.stats.record(proposed, accepted, source, step.draft_ran)
        verified = input_ids[0, -(accepted + 1) :].tolist()  # this step's accepted tokens + bonus (the target's)
        shadow = None
        if step.shadow is not None:  # the draft ran but its block lost to a span: what would it have got?
            shadow = shadow_accepted(step.shadow.tolist(), verified)
        self.chooser.update(step, accepted, shadow, verified)
        if self.backoff is not None and (source == "domino" or shadow is not None):
            # a block that lost to a span is judged by what it would have had accepted
            self.backoff.update(accepted if source == "domino" else shadow)
        if self.schedule in HEURISTIC_SCHEDULES and proposed:
            self.cap = self.cap + 2 if accepted == proposed else max(1, self.cap - 1)
        self._step = None
