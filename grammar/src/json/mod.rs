//! JSON Schema → NFA. Non-recursive parts are inlined (one flat automaton); `$ref` cycles,
//! heavily reused definitions, long repetitions and "any JSON value" become rules (calls).
//!
//! Exactness: every keyword is either enforced exactly, made stricter (documented in
//! `docs/grammar.md`: no exponent under numeric bounds, declared properties only unless
//! allowed, fixed property order, no `\u` escapes in pattern strings), or refused with
//! [`CompileError::Unsupported`] naming the keyword and its JSON pointer.

mod any_order;
mod array;
mod bundle;
mod check;
mod formats;
mod key_conds;
mod key_names;
mod keys;
mod multiple;
mod negate;
mod norm;
mod normalized;
mod numbers;
mod object;
mod one_of;
mod presence;
mod product;
mod refs;
mod switch;
mod types;
mod unevaluated;
mod unique;
mod values;

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::nfa::{Builder, RuleId, StateId};
use crate::{CompileError, CompileOptions, Whitespace};
pub(crate) use values::json_eq;
use values::ValueSet;

/// A schema body a rule will hold: either a `$ref` target or an inline schema.
enum Pending {
    Ref(String),
    /// A schema, its pointer, and the references being expanded where it was met.
    Schema(Value, String, Vec<String>),
    Any,
}

pub(crate) struct JsonCompiler<'a> {
    pub b: &'a mut Builder,
    pub root: &'a Value,
    pub opts: &'a CompileOptions,
    /// `$ref`s being expanded inline right now (a repeat means recursion).
    inlining: Vec<String>,
    ref_rules: HashMap<String, RuleId>,
    inline_count: HashMap<String, u32>,
    /// NFA states the first inline copy of each `$ref` took: a large one is called after
    /// that instead of copied again.
    inline_size: HashMap<String, usize>,
    any_rule: Option<RuleId>,
    /// One JSON string character, shared by long counted strings.
    pub(crate) char_rule: Option<RuleId>,
    pending: Vec<(RuleId, Pending)>,
    /// `$ref`s resolved by `normalize` (merged with siblings) since the caller's mark.
    merged_refs: Vec<String>,
    /// Nesting depth of `value` calls (bounded: deep inputs get an error, not a stack
    /// overflow).
    depth: u32,
    /// NFA states (estimated) spent on any-order objects so far (bounded by
    /// `any_order::MAX_ANY_ORDER_TOTAL`).
    any_order_cost: usize,
    /// NFA states (estimated) spent on key-loop objects so far (bounded by
    /// `any_order::MAX_KEY_LOOP_TOTAL`).
    key_loop_cost: usize,
    /// Anchors of the root resource by name (`resolve`), collected on first use.
    anchors: std::cell::OnceCell<HashMap<String, Vec<&'a Value>>>,
    /// The keyword `negate` last found no complement for (for error messages).
    unnegatable: Option<String>,
    /// `Some(depth)`: `negate` writes a subset of the complement — keywords without one,
    /// recursion, and nesting past `depth` add no alternatives (`oneOf` branches whose
    /// exact exclusion is refused or too large; `normalized.rs::one_of_exclusion`).
    approx: Option<u32>,
    /// Rules made by `schema_rule`, by schema text.
    schema_rules: HashMap<String, RuleId>,
    /// Rules of schemas that merge a recursive `$ref` with other keywords, by schema text.
    merge_rules: HashMap<String, RuleId>,
    /// Rules of large length-bounded regexes (regex, min, max), built once and called.
    /// (Free long strings have the empty regex.)
    pub(crate) len_rules: HashMap<(String, u64, Option<u64>), RuleId>,
    /// NFA states the inline copy of a string regex took (regex, min, max).
    pub(crate) regex_size: HashMap<(String, u64, Option<u64>), usize>,
    /// Rules of the complements of `$ref`s (`__not_ref`), by reference.
    not_ref_rules: HashMap<String, RuleId>,
    /// `$ref`s whose complement `negate` is writing right now: met again inside, the
    /// complement is `__not_ref` (a call to its rule), so recursive definitions negate.
    negating: Vec<String>,
    /// [`stack_address`] where the compile began (see [`JsonCompiler::check_stack`]).
    stack_base: usize,
    /// Numbers are written in one spelling per value (the items of a unique-number array,
    /// `unique.rs`): no exponent, no trailing zero in a fraction, no `.0`, no `-0`.
    pub(super) canonical_numbers: bool,
    /// Strings under `pattern`/`format` are written inline, never through a shared rule (the
    /// items of a unique-item array must have states of their own, `unique.rs`).
    pub(super) inline_strings: bool,
}

