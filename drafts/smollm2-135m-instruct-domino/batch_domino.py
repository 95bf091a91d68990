# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""The batched verify loop: exact Domino speculative decoding of B ≥ 2 prompts at once.

Remote-code file (torch + transformers only). transformers' `_assisted_decoding` verifies one sequence; the
dispatch (`dispatch_domino.py`) sends a Domino draft with a batch of prompts here instead. One step:

    live rows' anchors + their new context ──► one draft forward (every row's block) ──► head rollout, per row
    the draft's per-slot confidence ──► one proposal length q for the step (expected tokens per second of the
        whole batch under the measured cost of a forward over rows × q tokens; q = 1 is a plain batched step)
    one target forward over (rows, q) with a per-row mask (`ragged_domino.py`) ──► per row: exact match (greedy)
        or speculative sampling ──► each row keeps its accepted tokens and the target's bonus token
    rows that reach EOS, `max_new_tokens` or a stop string leave the batch (their cache rows are dropped)

Rows accept different numbers of tokens: each keeps its own positions and its own cache entries
(`RaggedCache`), so nothing is realigned or padded step after step. Stopping criteria other than EOS, length and
stop strings (lm-eval's, a user's) are asked exactly as plain decoding asks them: over the whole batch, one
token column at a time, once every row has that column (`stops_domino.py`). Every choice (whether the draft runs, q) is
made from the draft's distributions and past timings, never from a token drawn for the step: sampling is exact (and,
the timings being left out of sampling calls by default, a seeded call repeats itself: `_verify_cost`). Drafting
goes through the proposer (`proposer_domino.py`), acceptance through `acceptance_domino.py`.
"""

from __future__ import annotations

import logging
import time

import torch
from transformers.cache_utils import DynamicCache
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StopStringCriteria,
)

from .acceptance_domino import accept_chain
from .batch_policy_domino import BatchPolicy
from .cost_domino import VERIFY_COSTS, VerifyCost
from .generation_domino import HEURISTIC_SCHEDULES, lap_timer
from .hybrid_domino import store_history
from .proposer_domino import DominoProposer, Proposal, span_sources
from .ragged_domino import (
    RaggedCache,
    RaggedContextCache,
    attention_masks,
    check_attention_supported,
    context_mask,
    verify_mask,
)
from .stops_domino import RowEnds
from .tree_domino import TreeSteps
from .target_domino import DominoTargetHead, context_features, hidden_state_indices

logger = logging.getLogger(__name__)

# Logits warpers that read no token ids: applied to every row and slot in one call.
_ROW_FREE_PROCESSORS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
                        "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper")
# Stopping criteria that judge each row from its own tokens: checked per row, right after the row's tokens.
_ROW_CRITERIA = (StopStringCriteria,)


class DominoBatchDecoder:
    """Decodes a left-padded batch with a Domino draft, each row exactly as plain decoding decodes it.

    Args:
        draft ([`DominoDraftModel`]): the draft.
        target (`PreTrainedModel`): the target; its attention must take explicit 4D masks (eager or SDPA).
        generation_config (`GenerationConfig`): the call's config (max length, sampling, eos and pad ids).
        logits_processor (`LogitsProcessorList` or `None`): the target's processors (applied to the draft's logits
            too, as its q when sampling).
        stopping_criteria (`StoppingCriteriaList` or `None`): the call's criteria.
        settings ([`DraftingSettings`]): the call's drafting policy (every field is read; the dispatch refuses
            `use_draft_tree` for a batch).
        stats ([`DominoGenerationStats`]): where steps are recorded: one entry per row and step, and `per_row`.
        suffix_cache ([`SuffixCache`], *optional*): the store of earlier generations each row reads spans from.
        profile (`bool`, defaults to `False`): time the step's phases into `stats.timings` (`_clock`).
        tree ([`TreeShape`], *optional*): a single row verifies a draft tree of this shape each step
            (`tree_domino.py`) instead of a chain.
        cache_argument (`str`, defaults to `"cache"`): the keyword the target's forward takes its cache by on the
            running transformers (the dispatch's `CACHE_ARGUMENT`).
        cost_store ([`VerifyCostStore`], *optional*): the measured verify costs greedy calls start from and add to
            (`VERIFY_COSTS`, the process's store, when omitted).
    """

    def __init__(self, draft, target, generation_config, logits_processor, stopping_criteria, settings, stats,
                 suffix_cache=None, profile=False, tree=None, cache_argument="cache", cost_store=None):
        check_attention_supported(target)
        self.draft, self.target, self.config = draft, target, draft.config
        self.head = DominoTargetHead.cached(draft, target)
        self.generation_config = generation_config
        self.do_sample = bool(generation_config.do_sample)
        self.processors = logits_processor if logits_processor is not None else LogitsProcessorList()
        self.row_free = all(type(p).__name__ in _ROW_FREE_PROCESSORS for p in self.processors)
        criteria = list(stopping_criteria or [])
        self.row_criteria = [c for c in criteria if isinstance(c, _ROW_CRITERIA)]
        self.max_time = [c for c in criteria if isinstance(c, MaxTimeCriteria)]
        self.batch_criteria = [c for c in criteria if not isinstance(
            c, (*_ROW_CRITERIA, MaxTimeCriteria, MaxLengthCriteria, EosTokenCriteria))]
        eos = generation_config._eos_token_tensor
        self.eos = None if eos is None else eos.reshape(-1)
        self.eos_ids = set() if eos is None else set(self.eos.tolist())
        # Plain decoding writes pad tokens after a row's end only when it has an EOS criterion; without one a
        # stopped row keeps generating until the whole batch stops, and so it does here.
        self.pad_finished = self.eos is not None
        pad = generation_config._pad_token_tensor
        self.pad_id = int(pad) if pad is not None else (int(self.eos[0]) if self.eos is not None else 0)
        self.layer_ids = self.config.target_layer_ids
        self.wanted = hidden_state_indices(self.layer_ids)
        self.n_draft = self.config.num_draft_tokens  # `max_draft_tokens` caps each row's room (`caps`)
        self.settings, self.suffix_cache, self.stats, self.profile = settings, suffix_cache, stats, bool(profile)
        self.tree, self.cache_argument = tree, cache_argument
        self.cost_store = VERIFY_COSTS if cost_store is None else cost_store
        # Spans are cut at EOS only: the processors may keep per-row state sized to the batch, so they are never
        # asked about one row alone (a span token they forbid is rejected by the verify: exact, one token wasted).
        # Drafts are not cut at stop strings either: a row's output is cut where it ends (`RowEnds`).
        self.proposer = DominoProposer(draft, target, span_sources=span_sources(settings, suffix_cache, self.eos,
                                                                                self.head.vocab_size))
        self.tree_steps = None if tree is None else TreeSteps(
            self.proposer, tree, self.n_draft, self.do_sample, self._process if self.processors else None,
            self.row_free)

    # ------------------------------------------------------------------------------------------ the loop
    @torch.no_grad()
    def decode(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, streamer=None):
        """(B, L) left-padded prompts (and their (B, L) mask) -> (B, L + T) sequences, padded as plain decoding
        pads them."""
        device = input_ids.device
        batch, width = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if bool((attention_mask[:, -1] == 0).any()):
            raise ValueError("Batched Domino decoding needs left-padded prompts (the tokenizer's padding_side='left').")
        self.width = width
        self.budget = self.generation_config.max_length - width
        start = (attention_mask == 0).long().sum(dim=1)  # (B,) left padding per row
        self.prompt_start = start.tolist()
        max_span = max(self.settings.context_lookup_tokens,
                       self.settings.suffix_cache_max_span if self.suffix_cache else 0, 1)
        # every row's tokens, and one verify forward past the longest: a block or a span
        longest = max(self.config.block_size, max_span)
        if self.tree is not None:  # a tree's nodes: `width` per slot, and a span's
            longest = self.n_draft * self.tree.width + max_span
        capacity = self.generation_config.max_length + longest + 1
        self.sequences = torch.full((batch, capacity), self.pad_id, dtype=torch.long, device=device)
        self.sequences[:, :width] = input_ids
        self.ends = RowEnds(self.sequences, width, self.budget, self.eos_ids, self.row_criteria, self.batch_criteria,
                            self.pad_id, self.pad_finished, streamer)
        self.stats.per_row = [type(self.stats)() for _ in range(batch)]
        self.rows = torch.arange(batch, device=device)  # live row -> original row
        self.policy = BatchPolicy(batch, max_span, self._verify_cost(width), self.settings.draft_backoff,
                                  store_history(self.suffix_cache), threshold=self.settings.draft_confidence_threshold,
                                  cut_spans=self.settings.cut_lookup_spans)
        cap = self.settings.max_draft_tokens
        self.caps = [capacity if cap is None else cap] * batch  # tokens a row may propose per step
        self.cache = RaggedCache(start, capacity)
        self.draft_cache = RaggedContextCache(start.to(self.draft.device), capacity)
        self._prefill(input_ids)
        self.ends.replay(self.rows.tolist())
        self._drop_finished()  # the prefill's token may end a row (`max_new_tokens=1`, EOS)
        while len(self.rows):
            self._tree_step() if self.tree is not None and batch == 1 else self._step()
            self.ends.replay(self.rows.tolist())
            self._drop_finished()
            self._lap("rows")
        self.ends.replay(self.rows.tolist(), final=True)
        return self.ends.batch_view(width + self.ends.longest())

    def _verify_cost(self, width: int):
        """The verify-cost curve the policy chooses lengths by. Decoding greedily, the forwards are timed into the
        curve earlier calls measured at this context length (`cost_store`). Sampling, the fixed prior, or with
        `measure_verify_cost` a curve this call measures for itself: a timing-dependent length changes which random
        numbers a step draws, and a seeded call never depends on an earlier one."""
        if not self.do_sample:
            return self.cost_store.cost(self.target, width)
        return VerifyCost.for_device(self.target.device, measure=self.settings.measure_verify_cost)

    def _prefill(self, input_ids):
        """The prompts' forward. Without left padding it runs as plain decoding's does (a causal mask the attention
        kernel needs not read: at 2,800 tokens an explicit mask made SDPA take 3.2 s more), into a `DynamicCache`
        whose entries the ragged cache then takes over; padded rows need their own masks."""
        states = self.cache.states
        length = input_ids.shape[1]
        if int(states.start.max()) == 0:
            prefill = DynamicCache()
            out = self.target(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=True,
                              output_hidden_states=self.wanted, logits_to_keep=1, **{self.cache_argument: prefill})
            states.adopt([layer.keys for layer in prefill.layers], [layer.values for layer in prefill.layers])
        else:
            states.plan(length)
            out = self._forward(input_ids, verify_mask(states, length), length, keep=1)
            states.advance(torch.full_like(states.end, length))
        self.pending = context_features(out.hidden_states, self.layer_ids)  # (b, L, F): context not yet drafted on
        self.pending_counts = torch.full_like(states.end, input_ids.shape[1])
        logits = out.logits[:, -1:].float()  # (b, 1, V)
        tokens = accept_chain(self._target_logits(logits, None), None, torch.zeros_like(self.rows),
                              do_sample=self.do_sample)[0][:, 0]
        self._append([[int(t)] for t in tokens], torch.ones_like(self.rows), None)

    def _step(self):
        """One verify step of every live row: each row's proposal (its draft block or a span), one length q for
        the step, one target forward, each row's accepted tokens."""
        b = len(self.rows)
        self.anchors = self.sequences[self.rows, self.width + self._generated_tensor() - 1]  # (b,)
        generated = self.ends.generated
        room = torch.tensor([min(self.budget - generated[r] - 1, self.caps[r]) for r in self.rows.tolist()])
        self.policy.begin_step(self.rows.tolist())
        lap = self._clock()
        spans = self._find_spans(room)  # per row: the best span, or None
        drafting = self.n_draft > 0 and int(room.max()) > 0 and self.policy.should_draft()
        draft = None
        if drafting:
            began = time.perf_counter()
            draft = self._draft(int(room.max()))
            self.policy.observe_draft(time.perf_counter() - began)
            lap = self._clock()  # the draft's phases were laps of their own
        proposal = self.policy.propose(spans, draft, room)
        q = self.policy.choose_length(proposal, drafting)
        step_ids = torch.cat([self.anchors[:, None], proposal.ids[:, : q - 1].to(self.anchors)], dim=1)  # (b, q)
        proposed = proposal.room.clamp(max=q - 1).to(self.anchors)  # draft tokens each row has verified
        q_logits = self._q_logits(proposal, draft.logits if draft else None, q) if self.do_sample and q > 1 else None
        states = self.cache.states
        states.plan(q)
        began = time.perf_counter()
        lap("rows")
        out = self._forward(step_ids, verify_mask(states, q), q, keep=q)
        tokens, accepted = accept_chain(self._target_logits(out.logits.float(), step_ids), step_ids, proposed,
                                        q_logits, self.do_sample)
        self.policy.observe_verify(b * q, time.perf_counter() - began)  # the acceptance read the logits: it ran
        lap("verify")
        states.advance(accepted + 1)
        accepted_list = accepted.tolist()
        new = [step_ids[i, 1 : 1 + n].tolist() + [int(tokens[i, n])] for i, n in enumerate(accepted_list)]
        self.policy.update(proposal, q, accepted_list, new)
        self._schedule(self.rows.tolist(), proposed.tolist(), accepted_list)
        before = [self.ends.generated[row] for row in self.rows.tolist()]
        self._append(new, accepted + 1, context_features(out.hidden_states, self.layer_ids))
        for i, row in enumerate(self.rows.tolist()):
            source = proposal.sources[i] if q > 1 and int(proposed[i]) > 0 else "none"
            kept = max(self.ends.generated[row] - before[i] - 1, 0)  # accepted tokens kept (its end may cut some)
            for record in (self.stats, self.stats.per_row[row]):
                record.record(int(proposed[i]) if source != "none" else 0, kept, source, drafting)
        self._lap = lap  # `decode` adds the replay and rows leaving to `rows`

    def _tree_step(self):
        """One draft tree of the single live row verified in one forward (`tree_domino.TreeSteps`)."""
        lap = self._clock()
        row = int(self.rows[0])
        before = self.ends.generated[row]
        self.anchors = self.sequences[self.rows, self.width + before - 1]  # (1,)
        room = min(self.budget - before - 1, self.caps[row])  # draft tokens that can still be verified
        self.policy.begin_step([row])
        span = self._find_spans(torch.tensor([room]))[0]
        step = self.tree_steps.step(row, self.anchors, room, span, self.policy, self._backbone, self._verify_tree,
                                    self._clock, lap)
        if step.count:
            self._schedule([row], [step.depth], [len(step.path)])
        states = self.cache.states
        states.compact(step.kept[1:])
        states.advance(torch.tensor([len(step.kept)]))
        features = context_features(step.out.hidden_states, self.layer_ids)[:, step.kept.to(step.out.logits.device)]
        self._append([step.new], torch.tensor([len(step.kept)]), features)
        for record in (self.stats, self.stats.per_row[row]):  # the accepted depth the row kept (its end may cut it)
            record.record(step.count, self.ends.generated[row] - before - 1, step.source, step.drafted)
        self._lap = step.lap

    def _verify_tree(self, step_ids, block):
        """The target's forward over the anchor and a draft tree (`block`: its mask and position offsets)."""
        new = step_ids.shape[1]
        states = self.cache.states
        states.plan(new)
        return self._forward(step_ids, verify_mask(states, new, block=block), new, keep=new, block=block)

    def _schedule(self, rows: list[int], proposed: list[int], accepted: list[int]) -> None:
        """`num_assistant_tokens_schedule="heuristic"`: each row's cap grows by 2 after a proposal accepted in full
        and shrinks by 1 (to 1 at least) after one that was not, as at batch size 1."""
        if self.settings.num_assistant_tokens_schedule not in HEURISTIC_SCHEDULES:
            return
        for row, sent, kept in zip(rows, proposed, accepted):
            if sent:
                self.caps[row] = self.caps[row] + 2 if kept == sent else max(1, self.caps[row] - 1)

    def _clock(self):
        """A lap timer into `stats.timings` when profiling (`profile_drafting`), else a no-op: the draft's phases,
        `verify` (the target's forward and the acceptance) and `rows` (what the batch costs beyond them: spans,
        proposals, per-row tokens and stops, rows leaving)."""
        sync = torch.cuda.synchronize if self.target.device.type == "cuda" else (lambda: None)
        return lap_timer(self.stats.timings, self.profile, sync)

    def _find_spans(self, room) -> list:
        """Each live row's best span (context lookup, suffix cache), cut at its room; None where none."""
        if not self.proposer.span_sources:
            return [None] * len(self.rows)
        spans = []
        for i, row in enumerate(self.rows.tolist()):
            sequence = self.sequences[row : row + 1, self.prompt_start[row] : self.width + self.ends.generated[row]]
            found = self.proposer.find_spans(sequence, int(room[i]),
                                             lambda *spans, row=row: self.policy.better_span(row, *spans))
            spans.append(found[0] if found else None)
        return spans

    def _q_logits(self, proposal, draft_logits, q):
        """(b, q - 1, V) the processed logits each row's proposal was drawn from: the draft's, or one-hot for a
        span (fixed given the context). A row's slots past its own proposal (a draft block shorter than another
        row's span) are never accepted; they keep -inf."""
        b = len(proposal.sources)
        vocab = self.head.vocab_size
        logits = torch.full((b, q - 1, vocab), float("-inf"), device=self.anchors.device)
        for i, source in enumerate(proposal.sources):
            if source == "domino":
                n = min(q - 1, draft_logits.shape[1])
                logits[i, :n] = draft_logits[i, :n].to(logits)
            elif source != "none":
                logits[i] = self.proposer.span_logits(proposal.ids[i : i + 1, : q - 1].to(logits.device))[0]
        return logits

    # ----------------------------------------------------------------------------------------- drafting
    def _backbone(self, room: int):
        """The proposer's backbone forward over every live row's block, absorbing the context it has not seen:
        slot states (b, n, H) and base logits (b, n, V') of the first n = min(block, `room`) slots."""
        states = self.draft_cache.states
        width = self.pending.shape[1]
        states.plan(width)
        device = self.draft.device
        counts = self.pending_counts.to(device)
        positions = (states.end - states.start)[:, None] + torch.arange(width, device=device)  # (b, m)
        anchor_positions = self.cache.states.end - self.cache.states.start  # (b,)
        slots, base = self.proposer.backbone(
            self.anchors, anchor_positions, self.pending, positions,
            context_mask(states, counts, self.config.block_size), self.draft_cache, min(self.n_draft, room),
            self._clock(),
        )
        states.advance(counts)
        self.pending = self.pending[:, :0]
        self.pending_counts = torch.zeros_like(self.pending_counts)
        return slots, base

    def _draft(self, room: int) -> Proposal:
        """The draft's blocks for every live row (`Proposal`): ids (b, n), their processed logits (b, n, V) when
        sampling (else None), and the draft's greedy confidence per slot (b, n) and what it expects to gain
        (b, n + 1), from a pass that draws nothing."""
        slots, base = self._backbone(room)
        lap = self._clock()
        rollout = self.proposer.rollout
        if self.do_sample:  # the length is chosen from a pass that draws nothing, then the proposal is drawn
            scored = rollout(slots, base, self.anchors, "score")
            drawn = rollout(slots, base, self.anchors, "sample", process=self._process)
            proposal = Proposal(drawn.ids, drawn.logits, scored.probs, drawn.source, scored.expected)
        else:
            mode = "greedy" if self.processors else "score"
            proposal = rollout(slots, base, self.anchors, mode, process=self._process, with_probs=True)
        lap("head_rollout")
        return proposal

    # -------------------------------------------------------------------------------------- target side
    def _forward(self, ids, mask, new, keep, block=None):
        """The target's forward over `new` tokens per row planned on its cache; `block` = a draft tree's
        ((new, new) mask, (new,) position offsets) instead of a causal chain."""
        states = self.cache.states
        offsets = torch.arange(new) if block is None else block[1]
        positions = (states.end - states.start)[:, None] + offsets.to(ids.device)
        return self.target(
            input_ids=ids,
            attention_mask=attention_masks(self.target, mask, states, new, block),
            position_ids=positions.clamp(min=0),
            use_cache=True,
            output_hidden_states=self.wanted,
            logits_to_keep=keep,
            **{self.cache_argument: self.cache},
        )

    def _target_logits(self, logits, step_ids):
        """(b, q, V) the target's processed logits after the anchor and after each proposed token, each position
        processed with the tokens before it (`step_ids` (b, q))."""
        return torch.stack([self._process(logits[:, j], None if j == 0 else step_ids[:, 1 : j + 1])
                            for j in range(logits.shape[1])], dim=1)

    def _process(self, logits, extra=None):
        """The target's logits processors on (b, V) logits of the live rows, each row's after its own sequence and
        `extra[i]` ((b, k) ids or None). Processors that read ids see the whole batch as plain decoding holds it
        (a processor may keep per-row state sized to the batch), once per distinct sequence length."""
        if not self.processors:
            return logits
        if self.row_free:
            return self.processors(torch.zeros(len(logits), 1, dtype=torch.long, device=logits.device), logits)
        k = 0 if extra is None else extra.shape[1]
        rows = self.rows.tolist()
        lengths = [self.width + self.ends.generated[row] + k for row in rows]
        out = torch.empty_like(logits)
        for length in sorted(set(lengths)):
            group = [i for i, n in enumerate(lengths) if n == length]
            view = self.sequences[:, :length].clone()  # (B, length)
            scores = logits.new_zeros(len(view), logits.shape[-1])
            for i in group:
                if k:
                    view[rows[i], length - k :] = extra[i].to(view.device)
                scores[rows[i]] = logits[i]
            processed = self.processors(view, scores)
            for i in group:
                out[i] = processed[rows[i]]
        return out

    # ---------------------------------------------------------------------------------------- row state
    def _generated_tensor(self):
        return torch.tensor([self.ends.generated[r] for r in self.rows.tolist()], device=self.rows.device)

    def _append(self, new: list[list[int]], counts, features):
        """Give each live row its new tokens (cut where its output ends: EOS, the length limit, a stop string), and
        queue the target features of the verified positions (`counts[i]` of `features[i]`) for the next draft
        forward."""
        self.ends.append(self.rows.tolist(), new)
        if features is not None:
            self._queue(features, counts)

    def _queue(self, features, counts):
        """Append (b, q, F) `features`, `counts[i]` of them per row, to the context the draft has not seen."""
        counts = counts.to(self.pending_counts)
        width = int((self.pending_counts + counts).max())
        pending = features.new_zeros(len(features), width, features.shape[-1])
        old = min(self.pending.shape[1], width)  # past a row's count the old entries are scratch
        pending[:, :old] = self.pending[:, :old]
        index = self.pending_counts[:, None] + torch.arange(features.shape[1], device=features.device)
        keep = torch.arange(features.shape[1], device=features.device)[None, :] < counts[:, None]
        index = torch.where(keep, index, width)  # entries past a row's count go to a scratch column
        pending = torch.cat([pending, pending.new_zeros(len(pending), 1, pending.shape[-1])], dim=1)
        pending.scatter_(1, index[..., None].expand(-1, -1, features.shape[-1]), features)
        self.pending, self.pending_counts = pending[:, :width], self.pending_counts + counts

    def remember(self) -> None:
        """After `decode`: each row's prompt and output (without padding) into the suffix cache, if any, and what
        its spans were worth in this call, averaged over the rows, for the next call (`store_history`)."""
        if self.suffix_cache is None:
            return
        for row, start in enumerate(self.prompt_start):
            self.suffix_cache.add(self.sequences[row, start : self.width + self.ends.length(row)].tolist())
        history = store_history(self.suffix_cache)
        if history is not None:
            history.update(self.policy.cache_history())

    def _drop_finished(self):
        """Rows whose output is final leave the batch: their cache rows, pending context and anchors."""
        if self.max_time and any(bool(torch.as_tensor(c(self.sequences, None)).all()) for c in self.max_time):
            self.ends.stop(self.rows.tolist())
        keep = [i for i, row in enumerate(self.rows.tolist()) if self.ends.final[row] is None]
        if len(keep) == len(self.rows):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.rows.device)
        self.rows = self.rows[index]
        self.cache.states.select(index)
        self.draft_cache.states.select(index.to(self.draft.device))
        self.pending, self.pending_counts = self.pending[index], self.pending_counts[index]
