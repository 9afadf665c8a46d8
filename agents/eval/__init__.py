"""Evaluation: held-out runs, their summaries, reports, comparisons and rescoring."""
