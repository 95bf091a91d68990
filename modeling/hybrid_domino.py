# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""Hybrid drafting policy: which proposal goes to the target each step (used by `generation_domino.py`).

Remote-code file (torch + transformers only). Every step has up to three proposals: the Domino block, a span
copied from the context (`ContextLookup`) and a span from earlier generations (`SuffixLookup` over a
`SuffixCache`). `SourceChooser` sends the one expected to give more tokens per unit of verify cost, and sends a
span without running the draft when the draft is not expected to beat it; `DraftBackoff` stops running a draft
that does not pay for itself. Everything here is decided from the context, the cache's contents (fixed while a
`generate` call runs) and past verify steps, never from a token drawn for the step at hand, so speculative
sampling stays exact.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .cost_domino import VerifyCost

# h[j] = P(token j+1 of a span is accepted | the tokens before it were), by the length of the n-gram match that
# found the span (3 stands for 3 or more), before a `generate` call has seen any span. Measured with
# `ContextLookup` on 500 of the target's own answers to ShareGPT prompts (SmolLM2-135M-Instruct, greedy; no
# benchmark prompt): a 1-gram match is right 23% of the time, a 3-gram match 86%.
SPAN_START_RATES = {1: (0.25, 0.6, 0.75), 2: (0.55, 0.7, 0.8), 3: (0.85, 0.95)}
# The same for suffix-cache spans, by match length (2-3, 4-7, 8-15, 16+ tokens matched: `CACHE_BUCKETS`), measured
# with a store of 100k tokens of the target's answers to unrelated prompts and held-out answers
# (`examples/suffix_cache_cost.py --rates`, docs/bench/suffix_cache/rates.md): the case where the store has least
# to offer. A store keeps what its spans were worth across calls (`store_history`), so on a workload that repeats
# itself these priors matter for the first call only.
CACHE_START_RATES = {2: (0.27, 0.36, 0.48), 4: (0.42, 0.48, 0.58), 8: (0.61, 0.64, 0.6, 0.52),
                     16: (0.72, 0.76, 0.77, 0.73)}
CACHE_BUCKETS = (16, 8, 4, 2)


def store_history(store) -> dict | None:
    """The span history kept with `store` (a `SuffixCache`'s `span_history`: `SpanModel.h` per cache bucket, as
    the last `generate` call with it left it), so the next call starts from what the store's spans have been
    worth, not from the priors; empty before any call used it or after `clear()`. None for a store that keeps
    no history (a duck-typed store without `span_history`): drafting then starts from the priors every call."""
    history = getattr(store, "span_history", None)
    return history if isinstance(history, dict) else None


class Span(NamedTuple):
    """A span proposal: the tokens that followed the match, the match's length in tokens and where it was found
    (`"lookup"`: the context; `"cache"`: the suffix cache of earlier generations)."""

    tokens: list[int]
    ngram: int
    source: str = "lookup"

    @property
    def bucket(self) -> tuple[str, int]:
        """The `SourceChooser` history this span is judged by: its source and match-length class."""
        if self.source == "cache":
            return self.source, next(b for b in CACHE_BUCKETS if self.ngram >= b or b == CACHE_BUCKETS[-1])
        return self.source, min(max(self.ngram, 1), max(SPAN_START_RATES))


class _Step(NamedTuple):
    """A proposal awaiting verification."""

    proposed: int  # tokens sent to the target
    source: str  # "domino", "lookup", "cache" or "none"
    predicted: float | None  # the draft's expected accepted tokens for it, when scored
    shadow: torch.Tensor | None  # (k,) the draft's block, when a span beat it
    draft_ran: bool
    spans: tuple[Span, ...]  # the spans found this step (sent or not), each scored after the verify


