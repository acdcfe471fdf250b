"""The golden store: where a store is (``locations``, a leaf), how a file is sealed and checked
(``integrity``), what a file holds (``h5file``), explicit input bundles by content hash (``bundles``) and
the directory itself with its locks and atomic writes (``directory``).  Imports ``facts`` and
``golden.specs``; it never builds a golden: a builder is handed to it."""
