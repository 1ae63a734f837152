"""A section declares itself once (lmperf.declare, lmperf.catalog): a new section is three files in
a folder of its own (a benchmark module, a report module with its declaration, a template), named
in config `sections`, and the workflow plans and runs its job, the report rule's check validates
its CSV and the renderer shows it, with no file of the repository touched. Also what the
declarations derive: the rules (one generic rule per job kind, no two rules the same but for
names), the result-file layout, the report's list of sections and the docs' table."""
import itertools
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, copy_repo, snakemake, workflow_env
from lmperf import catalog, declare, repeats, workflow as wf
from lmperf.report import render, sections as report_sections, validate

BENCH = '''
"""Square matmuls: x @ x in fp32 at each size of the grid, timed over a few calls."""
from lmperf import stats
from lmperf.bench import cli, loop


def job_cases(study, spec, arg=None):
    return [{"size": n, "case_id": f"n{n}"} for n in spec["sizes"]]


def measure(case):
    import time
    import torch
    x = torch.randn(case["size"], case["size"])
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        x @ x
        times.append((time.perf_counter() - t0) * 1e3)
    return [stats.summarize("matmul_ms", "ms", times)]


def main(argv=None):
    args = cli.bench_args(__doc__, argv)
    loop.run_cases(section="square", study="bench", cases=job_cases("bench", args.spec), measure=measure,
                     out_csv=args.out, hw=args.hw, log_path=args.log, fingerprint={"spec": args.spec})


if __name__ == "__main__":
    main()
'''

REPORT = '''
"""Square matmuls in the report: one row a size, its median time; and the section's declaration."""
import json
from pathlib import Path

from lmperf.declare import Job, Planned, Section


def plan(ctx):
    return [Planned("square_bench", "bench", json.dumps(ctx.grid("square"), sort_keys=True))]


def view(inputs):
    df = inputs.rows("square")
    ok = df[df["status"] == "ok"] if not df.empty else df
    return {"rows": [{"size": int(r["size"]), "median_ms": float(r["median"])} for _, r in ok.iterrows()]}


SECTION = Section("square", (Job("square_bench", "bench", "square/bench.csv", "--spec {params.spec:q}"),), plan,
                  bench="square_bench", view_module="square_report", templates=str(Path(__file__).parent / "templates"),
                  defaults={"smoke": {"sizes": [8, 16]}, "quick": {"run": False}, "full": {"sizes": [1024, 4096]}},
                  subcategory="Square matmuls")
'''

TEMPLATE = '''## Square matmuls

| size | median (ms) |
|---|---|
{% for r in square.rows %}
| {{ r.size }} | {{ "%.4f" | format(r.median_ms) }} |
{% endfor %}
'''


def section_folder(root: Path) -> Path:
    """The three files of a new section, in a folder of their own."""
    folder = root / "square_section"
    (folder / "templates").mkdir(parents=True)
    (folder / "square_bench.py").write_text(textwrap.dedent(BENCH))
    (folder / "square_report.py").write_text(textwrap.dedent(REPORT))
    (folder / "templates" / "square.md.j2").write_text(TEMPLATE)
    return folder


