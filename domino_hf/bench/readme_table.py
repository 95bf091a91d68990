"""The README's results block, rendered from a committed benchmark report.

`python -m domino_hf.bench.readme_table docs/bench/bench.json --write README.md` rewrites the text between
`<!-- results:begin -->` and `<!-- results:end -->` in README.md; without `--write` it prints the block.
Every number comes from the report's JSON (`report.py` writes it), so the README cannot drift from the file
it cites; `tests/test_readme.py` checks that the committed README holds exactly what this renders.

Below the table, the same draft on several CPU kinds side by side, one row per report that the manifest
`cpu_kinds/kinds.json` beside the report lists (`--cpu_kinds` names another): `[{"cpu": label, "report": JSON path
relative to the manifest, "note": optional}]`, each row linking its report's Markdown twin.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .report import _fmt, _lossless, _table, draft_dtype_note, environment_line
from .stats import AR_STOCK

logger = logging.getLogger(__name__)

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"

LABELS = {
    "autoregressive": "plain decoding (`autoregressive`)",
    "prompt_lookup": "prompt lookup, transformers' (`prompt_lookup`)",
    "assisted": "classic assistant model (`assisted`)",
    "dflash": "DFlash mode: same draft, head off (`dflash`)",
    "domino_no_lookup": "Domino block only (`domino_no_lookup`)",
    "domino": "**Domino as shipped (`domino`)**",
    "domino_tree": "Domino verifying draft trees (`domino_tree`)",
    AR_STOCK: f"plain decoding, stock kernels (`{AR_STOCK}`)",
}


def command(config: dict) -> str:
    """The `domino bench` command line that reproduces the run the report records."""
    sets = config["prompt_sets"]
    counts = set(sets.values())
    parts = ["domino bench", f"--target {config.get('target', '?')}"]
    if config.get("draft"):
        parts.append(f"--draft {config['draft']}")
    parts.append(f"--prompts {','.join(sets)}")
    if len(counts) == 1:
        parts.append(f"--num_prompts {counts.pop()}")
    parts += [f"--max_new_tokens {config['max_new_tokens']}", f"--methods {','.join(config['methods'])}"]
    if not config.get("greedy", True):
        parts.append(f"--temperature {config['temperature']}")
    if config.get("repeats", 1) != 1:
        parts.append(f"--repeats {config['repeats']}")
    parts.append(f"--dtype {config.get('dtype', 'float32')}")
    if config.get("draft_dtype"):
        parts.append(f"--draft_dtype {config['draft_dtype']}")
    if config.get("target_kernels"):
        parts.append(f"--target_kernels {config['target_kernels']}")
    return " ".join(parts)


CPU_KINDS_NOTE = (
    "τ is the same on every CPU for the same target dtype: the draft proposes the same tokens (a bf16 target answers "
    "a little differently, hence a slightly different τ). The speedup follows what a Domino verify step "
    "(the target over the drafted tokens) costs against a plain one-token step on that CPU's kernels (target ms per "
    "step, from each report's profile): the closer that ratio is to 1, the more of τ becomes speedup."
)


def cpu_kinds(manifest: Path, readme: Path) -> list[dict]:
    """The rows of the CPU-kinds table from `manifest` (see the module doc): each entry with its report loaded
    (`report`) and the link to the report's Markdown twin relative to `readme` (`link`)."""
    rows = []
    for entry in json.loads(manifest.read_text()):
        path = manifest.parent / entry["report"]
        rows.append({**entry, "report": json.loads(path.read_text()), "link": markdown_source(path, readme)})
    return rows


def cpu_kinds_table(kinds: list[dict]) -> str:
    """One row per CPU kind: the run's date, draft dtype, Domino's verify step ÷ a plain step (target time per step),
    Domino's τ and speedups, the report."""
    rows = []
    for kind in kinds:
        config, domino = kind["report"]["config"], kind["report"]["methods"]["domino"]
        profile = kind["report"].get("profile") or {}
        verify = (profile.get("domino") or {}).get("ms_per_step", {}).get("target_verify")
        plain = (profile.get("autoregressive") or {}).get("ms_per_step", {}).get("target_verify")
        cost = f"{verify:.1f} ÷ {plain:.1f} ms = {verify / plain:.2f}" if verify and plain else "–"
        run = (config.get("environment") or {}).get("date", "?")[:10] + (f" ({kind['note']})" if kind.get("note")
                                                                          else "")
        rows.append([kind["cpu"], run, config.get("draft_dtype") or config.get("dtype", "?"), cost,
                     _fmt(domino["tau"]), _fmt(domino["speedup"], "{:.2f}×"),
                     _fmt(domino.get("speedup_vs_stock"), "{:.2f}×"), f"[report]({kind['link']})"])
    header = ["CPU", "run", "draft dtype", "verify ÷ plain step", "Domino τ", "speedup, same kernels",
              "vs stock transformers", "report"]
    return _table(header, rows)


