"""Published numbers beside ours: config/references.yaml (validated by
config/references.schema.yaml), each with its source and the conditions it holds for. A section
shows the entries that name it and whose `hw` patterns match the results folder's name (the
GPU), marked "published, not measured here"; the summary quotes some by id."""
from __future__ import annotations

import fnmatch
from pathlib import Path

import pandas as pd

REFERENCES = Path("config/references.yaml")


def load(path: Path = REFERENCES) -> list[dict]:
    """The entries of a references file, validated (ValueError naming the entry and what is
    wrong): the schema beside it, sections that exist, ids used once."""
    import jsonschema
    import yaml

    from lmperf.report.sections import SECTIONS

    path = Path(path)
    entries = yaml.safe_load(path.read_text())
    schema = yaml.safe_load((path.parent / "references.schema.yaml").read_text())
    try:
        jsonschema.validate(entries, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(map(str, e.absolute_path))
        raise ValueError(f"{path}: {where}: {e.message}") from None
    names = {s.name for s in SECTIONS}
    seen = set()
    for e in entries:
        if e["section"] not in names:
            raise ValueError(f"{path}: {e['id']}: section {e['section']!r} is not one of {sorted(names)}")
        if e["id"] in seen:
            raise ValueError(f"{path}: id {e['id']!r} is used twice")
        seen.add(e["id"])
    return entries


def matching(entries: list[dict], hw: str) -> dict[str, dict]:
    """{id: entry} of the entries whose conditions hold for results folder `hw`."""
    return {e["id"]: e for e in entries if any(fnmatch.fnmatch(hw, p) for p in e["hw"])}


def value_text(entry: dict) -> str:
    """The value as published (all its digits), a range where it has an upper end."""
    value = f"{entry['value']:,g}" + (f"-{entry['upper']:,g}" if "upper" in entry else "")
    return f"{value} {entry['unit']}" + (" (derived)" if entry.get("derived") else "")


def by_section(entries: list[dict], hw: str) -> dict[str, pd.DataFrame]:
    """{section: table of its matching entries}: what, value, conditions, source."""
    rows: dict[str, list[dict]] = {}
    for e in matching(entries, hw).values():
        c = e["conditions"]
        rows.setdefault(e["section"], []).append({
            "published, not measured here": e["what"], "value": value_text(e),
            "conditions": "; ".join(v for v in (c["gpu"], c["dtype"], c["shape"], c["mode"], c["software"])
                                    if v and v != "-"),
            "source": f"{e['source']['title']} ({e['source']['locator']})", "confidence": e["confidence"]})
    return {section: pd.DataFrame(r) for section, r in rows.items()}
