#!/usr/bin/env python3
"""JSON Schemas of real tool and API models, as an independent check of schema coverage.

The public JSONSchemaBench set is what the grammar compiler was tuned on; this corpus is not.
It collects the JSON Schema of every pydantic model (and request `TypedDict`) defined in the
packages named on the command line — by default the `openai` and `anthropic` SDKs, the `mcp`
SDK and the reference MCP servers on PyPI (`mcp-server-fetch`, `-git`, `-time`), whose tool
input schemas are pydantic models — the shape of schemas that tool-calling clients and MCP
servers send. Instances: valid ones drawn by `hypothesis-jsonschema`, invalid ones made by
mutating them (a required key dropped, a value of the wrong type, an unknown key, a string
changed); every instance is labelled by python-jsonschema (Draft 2020-12, its format checker
with the `format-nongpl` extras installed, exact-decimal `multipleOf`), never by the
generator. Floats without a fraction are written as integers (see
`integral_floats_as_ints`); instances with integers past 64 bits are left out
(`fits_64_bits`).

Writes `<out>/Models.tar.gz` in JSONSchemaBench's layout; `make schema-corpus` builds it in a
virtual environment of its own and runs `jsb_coverage` over it.

    python3 scripts/model_schema_corpus.py --out /tmp/models openai anthropic mcp mcp_server_git
"""

from __future__ import annotations

import argparse
import copy
import importlib
import io
import json
import pkgutil
import random
import signal
import sys
import tarfile
import typing
import warnings
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis_jsonschema import from_schema  # noqa: E402
from jsonschema import Draft202012Validator  # noqa: E402
from pydantic import BaseModel, TypeAdapter  # noqa: E402
from schema_differential import ExactValidator  # noqa: E402

DEFAULT_PACKAGES = ["openai", "anthropic", "mcp", "mcp_server_fetch", "mcp_server_git", "mcp_server_time"]


class Timeout(Exception):
    """A schema's instance generation ran past its time."""


def _alarm(_sig: int, _frame: object) -> None:
    raise Timeout()


def modules(package: str) -> Iterator[Any]:
    """Imports `package` and every module under it, skipping those that fail to import."""
    stack = [package]
    while stack:
        name = stack.pop()
        # `__main__` modules run their program on import (the MCP servers start serving).
        if ".tests" in name or "._vendor" in name or name.endswith(".__main__"):
            continue
        try:
            module = importlib.import_module(name)
        except BaseException:  # a module may raise anything (or exit) on import
            continue
        yield module
        for info in pkgutil.iter_modules(getattr(module, "__path__", None) or []):
            stack.append(f"{name}.{info.name}")


