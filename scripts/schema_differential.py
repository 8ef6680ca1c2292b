#!/usr/bin/env python3
"""Random JSON Schemas checked against python-jsonschema: the grammar must never accept an
instance the reference validator rejects.

Writes `<out>/Fuzz.tar.gz` in JSONSchemaBench's layout (one `{"schema", "tests"}` member per
schema), labelled by `jsonschema`'s Draft 2020-12 validator with its format checker, then
`make schema-diff` runs the grammar's `jsb_coverage` over it and fails on any "invalid
accepted" verdict. Valid instances the grammar rejects are expected (its documented stricter
choices: no exponent under numeric bounds, no `1.0` for an integer, formats it enforces that
the reference only annotates), and so are refusals; what this hunts is unsoundness.

Schemas mix every keyword family the compiler handles (numeric bounds of every size and
exclusivity, `multipleOf`, string lengths and patterns, tuples, `contains`, `uniqueItems`,
properties with `required` / `additionalProperties` / `patternProperties` /
`propertyNames` / `dependentRequired` / `dependentSchemas` / `unevaluated*`, the
combinators, `if` / `then` / `else`, `enum` / `const`, recursive `$ref`), nested up to four
levels; instances are drawn mostly from values near what the schema names.

`multipleOf` is labelled in exact decimal arithmetic: python-jsonschema divides floats, so
`0.6` is "not a multiple of 0.1" and 9007199254740992 "is a multiple of 1.5" there.

    python3 scripts/schema_differential.py --seed 1 --count 3000 --out /tmp/schema-diff
"""

from __future__ import annotations

import argparse
import io
import json
import random
import tarfile
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

Schema = dict[str, Any]

NUMBERS: list[int | float] = [
    0, 1, -1, 2, 3, 5, 7, 10, 100, -100, 0.5, -0.5, 2.5, 3.75, 12.25, 0.1, 0.01, 1e-3,
    1e6, 1.5e15, 1e16, 9007199254740991, 1e20, -1e20,
]
STRINGS: list[str] = [
    "", "a", "ab", "abc", "abcd", "aab", "ababab", "x", "xy", "xa", "b", "ba", "AB", "12",
    "123", "zzzzzzzzz", "2024-02-29", "2023-02-29", "1.2.3.4", "256.1.1.1",
    "123e4567-e89b-12d3-a456-426614174000", "é", "aé", "😀", "a😀b", "\u0000", "\"", "\\",
    "a\nb", "\t", "ÿÿÿ", "日本語", "/", "</", "\u2028", "\ud7ff", "\ue000x",
]
PATTERNS: list[str] = [
    "^a", "b$", "^[a-c]+$", "x|y", "^\\d{2,3}$", "[A-Z]", "^$", "(ab)+", "^.{3}$", "^[^a]*$",
    "é", "^.$", "^[\\u00e0-\\u00ff]+$", "\\s", "^\\w+$", "^\\S{2}$",
]


def exact_multiple_of(validator: Any, divisor: Any, instance: Any, schema: Schema) -> Iterator[ValidationError]:
    """`multipleOf` on the numbers' decimal spellings (what the grammar reads), not floats."""
    if not validator.is_type(instance, "number"):
        return
    q = Fraction(repr(instance)) / Fraction(repr(divisor))
    if q.denominator != 1:
        yield ValidationError(f"{instance!r} is not a multiple of {divisor!r}")


ExactValidator = validators.extend(Draft202012Validator, {"multipleOf": exact_multiple_of})


