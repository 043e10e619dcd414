#!/usr/bin/env python3
"""scripts/check-thread-safety.py against planted lock errors, one file at a time.

Each case writes one translation unit into a scratch source tree, with a compile database
that builds it against the real common/core/mutex.h, and expects the check to pass or fail
as the case says. Needs clang++ (scripts/setup.sh installs it).

  tests/thread_safety_check_test.py [ROOT]
"""
import json
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = pathlib.Path(sys.argv.pop(1) if len(sys.argv) > 1 else
                    pathlib.Path(__file__).resolve().parent.parent).resolve()
CHECK = ROOT / "scripts" / "check-thread-safety.py"

# A class with a guarded counter, declared in a header of the scratch tree.
HEADER = """
#include <condition_variable>
#include "common/core/mutex.h"
namespace planted {
class Counter {
 public:
  void Add();
  int Wait();
 private:
  void AddLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  baton::Mutex mu_;
  std::condition_variable changed_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};
}  // namespace planted
"""
PRELUDE = '#include "common/planted/counter.h"\nnamespace planted {\n'

CASES = {
    # name: (body of counter.cc, what the check must say; None: that it found nothing)
    "locked access passes": ("""
        void Counter::Add() { baton::MutexLock l(mu_); AddLocked(); changed_.notify_all(); }
        void Counter::AddLocked() { ++n_; }
        int Counter::Wait() {
          baton::MutexLock l(mu_);
          changed_.wait(l.native(), [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return n_ > 0; });
          return n_;
        }""", None),
    "guarded member without the lock": ("""
        void Counter::Add() { ++n_; }
        void Counter::AddLocked() { ++n_; }
        int Counter::Wait() { baton::MutexLock l(mu_); return n_; }""",
        "writing variable 'n_' requires holding mutex 'mu_'"),
    "locks-required function without the lock": ("""
        void Counter::Add() { AddLocked(); }
        void Counter::AddLocked() { ++n_; }
        int Counter::Wait() { baton::MutexLock l(mu_); return n_; }""",
        "calling function 'AddLocked' requires holding mutex 'mu_'"),
    "predicate that does not say it holds the lock": ("""
        void Counter::Add() { baton::MutexLock l(mu_); AddLocked(); }
        void Counter::AddLocked() { ++n_; }
        int Counter::Wait() {
          baton::MutexLock l(mu_);
          changed_.wait(l.native(), [this]() { return n_ > 0; });
          return n_;
        }""", "reading variable 'n_' requires holding mutex 'mu_'"),
    "the analysis turned off": ("""
        void Counter::Add() { baton::MutexLock l(mu_); AddLocked(); }
        void Counter::AddLocked() { ++n_; }
        int Counter::Wait() {
          baton::MutexLock l(mu_);
          changed_.wait(l.native(), [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return n_ > 0; });
          return n_;
        }""", "counter.cc:8: ABSL_NO_THREAD_SAFETY_ANALYSIS turns the analysis off"),
}


def run_check(root: pathlib.Path, build: pathlib.Path):
    p = subprocess.run([sys.executable, str(CHECK), str(build), "--root", str(root), "-j", "1"],
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


class ThreadSafetyCheckTest(unittest.TestCase):
    def tree(self, body: str):
        """A scratch source tree with common/planted/counter.{h,cc}, and its build dir."""
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        root = pathlib.Path(tmp.name) / "src"
        build = pathlib.Path(tmp.name) / "build"
        (root / "common" / "planted").mkdir(parents=True)
        build.mkdir()
        (root / "common" / "planted" / "counter.h").write_text(HEADER)
        source = root / "common" / "planted" / "counter.cc"
        # The .cc names no lock itself: it is checked because the header it includes does.
        source.write_text(PRELUDE + textwrap.dedent(body) + "\n}  // namespace planted\n")
        command = (f"c++ -std=c++17 -I{root} -I{ROOT} -fno-fast-math -c {source} "
                   f"-o {build / 'counter.o'}")
        (build / "compile_commands.json").write_text(
            json.dumps([{"directory": str(build), "command": command, "file": str(source)}]))
        return root, build

    def test_each_case(self):
        for name, (body, says) in CASES.items():
            with self.subTest(case=name):
                rc, out = run_check(*self.tree(body))
                self.assertIn("check-thread-safety: 1 files", out)
                self.assertEqual(rc, 0 if says is None else 1, f"{name}:\n{out}")
                if says is not None:
                    self.assertIn(says, out)

    def test_a_build_with_nothing_checked_fails(self):
        root, build = self.tree(CASES["locked access passes"][0])
        (build / "compile_commands.json").write_text("[]")
        rc, out = run_check(root, build)
        self.assertEqual(rc, 2, out)
        self.assertIn("no file", out)


if __name__ == "__main__":
    unittest.main()
