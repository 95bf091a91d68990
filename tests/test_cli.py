"""`domino` CLI conventions: fast top-level help, defaults in every --help, 🤗 Trainer option names, target
loading options, and one-line errors for empty data, missing paths and a committed bench report."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import pytest

from domino_hf.cli import PASSTHROUGH, SUBCOMMANDS, build_parser, main, requested_command


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(command)
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


def test_top_level_help_imports_neither_torch_nor_transformers():
    script = (
        "import sys\n"
        "from domino_hf.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in result.stdout, result.stdout + result.stderr
    for command in SUBCOMMANDS:
        assert command in result.stdout


# Every command's help and usage errors (an unknown option; a missing required argument where one is required), run
# in one interpreter by `main`: exit codes by argv, then the heavy modules that got imported.
HELP_AND_USAGE_ERRORS = (
    "import contextlib, io, json, sys\n"
    "from domino_hf.cli import PASSTHROUGH, SUBCOMMANDS, main\n"
    "codes = {}\n"
    "for command in [*SUBCOMMANDS, *PASSTHROUGH]:\n"
    "    runs = [[command, '--help'], [command, '--no-such-option']]\n"
    "    runs += [[command]] if command in SUBCOMMANDS and command != 'bench' else []\n"
    "    for argv in runs:\n"
    "        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
    "            try:\n                codes[' '.join(argv)] = main(argv)\n"
    "            except SystemExit as exit:\n                codes[' '.join(argv)] = exit.code\n"
    "print(json.dumps(codes))\n"
    "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'domino_hf.modeling') if m in sys.modules))\n"
)


def test_subcommand_help_and_usage_errors_import_neither_torch_nor_transformers():
    """`domino <command> --help`, an unknown option and a missing required argument are answered by argparse (or
    lm-eval's parser) before torch, transformers or the modeling files load."""
    result = subprocess.run([sys.executable, "-c", HELP_AND_USAGE_ERRORS], capture_output=True, text=True,
                            timeout=300)
    assert "HEAVY []" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    codes = json.loads(result.stdout.splitlines()[0])
    for command in [*SUBCOMMANDS, *PASSTHROUGH]:
        assert codes[f"{command} --help"] == 0 and codes[f"{command} --no-such-option"] == 2, command
    assert all(codes[command] == 2 for command in SUBCOMMANDS if command != "bench")  # required arguments missing


def test_subcommand_help_is_fast():
    """Each `domino <command> --help` in its own interpreter: well under a second on an idle machine (importing torch
    and transformers alone takes several); the bound leaves room for a busy shared one."""
    slowest = {}
    for command in [*SUBCOMMANDS, *PASSTHROUGH]:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "domino_hf.cli", command, "--help"], capture_output=True,
                                text=True, timeout=120)
        slowest[command] = time.perf_counter() - start
        assert result.returncode == 0 and "usage:" in result.stdout, (command, result.stderr[-2000:])
    assert max(slowest.values()) < 2.5, slowest


