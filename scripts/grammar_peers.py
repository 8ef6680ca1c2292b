#!/usr/bin/env python3
"""Runs llguidance or xgrammar over JSONSchemaBench the way `sglrs bench grammar` runs sglrs.

Same data layout (a folder of `<Subset>.tar.gz`, one `{"schema", "tests"}` member per schema),
same selection (the first N members of each subset by name), same tokenizer file, same
serialisations (compact under the compact whitespace policy, `json.dumps` style under the
flexible one), same counting: a schema is covered when it compiles, every valid instance is
accepted token by token with EOS allowed at the end under both policies, and every invalid one
is rejected. Compile time is the compact compile; mask time is `fill_next_token_bitmask`
before every token while following the valid instances (compact). Single thread.

Run each engine in its own process (the venv of `../shared/peers/README.md`):

    /tmp/grammarpeers/bin/python scripts/grammar_peers.py --engine llguidance \
        --data ../shared/jsonschemabench/public \
        --tokenizer ../shared/tokenizers/llama3-128k/tokenizer.json --per-subset 40 --json

With `--json` the last line is `{"engine", "overall": S, "subsets": {name: S}}`, S in the
shape of `sglrs bench grammar --json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tarfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

# Keep the peers single-threaded, as the issue measures them.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

EOS_NAMES = ["<|end_of_text|>", "</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>"]


@dataclass
class Stats:
    schemas: int = 0
    compiled: int = 0
    covered: int = 0
    valid_rejected: int = 0
    invalid_accepted: int = 0
    compile_ms: list[float] = field(default_factory=list)
    mask_us: list[float] = field(default_factory=list)

    def add(self, o: "Stats") -> None:
        self.schemas += o.schemas
        self.compiled += o.compiled
        self.covered += o.covered
        self.valid_rejected += o.valid_rejected
        self.invalid_accepted += o.invalid_accepted
        self.compile_ms += o.compile_ms
        self.mask_us += o.mask_us

    def to_json(self) -> dict[str, Any]:
        def pct(v: list[float], q: float) -> float:
            if not v:
                return 0.0
            s = sorted(v)
            return s[min(len(s) - 1, int(q * len(s)))]

        return {
            "schemas": self.schemas,
            "compiled": self.compiled,
            "covered": self.covered,
            "valid_rejected": self.valid_rejected,
            "invalid_accepted": self.invalid_accepted,
            "compile_ms": {
                "p50": pct(self.compile_ms, 0.5),
                "p90": pct(self.compile_ms, 0.9),
                "max": max(self.compile_ms, default=0.0),
            },
            "mask_us": {
                "p50": pct(self.mask_us, 0.5),
                "p90": pct(self.mask_us, 0.9),
                "p99": pct(self.mask_us, 0.99),
                "mean": statistics.fmean(self.mask_us) if self.mask_us else 0.0,
            },
        }

    def line(self, name: str) -> str:
        j = self.to_json()
        pc = lambda x: 100.0 * x / self.schemas if self.schemas else 0.0  # noqa: E731
        return (
            f"{name:24} {self.schemas:5} schemas  compiled {pc(self.compiled):5.1f}%  "
            f"covered {pc(self.covered):5.1f}%  valid-rejected {self.valid_rejected:4}  "
            f"invalid-accepted {self.invalid_accepted:4}  compile ms p50 {j['compile_ms']['p50']:7.2f} "
            f"p90 {j['compile_ms']['p90']:7.2f} max {j['compile_ms']['max']:8.1f}  mask µs p50 "
            f"{j['mask_us']['p50']:6.1f} p90 {j['mask_us']['p90']:6.1f} p99 {j['mask_us']['p99']:7.1f} "
            f"mean {j['mask_us']['mean']:6.1f}"
        )


def read_subset(path: str) -> Iterator[tuple[str, Any, list[tuple[bool, Any]]]]:
    with tarfile.open(path) as tar:
        members = sorted((m for m in tar.getmembers() if m.name.endswith(".json")), key=lambda m: m.name)
        for m in members:
            f = tar.extractfile(m)
            if f is None:
                continue
            d = json.load(f)
            tests = [(bool(t.get("valid", False)), t.get("data")) for t in d.get("tests", [])]
            yield m.name, d.get("schema"), tests


class Engine:
    """One grammar engine: compile(schema_text, flexible) -> handle; follow(handle, ids, times) -> bool."""

    vocab_size: int
    eos: int

    def compile(self, schema: str, flexible: bool) -> Any:
        raise NotImplementedError

    def follow(self, g: Any, ids: list[int], times: Optional[list[float]]) -> bool:
        raise NotImplementedError


class LLGuidance(Engine):
    def __init__(self, tokenizer: str, eos: int) -> None:
        import llguidance  # type: ignore
        import llguidance.numpy  # type: ignore

        self.ll = llguidance
        self.np = llguidance.numpy
        self.tok = llguidance.LLTokenizer(tokenizer)
        self.vocab_size = self.tok.vocab_size
        self.eos = eos

    def compile(self, schema: str, flexible: bool) -> Any:
        grm = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": flexible}
        )
        m = self.ll.LLMatcher(self.tok, grm, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return grm

    def follow(self, grm: Any, ids: list[int], times: Optional[list[float]]) -> bool:
        m = self.ll.LLMatcher(self.tok, grm, log_level=0)
        mask = self.np.allocate_token_bitmask(1, self.vocab_size)
        for t in ids + [self.eos]:
            if times is not None:
                t0 = time.perf_counter()
                self.np.fill_next_token_bitmask(m, mask, 0)
                times.append((time.perf_counter() - t0) * 1e6)
                if not (int(mask[0, t // 32]) >> (t % 32)) & 1:
                    return False
            if t == self.eos:
                return m.is_accepting() and not m.is_error()
            if not m.consume_token(t) or m.is_error():
                return False
        return False


class XGrammar(Engine):
    def __init__(self, tokenizer: str, eos: int, eos_name: str, strict: bool) -> None:
        self.strict = strict
        import xgrammar as xgr  # type: ignore
        from transformers import PreTrainedTokenizerFast  # type: ignore

        self.xgr = xgr
        hf = PreTrainedTokenizerFast(tokenizer_file=tokenizer, eos_token=eos_name)
        self.vocab_size = len(hf)
        self.info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=self.vocab_size, stop_token_ids=[eos])
        self.comp = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.eos = eos

    def compile(self, schema: str, flexible: bool) -> Any:
        # Compact: no whitespace at all (xgrammar's default without any_whitespace is ", " / ": ").
        # strict_mode=False keeps JSON Schema's meaning of an absent additionalProperties, as
        # `sglrs bench grammar` compiles it; --xgrammar-strict measures its default instead.
        if flexible:
            return self.comp.compile_json_schema(schema, any_whitespace=True, strict_mode=self.strict)
        return self.comp.compile_json_schema(
            schema, any_whitespace=False, separators=(",", ":"), strict_mode=self.strict
        )

    def follow(self, g: Any, ids: list[int], times: Optional[list[float]]) -> bool:
        m = self.xgr.GrammarMatcher(g)
        mask = self.xgr.allocate_token_bitmask(1, self.vocab_size)
        for t in ids + [self.eos]:
            if times is not None:
                t0 = time.perf_counter()
                m.fill_next_token_bitmask(mask)
                times.append((time.perf_counter() - t0) * 1e6)
                if not (int(mask[0, t // 32]) >> (t % 32)) & 1:
                    return False
            if not m.accept_token(t):
                return False
        return m.is_terminated()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["llguidance", "xgrammar"], required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--per-subset", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--xgrammar-strict", action="store_true", help="xgrammar's default strict_mode")
    args = ap.parse_args()

    from tokenizers import Tokenizer  # type: ignore

    hf_tok = Tokenizer.from_file(args.tokenizer)
    eos_name = next((n for n in EOS_NAMES if hf_tok.token_to_id(n) is not None), None)
    if eos_name is None:
        print("no EOS token found in the tokenizer", file=sys.stderr)
        return 2
    eos = hf_tok.token_to_id(eos_name)
    eng: Engine = LLGuidance(args.tokenizer, eos) if args.engine == "llguidance" else XGrammar(
        args.tokenizer, eos, eos_name, args.xgrammar_strict
    )
    encode: Callable[[str], list[int]] = lambda s: hf_tok.encode(s, add_special_tokens=False).ids  # noqa: E731

    files = sorted(f for f in os.listdir(args.data) if f.endswith(".tar.gz"))
    if not files:
        print(f"no .tar.gz files in {args.data}", file=sys.stderr)
        return 2
    print(f"{args.engine}: {len(files)} subsets, tokenizer {args.tokenizer} ({eng.vocab_size} tokens), per-subset {args.per_subset}")
    overall = Stats()
    subsets: dict[str, Any] = {}
    for f in files:
        name = f[: -len(".tar.gz")]
        st = Stats()
        for i, (_member, schema, tests) in enumerate(read_subset(os.path.join(args.data, f))):
            if args.per_subset is not None and i >= args.per_subset:
                break
            st.schemas += 1
            text = json.dumps(schema)
            try:
                t0 = time.perf_counter()
                gc = eng.compile(text, False)
                ms = (time.perf_counter() - t0) * 1e3
                gf = eng.compile(text, True)
            except Exception:  # a refusal: the engine does not support the schema
                continue
            st.compiled += 1
            st.compile_ms.append(ms)
            ok = True
            for valid, data in tests:
                compact = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
                flex = json.dumps(data, ensure_ascii=False)
                try:
                    ac = eng.follow(gc, encode(compact), st.mask_us if valid else None)
                    af = eng.follow(gf, encode(flex), None)
                except Exception:
                    ac = af = False
                for acc in (ac, af):
                    if acc != valid:
                        ok = False
                        if valid:
                            st.valid_rejected += 1
                        else:
                            st.invalid_accepted += 1
            st.covered += int(ok)
        print(st.line(name), flush=True)
        subsets[name] = st.to_json()
        overall.add(st)
    print(overall.line("overall"))
    if args.json:
        print(json.dumps({"engine": args.engine, "overall": overall.to_json(), "subsets": subsets}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
