"""The installed package type-checks (its annotations, and the .pyi stubs generated for
baton.v1): what users' type checkers and editors read."""

import subprocess
import sys

import pytest


def test_the_package_type_checks(tmp_path):
    pytest.importorskip("mypy")
    # grpc ships no type information; everything else is checked.
    r = subprocess.run([sys.executable, "-m", "mypy", "-p", "baton", "--ignore-missing-imports",
                        "--cache-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success" in r.stdout
