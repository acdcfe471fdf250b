"""Running the suites under pytest: the joint (the entry point ``plugin``, the suites' plugin ``session``,
the usage checks ``front_door``, ``selection``, a test's ``identity``, ``applicability``, how a test ends
``ending``, ``failures``, record ``collect``-ion and the ``run_directory``) and the suites' machinery
(``execution``: a call on a backend; ``conformance``: ``run_case``; ``perturb``: the error contract;
``metamorphic``: the relations).  Imports every room below it; never ``tools`` or ``cases``."""
