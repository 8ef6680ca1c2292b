//! `uniqueItems` on arrays of strings, of integers, and of objects open to a free property
//! name (also beside free strings).
//!
//! Uniqueness of unbounded strings is not a regular property, so the automaton alone cannot
//! enforce it. The compiler builds the array as usual but records its states; the matcher
//! then follows the text with a JSON tracker and drops, at an item's closing quote, every
//! thread inside such an array when the item repeats an earlier item of the same array
//! (`crate::unique`).
//!
//! Free strings (`unique_strings`): only the item bodies are recorded
//! (`Builder::unique_ranges`). Exactness rests on three facts the compiler guarantees:
//! - the item strings are canonical (each character in its one spelling,
//!   `types::json_char_canonical_into`: no `\/`, no `\u` for a character that has a literal
//!   or short form), so two items are equal as JSON values iff their texts are equal;
//! - from every state of an item body infinitely many completions remain (no `maxLength`),
//!   so a prefix is always completable to a new item: only the closing quote of a repeated
//!   item is ever refused;
//! - JSON's structure is unambiguous, so the array a thread inside an item body belongs to is
//!   the innermost array the tracker sees.
//!
//! Bounded strings and integers (`unique_bounded`: strings under an `enum` beyond the 8
//! values `array.rs::unique_finite` tracks in the automaton, `pattern`, `format`,
//! `maxLength`; integers, bounded or not — pydantic's `set[int]`, zod's `z.set(z.number()
//! .int())`): the second fact does not hold (a bounded item set runs out, and a number item
//! has no closing byte, so it ends where it may also go on), so the whole array is recorded
//! (`Builder::unique_arrays`) and the matcher also refuses every prefix that can no longer
//! end as a new item. The first fact is checked on the compiled states (no `\` move, no
//! call inside the array); integers are written in one spelling each (no fraction, no
//! exponent, no leading zero, no `-0`: `formats::int_range`). A finite item set allows
//! `minItems` of at most 1, so a used-up set never keeps the array from closing; integers
//! unbounded on a side have infinitely many values and take any `minItems`.
//!
//! Objects open to a free property name, and free strings beside them (`unique_values`):
//! equal values have many texts here (keys in any order, every spelling of a string or a
//! number), so items are compared as values (`crate::canon`) right after the byte that
//! closes them, and only the states that follow each item are recorded
//! (`Builder::unique_after`). No prefix is a dead end: a property of a name no earlier item
//! has can always be added before the `}` (`open_object`).
//!
//! Any other items (`unique_searched`: closed objects, `enum`s of objects, unions with
//! `null`, numbers or bounded strings, items of any kind) are compared as values the same
//! way — numbers and literals too, in these arrays — but may run out of new values
//! part-way: `{"name":"a"` of a closed object whose only other property is written can
//! only end as `{"name":"a"}`, which may be an earlier item. The matcher marks these
//! arrays at their `[` and refuses every prefix of an item that no completion ends as a
//! new value: where an earlier item is still a candidate (it has every complete member
//! the item has, and the open string starts its value) and no thread is in a string
//! that takes more characters, a bounded search for a new-value completion decides.

use serde_json::{Map, Value};

use super::{is_annotation, JsonCompiler};
use crate::nfa::StateId;
use crate::CompileError;

/// Most items written out one by one for `minItems` / `maxItems` (more: refused).
const MAX_UNROLLED: u64 = 64;