/// Most NFA states a JSON Schema may compile to (the post-passes are not interruptible).
pub(crate) const MAX_JSON_STATES: usize = 600_000;

/// A `$ref` whose first inline copy took more NFA states than this is called as a rule at
/// its later uses (copying large definitions at every use is what makes schemas too large).
const MAX_REF_INLINE_STATES: usize = 2_000;

/// A string regex whose inline copy took more NFA states than this is a rule at its later
/// uses.
pub(crate) const MAX_INLINE_REGEX_STATES: usize = 1_000;

/// Deepest schema nesting compiled inline.
const MAX_DEPTH: u32 = 96;

/// Most stack the schema recursion may take, in bytes from the compile's entry: a net
/// under the depth limits, whose cost in stack depends on the build and on the keywords a
/// level goes through. Half of a 2 MiB thread stack (what Rust gives spawned threads).
const MAX_STACK_BYTES: usize = 1 << 20;

/// An address in the caller's stack frame.
#[inline(always)]
fn stack_address() -> usize {
    let marker = 0u8;
    std::hint::black_box(&marker) as *const u8 as usize
}

/// Past this nesting a bare `$ref` is called as a rule instead of copied inline: the rule
/// is compiled later from the work list, at depth 0, so long reference chains compile
/// instead of running into [`MAX_DEPTH`].
const MAX_REF_INLINE_DEPTH: u32 = MAX_DEPTH / 2;

/// Deepest nesting of arrays and objects in a schema value: what `serde_json` parses from
/// text. The compiler's passes recurse over values (equality, serialisation, literals); a
/// value built in code could nest deeper than any parsed one.
pub(crate) const MAX_VALUE_NESTING: usize = 128;

