"""How sure a chip or release fact is: the two words every fact of this package carries."""

from __future__ import annotations

#: Read in the cited source file (a device run may still contradict it).
CONFIRMED = "confirmed-in-source"
#: Only documentation, a consumer or an inference says so: a device run settles it.
UNCONFIRMED = "unconfirmed"
CONFIDENCES = (CONFIRMED, UNCONFIRMED)
