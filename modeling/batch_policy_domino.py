# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""Drafting policy of the batched verify loop (`batch_domino.py`): what each row proposes, and how many tokens the
step verifies.

Remote-code file (torch + transformers only). A step verifies the same number of tokens q in every live row (one
rectangular forward), so its cost is that of rows × q tokens, measured as the loop goes (`VerifyCost` over the
token count). Each row proposes its draft block or a span (context lookup or suffix cache, per row, judged by the
row's own span history, as `SourceChooser` judges them at batch size 1), whichever it expects more accepted tokens
from; then q is the length with the most expected tokens per second over the whole batch, q = 1 being a plain
batched step. As the batch grows a forward costs more per token, so q shrinks, down to plain steps where
speculation cannot pay. Everything is decided from the draft's distributions (a pass that draws nothing), the
spans' histories and past timings (a sampling call's cost is the fixed prior unless `measure_verify_cost`, so that a
seeded call repeats itself): never from a token drawn for the step, so sampling stays exact.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .cost_domino import VerifyCost
from .hybrid_domino import Calibration, DraftBackoff, SourceChooser, moving_average
from .tree_domino import best_count, tree_values


class BatchProposal(NamedTuple):
    """What each live row proposes this step.

    ids: (b, W) target ids (each row's first `room[i]` count); expected: (b, W + 1) expected accepted tokens if
    the step verifies k of them, calibrated; room: (b,) tokens a row can have verified; sources: "domino", "lookup",
    "cache" or "none" per row; spans: the span found per row (sent or not); draft_expected: (b, W + 1) the draft's
    own, uncalibrated expectation (zeros without a draft)."""

    ids: torch.Tensor
    expected: torch.Tensor
    room: torch.Tensor
    sources: list
    spans: list
    draft_expected: torch.Tensor


