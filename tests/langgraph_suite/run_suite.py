"""Run LangGraph's own checkpointer-parametrised tests against FencedSqliteSaver.

Reproducible from a fresh clone::

    python tests/langgraph_suite/run_suite.py            # our saver, both modes
    python tests/langgraph_suite/run_suite.py --control  # InMemorySaver + SqliteSaver
    python tests/langgraph_suite/run_suite.py --store postgres  # FencedPostgresSaver

Steps: download (or reuse a cached copy of) the sdist of the *installed*
langgraph version with `pip download`, extract its `tests/` into a build dir,
add `lgfs_checkpointer.py` as conftest glue (one line appended to LangGraph's
conftest; their test files are not touched), install what their tests import
that is missing, and run them in LangGraph's default mode and in strict mode
(`LANGGRAPH_STRICT_MSGPACK=true`). Each mode prints one line
`langgraph suite (MODE): N passed, M failed` (`(MODE, postgres)` with
`--store postgres`) and its failing test ids with the first line of each failure.

`--store postgres` runs `FencedPostgresSaver` instead, on a throwaway server
that it starts itself (`langgraph_fenced_sqlite.testing.postgres_server`: the
system's binaries, else the pgserver wheel of the dev extra), a fresh schema
per test, and stops afterwards.

A test named on a `flaky` line of `known_failures.txt` that fails is run again
alone, up to three times, and counts as passed (printed as FLAKY) if it passes
once: LangGraph's own timing-based tests, which fail now and then under load
with every checkpointer.

Exit status: 0 when every mode's failing set equals the one recorded in
`known_failures.txt` for the checkpointers run (for the default `fenced` run;
other runs have no record and must fail nothing), 1 otherwise: a new failure
is a regression, and a recorded failure that now passes must be removed from
the record, so the record stays the exact failure list.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
GLUE = HERE / "lgfs_checkpointer.py"
KNOWN = HERE / "known_failures.txt"
HOOK_LINE = "import tests._lgfs_checkpointer as _lgfs; _lgfs.install(globals())  # noqa\n"
MODES = {"default": "false", "strict": "true"}
RERUNS = 3

# What LangGraph's tests/conftest.py and the checkpointer-parametrised files import
# that langgraph itself does not depend on: module -> pip requirement.
TEST_REQUIREMENTS = {
    "syrupy": "syrupy",
    "pytest_mock": "pytest-mock",
    "redis": "redis",
    "psycopg": "psycopg[binary]",
    "psycopg_pool": "psycopg-pool",
    "langgraph.checkpoint.postgres": "langgraph-checkpoint-postgres",
    "langgraph.checkpoint.sqlite": "langgraph-checkpoint-sqlite",
    "Crypto": "pycryptodome",
}


def default_cache() -> Path:
    """Where downloaded sdists are kept between runs (`LGFS_SUITE_CACHE` overrides)."""
    env = os.environ.get("LGFS_SUITE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "langgraph-fenced-sqlite" / "langgraph-sdist"


def fetch_sdist(version: str, cache: Path) -> Path:
    """Return the cached sdist of langgraph `version`, downloading it with pip if absent."""
    sdist = cache / f"langgraph-{version}.tar.gz"
    if sdist.is_file():
        return sdist
    cache.mkdir(parents=True, exist_ok=True)
    print(f"downloading the langgraph {version} sdist into {cache}", flush=True)
    # Into a private directory, then renamed into place: two runs at once (the two
    # modes under pytest-xdist) must never read each other's half-written file.
    download = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"langgraph=={version}", "-d", str(download)],
            check=True,
        )  # fmt: skip
        if not (download / sdist.name).is_file():
            raise SystemExit(f"pip download left no {sdist.name} in {download}")
        os.replace(download / sdist.name, sdist)
    finally:
        shutil.rmtree(download, ignore_errors=True)
    return sdist


def extract_tests(sdist: Path, version: str, build: Path) -> Path:
    """Extract the sdist's `tests/` and `pyproject.toml` into a fresh `build`/root."""
    root = build / f"langgraph-{version}"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    prefix = f"langgraph-{version}/"
    with tarfile.open(sdist) as tar:
        # Only their tests and pytest config: their `langgraph/` source must not
        # shadow the installed package the saver is tested with.
        members = [
            m
            for m in tar.getmembers()
            if m.name.startswith(prefix + "tests/") or m.name == prefix + "pyproject.toml"
        ]
        for member in members:
            member.name = member.name[len(prefix) :]
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, members=members, filter="data")
        else:  # Python < 3.11.4 (no extraction filters)
            tar.extractall(root, members=members)  # noqa: S202
    conftest = root / "tests" / "conftest.py"
    text = conftest.read_text()
    for needle in ("def sync_checkpointer(", "def async_checkpointer("):
        if needle not in text:
            raise SystemExit(f"{conftest} has no {needle!r}: LangGraph changed its layout")
    conftest.write_text(text.rstrip("\n") + "\n\n\n" + HOOK_LINE)
    shutil.copyfile(GLUE, root / "tests" / "_lgfs_checkpointer.py")
    return root


