"""The benchmark report says what ran: its text follows the warm-up setting, a headline from few prompts or tokens
says so, repeats give a spread, a batches-only run says why there is no one-prompt table, and an existing report is
replaced only with --overwrite_output_dir. Hand-made results: no timing."""

from __future__ import annotations

import pytest

from domino_hf.bench import pipeline
from domino_hf.bench.report import FEW_PROMPTS, FEW_TOKENS, markdown
from domino_hf.bench.stats import AR, repeat_spread


def _method(speedup: float) -> dict:
    return {"tau": 2.0 if speedup != 1 else 1.0, "speedup": speedup, "decode_ms_per_token": 10 / speedup,
            "tokens_per_s": 50.0 * speedup, "lossless": True}


def _runs(ms_by_repeat: dict[str, list[float]], prompts: int) -> list[dict]:
    return [{"method": method, "repeat": repeat, "prompt_id": str(p), "decode_ms_per_token": ms}
            for method, per_repeat in ms_by_repeat.items() for repeat, ms in enumerate(per_repeat)
            for p in range(prompts)]


def _result(prompts: int = 20, tokens: int = 128, repeats: int = 1, warmup: int = 1, runs=None) -> dict:
    config = {"prompt_sets": {"humaneval": prompts}, "num_prompts": prompts, "greedy": True, "temperature": 0.0,
              "max_new_tokens": tokens, "repeats": repeats, "warmup": warmup, "methods": [AR, "domino"]}
    return {"config": config, "methods": {AR: _method(1.0), "domino": _method(1.8)}, "runs": runs or []}


def test_the_settings_line_says_the_warm_up_that_ran():
    assert "1 repeat(s), 1 untimed warm-up call per method," in markdown(_result(warmup=1))
    assert "3 untimed warm-up calls per method" in markdown(_result(warmup=3))
    text = markdown(_result(warmup=0))
    assert "1 repeat(s), no warm-up," in text and "warm-up call" not in text


def test_the_batch_note_follows_the_warm_up():
    result = _result(warmup=0)
    block = {AR: {"supported": True, "tau": 1.0, "tokens_per_s": 90.0, "speedup": 1.0, "row_ms_per_token": 20.0,
                  "tokens_per_s_e2e": 80.0, "lossless": True}}
    result["batch"] = {"sizes": {"1": block, "2": block}}
    text = markdown(result)
    assert "interleaved batch by batch, with no warm-up." in text and "after a warm-up" not in text
    result["config"]["warmup"] = 2
    assert "interleaved batch by batch, after 2 untimed warm-up calls per method." in markdown(result)


def test_a_headline_from_few_prompts_or_tokens_says_so():
    assert "Small sample" not in markdown(_result(prompts=FEW_PROMPTS, tokens=FEW_TOKENS))
    text = markdown(_result(prompts=1, tokens=16))
    assert "**Small sample: 1 prompt and 16 new tokens a prompt.**" in text
    assert f"at least {FEW_PROMPTS} prompts (--num_prompts)" in text and "--repeats 3" in text
    assert "**Small sample: 4 prompts.**" in markdown(_result(prompts=4))
    assert "**Small sample: 32 new tokens a prompt.**" in markdown(_result(tokens=32))


def test_repeats_give_each_speedup_its_range():
    # per repeat, medians over prompts: plain 10 and 12 ms/token, domino 5 and 8: speedups 2.0 and 1.5
    runs = _runs({AR: [10.0, 12.0], "domino": [5.0, 8.0]}, prompts=3)
    assert repeat_spread(runs) == {AR: (1.0, 1.0), "domino": (1.5, 2.0)}
    assert repeat_spread(_runs({AR: [10.0], "domino": [5.0]}, prompts=3)) == {}  # one repeat: no spread
    text = markdown(_result(prompts=3, repeats=2, runs=runs))
    assert "| speedup per repeat, min–max |" in text and "| 1.50–2.00× |" in text
    assert "**Small sample: 3 prompts.**" in text and "--repeats 3" not in text  # the spread is there already
    assert "min–max" not in markdown(_result(runs=_runs({AR: [10.0], "domino": [5.0]}, prompts=20)))


def test_a_batches_only_run_says_why_there_is_no_one_prompt_table():
    result = _result()
    result["methods"], result["runs"] = {}, []
    block = {AR: {"supported": True, "tau": 1.0, "tokens_per_s": 90.0, "speedup": 1.0, "row_ms_per_token": 20.0,
                  "tokens_per_s_e2e": 80.0, "lossless": True}}
    result["batch"] = {"sizes": {"2": block}}
    text = markdown(result)
    assert "Batches only (`--batch_size 2`, without 1): no one-prompt-per-call table." in text
    assert "\n| method | τ |" not in text and "## Batched decoding" in text


def test_bench_help_says_which_batch_sizes_give_which_tables():
    from domino_hf.bench.cli import DESCRIPTION

    assert "--batch_size 1,4 gives both, --batch_size 4 the batches alone" in DESCRIPTION
    assert f"below {FEW_PROMPTS} prompts or {FEW_TOKENS} new tokens a prompt" in DESCRIPTION


def test_an_existing_report_is_replaced_only_with_overwrite_output_dir(tmp_path):
    names = ["bench.json", "bench.md"]
    pipeline.refuse_overwrite(tmp_path, names, overwrite=False)  # nothing there yet
    (tmp_path / "bench.md").write_text("# an earlier run\n")
    with pytest.raises(pipeline.UsageError, match=r"bench.md is already there, from an earlier run.*"
                       r"--overwrite_output_dir"):
        pipeline.refuse_overwrite(tmp_path, names, overwrite=False)
    pipeline.refuse_overwrite(tmp_path, names, overwrite=True)
    pipeline.refuse_overwrite(tmp_path, ["bench_T1.json", "bench_T1.md"], overwrite=False)  # another stem
