//! References to the draft-04/06/07 meta-schemas by URL
//! (`"$ref": "http://json-schema.org/draft-04/schema#/definitions/positiveInteger"`), resolved
//! against copies bundled with the compiler (`json/meta/`): the schema is rewritten with each
//! meta-schema it names under `$defs` of its root and those references pointing there, the
//! meta-schema's own references (`#`, `#/definitions/…`) rebased onto its new place. Nothing is
//! fetched; other remote references are still refused by `resolve`.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// The bundled meta-schemas: (URI without scheme or fragment, text).
const META: [(&str, &str); 3] = [
    (
        "json-schema.org/draft-04/schema",
        include_str!("meta/draft-04.json"),
    ),
    (
        "json-schema.org/draft-06/schema",
        include_str!("meta/draft-06.json"),
    ),
    (
        "json-schema.org/draft-07/schema",
        include_str!("meta/draft-07.json"),
    ),
];

/// Most `$ref`s looked at (a bound on the walk of a huge schema with none to rewrite).
const MAX_WALK: usize = 1 << 20;

/// Which bundled meta-schema `uri` (a `$ref` without its fragment) names, if any.
fn meta_index(uri: &str) -> Option<usize> {
    let bare = uri
        .strip_prefix("http://")
        .or_else(|| uri.strip_prefix("https://"))?;
    META.iter().position(|(u, _)| *u == bare)
}

/// Where meta-schema `i` goes in the bundled schema: `$defs/<key>` of the root.
fn defs_key(i: usize) -> String {
    format!("sglrs-bundled-{}", &META[i].0[16..24])
}

/// How to walk into the value under `key` of an object: `None` to skip it (data, not
/// schemas: `enum`, `const`, `default`, `examples` of a schema), else whether it is a map of
/// names to schemas (`properties` and the like), whose keys are names, not keywords.
fn child(in_name_map: bool, key: &str) -> Option<bool> {
    if in_name_map {
        return Some(false);
    }
    match key {
        "enum" | "const" | "default" | "examples" => None,
        "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas"
        | "dependencies" => Some(true),
        _ => Some(false),
    }
}

/// Calls `f` on every `$ref` of `v` (not on data that happens to hold one: [`child`]).
fn refs_mut(v: &mut Value, f: &mut dyn FnMut(&mut String), budget: &mut usize) {
    let mut stack = vec![(v, false)];
    while let Some((v, in_map)) = stack.pop() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        match v {
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    match x {
                        Value::String(s) if k == "$ref" && !in_map => f(s),
                        Value::Object(_) | Value::Array(_) => {
                            if let Some(is_map) = child(in_map, k) {
                                stack.push((x, is_map));
                            }
                        }
                        _ => {}
                    }
                }
            }
            Value::Array(a) => stack.extend(a.iter_mut().map(|x| (x, false))),
            _ => {}
        }
    }
}

/// The meta-schemas `schema` references by URL (indexes into [`META`]), not counting one
/// that is the root itself (its `$id`/`id` is the meta-schema's URI).
fn referenced(schema: &Value) -> Vec<usize> {
    let root_id = schema
        .get("$id")
        .or_else(|| schema.get("id"))
        .and_then(Value::as_str)
        .map(|s| s.trim_end_matches('#').to_string());
    let mut found = Vec::new();
    let mut stack = vec![(schema, false)];
    let mut budget = MAX_WALK;
    while let Some((v, in_map)) = stack.pop() {
        if budget == 0 {
            break;
        }
        budget -= 1;
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    match x {
                        Value::String(s) if k == "$ref" && !in_map => {
                            let uri = &s[..s.find('#').unwrap_or(s.len())];
                            if root_id.as_deref() == Some(uri) {
                                continue;
                            }
                            if let Some(i) = meta_index(uri) {
                                if !found.contains(&i) {
                                    found.push(i);
                                }
                            }
                        }
                        Value::Object(_) | Value::Array(_) => {
                            if let Some(is_map) = child(in_map, k) {
                                stack.push((x, is_map));
                            }
                        }
                        _ => {}
                    }
                }
            }
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, false))),
            _ => {}
        }
    }
    found
}

