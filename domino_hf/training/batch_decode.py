"""Batched decoding that drops finished answers from the batch: the decoder behind `domino regen`.

Why: `generate` keeps a finished row in the batch until the longest answer of its batch ends, so with answers
of 20 to 256 tokens about a third of a regen batch's decode slots compute padding (measured in
docs/training.md). Here each step runs only the rows still answering: when rows finish, the KV cache, the
attention mask and the pending tokens are cut down to the live rows (`Cache.batch_select_indices`).

The contract is `generate`'s for plain decoding: greedy (argmax of the fp32 logits) or plain sampling from
the tempered distribution, left-padded prompts, an answer ends at an EOS id (kept) or at the token that
completes a stop text (kept), else at `max_new_tokens`. Logits processors (repetition penalty and the like)
are not applied: `regenerate` routes a target whose generation config asks for one through `generate`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache, GenerationConfig

from ..modeling.dispatch_domino import CACHE_ARGUMENT

# Generation-config fields that add logits processors or length rules `decode_shrinking` does not apply.
_PROCESSOR_FIELDS = (
    "repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "min_length",
    "min_new_tokens", "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id",
    "sequence_bias", "exponential_decay_length_penalty", "renormalize_logits", "epsilon_cutoff", "eta_cutoff",
    "typical_p", "min_p", "top_h", "watermarking_config",
)


def stop_tail(stops: list[str]) -> int:
    """How many trailing tokens to decode to see every stop text an answer may end with: each token decodes to
    at least one character. Shared by both decoders (`regen.StopTexts` for `generate`)."""
    return max(len(stop) for stop in stops) + 1


def needs_generate(generation_config: GenerationConfig) -> list[str]:
    """The fields of `generation_config` that only `generate` honours (empty: `decode_shrinking` is exact)."""
    default = GenerationConfig()
    return [name for name in _PROCESSOR_FIELDS
            if getattr(generation_config, name, None) != getattr(default, name, None)]


def decode_shrinking(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, eos_ids: list[int],
    temperature: float = 0.0, stop: list[str] | None = None, tokenizer: Any = None,
) -> list[tuple[list[int], bool]]:
    """Answer a left-padded batch; `(response ids, finished)` per row, as `regen.generate_batch` returns.

    input_ids, attention_mask: [batch, width] on the model's device, padding on the left.
    """
    eos = torch.tensor(sorted(set(eos_ids)), device=input_ids.device)
    tail = stop_tail(stop) if stop else 0
    responses: list[list[int]] = [[] for _ in range(input_ids.shape[0])]
    finished = [False] * input_ids.shape[0]
    live = torch.arange(input_ids.shape[0], device=input_ids.device)  # batch row -> original row
    cache = DynamicCache(config=model.config)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [batch, width]
    step_ids = input_ids
    for step in range(max_new_tokens):
        logits = model(input_ids=step_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=True, logits_to_keep=1, **{CACHE_ARGUMENT: cache}).logits[:, -1].float()  # [live, V]
        if temperature > 0:
            next_ids = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1).squeeze(1)  # [live]
        else:
            next_ids = logits.argmax(dim=-1)
        done = torch.isin(next_ids, eos)
        for row, token in zip(live.tolist(), next_ids.tolist()):
            responses[row].append(token)
        if stop:
            for i, row in enumerate(live.tolist()):
                if not done[i] and any(text in tokenizer.decode(responses[row][-tail:]) for text in stop):
                    done[i] = True
        for row in live[done].tolist():
            finished[row] = True
        if done.all() or step == max_new_tokens - 1:
            break
        if done.any():  # drop the finished rows from every per-row tensor and the KV cache
            keep = (~done).nonzero().squeeze(1)  # [still live]
            cache.batch_select_indices(keep)
            live, next_ids, attention_mask = live[keep], next_ids[keep], attention_mask[keep]
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(attention_mask.shape[0], 1)], dim=1)
        position_ids = attention_mask.long().sum(-1, keepdim=True) - 1  # [live, 1]
        step_ids = next_ids[:, None]  # [live, 1]
    return list(zip(responses, finished))
