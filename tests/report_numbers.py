"""The numbers in a rendered report's tables, per `## ` section: what tests/test_report_numbers.py
compares before and after a change to the report side.

    python tests/report_numbers.py report/report.md > tests/fixtures/report_numbers_h100.json
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# A number as the report prints it: sign, thousands separators, decimals, exponent.
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
SEPARATOR = re.compile(r"^\|[\s:|-]+\|$")


def table_numbers(text: str) -> dict[str, list[str]]:
    """{section heading: the sorted distinct numbers in its markdown table rows}. Numbers in
    prose and headings are left out; numbers are kept as printed (same formatting required)."""
    out: dict[str, set[str]] = {}
    section = "(top)"
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("|") and not SEPARATOR.match(line.strip()):
            out.setdefault(section, set()).update(NUMBER.findall(line))
    return {k: sorted(v) for k, v in out.items()}


if __name__ == "__main__":
    print(json.dumps(table_numbers(Path(sys.argv[1]).read_text()), indent=1))
