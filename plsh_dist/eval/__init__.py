"""Evaluation: perplexity against the context length, attention modes, generation, scoring, plots.

The approximation-error study is not here: ``experiments/approximation/``.
"""