/// Whether `v` nests arrays and objects at most `max` deep (iterative: `v` may be deeper
/// than the stack allows recursing).
fn nesting_within(v: &Value, max: usize) -> bool {
    let mut stack: Vec<(&Value, usize)> = vec![(v, 1)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(m) => Box::new(m.values()),
            _ => continue,
        };
        if depth > max {
            return false;
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    true
}

/// Compiles `schema` into `b`; rule 0 is the root.
pub(crate) fn compile(
    b: &mut Builder,
    schema: &Value,
    opts: &CompileOptions,
) -> Result<(), CompileError> {
    compile_rule(b, schema, opts).map(|_| ())
}

/// Keywords whose value JSON Schema requires to be a non-negative integer.
const COUNT_KEYWORDS: [&str; 8] = [
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
];

/// Refuses, naming it, a count keyword (`maxLength`…) whose value is not a non-negative
/// integer (`10.0` is one), in `schema` and every schema inside it: such a value was read
/// as no bound (a string) or as 0 (a negative number) before, a constraint silently changed.
fn check_counts(schema: &Value, ptr: &str) -> Result<(), CompileError> {
    let Value::Object(m) = schema else {
        return Ok(());
    };
    for kw in COUNT_KEYWORDS {
        if let Some(v) = m.get(kw) {
            let ok = v.as_f64().is_some_and(|x| x >= 0.0 && x.fract() == 0.0);
            if !ok {
                return Err(CompileError::InvalidSchema {
                    pointer: format!("{ptr}/{kw}"),
                    reason: format!(
                        "{kw} must be a non-negative integer, not {}",
                        crate::excerpt(&v.to_string())
                    ),
                });
            }
        }
    }
    for (kw, v) in m {
        let at = format!("{ptr}/{kw}");
        match kw.as_str() {
            // Maps of names to schemas (`dependencies`: or to key lists, which hold none).
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas"
            | "dependencies" => {
                if let Value::Object(named) = v {
                    for (k, sub) in named {
                        check_counts(sub, &format!("{at}/{k}"))?;
                    }
                }
            }
            // A schema, or an array of schemas.
            "items"
            | "prefixItems"
            | "allOf"
            | "anyOf"
            | "oneOf"
            | "not"
            | "if"
            | "then"
            | "else"
            | "additionalProperties"
            | "additionalItems"
            | "contains"
            | "propertyNames"
            | "unevaluatedProperties"
            | "unevaluatedItems" => match v {
                Value::Array(subs) => {
                    for (i, sub) in subs.iter().enumerate() {
                        check_counts(sub, &format!("{at}/{i}"))?;
                    }
                }
                sub => check_counts(sub, &at)?,
            },
            _ => {}
        }
    }
    Ok(())
}

/// Compiles `schema` into `b` as a rule of its own (with its own `$ref` namespace) and
/// returns it: the first rule of an empty builder is the root, and a grammar that frames
/// JSON values in other text (`tagged.rs`) calls one such rule per schema.
pub(crate) fn compile_rule(
    b: &mut Builder,
    schema: &Value,
    opts: &CompileOptions,
) -> Result<RuleId, CompileError> {
    if !nesting_within(schema, MAX_VALUE_NESTING) {
        return Err(CompileError::LimitExceeded {
            limit: "JSON Schema nesting",
            max: MAX_VALUE_NESTING,
        });
    }
    check_counts(schema, "#")?;
    let bundled = bundle::bundle_meta_schemas(schema);
    let schema: &Value = &bundled;
    let root_rule = b.new_rule()?;
    let mut c = JsonCompiler::new(b, schema, opts);
    let r = c.b.rules[root_rule as usize];
    c.inlining.push("#".to_string());
    c.ref_rules.insert("#".to_string(), root_rule);
    let e = c.value(r.start, schema, "#")?;
    c.b.eps(e, r.end);
    c.inlining.pop();
    while let Some((rule, p)) = c.pending.pop() {
        c.build_pending(rule, p)?;
    }
    // Trimming and distances after this are not interruptible: keep them small.
    if c.b.states.len() > MAX_JSON_STATES {
        return Err(CompileError::TooLarge {
            states: c.b.states.len(),
        });
    }
    Ok(root_rule)
}

impl JsonCompiler<'_> {
    /// The body of a rule declared earlier (a `$ref`, a schema, any value), built from the
    /// references the rule was declared under (none for a `$ref`: its own).
    fn build_pending(&mut self, rule: RuleId, p: Pending) -> Result<(), CompileError> {
        let r = self.b.rules[rule as usize];
        let outer = std::mem::take(&mut self.inlining);
        // Nesting counts from the body's own top, as at the end (the stack check still
        // bounds what a body built inside a branch adds).
        let depth = std::mem::take(&mut self.depth);
        let e = match p {
            Pending::Ref(reference) => {
                let target = self.resolve(&reference, "#").cloned();
                target.and_then(|target| {
                    self.inlining.push(reference.clone());
                    self.value(r.start, &target, &reference)
                })
            }
            Pending::Schema(v, ptr, inlining) => {
                // The references being expanded where the rule was made stay marked, so a
                // recursion inside still becomes a call.
                self.inlining = inlining;
                self.value(r.start, &v, &ptr)
            }
            Pending::Any => self.any_value_body(r.start),
        };
        self.inlining = outer;
        self.depth = depth;
        self.b.eps(e?, r.end);
        Ok(())
    }

    /// Builds the bodies declared since `mark` (`pending`'s length then) now rather than
    /// at the end, so that an error in one is the error of what declared it (a `oneOf`
    /// branch compiled again more coarsely when refused, `normalized.rs`). A body does
    /// not depend on where it is built; it is built as at the end, outside any unique
    /// array's spelling rules.
    pub(super) fn drain_pending(&mut self, mark: usize) -> Result<(), CompileError> {
        let flags = (self.canonical_numbers, self.inline_strings);
        (self.canonical_numbers, self.inline_strings) = (false, false);
        let mut r = Ok(());
        while self.pending.len() > mark {
            let Some((rule, p)) = self.pending.pop() else {
                break;
            };
            r = self.build_pending(rule, p);
            if r.is_err() {
                break;
            }
        }
        (self.canonical_numbers, self.inline_strings) = flags;
        r
    }
}

