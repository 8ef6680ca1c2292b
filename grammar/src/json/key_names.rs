//! `propertyNames` on undeclared keys: a key automaton exit carries the set of key patterns
//! the key matched (`object.rs::undeclared_rules`), and the key names allowed are a boolean
//! formula over that set — every positive pattern, no negative one, no excluded name, and
//! for `anyOf` / `oneOf` / `not` over key schemas (a string pattern with a length, or an
//! enum, beside branches of other types that no key matches), a [`KeyFormula`].

use serde_json::{Map, Value};

use super::keys::FULL_MATCH;
use super::object::{Item, ObjectPlan};
use super::JsonCompiler;
use crate::CompileError;

/// Keywords that say nothing about a string (a key): they constrain other types only.
const NOT_ON_STRINGS: &[&str] = &[
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedItems",
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "minProperties",
    "maxProperties",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "propertyNames",
    "unevaluatedProperties",
];

/// Which key names a `propertyNames` combinator allows, over the key patterns a key
/// matches (`Pat(i, positive)`: pattern `i` of [`ObjectPlan::name_alt`] matches, or not).
#[derive(Clone, Debug)]
pub(super) enum KeyFormula {
    /// Always or never.
    Const(bool),
    /// Pattern `i` matches (`true`) or does not (`false`).
    Pat(usize, bool),
    /// The negation.
    Not(Box<KeyFormula>),
    /// Every one holds.
    All(Vec<KeyFormula>),
    /// At least one holds.
    Any(Vec<KeyFormula>),
    /// Exactly one holds.
    One(Vec<KeyFormula>),
}

impl KeyFormula {
    /// Whether a key that matches exactly the patterns `matched` says it satisfies this.
    pub(super) fn holds(&self, matched: &dyn Fn(usize) -> bool) -> bool {
        match self {
            KeyFormula::Const(b) => *b,
            KeyFormula::Pat(i, pos) => matched(*i) == *pos,
            KeyFormula::Not(f) => !f.holds(matched),
            KeyFormula::All(fs) => fs.iter().all(|f| f.holds(matched)),
            KeyFormula::Any(fs) => fs.iter().any(|f| f.holds(matched)),
            KeyFormula::One(fs) => fs.iter().filter(|f| f.holds(matched)).count() == 1,
        }
    }
}

/// Pattern `p` (added to `alts` unless there) matching, or not.
fn pat(alts: &mut Vec<String>, p: String, pos: bool) -> KeyFormula {
    let i = alts.iter().position(|q| *q == p).unwrap_or_else(|| {
        alts.push(p);
        alts.len() - 1
    });
    KeyFormula::Pat(i, pos)
}

/// The strings of an `enum` / `const` value (others never name a key).
fn key_names(v: &Value) -> Vec<&str> {
    match v {
        Value::Array(a) => a.iter().filter_map(|x| x.as_str()).collect(),
        other => other.as_str().into_iter().collect(),
    }
}

/// A pattern matching exactly one of `names`.
fn names_pattern(names: &[&str]) -> String {
    let alts: Vec<String> = names.iter().map(|n| literal_pattern(n)).collect();
    format!("^(?:{})$", alts.join("|"))
}

/// The pattern of a length range, `[lo, hi]` characters.
fn length_pattern(m: &Map<String, Value>) -> String {
    let lo = m.get("minLength").and_then(|x| x.as_u64()).unwrap_or(0);
    match m.get("maxLength").and_then(|x| x.as_u64()) {
        Some(h) => format!("^[\\s\\S]{{{lo},{h}}}$"),
        None => format!("^[\\s\\S]{{{lo},}}$"),
    }
}

