"""Reward functions for the quickstart task, with verl's `compute_score` signature (used by the examples)."""

from __future__ import annotations


def exact_reversal(data_source, solution_str, ground_truth, extra_info=None):
    """1 when the answer is the reversed digits, else 0."""
    return float(solution_str.strip() == str(ground_truth).strip())


def digit_overlap(data_source, solution_str, ground_truth, extra_info=None):
    """Partial credit: the share of positions where the answer has the right digit."""
    answer, truth = solution_str.strip(), str(ground_truth).strip()
    return sum(a == b for a, b in zip(answer, truth)) / max(len(truth), 1)


def brevity(data_source, solution_str, ground_truth, extra_info=None):
    """1 for an answer no longer than the truth, falling by 0.25 per extra character."""
    extra = len(solution_str.strip()) - len(str(ground_truth).strip())
    return max(0.0, 1.0 - 0.25 * max(extra, 0))
