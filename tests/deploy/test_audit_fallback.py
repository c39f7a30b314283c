"""scripts/audit_newest.py, `make audit`'s fallback: which pins it reads, which advisories it accepts, its verdicts.

The look-ups themselves go to PyPI (`make audit` runs them in CI); here the findings are built by hand.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("audit_newest", ROOT / "scripts" / "audit_newest.py")
audit = sys.modules["audit_newest"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(audit)

MINERVA = ("GHSA-wj6h-64fc-37mp", "CVE-2024-23342")


def test_every_pin_of_the_lock_files_is_read():
    pins = audit.pins([ROOT / "requirements" / "serve.txt", ROOT / "requirements" / "gpu.txt"])
    names = [name for name, _ in pins]
    assert {"onnxruntime", "onnxruntime-gpu", "redis", "fastapi-offline"} <= set(names)
    assert names.count("redis") == 1  # pinned alike in both files: looked up once
    assert "torch" not in {name for name, _ in audit.pins([ROOT / "requirements" / "dev.txt"])}  # `make audit` adds it


def test_exception_lines_accept_advisories_or_explain_older_pins(tmp_path):
    exceptions = tmp_path / "exceptions.txt"
    exceptions.write_text(
        "# GHSA-aaaa-aaaa-aaaa  an example\n\nCVE-2024-23342  timing side channel; unused\n"
        "Typer==0.27.3  openapi-python-client 0.29.1 requires typer<0.28\n"
    )
    read = audit.read_exceptions(exceptions)
    assert read.advisories == {"CVE-2024-23342"}
    assert read.held_back == {("typer", "0.27.3"): "openapi-python-client 0.29.1 requires typer<0.28"}
    committed = audit.read_exceptions(ROOT / "requirements" / "audit-exceptions.txt")
    assert committed.advisories == set()
    assert all(committed.held_back.values())  # every older pin named there says why


def test_only_an_advisory_of_an_audited_pin_that_is_not_accepted_fails():
    findings = [
        audit.Finding("ecdsa", "0.19.2", "0.19.2", (MINERVA,)),
        audit.Finding("numpy", "2.4.6", "2.5.5", (("GHSA-bbbb-bbbb-bbbb",),), ">=3.12", "2.4.6"),  # not audited
        audit.Finding("fastapi", "0.165.0", "0.165.0", ()),
    ]
    lines, failed = audit.report(findings, audit.Exceptions(), "3.11")
    assert failed and "ecdsa 0.19.2: GHSA-wj6h-64fc-37mp / CVE-2024-23342: VULNERABLE" in lines[0]
    assert "2 of 3 pins" in lines[1]
    assert lines[2].startswith("audit: NOT AUDITED: numpy 2.4.6 (newest 2.5.5") and "GHSA-bbbb-bbbb-bbbb" in lines[2]
    lines, failed = audit.report(findings, audit.Exceptions({"CVE-2024-23342"}), "3.11")  # an alias matches too
    assert not failed and lines[0].endswith("accepted (audit-exceptions.txt)")


def test_an_older_pin_passes_only_with_a_reason():
    numpy = audit.Finding("numpy", "2.4.6", "2.5.5", (), ">=3.12", newest_for_python="2.4.6")
    lines, failed = audit.report([numpy], audit.Exceptions(), "3.11")
    assert not failed
    assert "held back by Python: 2.5.5 needs Python >=3.12, 2.4.6 is the newest for Python 3.11" in lines[1]
    lines, failed = audit.report([numpy], audit.Exceptions(), "3.12")  # a 3.12 lock could move it
    assert failed and "UNEXPLAINED" in lines[1] and "make lock UPGRADE=1" in lines[1]
    behind = audit.Finding("numpy", "2.4.5", "2.5.5", (), ">=3.12", newest_for_python="2.4.6")  # 2.4.6 would do
    assert audit.report([behind], audit.Exceptions(), "3.11")[1]
    typer = audit.Finding("typer", "0.27.3", "0.29.2", (), ">=3.11", newest_for_python="0.29.2")
    assert audit.report([typer], audit.Exceptions(), "3.11")[1]
    explained = audit.Exceptions(held_back={("typer", "0.27.3"): "openapi-python-client requires typer<0.28"})
    lines, failed = audit.report([typer], explained, "3.11")
    assert not failed
    assert lines[1].endswith("held back: openapi-python-client requires typer<0.28 (audit-exceptions.txt)")
    stale = audit.Exceptions(held_back={("typer", "0.27.2"): "an old reason"})  # the pin moved: explains nothing
    lines, failed = audit.report([typer], stale, "3.11")
    assert failed and "the exception for typer==0.27.2 no longer matches an older pin" in lines[2]


def test_a_yanked_pin_fails():
    yanked = audit.Finding("ecdsa", "0.19.2", "0.19.2", (), yanked="broken wheel")
    lines, failed = audit.report([yanked], audit.Exceptions(), "3.11")
    assert failed and lines[0] == "audit: YANKED: ecdsa 0.19.2 (broken wheel)"


def test_the_newest_release_for_a_python_skips_yanked_files_and_prereleases():
    releases = {
        "2.4.5": [{"requires_python": ">=3.11"}],
        "2.4.6": [{"requires_python": ">=3.11"}],
        "2.4.7": [{"requires_python": ">=3.11", "yanked": True}],
        "2.5.0": [{"requires_python": ">=3.12"}],
        "2.6.0rc1": [{"requires_python": ">=3.11"}],
        "2.6.1": [],  # no files
    }
    assert audit.newest_for_python(releases, "3.11") == "2.4.6"
    assert audit.newest_for_python(releases, "3.12") == "2.5.0"
    assert audit.yank_reason([{"yanked": True, "yanked_reason": "CVE"}, {"yanked": True}]) == "CVE"
    assert audit.yank_reason([{"yanked": True}, {"yanked": False}]) is None
    assert audit.lock_python([ROOT / "requirements" / "serve.txt"]) == "3.11"


def test_a_release_younger_than_the_grace_period_is_new_not_a_failure():
    fresh = audit.Finding("typer", "0.27.3", "0.29.2", (), ">=3.11", newest_for_python="0.29.2", candidate_age_days=3)
    lines, failed = audit.report([fresh], audit.Exceptions(), "3.11")
    assert not failed and "NEW: 0.29.2 was released 3 day(s) ago" in lines[1]
    old = audit.Finding("typer", "0.27.3", "0.29.2", (), ">=3.11", newest_for_python="0.29.2", candidate_age_days=45)
    assert audit.report([old], audit.Exceptions(), "3.11")[1]
    files = [{"upload_time_iso_8601": "2026-11-01T10:00:00.000000Z"}, {"upload_time_iso_8601": "2026-11-02T10:00:00Z"}]
    now = audit.datetime(2026, 11, 11, 10, tzinfo=audit.UTC)
    assert audit.age_days(files, now) == 10 and audit.age_days([{}], now) is None
