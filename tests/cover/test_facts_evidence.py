"""Every chip and release fact names its source and says how sure it is.

The facts of facts/releases.py and facts/torch_npu_ops.py carry a source and a confidence
(facts/evidence.py); each known deviation a reference, the ATB commit it was reviewed at and a status;
each error case the ATB commit its expectation was read at.  A fact without them fails here.
"""

from __future__ import annotations

import re

import pytest

from mlaconf.facts import releases
from mlaconf.facts.evidence import CONFIDENCES
from mlaconf.facts.torch_npu_ops import RULES, OpRule
from mlaconf.golden.specs.suites import load_suites
from mlaconf.judge.deviations import load_deviations

COMMIT = re.compile(r"[0-9a-f]{40}")
#: Something that names a place: a repository path, a function, a doc page or a commit.
PLACE = re.compile(r"[\w.-]+/[\w./-]+|\w+\.(?:cpp|h|py|md|yaml|ini)\b|[0-9a-f]{9,40}")


def test_release_facts_name_source_and_confidence() -> None:
    facts = [v for v in vars(releases).values() if isinstance(v, releases.ByRelease)]
    assert {f.name for f in facts} == {"mask_free_op_ranks", "swa_norm_rejection"}
    for fact in facts:
        assert PLACE.search(fact.source) and fact.confidence in CONFIDENCES, fact.name
    for name, (source, confidence) in releases.EVIDENCE.items():
        assert hasattr(releases, name) and PLACE.search(source) and confidence in CONFIDENCES, name
    with pytest.raises(ValueError, match="fact x: needs a source and a confidence"):
        releases.ByRelease("x", (("<9", 1),), source="", confidence="sure")


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
def test_torch_npu_rules_name_source_and_confidence(rule: OpRule) -> None:
    assert PLACE.search(rule.source) and rule.cite and rule.confidence in CONFIDENCES


def test_known_deviations_carry_their_evidence() -> None:
    for entry in load_deviations().entries:
        assert entry.reference and PLACE.search(entry.reference), entry.id
        assert COMMIT.fullmatch(entry.source_commit), entry.id
        assert entry.status in ("confirmed", "unconfirmed"), entry.id  # confirmed: seen on a device


def test_error_cases_carry_the_commit_they_were_read_at() -> None:
    cases = load_suites(["errors"])
    assert cases
    for case in cases:
        assert COMMIT.fullmatch(case.source_commit), case.name
    bounded = [c.name for c in cases if c.unconfirmed_at]
    assert bounded == ["mask-free-mask-rank3"]  # the one unconfirmed boundary, accepted both ways
