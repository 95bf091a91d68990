"""`domino bench`: measure speculative decoding (τ, acceptance, decode speedup, losslessness) on the
🤗 Transformers backend. Library entry point: `run_benchmark(target, prompts, BenchConfig(...), draft=...)`,
then `write_report(result, out_dir)`; batches of prompts at several batch sizes are `run_batch_sizes`
(`batched.py`); the chained repeated-workload suite is `run_repeated` (`workloads.py`); the
CLI lives in `cli.py`.

The names below load on first use (PEP 562), so `domino bench --help` imports neither torch nor transformers."""

import importlib

# name -> submodule that defines it
_EXPORTS = {"ALL_METHODS": "runner", "BenchConfig": "runner", "BenchPrompt": "runner", "run_benchmark": "runner",
            "run_batch_sizes": "batched", "run_repeated": "workloads", "write_report": "report", "markdown": "report"}


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = ["ALL_METHODS", "BenchConfig", "BenchPrompt", "run_benchmark", "run_batch_sizes", "run_repeated",
           "write_report", "markdown"]
