"""`domino bench`: measure speculative decoding (τ, acceptance, decode speedup, losslessness) on the
🤗 Transformers backend. Library entry point: `run_benchmark(target, prompts, BenchConfig(...), draft=...)`,
then `write_report(result, out_dir)`; the chained repeated-workload suite is `run_repeated` (`workloads.py`); the
CLI lives in `cli.py`."""

from .report import markdown, write_report
from .runner import ALL_METHODS, BenchConfig, BenchPrompt, run_benchmark
from .workloads import run_repeated

__all__ = ["ALL_METHODS", "BenchConfig", "BenchPrompt", "run_benchmark", "run_repeated", "write_report", "markdown"]
