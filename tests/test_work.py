"""Per-rank useful FLOPs (core.work): they sum to the problem's, match a brute-force count, and give the known
imbalance of a causal global pattern."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from hilbert_hpc.core.patterns import Pattern, useful_flops
from hilbert_hpc.core.work import imbalance, rank_useful_flops, span_pairs


def brute_pairs(start: int, stop: int, tokens: int, heads: int, patterns, causal: bool) -> int:
    """Count the pairs query by query: position, head, pattern."""
    total = 0
    for p in patterns:
        for h in range(heads):
            o = h % p.dilation
            for pos in range(start, stop):
                inside = pos % p.segment
                if inside % p.dilation == o:
                    j = (inside - o) // p.dilation
                    total += j + 1 if causal else p.selected
    return total


CASES = [
    (64, 3, [Pattern(8, 1), Pattern(16, 4), Pattern(64, 8)]),
    (96, 5, [Pattern(12, 3), Pattern(96, 32), Pattern(48, 16)]),
    (32, 2, [Pattern(32, 1)]),
]


@pytest.mark.parametrize("tokens,heads,patterns", CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_spans_match_brute_force(tokens, heads, patterns, causal):
    for start, stop in [(0, tokens), (0, 0), (5, 6), (3, 29), (tokens // 2, tokens), (7, tokens - 1)]:
        assert span_pairs(start, stop, heads, patterns, causal) == brute_pairs(start, stop, tokens, heads,
                                                                               patterns, causal)


@pytest.mark.parametrize("tokens,heads,patterns", CASES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_ranks_sum_to_the_total(tokens, heads, patterns, causal, ranks):
    per_rank = rank_useful_flops(tokens, ranks, heads, 16, patterns, causal, batch=3)
    assert len(per_rank) == ranks
    assert sum(per_rank) == useful_flops(tokens, heads, 16, patterns, causal, batch=3)


def test_causal_global_pattern_on_4_ranks():
    # rank r of P holds queries j in [rL, (r+1)L) of one segment; query j sees j + 1 keys, so rank r sees
    # L * (r L) + L (L + 1) / 2 pairs: (r + 1/2) / P of the keys on average, plus 1 / (2L)
    tokens, ranks, heads, d = 1024, 4, 2, 8
    shard = tokens // ranks
    per_rank = rank_useful_flops(tokens, ranks, heads, d, [Pattern(tokens, 1)], causal=True)
    by_hand = [4 * d * heads * (shard * r * shard + shard * (shard + 1) // 2) for r in range(ranks)]
    assert per_rank == by_hand
    expected = Fraction(ranks - 1, 1) + Fraction(1, 2) + Fraction(1, 2 * shard)
    expected /= Fraction(ranks, 2) + Fraction(1, 2 * shard)
    assert imbalance(per_rank) == pytest.approx(float(expected), rel=1e-15)
    assert imbalance(per_rank) == pytest.approx(1.75, rel=1e-2)   # (2P - 1) / P for long shards


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_non_causal_local_patterns_are_balanced(ranks):
    per_rank = rank_useful_flops(256, ranks, 4, 8, [Pattern(16, 1), Pattern(64, 4)], causal=False)
    assert len(set(per_rank)) == 1
    assert imbalance(per_rank) == 1.0


def test_imbalance_is_the_median_over_repeats():
    times = np.array([[1.0, 2.0, 1.0], [3.0, 2.0, 1.0]])      # (ranks, repeats)
    assert imbalance(times) == pytest.approx(1.0)             # ratios 1.5, 1.0, 1.0 -> median 1.0
    assert imbalance(np.array([[1.0, 1.0], [3.0, 3.0]])) == pytest.approx(1.5)
    assert np.isnan(imbalance(np.zeros((2, 3))))


def test_bad_arguments():
    with pytest.raises(ValueError, match="ranks"):
        rank_useful_flops(10, 3, 1, 8, [Pattern(10, 1)], causal=True)
    with pytest.raises(ValueError, match="span"):
        span_pairs(5, 3, 1, [Pattern(8, 1)], causal=True)
