"""The verbs and tools built on the suites, their command lines in ``verbs`` (light): ``mlaconf run``
(``run``, ``command``; ``ray_run`` for ``--ray``), ``shrink``/``repro`` (``repro``), ``power``
(``power_report``, ``power``), ``ascend`` (``ascend``, ``facts_report``), ``import-dump`` (``import_dump``;
``msprobe_read`` reads a dump, ``msprobe_dump`` makes
cases of its calls) and the measuring tools (``gpu_check``, ``memprobe``, ``overhead``).
Imports every room but ``cases``; no room imports it."""