/// `schema` with the meta-schemas it references by URL bundled (see the module docs);
/// borrowed when it references none (almost always).
pub(super) fn bundle_meta_schemas(schema: &Value) -> Cow<'_, Value> {
    let found = referenced(schema);
    if found.is_empty() || !schema.is_object() {
        return Cow::Borrowed(schema);
    }
    let mut out = schema.clone();
    let mut budget = MAX_WALK;
    // The schema's own references to a meta-schema point into its bundled copy.
    refs_mut(
        &mut out,
        &mut |r: &mut String| {
            let (uri, frag) = r.split_at(r.find('#').unwrap_or(r.len()));
            if let Some(i) = meta_index(uri).filter(|i| found.contains(i)) {
                let frag = frag.strip_prefix('#').unwrap_or("");
                *r = format!("#/$defs/{}{frag}", defs_key(i));
            }
        },
        &mut budget,
    );
    let Value::Object(root) = &mut out else {
        return Cow::Borrowed(schema);
    };
    let defs = root
        .entry("$defs")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(defs) = defs else {
        // A `$defs` that is not an object: the schema is invalid anyway; leave it as it was
        // for the compiler to say so.
        return Cow::Borrowed(schema);
    };
    for &i in &found {
        let Ok(Value::Object(mut meta)) = serde_json::from_str::<Value>(META[i].1) else {
            continue;
        };
        // Not a resource of its own any more: its references are rebased below.
        for k in ["$schema", "$id", "id"] {
            meta.remove(k);
        }
        let key = defs_key(i);
        let mut meta = Value::Object(meta);
        let mut budget = MAX_WALK;
        refs_mut(
            &mut meta,
            &mut |r: &mut String| {
                if let Some(frag) = r.strip_prefix('#') {
                    *r = format!("#/$defs/{key}{frag}");
                }
            },
            &mut budget,
        );
        defs.insert(key.clone(), meta);
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn meta_schema_references_point_into_bundled_copies() {
        let s = json!({
            "type": "object",
            "properties": {
                "max": {"$ref": "http://json-schema.org/draft-04/schema#/definitions/positiveInteger"},
                "schema": {"$ref": "https://json-schema.org/draft-07/schema#"},
                "local": {"$ref": "#/definitions/x"}
            },
            "definitions": {"x": {"type": "string"}}
        });
        let b = bundle_meta_schemas(&s).into_owned();
        let p = &b["properties"];
        assert_eq!(
            p["max"]["$ref"],
            "#/$defs/sglrs-bundled-draft-04/definitions/positiveInteger"
        );
        assert_eq!(p["schema"]["$ref"], "#/$defs/sglrs-bundled-draft-07");
        assert_eq!(p["local"]["$ref"], "#/definitions/x");
        let d4 = &b["$defs"]["sglrs-bundled-draft-04"];
        assert!(d4.get("id").is_none() && d4.get("$schema").is_none());
        assert_eq!(
            d4["definitions"]["schemaArray"]["items"]["$ref"],
            "#/$defs/sglrs-bundled-draft-04"
        );
        assert_eq!(
            d4["properties"]["maxLength"]["$ref"],
            "#/$defs/sglrs-bundled-draft-04/definitions/positiveInteger"
        );
        assert!(b["$defs"].get("sglrs-bundled-draft-06").is_none());
    }

    #[test]
    fn references_that_are_data_stay_as_written() {
        let meta = "http://json-schema.org/draft-07/schema#";
        let s = json!({
            "properties": {
                "enum": {"$ref": meta},
                "v": {"const": {"$ref": meta}, "default": {"$ref": meta}}
            }
        });
        let b = bundle_meta_schemas(&s).into_owned();
        // A property named `enum` is a schema; a `const` and a `default` are values.
        assert_eq!(
            b["properties"]["enum"]["$ref"],
            "#/$defs/sglrs-bundled-draft-07"
        );
        assert_eq!(b["properties"]["v"]["const"]["$ref"], meta);
        assert_eq!(b["properties"]["v"]["default"]["$ref"], meta);
        // Only data names a meta-schema: nothing to bundle.
        let data_only = json!({"const": {"$ref": meta}});
        assert!(matches!(bundle_meta_schemas(&data_only), Cow::Borrowed(_)));
    }

    #[test]
    fn schemas_without_meta_references_are_borrowed() {
        let s = json!({"$ref": "#/$defs/a", "$defs": {"a": {"type": "integer"}}});
        assert!(matches!(bundle_meta_schemas(&s), Cow::Borrowed(_)));
        // The draft-04 meta-schema itself names its own URI as its `id`.
        let own: Value = serde_json::from_str(META[0].1).unwrap();
        assert!(matches!(bundle_meta_schemas(&own), Cow::Borrowed(_)));
    }
}
