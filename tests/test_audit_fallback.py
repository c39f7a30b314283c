"""scripts/audit_newest.py, `make audit`'s fallback: which pins it reads, which advisories it accepts, its verdicts.

The look-ups themselves go to PyPI (`make audit` runs them in CI); here the findings are built by hand.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def test_exceptions_are_the_first_word_of_each_line_that_is_not_a_comment(tmp_path):
    exceptions = tmp_path / "exceptions.txt"
    exceptions.write_text("# GHSA-aaaa-aaaa-aaaa  an example\n\nCVE-2024-23342  timing side channel; unused\n")
    assert audit.accepted_ids(exceptions) == {"CVE-2024-23342"}
    assert audit.accepted_ids(ROOT / "requirements" / "audit-exceptions.txt") == set()


def test_only_an_advisory_of_an_audited_pin_that_is_not_accepted_fails():
    findings = [
        audit.Finding("ecdsa", "0.19.2", "0.19.2", (MINERVA,)),
        audit.Finding("numpy", "2.4.6", "2.5.5", (("GHSA-bbbb-bbbb-bbbb",),)),  # older pin: not audited
        audit.Finding("fastapi", "0.165.0", "0.165.0", ()),
    ]
    lines, failed = audit.report(findings, accepted=set())
    assert failed and "ecdsa 0.19.2: GHSA-wj6h-64fc-37mp / CVE-2024-23342: VULNERABLE" in lines[0]
    assert "2 of 3 pins" in lines[1]
    assert lines[2].startswith("audit: NOT AUDITED: numpy 2.4.6 (newest 2.5.5") and "GHSA-bbbb-bbbb-bbbb" in lines[2]
    lines, failed = audit.report(findings, accepted={"CVE-2024-23342"})  # an alias matches too
    assert not failed and lines[0].endswith("accepted (audit-exceptions.txt)")