impl JsonCompiler<'_> {
    /// `uniqueItems: true` on an array whose items are free strings (`type: string`, at most
    /// `minLength` ≤ 64, unknown `format`s and annotations). `None` when not applicable.
    pub(super) fn unique_strings(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        min: u64,
        max: Option<u64>,
        ptr: &str,
    ) -> Result<Option<StateId>, CompileError> {
        if s.contains_key("contains") || s.contains_key("__contains") {
            return Ok(None);
        }
        let Some(item) = self.uniform_items(s, ptr)? else {
            return Ok(None);
        };
        let Some(item_min) = free_string_min(&item) else {
            if free_values(&item) {
                return self.unique_values(from, &item, min, max, ptr);
            }
            return self.unique_bounded(from, &item, min, max, ptr);
        };
        if item_min > MAX_UNROLLED || min > MAX_UNROLLED || max.is_some_and(|m| m > MAX_UNROLLED) {
            return Ok(None);
        }
        let end = self.unrolled_array(
            from,
            min,
            max,
            &mut |c, st| c.unique_item(st, item_min),
            None,
        )?;
        Ok(Some(end))
    }

    /// `[item, …]` with items 1..=n written out (n = maxItems, or max(minItems, 1) followed
    /// by a loop), so that each item has states of its own; returns the state after `]`.
    /// With `after`, each item's end is a state of its own and the ranges of states that
    /// follow an item (its end, whitespace, `,`, the `]` move's source) are pushed there.
    fn unrolled_array(
        &mut self,
        from: StateId,
        min: u64,
        max: Option<u64>,
        item: &mut dyn FnMut(&mut Self, StateId) -> Result<StateId, CompileError>,
        mut after: Option<&mut Vec<(StateId, StateId)>>,
    ) -> Result<StateId, CompileError> {
        let open = self.b.lit(from, b"[")?;
        let open = self.ws(open)?;
        let close = self.b.state()?;
        if let Some(a) = after.as_deref_mut() {
            a.push((close, close + 1));
        }
        if min == 0 {
            self.b.eps(open, close);
        }
        let n = max.unwrap_or(min.max(1));
        let mut cur = open;
        // The item's end, then (when another item may follow) whitespace and `,`.
        let mut end_item = |c: &mut Self, e: StateId, comma: bool| {
            let Some(a) = after.as_deref_mut() else {
                let st = if comma { Some(c.punct(e, b',')?) } else { None };
                return Ok::<_, CompileError>((e, st));
            };
            let lo = c.b.state()?;
            c.b.eps(e, lo);
            let st = if comma {
                Some(c.punct(lo, b',')?)
            } else {
                None
            };
            a.push((lo, c.b.states.len() as StateId));
            Ok((lo, st))
        };
        let mut next = None;
        for k in 1..=n {
            let st = if k == 1 {
                cur
            } else {
                next.take().unwrap_or(cur)
            };
            let e = item(self, st)?;
            let (e, comma) = end_item(self, e, k < n || max.is_none())?;
            cur = e;
            next = comma;
            if k >= min {
                self.b.eps(cur, close);
            }
        }
        if max.is_none() {
            let st = next.take().unwrap_or(cur);
            let e = item(self, st)?;
            self.b.eps(e, cur);
        }
        let lo = self.b.states.len() as StateId;
        let c = self.ws(close)?;
        if let Some(a) = after {
            if self.b.states.len() as StateId > lo {
                a.push((lo, self.b.states.len() as StateId));
            }
        }
        self.b.lit(c, b"]")
    }

    /// `uniqueItems: true` on an array whose items are strings of any other kind (`enum`,
    /// `pattern`, `format`, `maxLength`…) or numbers, which may run out of new values or
    /// end where they could go on: the whole array is recorded (`Builder::unique_arrays`),
    /// so that the matcher also refuses a prefix that can only end as an earlier item, or a
    /// new item when none is left. `None` when not applicable; refused when the items' text
    /// is not canonical (an escape) or runs through a call, and for `minItems` above 1 over
    /// a finite item set (it could not be reached).
    fn unique_bounded(
        &mut self,
        from: StateId,
        item: &Map<String, Value>,
        min: u64,
        max: Option<u64>,
        ptr: &str,
    ) -> Result<Option<StateId>, CompileError> {
        let numbers = numeric_only(item, "number");
        let infinite = if string_only(item) {
            false
        } else if numbers || numeric_only(item, "integer") {
            let (lo, hi) = Self::bounded_sides(item);
            !lo || !hi
        } else {
            return Ok(None);
        };
        if (min > 1 && !infinite) || max.is_some_and(|m| m > MAX_UNROLLED) {
            return Ok(None);
        }
        let lo = self.b.states.len() as StateId;
        let from_moves = self.b.states[from as usize].bytes.len();
        // Numbers in their one spelling each, so that equal texts are equal values.
        let was = std::mem::replace(&mut self.canonical_numbers, numbers);
        // Each item's states its own: a large pattern is not shared through a rule.
        let was_inline = std::mem::replace(&mut self.inline_strings, true);
        let end = self.unrolled_array(
            from,
            min,
            max,
            &mut |c, st| c.normalized(st, item, ptr),
            None,
        );
        self.canonical_numbers = was;
        self.inline_strings = was_inline;
        let end = end?;
        let hi = self.b.states.len() as StateId;
        // Equal texts must mean equal values (no escapes), and every thread inside an item
        // must be in the range (no calls). Moves into states that cannot reach the array's
        // end are left out (regex intersections emit a sink taking every byte; trimming
        // drops it).
        let live = live_within(&self.b.states, lo, hi, end);
        let exact = (lo..hi).all(|s| {
            let st = &self.b.states[s as usize];
            st.calls.is_empty()
                && st.bytes.iter().all(|&(a, b, t)| {
                    !(a..=b).contains(&b'\\') || !(lo..hi).contains(&t) || !live[(t - lo) as usize]
                })
        });
        if !exact {
            // Unhook the array built for nothing (its states stay unreachable).
            self.b.states[from as usize].bytes.truncate(from_moves);
            return Ok(None);
        }
        self.b.unique_arrays.push((lo, hi));
        Ok(Some(end))
    }

    /// `uniqueItems: true` on an array whose items are objects that always take one more
    /// property of a free name (`open_object`): the items are compiled as usual, and the
    /// states that follow each item are recorded (`Builder::unique_after`), so that the
    /// matcher drops the threads there right after the `}` of an item equal, as a value, to
    /// an earlier one. `None` when the counts are too large to write out.
    fn unique_values(
        &mut self,
        from: StateId,
        item: &Map<String, Value>,
        min: u64,
        max: Option<u64>,
        ptr: &str,
    ) -> Result<Option<StateId>, CompileError> {
        if min > MAX_UNROLLED || max.is_some_and(|m| m > MAX_UNROLLED) {
            return Ok(None);
        }
        let mut after = Vec::new();
        let end = self.unrolled_array(
            from,
            min,
            max,
            &mut |c, st| c.normalized(st, item, ptr),
            Some(&mut after),
        )?;
        self.b.unique_after.extend(after);
        Ok(Some(end))
    }

    /// `uniqueItems: true` on an array whose items are of any other kind (closed objects,
    /// unions with `null` or numbers, any value…), at most one of them required: such
    /// items may run out of new values part-way (a closed object whose free strings are
    /// written, an `enum` used up). The items are compiled as anywhere else and compared as
    /// values ([`crate::canon`]): strings, objects, arrays and literals right after their
    /// last byte (`Builder::unique_after`), numbers before the byte after them. The
    /// array's `[` is recorded (`Builder::searched_opens`): inside it the matcher also
    /// refuses every prefix whose completions are all earlier items (a search for one that
    /// is not, `crate::unique`). `None` for tuples and counts above `MAX_COUNT`.
    pub(super) fn unique_searched(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        min: u64,
        max: Option<u64>,
        ptr: &str,
    ) -> Result<Option<StateId>, CompileError> {
        // More than two copies go through one rule: a few states each, up to the item
        // counts the engine enforces anywhere.
        if min > 1 || max.is_some_and(|m| m > super::types::MAX_COUNT) {
            return Ok(None);
        }
        if s.contains_key("prefixItems") || s.get("items").is_some_and(Value::is_array) {
            return Ok(None);
        }
        let items = s.get("items").cloned().unwrap_or(Value::Bool(true));
        let from_moves = self.b.states[from as usize].bytes.len();
        let mut after = Vec::new();
        // The items as anywhere else (a recursive `$ref` through a rule); more than two
        // copies through one rule.
        let rptr = format!("{ptr}/items");
        let copies = max.unwrap_or(2);
        let end = self.unrolled_array(
            from,
            min,
            max,
            &mut |c, st| {
                if copies > 2 {
                    c.schema_call(st, &items, &rptr)
                } else {
                    c.value(st, &items, &rptr)
                }
            },
            Some(&mut after),
        )?;
        let open = self.b.states[from as usize].bytes[from_moves..]
            .iter()
            .find(|&&(a, b, _)| (a..=b).contains(&b'['))
            .map(|&(_, _, t)| t);
        let Some(open) = open else {
            return Ok(None);
        };
        self.b.unique_after.extend(after);
        self.b.searched_opens.push(open);
        Ok(Some(end))
    }

    /// The normalised schema every item of the array `s` has (no tuple part), if any.
    pub(super) fn uniform_items(
        &mut self,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<Option<Map<String, Value>>, CompileError> {
        if s.contains_key("prefixItems") || s.get("items").is_some_and(|i| i.is_array()) {
            return Ok(None);
        }
        let Some(Value::Object(item)) = s.get("items") else {
            return Ok(None);
        };
        let mark = self.merged_refs.len();
        let item = self.normalize(item, ptr, 0);
        self.merged_refs.truncate(mark);
        item.map(Some)
    }

    /// One item: a quoted free string of at least `min` characters whose body states are
    /// recorded as a unique-item body.
    fn unique_item(&mut self, from: StateId, min: u64) -> Result<StateId, CompileError> {
        let a = self.b.lit(from, b"\"")?;
        // min ≤ 64: the characters are written inline, inside the recorded range (no call),
        // each in its one canonical spelling (equal texts iff equal values).
        let e = self
            .b
            .repeat(a, min, None, &mut super::types::json_char_canonical_into)?;
        let hi = self.b.states.len() as StateId;
        self.b.unique_ranges.push((a, hi));
        self.b.lit(e, b"\"")
    }
}