impl<'a> JsonCompiler<'a> {
    /// A compiler writing `root` into `b`; its stack is measured from the caller's frame.
    fn new(b: &'a mut Builder, root: &'a Value, opts: &'a CompileOptions) -> Self {
        JsonCompiler {
            b,
            root,
            opts,
            inlining: Vec::new(),
            ref_rules: HashMap::new(),
            inline_count: HashMap::new(),
            inline_size: HashMap::new(),
            any_rule: None,
            char_rule: None,
            pending: Vec::new(),
            depth: 0,
            merged_refs: Vec::new(),
            any_order_cost: 0,
            key_loop_cost: 0,
            anchors: std::cell::OnceCell::new(),
            unnegatable: None,
            approx: None,
            merge_rules: HashMap::new(),
            schema_rules: HashMap::new(),
            len_rules: HashMap::new(),
            regex_size: HashMap::new(),
            not_ref_rules: HashMap::new(),
            negating: Vec::new(),
            stack_base: stack_address(),
            canonical_numbers: false,
            inline_strings: false,
        }
    }
}

/// What a `not` schema amounts to.
pub(crate) enum NotForm {
    /// `not: {}` / `not: true`: nothing is valid.
    Unsat,
    /// `not: false`: no constraint.
    NoOp,
    /// `not: {"required": [k]}`: objects must not have `k`.
    ForbidKey(String),
    /// `not: {"type": …}`: these types are excluded.
    NotTypes(Vec<String>),
    /// `not: {"enum": …}` / `not: {"const": …}`: these values are excluded.
    NotValues(Vec<Value>),
    /// `not: {"pattern": p}`: strings must not match `p` (other types unaffected).
    NotPattern(Value),
    /// `not: {"not": x}`: `x` itself.
    Positive(Value),
    /// Anything else.
    Other,
}

/// Keywords that constrain instances (everything else is an annotation or an unknown
/// extension keyword, which validators ignore).
pub(crate) const CONSTRAINTS: &[&str] = &[
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "unevaluatedProperties",
    "unevaluatedItems",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "if",
    "then",
    "else",
    "$ref",
    "$dynamicRef",
    "$recursiveRef",
    "__false",
    "__forbidden",
    "__not_enum",
    "__not_pattern",
    "__patterns",
    "__has_other",
    "__fraction",
    "__multiples",
    "__not_multiple",
    "__contains",
    "__pattern_else",
    "__not_ref",
];

/// True for keywords that carry no constraint.
pub(crate) fn is_annotation(k: &str) -> bool {
    !CONSTRAINTS.contains(&k)
}

impl<'a> JsonCompiler<'a> {
    pub fn unsupported(
        &self,
        keyword: &str,
        pointer: &str,
        reason: &str,
    ) -> Result<(), CompileError> {
        if self.opts.lenient {
            return Ok(());
        }
        Err(CompileError::Unsupported {
            keyword: keyword.into(),
            pointer: pointer.into(),
            reason: reason.into(),
        })
    }

    /// Fails once the recursion has taken more than [`MAX_STACK_BYTES`] of stack. (Stacks
    /// grow down on every target served; on one growing up this never fires and the depth
    /// limits alone apply.)
    pub(crate) fn check_stack(&self) -> Result<(), CompileError> {
        if self.stack_base.saturating_sub(stack_address()) > MAX_STACK_BYTES {
            return Err(CompileError::LimitExceeded {
                limit: "JSON Schema compile stack in bytes",
                max: MAX_STACK_BYTES,
            });
        }
        Ok(())
    }

    pub fn invalid(&self, pointer: &str, reason: &str) -> CompileError {
        CompileError::InvalidSchema {
            pointer: pointer.into(),
            reason: reason.into(),
        }
    }

    /// Optional whitespace (flexible policy only).
    pub fn ws(&mut self, from: StateId) -> Result<StateId, CompileError> {
        if self.opts.whitespace == Whitespace::Compact {
            return Ok(from);
        }
        let lp = self.b.state()?;
        self.b.eps(from, lp);
        for c in [b' ', b'\t', b'\n', b'\r'] {
            self.b.range(lp, c, c, lp);
        }
        Ok(lp)
    }

