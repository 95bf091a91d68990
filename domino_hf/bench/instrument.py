"""Measuring one `generate` call from the outside, identically for every decoding method.

Nothing here knows which method runs: the same two probes watch autoregressive decoding, prompt lookup,
a classic assistant and Domino, so τ, acceptance and timings are counted the same way for all of them.

* `TimingStreamer` timestamps every chunk `generate` emits. transformers puts the prompt first, then one
  chunk per target forward (one token for plain decoding, the accepted tokens + the bonus token for
  speculative decoding). Decode time runs from the first generated chunk (the end of prefill) to the last:
  prefill is excluded because it is identical for all methods and would dilute the speedup.
* `ForwardProbe` hooks the top-level `forward` of a module (the target, the draft backbone, an assistant)
  and records the query length and wall time of each call. For the target, call 0 is the prefill and
  every later call is one verify step whose input is `[last token, candidates…]`, so
  `drafted = length - 1`; the matching streamer chunk holds `accepted + 1` tokens. A loop that streams token by
  token after its step (Domino's draft-tree loop) is counted per forward all the same (`chunks_per_forward`), its
  decode timed from the end of the prefill forward (`streamed_late`).

The per-step profile (`RunRecord.phase_seconds`) adds what a Domino draft times itself (backbone, base LM
head, head rollout: `draft.last_generation_stats.timings`); whatever no probe covers is `loop_overhead`.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass, field

import torch
from transformers.generation.streamers import BaseStreamer

logger = logging.getLogger(__name__)


class TimingStreamer(BaseStreamer):
    """Records `(perf_counter, n_tokens)` for every generated chunk; the first `put` (the prompt) is skipped.

    On CUDA the chunk is already on the host when `put` runs (transformers calls `.cpu()` first), so the
    timestamp is taken after the device finished the step without an explicit synchronize.
    """

    def __init__(self):
        self.prompt_seen = False
        self.chunks: list[tuple[float, int]] = []
        self.t_end: float | None = None

    def put(self, value):
        now = time.perf_counter()
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.chunks.append((now, int(value.numel())))

    def end(self):
        self.t_end = time.perf_counter()

    @property
    def chunk_sizes(self) -> list[int]:
        return [n for _, n in self.chunks]


@dataclass
class ForwardCall:
    start: float
    end: float
    length: int  # query positions in this call (input_ids / inputs_embeds / block_embeds width)


@dataclass
class ForwardProbe:
    """Forward pre/post hooks on one module; `calls` is reset by `reset()` before each generate.

    `synchronize` waits for CUDA around every call; `synchronize_first` around the first call after `reset()`
    only (the prefill: its end is then when the device finished it, and the decode loop waits for each step's
    logits anyway)."""

    module: torch.nn.Module
    synchronize: bool = False
    calls: list[ForwardCall] = field(default_factory=list)
    synchronize_first: bool = False

    def __post_init__(self):
        self._start: list[tuple[float, int]] = []
        self._handles = [
            self.module.register_forward_pre_hook(self._pre, with_kwargs=True),
            self.module.register_forward_hook(self._post, with_kwargs=True),
        ]

    def _sync(self):
        wanted = self.synchronize or (self.synchronize_first and not self.calls)
        if wanted and torch.cuda.is_available():
            torch.cuda.synchronize()

    def _pre(self, module, args, kwargs):
        length = 0
        for key in ("input_ids", "inputs_embeds", "block_embeds"):
            value = kwargs.get(key)
            if value is not None:
                length = int(value.shape[1])
                break
        else:
            if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
                length = int(args[0].shape[1])
        self._sync()
        self._start.append((time.perf_counter(), length))

    def _post(self, module, args, kwargs, output):
        self._sync()
        start, length = self._start.pop()
        self.calls.append(ForwardCall(start, time.perf_counter(), length))

    def reset(self):
        self.calls = []
        self._start = []

    def time_between(self, t0: float, t1: float) -> float:
        """Seconds spent in calls that started inside [t0, t1]."""
        return sum(c.end - c.start for c in self.calls if t0 <= c.start <= t1)

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []


PHASES = ("target_verify", "backbone", "lm_head", "head_rollout", "draft_other", "loop_overhead")
DRAFT_PHASES = ("backbone", "lm_head", "head_rollout", "draft_other")


@dataclass
class RunRecord:
    """One timed `generate` call of one method on one prompt. All times in seconds.

    `drafted[i]` / `accepted[i]` describe verify step i (prefill excluded): draft tokens proposed and draft
    tokens accepted (the bonus token is not counted, so a step produces `accepted + 1` tokens).
    `draft_decode_s` is the probed assistant's forward time (the `assisted` method); `draft_phases` holds
    a Domino draft's own per-phase seconds when it was profiling (`profiled`).
    """

    method: str
    prompt_set: str
    prompt_id: str
    repeat: int
    prompt_tokens: int
    output_ids: list[int]
    first_chunk: int
    drafted: list[int]
    accepted: list[int]
    total_s: float
    prefill_s: float
    decode_s: float
    target_prefill_s: float
    target_decode_s: float
    draft_decode_s: float
    tau_from_stats: float | None = None
    draft_phases: dict[str, float] = field(default_factory=dict)
    profiled: bool = False
    sources: list[str] = field(default_factory=list)  # per step, from a Domino draft: domino / lookup / none

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def decode_tokens(self) -> int:
        """Tokens produced after prefill, i.e. by the timed verify steps."""
        return self.new_tokens - self.first_chunk

    @property
    def decode_ms_per_token(self) -> float | None:
        return 1000.0 * self.decode_s / self.decode_tokens if self.decode_tokens > 0 else None

    def phase_seconds(self) -> dict[str, float]:
        """Decode time split into `PHASES`; `loop_overhead` is the unclamped rest (timer noise can make it
        slightly negative on a very short run)."""
        parts = dict.fromkeys(PHASES, 0.0)
        parts["target_verify"] = self.target_decode_s
        parts["draft_other"] = self.draft_decode_s
        for phase in ("backbone", "lm_head", "head_rollout"):
            parts[phase] = self.draft_phases.get(phase, 0.0)
        parts["loop_overhead"] = self.decode_s - sum(parts.values())
        return parts

    def summary(self) -> dict:
        """JSON-friendly view without the token ids."""
        record = {
            "method": self.method,
            "set": self.prompt_set,
            "prompt_id": self.prompt_id,
            "repeat": self.repeat,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "decode_tokens": self.decode_tokens,
            "steps": len(self.accepted),
            "accepted": self.accepted,
            "drafted": self.drafted,
            "total_ms": round(1000 * self.total_s, 3),
            "prefill_ms": round(1000 * self.prefill_s, 3),
            "decode_ms": round(1000 * self.decode_s, 3),
            "decode_ms_per_token": self.decode_ms_per_token,
        }
        if self.sources:
            record["sources"] = self.sources
        if self.profiled:
            record["phase_ms"] = {k: round(1000 * v, 3) for k, v in self.phase_seconds().items()}
        return record


def chunks_per_forward(target_calls: list[ForwardCall], chunks: list[tuple[float, int]]) -> list[int]:
    """Generated tokens per target forward (call 0: the prefill): each streamed chunk counts for the last forward
    that ended before it was put.

    A loop that streams one chunk per forward right after it (transformers', a Domino chain) gives its chunk sizes
    back unchanged. The draft-tree loop (`use_draft_tree`) streams token by token after each step, the prefill's
    token with the first step's: its chunks are summed per step, and that first token moved back to the prefill.
    Without target forwards: the chunk sizes as streamed.
    """
    if not target_calls:
        return [n for _, n in chunks]
    ends = [c.end for c in target_calls]
    sizes = [0] * len(target_calls)
    for t, n in chunks:
        sizes[max(bisect.bisect_right(ends, t) - 1, 0)] += n
    late = next((i for i, n in enumerate(sizes) if n), 0)
    if sizes[0] == 0 and late:  # the prefill's token was streamed after a later forward
        sizes[0], sizes[late] = 1, sizes[late] - 1
    return sizes


def streamed_late(target_calls: list[ForwardCall], chunks: list[tuple[float, int]]) -> bool:
    """Whether the first generated chunk was put after the first verify forward began (the draft-tree loop): the
    decode then starts at the end of the prefill forward, not at that chunk."""
    return bool(chunks) and len(target_calls) > 1 and chunks[0][0] > target_calls[1].start


def steps_from_probe(target_calls: list[ForwardCall], chunk_sizes: list[int]) -> tuple[list[int], list[int]]:
    """Per verify step (drafted, accepted) from target forward lengths and streamer chunk sizes.

    Forward i produces chunk i (transformers puts after every target forward); call 0 is the prefill.
    """
    if len(target_calls) != len(chunk_sizes):
        logger.warning(
            "Target forwards (%d) and generated chunks (%d) do not pair up; per-step counts use the shorter list.",
            len(target_calls),
            len(chunk_sizes),
        )
    pairs = list(zip(target_calls, chunk_sizes))[1:]
    return [max(c.length - 1, 0) for c, _ in pairs], [max(n - 1, 0) for _, n in pairs]