/// Which states of `lo..hi` reach `end` (inside the range) by byte and epsilon moves: the
/// range has no calls, so the others are dead and trimming removes the moves into them.
fn live_within(states: &[crate::nfa::State], lo: StateId, hi: StateId, end: StateId) -> Vec<bool> {
    let n = (hi - lo) as usize;
    let mut rev: Vec<Vec<StateId>> = vec![Vec::new(); n];
    for s in lo..hi {
        let st = &states[s as usize];
        let targets = st
            .bytes
            .iter()
            .map(|&(_, _, t)| t)
            .chain(st.eps.iter().copied());
        for t in targets.filter(|t| (lo..hi).contains(t)) {
            rev[(t - lo) as usize].push(s);
        }
    }
    let mut live = vec![false; n];
    let mut stack = Vec::new();
    if (lo..hi).contains(&end) {
        live[(end - lo) as usize] = true;
        stack.push(end);
    }
    while let Some(t) = stack.pop() {
        for &s in &rev[(t - lo) as usize] {
            if !live[(s - lo) as usize] {
                live[(s - lo) as usize] = true;
                stack.push(s);
            }
        }
    }
    live
}

/// `Some(minLength)` when a normalised item schema means "any string of at least that many
/// characters": `type: string` and nothing else that constrains, except an unknown `format`
/// (an annotation).
fn free_string_min(item: &Map<String, Value>) -> Option<u64> {
    let is_string = match item.get("type")? {
        Value::String(t) => t == "string",
        Value::Array(ts) => ts.len() == 1 && ts[0] == "string",
        _ => false,
    };
    if !is_string {
        return None;
    }
    let mut min = 0;
    for (k, v) in item {
        match k.as_str() {
            "type" => {}
            "minLength" => {
                let m = v.as_f64()?;
                if m < 0.0 {
                    return None;
                }
                min = m.ceil() as u64;
            }
            "format" => {
                // Unknown formats are annotations (`Some("")`); known ones constrain.
                let f = v.as_str()?;
                if super::formats::format_regex(f).is_none_or(|r| !r.is_empty()) {
                    return None;
                }
            }
            k if is_annotation(k) => {}
            _ => return None,
        }
    }
    Some(min)
}

