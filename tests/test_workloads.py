"""The repeated-workload suite (`domino bench --suite repeated`): chained turns, one store per store-using method
emptied where it should be, a warm-up on no timed prompt, the packaged workloads and their decontamination, the
report and the CLI. Tiny random targets with the word-level chat tokenizer (seconds on 2 shared cores).

The tests that run `domino_cache` (or `domino` with `use_suffix_cache=False`) need a generator that takes the
`use_suffix_cache` / `suffix_cache` arguments of `generate`."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from domino_hf.bench import cli as bench_cli
from domino_hf.bench import pipeline, runner, workloads
from domino_hf.bench.report import markdown
from domino_hf.bench.runner import BenchConfig
from domino_hf.bench.workloads import Conversation, answer_text, measure_cache_cost, run_repeated
from domino_hf.benchmark_sets import PACKAGED_SETS, REPEATED_SETS, packaged_set_path
from domino_hf.chat import chat_input_ids
from domino_hf.data import read_prompts

from conftest import make_tiny_target, make_tiny_tokenizer

CONVERSATIONS = [
    Conversation("loop", "a", ["w1 w2 w3", "w4 w5", "w6 w7 w8"]),
    Conversation("loop", "b", ["w9 w10 w11 w12", "w4 w5"]),
    Conversation("eval", "c", ["w20 w21 w22 w23 w24 w1"]),
    Conversation("eval", "d", ["w20 w21 w22 w23 w24 w2"]),
]
TURNS = sum(len(c.turns) for c in CONVERSATIONS)


@pytest.fixture(scope="module")
def models():
    """(target, draft, tokenizer): a random tiny target sized to the chat tokenizer and a random Domino draft."""
    from domino_hf import DominoDraftModel

    tiny_tokenizer = make_tiny_tokenizer()
    target = make_tiny_target(vocab_size=len(tiny_tokenizer))
    torch.manual_seed(0)
    draft = DominoDraftModel.from_target(target, num_hidden_layers=1, block_size=4).eval()
    return target, draft, tiny_tokenizer


def _config(methods, **overrides) -> BenchConfig:
    fields = dict(methods=tuple(methods), max_new_tokens=8, warmup=1, progress=False, profile=False)
    fields.update(overrides)
    return BenchConfig(**fields)


def _spy(monkeypatch) -> list[tuple[str, object, int, list[int]]]:
    """Record every `run_once` of the suite: (method, prompt, repeat, output ids)."""
    calls = []
    real = workloads.run_once

    def spy(target, method, prompt, repeat, *args):
        record = real(target, method, prompt, repeat, *args)
        calls.append((method.name, prompt, repeat, record.output_ids))
        return record

    monkeypatch.setattr(workloads, "run_once", spy)  # the timed calls
    monkeypatch.setattr(runner, "run_once", spy)  # the warm-up's
    return calls


# ------------------------------------------------------------------------------------------------ chained turns
def test_chained_turns_feed_back_the_reference_answers(models, monkeypatch):
    """Turn k's prompt is the chat template over the earlier turns and plain decoding's answers to them; every
    method gets the same prompt, in an order rotated turn by turn."""
    target, _, tokenizer = models
    calls = _spy(monkeypatch)
    result = run_repeated(target, tokenizer, CONVERSATIONS, _config(["autoregressive", "prompt_lookup"]))
    timed = [c for c in calls if c[2] >= 0]
    assert len(timed) == 2 * TURNS and len(result["runs"]) == 2 * TURNS
    ar = [(prompt, output) for name, prompt, _, output in timed if name == "autoregressive"]
    for conversation in CONVERSATIONS:
        mine = [(p, o) for p, o in ar if p.prompt_id.startswith(f"{conversation.id}/")]
        assert [p.prompt_id for p, _ in mine] == [f"{conversation.id}/turn{k + 1}" for k in range(len(mine))]
        answers = []
        for k, (prompt, output) in enumerate(mine):
            history = [t for turn, answer in zip(conversation.turns, answers) for t in (turn, answer)]
            assert prompt.input_ids == chat_input_ids(tokenizer, [*history, conversation.turns[k]])
            if k and answers[-1]:  # the previous answer's tokens are in this prompt
                previous = tokenizer(answers[-1], add_special_tokens=False)["input_ids"]
                text = " ".join(map(str, prompt.input_ids))
                assert " ".join(map(str, previous)) in text
            answers.append(answer_text(tokenizer, output))
    by_turn = {}
    for name, prompt, _, _ in timed:
        by_turn.setdefault((prompt.prompt_set, prompt.prompt_id), []).append((name, prompt.input_ids))
    assert all(len({tuple(ids) for _, ids in v}) == 1 for v in by_turn.values())
    orders = [tuple(name for name, _ in v) for v in by_turn.values()]
    assert len(set(orders)) == 2  # rotated
    assert result["methods"]["prompt_lookup"]["lossless"] is True
    assert set(result["by_set"]) == {"loop", "eval"}
    assert result["config"]["suite"] == "repeated" and result["config"]["conversations"] == {"loop": 2, "eval": 2}
    assert result["config"]["prompt_sets"] == {"loop": 5, "eval": 2} and "suffix_cache" not in result


def test_warmup_uses_a_prompt_of_no_workload(models, monkeypatch):
    target, _, tokenizer = models
    calls = _spy(monkeypatch)
    run_repeated(target, tokenizer, CONVERSATIONS, _config(["autoregressive", "prompt_lookup"], warmup=2))
    warm = [c for c in calls if c[2] < 0]
    assert len(warm) == 4 and calls[:4] == warm  # 2 per method, all before the first timed call
    timed_ids = {tuple(c[1].input_ids) for c in calls if c[2] >= 0}
    assert {tuple(c[1].input_ids) for c in warm} == {tuple(chat_input_ids(tokenizer, [workloads.WARMUP_TURN]))}
    assert not timed_ids & {tuple(c[1].input_ids) for c in warm}
    for name in REPEATED_SETS:  # nor is it a turn of a packaged workload
        assert all(workloads.WARMUP_TURN not in turn for r in read_prompts(name) for turn in r.turns)


def test_repeats_rerun_the_whole_suite_and_sampling_runs(models):
    target, _, tokenizer = models
    config = _config(["autoregressive", "prompt_lookup"], temperature=0.7, repeats=2, warmup=0)
    result = run_repeated(target, tokenizer, CONVERSATIONS[:2], config)
    assert len(result["runs"]) == 2 * 2 * 5 and {r["repeat"] for r in result["runs"]} == {0, 1}
    assert result["methods"]["prompt_lookup"]["lossless"] is None and "sampling" in markdown(result)


# ------------------------------------------------------------------------------------------------ stores
def test_each_store_using_method_has_its_own_store(models):
    """`domino_cache` owns a store (emptied by `reset`); the other Domino methods own none and switch the store off
    explicitly (the draft's default store would carry answers across prompts); two method lists never share one."""
    _, draft, _ = models
    first = runner.build_methods(["domino", "domino_cache", "dflash"], draft)
    second = runner.build_methods(["domino_cache"], draft)
    domino, cached, dflash = first
    assert domino.suffix_cache is None and dflash.suffix_cache is None
    assert domino.generate_kwargs() == {"assistant_model": draft, "use_suffix_cache": False}
    assert dflash.generate_kwargs()["use_suffix_cache"] is False
    kwargs = cached.generate_kwargs()
    assert kwargs["use_suffix_cache"] is True and kwargs["suffix_cache"] is cached.suffix_cache
    assert cached.suffix_cache is not second[0].suffix_cache
    assert cached.lookup and cached.use_head and cached.config_fields() == {}  # otherwise `domino` as shipped
    cached.suffix_cache.add([1, 2, 3, 4])
    cached.reset()
    assert cached.suffix_cache.num_tokens == 0


def test_plain_bench_methods_use_no_store(models):
    """Needs the generator's store arguments. In `run_benchmark` too, `domino` leaves the draft's default store
    alone (the warm-up runs on the first timed prompt there) and `domino_cache` starts its own empty."""
    target, draft, tokenizer = models
    prompts = [runner.BenchPrompt("chat", str(i), chat_input_ids(tokenizer, c.turns[:1]))
               for i, c in enumerate(CONVERSATIONS)]
    result = runner.run_benchmark(target, prompts, _config(["autoregressive", "domino", "domino_cache"]), draft=draft)
    assert len(getattr(draft, "suffix_cache", None) or []) == 0
    assert result["methods"]["domino"]["step_sources"]["cache"] == 0
    assert result["methods"]["domino_cache"]["lossless"] is True


def test_cache_cost_is_measured_on_what_the_store_holds():
    from domino_hf import SuffixCache

    cache = SuffixCache(max_tokens=10_000)
    sequences = [(4, [5, 6, 7, 8, 1, 2, 3, 4, 1, 2, 3, 4]), (4, [5, 6, 7, 9, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2])]
    for _, ids in sequences:
        cache.add(ids)
    cost = measure_cache_cost(cache, sequences)
    assert cost["num_tokens"] == 12 + 14 + 2 and cost["nbytes"] == cache.nbytes and cost["sequences"] == 2
    assert cost["lookups"] == 2 * workloads.LOOKUPS_PER_SEQUENCE
    assert cost["lookup_us_median"] > 0 and cost["add_us_median"] > 0 and cost["add_us_per_token"] > 0
    assert cache.num_tokens == 28  # measuring added nothing


def test_domino_cache_store_is_per_workload(models, monkeypatch):
    """Needs the generator's `use_suffix_cache` / `suffix_cache`. Each workload's store holds exactly that
    workload's prompts and outputs (nothing of the warm-up or an earlier workload); `domino` adds to no store;
    outputs stay identical to plain decoding; the report has the store's size and cost."""
    target, draft, tokenizer = models
    calls = _spy(monkeypatch)
    sizes = {}
    real = workloads.measure_cache_cost

    def measure(cache, sequences):
        sizes[len(sizes)] = cache.num_tokens
        return real(cache, sequences)

    monkeypatch.setattr(workloads, "measure_cache_cost", measure)
    config = _config(["autoregressive", "domino", "domino_cache"])
    result = run_repeated(target, tokenizer, CONVERSATIONS, config, draft=draft)
    for name in ("domino", "domino_cache"):
        assert result["methods"][name]["lossless"] is True
    expected = {}
    for name, prompt, repeat, output in calls:
        if name == "domino_cache" and repeat >= 0:
            expected[prompt.prompt_set] = expected.get(prompt.prompt_set, 0) + len(prompt.input_ids) + len(output) + 1
    by_set = result["suffix_cache"]["by_set"]
    assert list(by_set) == ["loop", "eval"] and all(list(v) == ["domino_cache"] for v in by_set.values())
    assert [by_set[s]["domino_cache"]["num_tokens"] for s in by_set] == [expected["loop"], expected["eval"]]
    assert list(sizes.values()) == [expected["loop"], expected["eval"]]
    assert len(getattr(draft, "suffix_cache", None) or []) == 0  # the draft's own store was never used
    shares = result["methods"]["domino_cache"]["step_sources"]
    assert set(shares) == {"domino", "lookup", "cache", "none"}
    assert result["methods"]["domino"]["step_sources"]["cache"] == 0
    assert result["suffix_cache"]["methods"]["domino_cache"]["per_step_us"] > 0
    text = markdown(result)
    assert "# Repeated-workload benchmark" in text and "## The cross-request store" in text
    assert "eval · domino_cache" in text and "steps: lookup / cache / plain" in text


def test_domino_cache_samples(models):
    """Needs the generator's store arguments: the suite at T = 0.7 with the store (lossless check n/a)."""
    target, draft, tokenizer = models
    config = _config(["autoregressive", "domino_cache"], temperature=0.7)
    result = run_repeated(target, tokenizer, CONVERSATIONS[:2], config, draft=draft)
    assert result["methods"]["domino_cache"]["lossless"] is None
    assert result["suffix_cache"]["by_set"]["loop"]["domino_cache"]["num_tokens"] > 0


# ------------------------------------------------------------------------------------------------ packaged sets
@pytest.mark.parametrize(("name", "count", "turns"), [("repeated_eval", 20, 1), ("refine_loop", 6, 3),
                                                      ("edit_loop", 4, 4)])
def test_packaged_workloads_are_registered(name, count, turns):
    assert name in PACKAGED_SETS and name in REPEATED_SETS and packaged_set_path(name).is_file()
    prompts = read_prompts(name)
    assert len(prompts) == count and prompts.skipped == 0
    assert all(len(r.turns) == turns for r in prompts.records)
    readme = packaged_set_path(name).with_name("README.md").read_text(encoding="utf-8")
    assert any(line.startswith(f"| `{name}` |") and "Apache-2.0" in line for line in readme.splitlines())


def test_eval_workload_repeats_one_preamble():
    records = read_prompts("repeated_eval").records
    questions = [r.turns[0].rsplit("Question: ", 1) for r in records]
    assert len({preamble for preamble, _ in questions}) == 1 and len({q for _, q in questions}) == len(records)
    assert questions[0][0].count("The answer is ") == 4  # the instruction's form, then three worked exemplars


def test_workloads_are_benchmark_filtered():
    """Every turn of the new workloads is a benchmark prompt: the decontamination filter drops it, and any training
    text holding a 13-word run of the shared preamble or of a function."""
    from domino_hf.training.decontaminate import BenchmarkFilter

    default = BenchmarkFilter.for_benchmarks()
    for name in REPEATED_SETS:
        for record in read_prompts(name).records:
            assert all(default(turn) for turn in record.turns), record.id
    preamble = read_prompts("repeated_eval").records[0].turns[0].split()
    assert default("Here is my homework: " + " ".join(preamble[10:25]))
    edit = read_prompts("edit_loop").records[0].turns[0]
    assert default(edit.split("```python\n")[1].split("```")[0])
    assert not default("Improve your answer, please, and make it rhyme.")


# ------------------------------------------------------------------------------------------------ CLI
def _parse(argv):
    parser = argparse.ArgumentParser(prog="domino")
    bench_cli.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_cli_suite_defaults():
    request = bench_cli.bench_request(_parse(["--suite", "repeated"]))
    assert request.prompts == list(REPEATED_SETS) and request.num_prompts is None and request.stem == "repeated"
    assert bench_cli.bench_request(_parse(["--suite", "repeated", "--temperature", "0.7"])).stem == "repeated_T0.7"
    assert pipeline.choose_methods(None, None, "repeated") == ["autoregressive", "prompt_lookup", "domino",
                                                               "domino_cache"]
    assert "domino_cache" not in pipeline.choose_methods(None, None)
    assert pipeline.choose_methods(["domino_cache"], None) == ["domino_cache"]
    request = bench_cli.bench_request(_parse(["--suite", "repeated", "--prompts", "refine_loop", "--num-prompts", "2"]))
    assert request.prompts == ["refine_loop"] and request.num_prompts == 2
    with pytest.raises(SystemExit):
        _parse(["--suite", "nope"])


def test_cli_suite_end_to_end(monkeypatch, tmp_path, models, capsys):
    """A chained JSONL workload through the CLI with the baselines: exit 0, `repeated.*` written."""
    tokenizer = models[2]
    target = make_tiny_target(vocab_size=len(tokenizer))  # its own: the CLI optimizes the kernels in place
    prompts = tmp_path / "chats.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": c.id, "turns": c.turns}) for c in CONVERSATIONS[:2]))
    monkeypatch.setattr(pipeline, "load_target", lambda name, dtype, device, **hub_options: (target, tokenizer))
    argv = ["--suite", "repeated", "--prompts", str(prompts), "--methods", "autoregressive,prompt_lookup",
            "--max-new-tokens", "6", "--no-progress", "--no-plots", "--out", str(tmp_path / "out"), "--threads", "1"]
    assert bench_cli.run(_parse(argv)) == 0
    assert "# Repeated-workload benchmark" in capsys.readouterr().out
    result = json.loads((tmp_path / "out" / "repeated.json").read_text())
    assert result["config"]["suite"] == "repeated" and result["config"]["prompt_sets"] == {"chats": 5}
    assert len(result["runs"]) == 15 and result["config"]["target_kernels"] == "optimized"  # + the stock baseline
