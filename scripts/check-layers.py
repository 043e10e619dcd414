#!/usr/bin/env python3
"""Checks that nothing runs from a lower folder to a higher one: no #include, no CMake link.

Every folder has a layer; a file may include headers of its own folder and of folders on
lower layers only, so two folders on one layer (the worker and the coordinator, say) never
include each other. Test files are held to the same rule: a test that needs a higher
folder lives in that folder.

What counts as an include: `#include "..."` and `#include <...>` (the root is on -I), in
every C++ or CUDA file (.h .hpp .cc .cpp .cu .cuh .inc) under the source folders, whatever
folder they sit in below them (one named `build` included). A quoted path is looked up
beside the including file first, as the preprocessor does, so `../pipeline/x.h` is seen
for the folder it reaches; anything else is read from the root. Generated protos and
third-party headers name no folder of ours and are left alone.

The CMake side holds to the same list: a library, executable or test defined in a folder
may link only libraries defined in its own folder or on lower layers, and may compile only
sources from them. CMakeLists.txt files are read as text: add_library, add_executable,
baton_test, baton_fuzz, target_link_libraries and target_sources.

Exits 1 listing every offence; run by ctest (`layers`) and by hand:
scripts/check-layers.py [ROOT]. scripts/check_layers_test.py plants each kind of offence.
"""
import os
import pathlib
import re
import sys

# Lowest first. docs/architecture.md draws the same picture.
LAYERS = [
    ["proto"],
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
SOURCE_TOPS = ("common", "coordinator", "worker", "client", "bench", "tests")
SUFFIXES = {".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".inc"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')

# CMake commands that define a target (its name is the first argument) and where their
# libraries and sources are among the arguments.
DEFINES = {"add_library", "add_executable", "baton_test", "baton_fuzz"}
CMAKE_KEYWORDS = {"PUBLIC", "PRIVATE", "INTERFACE", "STATIC", "SHARED", "OBJECT", "MODULE",
                  "IMPORTED", "GLOBAL", "ALIAS", "EXCLUDE_FROM_ALL", "WIN32", "MACOSX_BUNDLE",
                  "LINK_PUBLIC", "LINK_PRIVATE"}
BATON_TEST_SECTIONS = {"SOURCES", "LIBS", "LABELS", "PREFIX"}
COMMAND = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_:.+-]*")


def folder_of(rel: str):
    parts = rel.split("/")
    for n in (2, 1):
        key = "/".join(parts[:n])
        if key in RANK:
            return key
    return None


def inside(root: pathlib.Path, path: str):
    """`path` relative to root, normalised, or None when it leaves the root."""
    rel = os.path.relpath(os.path.normpath(path), root)
    return None if rel.startswith("..") else rel.replace(os.sep, "/")


def include_target(root: pathlib.Path, src: pathlib.Path, bracket: str, name: str):
    """The root-relative path an include reaches, or None when it is not ours."""
    if bracket == '"':
        beside = src.parent / name
        if name.startswith(".") or beside.exists():
            return inside(root, str(beside))
    return inside(root, str(root / name))


def check_includes(root: pathlib.Path, bad: list) -> int:
    files = 0
    for top in SOURCE_TOPS:
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in SUFFIXES or not f.is_file():
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
                reached = include_target(root, f, m.group(1), m.group(2))
                dst = folder_of(reached) if reached else None
                if dst is None or dst == src:
                    continue  # generated protos, third-party headers, the same folder
                if RANK[dst] >= RANK[src]:
                    bad.append(f"{rel}:{n}: includes {m.group(2)} ({dst}, layer {RANK[dst]}) "
                               f"from {src} (layer {RANK[src]})")
    return files


def cmake_commands(text: str):
    """(line, command, arguments) of each command in a CMakeLists.txt, comments removed."""
    text = re.sub(r"#[^\n]*", "", text)
    pos = 0
    while (m := COMMAND.search(text, pos)) is not None:
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        body = text[m.end():i - 1]
        line = text.count("\n", 0, m.start()) + 1
        yield line, m.group(1), re.findall(r'"[^"]*"|[^\s"]+', body)
        pos = i


def link_and_source_args(command: str, args: list):
    """(libraries, sources) that a defining or linking command names, target name dropped."""
    rest = args[1:]
    if command == "baton_fuzz":
        return rest, []
    if command == "baton_test":
        section, libs, sources = "SOURCES", [], []
        for a in rest:
            if a in BATON_TEST_SECTIONS:
                section = a
            elif section == "LIBS":
                libs.append(a)
            elif section == "SOURCES":
                sources.append(a)
        return libs, sources
    if command == "target_link_libraries":
        return [a for a in rest if a not in CMAKE_KEYWORDS], []
    if command in ("add_library", "add_executable", "target_sources"):
        return [], [a for a in rest if a not in CMAKE_KEYWORDS]
    return [], []


def check_cmake(root: pathlib.Path, bad: list) -> int:
    lists = [root / "CMakeLists.txt", *sorted((root / "proto").rglob("CMakeLists.txt"))]
    for top in SOURCE_TOPS:
        lists += sorted((root / top).rglob("CMakeLists.txt"))
    defined = {}  # target -> folder
    uses = []  # (where, target, folder, kind, name, base dir)
    for cm in lists:
        if not cm.is_file():
            continue
        rel_dir = inside(root, str(cm.parent)) or ""
        folder = folder_of(rel_dir) if rel_dir not in ("", ".") else None
        for line, command, args in cmake_commands(cm.read_text(errors="replace")):
            if command not in DEFINES and command not in ("target_link_libraries",
                                                          "target_sources"):
                continue
            if not args:
                continue
            where = f"{cm.relative_to(root)}:{line}"
            target = args[0] if command != "baton_fuzz" else f"{args[0]}_fuzz"
            if command in DEFINES:
                if folder is None and rel_dir not in ("", "."):
                    bad.append(f"{where}: {target} is defined in {rel_dir}, a folder with no "
                               "layer in scripts/check-layers.py")
                if folder is not None:
                    defined[target] = folder
            libs, sources = link_and_source_args(command, args)
            for lib in libs:
                for name in NAME.findall(lib):  # also inside $<...:lib> expressions
                    uses.append((where, target, "links", name, cm.parent))
            for s in sources:
                if "$" not in s:
                    uses.append((where, target, "compiles", s.strip('"'), cm.parent))
    for where, target, kind, name, base in uses:
        src = defined.get(target)
        if src is None:
            continue  # a target of the top-level file, or one defined nowhere we read
        if kind == "links":
            dst = defined.get(name)
        else:
            reached = inside(root, str(base / name))
            dst = folder_of(reached) if reached else None
        if dst is None or dst == src:
            continue
        if RANK[dst] >= RANK[src]:
            bad.append(f"{where}: {target} ({src}, layer {RANK[src]}) {kind} {name} "
                       f"({dst}, layer {RANK[dst]})")
    return len(defined)


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    bad = []
    files = check_includes(root, bad)
    targets = check_cmake(root, bad)
    for b in bad:
        print(b)
    print(f"check-layers: {files} files, {targets} CMake targets, {len(bad)} includes, links "
          "or sources that run up or sideways")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