    /// Literal punctuation with whitespace around it under the flexible policy.
    pub fn punct(&mut self, from: StateId, c: u8) -> Result<StateId, CompileError> {
        let a = self.ws(from)?;
        let b = self.b.lit(a, &[c])?;
        self.ws(b)
    }

    /// A fragment that accepts nothing (its exit is unreachable, so it gets trimmed).
    pub fn nothing(&mut self) -> Result<StateId, CompileError> {
        self.b.state()
    }

    /// Any JSON value, as a call to the shared "any" rule.
    pub fn any_value(&mut self, from: StateId) -> Result<StateId, CompileError> {
        let r = match self.any_rule {
            Some(r) => r,
            None => {
                let r = self.b.new_rule()?;
                self.any_rule = Some(r);
                self.pending.push((r, Pending::Any));
                r
            }
        };
        self.b.call(from, r)
    }

    fn any_value_body(&mut self, from: StateId) -> Result<StateId, CompileError> {
        let exit = self.b.state()?;
        for lit in ["null", "true", "false"] {
            let e = self.b.lit(from, lit.as_bytes())?;
            self.b.eps(e, exit);
        }
        let e = self.number_plain(from)?;
        self.b.eps(e, exit);
        let e = self.string_free(from, 0, None)?;
        self.b.eps(e, exit);
        // Array of any.
        let a = self.b.lit(from, b"[")?;
        let a = self.ws(a)?;
        let close = self.b.state()?;
        self.b.eps(a, close);
        let first = self.any_value(a)?;
        let lp = self.b.state()?;
        self.b.eps(first, lp);
        let comma = self.punct(lp, b',')?;
        let nx = self.any_value(comma)?;
        self.b.eps(nx, lp);
        self.b.eps(lp, close);
        let c2 = self.ws(close)?;
        let e = self.b.lit(c2, b"]")?;
        self.b.eps(e, exit);
        // Object of any.
        let o = self.b.lit(from, b"{")?;
        let o = self.ws(o)?;
        let close = self.b.state()?;
        self.b.eps(o, close);
        let kv = |c: &mut Self, s: StateId| -> Result<StateId, CompileError> {
            let k = c.string_free(s, 0, None)?;
            let col = c.punct(k, b':')?;
            c.any_value(col)
        };
        let first = kv(self, o)?;
        let lp = self.b.state()?;
        self.b.eps(first, lp);
        let comma = self.punct(lp, b',')?;
        let nx = kv(self, comma)?;
        self.b.eps(nx, lp);
        self.b.eps(lp, close);
        let c2 = self.ws(close)?;
        let e = self.b.lit(c2, b"}")?;
        self.b.eps(e, exit);
        Ok(exit)
    }

    /// A schema as a rule call (for repetition of large bodies).
    pub fn schema_call(
        &mut self,
        from: StateId,
        schema: &Value,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let rule = self.schema_rule(schema, ptr)?;
        self.b.call(from, rule)
    }

    /// A rule whose body is `schema` (a bare `$ref` reuses the reference's rule).
    pub fn schema_rule(&mut self, schema: &Value, ptr: &str) -> Result<RuleId, CompileError> {
        if let Some(r) = schema
            .as_object()
            .and_then(|m| m.get("$ref"))
            .and_then(|r| r.as_str())
        {
            if schema
                .as_object()
                .is_some_and(|m| m.keys().all(|k| k == "$ref" || is_annotation(k)))
            {
                return self.ref_rule(r);
            }
        }
        // One rule per distinct schema text (a `maxItems: 100` array calls its item rule at
        // every position). The body does not depend on where it is called from: the
        // references being inlined there only decide call-or-copy, not the language.
        let key = serde_json::to_string(schema).map_err(|e| CompileError::Json(e.to_string()))?;
        if let Some(&r) = self.schema_rules.get(&key) {
            return Ok(r);
        }
        let rule = self.b.new_rule()?;
        self.schema_rules.insert(key, rule);
        self.pending.push((
            rule,
            Pending::Schema(schema.clone(), ptr.to_string(), self.inlining.clone()),
        ));
        Ok(rule)
    }

