"""τ of a draft without decoding with it: greedy decoding replayed, teacher-forced, on the target's answers.

Per draft and prompt set: the replayed τ (what `generate(assistant_model=draft)` accepts, the block alone,
drafting every step: `domino_hf.training.teacher_forced`), the anchor mean that training logs as `sim_tau`
(biased high), and how often slot 1 is right. Answers come from the target (greedy, `--max-new-tokens`) for
prompt sets, or are read from regen JSONL files (`--answers`, e.g. a draft's own training data: its
training-set τ at the cost of one forward per answer).

    python examples/replay_tau.py --draft drafts/smollm2-135m-instruct-domino runs/x/checkpoint-500 \
        --prompts mt_bench,sum
    python examples/replay_tau.py --draft drafts/smollm2-135m-instruct-domino \
        --answers data/regen/base/smollm2-135m-instruct_sharegpt.jsonl.gz --num-prompts 40
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModel

from domino_hf import DominoTargetHead, load_target
from domino_hf.bench.pipeline import build_prompts
from domino_hf.modeling.generation_domino import acceptance_length
from domino_hf.training.dataset import RegenDataset
from domino_hf.training.teacher_forced import replay_answer


def answer_sets(args, target, tokenizer) -> dict[str, list[tuple[list[int], list[int]]]]:
    """{set name: [(prompt ids, answer ids)]}: regen files as they are, prompt sets answered by the target."""
    sets = {}
    for path in args.answers or []:
        examples = RegenDataset.from_jsonl(path, limit=args.num_prompts).examples
        sets[Path(path).name.split(".")[0]] = [(e.prompt_ids, e.response_ids) for e in examples]
    for prompt in build_prompts(tokenizer, args.prompts.split(",") if args.prompts else [], args.num_prompts):
        ids = torch.tensor([prompt.input_ids])
        with torch.no_grad():
            output = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                     do_sample=False)
        sets.setdefault(prompt.prompt_set, []).append((prompt.input_ids, output[0, ids.shape[1]:].tolist()))
    return sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", required=True, nargs="+", help="one or more drafts, replayed on the same answers")
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--prompts", default="", help="comma-separated prompt sets or JSONL paths")
    parser.add_argument("--answers", nargs="*", help="regen JSONL(.gz) files: prompts with the target's answers")
    parser.add_argument("--num-prompts", type=int, default=8, help="per set or file")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if not args.prompts and not args.answers:
        parser.error("give --prompts and/or --answers")
    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target, dtype=torch.float32)
    sets = answer_sets(args, target, tokenizer)  # answered once, replayed for every draft
    print("| draft | set | answers | replayed τ | anchor-mean τ (`sim_tau`) | slot-1 right |")
    print("|---|---|---:|---:|---:|---:|")
    for path in args.draft:
        draft = AutoModel.from_pretrained(path, trust_remote_code=True, dtype=torch.float32).eval()
        head = DominoTargetHead(target, draft.config)
        pooled = []  # accepted tokens per step over every set
        for name, pairs in sets.items():
            replays = [replay_answer(draft, target, p, a, head) for p, a in tqdm(pairs, desc=name, leave=False)]
            replays = [r for r in replays if r.runs]
            runs = [run for r in replays for run in r.runs]
            accepted = [n for r in replays for n in r.accepted]
            pooled += accepted
            mean = 1 + statistics.mean(runs)  # pooled over anchors, as training logs it
            right = sum(r > 0 for r in runs) / len(runs)
            tau = acceptance_length(accepted)
            print(f"| {path} | {name} | {len(replays)} | {tau:.2f} | {mean:.2f} | {right:.2f} |")
        if len(sets) > 1:
            print(f"| {path} | all (pooled) | | {acceptance_length(pooled):.2f} | | |")


if __name__ == "__main__":
    main()