def allowed_prefix(input_ids, span, eos_token_id=None, logits_processor=None, vocab_size=None):
    """`span` (S,) up to its first eos token (`eos_token_id`: a (E,) tensor or None) or the first token the logits
    processors forbid after `input_ids` (1, L) and the span's tokens before it, as transformers' prompt lookup
    cuts its spans."""
    if eos_token_id is not None:
        is_eos = torch.isin(span, eos_token_id.to(span.device)).nonzero()
        if len(is_eos):
            span = span[: int(is_eos[0, 0])]
    if logits_processor and len(span):
        # Processors that forbid tokens (bad words, no-repeat n-grams…) set their logits to -inf whatever
        # the scores, so uniform scores show which tokens are allowed after each prefix.
        uniform = torch.ones(1, vocab_size, device=input_ids.device)
        for j in range(len(span)):
            prefix = torch.cat([input_ids, span[None, :j].to(input_ids.device)], dim=1)
            score = logits_processor(prefix, uniform.clone())[0, span[j]]
            if score == float("-inf") or score == torch.finfo(score.dtype).min:
                return span[:j]
    return span


class ContextLookup:
    """The context proposal: the tokens that follow the most recent earlier occurrence of the sequence's last
    n-gram, longest n-gram first (up to `max_ngram`), at most `max_tokens` of them, cut before an eos token and
    before a token the logits processors forbid (as transformers' prompt lookup does; a match whose span comes
    out empty gives way to the next most recent one).

    Transformers' `PromptLookupCandidateGenerator` takes the *first* occurrence from the left, which in a chat
    is often the system prompt. A match near the end continues periodically, as an overlapping copy does in
    LZ77: after "0 0 0" the span is more zeros, not the one token left before the end. Lookup alone, same span
    length, on 600 of the target's answers to ShareGPT prompts: τ 1.89 → 2.00 and tokens per unit of verify
    cost +6% over transformers' rule; τ at least as high on each of our six benchmark sets (16 prompts each).
    """

    max_tries = 8  # matches tried per step when spans come out empty (eos / forbidden tokens)

    def __init__(self, max_tokens: int, max_ngram: int, eos_token_id=None, logits_processor=None, vocab_size=None):
        if max_tokens <= 0 or max_ngram <= 0:
            raise ValueError(f"Context lookup needs max_tokens > 0 and max_ngram > 0, got {max_tokens}, {max_ngram}.")
        self.max_tokens, self.max_ngram = max_tokens, max_ngram
        self.eos_token_id = None if eos_token_id is None else torch.as_tensor(eos_token_id).reshape(-1)
        self.logits_processor = logits_processor or None
        self.vocab_size = vocab_size

    def __call__(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(1, L) ids -> the span (S,) (S = 0 when nothing matched) and the n-gram length that found it."""
        sequence = input_ids[0]
        length = sequence.shape[0]
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            windows = sequence[: length - 1].unfold(0, n, 1)  # (L-n, n): every n-gram with a token after it
            starts = (windows == sequence[length - n :]).all(dim=1).nonzero()[:, 0]
            for start in reversed(starts[-self.max_tries :].tolist()):  # most recent first
                period = length - (start + n)  # tokens from the match's continuation to the end
                follows = start + n + torch.arange(self.max_tokens, device=sequence.device) % period
                span = allowed_prefix(input_ids, sequence[follows], self.eos_token_id, self.logits_processor,
                                      self.vocab_size)
                if len(span):
                    return span, n
        return sequence.new_zeros(0), 0



class SuffixLookup:
    """The cache proposal: the continuation a `SuffixCache` has seen most often after the longest match of the
    sequence's last tokens among earlier generations (`SuffixCache.lookup`), at most `max_tokens` long, cut
    before an eos token and before a token the logits processors forbid (`allowed_prefix`). The store is read
    only while a `generate` call runs; the call's prompt and output are added when it returns."""

    def __init__(self, cache, max_tokens: int, eos_token_id=None, logits_processor=None, vocab_size=None):
        if max_tokens <= 0:
            raise ValueError(f"Suffix-cache lookup needs max_tokens > 0, got {max_tokens}.")
        self.cache, self.max_tokens = cache, max_tokens
        self.eos_token_id = None if eos_token_id is None else torch.as_tensor(eos_token_id).reshape(-1)
        self.logits_processor = logits_processor or None
        self.vocab_size = vocab_size

    def __call__(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(1, L) ids -> the span (S,) (S = 0 when nothing matched) and the match length that found it."""
        match = self.cache.lookup(input_ids[0, -self.cache.max_match :].tolist(), self.max_tokens)
        if match is None:
            return input_ids.new_zeros(0), 0
        span = torch.tensor(match.tokens, dtype=input_ids.dtype, device=input_ids.device)
        return allowed_prefix(input_ids, span, self.eos_token_id, self.logits_processor, self.vocab_size), \
            match.match_length


class DraftBackoff:
    """No-fit fallback: skip the draft while it does not pay for itself.

    A drafted step costs the draft's forward and a longer verify (≈ 1.1–1.3× a plain step with
    `optimize_for_cpu` kernels), so the draft pays off once its blocks get ≳ `min_gain` tokens accepted. A block
    that lost to a lookup span counts with what it would have had accepted (`shadow_accepted`). While the moving
    average (weight `alpha`, starting at `start`: 5 misses in a row pause a fresh draft; a draft averaging 0.4
    is never paused) is below `min_gain`, take 1, 2, 4 … (at most `max_skip`) steps without the draft between
    single probes; a probe that lifts the average back ends it. Decided from the acceptance history only, never
    from the tokens of the step at hand: sampling stays exact.

    With a measuring `cost` (`VerifyCost` with `measure`), the bar is at least what a `proposed`-token verify
    costs beyond a plain step, `cost(proposed) − 1`: on a CPU where verifying 5 tokens costs 1.6× a plain step
    a block must average 0.6 accepted tokens to pay (docs/cpu_kernels.md). Timings never depend on a token of the
    step at hand either.

    The batched loop and the tree step use the same rule (`BatchPolicy`): each drafted step's gain is the expected
    tokens per second it gets with the draft minus without it, `alpha` 1 and `min_gain` 0 (paused at a loss).

    (Judging the draft by its gain over the span instead, accepted minus what the span would have had, paused it
    too often where it helps: MT-Bench τ 1.73 → 1.47 in the six-set benchmark.)
    """

    def __init__(self, min_gain: float = 0.25, alpha: float = 0.15, max_skip: int = 32, start: float = 0.5,
                 cost: VerifyCost | None = None, proposed: int = 1):
        self.min_gain, self.alpha, self.max_skip = min_gain, alpha, max_skip
        self.cost, self.proposed = cost, proposed
        self.average = start
        self.skip = self.skip_left = 0

    @property
    def bar(self) -> float:
        """The average accepted tokens per drafted step below which the draft is paused."""
        if self.cost is None or not self.cost.measure:
            return self.min_gain
        return max(self.min_gain, self.cost(self.proposed) - 1.0)

    def should_draft(self) -> bool:
        if self.skip_left > 0:
            self.skip_left -= 1
            return False
        return True

    def update(self, gain: float) -> None:
        """After a step the draft ran for: the tokens its block got (or would have got) accepted, or what it
        gained."""
        self.average += self.alpha * (gain - self.average)
        if self.average >= self.bar:
            self.skip = self.skip_left = 0
        else:
            self.skip = min(max(1, 2 * self.skip), self.max_skip)
            self.skip_left = self.skip


class Calibration:
    """The draft's calibration in one call: accepted ÷ expected tokens of its past blocks (or trees), each side
    starting from `prior` pseudo-tokens, since a draft's confidence is not its acceptance rate. The one rule every
    policy scales the draft's expectation by."""

    def __init__(self, prior: float):
        self.realised = self.predicted = prior

    @property
    def ratio(self) -> float:
        return self.realised / self.predicted

    def observe(self, expected: float, accepted: float) -> None:
        """A block the draft expected `expected` accepted tokens of had `accepted` accepted."""
        self.predicted += expected
        self.realised += accepted


def moving_average(old: float | None, value: float, alpha: float) -> float:
    """`value` folded into the moving average `old` (None: none yet) with weight `alpha`."""
    return value if old is None else old + alpha * (value - old)


class SpanModel:
    """What past lookup spans say about the next one: h[j] = P(token j+1 of a span is accepted | the tokens
    before it were), a moving average (weight `alpha`) over every step that had a span, sent or not. The
    verified tokens of a step (accepted + bonus: the target's own) show how far any span would have matched,
    so an unsent span is scored too, as far as they reach."""

    def __init__(self, max_len: int, start: tuple[float, ...], alpha: float = 0.2):
        self.alpha = alpha
        self.h = [start[min(j, len(start) - 1)] for j in range(max_len)]

    def expected(self, length: int) -> float:
        """Σ_{j≤length} Π_{i≤j} h_i: tokens a span of `length` gets accepted on average."""
        return expected_accepted(self.h[:length])

    def observe(self, span: list[int], verified: list[int]) -> None:
        for j, (token, target_token) in enumerate(zip(span, verified)):
            hit = token == target_token
            self.h[j] += self.alpha * (hit - self.h[j])
            if not hit:
                break


class SourceChooser:
    """Picks the Domino block or a span (from the context or the suffix cache), whichever is expected to give
    more tokens per unit of verify cost (`VerifyCost`: a 10-token span costs a longer verify than a 4-token block).

    * Span: the expected accepted tokens of `SpanModel`, one per source and match length (a span found by a
      3-gram match is far more often right than one found by a single token), learnt from every past step that
      had such a span; when the draft ran, the larger of that and the draft's own expectation for the span (the
      draft may know a span is right before the history does; the history knows spans the draft cannot predict,
      such as names and numbers). Of a context span and a cache span the better one by that history competes
      with the block (`better_span`).
    * Domino: the draft's expected accepted tokens for its greedy block, scaled by realised ÷ predicted
      accepted tokens of its past blocks in this `generate` call (`prior` pseudo-tokens each), since a draft's
      confidence is not its acceptance rate.
    * A span goes out without running the draft at all (`span_first`) while a copy is under way (the last step
      was a span accepted in full), when spans like it are expected to beat blocks by over a token, or when
      running the draft has not paid on steps with spans like it: for every step the draft ran with a span
      found, the tokens per unit of cost it got (the draft's own cost, `draft_cost` of a plain step, included)
      minus what the span alone would have got (`shadow_accepted`), a moving average per source and match
      length (`run_gain`). While that is negative the draft runs only on probes, 1, 2, 4 … (at most 16) such
      steps apart. On copy-heavy or repeated text this saves the draft's forward on most steps, which is what
      prompt lookup never pays.
    * Blocks are also scored on steps where a span won after the draft ran (`shadow_accepted`), so a draft that
      loses every step to spans learns that it does (`domino_average`, and the back-off).

    Context spans are sent whole, as prompt lookup sends them (cutting them short saved verify cost but lost
    τ), unless `cut_spans`; cache spans, which can be long, are cut to the prefix with the most expected tokens
    per unit of cost (`span_length`), so their length grows with the match length and the acceptance seen.

    Args:
        max_span (`int`): the longest span any source proposes.
        history (`dict`, *optional*): span histories (`SpanModel.h` by bucket) to start from instead of the
            priors: the suffix cache's, as its last call left them (`store_history`).
        cost ([`VerifyCost`], *optional*): the verify-cost curve (a fixed CPU prior when omitted).
        draft_cost (`float`, defaults to 0.15): the draft's forward (backbone, LM head, head rollout) as a
            fraction of a plain target step; 0.1–0.15 for the SmolLM2 draft with `optimize_for_cpu`
            (docs/bench/bench.md). With a measuring `cost`, replaced by the measured ratio (`observe_draft`).
        cut_spans (`bool`, defaults to `False`): cut context spans too (`DraftingSettings.cut_lookup_spans`).
    """

    def __init__(self, max_span: int, cost: VerifyCost | None = None, prior: float = 0.25, alpha: float = 0.3,
                 *, draft_cost: float = 0.15, cut_spans: bool = False, history: dict | None = None):
        self.cost = cost or VerifyCost()
        self.spans = {("lookup", n): SpanModel(max_span, start) for n, start in SPAN_START_RATES.items()}
        self.spans.update({("cache", n): SpanModel(max_span, start) for n, start in CACHE_START_RATES.items()})
        for bucket, h in (history or {}).items():  # an earlier call's span history (`store_history`)
            if bucket in self.spans and h:
                self.spans[bucket] = SpanModel(max_span, tuple(h))
        self.alpha = alpha
        self.calibration = Calibration(prior)  # the draft's realised ÷ predicted accepted tokens
        self.domino_average = 1.0  # accepted tokens per drafted block (real or shadow), moving average
        self.copying = False  # the last verify step accepted a whole span
        self.cut_spans = cut_spans  # DraftingSettings.cut_lookup_spans
        self.draft_cost = draft_cost
        self._draft_seconds: float | None = None  # measured draft forward, moving average (with a measuring cost)
        # Per span bucket: tokens per cost of running the draft minus the span alone's (moving average), and the
        # probe schedule while it is negative ([interval, steps left before the next probe]).
        self.run_gain: dict[tuple[str, int], float] = {bucket: 0.0 for bucket in self.spans}
        self._probe = {bucket: [0, 0] for bucket in self.spans}

    def span_model(self, span: Span) -> SpanModel:
        return self.spans[span.bucket]

    def history(self, source: str) -> dict[tuple[str, int], list[float]]:
        """The span histories of one source, by bucket (for `store_history`)."""
        return {bucket: list(model.h) for bucket, model in self.spans.items() if bucket[0] == source}

    def span_value(self, span: Span, lookup_score: float = 0.0) -> float:
        """Expected tokens (accepted + bonus) per verify cost of sending `span` (cut to `span_length`)."""
        length = self.span_length(span)
        return (1.0 + max(lookup_score, self.span_model(span).expected(length))) / self.cost(length + 1)

    def better_span(self, *spans: Span | None) -> Span | None:
        """Of the spans found this step (None: nothing found), the one with the higher `span_value`; the first
        on a tie."""
        found = [span for span in spans if span is not None]
        return max(found, key=self.span_value) if found else None

    def relative_draft_cost(self) -> float:
        """The draft's forward as a fraction of a plain target step: measured when the verify cost is, else
        `draft_cost`."""
        plain = self.cost.seconds(1) if self.cost.measure else None
        if self._draft_seconds is None or not plain:
            return self.draft_cost
        return self._draft_seconds / plain

    def observe_draft(self, seconds: float) -> None:
        """One draft forward took `seconds` (kept only with a measuring verify cost)."""
        if self.cost.measure and seconds > 0:
            self._draft_seconds = moving_average(self._draft_seconds, seconds, self.alpha)

    def span_first(self, span: Span) -> bool:
        """Send the span without drafting: a copy is under way, spans like it beat blocks by over a token lately,
        or running the draft has not paid on steps with spans like it (`run_gain`, probed now and then)."""
        if self.copying or self.span_model(span).expected(len(span.tokens)) > self.domino_average + 1.0:
            return True
        if self.run_gain[span.bucket] >= 0.0:
            return False
        probe = self._probe[span.bucket]
        if probe[1] > 0:
            probe[1] -= 1
            return True
        probe[0] = min(max(1, 2 * probe[0]), 16)  # run the draft this step, then skip twice as many
        probe[1] = probe[0]
        return False

    def span_length(self, span: Span) -> int:
        """How much of the span to send: all of a context span (unless `cut_spans`), else the prefix with the
        most expected tokens (accepted + bonus) per unit of verify cost under the span history."""
        length = len(span.tokens)
        if (span.source == "lookup" and not self.cut_spans) or length <= 1 or self.copying:
            return length  # a copy under way goes out whole
        expected, chain, values = 0.0, 1.0, []
        for n, h in enumerate(self.span_model(span).h[:length], start=1):  # expected(n) for every n, in one pass
            chain *= h
            expected += chain
            values.append((1.0 + expected) / self.cost(n + 1))
        return 1 + values.index(max(values))  # the shortest of equally good prefixes

    def _values(self, domino_score: float, block: int, lookup_score: float, span: Span) -> tuple[float, float]:
        """Expected tokens (accepted + bonus) per verify cost of the block and of the span."""
        domino = (1.0 + domino_score * self.calibration.ratio) / self.cost(block + 1)
        return domino, self.span_value(span, lookup_score)

    def needs_lookup_score(self, domino_score: float, block: int, span: Span) -> bool:
        """Whether the draft's score of the span can change the choice (else its rollout is skipped)."""
        domino, lookup = self._values(domino_score, block, 0.0, span)
        return lookup <= domino < self._values(domino_score, block, float(len(span.tokens)), span)[1]

    def choose(self, domino_score: float, block: int, lookup_score: float, span: Span) -> str:
        """`"domino"` or the span's source."""
        domino, lookup = self._values(domino_score, block, lookup_score, span)
        return span.source if lookup > domino else "domino"

    def update(self, step: _Step, accepted: int, shadow: int | None, verified: list[int]) -> None:
        """After a verify step: `shadow` is what the draft's block would have had accepted when a span beat it."""
        is_span = step.source in ("lookup", "cache")
        self.copying = is_span and 0 < step.proposed == accepted
        for span in step.spans:
            self.span_model(span).observe(span.tokens, verified)
        if step.draft_ran and step.spans:
            self._observe_run_gain(step, accepted, verified)
        if is_span and shadow is not None:
            self.observe_block(shadow)
        elif step.source == "domino":
            self.observe_block(accepted)
            if step.predicted is not None:
                self.calibration.observe(step.predicted, accepted)

    def observe_block(self, accepted: int) -> None:
        """The draft's block (or tree) had `accepted` tokens accepted (or would have had, beaten by a span)."""
        self.domino_average += self.alpha * (accepted - self.domino_average)

    def observe_branch(self, span: Span, verified: list[int]) -> None:
        """A span verified as a tree's branch: its history, and whether it was accepted whole (keep copying)."""
        self.span_model(span).observe(span.tokens, verified)
        self.copying = verified[: len(span.tokens)] == span.tokens

    def _observe_run_gain(self, step: _Step, accepted: int, verified: list[int]) -> None:
        """Tokens per cost the step got with the draft run, minus what its best span alone would have got."""
        span = step.spans[0]
        length = self.span_length(span)
        alone = (1.0 + shadow_accepted(span.tokens[:length], verified)) / self.cost(length + 1)
        ran = (1.0 + accepted) / (self.cost(step.proposed + 1) + self.relative_draft_cost())
        bucket = span.bucket
        self.run_gain[bucket] += self.alpha * ((ran - alone) - self.run_gain[bucket])
        if self.run_gain[bucket] >= 0.0:
            self._probe[bucket] = [0, 0]


def shadow_accepted(proposal: list[int], verified: list[int]) -> int:
    """Tokens of a proposal that was not sent that the target would have accepted, as far as the verified
    tokens (this step's accepted tokens + bonus, the target's own) show: the length of their common prefix.
    Exact in greedy decoding up to `len(verified)`; a lower bound past it."""
    n = 0
    while n < min(len(proposal), len(verified)) and proposal[n] == verified[n]:
        n += 1
    return n


def expected_accepted(probs: list[float], length: int | None = None) -> float:
    """Σ_k Π_{j≤k} p_j: tokens a verifier would accept on average if the draft's probabilities were right.
    `length` > len(probs) extends the chain at the scored tokens' geometric-mean rate (a lookup span is longer
    than the block the draft can score)."""
    total, chain = 0.0, 1.0
    for p in probs:
        chain *= p
        total += chain
    extra = (length or len(probs)) - len(probs)
    if extra > 0 and probs and chain > 0:
        rate = chain ** (1.0 / len(probs))
        total += chain * sum(rate**t for t in range(1, extra + 1))
    return total


def chain_expected(probs: torch.Tensor) -> torch.Tensor:
    """(b, n) per-slot acceptance probabilities -> (b, n + 1) expected accepted tokens when k = 0 … n are verified
    (Σ_{j<k} Π_{l≤j} p_l): `expected_accepted` of every prefix, over rows."""
    chain = probs.cumprod(dim=1)
    return torch.cat([chain.new_zeros(len(chain), 1), chain.cumsum(dim=1)], dim=1)