class BatchPolicy:
    """Per-row sources and the per-step length of the batched verify loop.

    Args:
        batch (`int`): rows in the call (each keeps its own span history).
        max_span (`int`): the longest span any source proposes.
        cost ([`VerifyCost`]): the measured cost of a forward, by tokens in it (rows × q).
        backoff (`bool`): skip the draft while it does not pay (`DraftBackoff`, fed the expected tokens per second
            a drafted step gains over the same step without the draft: paused at the first loss).
        history (`dict`, *optional*): the suffix cache's span history to start from (`store_history`).
        threshold (`float`, defaults to 0.0): `draft_confidence_threshold`: a row's block stops before the slot
            where the draft's chain probability falls below it.
        cut_spans (`bool`, defaults to `False`): `cut_lookup_spans`: a context span is cut to the prefix worth its
            verify cost (`SourceChooser.span_length`) before the step's length is chosen.
    """

    def __init__(self, batch: int, max_span: int, cost: VerifyCost, backoff: bool = True, history=None,
                 threshold: float = 0.0, cut_spans: bool = False):
        self.cost, self.threshold = cost, threshold
        self.choosers = [SourceChooser(max(max_span, 1), cost, cut_spans=cut_spans, history=history)
                         for _ in range(batch)]
        self.backoff = DraftBackoff(min_gain=0.0, alpha=1.0, max_skip=16) if backoff else None
        self.calibrated = Calibration(1.0)  # the draft's, over every row (`Calibration`)
        self.draft_seconds: float | None = None
        self.rows: list[int] = []  # live row -> original row, set by the loop each step (`begin_step`)

    def begin_step(self, rows: list[int]) -> None:
        """A step of the live `rows` (their original row numbers, in the step's order) begins."""
        self.rows = rows

    def should_draft(self) -> bool:
        return self.backoff is None or self.backoff.should_draft()

    def observe_draft(self, seconds: float) -> None:
        """One draft forward took `seconds` (kept only with a measuring cost: the prior is in units of a plain
        step, and a seeded sampling call must not depend on timings)."""
        if self.cost.measure:
            self.draft_seconds = moving_average(self.draft_seconds, seconds, 0.3)

    def observe_verify(self, tokens: int, seconds: float) -> None:
        """A verify forward over `tokens` tokens took `seconds` (a measuring cost fits its curve to it)."""
        self.cost.observe(tokens, seconds)

    def calibration(self) -> float:
        """The draft's calibration so far: its accepted ÷ expected tokens (with pseudo-counts)."""
        return self.calibrated.ratio

    def better_span(self, row: int, *spans):
        """The span a row's history expects more of (`SourceChooser.better_span`), None without any."""
        return self.choosers[row].better_span(*spans)

    def span_first(self, row: int, span) -> bool:
        """Whether a row sends its span alone, without running the draft (`SourceChooser.span_first`)."""
        return self.choosers[row].span_first(span)

    def span_branch(self, row: int, span) -> tuple[list[int], list[float]]:
        """A span as a draft tree's branch: the tokens the row sends and each one's acceptance probability, from
        the span's history."""
        sent = self.span_tokens(row, span)
        return sent, torch.tensor(self.choosers[row].span_model(span).h[: len(sent)]).cumprod(0).tolist()

    def record_tree_step(self, row: int, span, verified: list[int], predicted: float | None, depth: int | None):
        """After a tree step's verify: the span's history against the `verified` tokens (and whether it was
        accepted whole: keep copying); when the draft's own tree was verified, its calibration (`predicted`
        expected against `depth` accepted draft nodes) and the accepted depth `span_first` weighs."""
        if span is not None:
            self.choosers[row].observe_branch(span, verified)
        if predicted is not None:
            self.calibrated.observe(predicted, depth)
            self.choosers[row].observe_block(depth)

    def cache_history(self) -> dict:
        """What suffix-cache spans were worth in this call, averaged over the rows (`SourceChooser.history`)."""
        rows = [chooser.history("cache") for chooser in self.choosers]
        return {bucket: [sum(h) / len(h) for h in zip(*(row[bucket] for row in rows))] for bucket in rows[0]}

    def seconds(self, tokens: int) -> float:
        """A forward over `tokens` tokens, in seconds: fitted to the timings so far, else the prior curve in seconds
        (`VerifyCost.prior_seconds`)."""
        measured = self.cost.seconds(tokens)
        return measured if measured is not None else self.cost.prior_seconds(tokens)

    def span_tokens(self, row: int, span) -> list[int]:
        """The tokens of `span` a row sends: all of them, or with `cut_lookup_spans` a context span's prefix worth
        its verify cost."""
        chooser = self.choosers[row]
        if span.source == "lookup" and chooser.cut_spans:
            return span.tokens[: chooser.span_length(span)]
        return span.tokens

    def block_lengths(self, confidence: torch.Tensor) -> torch.Tensor:
        """(b,) each row's block length from the draft's per-slot confidence (b, n): up to the slot where the
        draft's chain probability falls below the threshold (`draft_confidence_threshold`)."""
        if self.threshold <= 0:
            return torch.full((len(confidence),), confidence.shape[1], dtype=torch.long)
        return (confidence.cumprod(dim=1) >= self.threshold).sum(dim=1)  # a prefix: the chain probability only falls

    def propose(self, spans: list, draft, room: torch.Tensor) -> BatchProposal:
        """Each row's source: its span when the span's history expects more accepted tokens than the draft's
        calibrated expectation (`draft.expected`, the proposer's, held past the row's block length) does for its
        block, else the block (`draft`: the proposer's [`Proposal`] of every row, None when the draft did not
        run), else nothing."""
        b = len(spans)
        n = 0 if draft is None else draft.ids.shape[1]
        width = max([n, 1] + [len(span.tokens) for span in spans if span is not None])
        ids = torch.zeros(b, width, dtype=torch.long)
        expected = torch.zeros(b, width + 1)
        draft_expected = torch.zeros(b, width + 1)
        rows_room, sources = [], []
        ratio = self.calibrated.ratio
        if draft is not None:
            lengths = self.block_lengths(draft.probs.float().cpu())
            ks = torch.minimum(torch.arange(n + 1)[None, :], lengths[:, None])  # past a row's block: held
            own = draft.expected.float().cpu().gather(1, ks)  # (b, n + 1)
            draft_expected[:, : n + 1] = own
            draft_expected[:, n + 1 :] = own[:, -1:]
            lengths = lengths.tolist()
        for i, span in enumerate(spans):
            block = float(ratio * draft_expected[i, n]) if draft is not None else -1.0
            span_values = None
            if span is not None:
                model = self.choosers[self.rows[i]].span_model(span)
                sent = self.span_tokens(self.rows[i], span)
                span_values = torch.tensor([model.expected(k) for k in range(len(sent) + 1)])
            if span_values is not None and float(span_values[-1]) > block:
                length = len(sent)
                ids[i, :length] = torch.tensor(sent)
                expected[i, : length + 1] = span_values
                expected[i, length + 1 :] = span_values[-1]
                rows_room.append(min(length, int(room[i])))
                sources.append(span.source)
            elif draft is not None:
                ids[i, :n] = draft.ids[i].cpu()
                expected[i] = ratio * draft_expected[i]
                rows_room.append(min(lengths[i], int(room[i])))
                sources.append(draft.source)
            else:
                rows_room.append(0)
                sources.append("none")
        return BatchProposal(ids, expected, torch.tensor(rows_room), sources, spans, draft_expected)

    def choose_length(self, proposal: BatchProposal, drafted: bool) -> int:
        """The step's verify length q: the most expected tokens (accepted + bonus) per second over the batch."""
        b = len(proposal.sources)
        value = self._values(proposal.expected, proposal.room)
        q = int(value.argmax()) + 1
        if drafted and self.backoff is not None:  # would the step have done as well without running the draft?
            spans_only = proposal.expected.clone()
            spans_only[[i for i, s in enumerate(proposal.sources) if s == "domino"]] = 0.0
            self._judge_draft(float(value.max()), b, b * q, float(self._values(spans_only, proposal.room).max()))
        return q

    def tree_budget(self, tree, room: int, alone=None) -> int:
        """How many of a draft tree's nodes to verify (`tree_domino.tree_budget` under this policy's costs). When
        the draft ran, `alone` is the tree the step would have verified without it (the span's branch, or no
        node): the back-off weighs the two, as `choose_length` does for a chain."""
        if not tree.size:
            return 0
        values = tree_values(tree, self.seconds, room)
        count = best_count(values)
        if alone is not None and self.backoff is not None:
            self._judge_draft(values[count], 1, 1 + count, max(tree_values(alone, self.seconds, room)))
        return count

    def _judge_draft(self, value: float, rows: int, tokens: int, without: float) -> None:
        """The back-off's one rule: a drafted step's expected tokens per second (`value`, a verify forward over
        `tokens` tokens of `rows` rows), with the draft's own time added, against the best the same step gets
        without the draft (`without`)."""
        timed = self.draft_seconds is not None and self.cost.seconds(1) is not None  # both measured
        draft_time = self.draft_seconds if timed else 0.15 * self.seconds(rows)
        with_draft = value * self.seconds(tokens) / (self.seconds(tokens) + draft_time)
        self.backoff.update(with_draft - without)

    def _values(self, expected, room) -> torch.Tensor:
        """(W + 1,) expected batch tokens per second when each row verifies up to k = 0 … W of its tokens."""
        b, width = expected.shape[0], expected.shape[1] - 1
        ks = torch.arange(width + 1)
        capped = torch.minimum(ks[None, :], room[:, None].clamp(min=0))
        tokens = (1.0 + expected.gather(1, capped)).sum(dim=0)
        return tokens / torch.tensor([self.seconds(b * (k + 1)) for k in range(width + 1)])

    def update(self, proposal: BatchProposal, q: int, accepted: list[int], verified: list[list[int]]) -> None:
        """After the verify: the span histories (every span found, sent or not, scored against the row's verified
        tokens) and the draft's calibration (its rows' accepted against expected tokens)."""
        for i, span in enumerate(proposal.spans):
            if span is not None:
                self.choosers[self.rows[i]].span_model(span).observe(span.tokens, verified[i])
            if proposal.sources[i] == "domino" and q > 1:
                self.calibrated.observe(float(proposal.draft_expected[i, min(q - 1, int(proposal.room[i]))]),
                                        accepted[i])

