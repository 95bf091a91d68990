"""Build the long-prompt sets `long_qa`, `long_sum` and `long_chat` (`domino_hf/prompt_sets/`): 700-3,000 tokens each.

Why: on long prompts a verify step reads a long KV cache, and copy-friendly context changes what a drafter can
propose; the benchmark needs long prompts of its own, from text that may be redistributed and that no benchmark
and no training source of the project uses. Sources, all on the machine offline:
* the licence texts Debian ships in /usr/share/common-licenses (Apache-2.0, GPL-3, LGPL-3, MPL-2.0, the
  Artistic licence, GFDL-1.3, CC0-1.0), quoted verbatim, as their own terms allow;
* the Python standard library's `LICENSE.txt` and IDLE's release notes (`idlelib/NEWS.txt`, `NEWS2x.txt`,
  `HISTORY.txt`), PSF licence.

* `long_qa`: one document (a licence, or a part of one) and a question it answers;
* `long_sum`: release notes or licence sections under one of several summarisation instructions;
* `long_chat`: a conversation over a licence, section by section, given as a transcript in one user message
  (`domino bench` formats a set's first user turn), ending with a question that spans the sections. The
  assistant turns of the transcript quote the section they answer about.

Deterministic; rerun to regenerate, then commit the JSONL files (`--check` prints token counts with a tokenizer):

    python examples/make_long_sets.py --out domino_hf/prompt_sets --check HuggingFaceTB/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import json
import re
import sysconfig
from pathlib import Path

LICENSES = Path("/usr/share/common-licenses")
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8").replace("\r\n", "\n").strip()


def sections(text: str, pattern: str) -> list[str]:
    """`text` cut before every line matching `pattern` (the text before the first match is section 0)."""
    starts = [0] + [m.start() for m in re.finditer(pattern, text, flags=re.MULTILINE)]
    return [text[a:b].strip() for a, b in zip(starts, starts[1:] + [len(text)]) if text[a:b].strip()]


def gpl3() -> list[str]:
    return sections(read(LICENSES / "GPL-3"), r"^  \d+\. ")  # [preamble, 0. Definitions, …, 17.]


def mpl2() -> list[str]:
    return sections(read(LICENSES / "MPL-2.0"), r"^\d+\. ")  # [title, 1. Definitions, …, 10., Exhibit A…]


def gfdl() -> list[str]:
    return sections(read(LICENSES / "GFDL-1.3"), r"^\d+\. [A-Z]")


def python_license() -> list[str]:
    return sections(read(STDLIB / "LICENSE.txt"), r"^[AB]\. ")


def idle_releases() -> list[str]:
    """IDLE's release notes, one entry per release, newest first, 3.x then 2.x and earlier."""
    notes = []
    for name in ("NEWS.txt", "NEWS2x.txt"):
        notes += sections(read(STDLIB / "idlelib" / name), r"^What's New in IDLE")
    return [n for n in notes if n.startswith("What's New")]


def chunks(entries: list[str], min_chars: int, max_chars: int) -> list[str]:
    """Consecutive entries (split at blank lines when one is too long) joined into pieces of a bounded size."""
    paragraphs = [p for entry in entries for p in re.split(r"\n\s*\n", entry) if p.strip()]
    pieces, current = [], ""
    for paragraph in paragraphs:
        if current and len(current) + len(paragraph) > max_chars:
            pieces.append(current)
            current = ""
        current = f"{current}\n\n{paragraph}" if current else paragraph
    if len(current) >= min_chars:
        pieces.append(current)
    return [p for p in pieces if len(p) >= min_chars]


def joined(parts: list[str]) -> str:
    return "\n\n".join(parts)


def _cut(text: str, max_chars: int) -> str:
    """`text` up to the last paragraph break within `max_chars`."""
    return text if len(text) <= max_chars else text[:max_chars].rsplit("\n\n", 1)[0]


def qa_prompts() -> list[dict]:
    g, m, f, p = gpl3(), mpl2(), gfdl(), python_license()
    documents = [
        ("apache", read(LICENSES / "Apache-2.0"), "Under this licence, what happens to the patent licence granted to "
         "you if you start patent litigation claiming that the Work infringes a patent? Quote the relevant sentence."),
        ("gpl3_definitions", joined(g[1:5]), "According to the licence above, what counts as the \"Corresponding "
         "Source\" of a work, and what is left out of it?"),
        ("gpl3_conveying", joined([g[0], *g[5:7]]), "What conditions must a modified version meet before I may "
         "convey it under the text above? Answer as a list."),
        ("gpl3_object_code", g[7], "List the ways the text above allows me to convey object code, and say for each "
         "how the Corresponding Source must be made available."),
        ("gpl3_termination", joined(g[8:10]), "If my licence is terminated because of a first violation, how can "
         "it be reinstated, according to the text above?"),
        ("gpl3_patents", joined(g[11:14]), "What does the text above say I must do if a court order imposes "
         "conditions on me that contradict the licence?"),
        ("lgpl3", read(LICENSES / "LGPL-3"), "What must I do to convey a Combined Work under this licence?"),
        ("mpl2_distribution", joined(m[1:4]), "What must I do when I distribute Covered Software in Executable "
         "Form, according to the licence above?"),
        ("mpl2_termination", joined(m[4:11]), "What happens to my rights under the licence above if I fail to "
         "comply, and how can they be reinstated?"),
        ("artistic", read(LICENSES / "Artistic"), "Under what conditions may I distribute a modified version of "
         "the Package, according to the licence above?"),
        ("cc0", read(LICENSES / "CC0-1.0"), "What does the Public License Fallback section grant, and when does it "
         "apply?"),
        ("python_license", _cut(joined(p[:2]), 9000), "Which organisations has Python's development moved through, and "
         "under which licence is Python distributed today? Answer from the document."),
        ("gfdl_definitions", joined(f[:4]), "How does the licence above define a Transparent copy, and when must "
         "I provide one?"),
    ]
    return [{"id": f"long_qa_{key}", "turns": [f"Read the document below, then answer the question.\n\n{text}\n\n"
                                                f"Question: {question}"]}
            for key, text, question in documents]


