"""Evaluation: approximation error of positional LSH, q/k/v capture, plots."""
