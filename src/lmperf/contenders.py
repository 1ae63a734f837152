"""Contenders: a user's own implementations, named once, run beside ours and the peers.

A contender is a Python module with any of the Stanford CS336 assignment-2 adapter functions:

    get_flashattention_autograd_function_pytorch() -> autograd.Function class   contract "attention"
    get_flashattention_autograd_function_triton()  -> autograd.Function class   contract "attention"
    get_ddp(module) + ddp_on_after_backward(model, optimizer)                   contract "ddp"
    get_fsdp(module, compute_dtype=None) + fsdp_on_after_backward(model, optimizer)
        + fsdp_gather_full_params(model)                                       contract "fsdp"
    get_sharded_optimizer(params, optimizer_cls, **kwargs)                     contract "sharded_optimizer"

It is named on the command line (`--config contenders=path/to/adapters.py`) or, several at once,
as a mapping in a config file (docs/contenders.md).
A contender's name is the mapping's key, or the file's stem for a bare path. What it does not
define, or defines as `raise NotImplementedError`, is "not implemented": the studies of that
contract are `skipped` rows saying so. A module that does not import stops planning with an error
naming the file (`ContenderError`), before any job runs.

Each attention adapter becomes one provider of the attention contract (lmperf.providers), named
`<contender>_triton` or `<contender>_pytorch`, role "contender": the benchmarks run it as they run
ours. Its calls are wrapped (`guarded`) so that an output of the wrong shape, dtype or device, or
with NaN, is a `wrong` row naming what was wrong, never a time.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lmperf.failures import NotRun
from lmperf.guard import Wrong, guarded

# The adapter functions of each contract, as CS336 assignment 2 names them (tests/adapters.py):
# the 2026 handout's `ddp` and `fsdp`, the 2025 handout's `ddp_individual_parameters` and
# `ddp_bucketed` (get_ddp_bucketed(module, bucket_size_mb), its hook called at each step's start).
CONTRACTS: dict[str, tuple[str, ...]] = {
    "attention_triton": ("get_flashattention_autograd_function_triton",),
    "attention_pytorch": ("get_flashattention_autograd_function_pytorch",),
    "ddp": ("get_ddp", "ddp_on_after_backward"),
    "ddp_individual_parameters": ("get_ddp_individual_parameters", "ddp_individual_parameters_on_after_backward"),
    "ddp_bucketed": ("get_ddp_bucketed", "ddp_bucketed_on_after_backward", "ddp_bucketed_on_train_batch_start"),
    "fsdp": ("get_fsdp", "fsdp_on_after_backward", "fsdp_gather_full_params"),
    "sharded_optimizer": ("get_sharded_optimizer",),
}
ADAPTERS = tuple(name for names in CONTRACTS.values() for name in names)
# The attention adapters, by the suffix of the provider each becomes.
ATTENTION = {"triton": "get_flashattention_autograd_function_triton",
             "pytorch": "get_flashattention_autograd_function_pytorch"}
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_")


class ContenderError(ValueError):
    """A contender that cannot be used at all: its module does not import, or its config entry
    is malformed. Raised while planning, before any job runs."""


class NotImplementedByContender(NotRun):
    """The contender does not implement this adapter: a `skipped` row saying so."""
    status = "skipped"


class Failed(NotRun):
    """The contender's code raised: a `failed` row with the whole cause. A result about the
    contender, not a failure of the job."""
    status = "failed"


@dataclass(frozen=True)
class Contender:
    """One contender: its name, where its adapters come from (`sources`: the files that are code
    inputs of every job running it) and, per adapter function name, the callable or None."""
    name: str
    origin: str
    sources: tuple[str, ...]
    adapters: dict = field(hash=False, compare=False)

    def adapter(self, name: str) -> Callable:
        """The adapter function `name`, or NotImplementedByContender saying it is not defined."""
        fn = self.adapters.get(name)
        if fn is None:
            raise NotImplementedByContender(f"not implemented: contender {self.name!r} ({self.origin}) "
                                            f"defines no {name}")
        return fn

    def implements(self, contract: str) -> bool:
        """Whether every adapter function of `contract` is defined (it may still raise
        NotImplementedError when called)."""
        return all(self.adapters.get(n) is not None for n in CONTRACTS[contract])


# ---------------------------------------------------------------------------------------------
# The config's `contenders` value -> {name: source}


def normalise(value) -> dict[str, dict[str, str] | str]:
    """The config's `contenders` (a path string: a repository, an adapters file or a module, or
    several joined by commas; or a mapping name -> one of those | mapping of adapter function ->
    'module:attr') as {name: source-or-mapping}; ContenderError naming what is malformed, or two
    contenders that would get the same name. Empty: {}."""
    if value in (None, "", {}):
        return {}
    if isinstance(value, str):
        items: dict = {}
        for part in filter(None, (p.strip() for p in value.split(","))):
            name = _name_from_source(part)
            if name in items:
                raise ContenderError(
                    f"config contenders: {items[name]} and {part} would both be named {name!r}; name each "
                    f"in a mapping (contenders: {{mine: {items[name]}, theirs: {part}}} in a --configfile)")
            items[name] = part
        return items
    if not isinstance(value, dict):
        raise ContenderError(f"config contenders: expected a path or a mapping of name -> source, got "
                             f"{type(value).__name__} {value!r}")
    for name, source in value.items():
        if not isinstance(name, str) or not name or set(name) - NAME_CHARS:
            raise ContenderError(f"config contenders: name {name!r}: use lower-case letters, digits and _")
        if isinstance(source, dict):
            unknown = sorted(set(source) - set(ADAPTERS))
            if unknown:
                raise ContenderError(f"config contenders.{name}: {unknown} are no adapter functions; "
                                     f"known: {', '.join(ADAPTERS)}")
            if not all(isinstance(s, str) and s for s in source.values()):
                raise ContenderError(f"config contenders.{name}: each adapter names 'module:attr' or 'file.py:attr'")
        elif not isinstance(source, str) or not source:
            raise ContenderError(f"config contenders.{name}: expected a path, a module or a mapping, got {source!r}")
    return dict(value)


def _clean_name(text: str) -> str:
    return "_".join(filter(None, "".join(c if c in NAME_CHARS else "_" for c in text.lower()).split("_"))) \
        or "contender"


def _name_from_source(source: str) -> str:
    """A repository's name: its remote's owner and name (every clone of the handout is called
    `assignment2-systems`), else its folder's; a file's stem; a module's last part."""
    if not _is_file(source) and not Path(source).is_dir():
        return _clean_name(source.split(".")[-1])
    root = repository_root(Path(source))
    if root is None:
        return _clean_name(Path(source).stem)
    remote = _remote(root)
    return _clean_name(remote.replace("/", "_") if remote else root.resolve().name)


