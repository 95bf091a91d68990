"""`SuffixCache` (modeling/suffix_domino.py) against a brute-force search over the same sequences."""

from __future__ import annotations

import random
import threading

import pytest

from domino_hf.modeling.suffix_domino import SuffixCache


def _brute_force(sequences, context, max_tokens, levels, max_match):
    """Every position of every stored sequence with a token after it, its match length with the context's tail
    (capped at max_match), the longest (≥ the shortest level) kept; then the same newest-first majority walk."""
    tail = list(context[-max_match:])
    flat = []  # (sequence index, position) newest last, as the store writes them
    for s, seq in enumerate(sequences):
        for i in range(len(seq) - 1):
            flat.append((s, i))
    best, found = 0, []
    for s, i in flat:
        seq = sequences[s]
        length = 0
        while length < len(tail) and i - length >= 0 and seq[i - length] == tail[-length - 1]:
            length += 1
        if length < levels[0]:
            continue
        if length > best:
            best, found = length, [(s, i)]
        elif length == best:
            found.append((s, i))
    if not found:
        return None
    alive = list(reversed(found))  # newest first
    tokens, support = [], []
    for offset in range(1, max_tokens + 1):
        votes = {}
        for s, i in alive:
            if i + offset < len(sequences[s]):
                votes.setdefault(sequences[s][i + offset], []).append((s, i))
        if not votes:
            break
        token, alive = max(votes.items(), key=lambda item: len(item[1]))
        tokens.append(token)
        support.append(len(alive))
    return tokens, best, support, len(found)


@pytest.mark.parametrize("seed", range(12))
def test_lookup_matches_brute_force(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 12])
    levels = rng.choice([(2,), (2, 4), (1, 3, 6)])
    cache = SuffixCache(max_tokens=10_000, ngram_levels=levels, max_candidates=10**6, max_match=rng.choice([8, 64]))
    sequences = [[rng.randrange(vocab) for _ in range(rng.randint(1, 60))] for _ in range(rng.randint(1, 12))]
    for seq in sequences:
        cache.add(seq)
    for _ in range(30):
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 20))]
        if rng.random() < 0.5:  # a context that ends inside a stored sequence
            seq = rng.choice(sequences)
            cut = rng.randint(1, len(seq))
            context = context + seq[:cut]
        k = rng.randint(1, 9)
        got = cache.lookup(context, k)
        want = _brute_force(sequences, context, k, levels, cache.max_match)
        if want is None:
            assert got is None
        else:
            assert got is not None and (got.tokens, got.match_length, got.support, got.occurrences) == want


def test_most_frequent_continuation_wins_and_newest_breaks_ties():
    cache = SuffixCache(max_tokens=100)
    for seq in ([1, 2, 3, 7], [1, 2, 3, 8], [1, 2, 3, 8]):
        cache.add(seq)
    match = cache.lookup([9, 2, 3], 4)
    assert match.tokens == [8] and match.support == [2] and match.occurrences == 3 and match.match_length == 2
    cache.add([1, 2, 3, 7])  # 7 and 8 tie at two each: the newest occurrence decides
    assert cache.lookup([2, 3], 1).tokens == [7]


def test_no_continuation_crosses_a_sequence_boundary():
    cache = SuffixCache(max_tokens=100)
    cache.add([5, 6])
    cache.add([7, 8, 9])
    assert cache.lookup([5, 6], 3) is None  # 5 6 ends its sequence: 7 follows only across the separator
    assert cache.lookup([4, 7, 8], 5).tokens == [9]


def test_eviction_is_first_in_first_out_and_bounded():
    cache = SuffixCache(max_tokens=20, ngram_levels=(2,))
    size = cache.nbytes
    cache.add([1, 2, 3, 4, 5, 6])  # 7 slots with its separator
    for i in range(3):
        cache.add([10 + i, 11 + i, 12 + i, 13 + i, 14 + i, 15 + i])
    assert cache.num_tokens == 20 and cache.nbytes == size
    assert cache.lookup([1, 2], 3) is None  # the first sequence is gone
    assert cache.lookup([12, 13], 2).tokens == [14, 15]
    assert cache.sequences()[-1] == [12, 13, 14, 15, 16, 17]
    for _ in range(200):  # many wraps of the ring: lookups stay consistent with what is held
        cache.add([1, 2, 3])
    assert cache.lookup([1, 2], 1) == cache.lookup([7, 1, 2], 1)
    assert cache.lookup([1, 2], 1).tokens == [3]
    assert cache.lookup([12, 13], 2) is None


def test_a_sequence_longer_than_the_store_keeps_its_end():
    cache = SuffixCache(max_tokens=10, ngram_levels=(2,))
    cache.add(list(range(100)))
    assert cache.sequences() == [list(range(91, 100))]
    assert cache.lookup([93, 94], 2).tokens == [95, 96]


def test_save_load_round_trip(tmp_path):
    rng = random.Random(0)
    cache = SuffixCache(max_tokens=500, ngram_levels=(2, 5), max_candidates=16, max_match=32)
    for _ in range(40):
        cache.add([rng.randrange(6) for _ in range(rng.randint(2, 30))])  # wraps the ring
    cache.save(tmp_path / "cache.json")
    loaded = SuffixCache.load(tmp_path / "cache.json")
    assert loaded.sequences() == cache.sequences()
    for _ in range(50):
        context = [rng.randrange(6) for _ in range(8)]
        assert loaded.lookup(context, 6) == cache.lookup(context, 6)
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="not a saved SuffixCache"):
        SuffixCache.load(tmp_path / "other.json")


def test_clear_and_bad_settings():
    cache = SuffixCache(max_tokens=50)
    cache.add([1, 2, 3])
    cache.clear()
    assert cache.num_tokens == 0 and cache.lookup([1, 2], 2) is None
    with pytest.raises(ValueError, match="ngram_levels"):
        SuffixCache(ngram_levels=(4, 2))
    with pytest.raises(ValueError, match="max_tokens"):
        SuffixCache(max_tokens=4, ngram_levels=(2, 8))
    with pytest.raises(ValueError, match="non-negative"):
        cache.add([1, -3])


def test_concurrent_adds_and_lookups_keep_the_store_consistent():
    cache = SuffixCache(max_tokens=5_000, ngram_levels=(2, 4))
    errors = []

    def writer(offset):
        for i in range(200):
            cache.add([offset, offset + 1, offset + 2, i % 7])

    def reader():
        try:
            for _ in range(400):
                match = cache.lookup([100, 101], 3)
                assert match is None or match.tokens[0] == 102
        except AssertionError as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(o,)) for o in (100, 200)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cache.num_tokens == 2 * 200 * 5
    assert cache.lookup([200, 201], 1).tokens == [202]
