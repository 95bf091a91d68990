"""The README's first snippet runs exactly as pasted (from a folder outside the checkout: the shipped draft loads by
its short name), and so does the `Use` snippet after it; its results block is what the renderer makes of the
committed report; the shipped model card's metadata and snippet are true; pyproject's torch floor is the one README
and CI state."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import requires_offline_target
from huggingface_hub import ModelCard

from domino_hf.bench import readme_table

ROOT = Path(__file__).resolve().parent.parent
CARD = ROOT / "drafts" / "smollm2-135m-instruct-domino" / "README.md"
REPORT = ROOT / "docs" / "bench" / "bench.json"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_first_snippet_defines_everything_it_uses():
    first = _python_blocks((ROOT / "README.md").read_text())[0]
    for name in ("target", "tokenizer", "draft", "inputs"):
        assert re.search(rf"^{name}\b.*=|^{name}, \w+ = |, {name} = ", first, re.M), name
    assert "TARGET" not in first and "DRAFT_DIR_OR_HUB_ID" not in first


KINDS = ROOT / "docs" / "bench" / "cpu_kinds" / "kinds.json"


def _rendered_block() -> str:
    report = json.loads(REPORT.read_text())
    kinds = readme_table.cpu_kinds(KINDS, ROOT / "README.md")
    return readme_table.render(report, readme_table.markdown_source(REPORT, ROOT / "README.md"), kinds)


def test_readme_results_block_is_rendered_from_the_committed_report():
    committed = readme_table.current_block((ROOT / "README.md").read_text())
    assert committed == _rendered_block(), (
        "README.md's results block differs from docs/bench/bench.json: run "
        "`python -m domino_hf.bench.readme_table docs/bench/bench.json --write README.md`"
    )


def test_results_block_carries_the_report_numbers(tmp_path):
    report = json.loads(REPORT.read_text())
    domino = report["methods"]["domino"]
    block = _rendered_block()
    assert f"{domino['tau']:.2f}" in block and f"{domino['speedup']:.2f}×" in block
    assert report["config"]["environment"]["transformers"] in block and "domino bench --target" in block
    edited = json.loads(REPORT.read_text())
    edited["methods"]["domino"]["speedup"] += 0.5  # an edited number no longer matches the committed README
    assert readme_table.render(edited, "docs/bench/bench.md") != block
    readme = tmp_path / "README.md"
    readme.write_text("intro\n" + readme_table.BEGIN + "\nold\n" + readme_table.END + "\noutro\n")
    assert readme_table.main([str(REPORT), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("\noutro\n") and "old" not in text
    assert readme_table.current_block(text).count(f"{domino['tau']:.2f}") >= 1
    with pytest.raises(ValueError):
        readme_table.replace_block("no markers here", block)


def test_shipped_card_metadata():
    text = CARD.read_text()
    meta = ModelCard(text).data.to_dict()
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and meta["base_model_relation"] == "adapter"
    assert meta["datasets"] and meta["pipeline_tag"] == "text-generation" and "draft-model" in meta["tags"]
    assert "../shared" not in text and "Q4_1 GGUF" in text and "untested" in text
    usage = _python_blocks(text)[0]
    assert 'load_target("smollm2")' in usage and "drafts/" not in usage  # a Hub id, not a local folder


@pytest.mark.integration
def test_readme_snippets_run_as_pasted(tmp_path):
    requires_offline_target()
    first, use = _python_blocks((ROOT / "README.md").read_text())[:2]
    assert "drafts/" not in first  # it works from any folder
    script = first + "\n" + use + "\nprint('SNIPPETS-OK', draft.last_generation_stats.num_steps)\n"
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert "SNIPPETS-OK" in result.stdout, result.stderr[-3000:]


@pytest.mark.integration
def test_shipped_card_snippet_runs_against_the_shipped_folder():
    requires_offline_target()
    usage = _python_blocks(CARD.read_text())[0]
    repo = re.search(r'AutoModel\.from_pretrained\("([^"]+)"', usage).group(1)
    checks = "\nassert draft.last_generation_stats.num_steps > 0\nprint('CARD-OK')\n"
    script = usage.replace(repo, str(CARD.parent)) + checks
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert "CARD-OK" in result.stdout, result.stderr[-3000:]


def test_torch_floor_agrees_with_readme_and_ci():
    """pyproject's torch floor is the oldest torch the README promises and CI installs; the README's install gives
    the CPU build's command (a plain `pip install torch` pulls the 2 GB CUDA build on Linux)."""
    floor = re.search(r'"torch>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    readme = (ROOT / "README.md").read_text()
    stated = re.findall(r"torch (\d+\.\d+) or newer", readme)
    assert stated and set(stated) == {floor}, f"README states torch {stated}, pyproject's floor is {floor}"
    ci = re.search(r"pip install -q torch==(\d+\.\d+)", (ROOT / ".ci" / "run").read_text()).group(1)
    assert ci == floor, f"CI tests torch {ci}, pyproject's floor is {floor}"
    assert re.search(r"^pip install torch --index-url https://download\.pytorch\.org/whl/cpu", readme, re.M)


def test_cpu_kinds_table_rows_come_from_their_reports(tmp_path):
    """Each row of the README's CPU table is its report's numbers (Domino's τ and speedups, the verify step ÷ a plain
    step from its profile) and links the report's Markdown twin, which exists."""
    kinds = readme_table.cpu_kinds(KINDS, ROOT / "README.md")
    block = readme_table.current_block((ROOT / "README.md").read_text())
    assert len(kinds) >= 3 and len({kind["cpu"] for kind in kinds}) >= 3
    for kind in kinds:
        domino, profile = kind["report"]["methods"]["domino"], kind["report"]["profile"]
        verify = profile["domino"]["ms_per_step"]["target_verify"]
        plain = profile["autoregressive"]["ms_per_step"]["target_verify"]
        row = next(line for line in block.splitlines() if line.startswith("| ") and f"]({kind['link']})" in line)
        assert row.startswith(f"| {kind['cpu']} |") and f"= {verify / plain:.2f} |" in row
        assert f"| {domino['tau']:.2f} | {domino['speedup']:.2f}× | {domino['speedup_vs_stock']:.2f}× |" in row
        assert (ROOT / kind["link"]).exists()
    edited = [dict(kind) for kind in kinds]
    edited[0]["report"] = json.loads(json.dumps(kinds[0]["report"]))
    edited[0]["report"]["methods"]["domino"]["speedup"] += 0.5
    report = json.loads(REPORT.read_text())
    assert readme_table.render(report, "docs/bench/bench.md", edited) != readme_table.render(
        report, "docs/bench/bench.md", kinds)
