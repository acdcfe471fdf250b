"""The factor model applied: which levels a case hits (``levels``), the deterministic covering generator
(``covering``) and ``mlaconf coverage`` (``verb``).  Imports ``facts`` and the golden sub-rooms below it."""
