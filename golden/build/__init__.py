"""Making goldens: inputs, the float64 reference (its fused tile kernel is the extension
``_tile_kernel``, ``src/tile_kernel.cpp``), the error-model magnitudes, the emulated baseline and its
statistics, row chunks, cost, ``regen`` (local and ``--ray``) and ``verify --recompute``'s drift.
Imports ``facts``, ``golden.specs`` and ``golden.store``."""
