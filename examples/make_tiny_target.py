"""Build a tiny random chat target for `examples/train_tiny.sh`: `python examples/make_tiny_target.py OUT_DIR`.

Writes a 4-layer, 64-wide fp32 `LlamaForCausalLM` with random weights and a matching character-level tokenizer
(printable ASCII plus newline, ChatML-like chat template, `<|im_end|>` as EOS) into OUT_DIR, loadable with
`AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`, i.e. `domino … --target OUT_DIR`.
Everything is offline and seeded: the same folder comes out every time, in about a second.

The weights are drawn with a large std (`initializer_range`) so greedy answers wander over many characters
instead of repeating one: a draft then has something to learn.
"""

from __future__ import annotations

import argparse

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]  # unk, pad, bos, eos
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (BPE without merges), specials matched whole, decoded by concatenation."""
    vocab = {token: i for i, token in enumerate(SPECIALS + CHARS)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    roles = dict(zip(("unk_token", "pad_token", "bos_token", "eos_token"), SPECIALS))
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=CHAT_TEMPLATE, **roles)


def make_model(tokenizer, seed: int = 0, init_std: float = 0.15) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        initializer_range=init_std,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="Folder to write the model and tokenizer to.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-std", type=float, default=0.15, help="Std of the random weights (default: %(default)s).")
    args = parser.parse_args()
    tokenizer = make_tokenizer()
    model = make_model(tokenizer, seed=args.seed, init_std=args.init_std)
    model.save_pretrained(args.out_dir)
    tokenizer.save_pretrained(args.out_dir)
    print(f"tiny target ({sum(p.numel() for p in model.parameters()) / 1e3:.0f}k parameters, "
          f"vocab {len(tokenizer)}) -> {args.out_dir}")


if __name__ == "__main__":
    main()
