#!/usr/bin/env python3
"""scripts/check-layers.py against planted offences, one at a time, in a copy of the tree.

Each case plants one include or CMake line that runs up or sideways, and expects the check
to fail naming the planted file. The untouched copy must pass, and so must a copy with
includes that only look suspicious (downward through `../`, system headers).

  tests/check_layers_test.py [ROOT]
"""
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(sys.argv.pop(1) if len(sys.argv) > 1 else
                    pathlib.Path(__file__).resolve().parent.parent).resolve()
CHECK = ROOT / "scripts" / "check-layers.py"
TOPS = ("common", "coordinator", "worker", "client", "bench", "tests", "proto")
KEEP = {".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".inc"}

# (name, file to write or append to, text, whether to append). Every one is an offence.
PLANTS = [
    ("quoted include", "common/nn/planted.cc", '#include "coordinator/coordinator.h"\n', False),
    ("angle-bracket include", "common/nn/planted.cc", "#include <worker/job_run.h>\n", False),
    ("../ include", "common/optim/planted.cc", '#include "../pipeline/stage_executor.h"\n',
     False),
    (".cuh file", "common/core/planted.cuh", '#include "common/nn/model.h"\n', False),
    ("file under a folder named build", "common/core/build/planted.h",
     '#include "common/pipeline/stage_executor.h"\n', False),
    ("sideways include", "worker/planted.cc", '#include "coordinator/job_store.h"\n', False),
    ("folder with no layer", "common/unlayered/planted.h", "#pragma once\n", False),
    ("CMake link up", "common/nn/CMakeLists.txt",
     "target_link_libraries(baton_nn PRIVATE baton_pipeline)\n", True),
    ("CMake test linking up", "common/optim/CMakeLists.txt",
     "baton_test(planted_test planted_test.cc\n  LIBS baton_optim baton_worker)\n", True),
    ("CMake link in a generator expression", "common/spec/CMakeLists.txt",
     "target_link_libraries(baton_spec PUBLIC $<$<BOOL:ON>:baton_checkpoint>)\n", True),
    ("CMake link sideways", "coordinator/CMakeLists.txt",
     "target_link_libraries(baton_coordinator PRIVATE baton_worker)  # planted\n", True),
    ("CMake source from a higher folder", "common/core/CMakeLists.txt",
     "target_sources(baton_core PRIVATE ../../worker/job_run.cc)\n", True),
]

# Includes and links that are allowed and must not be reported.
ALLOWED = [
    ("common/pipeline/allowed.cc",
     '#include "../core/status.h"\n#include <vector>\n#include <common/nn/model.h>\n'
     '// #include "coordinator/coordinator.h" in a comment is no include\n'),
    ("worker/allowed.h", '#include "job_run.h"\n#include "common/pipeline/stage_executor.h"\n'),
]


def copy_tree(dst: pathlib.Path):
    shutil.copy(ROOT / "CMakeLists.txt", dst / "CMakeLists.txt")
    for top in TOPS:
        for f in (ROOT / top).rglob("*"):
            if f.is_file() and (f.suffix in KEEP or f.name == "CMakeLists.txt"):
                out = dst / f.relative_to(ROOT)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, out)


def run_check(root: pathlib.Path):
    p = subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


class CheckLayersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.clean = pathlib.Path(cls.tmp.name) / "clean"
        cls.clean.mkdir()
        copy_tree(cls.clean)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def planted_copy(self, name):
        root = pathlib.Path(self.tmp.name) / name.replace(" ", "_").replace("/", "_")
        shutil.copytree(self.clean, root)
        return root

    def test_the_tree_passes(self):
        rc, out = run_check(self.clean)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"check-layers: [1-9]\d* files, [1-9]\d* CMake targets, 0 ")

    def test_allowed_includes_pass(self):
        root = self.planted_copy("allowed")
        for path, text in ALLOWED:
            (root / path).write_text(text)
        rc, out = run_check(root)
        self.assertEqual(rc, 0, out)

    def test_each_planted_offence_is_reported(self):
        for name, path, text, append in PLANTS:
            with self.subTest(plant=name):
                root = self.planted_copy(name)
                target = root / path
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "a" if append else "w") as f:
                    f.write(text)
                rc, out = run_check(root)
                self.assertEqual(rc, 1, f"{name} not caught:\n{out}")
                offences = [l for l in out.splitlines() if not l.startswith("check-layers:")]
                self.assertEqual(len(offences), 1, out)
                self.assertIn(path, offences[0])


if __name__ == "__main__":
    unittest.main()