def test_only_the_requested_subcommand_is_imported():
    assert requested_command(["--log-level", "debug", "train", "--data", "x"]) == "train"
    assert requested_command(["--log-level=debug", "bench"]) == "bench"
    assert requested_command(["--help"]) is None and requested_command(["nope"]) is None
    script = (
        "import sys\n"
        "from domino_hf.cli import build_parser\n"
        "build_parser('export')\n"
        "print('LOADED', sorted(m for m in sys.modules if m.startswith('domino_hf.') and m.count('.') >= 2 "
        "and not m.startswith('domino_hf.modeling')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    loaded = result.stdout.split("LOADED", 1)[1]
    assert "domino_hf.training.export" in loaded and "regen" not in loaded and "domino_hf.bench" not in loaded


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_default_is_shown_in_help(command):
    parser = _subparser(command)
    formatter = parser._get_formatter()
    missing = [
        action.option_strings[0]
        for action in parser._actions
        if action.option_strings and action.help not in (None, argparse.SUPPRESS)
        and action.default not in (None, argparse.SUPPRESS) and "default" not in formatter._expand_help(action)
    ]
    assert missing == []
    assert "(default:" in parser.format_help()


TRAIN_ALIASES = [
    ("--model_name_or_path", "owner/model", "target", "owner/model"),
    ("--train_file", "d.jsonl", "data", ["d.jsonl"]),
    ("--output_dir", "run", "out", "run"),
    ("--learning_rate", "1e-3", "lr", 1e-3),
    ("--gradient_accumulation_steps", "4", "grad_accum", 4),
    ("--num_train_epochs", "2", "epochs", 2.0),
    ("--per_device_train_batch_size", "3", "batch_size", 3),
    ("--max_steps", "7", "max_steps", 7),
    ("--resume_from_checkpoint", "run/checkpoint-5", "resume", "run/checkpoint-5"),
    ("--save_steps", "9", "save_steps", 9),
    ("--save_total_limit", "0", "save_total_limit", 0),
    ("--report_to", "tensorboard", "report_to", "tensorboard"),
]


def _parse(argv):
    return build_parser(argv[0]).parse_args(argv)


def test_train_answers_to_trainer_names_and_keeps_its_own():
    for flag, value, dest, expected in TRAIN_ALIASES:
        required = {"data": ["--data", "d.jsonl"], "out": ["--out", "run"]}
        required.pop(dest, None)  # the alias under test stands in for it
        argv = ["train", *required.get("data", []), *required.get("out", []), flag, value]
        assert getattr(_parse(argv), dest) == expected, flag
    old = _parse(["train", "--target", "t", "--data", "d", "--out", "o", "--lr", "1e-3", "--grad-accum", "2",
                  "--epochs", "5", "--batch-size", "2", "--resume"])
    assert (old.target, old.out, old.lr, old.grad_accum, old.epochs, old.batch_size) == ("t", "o", 1e-3, 2, 5.0, 2)
    assert old.resume is True  # the newest complete checkpoint in --out
    assert _parse(["train", "--data", "d", "--out", "o", "--resume_from_checkpoint"]).resume is True
    assert _parse(["train", "--data", "d", "--out", "o"]).resume is False


def test_export_push_options_both_ways():
    new = _parse(
        ["export", "run", "--output_dir", "x", "--push_to_hub", "--hub_model_id", "me/d", "--hub_private_repo"],
    )
    assert (new.out, new.push_to_hub, new.hub_model_id, new.private) == ("x", True, "me/d", True)
    old = _parse(["export", "run", "--out", "x", "--push-to-hub", "me/d"])
    assert (old.push_repo, old.push_to_hub) == ("me/d", False)


@pytest.mark.parametrize("command, required", [
    ("regen", ["--out", "o"]), ("features", ["--data", "d", "--config", "c", "--out", "o"]),
    ("train", ["--data", "d", "--out", "o"]), ("bench", []),
])
def test_target_options_everywhere(command, required):
    args = _parse([command, *required, "--model_name_or_path", "me/t", "--trust_remote_code", "--revision", "v2",
                   "--token", "hf_x"])
    assert (args.target, args.trust_remote_code, args.revision, args.token) == ("me/t", True, "v2", "hf_x")
    assert _parse([command, *required, "--trust-remote-code"]).trust_remote_code is True
    assert _parse([command, *required]).target == "smollm2"


@pytest.mark.parametrize("command", ["train", "features", "regen"])
def test_target_options_reach_load_target(command, tmp_path, monkeypatch, caplog):
    import domino_hf.targets

    seen = []

    def spy(name, dtype=None, device=None, **hub_options):
        seen.append((name, hub_options))
        raise OSError("no target in this test")

    monkeypatch.setattr(domino_hf.targets, "load_target", spy)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "hi"}) + "\n")
    required = {"train": ["--data", str(data)], "features": ["--data", str(data), "--config", str(data)],
                "regen": ["--prompts", str(data)]}[command]
    argv = [command, *required, "--output_dir" if command != "regen" else "--out", str(tmp_path / "o"),
            "--target", "me/t", "--trust_remote_code", "--revision", "v2", "--token", "hf_x"]
    assert main(argv) == 2 and "no target in this test" in caplog.text
    assert seen == [("me/t", {"trust_remote_code": True, "revision": "v2", "token": "hf_x"})]


