"""The approximation study: how far positional LSH's averaged mask and attention outputs are from
exact ALiBi's, against the number of samples, and truncated ALiBi at the same cost.

- ``approx_error``: mask and output errors (max, spectral, Frobenius), the largest block;
- ``equal_cost``: PLSH's one-pass band and the truncation window of the same cost;
- ``qkv_capture``: q/k/v of a trained checkpoint's layers, for the output error;
- ``approx_report``: the run over a grid, its table and plots; ``__main__``: the command
  (``python -m experiments.approximation --out runs/approx``, ``make approx``).

Not part of the installed package; ``plsh_dist`` never imports it.
"""