    /// The rule of the complement of `reference`'s schema (built once; the complement of
    /// the same reference met inside it is a call to this rule).
    pub(super) fn not_ref_rule(
        &mut self,
        reference: &str,
        ptr: &str,
    ) -> Result<RuleId, CompileError> {
        if let Some(&r) = self.not_ref_rules.get(reference) {
            return Ok(r);
        }
        let target = self.resolve(reference, ptr)?;
        self.negating.push(reference.to_string());
        let neg = self.negate(target, reference, 0);
        self.negating.pop();
        let Some(neg) = neg? else {
            let k = self.unnegatable.take().unwrap_or_default();
            return Err(CompileError::Unsupported {
                keyword: "not".into(),
                pointer: ptr.into(),
                reason: format!(
                    "the complement of {:?}: `{k}` has no complement",
                    crate::excerpt(reference)
                ),
            });
        };
        let r = self.b.new_rule()?;
        self.not_ref_rules.insert(reference.to_string(), r);
        self.pending
            .push((r, Pending::Schema(neg, reference.to_string(), Vec::new())));
        Ok(r)
    }

    fn ref_rule(&mut self, reference: &str) -> Result<RuleId, CompileError> {
        if let Some(&r) = self.ref_rules.get(reference) {
            return Ok(r);
        }
        let r = self.b.new_rule()?;
        self.ref_rules.insert(reference.to_string(), r);
        self.pending.push((r, Pending::Ref(reference.to_string())));
        Ok(r)
    }

    /// Any schema.
    pub fn value(
        &mut self,
        from: StateId,
        schema: &Value,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        self.b.check_deadline()?;
        self.check_stack()?;
        if self.depth >= MAX_DEPTH {
            return Err(CompileError::Unsupported {
                keyword: "$ref".into(),
                pointer: ptr.into(),
                reason: format!("schema nesting deeper than {MAX_DEPTH} levels"),
            });
        }
        self.depth += 1;
        let r = self.value_inner(from, schema, ptr);
        self.depth -= 1;
        r
    }

    fn value_inner(
        &mut self,
        from: StateId,
        schema: &Value,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let map = match schema {
            Value::Bool(true) => return self.any_value(from),
            Value::Bool(false) => return self.nothing(),
            Value::Object(m) => m,
            _ => return Err(self.invalid(ptr, "a schema must be an object or a boolean")),
        };
        // `unevaluated*` become keywords of the parts that decide them (`unevaluated.rs`);
        // where that does not apply the keyword is refused, with the reason.
        if let Some(s) = self.own_unevaluated(map, ptr)? {
            return self.value(from, &s, ptr);
        }
        // A bare `$ref`: inline, or call when recursive / reused a lot.
        if let Some(reference) = map.get("$ref").and_then(|r| r.as_str()) {
            let only_ref =
                map.keys().all(|k| k == "$ref" || is_annotation(k)) || !self.is_modern_draft();
            if only_ref {
                let reference = reference.to_string();
                let count = self.inline_count.entry(reference.clone()).or_insert(0);
                *count += 1;
                let many = *count > 8
                    || self
                        .inline_size
                        .get(&reference)
                        .is_some_and(|&n| n > MAX_REF_INLINE_STATES);
                if self.inlining.contains(&reference) || many || self.depth >= MAX_REF_INLINE_DEPTH
                {
                    let rule = self.ref_rule(&reference)?;
                    return self.b.call(from, rule);
                }
                let target = self.resolve(&reference, ptr)?;
                self.inlining.push(reference.clone());
                let n0 = self.b.states.len();
                let r = self.value(from, target, &reference);
                let size = self.b.states.len() - n0;
                self.inlining.pop();
                let seen = self.inline_size.entry(reference).or_insert(0);
                *seen = (*seen).max(size);
                return r;
            }
        }
        // `allOf: [x]` alone is `x` (keeps `$ref` recursion going through rules).
        let mut constraints = map.iter().filter(|(k, _)| !is_annotation(k));
        if let (Some((k, Value::Array(all))), None) = (constraints.next(), constraints.next()) {
            if k == "allOf" && all.len() == 1 {
                return self.value(from, &all[0], &format!("{ptr}/allOf/0"));
            }
        }
        // A recursive `$ref` beside other keywords (or in an `allOf`): one rule per distinct
        // schema text, compiled with the reference merged once at its own level; the same
        // schema met again inside is a call to that rule, so the recursion is exact.
        if self.recursive_merge(map) {
            let key = serde_json::to_string(map).map_err(|e| CompileError::Json(e.to_string()))?;
            let rule = match self.merge_rules.get(&key) {
                Some(&r) => r,
                None => {
                    let r = self.b.new_rule()?;
                    self.merge_rules.insert(key, r);
                    self.pending.push((
                        r,
                        Pending::Schema(schema.clone(), ptr.to_string(), Vec::new()),
                    ));
                    r
                }
            };
            return self.b.call(from, rule);
        }
        let mark = self.merged_refs.len();
        let norm = self.normalize_cow(map, ptr, 0);
        self.normalized_marked(from, norm, mark, ptr)
    }