@pytest.fixture
def tiny_target_dir(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    return tmp_path / "target"


@pytest.mark.parametrize("command", ["train", "features"])
def test_data_with_no_usable_line_is_a_one_line_error(command, tiny_target_dir, tmp_path, caplog):
    data = tmp_path / "bad.jsonl"
    data.write_text("{broken\n" + json.dumps({"prompt": "no ids"}) + "\n[]\n")
    extra = ["--config", str(data)] if command == "features" else []
    argv = [command, "--target", str(tiny_target_dir), "--data", str(data), *extra, "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0].getMessage()
    assert f"--data {data}: no usable training example (3 malformed line(s) skipped)" in errors[0].getMessage()
    assert "Expected `domino regen` JSONL" in errors[0].getMessage()
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["train", "features", "regen", "bench"])
def test_missing_local_target_is_a_clear_error(command, tmp_path, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "hi"}) + "\n")
    required = {"train": ["--data", str(data), "--out", "o"], "features": ["--data", str(data), "--config",
                str(data), "--out", "o"], "regen": ["--prompts", str(data), "--out", "o"],
                "bench": ["--methods", "autoregressive", "--out", "o"]}[command]
    assert main([command, *required, "--target", "./runs/no-such-target"]) == 2
    assert "target './runs/no-such-target': no such folder (relative to" in caplog.text
    assert "Repo id must be in the form" not in caplog.text


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def test_bench_refuses_to_overwrite_a_report(tmp_path, monkeypatch, caplog):
    """A committed report, or an earlier run's, is replaced only with --overwrite_output_dir; another stem writes."""
    from domino_hf.bench import pipeline

    report = tmp_path / "docs" / "bench"
    report.mkdir(parents=True)
    (report / "bench.json").write_text("{}")
    (report / "bench_T1.json").write_text("{}")  # present but not committed: an earlier run's
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "docs/bench/bench.json")
    _git(tmp_path, "commit", "-qm", "report")

    def no_target(*args, **kwargs):
        raise pipeline.UsageError("target load reached")

    monkeypatch.setattr(pipeline, "load_target", no_target)
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "--methods", "autoregressive", "--out", "docs/bench"]
    assert main(argv) == 2
    assert "--out docs/bench: bench.json is already there, tracked by git (a committed report)" in caplog.text
    assert "--overwrite_output_dir" in caplog.text and "target load reached" not in caplog.text
    caplog.clear()
    assert main(argv + ["--overwrite_output_dir"]) == 2 and "target load reached" in caplog.text
    caplog.clear()
    assert main(argv + ["--temperature", "1"]) == 2 and "target load reached" not in caplog.text
    assert "bench_T1.json is already there, from an earlier run" in caplog.text
    caplog.clear()
    assert main(argv + ["--overwrite-output-dir", "--temperature", "1"]) == 2 and "target load reached" in caplog.text
    caplog.clear()
    assert main(argv + ["--name", "other"]) == 2 and "target load reached" in caplog.text  # nothing there yet
    assert _parse(["bench"]).out == "runs/bench"  # the default never points at the committed docs/bench