def ensure_requirements(install: bool) -> None:
    """Install the test requirements that are missing (or stop, naming them)."""
    missing = []
    for module, requirement in TEST_REQUIREMENTS.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(requirement)
    if not missing:
        return
    if not install:
        raise SystemExit(f"missing test requirements: {' '.join(missing)}")
    print(f"installing LangGraph's test requirements: {' '.join(missing)}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)


def parse_junit(path: Path) -> tuple[int, dict[str, str], int]:
    """Return (passed, {failing test id: first line of its failure}, skipped)."""
    passed = skipped = 0
    failed: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        parts = classname.split(".")
        # classname is "tests.test_x" or "tests.test_x.TestClass".
        file = "/".join(parts[:2]) + ".py"
        test_id = "::".join([file, *parts[2:], name])
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failed[test_id] = message[0][:200] if message else "(no message)"
        elif case.find("skipped") is not None:
            # A module skipped whole at collection (test_remote_graph needs
            # Docker) has no classname and holds no checkpointer test.
            skipped += bool(classname)
        else:
            passed += 1
    return passed, failed, skipped


def read_known() -> tuple[dict[str, set[str]], list[re.Pattern[str]]]:
    """Read known_failures.txt: `MODE TEST_ID  # cause` lines, and `flaky PATTERN` lines."""
    known: dict[str, set[str]] = {mode: set() for mode in MODES}
    flaky: list[re.Pattern[str]] = []
    for line in KNOWN.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        kind, test_id = (part.strip() for part in line.split(None, 1))
        if kind == "flaky":
            # `*` is the only wildcard: test ids are full of `[` and `]`.
            flaky.append(re.compile(".*".join(map(re.escape, test_id.split("*"))) + r"\Z"))
        else:
            known[kind].add(test_id)
    return known, flaky


def run_pytest(
    root: Path, mode: str, args: argparse.Namespace, log: Path, targets: list[str]
) -> tuple[int, dict[str, str], int, float]:
    """Run pytest on `targets` in `mode`; return (passed, failures, skipped, seconds)."""
    # Run from a pytest-xdist worker (tests/conformance/test_langgraph_suite.py), the child must
    # not take the worker's PYTEST_XDIST_* variables for its own: it is a fresh run.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.update(
        NO_DOCKER="true",  # no Postgres/Redis here: LangGraph's own switch
        LANGGRAPH_STRICT_MSGPACK=MODES[mode],
        LGFS_SUITE_SYNC=args.sync,
        LGFS_SUITE_ASYNC=args.async_,
    )
    if args.pg_dsn:
        env["LGFS_SUITE_PG_DSN"] = args.pg_dsn
    junit = log.with_suffix(".xml")
    junit.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", *targets, "-q", "-p", "no:cacheprovider",
           "--tb=line", "-p", "no:asyncio", f"--junitxml={junit}", *args.pytest_args]  # fmt: skip
    if args.workers > 1:
        cmd += ["-n", str(args.workers)]  # needs pytest-xdist
    started = time.monotonic()
    with log.open("w") as fh:
        rc = subprocess.run(cmd, cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    took = time.monotonic() - started
    if rc not in (0, 1) or not junit.is_file():
        print(log.read_text()[-4000:])
        raise SystemExit(f"pytest ({mode}) stopped with exit code {rc}; log: {log}")
    return (*parse_junit(junit), took)


def run_mode(
    root: Path, mode: str, args: argparse.Namespace, out: Path, flaky: list[re.Pattern[str]]
) -> dict[str, str]:
    """Run LangGraph's tests in `mode`; print the counts and failures; return the failures.

    A failing test that `flaky` names is run again alone, up to `RERUNS` times;
    if it passes once it is reported as flaky and not counted as failed.
    """
    passed, failed, skipped, took = run_pytest(root, mode, args, out / f"pytest-{mode}", ["tests"])
    tail = f", {skipped} skipped" if skipped else ""
    retry = sorted(t for t in failed if any(p.match(t) for p in flaky))
    notes = []
    for attempt in range(1, RERUNS + 1):
        if not retry:
            break
        log = out / f"pytest-{mode}-rerun{attempt}"
        _, still, _, _ = run_pytest(root, mode, args, log, retry)
        for test_id in retry:
            if test_id not in still:
                cause = failed.pop(test_id)
                notes.append(f"  FLAKY, passed on rerun {attempt}: {test_id} - {cause}")
                passed += 1
        retry = [t for t in retry if t in still]
    label = mode if args.store == "sqlite" else f"{mode}, {args.store}"
    print(f"langgraph suite ({label}): {passed} passed, {len(failed)} failed{tail} in {took:.0f}s")
    print("\n".join(notes), end="\n" if notes else "")
    for test_id, cause in sorted(failed.items()):
        print(f"  FAILED {test_id} - {cause}")
    return failed


def main(argv: list[str] | None = None) -> int:
    """Run the suite; return 0 when the failures are exactly the recorded ones."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="default,strict", help="default,strict")
    parser.add_argument("--sync", default="fenced", help="sync checkpointer names")
    parser.add_argument("--async", dest="async_", default="fenced_aio", help="async names")
    parser.add_argument(
        "--control",
        action="store_true",
        help="LangGraph's own variants instead of ours (InMemorySaver, SqliteSaver)",
    )
    parser.add_argument(
        "--store",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="whose saver: FencedSqliteSaver, or FencedPostgresSaver on a server started here",
    )
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers")
    parser.add_argument("--cache-dir", type=Path, default=default_cache())
    parser.add_argument("--build-dir", type=Path, default=REPO / "build" / "langgraph-suite")
    parser.add_argument("--no-install", action="store_true", help="never pip install")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    args = parser.parse_args(argv)
    if args.control and args.store != "sqlite":
        parser.error("--control runs LangGraph's own savers; it takes no --store")
    if args.control:
        args.sync, args.async_ = "memory,sqlite,sqlite_aes", "memory,sqlite_aio"
    elif args.store == "postgres":
        args.sync, args.async_ = "fenced_pg", "fenced_pg_aio"
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= set(MODES):
        parser.error(f"--modes takes {','.join(MODES)}")

    version = importlib.metadata.version("langgraph")
    ensure_requirements(install=not args.no_install)
    sdist = fetch_sdist(version, args.cache_dir)
    root = extract_tests(sdist, version, args.build_dir)
    out = args.build_dir / "results"
    out.mkdir(parents=True, exist_ok=True)
    print(f"LangGraph {version} tests from {sdist.name}, run in {root}", flush=True)

    recorded = (args.sync, args.async_) == ("fenced", "fenced_aio") and not args.pytest_args
    known, flaky = read_known()
    ok = True
    server = None
    args.pg_dsn = None
    if args.store == "postgres":
        from langgraph_fenced_sqlite.testing.postgres_server import start_server

        server = start_server()
        args.pg_dsn = server.dsn
    try:
        for mode in modes:
            ok = check_mode(root, mode, args, out, flaky, known[mode] if recorded else set()) and ok
    finally:
        if server is not None:
            server.stop()
    return 0 if ok else 1


def check_mode(
    root: Path,
    mode: str,
    args: argparse.Namespace,
    out: Path,
    flaky: list[re.Pattern[str]],
    expected: set[str],
) -> bool:
    """Run `mode`; print what differs from the `expected` failures; return whether none does."""
    failed = set(run_mode(root, mode, args, out, flaky))
    for test_id in sorted(failed - expected):
        print(f"  NEW FAILURE ({mode}): {test_id}")
    for test_id in sorted(expected - failed):
        print(f"  NOW PASSES ({mode}), remove it from {KNOWN.name}: {test_id}")
    return failed == expected


if __name__ == "__main__":
    sys.exit(main())