    /// Whether `map` merges a `$ref` being expanded right now (its own or one in `allOf`,
    /// nested `allOf`s included).
    fn recursive_merge(&self, map: &Map<String, Value>) -> bool {
        fn walk(c: &JsonCompiler<'_>, m: &Map<String, Value>, depth: u32) -> bool {
            m.get("$ref")
                .and_then(|r| r.as_str())
                .is_some_and(|r| c.inlining.iter().any(|x| x == r))
                || (depth < 8
                    && m.get("allOf")
                        .and_then(|a| a.as_array())
                        .is_some_and(|all| {
                            all.iter()
                                .any(|x| x.as_object().is_some_and(|x| walk(c, x, depth + 1)))
                        }))
        }
        walk(self, map, 0)
    }

    /// Compiles a schema `normalize` produced, with the references it merged (pushed since
    /// `mark`) marked as being inlined, so that a recursive reference inside becomes a rule.
    fn normalized_marked(
        &mut self,
        from: StateId,
        norm: Result<std::borrow::Cow<'_, Map<String, Value>>, CompileError>,
        mark: usize,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let merged: Vec<String> = self.merged_refs.drain(mark..).collect();
        let norm = norm?;
        let depth = self.inlining.len();
        self.inlining.extend(merged);
        let r = self.normalized(from, &norm, ptr);
        self.inlining.truncate(depth);
        r
    }

    pub(super) fn is_modern_draft(&self) -> bool {
        match self.root.get("$schema").and_then(|s| s.as_str()) {
            Some(s) => {
                !(s.contains("draft-04")
                    || s.contains("draft-06")
                    || s.contains("draft-07")
                    || s.contains("draft-03"))
            }
            None => true,
        }
    }

    /// A JSON value written out (whitespace per policy).
    pub fn literal(&mut self, from: StateId, v: &Value) -> Result<StateId, CompileError> {
        match v {
            Value::Array(items) => {
                let mut cur = self.b.lit(from, b"[")?;
                cur = self.ws(cur)?;
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        cur = self.punct(cur, b',')?;
                    }
                    cur = self.literal(cur, x)?;
                }
                cur = self.ws(cur)?;
                self.b.lit(cur, b"]")
            }
            Value::Object(m) => {
                let mut cur = self.b.lit(from, b"{")?;
                cur = self.ws(cur)?;
                for (i, (k, x)) in m.iter().enumerate() {
                    if i > 0 {
                        cur = self.punct(cur, b',')?;
                    }
                    let key =
                        serde_json::to_string(k).map_err(|e| CompileError::Json(e.to_string()))?;
                    cur = self.b.lit(cur, key.as_bytes())?;
                    cur = self.punct(cur, b':')?;
                    cur = self.literal(cur, x)?;
                }
                cur = self.ws(cur)?;
                self.b.lit(cur, b"}")
            }
            Value::Number(n) => {
                // A value written with a fraction that is integral (`2.0`) also in its
                // integer spelling: `enum: [2.0]` holds for the instance `2`. (Not the other
                // way: under draft 4, `2.0` is not an integer.)
                let text = n.to_string();
                match n.as_f64() {
                    Some(x) if n.is_f64() && x.fract() == 0.0 && x.abs() < 1e15 => {
                        let exit = self.b.state()?;
                        for t in [(x as i64).to_string(), text] {
                            let e = self.b.lit(from, t.as_bytes())?;
                            self.b.eps(e, exit);
                        }
                        Ok(exit)
                    }
                    _ => self.b.lit(from, text.as_bytes()),
                }
            }
            other => {
                let text =
                    serde_json::to_string(other).map_err(|e| CompileError::Json(e.to_string()))?;
                self.b.lit(from, text.as_bytes())
            }
        }
    }
}

