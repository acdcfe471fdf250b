"""Goldens: what a case is, how its float64 reference is built, and the store that keeps it.

Sub-rooms, each importing only the ones before it (and ``facts``):

- ``specs``: a case (``CaseSpec``, the field table, TOML suites, the data a golden holds, the layouts);
- ``store``: the golden store (a directory of sealed HDF5 files, locks, atomic writes, explicit input
  bundles, the location constants in a leaf);
- ``building``: making goldens (inputs, the float64 reference and its fused tile kernel, the error-model
  magnitudes, the emulated baseline and its statistics, cost, ``regen`` and ``regen --ray``, ``verify
  --recompute``'s drift);
- ``bench`` and ``coverage``: measuring the build, and the factor-model levels a case hits with the
  covering generator.

The room's own modules sit above them: the golden verbs' arguments (``verbs``, light) and their work
(``cli``).  ``tests/cover/test_architecture.py`` holds the order.
"""

#: The sub-rooms from the floor up: a module imports only from its own sub-room and those before it.
SUB_ROOMS = ("specs", "store", "building", "bench", "coverage")
