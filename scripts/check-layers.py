#!/usr/bin/env python3
"""Checks that no #include runs from a lower folder to a higher one.

Every folder has a layer; a file may include headers of its own folder and of folders on
lower layers only, so two folders on one layer (the worker and the coordinator, say) never
include each other. Test files are held to the same rule: a test that needs a higher
folder lives in that folder. Exits 1 listing every offending include; run by ctest
(`layers`) and by hand: scripts/check-layers.py [ROOT].
"""
import pathlib
import re
import sys

# Lowest first. docs/architecture.md draws the same picture.
LAYERS = [
    ["common/core"],
    ["common/schedule", "common/http"],
    ["common/spec"],
    ["common/nn", "common/comm", "common/rpc"],
    ["common/data", "common/optim", "common/nccl", "common/metrics"],
    ["common/checkpoint", "common/plan", "common/service"],
    ["common/train", "common/transport"],
    ["common/collective"],
    ["common/pipeline"],
    ["coordinator", "worker", "client"],
    ["bench", "tests"],
]
RANK = {folder: i for i, layer in enumerate(LAYERS) for folder in layer}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(path: str):
    parts = path.split("/")
    for n in (2, 1):
        key = "/".join(parts[:n])
        if key in RANK:
            return key
    return None


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    bad = []
    files = 0
    for top in ("common", "coordinator", "worker", "client", "bench", "tests"):
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in (".h", ".cc", ".cu") or "build" in f.relative_to(root).parts:
                continue
            rel = str(f.relative_to(root))
            src = folder_of(rel)
            if src is None:
                bad.append(f"{rel}: folder has no layer in scripts/check-layers.py")
                continue
            files += 1
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                dst = folder_of(m.group(1))
                if dst is None or dst == src:
                    continue  # generated protos, third-party headers, the same folder
                if RANK[dst] >= RANK[src]:
                    bad.append(f"{rel}:{n}: includes {m.group(1)} ({dst}, layer {RANK[dst]}) "
                               f"from {src} (layer {RANK[src]})")
    for b in bad:
        print(b)
    print(f"check-layers: {files} files, {len(bad)} includes that run up or sideways")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
