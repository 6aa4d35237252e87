"""A slice of the bad-input campaign (fuzz_runner.py; the full one is `nox -s fuzz`):
1,500 seeded cases over the NumPy API and the raw bindings, in worker subprocesses.
Every case must give a verified result, an accepted one, or a clear exception."""

from __future__ import annotations

import fuzz_runner


def test_campaign_slice_has_no_failures():
    counts, failures = fuzz_runner.campaign(1500, seed=20261202, batch=750)
    assert not failures, "\n".join(failures[:20])
    assert sum(counts.values()) == 1500
    assert counts.get("error", 0) > 500 and counts.get("ok", 0) > 100  # both sides are exercised


def test_runner_pins_a_crash_and_a_hang_on_their_case(monkeypatch):
    monkeypatch.setenv("TE_FUZZ_CRASH_AT", "3")
    monkeypatch.setenv("TE_FUZZ_HANG_AT", "7")
    counts, failures = fuzz_runner.campaign(10, seed=5, batch=10, timeout=6.0)
    assert counts["crash"] == 1 and counts["hang"] == 1
    assert failures[0].startswith("case 5:3 crash") and failures[1].startswith("case 5:7 hang")
    assert sum(counts.values()) == 10  # the cases after each failure still ran
