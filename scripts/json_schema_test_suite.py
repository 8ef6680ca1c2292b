#!/usr/bin/env python3
"""Write the JSON Schema Test Suite in the layout `jsb_coverage` reads.

Each test group of `tests/DRAFT/KEYWORD.json` (and `optional/format/FORMAT.json`, as
`format-FORMAT`) becomes one `{schema, tests: [{data, valid}]}` file in `KEYWORD.tar.gz`,
so the compiler's verdicts can be checked against the suite's labels:

    python3 scripts/json_schema_test_suite.py SUITE_CHECKOUT draft2020-12 OUT_DIR
    cargo run --release -p sglrs-grammar --example jsb_coverage -- OUT_DIR --list out.tsv

(`SUITE_CHECKOUT` is a checkout of `json-schema-org/JSON-Schema-Test-Suite`.)
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any


def write_keyword(groups: list[dict[str, Any]], keyword: str, out: Path) -> int:
    """Writes one tarball for one keyword file; returns the number of groups."""
    with tarfile.open(out / f"{keyword}.tar.gz", "w:gz") as tf:
        for i, group in enumerate(groups):
            doc = {
                "description": group["description"],
                "meta": {},
                "schema": group["schema"],
                "tests": [
                    {"description": t["description"], "valid": t["valid"], "data": t["data"]}
                    for t in group["tests"]
                ],
            }
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(f"{keyword}/{keyword}---g{i:03d}.json")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return len(groups)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    suite, draft, out = Path(argv[1]), argv[2], Path(argv[3])
    root = suite / "tests" / draft
    if not root.is_dir():
        print(f"no such draft folder: {root}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    files = [(f.stem, f) for f in sorted(root.glob("*.json"))]
    files += [(f"format-{f.stem}", f) for f in sorted((root / "optional" / "format").glob("*.json"))]
    total = 0
    for keyword, path in files:
        total += write_keyword(json.loads(path.read_text()), keyword, out)
    print(f"{total} groups in {len(files)} files under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
