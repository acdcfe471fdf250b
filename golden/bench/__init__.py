"""``mlaconf bench``: the golden build measured against the GEMM rates of this host (``verb``: arguments
and driver; ``cases``: the named bench cases, light; ``limits``: the derived limits; ``measure``: the
timed stages).  Imports ``facts`` and the golden sub-rooms below it."""