def _remote(root: Path) -> str | None:
    """owner/name of the repository's `origin` remote (or its first), None without one."""
    import re
    import subprocess
    try:
        urls = subprocess.run(["git", "-C", str(root), "remote", "-v"], capture_output=True, text=True,
                              timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    if not urls or str(root.resolve()) != _git_toplevel(root):  # a folder inside another repository
        return None
    url = urls[urls.index("origin") + 1] if "origin" in urls else urls[1]
    match = re.search(r"[:/]([^/:]+)/([^/]+?)(?:\.git)?/*$", url)
    return f"{match.group(1)}/{match.group(2)}" if match else None


def _git_toplevel(folder: Path) -> str | None:
    import subprocess
    try:
        proc = subprocess.run(["git", "-C", str(folder), "rev-parse", "--show-toplevel"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return str(Path(proc.stdout.strip()).resolve()) if proc.returncode == 0 else None


# ---------------------------------------------------------------------------------------------
# Where a contender's code is: found without importing it (the workflow plans with it; only the
# contender's own processes import it)

ADAPTERS_FILE = Path("tests") / "adapters.py"  # where a CS336 repository keeps its adapters
SKIPPED_FOLDERS = {".venv", "venv", "__pycache__", "node_modules", "build", "dist", "site-packages"}


@dataclass(frozen=True)
class Location:
    """A contender's code: `adapters`, its adapters' file (or an importable module's name when
    `module` is True); `root`, the repository it belongs to (None: a file of its own); `paths`,
    the folders its process imports from, as the student's own pytest does (the repository's
    root, its `src/`, its workspace members such as the handout's `cs336-basics/`, the adapters'
    folder); `files`, the code inputs of every job that runs it."""
    adapters: str
    module: bool
    root: Path | None
    paths: tuple[str, ...]
    files: tuple[str, ...]


def repository_root(path: Path) -> Path | None:
    """The repository a source belongs to: a folder given as is, or the root of an adapters file at
    its handout place (<root>/tests/adapters.py beside <root>/pyproject.toml); None for a file of
    its own."""
    if path.is_dir():
        return path
    root = path.resolve().parent.parent
    if path.name == ADAPTERS_FILE.name and path.resolve().parent.name == "tests" and (root / "pyproject.toml").is_file():
        return root
    return None


def _pyproject(folder: Path) -> dict:
    file = folder / "pyproject.toml"
    if not file.is_file():
        return {}
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pip's own copy of the same parser
        from pip._vendor import tomli as tomllib
    try:
        return tomllib.loads(file.read_text())
    except (ValueError, OSError) as exc:
        raise ContenderError(f"{file} is not valid TOML: {exc}") from None


def workspace_members(root: Path) -> list[Path]:
    """The repository's workspace members: the folders its pyproject.toml names under
    [tool.uv.workspace] members or as path sources ([tool.uv.sources]: the handout's
    `cs336-basics = { path = "./cs336-basics" }`), and any folder right below the root with a
    pyproject.toml of its own."""
    members = []
    patterns = _pyproject(root).get("tool", {}).get("uv", {}).get("workspace", {}).get("members", [])
    for pattern in patterns:
        members += sorted(p for p in root.glob(pattern) if (p / "pyproject.toml").is_file())
    sources = _pyproject(root).get("tool", {}).get("uv", {}).get("sources", {})
    members += [(root / s["path"]) for s in sources.values() if isinstance(s, dict) and "path" in s
                and (root / s["path"]).is_dir()]
    members += sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                      and p.name not in SKIPPED_FOLDERS and (p / "pyproject.toml").is_file())
    return list(dict.fromkeys(m.resolve() for m in members if m.resolve() != root.resolve()))


def _import_folders(folder: Path) -> list[Path]:
    """Where a project's packages import from: its `src/` in a src layout, else the folder."""
    return [folder / "src"] if (folder / "src").is_dir() else [folder]


def code_files(root: Path) -> list[str]:
    """The repository's Python files that decide whether its rows are stale: those git tracks or
    would track (not ignored), or, outside git, every one; never in hidden folders or
    virtual environments."""
    import subprocess
    try:
        proc = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                               "--", "*.py"], capture_output=True, text=True, timeout=60)
        listed = [root / f for f in proc.stdout.split("\0") if f] if proc.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        listed = None
    if listed is None:
        listed = list(root.rglob("*.py"))
    keep = [p for p in listed if p.is_file() and not any(
        part.startswith(".") or part in SKIPPED_FOLDERS for part in p.relative_to(root).parts[:-1])]
    return sorted({os.path.relpath(p) if not Path(os.path.relpath(p)).is_absolute() else str(p) for p in keep})