impl JsonCompiler<'_> {
    /// The conjunction of constraints `not: n` amounts to, appended to `out`.
    pub(crate) fn not_forms(&self, n: &Value, out: &mut Vec<NotForm>) {
        let m = match n {
            Value::Bool(true) => return out.push(NotForm::Unsat),
            Value::Bool(false) => return out.push(NotForm::NoOp),
            Value::Object(m) => m,
            _ => return out.push(NotForm::Other),
        };
        let keys: Vec<&String> = m.keys().filter(|k| !is_annotation(k)).collect();
        match keys.as_slice() {
            [] => out.push(NotForm::Unsat),
            // not not x = x.
            [k] if k.as_str() == "not" => out.push(NotForm::Positive(m["not"].clone())),
            // not (a or b) = not a and not b.
            [k] if k.as_str() == "anyOf" => match m["anyOf"].as_array() {
                Some(branches) => {
                    for b in branches {
                        self.not_forms(b, out);
                    }
                }
                None => out.push(NotForm::Other),
            },
            [k] if k.as_str() == "required" => {
                match m["required"].as_array().map(|a| a.as_slice()) {
                    Some([Value::String(key)]) => out.push(NotForm::ForbidKey(key.clone())),
                    Some([]) => out.push(NotForm::Unsat),
                    _ => out.push(NotForm::Other),
                }
            }
            [k] if k.as_str() == "type" => match &m["type"] {
                Value::String(t) => out.push(NotForm::NotTypes(vec![t.clone()])),
                Value::Array(a) => out.push(NotForm::NotTypes(
                    a.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect(),
                )),
                _ => out.push(NotForm::Other),
            },
            [k] if k.as_str() == "enum" => match m["enum"].as_array() {
                Some(vals) => out.push(NotForm::NotValues(vals.clone())),
                None => out.push(NotForm::Other),
            },
            [k] if k.as_str() == "const" => out.push(NotForm::NotValues(vec![m["const"].clone()])),
            [k] if k.as_str() == "pattern" && m["pattern"].is_string() => {
                out.push(NotForm::NotPattern(m["pattern"].clone()))
            }
            _ => out.push(NotForm::Other),
        }
    }
}

/// Appends `vals` to the list under `key` (created when absent), each value once.
fn push_list(m: &mut Map<String, Value>, key: &str, vals: impl IntoIterator<Item = Value>) {
    let mut list = match m.remove(key) {
        Some(Value::Array(l)) => l,
        _ => Vec::new(),
    };
    let mut seen = ValueSet::of(&list);
    list.extend(vals.into_iter().filter(|v| seen.insert(v)));
    m.insert(key.into(), Value::Array(list));
}

fn static_type(t: &str) -> Option<&'static str> {
    Some(match t {
        "null" => "null",
        "boolean" => "boolean",
        "object" => "object",
        "array" => "array",
        "string" => "string",
        "number" => "number",
        "integer" => "integer",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfa::Budget;

    #[test]
    fn recursion_past_the_stack_budget_is_refused() {
        let schema = serde_json::json!({"type": "string"});
        let opts = CompileOptions::default();
        let mut b = Builder::new(Budget {
            max_states: 1000,
            deadline: None,
        });
        let r = b.new_rule().unwrap();
        let start = b.rules[r as usize].start;
        let mut c = JsonCompiler::new(&mut b, &schema, &opts);
        assert!(c.value(start, &schema, "#").is_ok());
        // As if the compile had begun a whole budget higher up the stack.
        c.stack_base = stack_address() + MAX_STACK_BYTES;
        let e = c.value(start, &schema, "#").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("JSON Schema compile stack in bytes exceeds the limit of {MAX_STACK_BYTES}")
        );
    }
}
