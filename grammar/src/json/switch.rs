//! `allOf` of many `if`/`then`/`else` blocks that all test one property against constants
//! (`if: {properties: {kind: {const: "a"}}}`, a common way to write a tagged union): the
//! blocks are rewritten as one `anyOf` with a branch per case of that property — not an
//! object, absent, each listed constant, any other value — instead of distributing each
//! block's two sides over the others (2^k branches). Exact: the cases are disjoint and
//! cover every value, and in each case every block's condition is decided.

use serde_json::{json, Map, Value};

use super::{is_annotation, json_eq};

/// Fewest blocks on one property worth rewriting.
const MIN_BLOCKS: usize = 2;

/// One block: its condition's parts and its two sides.
struct Block {
    /// The values of the property that satisfy the condition.
    values: Vec<Value>,
    /// The condition requires the property (`required: [p]`).
    required: bool,
    /// The condition requires an object (`type: object`).
    object: bool,
    then: Value,
    els: Value,
}

/// The property and block of an `if`/`then`/`else` schema in the switch form.
fn block(s: &Value) -> Option<(String, Block)> {
    let m = s.as_object()?;
    if m.keys()
        .any(|k| !is_annotation(k) && !matches!(k.as_str(), "if" | "then" | "else"))
    {
        return None;
    }
    let cond = m.get("if")?.as_object()?;
    let mut prop: Option<(String, Vec<Value>)> = None;
    let mut required = false;
    let mut object = false;
    for (k, v) in cond {
        match k.as_str() {
            "properties" => {
                let p = v.as_object()?;
                if p.len() != 1 {
                    return None;
                }
                let (name, ps) = p.iter().next()?;
                let ps = ps.as_object()?;
                let values = match (ps.get("const"), ps.get("enum")) {
                    (Some(c), None) => vec![c.clone()],
                    (None, Some(Value::Array(e))) => e.clone(),
                    _ => return None,
                };
                // Other keywords of the property schema must hold for every listed value
                // (then the schema is exactly "one of the values").
                for (pk, _) in ps {
                    if !is_annotation(pk) && !matches!(pk.as_str(), "const" | "enum" | "type") {
                        return None;
                    }
                }
                let mut rest = ps.clone();
                rest.remove("const");
                rest.remove("enum");
                let mut kept = Vec::new();
                for v in values {
                    if super::check::check_value(&v, &rest)? {
                        kept.push(v);
                    }
                }
                let values = kept;
                prop = Some((name.clone(), values));
            }
            "required" => {
                required = true;
                let r = v.as_array()?;
                if r.len() != 1 {
                    return None;
                }
            }
            "type" if v == "object" => object = true,
            _ if is_annotation(k) => {}
            _ => return None,
        }
    }
    let (name, values) = prop?;
    if required && cond.get("required")?.as_array()?.first()?.as_str()? != name {
        return None;
    }
    Some((
        name,
        Block {
            values,
            required,
            object,
            then: m.get("then").cloned().unwrap_or(Value::Bool(true)),
            els: m.get("else").cloned().unwrap_or(Value::Bool(true)),
        },
    ))
}

/// Rewrites the `if`/`then`/`else` parts of an `allOf` that test one property (at least
/// [`MIN_BLOCKS`] of them) into one `anyOf` part; other parts are left as they are.
pub(super) fn rewrite(parts: &mut Vec<(Value, String)>) {
    let mut by_prop: Map<String, Value> = Map::new();
    for (i, (s, _)) in parts.iter().enumerate() {
        if let Some((p, _)) = block(s) {
            let list = by_prop.entry(p).or_insert_with(|| json!([]));
            if let Value::Array(a) = list {
                a.push(json!(i));
            }
        }
    }
    let mut drop: Vec<usize> = Vec::new();
    for (p, idx) in by_prop {
        let idx: Vec<usize> = idx
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_u64().map(|x| x as usize))
            .collect();
        if idx.len() < MIN_BLOCKS {
            continue;
        }
        let blocks: Vec<Block> = idx
            .iter()
            .filter_map(|&i| block(&parts[i].0).map(|b| b.1))
            .collect();
        let mut constants: Vec<Value> = Vec::new();
        for b in &blocks {
            for v in &b.values {
                if !constants.iter().any(|c| json_eq(c, v)) {
                    constants.push(v.clone());
                }
            }
        }
        let pick = |holds: &dyn Fn(&Block) -> bool| -> Vec<Value> {
            blocks
                .iter()
                .map(|b| {
                    if holds(b) {
                        b.then.clone()
                    } else {
                        b.els.clone()
                    }
                })
                .collect()
        };
        let mut branches = Vec::new();
        // Not an object: `properties`/`required` hold vacuously, `type: object` does not.
        let mut sides = pick(&|b| !b.object);
        sides.push(json!({"not": {"type": "object"}}));
        branches.push(json!({ "allOf": sides }));
        // An object without the property.
        let mut sides = pick(&|b| !b.required);
        sides.push(json!({"type": "object", "__forbidden": [p]}));
        branches.push(json!({ "allOf": sides }));
        // The property equal to each constant.
        for c in &constants {
            let mut sides = pick(&|b| b.values.iter().any(|v| json_eq(v, c)));
            sides.push(
                json!({"type": "object", "required": [p], "properties": {p.clone(): {"const": c}}}),
            );
            branches.push(json!({ "allOf": sides }));
        }
        // Any other value.
        let mut sides = pick(&|_| false);
        sides.push(json!({"type": "object", "required": [p],
            "properties": {p.clone(): {"not": {"enum": constants}}}}));
        branches.push(json!({ "allOf": sides }));
        let ptr = parts[idx[0]].1.clone();
        parts[idx[0]] = (json!({ "anyOf": branches }), ptr);
        drop.extend(idx[1..].iter().copied());
    }
    drop.sort_unstable();
    for i in drop.into_iter().rev() {
        parts.remove(i);
    }
}