def _find_module(name: str) -> Path | None:
    """The file of an importable module `name`, found on sys.path without importing anything."""
    parts = name.split(".")
    for entry in sys.path:
        base = Path(entry or ".").joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _relative(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def locate(source: str) -> Location:
    """Where the contender `source` (a repository folder, an adapters file, or a module name) keeps
    its code; ContenderError if it is not there. Imports nothing."""
    path = Path(source)
    if path.is_dir():
        adapters = path / ADAPTERS_FILE
        if not adapters.is_file():
            raise ContenderError(f"contender repository {source} has no {ADAPTERS_FILE} (the handout's adapters); "
                                 f"name the adapters file itself, or a module")
    elif _is_file(source):
        if not path.is_file():
            raise ContenderError(f"contender file {source} does not exist")
        adapters = path
    else:
        file = _find_module(source)
        if file is None:
            raise ContenderError(f"contender module {source} is not found on Python's path")
        return Location(source, True, None, (), (_relative(file),))
    root = repository_root(path)
    folders: list[Path] = []
    files = [_relative(adapters)]
    if root is not None:
        folders += _import_folders(root)
        for member in workspace_members(root):
            folders += _import_folders(member)
        files += code_files(root)
    folders.append(adapters.resolve().parent)  # its own helpers import as they would beside it
    paths = tuple(dict.fromkeys(str(f.resolve()) for f in folders))
    return Location(_relative(adapters), False, root.resolve() if root else None, paths, tuple(sorted(set(files))))


def _locations(value) -> dict[str, list[Location]]:
    """{name: the locations of its sources} for the config's `contenders`."""
    out = {}
    for name, source in normalise(value).items():
        sources = [source] if isinstance(source, str) else \
            [where.rpartition(":")[0] if ":" in where else where for where in source.values()]
        out[name] = [locate(s) for s in dict.fromkeys(sources)]
    return out


# ---------------------------------------------------------------------------------------------
# What a repository needs: the packages its adapters' code imports, present in lmperf's environment


def _requirement_names(deps: list[str]) -> dict[str, str]:
    """{import-like name: distribution name} of pyproject dependency strings (version pins,
    extras and markers left out)."""
    import re
    names = {}
    for dep in deps:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", dep)
        if match:
            names[_canonical(match.group(1)).replace("-", "_")] = match.group(1)
    return names


def _canonical(name: str) -> str:
    import re
    return re.sub(r"[-_.]+", "-", name).lower()


def _imports_of(file: Path, package: str) -> set[str]:
    """The absolute dotted names `file` imports anywhere in its code (inside functions too: the
    2026 adapters import lazily), relative imports resolved against `package`."""
    import ast
    try:
        tree = ast.parse(file.read_text(errors="replace"))
    except (SyntaxError, ValueError, OSError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[:len(parts) - node.level + 1] if node.level > 1 else parts
                base = ".".join(parts + ([node.module] if node.module else []))
            if base:
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _module_in(paths: tuple[str, ...], name: str) -> Path | None:
    """The file of module `name` in the contender's own folders, None where it is not theirs."""
    parts = name.split(".")
    for folder in paths:
        base = Path(folder).joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        if len(parts) == 1 and base.is_dir():  # a namespace package (a folder without __init__.py)
            return base
    return None


def imported_packages(location: Location) -> set[str]:
    """The top-level packages that the contender's adapters import, directly or through its own
    modules (followed in its folders, statically: nothing is imported), that are not its own."""
    outside, seen = set(), set()
    todo = [(Path(location.adapters), "")]
    while todo:
        file, package = todo.pop()
        if file in seen or not file.is_file():
            continue
        seen.add(file)
        for name in _imports_of(file, package):
            top = name.split(".")[0]
            if _module_in(location.paths, top) is None:
                outside.add(top)
                continue
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # the module and every package on the way
                found = _module_in(location.paths, ".".join(parts[:i]))
                if found is not None and found.is_file():
                    pkg = ".".join(parts[:i]) if found.name == "__init__.py" else ".".join(parts[:i - 1])
                    todo.append((found, pkg))
    return outside


def _path_sources(root: Path) -> dict[str, str]:
    """{canonical name: path} of the repository's path sources ([tool.uv.sources])."""
    sources = _pyproject(root).get("tool", {}).get("uv", {}).get("sources", {})
    return {_canonical(n): s["path"] for n, s in sources.items() if isinstance(s, dict) and "path" in s}


def missing_dependencies(location: Location) -> list[str]:
    """The packages the contender's code imports (imported_packages) that neither it nor lmperf's
    environment has, each by the distribution name its pyproject.toml gives where it lists one."""
    import importlib.util
    listed = {}
    if location.root is not None:
        for project in [location.root] + workspace_members(location.root):
            listed.update(_requirement_names(_pyproject(project).get("project", {}).get("dependencies", [])))
    missing = set()
    for top in imported_packages(location):
        if top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ()):
            continue
        try:
            found = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.add(listed.get(top, top))
    return sorted(missing, key=str.lower)


def check(value) -> list[Location]:
    """Every contender the config names, located and its repository's dependencies checked,
    without importing any of its code (the workflow calls it while planning): ContenderError
    naming every missing package, or the first source that is not there."""
    locations = _locations(value)
    missing, pip, local = {}, set(), []
    for name, locs in locations.items():
        for loc in locs:
            if loc.module:
                continue
            sources = _path_sources(loc.root) if loc.root is not None else {}
            lacks = []
            for package in missing_dependencies(loc):
                path = sources.get(_canonical(package))
                if path is None:
                    lacks.append(package)
                    pip.add(package)
                    continue
                lacks.append(f"{package} (its [tool.uv.sources] path {path} holds no package"
                             + ("; a git submodule not checked out? git submodule update --init"
                                if (loc.root / ".gitmodules").is_file() else "") + ")")
                local.append(package)
            if lacks:
                missing[f"{name} ({loc.root or loc.adapters})"] = lacks
    if missing:
        raise ContenderError(
            "contenders import packages that neither they nor lmperf's environment have: "
            + "; ".join(f"{who}: {', '.join(lacks)}" for who, lacks in missing.items())
            + ". lmperf installs nothing into its environment for a contender (two contenders' packages "
              "would collide)"
            + (f"; add them yourself: .venv/bin/python -m pip install {' '.join(sorted(pip, key=str.lower))}"
               if pip else ""))
    return [loc for locs in locations.values() for loc in locs]


# ---------------------------------------------------------------------------------------------
# Loading, in a contender's own process


def _is_file(source: str) -> bool:
    return source.endswith(".py") or os.sep in source


_ENTERED: dict[str, frozenset[str]] = {}  # repository root -> its top-level packages, in this process


def _top_level_packages(paths: tuple[str, ...]) -> frozenset[str]:
    return frozenset(p.name for folder in paths for p in Path(folder).iterdir()
                     if p.is_dir() and (p / "__init__.py").is_file()) if paths else frozenset()


def _metadata_stand_ins(root: Path) -> str:
    """A folder of `<project>.dist-info` records for the repository's own projects (root and
    workspace members), so that code reading its installed metadata
    (`importlib.metadata.version("cs336-systems")`, the 2025 template's) finds a version without
    the project being installed into lmperf's environment."""
    import tempfile
    folder = Path(tempfile.mkdtemp(prefix="lmperf-contender-metadata-"))
    for project in [root] + workspace_members(root):
        table = _pyproject(project).get("project", {})
        name = table.get("name")
        if not name:
            continue
        version = table.get("version", "0")
        info = folder / f"{_canonical(name).replace('-', '_')}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return str(folder)


def _enter(location: Location) -> None:
    """Make the contender's code importable in this process, as its own pytest would: its
    folders first on sys.path (for good: adapters may import lazily, inside their functions), and
    its projects' metadata. ContenderError where another repository entered this process has a
    package of the same name (two `cs336_systems`: each contender runs in processes of its own)."""
    if location.root is None:
        for folder in location.paths:
            if folder not in sys.path:
                sys.path.insert(0, folder)
        return
    key = str(location.root)
    if key in _ENTERED:
        return
    packages = _top_level_packages(location.paths)
    for other, theirs in _ENTERED.items():
        if packages & theirs:
            raise ContenderError(f"contender repository {location.root}: this process already imports "
                                 f"{other}, which has packages of the same names ({', '.join(sorted(packages & theirs))}); "
                                 f"each contender runs in processes of its own")
    for folder in reversed(location.paths):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    sys.path.append(_metadata_stand_ins(location.root))
    _ENTERED[key] = packages


def _import_file(path: str):
    """The module at `path` (a fresh import, cached by the file's absolute path and contents)."""
    file = Path(path)
    if not file.is_file():
        raise ContenderError(f"contender file {path} does not exist")
    digest = hashlib.sha256(file.read_bytes()).hexdigest()[:12]
    mod_name = f"lmperf_contender_{_clean_name(file.stem)}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(mod_name, None)
        raise ContenderError(f"contender file {path} does not import: {type(exc).__name__}: {exc}") from exc
    return module


def _import(location: Location):
    """The adapters' module; ContenderError naming it if it does not import."""
    _enter(location)
    if not location.module:
        return _import_file(location.adapters)
    try:
        return importlib.import_module(location.adapters)
    except BaseException as exc:
        raise ContenderError(f"contender module {location.adapters} does not import: "
                             f"{type(exc).__name__}: {exc}") from exc


def load(name: str, source: str | dict) -> Contender:
    """One contender from its config entry, imported into this process (a contender's own:
    a check's child, a timed case's, a rank); ContenderError if a module does not import or an
    entry's attribute is missing."""
    if isinstance(source, str):
        location = locate(source)
        module = _import(location)
        adapters = {a: getattr(module, a, None) for a in ADAPTERS}
        adapters = {a: (fn if callable(fn) else None) for a, fn in adapters.items()}
        return Contender(name, source, location.files, adapters)
    adapters, files = {a: None for a in ADAPTERS}, []
    for adapter, where in source.items():
        mod_source, _, attr = where.rpartition(":") if ":" in where else (where, "", adapter)
        location = locate(mod_source)
        module = _import(location)
        fn = getattr(module, attr or adapter, None)
        if not callable(fn):
            raise ContenderError(f"contender {name}: {mod_source} has no callable {attr or adapter}")
        adapters[adapter] = fn
        files += location.files
    return Contender(name, ", ".join(sorted(set(source.values()))), tuple(sorted(set(files))), adapters)


def load_all(value) -> list[Contender]:
    """Every contender the config's `contenders` names, loaded into this process (ContenderError on
    the first that cannot be). For one contender, or contenders of different packages: two
    repositories with packages of one name refuse to share a process."""
    return [load(name, source) for name, source in normalise(value).items()]


def code_inputs(value) -> list[str]:
    """The files a job running these contenders depends on (a change reruns it): each contender's
    adapters and, for a repository, its Python files (`code_files`). Found without importing
    anything; a source that is not there is a ContenderError, at planning."""
    return sorted({f for locs in _locations(value).values() for loc in locs for f in loc.files})


def fingerprint(value) -> dict[str, str]:
    """What a job's journal keys on for the contenders it runs: {"contender_files": digest}, or
    nothing without contenders (a journal of ours alone stays as it was)."""
    return {"contender_files": digest(value)} if normalise(value) else {}


def digest(value) -> str:
    """The sha256 of every file code_inputs(value) names, for journals: a resume never mixes rows
    of two versions of a contender's code."""
    h = hashlib.sha256()
    for path in code_inputs(value):
        h.update(path.encode())
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# The attention contract


def attention_class(contender: Contender, kind: str):
    """The autograd Function class of `kind` ('triton' | 'pytorch'); NotImplementedByContender
    when the adapter is missing or raises NotImplementedError, Failed when it raises anything
    else (its cause whole: a result about the contender, never a traceback of lmperf's)."""
    from lmperf import failures
    getter = contender.adapter(ATTENTION[kind])
    try:
        cls = getter()
    except NotImplementedError as exc:
        raise NotImplementedByContender(f"not implemented: {ATTENTION[kind]} raised NotImplementedError"
                                        + (f" ({exc})" if str(exc) else "")) from None
    except Exception as exc:
        raise Failed(f"{ATTENTION[kind]}() raised {failures.describe(exc)}") from None
    if not callable(getattr(cls, "apply", None)):  # a class, or an instance of one (its apply is the class's)
        raise Wrong(f"{ATTENTION[kind]} returned {cls!r}, not an autograd.Function class")
    return cls


def attention_fn(contender: Contender, kind: str) -> Callable:
    """fn(q, k, v, is_causal) over lmperf's attention contract, from the contender's class: CS336's
    contract is (batch, N, D) inputs, so (B, H, N, D) inputs with as many K/V heads as Q heads are
    passed as (B * H, N, D) views and the output viewed back; fewer K/V heads (grouped-query) are
    passed as they are (a contender that cannot take them raises, an `unsupported` row)."""
    cls = attention_class(contender, kind)

    def fn(q, k, v, is_causal):
        if q.dim() == 4 and q.shape == k.shape == v.shape:
            b, h, n, d = q.shape
            return cls.apply(q.reshape(b * h, n, d), k.reshape(b * h, n, d), v.reshape(b * h, n, d),
                             is_causal).reshape(b, h, n, d)
        return cls.apply(q, k, v, is_causal)
    fn.__qualname__ = f"{contender.name}_{kind}"
    return fn


# ---------------------------------------------------------------------------------------------
# The workflow's jobs (rules/contenders.smk)

STUDIES = ("attention", "distributed")


def study_spec(config: dict, scale: str, study: str) -> str:
    """The JSON spec of one contenders job: the contenders (normalised) and that study's
    settings at `scale`, with the time limit per case."""
    import json
    settings = config.get("contenders_check", {}).get(scale, {})
    return json.dumps({"contenders": normalise(config.get("contenders")), **settings.get(study, {}),
                       "time_limit_s": config.get("contender_time_limit_s", 600)}, sort_keys=True)



# ---------------------------------------------------------------------------------------------
# Contenders as providers (lmperf.providers) and as the model's attention (lmperf.model)

ENV = "LMPERF_CONTENDERS"  # JSON of the normalised config value: what child processes register
TILED_NOTE = "the Python tile loop of a PyTorch implementation takes seconds a case above it"


def refuse_tiled(case: dict) -> None:
    """NotRun for a case of a PyTorch attention (a Python tile loop) above its tiled_max_seq_len."""
    limit = case.get("tiled_max_seq_len")
    if limit is not None and case.get("seq_len", 0) > limit:
        raise NotRun(f"N > {limit} (tiled_max_seq_len): {TILED_NOTE}")


def provider_names(value) -> list[str]:
    """The attention providers the contenders become, `<name>_triton` and `<name>_pytorch` for
    each (one that is not implemented gives `skipped` rows saying so)."""
    return [f"{name}_{kind}" for name in normalise(value) for kind in ATTENTION]


def owner(provider: str) -> str:
    """The contender a provider of theirs belongs to (`<name>_triton` -> name): the key of the
    processes its cases run in (two contenders never share one)."""
    return provider.rpartition("_")[0] if provider.endswith(tuple(f"_{k}" for k in ATTENTION)) else provider


_RESOLVED: dict[tuple[str, str], Callable] = {}  # (name, kind) -> fn, in a contender's own process


def resolve(name: str, source, kind: str) -> Callable:
    """fn(q, k, v, is_causal) of a contender's attention, loaded into this process at its first
    use (so only the processes that run the contender's cases import its code); an adapter that
    is missing, does not import or raises gives a function that raises why when called (a
    `skipped`, `failed` or `wrong` row)."""
    key = (name, kind)
    if key not in _RESOLVED:
        try:
            fn = attention_fn(load(name, source), kind)
        except (NotRun, ContenderError) as exc:
            error = exc if isinstance(exc, NotRun) else Failed(str(exc))

            def fn(q, k, v, is_causal, error=error):
                raise type(error)(str(error))
        _RESOLVED[key] = fn
    return _RESOLVED[key]


class Deferred:
    """A contender's attention as the model's attention choice (lmperf.model.ATTENTION), loaded
    when a model is built with it (`resolve`): registering it imports nothing, and a compiled model
    traces the contender's own function, nothing of the loading."""

    def __init__(self, name: str, source, kind: str):
        self.name, self.source, self.kind = name, source, kind

    def resolve(self) -> Callable:
        return resolve(self.name, self.source, self.kind)

    def __call__(self, q, k, v, is_causal):
        return self.resolve()(q, k, v, is_causal)


def register(value) -> list[str]:
    """Register every contender of the config's `contenders` as attention providers (role
    "contender") and as attention choices of the model (lmperf.model.ATTENTION), and pass them to
    the processes this one starts (ENV). Returns the provider names. Imports none of their code:
    a provider loads its contender when it builds a case (in the contender's own process)."""
    items = normalise(value)
    if not items:  # nothing imported: planning without contenders never loads torch here
        return []
    import json

    from lmperf import model, providers
    names = []
    for name, source in items.items():
        source_file = locate(source).adapters if isinstance(source, str) else None
        for kind in ATTENTION:
            provider = f"{name}_{kind}"
            names.append(provider)
            existing = providers.find(provider)
            if existing is not None:  # registered already (by this process, or the name is taken)
                if existing.role != "contender" or existing.source != source_file:
                    raise ContenderError(f"contender {name!r}: provider name {provider!r} is taken by "
                                         f"{existing.source or 'lmperf'}; choose another contender name")
                continue
            needs = ("cuda_for_bf16",) if kind == "triton" else ()
            providers.register(providers.Provider(
                provider, f"{name} ({kind}, contender)", "contender", "attention", _build(name, source, kind),
                needs=needs, source=source_file))
            if provider not in model.ATTENTION:
                model.register_attention(provider, Deferred(name, source, kind))
            providers.register(providers.Provider(  # the model's attention in place of ours (the ladder's rung)
                provider, f"{name} ({kind}, contender)", "contender", "model_attention",
                _model_build(provider), needs=needs, source=source_file))
    os.environ[ENV] = json.dumps(items)
    providers.load([__name__])  # a process this one starts imports this module: it registers them (below)
    return names


def _model_build(provider: str) -> Callable:
    def build(case: dict):
        import contextlib

        from lmperf import model
        return model.ATTENTION[provider], contextlib.nullcontext
    return build


def _build(name: str, source, kind: str) -> Callable:
    def build(case: dict):
        import contextlib
        if kind == "pytorch":
            refuse_tiled(case)
        causal = case["causal"]
        checked = guarded(resolve(name, source, kind))
        return (lambda q, k, v: checked(q, k, v, causal)), contextlib.nullcontext
    return build


def register_or_exit(value) -> list[str]:
    """`register`, for a benchmark's main: a contender that does not import ends the process with
    its error (its file named)."""
    try:
        return register(value)
    except ContenderError as exc:
        raise SystemExit(f"error: {exc}") from None


def ladder_rungs(value) -> list[tuple[str, str, dict, bool]]:
    """The ladder's rungs of a user's attention in place of ours (bench/ladder.py), one a
    provider, on the last carried rung's settings and not carried up: (name, change, the case
    keys it sets, whether it needs CUDA: its provider's needs at bf16, lmperf.providers)."""
    from lmperf import providers
    return [(f"contender_{p}", f"contender (on the last carried rung's settings; not carried up): {p}'s "
             f"attention in place of ours", {"attention": p}, providers.get(p, "model_attention").needs_cuda("bf16"))
            for p in register(value)]


def register_from_environment() -> None:
    """In a process a job started: register the contenders the job registered (ENV)."""
    import json
    raw = os.environ.get(ENV)
    if raw:
        from lmperf import providers
        if not all(providers.find(n) for n in provider_names(json.loads(raw))):
            register(json.loads(raw))


DISTRIBUTED = ("ddp", "ddp_individual_parameters", "ddp_bucketed", "fsdp", "sharded_optimizer")


def distributed_variants(value) -> dict[str, tuple]:
    """{variant: (name, source, contract)}: the distributed section's variants a user's contenders
    add, `<name>-ddp`, `<name>-fsdp`, `<name>-sharded_optimizer` (one not implemented gives
    `skipped` rows saying so)."""
    return {f"{name}-{contract}": (name, source, contract)
            for name, source in normalise(value).items() for contract in DISTRIBUTED}


# A process started by a job that registered contenders (a worker, a torchrun rank, an isolated
# case) registers them when it imports this module: lmperf.providers loads it by name (ENV).
register_from_environment()
