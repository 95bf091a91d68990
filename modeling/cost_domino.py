# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""What a verify forward costs: the cost model every loop's policy weighs proposals with, and the measured costs
that outlive a call.

Remote-code file (torch only). `VerifyCost` gives the cost of a target forward over k tokens (a prior fitted on
CPU kernels, then moving averages of timed forwards where the call measures); `VerifyCostStore` keeps measured
curves across greedy calls (`VERIFY_COSTS`, the process's store).
"""

from __future__ import annotations

import weakref

import torch


class VerifyCost:
    """Relative cost of a verify forward over k tokens, a plain step (k = 1) being 1.

    The prior is 1 + `step` + `per_token`·(k-1) for k > 1, fitted to the `optimize_for_cpu` column of
    docs/cpu_kernels.md on an AVX-512 machine (SmolLM2-135M fp32: k = 2, 5, 9, 17 cost 1.11, 1.20, 1.29, 1.52);
    on a GPU a few more tokens are close to free, and `for_device` assumes so. The real curve depends on the
    machine (on a 2-core AVX2 machine the same target costs 1.28, 1.46, 1.86 at k = 5, 9, 17), so with
    `measure` the generator times every verify forward (`observe`) and the curve is refitted as it goes:
    exponentially weighted least squares of seconds against k, t(1) on its own and t(k) = a + b·(k-1) for
    k > 1, starting from `prior_weight` pseudo-observations of the prior curve (scaled to the first measured
    forward) that fade like old measurements. A line misses the steps of a real curve (GEMM libraries switch
    algorithms with the row count: with stock MKL on an AMX Xeon 3 tokens cost 1.23× a plain step, 4 tokens
    1.56×), so each length measured also keeps its own moving average, which outweighs the line once it has a
    few forwards (the line counts as one); lengths never measured take the line. Timings never depend on a token
    drawn for the step being proposed, so speculative sampling stays exact; greedy output never depends on the
    choice at all.
    """

    PLAIN_STEP_SECONDS = 0.03  # a plain step of a small target on a CPU: the prior's unit before any timing

    def __init__(self, step: float = 0.08, per_token: float = 0.025, measure: bool = False, decay: float = 0.97,
                 prior_weight: float = 4.0):
        self.step, self.per_token = step, per_token
        self.measure, self.decay, self.prior_weight = measure, decay, prior_weight
        self._sums: list[float] | None = None  # [n1, t1, n, Σx, Σt, Σxx, Σxt] for k = 1 and x = k-1 > 0
        self._lengths: dict[int, list[float]] = {}  # k > 1 -> [weight, weighted Σ seconds] of its own forwards

    @classmethod
    def for_device(cls, device: torch.device, measure: bool = False) -> VerifyCost:
        return cls(measure=measure) if device.type == "cpu" else cls(step=0.01, per_token=0.002, measure=measure)

    def prior(self, k: int) -> float:
        return 1.0 if k <= 1 else 1.0 + self.step + self.per_token * (k - 1)

    def prior_seconds(self, k: int) -> float:
        """The prior in seconds: a plain step taken as `PLAIN_STEP_SECONDS` until one is timed, then as the timed
        one (only ratios of costs choose anything, so the nominal step changes no choice)."""
        plain = self.seconds(1)
        return self.prior(k) * (plain if plain is not None else self.PLAIN_STEP_SECONDS)

    def seconds(self, k: int) -> float | None:
        """The fitted time of a k-token verify forward, None before any measurement."""
        if self._sums is None:
            return None
        n1, t1, n, sx, st, sxx, sxt = self._sums
        if k <= 1:
            return t1 / n1
        slope = (n * sxt - sx * st) / max(n * sxx - sx * sx, 1e-12)
        slope = max(slope, 0.0)  # a longer forward is never cheaper
        line = (st - slope * sx) / n + slope * (k - 1)
        weight, total = self._lengths.get(k, (0.0, 0.0))
        return (total + line) / (weight + 1.0)

    def __call__(self, k: int) -> float:
        if k <= 1:
            return 1.0
        if self._sums is None:
            return self.prior(k)
        return max(self.seconds(k) / self.seconds(1), 1.0)

    def observe(self, k: int, seconds: float) -> None:
        """One verify forward over `k` tokens took `seconds` (ignored unless `measure`)."""
        if not self.measure or seconds <= 0:
            return
        if self._sums is None:  # the prior curve, scaled to this first forward, as pseudo-observations
            scale, w = seconds / self.prior(k), self.prior_weight
            self._sums = [w, w * scale, 0.0, 0.0, 0.0, 0.0, 0.0]
            for x in (1, 10):
                self._add(x, scale * self.prior(x + 1), w / 2)
        predicted = self.seconds(k)
        seconds = min(seconds, 2.0 * predicted)  # a stall (first use of a shape, the OS) is not the curve
        self._sums = [v * self.decay for v in self._sums]
        for own in self._lengths.values():
            own[0], own[1] = own[0] * self.decay, own[1] * self.decay
        if k <= 1:
            self._sums[0] += 1.0
            self._sums[1] += seconds
        else:
            self._add(k - 1, seconds, 1.0)
            own = self._lengths.setdefault(k, [0.0, 0.0])
            own[0], own[1] = own[0] + 1.0, own[1] + seconds

    def _add(self, x: float, t: float, w: float) -> None:
        sums = self._sums
        sums[2] += w
        sums[3] += w * x
        sums[4] += w * t
        sums[5] += w * x * x
        sums[6] += w * x * t


class VerifyCostStore:
    """The measured verify costs that outlive a call: one measuring `VerifyCost` per target, device and context
    bucket (under 512 tokens, under 1,024, under 2,048, …), so a greedy call starts from the curve earlier calls
    measured on this machine instead of the fixed prior (a short call never measures enough to learn it) and a long
    prompt from the costs of long prompts. Its moving averages follow the machine as it goes.

    Only greedy calls read it (their output cannot depend on timings): a sampling call never does, so a seeded call
    never depends on an earlier one. `enabled = False` starts every call from the prior; `clear()` forgets what
    was measured. The verify loop uses the process's store, `VERIFY_COSTS`, unless given another.

    Args:
        enabled (`bool`, defaults to `True`): keep measured costs across calls.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._costs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(device, bucket): cost}

    def cost(self, target, context: int) -> VerifyCost:
        """The measuring verify cost of `target` for a call whose prompts reach `context` tokens (a fresh one, the
        prior, when the store is off)."""
        if not self.enabled:
            return VerifyCost.for_device(target.device, measure=True)
        costs = self._costs.setdefault(target, {})
        key = (str(target.device), (max(int(context), 0) // 512).bit_length())
        if key not in costs:
            costs[key] = VerifyCost.for_device(target.device, measure=True)
        return costs[key]

    def clear(self) -> None:
        self._costs = weakref.WeakKeyDictionary()


VERIFY_COSTS = VerifyCostStore()  # the process's store