/// The normalised item schema admits values of the one numeric type `ty` only, without
/// `enum`/`const` (listed values keep the spellings they are written in, `2.0` beside `2`).
/// Integers have one spelling each; numbers get one from `canonical_numbers`.
fn numeric_only(item: &Map<String, Value>, ty: &str) -> bool {
    let only = match item.get("type") {
        Some(Value::String(t)) => t == ty,
        Some(Value::Array(ts)) => ts.len() == 1 && ts[0] == ty,
        _ => false,
    };
    only && !item.contains_key("enum") && !item.contains_key("const")
}

/// The normalised item schema admits strings only (`type: string`, or an `enum`/`const` of
/// strings).
fn string_only(item: &Map<String, Value>) -> bool {
    match item.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.len() == 1 && ts[0] == "string",
        Some(_) => false,
        None => match (item.get("enum"), item.get("const")) {
            (Some(Value::Array(e)), _) => !e.is_empty() && e.iter().all(|v| v.is_string()),
            (None, Some(c)) => c.is_string(),
            _ => false,
        },
    }
}

/// The normalised item schema admits free strings (`free_string_min`) and objects open to
/// a free name (`open_object`), and nothing else: as `type: [string, object]` with keywords
/// of either kind, or as `anyOf` / `oneOf` branches each of which is one of them (a `oneOf`
/// with at most one branch of each type, so that no value matches two). From any prefix of
/// a free string, too, infinitely many values can be written.
fn free_values(item: &Map<String, Value>) -> bool {
    if open_object(item) {
        return true;
    }
    if let Some(Value::Array(ts)) = item.get("type") {
        let kinds_ok = !ts.is_empty() && ts.iter().all(|t| t == "string" || t == "object");
        let mut strings = Map::new();
        let mut objects = Map::new();
        for (k, v) in item {
            match k.as_str() {
                "type" => {}
                "minLength" | "format" => {
                    strings.insert(k.clone(), v.clone());
                }
                _ => {
                    objects.insert(k.clone(), v.clone());
                }
            }
        }
        strings.insert("type".into(), "string".into());
        return kinds_ok
            && !item.contains_key("anyOf")
            && free_string_min(&strings).is_some()
            && open_parts(&objects, 0);
    }
    let (branches, one) = match (item.get("anyOf"), item.get("oneOf")) {
        (Some(Value::Array(b)), None) => (b, false),
        (None, Some(Value::Array(b))) => (b, true),
        _ => return false,
    };
    if item
        .keys()
        .any(|k| k != "anyOf" && k != "oneOf" && !is_annotation(k))
    {
        return false;
    }
    let (mut strings, mut objects) = (0, 0);
    for b in branches {
        let Some(b) = b.as_object() else { return false };
        if free_string_min(b).is_some() {
            strings += 1;
        } else if open_object(b) {
            objects += 1;
        } else {
            return false;
        }
    }
    !branches.is_empty() && (!one || (strings <= 1 && objects <= 1))
}

