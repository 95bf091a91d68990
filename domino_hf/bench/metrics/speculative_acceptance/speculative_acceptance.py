# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""Speculative decoding acceptance length (τ) and decode speedup, as a 🤗 Evaluate metric.

A local metric module: `evaluate.load("<path>/speculative_acceptance")` (the folder or this .py file)
works offline. It is self-contained (numpy + evaluate + datasets only) because `evaluate` copies the
script into its module cache and imports it from there.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """\
Measures speculative decoding from per-step acceptance counts and decode timings.

One example = one `generate` call. `accepted` lists, for every target verify forward after prefill, how many
draft tokens the target accepted (the bonus token the target adds itself is not counted). Then

* tau (acceptance length) = sum(accepted + 1) / number of steps, pooled over all examples: tokens produced
  per target forward, bonus token included. Plain autoregressive decoding has tau = 1.
* histogram: number of steps that produced 1, 2, ... tokens.
* decode_ms_per_token per example = 1000 * decode_seconds / sum(accepted + 1) (decode time from the first
  generated token to the last, prefill excluded, over the tokens those steps produced), aggregated with
  the median over examples.
* speedup = baseline decode ms/token (median over the baseline runs) / the method's (median).
"""

_KWARGS_DESCRIPTION = """
Args:
    accepted (`list[list[int]]`): per example, accepted draft tokens per verify step (prefill excluded).
    decode_seconds (`list[float]`, values may be None): per example, decode wall time without prefill.
    baseline_decode_seconds (`list[float]`, optional): decode times of the baseline (autoregressive) runs.
    baseline_decode_tokens (`list[int]`, optional): tokens those baseline runs produced after prefill.
    baseline_ms_per_token (`float`, optional): the baseline's decode ms/token directly (wins over the two above).
Returns:
    tau (`float`), num_steps (`int`), mean_accepted (`float`), histogram (`dict[int, int]`),
    decode_ms_per_token (`float` or None), speedup (`float` or None).
Examples:
    >>> metric = evaluate.load("domino_hf/bench/metrics/speculative_acceptance")
    >>> out = metric.compute(accepted=[[3, 0, 2], [1]], decode_seconds=[0.09, 0.04], baseline_ms_per_token=20.0)
    >>> out["tau"], out["num_steps"], out["mean_accepted"], out["histogram"]
    (2.5, 4, 1.5, {1: 1, 2: 1, 3: 1, 4: 1})
    >>> out["decode_ms_per_token"], out["speedup"]
    (15.625, 1.28)
"""

_CITATION = """\
@article{domino2026,
  title={Domino: Decoupling Causal Modeling from Autoregressive Drafting in Speculative Decoding},
  journal={arXiv preprint arXiv:2605.29707},
  year={2026}
}
"""


def _median_ms_per_token(seconds, tokens):
    values = [1000.0 * s / t for s, t in zip(seconds, tokens) if s is not None and t]
    return float(np.median(values)) if values else None


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SpeculativeAcceptance(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "accepted": datasets.Sequence(datasets.Value("int32")),
                    "decode_seconds": datasets.Value("float64"),
                }
            ),
        )

    def _compute(
        self,
        accepted,
        decode_seconds,
        baseline_decode_seconds=None,
        baseline_decode_tokens=None,
        baseline_ms_per_token=None,
    ):
        steps = [int(a) for example in accepted for a in example]
        if any(a < 0 for a in steps):
            raise ValueError("accepted counts must be >= 0")
        num_steps = len(steps)
        produced = [sum(int(a) + 1 for a in example) for example in accepted]
        tau = (sum(steps) + num_steps) / num_steps if num_steps else None
        counts = np.bincount(np.asarray(steps, dtype=np.int64) + 1) if num_steps else np.zeros(1, dtype=np.int64)
        histogram = {int(n): int(c) for n, c in enumerate(counts) if n >= 1}
        ms = _median_ms_per_token(decode_seconds, produced)
        if baseline_ms_per_token is None and baseline_decode_seconds is not None:
            if baseline_decode_tokens is None or len(baseline_decode_tokens) != len(baseline_decode_seconds):
                raise ValueError("baseline_decode_tokens must give one token count per baseline_decode_seconds")
            baseline_ms_per_token = _median_ms_per_token(baseline_decode_seconds, baseline_decode_tokens)
        speedup = baseline_ms_per_token / ms if baseline_ms_per_token is not None and ms else None
        return {
            "tau": tau,
            "num_steps": num_steps,
            "mean_accepted": (sum(steps) / num_steps) if num_steps else None,
            "histogram": histogram,
            "decode_ms_per_token": ms,
            "speedup": speedup,
        }
