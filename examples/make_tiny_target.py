"""Build a tiny random chat target for `examples/train_tiny.sh`: `python examples/make_tiny_target.py OUT_DIR`.

Writes a 4-layer, 64-wide fp32 `LlamaForCausalLM` with random weights and a matching character-level tokenizer
(printable ASCII plus newline, ChatML-like chat template, `<|im_end|>` as EOS) into OUT_DIR, loadable with
`AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`, i.e. `domino … --target OUT_DIR`.
Everything is offline and seeded: the same folder comes out every time, in about a second.

The weights are drawn with a large std (`initializer_range`) so greedy answers wander over many characters
instead of repeating one: a draft then has something to learn.

`--gemma3` makes the hard case instead: a Gemma-3-style base model (sliding-window and full layers, a 262,144-row
vocabulary of which the tokenizer uses the first ~100, no chat template) whose residual stream carries one
massive channel (`--massive`, default 1e5) from layer 0 on, as real Gemma 3 checkpoints do: its hidden states
exceed float16's 65504.
"""

from __future__ import annotations

import argparse

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]  # unk, pad, bos, eos
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer(chat_template: bool = True) -> PreTrainedTokenizerFast:
    """One token per character (BPE without merges), specials matched whole, decoded by concatenation."""
    vocab = {token: i for i, token in enumerate(SPECIALS + CHARS)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    roles = dict(zip(("unk_token", "pad_token", "bos_token", "eos_token"), SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, chat_template=CHAT_TEMPLATE if chat_template else None, **roles,
    )


def shape(tokenizer, init_std: float) -> dict:
    """The config fields both tiny targets share: 4 layers, 64 wide, the tokenizer's special ids."""
    return dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, initializer_range=init_std,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)


def make_model(tokenizer, seed: int = 0, init_std: float = 0.15) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=len(tokenizer), tie_word_embeddings=False, **shape(tokenizer, init_std))
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def make_gemma3(tokenizer, seed: int = 0, init_std: float = 0.15, vocab_size: int = 262144, massive: float = 1e5,
                norm_std: float = 3.0):
    """A Gemma-3-style base model: 4 layers (3 sliding-window of 8 tokens, 1 full), `vocab_size` rows, and one
    residual channel scaled to `massive` by layer 0's post-feed-forward norm (hidden states beyond fp16)."""
    config = Gemma3TextConfig(
        vocab_size=vocab_size, query_pre_attn_scalar=16, sliding_window=8, **shape(tokenizer, init_std),
        layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    )
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, module in model.named_modules():  # Gemma norms scale by (1 + weight)
            if type(module).__name__ == "Gemma3RMSNorm" and module.weight.shape[0] == config.hidden_size:
                module.weight.normal_(0.0, norm_std)
                if not name.endswith(("post_attention_layernorm", "post_feedforward_layernorm")):
                    module.weight[0] = -1.0  # what reads the residual stream ignores the massive channel
        model.model.layers[0].post_feedforward_layernorm.weight[0] = massive  # channel 0 carries ~±massive
        model.model.embed_tokens.weight[len(tokenizer) :] *= 0.1  # (tied head) rows past the tokenizer: rarely argmax
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="Folder to write the model and tokenizer to.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--init-std", type=float, default=0.15, help="Std of the random weights (default: %(default)s).",
    )
    parser.add_argument("--gemma3", action="store_true", help="A Gemma-3-style base model with a 262k vocabulary, "
                        "no chat template and hidden states beyond float16's range.")
    parser.add_argument("--massive", type=float, default=1e5, help="--gemma3: size of the massive channel.")
    args = parser.parse_args()
    tokenizer = make_tokenizer(chat_template=not args.gemma3)
    if args.gemma3:
        model = make_gemma3(tokenizer, seed=args.seed, init_std=args.init_std, massive=args.massive)
    else:
        model = make_model(tokenizer, seed=args.seed, init_std=args.init_std)
    model.save_pretrained(args.out_dir)
    tokenizer.save_pretrained(args.out_dir)
    print(f"tiny target ({sum(p.numel() for p in model.parameters()) / 1e3:.0f}k parameters, "
          f"vocab {len(tokenizer)}) -> {args.out_dir}")


if __name__ == "__main__":
    main()
