//! `uniqueItems` on arrays of free strings.
//!
//! Uniqueness of unbounded strings is not a regular property, so the automaton alone cannot
//! enforce it. The compiler builds the array as usual but gives every item's string body its
//! own NFA states and records them (`Builder::unique_ranges`); the matcher then follows the
//! text with a JSON tracker and drops, at an item's closing quote, every thread inside such a
//! body when the item repeats an earlier item of the same array (`crate::unique`).
//!
//! Exactness rests on three facts the compiler guarantees here:
//! - the item strings are canonical (free strings never contain an escape), so two items are
//!   equal as JSON values iff their texts are equal;
//! - from every state of an item body infinitely many completions remain (no `maxLength`),
//!   so a prefix is always completable to a new item: only the closing quote of a repeated
//!   item is ever refused;
//! - JSON's structure is unambiguous, so the array a thread inside an item body belongs to is
//!   the innermost array the tracker sees.

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
            return Ok(None);
        };
        if item_min > MAX_UNROLLED || min > MAX_UNROLLED || max.is_some_and(|m| m > MAX_UNROLLED) {
            return Ok(None);
        }
        let open = self.b.lit(from, b"[")?;
        let open = self.ws(open)?;
        let close = self.b.state()?;
        if min == 0 {
            self.b.eps(open, close);
        }
        // Items 1..=n written out (n = maxItems, or max(minItems, 1) followed by a loop).
        let n = max.unwrap_or(min.max(1));
        let mut cur = open;
        for k in 1..=n {
            let st = if k == 1 { cur } else { self.punct(cur, b',')? };
            cur = self.unique_item(st, item_min)?;
            if k >= min {
                self.b.eps(cur, close);
            }
        }
        if max.is_none() {
            let st = self.punct(cur, b',')?;
            let e = self.unique_item(st, item_min)?;
            self.b.eps(e, cur);
        }
        let c = self.ws(close)?;
        Ok(Some(self.b.lit(c, b"]")?))
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
        // min ≤ 64: the characters are written inline, inside the recorded range (no call).
        let e = self.string_body_free(a, min, None)?;
        let hi = self.b.states.len() as StateId;
        self.b.unique_ranges.push((a, hi));
        self.b.lit(e, b"\"")
    }
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
                let f = v.as_str()?;
                if super::formats::format_regex(f).is_some() {
                    return None;
                }
            }
            k if is_annotation(k) => {}
            _ => return None,
        }
    }
    Some(min)
}