SUMMARY_TASKS = [
    "Summarise the release notes above in one paragraph.",
    "Summarise the release notes above as five bullet points, most important first.",
    "Write a short summary of the changes above for someone who uses IDLE every day.",
    "Summarise the changes above, putting those about the editor and those about the shell in separate lists.",
    "Give a headline and a three-sentence summary of the text above.",
]


def summary_prompts() -> list[dict]:
    pieces = chunks(idle_releases(), min_chars=3000, max_chars=9000)[:9]
    prompts = [{"id": f"long_sum_idle_{i:02d}",
                "turns": [f"{piece}\n\n{SUMMARY_TASKS[i % len(SUMMARY_TASKS)]}"]} for i, piece in enumerate(pieces)]
    g, f = gpl3(), gfdl()
    for key, text in (("gpl3_tail", joined(g[14:])), ("gfdl_modifications", joined(f[4:6])),
                      ("idle_history", read(STDLIB / "idlelib" / "HISTORY.txt"))):
        prompts.append({"id": f"long_sum_{key}", "turns": [
            f"{text}\n\nSummarise the text above in plain language, in at most eight sentences."]})
    return prompts


def _first_sentences(section: str, count: int = 2) -> str:
    body = re.sub(r"\s+", " ", section.split("\n", 1)[-1]).strip()
    return " ".join(re.split(r"(?<=[.;:])\s+", body)[:count])


def _title(section: str) -> str:
    return re.sub(r"\s+", " ", section.split("\n", 1)[0]).strip()


CHATS = [
    ("gpl3_a", gpl3, slice(1, 6), "Putting those sections together: if I sell a device with modified GPL software on "
     "it, what do I owe the buyer?"),
    ("gpl3_b", gpl3, slice(6, 10), "Given everything we went through, which of these obligations would apply to "
     "a company that only uses the program internally?"),
    ("gpl3_c", gpl3, slice(10, 16), "So, in your own words, how do these sections protect users against patent "
     "claims?"),
    ("mpl2_a", mpl2, slice(1, 5), "Based on these sections, can I combine MPL code with my proprietary code in "
     "one executable, and what must I publish?"),
    ("mpl2_b", mpl2, slice(5, 11), "From all of that, what is my exposure if I distribute the software and it "
     "turns out to be defective?"),
    ("gfdl_a", gfdl, slice(1, 5), "Given those sections, what do I need to do to print and sell 500 copies of a "
     "manual under this licence?"),
    ("gfdl_b", gfdl, slice(5, 10), "From what we covered, can I translate the manual and drop its Invariant "
     "Sections?"),
    ("python_a", python_license, slice(0, 2), "So who owns the copyright in Python, and what do I have to keep if "
     "I ship a modified Python with my product?"),
    ("apache_a", lambda: sections(read(LICENSES / "Apache-2.0"), r"^   \d\. "), slice(1, 6), "Taking all those "
     "sections together, what must I include when I redistribute a modified Apache-licensed library?"),
    ("apache_b", lambda: sections(read(LICENSES / "Apache-2.0"), r"^   \d\. "), slice(5, 10), "Overall, what do "
     "these sections say about trademarks, warranty and liability?"),
]
ASKS = ["Here is the next part of the licence:", "And this part?", "Now this one:", "What about this section?"]


def chat_prompts() -> list[dict]:
    prompts = []
    for key, source, span, final in CHATS:
        lines = ["User: I am reading a licence and want to understand it part by part. Here is the first part:\n\n"]
        for i, section in enumerate(source()[span]):
            if i:
                lines.append(f"User: {ASKS[i % len(ASKS)]}\n\n")
            lines[-1] += _cut(section, 5000)
            lines.append(f"Assistant: This part, \"{_title(section)}\", says in short: {_first_sentences(section)}")
        lines.append(f"User: {final}")
        transcript = "\n\n".join(lines)
        prompts.append({"id": f"long_chat_{key}", "turns": [
            "Below is our conversation so far. Continue it: reply, as the assistant, to my last message.\n\n"
            f"{transcript}"]})
    return prompts


SETS = {"long_qa": qa_prompts, "long_sum": summary_prompts, "long_chat": chat_prompts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "data"), help="folder for NAME.jsonl")
    parser.add_argument("--check", metavar="TOKENIZER", help="print each prompt's token count with this tokenizer")
    args = parser.parse_args()
    tokenizer = None
    if args.check:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.check)
    for name, build in SETS.items():
        rows = build()
        path = Path(args.out) / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"wrote {len(rows)} prompts to {path}")
        if tokenizer is not None:
            counts = [len(tokenizer(r["turns"][0])["input_ids"]) for r in rows]
            print("  tokens:", ", ".join(f"{r['id']}={n}" for r, n in zip(rows, counts)))


if __name__ == "__main__":
    main()