def render(report: dict, source: str | None = None, kinds: list[dict] | None = None) -> str:
    """The README block (markers included) for one `domino bench` report, with the CPU-kinds table when `kinds`
    (`cpu_kinds`) are given."""
    config, methods = report["config"], report["methods"]
    sets = ", ".join(f"{n} {name}" for name, n in config["prompt_sets"].items())
    mode = "greedy" if config.get("greedy", True) else f"sampling at T = {config['temperature']}"
    kernels = config.get("target_kernels") or "stock"
    rows = [
        [
            LABELS.get(name, f"`{name}`"),
            _fmt(m["tau"]),
            _fmt(m["speedup"], "{:.2f}×"),
            _fmt(m.get("speedup_vs_stock"), "{:.2f}×"),
            _fmt(m["decode_ms_per_token"], "{:.1f}"),
            _lossless(m["lossless"], name),
        ]
        for name, m in methods.items()
    ]
    header = ["method", "τ", "speedup, same kernels", "vs stock transformers", "decode ms/token", "lossless"]
    lines = [
        BEGIN,
        "<!-- generated by `python -m domino_hf.bench.readme_table` from the report below; do not edit by hand -->",
        "",
        environment_line(config.get("environment")),
        "",
        f"Target `{config.get('target', '?')}` in {config.get('dtype', '?')}{draft_dtype_note(config)}, draft "
        f"`{config.get('draft', '–')}`; prompts: {sets}; {config['max_new_tokens']} new tokens, {mode}; every method "
        f"on `{kernels}` target kernels, in one process, interleaved prompt by prompt.",
        "",
        "```bash",
        command(config),
        "```",
        "",
        _table(header, rows),
        "",
        "τ = tokens per target forward (bonus token included). Speedup = plain decoding's decode time per token on "
        "the same kernels ÷ the method's (prefill excluded, medians over prompts); vs stock transformers = the same "
        "against plain decoding on transformers' stock kernels, timed in the same run. Lossless = every greedy "
        "output token-identical to plain decoding.",
    ]
    if source:
        lines += ["", f"Full report (per prompt set, per-step profile, plots): [`{source}`]({source})."]
    if kinds:
        lines += ["", "The same draft and demo on several CPU kinds, 2 threads each, every row from its report:", "",
                  cpu_kinds_table(kinds), "", CPU_KINDS_NOTE]
    lines.append(END)
    return "\n".join(lines)


def _span(text: str) -> tuple[int, int]:
    """Where the results block (markers included) starts and ends in `text`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN} … {END} block")
    return start, end + len(END)


def replace_block(text: str, block: str) -> str:
    """`text` with its results block (markers included) replaced by `block`."""
    start, end = _span(text)
    return text[:start] + block + text[end:]


def current_block(text: str) -> str:
    """The results block (markers included) `text` holds now."""
    start, end = _span(text)
    return text[start:end]


def markdown_source(report_path: Path, readme: Path) -> str:
    """The report's Markdown twin (`bench.md` beside `bench.json`), as a link relative to the README."""
    md = report_path.with_suffix(".md")
    target = md if md.exists() else report_path
    try:
        return target.resolve().relative_to(readme.resolve().parent).as_posix()
    except ValueError:
        return target.as_posix()


def default_manifest(report_path: Path) -> Path | None:
    """`cpu_kinds/kinds.json` beside the report, or None when there is none."""
    path = report_path.parent / "cpu_kinds" / "kinds.json"
    return path if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m domino_hf.bench.readme_table", description=__doc__.split("\n")[0])
    parser.add_argument("report", type=Path, help="a `domino bench` JSON report, e.g. docs/bench/bench.json")
    parser.add_argument("--write", type=Path, metavar="README", help="rewrite the results block in this file")
    parser.add_argument("--cpu_kinds", type=Path, metavar="MANIFEST",
                        help="the CPU-kinds manifest (default: cpu_kinds/kinds.json beside the report, when there)")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    readme = args.write or Path("README.md")
    manifest = args.cpu_kinds or default_manifest(args.report)
    kinds = cpu_kinds(manifest, readme) if manifest else None
    block = render(report, markdown_source(args.report, readme), kinds)
    if args.write is None:
        sys.stdout.write(block + "\n")
        return 0
    try:
        args.write.write_text(replace_block(args.write.read_text(), block))
    except ValueError as error:
        parser.error(f"{args.write}: {error}")
    logger.info("%s: results block rewritten from %s", args.write, args.report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
