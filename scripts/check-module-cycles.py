#!/usr/bin/env python3
"""Fails when the top-level modules of a library crate depend on each other in a cycle.

For every library crate of the workspace (a `src/lib.rs`), the top-level modules are the
files and folders directly under `src/`. A module depends on another when its non-test code
names it: `crate::other…`, or `super::other…` from the module's own top-level file, or a
name the crate root re-exports from the other module (`crate::Name` where `lib.rs` has
`pub use other::Name`). Test code (everything after a `#[cfg(test)]` line in a file, files
named `tests.rs` and folders named `tests`) is not counted.

Usage: scripts/check-module-cycles.py [CRATE_DIR …]   (default: every crate of the workspace)
Exit status 1 and the cycle on stderr when one is found.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def crates() -> list[Path]:
    return sorted(p.parent.parent for p in ROOT.glob("**/src/lib.rs") if "target" not in p.parts)


def non_test_text(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    cut = text.find("#[cfg(test)]")
    text = text if cut < 0 else text[:cut]
    # Drop comments (doc links name modules without depending on them).
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def module_files(src: Path, module: str) -> list[Path]:
    files = []
    single = src / f"{module}.rs"
    if single.exists():
        files.append(single)
    folder = src / module
    if folder.is_dir():
        for f in folder.rglob("*.rs"):
            if f.name == "tests.rs" or "tests" in f.relative_to(folder).parts[:-1]:
                continue
            files.append(f)
    return files


def reexports(lib: str, modules: set[str]) -> dict[str, str]:
    """Names the crate root re-exports, mapped to the module they come from."""
    names: dict[str, str] = {}
    for m in re.finditer(r"pub use ([a-z_][a-z0-9_]*)::([^;]+);", lib):
        module, rest = m.group(1), m.group(2)
        if module not in modules:
            continue
        for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", rest):
            names.setdefault(name, module)
    return names


def deps_of(src: Path) -> dict[str, set[str]]:
    lib_path = src / "lib.rs"
    lib = non_test_text(lib_path)
    modules = {
        p.stem
        for p in src.iterdir()
        if (p.suffix == ".rs" and p.stem not in ("lib", "main", "tests"))
        or (p.is_dir() and p.name != "bin" and p.name != "tests")
    }
    names = reexports(lib, modules)
    deps: dict[str, set[str]] = {m: set() for m in modules}
    for module in modules:
        for f in module_files(src, module):
            text = non_test_text(f)
            top = f == src / f"{module}.rs" or f == src / module / "mod.rs"
            refs = re.findall(r"\bcrate::([A-Za-z_][A-Za-z0-9_]*)", text)
            if top:
                refs += re.findall(r"\bsuper::([A-Za-z_][A-Za-z0-9_]*)", text)
            # `use crate::{a::X, b}` groups
            for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
                refs += re.findall(r"(?:^|,)\s*([A-Za-z_][A-Za-z0-9_]*)", group)
            for r in refs:
                target = r if r in modules else names.get(r)
                if target and target != module:
                    deps[module].add(target)
    return deps


def find_cycle(deps: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(deps[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(deps):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def main(argv: list[str]) -> int:
    targets = [Path(a).resolve() for a in argv] or crates()
    failed = False
    for crate in targets:
        src = crate / "src"
        if not (src / "lib.rs").exists():
            continue
        cycle = find_cycle(deps_of(src))
        name = crate.relative_to(ROOT) if crate.is_relative_to(ROOT) else crate
        if cycle:
            failed = True
            print(f"{name}: module cycle {' -> '.join(cycle)}", file=sys.stderr)
        else:
            print(f"{name}: no module cycles")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
