#!/usr/bin/env python3
"""clang's thread-safety analysis over the C++ translation units of a build that lock.

GCC, which builds baton, ignores the lock annotations (ABSL_GUARDED_BY,
ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...). This compiles source files of BUILD_DIR's
compile_commands.json with clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety
(parsing and analysis only: no code is generated), in parallel, and exits 1 listing what
it found. By default it checks every file that names a lock or a lock annotation, itself
or in a project header it includes directly (the files that can touch guarded state: a
class's members are private to the files implementing it); --all checks every file.
CUDA files are left out (nvcc; common/core/cuda_context.h says why).

It cannot be turned off quietly: every ABSL_NO_THREAD_SAFETY_ANALYSIS in the sources is a
finding (a predicate says that it holds the lock instead: common/core/mutex.h), and a build
in which no file was checked fails. Run by ctest (`thread_safety`) and by hand; planted
findings in tests/thread_safety_check_test.py.

  scripts/check-thread-safety.py [BUILD_DIR] [-j N] [--all] [--root SOURCE_DIR]
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

# GCC-only flags clang would warn about; -w-like noise is not what this check is for.
DROP = {"-fno-fast-math"}
LOCKING = re.compile(r"Mutex|ABSL_(GUARDED_BY|PT_GUARDED_BY|EXCLUSIVE_LOCKS_REQUIRED|"
                     r"LOCKS_EXCLUDED|LOCKABLE|SCOPED_LOCKABLE)")
OPT_OUT = re.compile(r"\bABSL_NO_THREAD_SAFETY_ANALYSIS\b")
SOURCE_TOPS = ("common", "coordinator", "worker", "client", "bench", "tests")
PROJECT_INCLUDE = re.compile(
    r'^\s*#\s*include\s*[<"]((?:common|coordinator|worker|client)/[^">]+)[">]', re.M)


def locks(root, rel):
    """Whether `rel` or a project header it includes directly names a lock."""
    text = (root / rel).read_text(errors="replace")
    if LOCKING.search(text):
        return True
    for inc in PROJECT_INCLUDE.findall(text):
        header = root / inc
        if header.exists() and LOCKING.search(header.read_text(errors="replace")):
            return True
    return False


def opt_outs(root):
    """`file:line` of each ABSL_NO_THREAD_SAFETY_ANALYSIS outside comments."""
    found = []
    for top in SOURCE_TOPS:
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in (".h", ".cc", ".cu", ".cuh") or not f.is_file():
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if OPT_OUT.search(line.split("//", 1)[0]):
                    found.append(f"{f.relative_to(root)}:{n}")
    return found


def clang_command(entry, clang):
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = [clang]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a in DROP:
            continue
        out.append(a)
    out += ["-fsyntax-only", "-Wno-everything", "-Wthread-safety", "-Werror=thread-safety"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir", nargs="?", default="build")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--clang", default=os.environ.get("BATON_CLANG", "clang++"))
    ap.add_argument("--all", action="store_true", help="every file, not only those that lock")
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent),
                    help="the source tree (default: this script's)")
    opts = ap.parse_args()
    db = pathlib.Path(opts.build_dir) / "compile_commands.json"
    if not db.exists():
        print(f"check-thread-safety: {db} not found (configure the build first)", file=sys.stderr)
        return 2
    root = pathlib.Path(opts.root).resolve()
    entries = {}  # one compile per file (a file built into two targets is checked once)
    for e in json.loads(db.read_text()):
        f = pathlib.Path(e["file"])
        if not f.is_absolute():
            f = pathlib.Path(e["directory"]) / f
        try:
            rel = f.resolve().relative_to(root)
        except ValueError:
            continue  # generated sources live in the build directory
        if rel.suffix != ".cc" or rel.parts[0] not in SOURCE_TOPS:
            continue
        if opts.all or locks(root, rel):
            entries.setdefault(str(rel), e)
    start = time.monotonic()

    def run(item):
        rel, e = item
        p = subprocess.run(clang_command(e, opts.clang), cwd=e["directory"],
                           capture_output=True, text=True)
        return rel, p.returncode, p.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=opts.j) as pool:
        for rel, rc, err in pool.map(run, sorted(entries.items())):
            if rc != 0:
                failed += 1
                print(f"--- {rel}\n{err}", end="")
    skipped = opt_outs(root)
    for where in skipped:
        print(f"--- {where}: ABSL_NO_THREAD_SAFETY_ANALYSIS turns the analysis off; say that "
              "the lock is held instead (common/core/mutex.h)")
    print(f"check-thread-safety: {len(entries)} files, {failed} with findings, "
          f"{len(skipped)} opt-outs, {time.monotonic() - start:.0f} s")
    if not entries:
        print(f"check-thread-safety: no file of {db} was checked", file=sys.stderr)
        return 2
    return 1 if failed or skipped else 0


if __name__ == "__main__":
    sys.exit(main())
