# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""A bounded store of earlier token sequences, searched for the longest match of a context's last tokens.

Remote-code file (standard library only). `SuffixCache` keeps the prompts and outputs of earlier `generate`
calls (and any documents a user adds) in one ring buffer of token ids, and indexes them the way LZ77 compressors
index their window: for each indexed n-gram length, a hash table gives the newest position whose n-gram ends
there, and a chain links every position to the previous one with the same hash. A lookup walks those chains
from the newest occurrence backwards, extends each verified match towards the past, keeps the longest, and
proposes the continuation that most of those occurrences agree on, token by token.

Bounded by construction: the ring holds `max_tokens` ids; a new sequence overwrites the oldest tokens (first
in, first out), and every position the ring no longer holds is invisible to the index (chains only point
backwards, so a walk stops at the first position older than the ring's tail). Memory is fixed at creation
(`nbytes`), about 4 + 12 × len(ngram_levels) bytes per token of capacity.
"""

from __future__ import annotations

import json
import threading
from array import array
from pathlib import Path
from typing import NamedTuple, Sequence

SEPARATOR = -1  # ends every added sequence: no match and no continuation crosses it
_NONE = -1  # an empty hash slot


def is_suffix_cache(obj) -> bool:
    """Whether `obj` can serve as a suffix cache: a `SuffixCache` from either copy of this file (the installed
    package's or a draft's remote code, which are different classes), or anything with its `add`, `lookup` and
    `max_match`."""
    return all(callable(getattr(obj, name, None)) for name in ("add", "lookup")) and hasattr(obj, "max_match")


class SuffixMatch(NamedTuple):
    """What a lookup found.

    Args:
        tokens: the proposed continuation (at most the `max_tokens` asked for; never empty).
        match_length: how many of the context's last tokens the chosen occurrences match.
        support: support[j] = how many of the longest-matching occurrences continue with tokens[: j + 1];
            non-increasing, support[0] ≥ 1.
        occurrences: how many occurrences matched `match_length` tokens (an upper bound on support[0]).
    """

    tokens: list[int]
    match_length: int
    support: list[int]
    occurrences: int


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


class SuffixCache:
    """A bounded, thread-safe store of token sequences with longest-suffix-match lookup.

    Args:
        max_tokens (`int`, defaults to 1,000,000): capacity in token ids (separators included); the oldest
            tokens are evicted first when a new sequence does not fit.
        ngram_levels (`tuple[int, ...]`, defaults to `(2, 8)`): the n-gram lengths indexed, shortest first. The
            shortest is the shortest match a lookup reports; a longer level finds long matches among many
            occurrences of a common short n-gram.
        max_candidates (`int`, defaults to 64): occurrences examined per level and lookup (newest first), which
            bounds a lookup's cost.
        max_match (`int`, defaults to 64): matches are extended towards the past up to this many tokens.

    Attributes:
        span_history (`dict`): what drafting learnt about this store's spans (the acceptance rate of each span
            position, by match length), so a `generate` call starts from what earlier calls saw; emptied by
            `clear`, not saved.
    """

    def __init__(self, max_tokens: int = 1_000_000, ngram_levels: Sequence[int] = (2, 8), max_candidates: int = 64,
                 max_match: int = 64):
        levels = tuple(int(n) for n in ngram_levels)
        if not levels or list(levels) != sorted(set(levels)) or levels[0] < 1:
            raise ValueError(f"ngram_levels must be increasing positive lengths, got {tuple(ngram_levels)}.")
        if int(max_tokens) <= levels[-1]:
            raise ValueError(f"max_tokens must exceed the longest n-gram level ({levels[-1]}), got {max_tokens}.")
        if int(max_candidates) < 1 or int(max_match) < levels[0]:
            raise ValueError(
                f"max_candidates must be ≥ 1 and max_match ≥ {levels[0]}, got {max_candidates} and {max_match}."
            )
        self.max_tokens, self.ngram_levels = int(max_tokens), levels
        self.max_candidates, self.max_match = int(max_candidates), int(max_match)
        self._lock = threading.RLock()
        self._allocate()

    def _allocate(self) -> None:
        capacity = self.max_tokens
        self._mask = _pow2_at_least(capacity) - 1
        self._tokens = array("i", [SEPARATOR]) * capacity  # ring: the id at absolute position p is at p % capacity
        # Per level: the newest absolute position whose n-gram ends there, by hash slot, and for each position the
        # distance back to the previous position with the same hash slot (0: none).
        self._heads = [array("q", [_NONE]) * (self._mask + 1) for _ in self.ngram_levels]
        self._back = [array("I", [0]) * capacity for _ in self.ngram_levels]
        self._end = 0  # absolute position of the next token written
        self._sequences = 0
        self.span_history: dict = {}

    # -- size -----------------------------------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        """Token ids held now (separators included)."""
        return min(self._end, self.max_tokens)

    @property
    def num_sequences_added(self) -> int:
        return self._sequences

    @property
    def nbytes(self) -> int:
        """Memory held by the store's arrays (fixed at creation)."""
        arrays = [self._tokens, *self._heads, *self._back]
        return sum(a.itemsize * len(a) for a in arrays)

    def __len__(self) -> int:
        return self.num_tokens

    def __deepcopy__(self, memo) -> SuffixCache:
        # A store is shared, never copied: `generate` deep-copies its GenerationConfig, which may hold one.
        return self

    def __copy__(self) -> SuffixCache:
        return self

    def __repr__(self) -> str:
        return (f"SuffixCache(num_tokens={self.num_tokens}, max_tokens={self.max_tokens}, "
                f"ngram_levels={self.ngram_levels}, nbytes={self.nbytes})")

    # -- writing --------------------------------------------------------------------------------------------------

    def clear(self) -> None:
        with self._lock:
            self._allocate()

    def add(self, token_ids: Sequence[int]) -> None:
        """Store one sequence (a prompt and its output, or a document), then a separator. A sequence longer than
        the capacity keeps its last `max_tokens - 1` tokens."""
        ids = [int(t) for t in token_ids]
        if any(t < 0 for t in ids):
            raise ValueError("SuffixCache.add takes non-negative token ids.")
        ids = ids[-(self.max_tokens - 1):] + [SEPARATOR]
        with self._lock:
            capacity, tokens, start = self.max_tokens, self._tokens, self._end
            for i, token in enumerate(ids):
                tokens[(start + i) % capacity] = token
            for level, n in enumerate(self.ngram_levels):
                heads, back = self._heads[level], self._back[level]
                for i in range(len(ids)):
                    position = start + i
                    back[position % capacity] = 0
                    if i < n - 1 or ids[i] == SEPARATOR:
                        continue
                    slot = hash(tuple(ids[i - n + 1 : i + 1])) & self._mask
                    newest = heads[slot]
                    if newest != _NONE and position - newest < capacity:
                        back[position % capacity] = position - newest
                    heads[slot] = position
            self._end = start + len(ids)
            self._sequences += 1

    # -- reading --------------------------------------------------------------------------------------------------

    def lookup(self, context: Sequence[int], max_tokens: int) -> SuffixMatch | None:
        """The continuation most often seen after the longest match of `context`'s last tokens, at most
        `max_tokens` long; None when no stored occurrence matches the shortest n-gram level with a token after
        it. Ties between continuations go to the newest occurrence."""
        if max_tokens <= 0:
            return None
        tail = [int(t) for t in context[-self.max_match :]]
        with self._lock:
            for level in range(len(self.ngram_levels) - 1, -1, -1):
                found = self._longest(tail, level)
                if found is not None:
                    length, occurrences = found
                    return self._continuation(occurrences, length, max_tokens)
        return None

    def _longest(self, tail: list[int], level: int) -> tuple[int, list[int]] | None:
        """(match length, end positions of the occurrences with that length), newest first; positions without a
        stored token after them are skipped."""
        n = self.ngram_levels[level]
        if len(tail) < n:
            return None
        capacity, tokens = self.max_tokens, self._tokens
        oldest, end = self._end - capacity, self._end
        gram = tail[-n:]
        position = self._heads[level][hash(tuple(gram)) & self._mask]
        back = self._back[level]
        best, found, examined = 0, [], 0
        while position != _NONE and position - n + 1 >= oldest and examined < self.max_candidates:
            examined += 1
            if position + 1 < end and tokens[(position + 1) % capacity] != SEPARATOR and all(
                tokens[(position - n + 1 + j) % capacity] == gram[j] for j in range(n)
            ):
                length = n
                while (length < len(tail) and position - length >= oldest
                       and tokens[(position - length) % capacity] == tail[-length - 1]):
                    length += 1
                if length > best:
                    best, found = length, [position]
                elif length == best:
                    found.append(position)
            step = back[position % capacity]
            position = position - step if step else _NONE
        return (best, found) if found else None

    def _continuation(self, occurrences: list[int], length: int, max_tokens: int) -> SuffixMatch:
        capacity, tokens, end = self.max_tokens, self._tokens, self._end
        alive = occurrences  # newest first
        proposed: list[int] = []
        support: list[int] = []
        for offset in range(1, max_tokens + 1):
            votes: dict[int, list[int]] = {}
            for position in alive:
                if position + offset < end:
                    token = tokens[(position + offset) % capacity]
                    if token != SEPARATOR:
                        votes.setdefault(token, []).append(position)
            if not votes:
                break
            # Most occurrences first; among equals the newest (dicts keep insertion order, newest inserted first).
            token, alive = max(votes.items(), key=lambda item: len(item[1]))
            proposed.append(token)
            support.append(len(alive))
        return SuffixMatch(proposed, length, support, len(occurrences))

    # -- persistence ----------------------------------------------------------------------------------------------

    def sequences(self) -> list[list[int]]:
        """The stored sequences, oldest first (the oldest may have lost its beginning to eviction)."""
        with self._lock:
            held = [self._tokens[p % self.max_tokens] for p in range(self._end - self.num_tokens, self._end)]
        out, current = [], []
        for token in held:
            if token == SEPARATOR:
                if current:
                    out.append(current)
                current = []
            else:
                current.append(token)
        return out

    def save(self, path: str | Path) -> None:
        """Write the settings and the stored sequences as JSON (the index is rebuilt on load)."""
        settings = {"max_tokens": self.max_tokens, "ngram_levels": list(self.ngram_levels),
                    "max_candidates": self.max_candidates, "max_match": self.max_match}
        Path(path).write_text(json.dumps({"format": "domino-suffix-cache/1", "settings": settings,
                                          "sequences": self.sequences()}))

    @classmethod
    def load(cls, path: str | Path) -> SuffixCache:
        data = json.loads(Path(path).read_text())
        if data.get("format") != "domino-suffix-cache/1":
            raise ValueError(f"{path} is not a saved SuffixCache (format {data.get('format')!r}).")
        cache = cls(**data["settings"])
        for sequence in data["sequences"]:
            cache.add(sequence)
        return cache