/// The normalised item schema admits objects only, and every object it admits can take one
/// more property whose name is free: `additionalProperties` absent, `true` or a bare
/// `type`, no `maxProperties`, `patternProperties` or `propertyNames` (which could leave
/// finitely many names); `dependentRequired` / array `dependencies` (they only forbid or
/// require declared names) and `anyOf` branches that are such objects too. Any prefix of
/// such an item can then still end as a value no earlier item has (finish what is open,
/// then add a property named unlike any key of the earlier items before the `}`: every
/// object the compiler builds takes undeclared properties in its last gap, and one of a
/// new name changes neither which branches match nor what is declared), so refusing the
/// `}` of a repeat is all uniqueness needs.
fn open_object(item: &Map<String, Value>) -> bool {
    let is_object = match item.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.len() == 1 && ts[0] == "object",
        _ => false,
    };
    is_object && open_parts(item, 0)
}

/// The keywords of `s` keep an object open to a property of a free name (see
/// [`open_object`]); `anyOf` branches are checked the same way, to `depth` 4.
fn open_parts(s: &Map<String, Value>, depth: u32) -> bool {
    let free_value = |v: &Value| match v {
        Value::Bool(b) => *b,
        Value::Object(m) => m.iter().all(|(k, t)| {
            is_annotation(k)
                || (k == "type"
                    && t.as_str().is_some_and(|t| {
                        matches!(
                            t,
                            "string"
                                | "integer"
                                | "number"
                                | "boolean"
                                | "object"
                                | "array"
                                | "null"
                        )
                    }))
        }),
        _ => false,
    };
    s.iter().all(|(k, v)| match k.as_str() {
        "type" => {
            v == "object"
                || v.as_array()
                    .is_some_and(|t| t.len() == 1 && t[0] == "object")
        }
        "minProperties" => true,
        "properties" => v.is_object(),
        "required" => v.is_array(),
        "additionalProperties" => free_value(v),
        "dependentRequired" | "dependencies" => v
            .as_object()
            .is_some_and(|d| d.values().all(Value::is_array)),
        "anyOf" => {
            depth < 4
                && v.as_array().is_some_and(|bs| {
                    !bs.is_empty()
                        && bs
                            .iter()
                            .all(|b| b.as_object().is_some_and(|b| open_parts(b, depth + 1)))
                })
        }
        k => is_annotation(k),
    })
}