class Gen:
    """Random schemas and instances from one seed."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        # Key schemas draw from a stream of their own, so adding forms here leaves every
        # other schema of a seed as it was.
        self.kr = random.Random(seed * 7919 + 1)

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def num(self) -> int | float:
        return self.r.choice(NUMBERS)

    def key_schema(self, depth: int = 0) -> Schema:
        """A `propertyNames` schema: a pattern, length or enum, or `anyOf` / `oneOf` /
        `not` over them, beside branches no key matches."""
        r = self.kr
        if depth == 0 and r.random() < 0.4:
            return {"pattern": "^[a-c]$"}
        if depth < 2 and r.random() < 0.5:
            kw = r.choice(["anyOf", "oneOf", "not"])
            if kw == "not":
                return {"not": self.key_schema(depth + 1)}
            return {kw: [self.key_schema(depth + 1) for _ in range(r.randint(2, 3))]}
        leaf: Schema = {}
        for _ in range(r.randint(1, 2)):
            k = r.choice(["pattern", "length", "enum", "const", "type"])
            if k == "pattern":
                leaf["pattern"] = r.choice(["^[a-c]$", "^x", "[0-9]", "^[a-z]+$", "e$"])
            elif k == "length":
                lo = r.randint(0, 2)
                leaf["minLength"] = lo
                if r.random() < 0.5:
                    leaf["maxLength"] = lo + r.randint(0, 2)
            elif k == "enum":
                leaf["enum"] = r.sample(["a", "b", "q", "x1", "z", 1], r.randint(1, 3))
            elif k == "const":
                leaf["const"] = r.choice(["a", "z", "x1"])
            else:
                leaf["type"] = r.choice(["string", "number", ["string", "null"]])
        return leaf

    def schema(self, depth: int = 0) -> Schema:
        kinds = ["integer", "number", "string", "boolean", "null", "enum"]
        if depth < 3:
            kinds += ["array", "object", "const", "anyOf", "oneOf", "allOf", "not", "if", "multi"]
        kind = self.r.choice(kinds)
        s: Schema = {}
        if kind in ("integer", "number"):
            s["type"] = kind
            for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                if self.chance(0.3):
                    s[k] = self.num()
            if self.chance(0.25):
                s["multipleOf"] = self.r.choice([2, 3, 5, 7, 0.5, 0.25, 0.125, 0.1, 1.5, 0.01])
        elif kind == "string":
            s["type"] = "string"
            if self.chance(0.3):
                s["minLength"] = self.r.randint(0, 5)
            if self.chance(0.3):
                s["maxLength"] = self.r.randint(0, 8)
            if self.chance(0.3):
                s["pattern"] = self.r.choice(PATTERNS)
            if self.chance(0.05):
                s["format"] = self.r.choice(["date", "uuid", "ipv4"])
            if self.chance(0.15):
                if self.chance(0.5):
                    s["const"] = "ab"
                else:
                    s["enum"] = ["ab", "c", "", "abc"]
        elif kind == "array":
            s["type"] = "array"
            if self.chance(0.7):
                s["items"] = self.schema(depth + 1)
            if self.chance(0.2):
                s["prefixItems"] = [self.schema(depth + 1) for _ in range(self.r.randint(1, 2))]
            if self.chance(0.3):
                s["minItems"] = self.r.randint(0, 3)
            if self.chance(0.3):
                s["maxItems"] = self.r.randint(0, 4)
            if self.chance(0.2):
                s["uniqueItems"] = True
            if self.chance(0.15):
                s["contains"] = self.schema(depth + 1)
                if self.chance(0.5):
                    s["minContains"] = self.r.randint(0, 2)
                if self.chance(0.3):
                    s["maxContains"] = self.r.randint(1, 3)
            if self.chance(0.1):
                s["unevaluatedItems"] = False if self.chance(0.5) else self.schema(depth + 1)
        elif kind == "object":
            s["type"] = "object"
            names = self.r.sample(["a", "b", "c", "d", "e"], self.r.randint(0, 4))
            s["properties"] = {n: self.schema(depth + 1) for n in names}
            if names and self.chance(0.6):
                s["required"] = self.r.sample(names, self.r.randint(1, len(names)))
            r = self.r.random()
            if r < 0.3:
                s["additionalProperties"] = False
            elif r < 0.45:
                s["additionalProperties"] = self.schema(depth + 1)
            if self.chance(0.15):
                s["patternProperties"] = {"^x": self.schema(depth + 1)}
            if self.chance(0.15):
                s["minProperties"] = self.r.randint(0, 3)
            if self.chance(0.15):
                s["maxProperties"] = self.r.randint(0, 3)
            if self.chance(0.1):
                s["propertyNames"] = self.key_schema()
            if names and self.chance(0.1):
                s["dependentRequired"] = {names[0]: ["z"]}
            if names and self.chance(0.1):
                s["dependentSchemas"] = {names[0]: self.schema(depth + 1)}
            if self.chance(0.1):
                s["allOf"] = [{"properties": {"q": self.schema(depth + 1)}}]
            if self.chance(0.1):
                s["unevaluatedProperties"] = False if self.chance(0.5) else self.schema(depth + 1)
        elif kind == "boolean":
            s["type"] = "boolean"
        elif kind == "null":
            s["type"] = "null"
        elif kind == "enum":
            pool: list[Any] = [1, 2.5, "a", "b", None, True, [1], {"k": 1}, 0, -1, ""]
            s["enum"] = self.r.sample(pool, self.r.randint(1, 4))
        elif kind == "const":
            s["const"] = self.r.choice([1, "x", None, [1, 2], {"a": 1}, 0.5, False])
        elif kind in ("anyOf", "oneOf", "allOf"):
            s[kind] = [self.schema(depth + 1) for _ in range(self.r.randint(1, 3))]
        elif kind == "not":
            s = self.schema(depth + 1)
            s["not"] = self.schema(depth + 1)
        elif kind == "if":
            s["if"] = self.schema(depth + 1)
            s["then"] = self.schema(depth + 1)
            if self.chance(0.5):
                s["else"] = self.schema(depth + 1)
        else:
            types = ["integer", "string", "null", "number", "boolean", "array", "object"]
            s["type"] = self.r.sample(types, self.r.randint(2, 3))
            if self.chance(0.5):
                s["minimum"] = self.num()
            if self.chance(0.5):
                s["maxLength"] = self.r.randint(0, 4)
        return s

    def top(self) -> Schema:
        if self.chance(0.1):
            node = {
                "type": "object",
                "properties": {
                    "v": self.schema(2),
                    "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["v"],
            }
            return {"$defs": {"node": node}, "$ref": "#/$defs/node"}
        return self.schema()

    def value(self, s: Schema, depth: int = 0) -> Any:
        """Mostly a value shaped by `s` (near its bounds and names), sometimes anything."""
        if depth > 4 or self.chance(0.15):
            return self.r.choice([0, 1, -1, 2.5, "a", "ab", "", None, True, False, [], {}, [1, "a"],
                                  {"a": 1}, 1e20, 10**20, 2**53, 0.1, "abc", "2024-01-01"])
        if "$ref" in s and "$defs" in s:
            node = s["$defs"]["node"]
            kids: list[Any] = [] if self.chance(0.5) else [{"v": 1}]
            return {"v": self.value(node["properties"]["v"], depth + 1), "kids": kids}
        if "const" in s:
            return s["const"]
        if "enum" in s:
            return self.r.choice(s["enum"])
        for k in ("anyOf", "oneOf", "allOf"):
            if k in s:
                return self.value(self.r.choice(s[k]), depth + 1)
        if "if" in s:
            return self.value(self.r.choice([s["if"], s["then"]]), depth + 1)
        t = s.get("type")
        if isinstance(t, list):
            t = self.r.choice(t)
        if t in ("integer", "number"):
            named = [s[k] for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
                     if isinstance(s.get(k), (int, float))]
            v: Any = self.r.choice(named) if named and self.chance(0.7) else self.num()
            v = v + self.r.choice([0, 0, 1, -1, 0.5, -0.5, 0.25])
            if t == "integer" or self.chance(0.3):
                v = int(v)
            return v
        if t == "string":
            return self.r.choice(STRINGS)
        if t == "array":
            out = []
            prefix = s.get("prefixItems", [])
            for i in range(self.r.randint(0, 4)):
                sub = prefix[i] if i < len(prefix) else (s.get("items") or {})
                if "contains" in s and self.chance(0.4):
                    sub = s["contains"]
                out.append(self.value(sub, depth + 1))
            if out and self.chance(0.2):
                out.append(out[0])
            return out
        if t == "object":
            o: dict[str, Any] = {}
            for k, sub in s.get("properties", {}).items():
                if k in s.get("required", []) or self.chance(0.6):
                    o[k] = self.value(sub, depth + 1)
            if self.chance(0.2):
                extra = s.get("additionalProperties")
                o[self.r.choice(["z", "x1", "q"])] = self.value(extra if isinstance(extra, dict) else {}, depth + 1)
            return o
        if t == "boolean":
            return self.r.choice([True, False])
        if t == "null":
            return None
        return self.r.choice([1, "a", None, True, [], {}])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=3000, help="schemas to draw")
    ap.add_argument("--instances", type=int, default=12, help="instances drawn per schema")
    ap.add_argument("--out", type=Path, required=True, help="folder for Fuzz.tar.gz")
    args = ap.parse_args()
    gen = Gen(args.seed)
    buf = io.BytesIO()
    written = 0
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for i in range(args.count):
            schema = gen.top()
            try:
                ExactValidator.check_schema(schema)
            except Exception:
                continue
            check = ExactValidator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
            tests, seen = [], set()
            for _ in range(args.instances):
                x = gen.value(schema)
                key = json.dumps(x)
                if key in seen:
                    continue
                seen.add(key)
                tests.append({"description": "drawn", "data": x, "valid": check.is_valid(x)})
            doc = json.dumps({"description": f"seed {args.seed} #{i}", "schema": schema, "tests": tests}).encode()
            info = tarfile.TarInfo(f"Fuzz/Fuzz---s{args.seed}-{i}.json")
            info.size = len(doc)
            tf.addfile(info, io.BytesIO(doc))
            written += 1
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "Fuzz.tar.gz").write_bytes(buf.getvalue())
    print(f"{written} schemas in {args.out / 'Fuzz.tar.gz'}")


if __name__ == "__main__":
    main()