def tree(repo: Path) -> dict[str, bytes]:
    """Every file of the copy that is not a run's output (results, logs, report, caches)."""
    skip = ("results", "logs", "report", ".snakemake", ".cache")
    return {str(p.relative_to(repo)): p.read_bytes() for p in repo.rglob("*")
            if p.is_file() and p.relative_to(repo).parts[0] not in skip and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def with_square(tmp_path_factory):
    """A copy of the repository and a new section beside it, and the environment that names it."""
    root = tmp_path_factory.mktemp("sections")
    repo = copy_repo(root / "lmperf")
    folder = section_folder(root)
    env = {"PYTHONPATH": f"{repo / 'src'}:{folder}"}
    return repo, folder, env


SQUARE = ("--config", "scale=smoke", "sections=[square_report]")


def planned_jobs(out: str) -> dict[str, int]:
    """{rule: jobs} of a dry run's job table."""
    return {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", out, re.M)}


def report_command(repo: Path, env: dict) -> str:
    """The report rule's shell command, as a dry run plans it."""
    dry = snakemake(repo, "-n", "-p", "--cores", "1", "report/report.md", *SQUARE, env=env)
    block = (dry.stdout + dry.stderr).split("\nrule report:")[1]
    return re.search(r"^Shell command: (.*)$", block, re.M)[1]


def test_a_section_in_a_folder_of_its_own_is_planned_run_validated_and_rendered(with_square, monkeypatch):
    repo, folder, env = with_square
    before = tree(repo)
    # planned: its job among the report's, the others as without it
    plain = snakemake(repo, "-n", "--quiet", "rules", "--cores", "1", "report/report.md", "--config", "scale=smoke")
    planned = snakemake(repo, "-n", "--quiet", "rules", "--cores", "1", "report/report.md", *SQUARE, env=env)
    jobs = planned_jobs(plain.stdout)
    assert planned_jobs(planned.stdout) == {**jobs, "square_bench": 1, "total": jobs["total"] + 1}
    # run on the smoke scale: the section's own target
    snakemake(repo, "--cores", "1", "square", *SQUARE, env=env)
    csv = repo / "results" / "cpu" / "square" / "bench.csv"
    rows = pd.read_csv(csv)
    assert list(rows["case_id"]) == ["n8", "n16"] and set(rows["status"]) == {"ok"}
    assert (rows["median"] > 0).all() and set(rows["section"]) == {"square"}
    # validated: the report rule's check of its inputs takes the CSV as it is, and names it and
    # plans its job again when it is cut short
    dry = lambda: snakemake(repo, "-n", "--quiet", "rules", "--cores", "1", "report/report.md", *SQUARE, env=env)
    assert "square_bench" not in planned_jobs(dry().stdout)
    whole = csv.read_bytes()
    csv.write_bytes(b"".join(whole.splitlines(keepends=True)[:2]))
    cut = dry()
    assert planned_jobs(cut.stdout)["square_bench"] == 1 and "results/cpu/square/bench.csv" in cut.stderr
    csv.write_bytes(whole)
    # rendered: the report rule's own command
    proc = subprocess.run(report_command(repo, env), shell=True, cwd=repo, env=workflow_env(repo, env),
                          capture_output=True, text=True)
    assert proc.returncode == 0, (repo / "logs" / "cpu" / "report.log").read_text()[-3000:]
    text = (repo / "report" / "report.md").read_text()
    shown = re.search(r"## Square matmuls\n(.*?)(?=\n## |\Z)", text, re.S)[1]
    table = [line.strip("|").split("|") for line in shown.splitlines() if re.match(r"\| \d", line)]
    assert [(int(size), float(ms)) for size, ms in table] == [(int(r.size), round(r.median, 4)) for r in rows.itertuples()]
    assert "[Square matmuls](#square-matmuls)" in text  # in the contents, as every section
    # its result file is among those a run promises, read the way the renderer reads them
    monkeypatch.syspath_prepend(str(folder))
    try:
        config = render.load_config(repo / "config" / "config.yaml", {"sections": ["square_report"], "hw": "cpu"})
        cpu = str(repo / "results" / "cpu")
        files = [f for f in wf.result_files(config, cpu, "smoke", [cpu]) if f.section == "square"]
        assert [(f.rule, f.case_ids()) for f in files] == [("square_bench", ["n8", "n16"])]
        assert validate.damaged(files) == {}
    finally:
        catalog.load({})  # the sections this process loaded: none beyond the package's again
    assert tree(repo) == before  # no file of the repository touched


def test_a_section_named_twice_or_missing_is_refused_naming_it(with_square, monkeypatch):
    _, folder, _ = with_square
    monkeypatch.syspath_prepend(str(folder))
    with pytest.raises(ValueError, match="square_missing"):
        catalog.load({"sections": ["square_missing"]})
    with pytest.raises(ValueError, match="square declared twice"):
        catalog.load({"sections": ["square_report", "square_report"]})
    catalog.load({})


def test_the_layout_the_report_list_and_the_repeats_derive_from_the_declarations():
    declared = catalog.SECTIONS
    assert wf.layout(declared) == {j.rule: j.layout for s in declared for j in s.jobs}
    assert [s.name for s in report_sections.SECTIONS] == [s.name for s in declared if s.report]
    assert set(report_sections.CHECKED_ONLY) == {s.name for s in declared if not s.report}
    assert repeats.repeatable(declared) == {"ladder_size", "flash_attention_bench", "lrpe_bench", "distributed_study"}
    # every declared job's kind has a generic rule, and each job's log is where its rule wrote it
    assert {j.kind for s in declared for j in s.jobs} == set(declare.KINDS)
    logs = {j.rule: j.log_path() for s in declared for j in s.jobs}
    assert logs["env"] == "env.log" and logs["lrpe_bench"] == "lrpe/bench_{dims}d.log"
    assert logs["e2e_study"] == "e2e/{study}/{size}.log" and logs["fused_check"] == "fused/check.log"


def rule_blocks() -> dict[str, str]:
    """{'<file>:<rule>': its body} of every rule in the Snakefile and rules/*.smk."""
    blocks = {}
    for path in [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]:
        text = path.read_text()
        for m in re.finditer(r"^( *)rule(?: (\w+))?:\n(.*?)(?=^\1\S|^\S|\Z)", text, re.M | re.S):
            blocks[f"{path.name}:{m[2] or m.start()}"] = m[3]
    return blocks


def differ_only_by_names(a: str, b: str) -> bool:
    """Whether two rule bodies are the same but for names (identifiers, words inside strings)."""
    ta, tb = re.findall(r"\w+|[^\w\s]", a), re.findall(r"\w+|[^\w\s]", b)
    return len(ta) == len(tb) and all(x == y or (re.fullmatch(r"\w+", x) and re.fullmatch(r"\w+", y))
                                      for x, y in zip(ta, tb))


def test_no_two_rules_differ_only_by_names():
    assert differ_only_by_names('wf.bench("fused check")\n', 'wf.bench("lrpe check")\n')  # the check itself
    blocks = rule_blocks()
    assert len(blocks) > 5
    same = [(a, b) for (a, x), (b, y) in itertools.combinations(blocks.items(), 2) if differ_only_by_names(x, y)]
    assert not same, f"rules that differ only by names: {same}"


def test_the_docs_table_of_sections_is_the_declarations():
    text = (REPO / "docs" / "architecture.md").read_text()
    assert declare.table(catalog.SECTIONS) in text, ("docs/architecture.md: its table of sections is not "
                                                    "lmperf.declare.table(lmperf.catalog.SECTIONS)")


def test_each_section_owns_its_config_and_a_users_override_merges_over_it(tmp_path):
    """config/config.yaml sets no section's grid: each built-in section's is its own file,
    config/sections/<name>.yaml, holding only its keys and its bars; a user's file that sets one
    value of a grid keeps every other value of it, and a list it sets replaces the section's."""
    import yaml
    config_dir = REPO / "config"
    user = yaml.safe_load((config_dir / "config.yaml").read_text())
    names = {s.name for s in catalog.SECTIONS}
    files = {p.stem: yaml.safe_load(p.read_text()) for p in (config_dir / "sections").glob("*.yaml")}
    assert set(files) <= names
    for name, keys in files.items():
        assert set(keys) - {"report"} and set(keys.get("report", {})) <= {name}
        # config/config.yaml sets none of a section's keys, nor its bars
        assert not (set(keys) - {"report"}) & set(user) and not set(keys.get("report", {})) & set(user["report"])
    # a user's file: one value of the FlashAttention grid, one list of the ladder's
    mine = tmp_path / "config"
    (mine / "sections").mkdir(parents=True)
    for p in (config_dir / "sections").glob("*.yaml"):
        (mine / "sections" / p.name).write_text(p.read_text())
    (mine / "config.yaml").write_text(yaml.safe_dump({**user, "flash_attention": {"full": {"bench": {"workers": 2}}},
                                                      "ladder": {"smoke": {"sizes": ["mini"]}}}))
    (mine / "schema.yaml").write_text((config_dir / "schema.yaml").read_text())
    default, overridden = render.load_config(config_dir / "config.yaml"), render.load_config(mine / "config.yaml")
    fa, fa0 = overridden["flash_attention"]["full"]["bench"], default["flash_attention"]["full"]["bench"]
    assert fa["workers"] == 2 and fa0["workers"] != 2 and fa["groups"] == fa0["groups"]
    assert overridden["ladder"]["smoke"]["sizes"] == ["mini"] != default["ladder"]["smoke"]["sizes"]
    assert {k: v for k, v in overridden["ladder"]["smoke"].items() if k != "sizes"} == \
        {k: v for k, v in default["ladder"]["smoke"].items() if k != "sizes"}
    assert render.bars_from_config(config_dir / "config.yaml") == default["report"]
    assert set(default["report"]) >= {"host_bound_idle_pct", "flash_attention", "ladder"}