def test_bench_checks_prompt_sets_and_draft_before_loading_models(monkeypatch, caplog):
    from domino_hf.bench import pipeline

    def no_target(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(pipeline, "load_target", no_target)
    assert main(["bench", "--methods", "autoregressive", "--prompts", "mt_bench,nosuchset"]) == 2
    line = next(r.getMessage() for r in caplog.records if "nosuchset" in r.getMessage())
    assert "\n" not in line and "neither a file nor one of: mt_bench, alpaca, sum, qa, copy_heavy" in line
    caplog.clear()
    assert main(["bench", "--methods", "autoregressive,domino"]) == 2  # no --draft
    assert "needs a Domino draft: pass --draft PATH_OR_HUB_ID" in caplog.text


UNSUPPORTED = (
    "import sys, transformers\n"
    "transformers.__version__ = '5.26.0'\n"
    "from domino_hf.cli import main\n"
    "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as exit:\n    code = exit.code\n"
    "print('EXIT', code)\n"
)


UNSUPPORTED_HELP = (
    "import contextlib, io, json, sys, transformers\n"
    "transformers.__version__ = '5.26.0'\n"
    "from domino_hf.cli import main\n"
    "for command in sys.argv[1:]:\n"
    "    out = io.StringIO()\n"
    "    with contextlib.redirect_stdout(out):\n"
    "        try:\n            code = main([command, '--help'])\n"
    "        except SystemExit as exit:\n            code = exit.code\n"
    "    print(json.dumps([command, code, out.getvalue()]))\n"
)


def test_help_works_on_an_unsupported_transformers():
    """Every subcommand's --help works on a transformers outside the range (here the installed release pretends to
    be 5.26.0), each subcommand's modules imported under it: one interpreter runs them all in turn."""
    result = subprocess.run([sys.executable, "-c", UNSUPPORTED_HELP, *SUBCOMMANDS], capture_output=True, text=True,
                            timeout=300)
    helps = {command: (code, out) for command, code, out in map(json.loads, result.stdout.splitlines())}
    assert list(helps) == list(SUBCOMMANDS), result.stderr[-2000:]
    for command, (code, out) in helps.items():
        assert code == 0 and "--log_level" not in out, (command, out[-500:])
        assert f"usage: domino {command}" in out


def test_a_command_on_an_unsupported_transformers_says_the_range_in_one_line():
    from domino_hf.modeling.dispatch_domino import supported_range

    argv = ["bench", "--methods", "autoregressive", "--target", "no-such-target-folder/"]
    result = subprocess.run([sys.executable, "-c", UNSUPPORTED, *argv], capture_output=True, text=True, timeout=300)
    assert "EXIT 2" in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("domino bench: Domino drafts support transformers"), lines
    assert f"transformers{supported_range()} (found 5.26.0)" in lines[0]


def test_lm_eval_on_an_unsupported_transformers_says_the_range_in_one_line():
    """`domino lm-eval` parses lm-eval's arguments first (help and usage errors at once), then refuses the release
    before anything runs, as every command does."""
    pytest.importorskip("lm_eval")
    argv = ["lm-eval", "--model", "domino", "--model_args", "pretrained=no-such-target", "--tasks", "none"]
    result = subprocess.run([sys.executable, "-c", UNSUPPORTED, *argv], capture_output=True, text=True, timeout=300)
    assert "EXIT 2" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.strip().splitlines() if line.startswith("domino")]
    assert len(lines) == 1 and lines[0].startswith("domino lm-eval: Domino drafts support transformers"), lines


