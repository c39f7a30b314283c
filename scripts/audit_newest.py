"""`make audit` where pip-audit cannot run: the advisories that PyPI's project JSON API lists for each pinned
package (https://pypi.org/pypi/NAME/json, its `vulnerabilities` field).

That API describes only the package's newest release. A pin that is its package's newest release is audited
exactly; an older pin is listed as not audited, with the advisories of the newest release (they may or may not
affect the pin). Exit status 1 when an audited pin has an advisory that the exceptions file does not accept,
2 when PyPI cannot be reached (nothing audited), 0 otherwise.

Usage: python scripts/audit_newest.py EXCEPTIONS_FILE REQUIREMENT_FILE...
"""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

PROJECT_API = "https://pypi.org/pypi/{name}/json"
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", re.MULTILINE)


@dataclass(frozen=True)
class Finding:
    name: str
    pinned: str
    newest: str
    advisories: tuple[tuple[str, ...], ...]  # each advisory: its id, then its aliases

    @property
    def audited(self) -> bool:
        return self.pinned == self.newest


def pins(files: list[Path]) -> list[tuple[str, str]]:
    """Every (package name in lower case, pinned version) of the requirement files, once each."""
    return sorted({(name.lower(), version) for file in files for name, version in PIN.findall(file.read_text())})


def accepted_ids(exceptions: Path) -> set[str]:
    """The advisory ids of the exceptions file (the first word of each line that is not a comment)."""
    lines = (line.split("#", 1)[0].split() for line in exceptions.read_text().splitlines())
    return {words[0] for words in lines if words}


def look_up(name: str, pinned: str) -> Finding:
    with urllib.request.urlopen(PROJECT_API.format(name=name), timeout=30) as answer:
        project = json.load(answer)
    advisories = tuple((item["id"], *item.get("aliases", [])) for item in project.get("vulnerabilities", []))
    return Finding(name, pinned, project["info"]["version"], advisories)


def report(findings: list[Finding], accepted: set[str]) -> tuple[list[str], bool]:
    """The audit's lines, and whether an audited pin has an advisory that is not accepted."""
    lines, failed = [], False
    audited = [finding for finding in findings if finding.audited]
    for finding in audited:
        for advisory in finding.advisories:
            verdict = "accepted (audit-exceptions.txt)" if accepted & set(advisory) else "VULNERABLE"
            failed |= verdict == "VULNERABLE"
            lines.append(f"audit: {finding.name} {finding.pinned}: {' / '.join(advisory)}: {verdict}")
    found = "advisories above" if any(finding.advisories for finding in audited) else "no known advisory"
    lines.append(
        f"audit: {len(audited)} of {len(findings)} pins are their package's newest release and were audited: {found}"
    )
    for finding in findings:
        if not finding.audited:
            newest = ", ".join(advisory[0] for advisory in finding.advisories) or "none"
            lines.append(
                f"audit: NOT AUDITED: {finding.name} {finding.pinned} (newest {finding.newest}; "
                f"advisories of the newest: {newest})"
            )
    return lines, failed


def main(exceptions: Path, files: list[Path]) -> int:
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            findings = list(pool.map(lambda pin: look_up(*pin), pins(files)))
    except (urllib.error.URLError, OSError) as error:
        print(f"audit: NOT RUN: PyPI's project JSON API is not reachable either ({error})")
        return 2
    lines, failed = report(findings, accepted_ids(exceptions))
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), [Path(argument) for argument in sys.argv[2:]]))
