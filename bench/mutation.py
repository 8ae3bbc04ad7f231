"""Mutation score of the modules whose bugs come out as plausible output, with mutmut.

    .venv/bin/python bench/mutation.py [--only cluster/access.py ...] [--children 2] [--show-survivors]
    .venv/bin/python bench/mutation.py --survivors --only actors/attack/search.py   # after writing tests
    .venv/bin/python bench/mutation.py --report-only                                # every module, as last measured
    .venv/bin/python bench/mutation.py --ci            # what .ci/run runs: the figure modules changed since measured

mutmut is not a project dependency: the first run makes its own environment in bench/.mutmut-venv
(mutmut from PyPI, plus a path file that lends it this checkout's installed dependencies). Each run
stages the package and the tests in bench/.mutmut-work (mutmut rewrites the sources it mutates, so
never in the checkout), mutates only the modules in TARGETS and tests each mutant against the tests
that execute the mutated function (mutmut records them in a first, clean run). Only tests that run
in-process take part: a test that starts Ray, a server or a subprocess cannot see a mutant that lives
in this process, so it is left out (see `inprocess.py`, written next to the tests).

The tiny test models are built once and kept for every mutant (REDLINE_TEST_STATE), memoised functions
are cleared in each mutant's run, and each module's latest verdicts are kept in .mutmut-results.json,
so modules measured in separate runs report together (`--survivors` re-tests only a module's last
survivors against the tests as they are now).

Prints one JSON line per module (mutants, killed, survived, timeouts, equivalent, score) and the
total, then each surviving mutant that is not in EQUIVALENT with its diff (with --show-survivors),
and each equivalent one with one line of why. Score = (killed + timeouts) / (mutants - equivalent);
a mutant no test runs counts as a survivor. Exits 1 when a module is below 80%.

The modules that make published figures (CI_MODULES) keep 85%: a run that measures one of them writes its
score and the hash of the source it was measured on into mutation-record.json (committed). `--ci`
measures only those whose source changed since (the modules a change touches; the whole bench takes
longer than CI's budget allows), then prints every one's score and fails if one is below 85%.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "bench" / ".mutmut-venv"
WORK = ROOT / "bench" / ".mutmut-work"
STATE = ROOT / "bench" / ".mutmut-state"  # tiny models and caches the tests keep between mutants
RESULTS = ROOT / "bench" / ".mutmut-results.json"  # each module's latest verdicts, kept across runs
RECORD = ROOT / "bench" / "mutation-record.json"  # committed: each CI module's score and the source it was measured on
MUTMUT = "mutmut==3.8.1"
BAR = 0.85  # the score every module in CI_MODULES keeps (issue 56)

# module -> the test files whose in-process tests cover it
TARGETS: dict[str, list[str]] = {
    "actors/attack/goals.py": ["tests/test_attack_components.py", "tests/test_plausible_outputs.py"],
    "actors/attack/transformations.py": ["tests/test_attack_components.py", "tests/test_attack_details.py"],
    "actors/attack/constraints.py": ["tests/test_attack_components.py", "tests/test_attack_details.py",
                                     "tests/test_plausible_outputs.py"],
    "actors/attack/search.py": ["tests/test_attack_components.py", "tests/test_attack_details.py",
                                "tests/test_plausible_outputs.py"],
    "pipelines/reporting/aggregates.py": ["tests/test_plausible_outputs.py", "tests/test_figures.py", "tests/test_figures_reference.py"],
    "pipelines/reporting/figures.py": ["tests/test_plausible_outputs.py", "tests/test_figures.py"],
    "actors/triggers/hits.py": ["tests/test_triggers.py", "tests/test_plausible_outputs.py"],
    "actors/dialogue_safety/two_step.py": ["tests/test_dialogue_safety.py", "tests/test_plausible_outputs.py"],
    "cluster/fingerprints.py": ["tests/test_plausible_outputs.py"],
    "view/rows.py": ["tests/test_hardening.py", "tests/test_plausible_outputs.py", "tests/test_view_tables.py"],
    "view/report.py": ["tests/test_plausible_outputs.py"],
    "cluster/access.py": ["tests/test_access.py"],
    "serve/gate.py": ["tests/test_access.py"],
    "serve/budgets.py": ["tests/test_access.py", "tests/test_plausible_outputs.py"],
    "cluster/paths.py": ["tests/test_hardening.py", "tests/test_paths.py"],
    # where rows become the figures a user publishes (issue 56's misses were all here)
    "pipelines/reporting/uncertainty.py": ["tests/test_card_figures.py", "tests/test_figures_reference.py"],
    "pipelines/reporting/card_figures.py": ["tests/test_card_figures.py", "tests/test_figures_reference.py"],
    "pipelines/plane/table_index.py": ["tests/test_figures_reference.py", "tests/test_view_tables.py"],
    # not pipelines/plane/steps.py, runner.py nor shard_host.py: every test of theirs runs them on Ray, where a
    # mutant living in this process is not seen (mutmut finds no test to run)
    "view/plan.py": ["tests/test_view_tables.py"],
    "view/scan.py": ["tests/test_view_tables.py"],
    "cluster/leases.py": ["tests/test_leases.py"],
}

# the modules that turn rows into the figures a user publishes: `--ci` (run by .ci/run) measures those whose
# source differs from the one RECORD was measured on, and fails below BAR
CI_MODULES = ("pipelines/reporting/aggregates.py", "pipelines/reporting/figures.py",
              "pipelines/reporting/card_figures.py", "pipelines/reporting/uncertainty.py",
              "pipelines/plane/table_index.py", "view/plan.py", "actors/attack/constraints.py",
              "actors/triggers/hits.py", "cluster/paths.py", "serve/gate.py")

# mutant name -> why it cannot change behaviour, reviewed by hand against its diff (`mutmut show NAME`).
# Names number the mutants of one version of a module: when a module changes, its survivors are reviewed
# again, never carried over blindly.
_GATE, _PATHS, _TWO_STEP = "redline.serve.gate.", "redline.cluster.paths.", "redline.actors.dialogue_safety.two_step."
_CONSTRAINTS, _SEARCH = "redline.actors.attack.constraints.", "redline.actors.attack.search."
_REASONS = {
    "receive": "the `receive` handed to a JSONResponse is never called (Starlette's Response only sends)",
    "header-case": "Starlette lower-cases response header names, so Retry-After is sent the same way",
    "codec-case": "codec names are case-insensitive: LATIN-1 is latin-1",
    "asgi-default": "the ASGI spec requires `path` and `headers` in an http scope, and a missing or false "
                    "`root_path` leaves the path as it is, so these defaults never decide anything",
    "falsy": "the default replaced is read only for its truth, and the replacement is as false",
    "nofollow": "os.O_NOFOLLOW exists wherever redline runs (Linux, macOS): the fallback is never taken",
    "directory": "O_RDONLY is 0, so the root is opened without O_DIRECTORY; a root that is not a folder then "
                 "fails the next open relative to it with the same ENOTDIR, read as the same refusal",
    "types-twice": "each column's type is given twice (the array's type and the table's schema): dropping "
                   "one leaves the other to decide the same type",
    "no-pairs": "per_category of no pairs asks no classifier and returns no verdicts, as the guard does",
    "cosine-only": "WordEmbeddingDistance reads only cosines; k sizes neighbour lists it never asks for",
    "bool-array": "a list of Python bools makes a bool array with or without dtype=bool",
    "batch-order": "texts are encoded longest first only so a batch pads little: each text's embedding is "
                   "its own (padding is masked out)",
    "cache-bound": "the tag cache is emptied one entry sooner or later: what it returns is what spaCy tags",
    "spacy-batch": "spaCy's pipe batch size decides how many texts are tagged at once, never a tag",
    "cutoff": "rapidfuzz's score_cutoff only caps the distance it reports at cutoff + 1 once it is passed: "
              "`distance <= cap` holds for the same candidates with or without it",
    "softmax-shift": "softmax is shift-invariant: exp((s + max) / T) normalises to the same parent odds as "
                     "exp((s - max) / T), and goal scores lie in [0, 1], so neither overflows",
    "last-part": "every hit type holds a '-' (checked just before): its last part is the same however many "
                 "times it is split, and a split from the right in two has that part at index 1 and -1",
}
EQUIVALENT: dict[str, str] = {
    **{_GATE + n: _REASONS["receive"] for n in (
        "x__busy__mutmut_13", "x__reply__mutmut_4", "xǁGuardǁ__call____mutmut_75", "xǁGuardǁ__call____mutmut_106",
        "xǁGuardǁ__call____mutmut_147", "xǁGuardǁ__call____mutmut_163", "xǁGuardǁ__call____mutmut_181",
        "xǁGuardǁ__call____mutmut_203", "xǁGuardǁ__call____mutmut_218")},
    **{_GATE + n: _REASONS["header-case"] for n in ("x__busy__mutmut_26", "x__busy__mutmut_27")},
    **{_GATE + n: _REASONS["codec-case"] for n in ("xǁGuardǁ__call____mutmut_58", "xǁGuardǁ__call____mutmut_61")},
    **{_GATE + n: _REASONS["asgi-default"] for n in (
        "xǁGuardǁ__call____mutmut_36", "xǁGuardǁ__call____mutmut_38", "xǁGuardǁ__call____mutmut_41",
        "xǁGuardǁ__call____mutmut_43", "xǁGuardǁ__call____mutmut_45", "xǁGuardǁ__call____mutmut_48",
        "xǁGuardǁ__call____mutmut_63", "xǁGuardǁ__call____mutmut_65")},
    **{_GATE + n: _REASONS["falsy"] for n in (
        "x__read_body__mutmut_24", "x__read_body__mutmut_26", "xǁGuardǁ__call____mutmut_233")},
    _GATE + "xǁGuardǁ__call____mutmut_135": "a missing Content-Length read as 'XXXX' is not digits either: "
                                            "no declared length, as with ''",
    **{_PATHS + n: _REASONS["nofollow"] for n in (
        "x_read_local_below__mutmut_7", "x_read_local_below__mutmut_10", "x_read_local_below__mutmut_13")},
    _PATHS + "x_read_local_below__mutmut_20": _REASONS["directory"],
    _PATHS + "x_relative_parts__mutmut_1": _REASONS["falsy"],
    _TWO_STEP + "xǁTwoStepDetectorǁdetect__mutmut_18": _REASONS["no-pairs"],
    **{_CONSTRAINTS + f"xǁWordEmbeddingDistanceǁ__init____mutmut_{k}": _REASONS["cosine-only"] for k in (1, 7, 10)},
    **{_CONSTRAINTS + f"xǁWordEmbeddingDistanceǁcheck__mutmut_{k}": _REASONS["bool-array"] for k in (18, 20)},
    **{_CONSTRAINTS + f"xǁLevenshteinǁcheck__mutmut_{k}": _REASONS["bool-array"] for k in (3, 5)},
    **{_CONSTRAINTS + f"xǁLevenshteinǁcheck__mutmut_{k}": _REASONS["cutoff"] for k in (8, 11)},
    **{_CONSTRAINTS + f"xǁPartOfSpeechǁtags__mutmut_{k}": _REASONS["cache-bound"] for k in (1, 2)},
    **{_CONSTRAINTS + f"xǁSentenceEncoderǁencode__mutmut_{k}": _REASONS["cache-bound"] for k in (1, 2)},
    **{_CONSTRAINTS + f"xǁSentenceEncoderǁencode__mutmut_{k}": _REASONS["batch-order"] for k in (5, 8, 9, 12)},
    _CONSTRAINTS + "xǁSentenceEncoderǁencode__mutmut_27": "an integer mask times float hidden states is float: "
                                                          "the same products",
    _CONSTRAINTS + "xǁSentenceEncoderǁencode__mutmut_34": "the pooled sum divided or multiplied by its positive "
                                                          "token count points the same way: normalised, the same",
    **{_CONSTRAINTS + f"xǁPartOfSpeechǁtags__mutmut_{k}": _REASONS["spacy-batch"] for k in (11, 13, 14)},
    **{f"redline.actors.triggers.hits.x_objective_of__mutmut_{k}": _REASONS["last-part"] for k in (8, 11, 12)},
    _SEARCH + "xǁAlzantotGeneticǁrun__mutmut_92": _REASONS["softmax-shift"],
    _SEARCH + "xǁAlzantotGeneticǁrun__mutmut_25": "int.from_bytes reads big-endian by default "
                                                  "since Python 3.11 (redline needs 3.11)",
    **{_TWO_STEP + f"xǁTwoStepWorkerǁ__call____mutmut_{k}": _REASONS["types-twice"]
       for k in (18, 20, 24, 26, 33, 35, 39, 41, 45, 47)},
}

# tests that need a fixture of this kind run outside this process (Ray, a server, a subprocess), or
# train a model for every mutant (a module fixture is built again in each mutant's test run). The tiny
# models of conftest.py take part: REDLINE_TEST_STATE keeps them (and the WordNet tables) on disk, built
# once in the first, clean run.
OUT_OF_PROCESS_FIXTURES = ("ray_session", "server", "moto_endpoint", "s3_env", "quickstart_dir", "attack_run",
                           "served", "viewer", "cluster", "planted", "dialogue_s2s", "trained", "davidson")

# in-process tests too slow to run once per mutant (each covers what faster tests check one rule at a time)
SLOW_TESTS = ("test_every_registered_recipe_runs_on_a_tiny_victim",)

# modules whose tables are built by their own functions while they are imported (figures.py's TABLES:
# `leaderboard()`, `_split(...)`, ...). mutmut forks each mutant's run from a process that imported them
# already, so such a mutant would never run: its runs import redline (and the test modules) afresh, and
# the functions hit while importing count as run by every test whose module holds one of its objects.
IMPORT_TIME = ("redline.pipelines.reporting.figures",)

# modules whose tests run torch models: a child forked from mutmut's process while torch's thread pool runs
# crashes (SIGSEGV) when it uses the pool. A run with one of these gives the tests one torch thread
# (tests/conftest.py), so no pool runs when mutmut forks (a fork server, importing torch afresh per mutant,
# took ~10x as long).
FORK_UNSAFE = ("actors/attack/constraints.py",)

INPROCESS_PLUGIN = f'''
"""Keep only in-process tests (written by bench/mutation.py)."""
import os
import sys
from pathlib import Path

import pytest

OUT = {OUT_OF_PROCESS_FIXTURES!r}
SLOW = {SLOW_TESTS!r}
IMPORT_TIME = {IMPORT_TIME!r}
TESTS = Path(__file__).resolve().parent
KEEP = ("conftest", "inprocess")
_import_hits = set()


def _mutant():
    return os.environ.get("MUTANT_UNDER_TEST", "")


def _fresh_imports():
    """A run that must see import-time code (an import-time module's mutant; the clean, stats and
    listing runs, so that the tests are known to pass the same way) imports redline and the test
    modules again: conftest is kept (its fixtures import redline when they run)."""
    mutant = _mutant()
    if mutant not in ("", "stats", "list_all_tests") and not any(mutant.startswith(m + ".") for m in IMPORT_TIME):
        return
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None) or ""
        if name.split(".")[0] == "redline" or (where.startswith(str(TESTS)) and name not in KEEP):
            del sys.modules[name]


def _imported_objects(module):
    for value in vars(module).values():
        yield getattr(value, "__name__", None) if isinstance(value, type(sys)) else getattr(value, "__module__", None)
        yield type(value).__module__


def pytest_collection_finish(session):
    """In the stats run, the import-time functions hit while the test modules were imported belong to
    every test whose module holds an object of that module, not to whichever test happens to run first."""
    if _mutant() != "stats":
        return
    from mutmut.state import state

    global _import_hits
    _import_hits = {{n for n in state()._stats if any(n.startswith(m + ".") for m in IMPORT_TIME)}}
    state()._stats.difference_update(_import_hits)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    if _mutant() != "stats" or not _import_hits:
        return
    from mutmut.state import state

    owners = set(_imported_objects(item.module))
    state()._stats.update(n for n in _import_hits if n.rsplit(".", 1)[0] in owners)


def pytest_sessionstart(session):
    """mutmut forks each mutant's run from a process that already ran every test once: a memoised
    function (functools.cache / lru_cache) would answer from that clean run and hide its mutants."""
    _fresh_imports()
    for name, module in list(sys.modules.items()):
        if not name.startswith("redline"):
            continue
        for obj in list(vars(module).values()):
            for member in [obj, *(vars(obj).values() if isinstance(obj, type) else ())]:
                if callable(getattr(member, "cache_clear", None)):
                    member.cache_clear()


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        (drop if names & set(OUT) or item.originalname in SLOW or "subprocess" in getattr(item.obj, "__code__", type("", (), {{"co_names": ()}})).co_names
         else keep).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)
'''


def ensure_venv() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", MUTMUT], check=True)
    site = next((VENV / "lib").glob("python3*/site-packages"))
    ours = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    (site / "redline-deps.pth").write_text(f"{ours}\n")
    return VENV / "bin" / "mutmut"


def stage(targets: dict[str, list[str]]) -> None:
    if WORK.exists():
        shutil.rmtree(WORK)
    if STATE.exists():  # models built by another version of the builders would hide its mutants
        shutil.rmtree(STATE)
    ignore = shutil.ignore_patterns(".venv", ".git", "bench", "tests", "redline-runs", "__pycache__", "*.egg-info",
                                    "node_modules", ".ci")
    shutil.copytree(ROOT, WORK / "redline", ignore=ignore)
    shutil.copytree(ROOT / "tests", WORK / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    (WORK / "tests" / "inprocess.py").write_text(INPROCESS_PLUGIN)
    write_config(targets)


def write_config(targets: dict[str, list[str]]) -> None:
    tests = sorted({t for files in targets.values() for t in files if (ROOT / t).exists()})
    config = {
        "source_paths": ["redline"],
        "only_mutate": [f"redline/{m}" for m in targets],
        "pytest_add_cli_args_test_selection": tests,
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-p", "inprocess", "-q", "-x"],
        "also_copy": ["tests"],
        "timeout_multiplier": 3.0,  # a mutant that loops is cut at 6x its tests' time (default 30x)
    }
    lines = ["[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in config.items()]
    lines += ["", "[tool.pytest.ini_options]", 'testpaths = ["tests"]', 'pythonpath = ["tests"]',
              'filterwarnings = ["ignore::DeprecationWarning"]']
    (WORK / "pyproject.toml").write_text("\n".join(lines) + "\n")


def refresh_tests(targets: dict[str, list[str]]) -> None:
    """The current tests into the work folder (and its mutants' copy), with a fresh record of which tests
    run which function, so re-tested survivors meet tests written since."""
    for where in (WORK / "tests", WORK / "mutants" / "tests"):
        if where.exists():
            shutil.rmtree(where)
        shutil.copytree(ROOT / "tests", where, ignore=shutil.ignore_patterns("__pycache__"))
        (where / "inprocess.py").write_text(INPROCESS_PLUGIN)
    write_config(targets)
    (WORK / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)


def results(targets: dict[str, list[str]]) -> tuple[list[dict], list[str]]:
    """Per module figures and the names of unexplained survivors, from mutmut's meta files."""
    rows, survivors = [], []
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for module in targets:
        codes = kept.get(module, {}).get("exit_code_by_key", {})
        row = {"module": module, "measured": kept.get(module, {}).get("at"), "mutants": len(codes), "killed": 0,
               "timeouts": 0, "survived": 0, "no_tests": 0,
               "crashed": 0, "equivalent": 0}
        for name, code in codes.items():
            if name in EQUIVALENT:
                row["equivalent"] += 1
            elif code in (1, 3):
                row["killed"] += 1
            elif code in (24, 36, -24, 152):
                row["timeouts"] += 1
            elif code in (5, 33):
                row["no_tests"] += 1
                survivors.append(name)
            elif code in (-11, -6):  # the test process crashed: no verdict (see FORK_UNSAFE), not a kill
                row["crashed"] += 1
                survivors.append(name)
            else:
                row["survived"] += 1
                survivors.append(name)
        scored = row["mutants"] - row["equivalent"]
        row["score"] = round((row["killed"] + row["timeouts"]) / scored, 3) if scored else None
        rows.append(row)
    return rows, survivors


def source_hash(module: str) -> str:
    return hashlib.sha256((ROOT / module).read_bytes()).hexdigest()


def keep_results(targets: dict[str, list[str]]) -> None:
    """Merge this run's verdicts into RESULTS (with the hash of the source they were measured on), so modules
    measured in separate runs report together, and the CI modules' scores into RECORD."""
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    at = time.strftime("%Y-%m-%d %H:%M")
    for module in targets:
        meta = WORK / "mutants" / "redline" / (module + ".meta")
        if meta.exists():
            kept[module] = {"at": at, "sha256": source_hash(module),
                            "exit_code_by_key": json.loads(meta.read_text())["exit_code_by_key"]}
    RESULTS.write_text(json.dumps(kept, indent=1, sort_keys=True))
    write_record(targets)


def write_record(targets: dict[str, list[str]]) -> None:
    """RECORD's lines for the CI modules among `targets` that have verdicts (as EQUIVALENT reads them now)."""
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    for row in results({m: targets[m] for m in targets if m in CI_MODULES and kept.get(m, {}).get("sha256")})[0]:
        record[row["module"]] = {"sha256": kept[row["module"]]["sha256"], "measured": row["measured"],
                                 **{k: row[k] for k in ("mutants", "killed", "timeouts", "survived", "no_tests",
                                                        "crashed", "equivalent", "score")}}
    RECORD.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n")


def stale_modules() -> list[str]:
    """The CI modules whose source is not the one their recorded score was measured on."""
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    return [m for m in CI_MODULES if record.get(m, {}).get("sha256") != source_hash(m)]


def ci_report() -> int:
    """Every CI module's score as recorded (measured on this very source) against BAR."""
    record = json.loads(RECORD.read_text())
    below = []
    print(f"{'module':34} {'score':>6} {'mutants':>8} {'equivalent':>10}  measured")
    for module in CI_MODULES:
        row = record[module]
        print(f"{module:34} {row['score']:>6.3f} {row['mutants']:>8} {row['equivalent']:>10}  {row['measured']}")
        if row["score"] < BAR:
            below.append(module)
    if below:
        print(f"mutation: below {BAR:.0%}: {', '.join(below)}", file=sys.stderr)
    return 1 if below else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="modules to mutate (paths as in TARGETS)")
    parser.add_argument("--children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--show-survivors", action="store_true", help="print each survivor's diff")
    parser.add_argument("--report-only", action="store_true", help="read the last run's results, run nothing (the CI modules' "
                        "lines in the record are rewritten from them, as EQUIVALENT reads them now)")
    parser.add_argument("--ci", action="store_true",
                        help=f"CI's check: measure the CI modules whose source changed since {RECORD.name} was written, "
                             f"then print every CI module's score; exit 1 if one is below {BAR:.0%}")
    parser.add_argument("--survivors", action="store_true",
                        help="test only the last run's survivors of these modules again, against the tests as they "
                             "are now (the work folder of that run still holds its mutants)")
    args = parser.parse_args()
    if args.ci:
        args.only = stale_modules()
        print(f"mutation: {len(args.only)} of {len(CI_MODULES)} figure modules changed since they were measured"
              + (f": {', '.join(args.only)}" if args.only else ""))
        if not args.only:
            return ci_report()
    targets = {m: t for m, t in TARGETS.items() if not args.only or m in args.only}
    unknown = set(args.only or ()) - set(TARGETS)
    if unknown:
        parser.error(f"not a target: {', '.join(sorted(unknown))} (see TARGETS in {__file__})")
    mutmut = ensure_venv()
    env = {**os.environ, "REDLINE_SHARED_DATA": os.environ.get("REDLINE_SHARED_DATA", str(ROOT.parent / "shared" / "data")),
           "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "REDLINE_PROGRESS": "0", "REDLINE_TEST_STATE": str(STATE),
           **({"REDLINE_TEST_TORCH_THREADS": "1"} if set(targets) & set(FORK_UNSAFE) else {})}
    wall = None
    if not args.report_only:
        names: list[str] = []
        if args.survivors:
            names = results(targets)[1]
            refresh_tests(targets)
        else:
            stage(targets)
        started = time.monotonic()
        proc = subprocess.run([str(mutmut), "run", "--max-children", str(args.children), *names], cwd=WORK, env=env,
                              capture_output=True, text=True)
        wall = round(time.monotonic() - started, 1)
        if proc.returncode != 0:
            print(proc.stdout[-4000:], proc.stderr[-4000:], file=sys.stderr)
            return proc.returncode
        keep_results(targets)
    if args.report_only:
        write_record(targets)  # the verdicts as EQUIVALENT reads them now
    rows, survivors = results(targets)
    for row in rows:
        print(json.dumps(row))
    total = {k: sum(r[k] for r in rows) for k in ("mutants", "killed", "timeouts", "survived", "no_tests", "crashed",
                                                  "equivalent")}
    scored = total["mutants"] - total["equivalent"]
    total["score"] = round((total["killed"] + total["timeouts"]) / scored, 3) if scored else None
    print(json.dumps({"total": total, "wall_s": wall, "children": args.children}))
    for name in survivors:
        print(f"survived: {name}")
        if args.show_survivors:
            shown = subprocess.run([str(mutmut), "show", name], cwd=WORK, env=env, capture_output=True, text=True)
            print(shown.stdout)
    for name, why in EQUIVALENT.items():
        print(f"equivalent: {name}: {why}")
    if args.ci:
        return ci_report()
    below = [r["module"] for r in rows if r["score"] is not None and r["score"] < 0.8]
    if below:
        print(f"below 80%: {', '.join(below)}")
    return 1 if below else 0


if __name__ == "__main__":
    raise SystemExit(main())
