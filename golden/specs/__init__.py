"""What a case is: the validated ``CaseSpec`` and what derives from it (``spec``), a table of fields to a
spec (``spec_build``), TOML suite files and the shipped suites (``suites``), the data a golden holds
(``types``) and the call layouts (``layout``).  Imports ``facts`` only."""
