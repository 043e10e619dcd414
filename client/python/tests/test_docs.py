"""docs/python.md is true: its API reference is the one the docstrings generate, its quick
start runs as written against a cluster, and the plotting example writes a PNG."""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

DOC = os.path.join(REPO, "docs", "python.md")
TOOLS = os.path.join(REPO, "client", "python", "tools")


def test_api_reference_is_generated_from_the_docstrings():
    sys.path.insert(0, TOOLS)
    try:
        import api_doc
    finally:
        sys.path.remove(TOOLS)
    with open(DOC) as f:
        doc = f.read()
    begin, end = doc.index(api_doc.BEGIN), doc.index(api_doc.END) + len(api_doc.END)
    assert doc[begin:end] == api_doc.render(), (
        "docs/python.md's API reference is stale: run "
        "python client/python/tools/api_doc.py --write (with the package installed)")


def test_quick_start_runs_as_written(cluster, idle, monkeypatch, capsys):
    with open(DOC) as f:
        doc = f.read()
    section = doc[doc.index("## Quick start"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) == 5, code
    monkeypatch.setenv("BATON_COORDINATOR", cluster.address)
    monkeypatch.chdir(REPO)
    exec(compile(code, "docs/python.md (quick start)", "exec"), {})
    state, digest, loss = capsys.readouterr().out.split()
    assert state == "SUCCEEDED"
    assert digest == cluster.reference_digest(
        os.path.join(REPO, "client", "examples", "gpt.json"), steps=50)
    assert float(loss) > 0


def test_plot_example_writes_a_png(cluster, idle, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "loss.png"
    r = subprocess.run([sys.executable, os.path.join(REPO, "client", "examples", "python",
                                                     "plot_loss.py"),
                        "--coordinator", cluster.address, "--steps", "5", "--stages", "2",
                        "--no-progress", "-o", str(png)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "SUCCEEDED" in r.stdout and str(png) in r.stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000