def model_schemas(packages: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(qualified name, JSON Schema) of every model class defined in `packages`."""
    seen: set[str] = set()
    for package in packages:
        for module in modules(package):
            for name, obj in sorted(vars(module).items()):
                if not isinstance(obj, type) or getattr(obj, "__module__", None) != module.__name__:
                    continue
                qual = f"{module.__name__}.{name}"
                if qual in seen:
                    continue
                try:
                    if issubclass(obj, BaseModel):
                        if obj is BaseModel or getattr(obj, "__pydantic_generic_metadata__", {}).get("parameters"):
                            continue
                        schema = obj.model_json_schema()
                    elif typing.is_typeddict(obj):
                        schema = TypeAdapter(obj).json_schema()
                    else:
                        continue
                except Exception:
                    continue
                seen.add(qual)
                yield qual, schema


def draw_valid(schema: dict[str, Any], count: int, seconds: int) -> list[Any]:
    """Up to `count` distinct instances drawn by hypothesis-jsonschema (may be none)."""
    out: list[Any] = []
    try:
        strategy = from_schema(schema)
    except Exception:
        return out

    @settings(
        max_examples=count * 4,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
        derandomize=True,
    )
    @given(strategy)
    def collect(x: Any) -> None:
        if len(out) < count and x not in out:
            out.append(x)

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        collect()
    except Exception:
        pass
    finally:
        signal.alarm(0)
    return out


def integral_floats_as_ints(x: Any) -> Any:
    """`x` with every float that has no fraction written as an integer: hypothesis draws
    `1.79e+37` for `type: integer` (JSON Schema's integers are the numbers with a zero
    fraction), which the grammar writes, as a model would, in integer form."""
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, list):
        return [integral_floats_as_ints(v) for v in x]
    if isinstance(x, dict):
        return {k: integral_floats_as_ints(v) for k, v in x.items()}
    return x


def fits_64_bits(x: Any) -> bool:
    """Whether every integer in `x` fits 64 bits: `jsb_coverage` reads instances as
    serde_json does, past 64 bits as a float (written back with an exponent)."""
    if isinstance(x, bool):
        return True
    if isinstance(x, int):
        return -(2**63) <= x < 2**64
    if isinstance(x, list):
        return all(fits_64_bits(v) for v in x)
    if isinstance(x, dict):
        return all(fits_64_bits(v) for v in x.values())
    return True


def relabel(src: Path, out: Path) -> None:
    """Writes `src`'s schemas to `out` with their instances canonicalised and labelled
    again (after a change of validator or of its format checkers)."""
    buf = io.BytesIO()
    with tarfile.open(src) as tin, tarfile.open(fileobj=buf, mode="w:gz") as tout:
        for member in tin:
            f = tin.extractfile(member)
            if f is None:
                continue
            doc = json.load(f)
            check = ExactValidator(doc["schema"], format_checker=Draft202012Validator.FORMAT_CHECKER)
            seen: set[str] = set()
            tests = []
            for t in doc["tests"]:
                x = integral_floats_as_ints(t["data"])
                k = json.dumps(x, sort_keys=True)
                if k not in seen and fits_64_bits(x):
                    seen.add(k)
                    tests.append({"description": t["description"], "data": x, "valid": check.is_valid(x)})
            data = json.dumps({**doc, "tests": tests}).encode()
            info = tarfile.TarInfo(member.name)
            info.size = len(data)
            tout.addfile(info, io.BytesIO(data))
    out.write_bytes(buf.getvalue())


WRONG = [0, 1.5, "x", True, None, [], {}]


def mutations(x: Any, r: random.Random) -> Iterator[Any]:
    """Instances near `x`: one member dropped, replaced by another type, or one key added."""
    paths: list[list[Any]] = []

    def walk(v: Any, path: list[Any]) -> None:
        paths.append(path)
        if isinstance(v, dict):
            for k, c in v.items():
                walk(c, path + [k])
        elif isinstance(v, list):
            for i, c in enumerate(v):
                walk(c, path + [i])

    walk(x, [])
    r.shuffle(paths)
    for path in paths[:6]:
        y = copy.deepcopy(x)
        parent, node = None, y
        for step in path:
            parent, node = node, node[step]
        # Wrong type in place.
        repl = r.choice([w for w in WRONG if type(w) is not type(node)])
        if parent is None:
            yield repl
        else:
            parent[path[-1]] = repl
            yield copy.deepcopy(y)
            parent[path[-1]] = node
        if isinstance(node, dict):
            if node:
                k = r.choice(sorted(node))
                z = copy.deepcopy(y)
                target = z
                for step in path:
                    target = target[step]
                del target[k]
                yield z
            z = copy.deepcopy(y)
            target = z
            for step in path:
                target = target[step]
            target["unexpected_key"] = 1
            yield z
        if isinstance(node, str) and parent is not None:
            parent[path[-1]] = node + "~"
            yield copy.deepcopy(y)
            parent[path[-1]] = node


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packages", nargs="*", default=DEFAULT_PACKAGES, help="packages to collect models from")
    ap.add_argument("--out", type=Path, required=True, help="folder for Models.tar.gz")
    ap.add_argument("--valid", type=int, default=4, help="valid instances drawn per schema")
    ap.add_argument("--seconds", type=int, default=2, help="time to draw one schema's instances")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--shard",
        default="0/1",
        help="i/n: only every n-th schema from the i-th (run the n shards side by side)",
    )
    ap.add_argument("--relabel", type=Path, help="a corpus to canonicalise and label again, into --out")
    args = ap.parse_args()
    if args.relabel:
        args.out.mkdir(parents=True, exist_ok=True)
        relabel(args.relabel, args.out / args.relabel.name)
        return
    shard, shards = (int(x) for x in args.shard.split("/"))
    warnings.simplefilter("ignore")
    r = random.Random(args.seed)
    buf = io.BytesIO()
    written = without_valid = 0
    unique: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for qual, schema in model_schemas(args.packages or DEFAULT_PACKAGES):
            key = json.dumps(schema, sort_keys=True)
            if key in unique:
                continue
            unique.add(key)
            if len(unique) % shards != shard:
                continue
            try:
                ExactValidator.check_schema(schema)
            except Exception:
                continue
            check = ExactValidator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
            tests: list[dict[str, Any]] = []
            seen: set[str] = set()
            drawn = [integral_floats_as_ints(x) for x in draw_valid(schema, args.valid, args.seconds)]
            valid = [x for x in drawn if fits_64_bits(x) and check.is_valid(x)]
            if not valid:
                without_valid += 1
            candidates = [(x, "drawn") for x in valid]
            for x in valid[:2]:
                candidates += [(y, "mutated") for y in mutations(x, r)]
            for x, how in candidates:
                k = json.dumps(x, sort_keys=True)
                if k in seen:
                    continue
                seen.add(k)
                tests.append({"description": how, "data": x, "valid": check.is_valid(x)})
            if written % 250 == 0:
                print(f"{written} schemas…", file=sys.stderr, flush=True)
            doc = json.dumps({"description": qual, "schema": schema, "tests": tests}).encode()
            info = tarfile.TarInfo(f"Models/Models---{qual}.json")
            info.size = len(doc)
            tf.addfile(info, io.BytesIO(doc))
            written += 1
    args.out.mkdir(parents=True, exist_ok=True)
    name = "Models.tar.gz" if shards == 1 else f"Models-{shard}.tar.gz"
    (args.out / name).write_bytes(buf.getvalue())
    print(f"{written} schemas ({without_valid} without a drawn valid instance) in {args.out / name}")


if __name__ == "__main__":
    main()
