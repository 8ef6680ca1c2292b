//! Tool-argument schemas in the shapes tool frameworks generate — pydantic v2 (FastMCP:
//! `anyOf` with `null` for optionals, `$defs` enums and models, `set[int]`/`set[str]` as
//! `uniqueItems`, `prefixItems` tuples, discriminated unions), zod-to-json-schema (the
//! TypeScript MCP servers: `additionalProperties: false`, draft-07, `exclusiveMinimum`,
//! `$ref`s into `#/properties/...`, records, formats), GitHub-style tools and OpenAI
//! structured-output examples (nullable enums, recursive `$defs`). Every schema compiles
//! under both whitespace policies, every valid argument object is accepted (compact and
//! `json.dumps` style) and every invalid one refused. The fixtures are written by hand in
//! those shapes (`fixtures/tool_schemas.json`).

mod common;

use serde_json::Value;
use sglrs_grammar::{CompileOptions, CompiledGrammar, Whitespace};

#[test]
fn tool_schemas_in_framework_shapes_are_covered() {
    let text = include_str!("fixtures/tool_schemas.json");
    let cases: Vec<Value> = serde_json::from_str(text).unwrap();
    assert!(cases.len() >= 46);
    let compact = CompileOptions::default();
    let flexible = CompileOptions {
        whitespace: Whitespace::Flexible,
        ..CompileOptions::default()
    };
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let schema = &case["schema"];
        let gc = CompiledGrammar::json_schema_value(schema, common::byte_vocab(), &compact)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let gf = CompiledGrammar::json_schema_value(schema, common::byte_vocab(), &flexible)
            .unwrap_or_else(|e| panic!("{name} (flexible): {e}"));
        for v in case["valid"].as_array().unwrap() {
            let (c, d) = (common::compact(v), common::dumps(v));
            assert!(common::accepts_text(&gc, &c), "{name}: valid {c} refused");
            assert!(
                common::accepts_text(&gf, &d),
                "{name}: valid {d} refused (flexible)"
            );
        }
        for v in case["invalid"].as_array().unwrap() {
            let (c, d) = (common::compact(v), common::dumps(v));
            assert!(
                !common::accepts_text(&gc, &c),
                "{name}: invalid {c} accepted"
            );
            assert!(
                !common::accepts_text(&gf, &d),
                "{name}: invalid {d} accepted (flexible)"
            );
        }
    }
}