# ------------------------------------------------------------------------------------------ one spelling convention
def _own_options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_help_spells_every_option_one_way_and_names_only_its_own(command):
    """Help lists options with underscores (the 🤗 Trainer scripts' spelling) and mentions no option the command
    lacks (another command's options appear only inside a quoted `domino …` command line)."""
    import re

    parser = _subparser(command)
    text = parser.format_help()
    assert re.findall(r"(?<![\w-])--[a-z0-9]+(?:-[a-z0-9]+)+", text) == [], command
    listed = {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
    assert all("-" not in s[2:] for s in listed if s.startswith("--")), command
    assert "also answers to its name with dashes for underscores" in text
    outside_quoted_commands = re.sub(r"`(domino|python|accelerate|pip)[^`]*`", "", text)
    mentioned = set(re.findall(r"(?<![\w-])--[a-z0-9_]+", outside_quoted_commands))
    assert mentioned <= _own_options(parser), (command, mentioned - _own_options(parser))
    top = build_parser().format_help()
    assert "--log_level" in top and "--log-level" not in top


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_option_answers_to_its_dashed_spelling(command):
    parser = _subparser(command)
    for option in _own_options(parser):
        if option.startswith("--") and "_" in option:
            dashed = option.replace("_", "-")
            if dashed in _own_options(parser):  # export's earlier `--push-to-hub [REPO_ID]`, declared on its own
                continue
            assert parser._declared_spelling(dashed) == option and parser._declared_spelling(f"{dashed}=7") == \
                f"{option}=7"


SPELLINGS = [  # (argv with underscores, the same with dashes)
    (["bench", "--num_prompts", "3", "--max_new_tokens=9", "--no_profile", "--overwrite_output_dir"],
     ["bench", "--num-prompts", "3", "--max-new-tokens=9", "--no-profile", "--overwrite-output-dir"]),
    (["train", "--data", "d", "--out", "o", "--max_steps", "2", "--draft_vocab_size", "0", "--no_bf16",
      "--resume_from_checkpoint", "o/checkpoint-4"],
     ["train", "--data", "d", "--out", "o", "--max-steps", "2", "--draft-vocab-size", "0", "--no-bf16",
      "--resume", "o/checkpoint-4"]),
    (["regen", "--out", "o", "--max_prompt_tokens", "5", "--trust_remote_code", "--request_timeout", "3"],
     ["regen", "--out", "o", "--max-prompt-tokens", "5", "--trust-remote-code", "--request-timeout", "3"]),
    (["export", "run", "--out", "x", "--base_model", "a/b", "--published_dialect"],
     ["export", "run", "--out", "x", "--base-model", "a/b", "--published-dialect"]),
]


@pytest.mark.parametrize("underscores, dashes", SPELLINGS)
def test_both_spellings_parse_to_the_same_values(underscores, dashes):
    assert vars(_parse(underscores)) == vars(_parse(dashes))
    assert build_parser().parse_args(["--log-level", "debug"]).log_level == "debug"
    assert _parse(["bench", "--num-p", "4"]).num_prompts == _parse(["bench", "--num_p", "4"]).num_prompts == 4


def test_train_resumes_through_one_option():
    parser = _subparser("train")
    resume = [a for a in parser._actions if a.dest == "resume"]
    assert len(resume) == 1 and resume[0].option_strings == ["--resume_from_checkpoint", "--resume"]
    assert _parse(["train", "--data", "d", "--out", "o", "--resume"]).resume is True
    assert _parse(["train", "--data", "d", "--out", "o", "--resume", "o/checkpoint-2"]).resume == "o/checkpoint-2"


def test_export_pushes_through_one_option(tmp_path, caplog):
    """`--push_to_hub` (a flag) with `--hub_model_id`; the earlier `--push-to-hub REPO_ID` still means both, and
    naming two repos is a one-line error before anything loads."""
    assert "--push-to-hub" not in _subparser("export").format_help()
    flag = _parse(["export", "run", "--out", "x", "--push-to-hub"])
    assert flag.push_repo is True  # no repo named: as --push_to_hub
    argv = ["export", str(tmp_path / "no-run"), "--out", str(tmp_path / "x"), "--push-to-hub", "me/a",
            "--hub_model_id", "me/b"]
    assert main(argv) == 2
    assert "--push-to-hub me/a and --hub_model_id me/b name two repos" in caplog.text


LM_EVAL_MISSING = (
    "import contextlib, io, sys\n"
    "sys.modules['lm_eval'] = None  # `import lm_eval` raises ImportError: the [eval] extra is not installed\n"
    "from domino_hf.cli import main\n"
    "for argv in (['lm-eval', '--help'], ['lm-eval', '--model', 'domino']):\n"
    "    out, err = io.StringIO(), io.StringIO()\n"
    "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
    "        code = main(argv)\n"
    "    print(repr((code, out.getvalue(), err.getvalue())))\n"
)


def test_lm_eval_help_works_without_lm_eval():
    import ast

    result = subprocess.run([sys.executable, "-c", LM_EVAL_MISSING], capture_output=True, text=True, timeout=300)
    (help_code, help_out, _), (run_code, _, run_err) = map(ast.literal_eval, result.stdout.splitlines())
    assert help_code == 0 and "usage: domino lm-eval" in help_out, result.stderr[-2000:]
    assert "pip install 'domino-hf[eval]'" in help_out
    assert run_code == 2 and "domino lm-eval: " in run_err and "pip install 'domino-hf[eval]'" in run_err


def test_save_total_limit_zero_keeps_every_checkpoint_and_negative_is_refused():
    from domino_hf.training.recipe import TrainSettings
    from domino_hf.training.train_cli import train_job

    args = _parse(["train", "--target", "smollm2", "--data", "d.jsonl", "--out", "o", "--save_total_limit", "0"])
    assert train_job(args).settings.save_total_limit is None
    with pytest.raises(ValueError, match="save_total_limit must be >= 1"):
        TrainSettings(output_dir="o", save_total_limit=-1)
