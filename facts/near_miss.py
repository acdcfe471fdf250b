"""A near miss named: the one way every usage error of a name (a backend, a suite, a spec field, a policy)
suggests what was probably meant."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``choices`` (case and ``-``/``_`` ignored), else ``""``."""
    folded = {choice.lower().replace("-", "_"): choice for choice in choices}
    close = difflib.get_close_matches(word.lower().replace("-", "_"), list(folded), n=1, cutoff=0.6)
    return f" (did you mean {folded[close[0]]!r}?)" if close else ""
