"""The factor model applied: which levels a case hits (``levels``), the deterministic covering generator
(``covering``), the shipped model's valid tuples counted ahead (``valid_table``, a leaf) and ``mlaconf coverage``
(``verb``).  Imports ``facts`` and the golden sub-rooms below it."""