impl JsonCompiler<'_> {
    /// `propertyNames`: declared keys are checked here, undeclared keys get patterns (or
    /// none are allowed). False when a required key is not a valid name.
    pub(super) fn property_names(
        &mut self,
        plan: &mut ObjectPlan,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<bool, CompileError> {
        let Some(pn) = s.get("propertyNames") else {
            return Ok(true);
        };
        let pn_ptr = format!("{ptr}/propertyNames");
        let pn_map = match pn {
            Value::Bool(true) => Map::new(),
            Value::Bool(false) => {
                let mut m = Map::new();
                m.insert("__false".into(), Value::Bool(true));
                m
            }
            Value::Object(m) => self.normalize_key_schema(m, &pn_ptr)?,
            _ => return Err(self.invalid(&pn_ptr, "a schema must be an object or a boolean")),
        };
        let mut keep: Vec<Item> = Vec::new();
        for item in plan.items.drain(..) {
            match super::check::check_value(&Value::String(item.0.clone()), &pn_map) {
                Some(true) => keep.push(item),
                Some(false) if item.2 => return Ok(false),
                Some(false) => {}
                None => {
                    self.unsupported("propertyNames", &pn_ptr, "cannot check a declared key")?;
                    keep.push(item);
                }
            }
        }
        plan.items = keep;
        if plan.has_undeclared() {
            for (k, v) in &pn_map {
                if super::is_annotation(k) {
                    continue;
                }
                self.undeclared_name_keyword(plan, &pn_map, k, v, &pn_ptr)?;
            }
        }
        let n = plan.patterns.len() + plan.name_pos.len() + plan.name_neg.len();
        if n + plan.name_alt.len() > 30 {
            self.unsupported("propertyNames", &pn_ptr, "too many key patterns")?;
            plan.name_pos.clear();
            plan.name_neg.clear();
            plan.name_alt.clear();
            plan.name_formulas.clear();
        }
        Ok(true)
    }

    /// A key schema with `allOf` and `$ref` merged in.
    fn normalize_key_schema(
        &mut self,
        m: &Map<String, Value>,
        ptr: &str,
    ) -> Result<Map<String, Value>, CompileError> {
        let mark = self.merged_refs.len();
        let n = self.normalize(m, ptr, 0);
        self.merged_refs.truncate(mark);
        n
    }

    /// One keyword `k: v` of the `propertyNames` schema `pn_map` applied to undeclared
    /// keys.
    fn undeclared_name_keyword(
        &mut self,
        plan: &mut ObjectPlan,
        pn_map: &Map<String, Value>,
        k: &str,
        v: &Value,
        pn_ptr: &str,
    ) -> Result<(), CompileError> {
        let no_undeclared = |plan: &mut ObjectPlan| {
            plan.additional = None;
            plan.patterns.clear();
            plan.matchers.clear();
        };
        match (k, v) {
            ("type", t) if super::norm::type_list(t).iter().any(|t| t == "string") => {}
            ("type", _) | ("__false", _) => no_undeclared(plan),
            ("pattern", Value::String(p)) => plan.name_pos.push(p.clone()),
            ("minLength" | "maxLength", _) => {
                let re = length_pattern(pn_map);
                if !plan.name_pos.contains(&re) {
                    plan.name_pos.push(re);
                }
            }
            // Undeclared keys must be one of the names (declared keys were checked
            // already): an alternation of the literal names.
            ("enum" | "const", v) => {
                let names = key_names(v);
                if names.is_empty() {
                    no_undeclared(plan);
                } else {
                    plan.name_pos.push(names_pattern(&names));
                }
            }
            ("format", Value::String(f)) => {
                if let Some(re) = self.key_format(f, pn_ptr)? {
                    plan.name_pos.push(re);
                }
            }
            ("__not_enum", Value::Array(vals)) => plan
                .name_excl
                .extend(vals.iter().filter_map(|x| x.as_str().map(String::from))),
            ("__not_pattern", Value::Array(ps)) => plan
                .name_neg
                .extend(ps.iter().filter_map(|x| x.as_str().map(String::from))),
            ("not", n) => {
                let mut forms = Vec::new();
                self.not_forms(n, &mut forms);
                let simple = |f: &super::NotForm| {
                    matches!(
                        f,
                        super::NotForm::NotValues(_)
                            | super::NotForm::NotPattern(Value::String(_))
                            | super::NotForm::NoOp
                    )
                };
                if !forms.iter().all(simple) {
                    // Any other complement: the formula of the schema, negated.
                    let f = self.key_formula(n, &format!("{pn_ptr}/not"), &mut plan.name_alt)?;
                    plan.name_formulas.push(KeyFormula::Not(Box::new(f)));
                    return Ok(());
                }
                for f in forms {
                    match f {
                        super::NotForm::NotValues(vals) => plan
                            .name_excl
                            .extend(vals.iter().filter_map(|x| x.as_str().map(String::from))),
                        super::NotForm::NotPattern(Value::String(p)) => plan.name_neg.push(p),
                        _ => {}
                    }
                }
            }
            ("anyOf" | "oneOf", Value::Array(branches)) => {
                let f = self.key_branches(k, branches, pn_ptr, &mut plan.name_alt)?;
                plan.name_formulas.push(f);
            }
            _ if NOT_ON_STRINGS.contains(&k) => {}
            _ => self.unsupported("propertyNames", pn_ptr, &format!("`{k}` on keys"))?,
        }
        Ok(())
    }

    /// The key pattern of `format: f` ([`FULL_MATCH`]-marked); `None` for a format that
    /// only annotates. The `regex` format takes the subset it has in products.
    fn key_format(&mut self, f: &str, ptr: &str) -> Result<Option<String>, CompileError> {
        match super::formats::format_regex_in_product(f) {
            Some(re) if re.is_empty() => Ok(None),
            Some(re) => Ok(Some(format!("{FULL_MATCH}{re}"))),
            None => {
                self.unsupported("propertyNames", ptr, &format!("format {f:?} on keys"))?;
                Ok(None)
            }
        }
    }

    /// `anyOf` / `oneOf` over key schemas.
    fn key_branches(
        &mut self,
        kw: &str,
        branches: &[Value],
        ptr: &str,
        alts: &mut Vec<String>,
    ) -> Result<KeyFormula, CompileError> {
        let mut fs = Vec::with_capacity(branches.len());
        for (i, b) in branches.iter().enumerate() {
            fs.push(self.key_formula(b, &format!("{ptr}/{kw}/{i}"), alts)?);
        }
        Ok(if kw == "anyOf" {
            KeyFormula::Any(fs)
        } else {
            KeyFormula::One(fs)
        })
    }

    /// The key names schema `b` allows, as a formula over patterns added to `alts`;
    /// refused (naming the keyword) where a keyword has no pattern form.
    fn key_formula(
        &mut self,
        b: &Value,
        ptr: &str,
        alts: &mut Vec<String>,
    ) -> Result<KeyFormula, CompileError> {
        let m = match b {
            Value::Bool(t) => return Ok(KeyFormula::Const(*t)),
            Value::Object(m) => self.normalize_key_schema(m, ptr)?,
            _ => return Err(self.invalid(ptr, "a schema must be an object or a boolean")),
        };
        if m.contains_key("__false")
            || m.get("type")
                .is_some_and(|t| !super::norm::type_list(t).iter().any(|t| t == "string"))
        {
            return Ok(KeyFormula::Const(false));
        }
        let mut all = Vec::new();
        for (k, v) in &m {
            if super::is_annotation(k) || NOT_ON_STRINGS.contains(&k.as_str()) {
                continue;
            }
            match (k.as_str(), v) {
                ("type", _) => {}
                ("pattern", Value::String(p)) => all.push(pat(alts, p.clone(), true)),
                ("minLength", _) => all.push(pat(alts, length_pattern(&m), true)),
                ("maxLength", _) if !m.contains_key("minLength") => {
                    all.push(pat(alts, length_pattern(&m), true))
                }
                ("maxLength", _) => {}
                ("enum" | "const", v) => {
                    let names = key_names(v);
                    if names.is_empty() {
                        return Ok(KeyFormula::Const(false));
                    }
                    all.push(pat(alts, names_pattern(&names), true));
                }
                ("format", Value::String(f)) => {
                    if let Some(re) = self.key_format(f, ptr)? {
                        all.push(pat(alts, re, true));
                    }
                }
                ("__not_enum", Value::Array(vals)) => {
                    let names: Vec<&str> = vals.iter().filter_map(|x| x.as_str()).collect();
                    if !names.is_empty() {
                        all.push(pat(alts, names_pattern(&names), false));
                    }
                }
                ("__not_pattern", Value::Array(ps)) => {
                    for p in ps.iter().filter_map(|x| x.as_str()) {
                        all.push(pat(alts, p.to_string(), false));
                    }
                }
                ("not", n) => {
                    let f = self.key_formula(n, &format!("{ptr}/not"), alts)?;
                    all.push(KeyFormula::Not(Box::new(f)));
                }
                ("anyOf" | "oneOf", Value::Array(bs)) => {
                    all.push(self.key_branches(k, bs, ptr, alts)?)
                }
                _ => self.unsupported("propertyNames", ptr, &format!("`{k}` on keys"))?,
            }
        }
        Ok(KeyFormula::All(all))
    }
}

/// A pattern matching exactly `name` (metacharacters escaped the same way in ECMA and
/// Rust syntax; control characters as `\uXXXX`).
fn literal_pattern(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        match c {
            '\\' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$' => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}
