//! Per-type emitters: numbers, strings, arrays, objects, and the "any other key" automaton.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::formats::{dec_ge, dec_le, format_regex, int_range, number_range, Dec};
use super::JsonCompiler;
use crate::nfa::StateId;
use crate::regex::{emit_hir, emit_hir_len, emit_intersection, parse, Escape, Flavor};
use crate::CompileError;

/// Bounded repetitions longer than this are refused (they would not be enforced cheaply).
const MAX_COUNT: u64 = 4096;

/// A numeric bound: `(value, inclusive)`.
type Bound = Option<(f64, bool)>;

fn f(v: Option<&Value>) -> Option<f64> {
    v.and_then(|x| x.as_f64())
}

impl JsonCompiler<'_> {
    fn emit_regex(
        &mut self,
        from: StateId,
        re: &str,
        flavor: Flavor,
        esc: Escape,
        kw: &str,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let hir = match parse(re, flavor) {
            Ok(h) => h,
            Err(e) => {
                return Err(CompileError::Unsupported {
                    keyword: kw.into(),
                    pointer: ptr.into(),
                    reason: format!("{re:?}: {e}"),
                })
            }
        };
        emit_hir(self.b, from, &hir, esc).map_err(|e| {
            if e.contains("too many states") {
                CompileError::TooLarge {
                    states: self.b.states.len(),
                }
            } else if e.contains("deadline") {
                CompileError::Timeout
            } else {
                CompileError::Unsupported {
                    keyword: kw.into(),
                    pointer: ptr.into(),
                    reason: format!("{re:?}: {e}"),
                }
            }
        })
    }

    /// Numeric bounds as `(value, inclusive)`, handling draft-4 boolean exclusives.
    fn bounds(s: &Map<String, Value>) -> (Bound, Bound) {
        let mut lo =
            f(s.get("minimum")).map(|v| (v, s.get("exclusiveMinimum") != Some(&Value::Bool(true))));
        let mut hi =
            f(s.get("maximum")).map(|v| (v, s.get("exclusiveMaximum") != Some(&Value::Bool(true))));
        if let Some(x) = f(s.get("exclusiveMinimum")) {
            if lo.is_none_or(|(l, _)| x >= l) {
                lo = Some((x, false));
            }
        }
        if let Some(x) = f(s.get("exclusiveMaximum")) {
            if hi.is_none_or(|(h, _)| x <= h) {
                hi = Some((x, false));
            }
        }
        (lo, hi)
    }

    pub(super) fn integer(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        if let Some(m) = s.get("multipleOf").and_then(|m| m.as_number()) {
            // Every integer is a multiple of 10^-k (k >= 0).
            let unit = super::check::decimal(m).is_some_and(|(mm, e)| {
                mm > 0
                    && mm
                        .to_string()
                        .trim_start_matches('1')
                        .bytes()
                        .all(|c| c == b'0')
                    && e + mm.to_string().len() as i32 - 1 <= 0
            });
            if !unit {
                self.unsupported(
                    "multipleOf",
                    ptr,
                    "only multipleOf 10^-k is enforced on integers",
                )?;
            }
        }
        let (lo, hi) = Self::bounds(s);
        const LIM: f64 = 1e15;
        let lo_i = match lo {
            None => None,
            // Beyond ±1e15 bounds are clamped inward: stricter, never looser.
            Some((v, _)) if v < -LIM => Some(-(LIM as i64)),
            Some((v, _)) if v > LIM => return self.nothing(),
            Some((v, inc)) => Some(if inc {
                v.ceil() as i64
            } else {
                v.floor() as i64 + 1
            }),
        };
        let hi_i = match hi {
            None => None,
            Some((v, _)) if v > LIM => Some(LIM as i64),
            Some((v, _)) if v < -LIM => return self.nothing(),
            Some((v, inc)) => Some(if inc {
                v.floor() as i64
            } else {
                v.ceil() as i64 - 1
            }),
        };
        let re = int_range(lo_i, hi_i);
        self.emit_regex(from, &re, Flavor::FullMatch, Escape::Raw, "minimum", ptr)
    }

    pub(crate) fn number_plain(&mut self, from: StateId) -> Result<StateId, CompileError> {
        self.emit_regex(
            from,
            r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
            Flavor::FullMatch,
            Escape::Raw,
            "type",
            "#",
        )
    }

    pub(super) fn number(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let mult = s.get("multipleOf").and_then(|m| m.as_number()).cloned();
        let (lo, hi) = Self::bounds(s);
        if lo.is_none() && hi.is_none() && mult.is_none() {
            return self.number_plain(from);
        }
        let as_int = |b: Option<(f64, bool)>| -> Option<Option<(i64, bool)>> {
            match b {
                None => Some(None),
                Some((v, inc)) if v.fract() == 0.0 && v.abs() < 1e15 => Some(Some((v as i64, inc))),
                Some(_) => None,
            }
        };
        if mult.is_none() {
            if let (Some(l), Some(h)) = (as_int(lo), as_int(hi)) {
                let re = number_range(l, h);
                return self.emit_regex(from, &re, Flavor::FullMatch, Escape::Raw, "minimum", ptr);
            }
        }
        // Decimal bounds and multipleOf 10^-k: an intersection of regexes (no exponent).
        let mut res: Vec<String> = Vec::new();
        match &mult {
            None => res.push(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?".into()),
            Some(m) => match super::check::decimal(m) {
                Some((mm, e))
                    if mm > 0
                        && mm
                            .to_string()
                            .trim_start_matches('1')
                            .bytes()
                            .all(|c| c == b'0') =>
                {
                    let k = e + mm.to_string().len() as i32 - 1;
                    if k > 0 {
                        self.unsupported("multipleOf", ptr, "multipleOf above 1 on numbers")?;
                        res.push(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?".into());
                    } else if k == 0 {
                        res.push(r"-?(0|[1-9][0-9]*)(\.0+)?".into());
                    } else {
                        res.push(format!(r"-?(0|[1-9][0-9]*)(\.[0-9]{{1,{}}}0*)?", -k));
                    }
                }
                _ => {
                    self.unsupported(
                        "multipleOf",
                        ptr,
                        "only multipleOf 10^-k is enforced on numbers",
                    )?;
                    res.push(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?".into());
                }
            },
        }
        let dec = |v: f64| -> Option<Dec> {
            let n = serde_json::Number::from_f64(v)?;
            let (m, e) = super::check::decimal(&n)?;
            Dec::new(m, e)
        };
        for (bound, is_lo) in [(lo, true), (hi, false)] {
            let Some((v, inc)) = bound else { continue };
            match dec(v) {
                Some(d) => res.push(if is_lo {
                    dec_ge(&d, !inc)
                } else {
                    dec_le(&d, !inc)
                }),
                None if is_lo && v < 0.0 || !is_lo && v > 0.0 => {
                    // Beyond ±10^15: clamp inward (stricter).
                    let d = Dec {
                        neg: v < 0.0,
                        int: 999_999_999_999_999,
                        frac: Vec::new(),
                    };
                    res.push(if is_lo {
                        dec_ge(&d, false)
                    } else {
                        dec_le(&d, false)
                    });
                }
                None => return self.nothing(),
            }
        }
        let mut hirs = Vec::new();
        for re in &res {
            hirs.push(
                parse(re, Flavor::FullMatch).map_err(|e| CompileError::Regex {
                    pattern: re.clone(),
                    reason: e,
                })?,
            );
        }
        emit_intersection(self.b, from, &hirs, Escape::Raw).map_err(|e| {
            if e.contains("too many states") {
                CompileError::TooLarge {
                    states: self.b.states.len(),
                }
            } else {
                CompileError::Unsupported {
                    keyword: "minimum".into(),
                    pointer: ptr.into(),
                    reason: e,
                }
            }
        })
    }

    /// A string of `min..=max` characters, any content.
    pub(crate) fn string_free(
        &mut self,
        from: StateId,
        min: u64,
        max: Option<u64>,
    ) -> Result<StateId, CompileError> {
        let a = self.b.lit(from, b"\"")?;
        // Long counted strings call one shared character rule: 2 states per position
        // instead of ~14.
        let long = min.max(max.unwrap_or(0)) > 64;
        let e = if long {
            let rule = match self.char_rule {
                Some(r) => r,
                None => {
                    let r = self.b.new_rule()?;
                    let rr = self.b.rules[r as usize];
                    let e = json_char_into(self.b, rr.start)?;
                    self.b.eps(e, rr.end);
                    self.char_rule = Some(r);
                    r
                }
            };
            self.b.repeat(a, min, max, &mut |b, s| b.call(s, rule))?
        } else {
            self.b.repeat(a, min, max, &mut json_char_into)?
        };
        self.b.lit(e, b"\"")
    }

    pub(super) fn string(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let min = f(s.get("minLength")).unwrap_or(0.0).max(0.0) as u64;
        let max = f(s.get("maxLength")).map(|m| m.max(0.0) as u64);
        if max.is_some_and(|m| m < min) {
            return self.nothing();
        }
        let pattern = s.get("pattern").and_then(|p| p.as_str());
        let mut format = s
            .get("format")
            .and_then(|p| p.as_str())
            .map(|fm| (fm, format_regex(fm)));
        if let Some((fm, None)) = format {
            self.unsupported("format", ptr, &format!("format {fm:?} is not enforced"))?;
            format = None;
        }
        let format_re = format.and_then(|(_, r)| r).filter(|r| !r.is_empty());
        let extra_patterns = s
            .get("__patterns")
            .and_then(|p| p.as_array())
            .into_iter()
            .flatten()
            .filter_map(|p| p.as_str())
            .map(|p| ("pattern", p.to_string(), Flavor::EcmaSearch));
        let res: Vec<(&str, String, Flavor)> = pattern
            .map(|p| ("pattern", p.to_string(), Flavor::EcmaSearch))
            .into_iter()
            .chain(extra_patterns)
            .chain(format_re.map(|r| ("format", r, Flavor::FullMatch)))
            .collect();
        // `not: {enum: [..strings]}`: any string but those (written canonically).
        let excluded: Vec<String> = s
            .get("__not_enum")
            .and_then(|e| e.as_array())
            .map(|e| {
                e.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let not_patterns: Vec<&str> = s
            .get("__not_pattern")
            .and_then(|e| e.as_array())
            .map(|e| e.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        if !excluded.is_empty() || !not_patterns.is_empty() {
            // Key automaton: excluded spellings, then pattern i (bit i): the pattern itself
            // (if any) must match, none of the excluded patterns may.
            let pos = res.iter().all(|r| r.0 == "pattern") && min == 0 && max.is_none();
            if pos && not_patterns.len() + res.len() < 24 {
                // Every positive pattern (all of `res` here) must match.
                let mut pats: Vec<&str> = res.iter().map(|r| r.1.as_str()).collect();
                let first_not = pats.len();
                let pos_mask: u32 = (1u32 << first_not) - 1;
                pats.extend(not_patterns.iter().copied());
                let exits = self.other_key(from, &excluded, &pats, true, ptr)?;
                let exit = self.b.state()?;
                for (set, e) in exits {
                    let has_pos = set & pos_mask == pos_mask;
                    if has_pos && set >> first_not == 0 {
                        self.b.eps(e, exit);
                    }
                }
                return Ok(exit);
            }
            self.unsupported(
                "not",
                ptr,
                "excluded strings together with other string keywords",
            )?;
        }
        if res.len() > 1 && min == 0 && max.is_none() {
            // pattern and format: the product of their DFAs.
            let mut hirs = Vec::new();
            for (kw, re, flavor) in &res {
                hirs.push(parse(re, *flavor).map_err(|e| CompileError::Unsupported {
                    keyword: (*kw).into(),
                    pointer: ptr.into(),
                    reason: format!("{re:?}: {e}"),
                })?);
            }
            let a = self.b.lit(from, b"\"")?;
            match emit_intersection(self.b, a, &hirs, Escape::JsonString) {
                Ok(e) => return self.b.lit(e, b"\""),
                Err(e) if e.contains("too many states") => {
                    return Err(CompileError::TooLarge {
                        states: self.b.states.len(),
                    })
                }
                Err(_) => {}
            }
        }
        if res.len() > 1 {
            self.unsupported(
                "format",
                ptr,
                "a pattern and a format on the same string cannot be intersected",
            )?;
        }
        if let Some((kw, re, flavor)) = res.into_iter().next() {
            let hir = match parse(&re, flavor) {
                Ok(h) => h,
                Err(e) => {
                    return Err(CompileError::Unsupported {
                        keyword: kw.into(),
                        pointer: ptr.into(),
                        reason: format!("{re:?}: {e}"),
                    })
                }
            };
            // Length bounds the regex already implies are dropped (no product needed).
            let p = hir.properties();
            let min_chars = p.minimum_len().map_or(0, |b| b.div_ceil(4)) as u64;
            let max_bytes = p.maximum_len().map(|b| b as u64);
            let lmin = if min_chars >= min { 0 } else { min };
            let lmax = max.filter(|m| max_bytes.is_none_or(|x| x > *m));
            let a = self.b.lit(from, b"\"")?;
            let e = emit_hir_len(self.b, a, &hir, Escape::JsonString, lmin, lmax).map_err(|e| {
                if e.contains("too many states") {
                    CompileError::TooLarge {
                        states: self.b.states.len(),
                    }
                } else if e.contains("deadline") {
                    CompileError::Timeout
                } else {
                    CompileError::Unsupported {
                        keyword: if lmin > 0 || lmax.is_some() {
                            "maxLength"
                        } else {
                            kw
                        }
                        .into(),
                        pointer: ptr.into(),
                        reason: format!("{re:?}: {e}"),
                    }
                }
            })?;
            return self.b.lit(e, b"\"");
        }
        if min > MAX_COUNT {
            self.unsupported(
                "minLength",
                ptr,
                &format!("length bounds above {MAX_COUNT} are not enforced"),
            )?;
            return self.string_free(from, MAX_COUNT, None);
        }
        // A maximum above MAX_COUNT is clamped to it: stricter, never looser.
        self.string_free(from, min, max.map(|m| m.min(MAX_COUNT)))
    }

    pub(super) fn array(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let min = f(s.get("minItems")).unwrap_or(0.0).max(0.0) as u64;
        let max = f(s.get("maxItems")).map(|m| m.max(0.0) as u64);
        if max.is_some_and(|m| m < min) {
            return self.nothing();
        }
        if s.get("uniqueItems") == Some(&Value::Bool(true)) && max.is_none_or(|m| m > 1) {
            if let Some(e) = self.unique_finite(from, s, min, max, ptr)? {
                return Ok(e);
            }
            self.unsupported("uniqueItems", ptr, "uniqueness of items is not enforced")?;
        }
        // Tuple part and the schema for the rest.
        let (tuple, rest): (Vec<Value>, Value) = if let Some(Value::Array(p)) = s.get("prefixItems")
        {
            (
                p.clone(),
                s.get("items").cloned().unwrap_or(Value::Bool(true)),
            )
        } else if let Some(Value::Array(p)) = s.get("items") {
            (
                p.clone(),
                s.get("additionalItems")
                    .cloned()
                    .unwrap_or(Value::Bool(true)),
            )
        } else {
            (
                Vec::new(),
                s.get("items").cloned().unwrap_or(Value::Bool(true)),
            )
        };
        if min > MAX_COUNT || max.is_some_and(|m| m > MAX_COUNT) {
            self.unsupported(
                "maxItems",
                ptr,
                &format!("item counts above {MAX_COUNT} are not enforced"),
            )?;
        }
        let rest_ok = rest != Value::Bool(false);
        let open = self.b.lit(from, b"[")?;
        let open = self.ws(open)?;
        let close = self.b.state()?;
        if min == 0 {
            self.b.eps(open, close);
        }
        let mut cur = open;
        let mut n = 0u64;
        for (i, t) in tuple.iter().enumerate() {
            if max.is_some_and(|m| n >= m) {
                break;
            }
            if i > 0 {
                cur = self.punct(cur, b',')?;
            }
            cur = self.value(cur, t, &format!("{ptr}/prefixItems/{i}"))?;
            n += 1;
            if n >= min {
                self.b.eps(cur, close);
            }
        }
        let rptr = format!("{ptr}/items");
        if rest_ok && max.is_none_or(|m| n < m) {
            // Required rest items, then optional ones (bounded) or a loop.
            let req = min.saturating_sub(n).min(MAX_COUNT);
            let opt = max.map(|m| m.min(MAX_COUNT).saturating_sub(n).saturating_sub(req));
            let copies = req + opt.unwrap_or(0);
            let use_call = copies > 2;
            let item = |c: &mut Self, s: StateId, first: bool| -> Result<StateId, CompileError> {
                let s = if first { s } else { c.punct(s, b',')? };
                if use_call {
                    c.schema_call(s, &rest, &rptr)
                } else {
                    c.value(s, &rest, &rptr)
                }
            };
            for _ in 0..req {
                cur = item(self, cur, n == 0)?;
                n += 1;
            }
            if n >= min {
                self.b.eps(cur, close);
            }
            match opt {
                Some(k) => {
                    for _ in 0..k {
                        cur = item(self, cur, n == 0)?;
                        n += 1;
                        self.b.eps(cur, close);
                    }
                }
                None => {
                    if n == 0 {
                        cur = item(self, cur, true)?;
                        self.b.eps(cur, close);
                    }
                    let lp = self.b.state()?;
                    self.b.eps(cur, lp);
                    let e = item(self, lp, false)?;
                    self.b.eps(e, lp);
                    self.b.eps(lp, close);
                }
            }
        }
        let c = self.ws(close)?;
        self.b.lit(c, b"]")
    }

    /// `uniqueItems` over a small finite item set (`enum`/`const`/boolean/null items, ≤ 8
    /// values): one state per set of values used so far. `None` when not applicable.
    fn unique_finite(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        min: u64,
        max: Option<u64>,
        ptr: &str,
    ) -> Result<Option<StateId>, CompileError> {
        if s.contains_key("prefixItems") || s.get("items").is_some_and(|i| i.is_array()) {
            return Ok(None);
        }
        let Some(Value::Object(item)) = s.get("items") else {
            return Ok(None);
        };
        let mark = self.merged_refs.len();
        let item = self.normalize(item, ptr, 0);
        self.merged_refs.truncate(mark);
        let item = item?;
        let candidates: Vec<Value> = if let Some(Value::Array(e)) = item.get("enum") {
            e.clone()
        } else if let Some(c) = item.get("const") {
            vec![c.clone()]
        } else {
            match item.get("type").and_then(|t| t.as_str()) {
                Some("boolean") => vec![Value::Bool(true), Value::Bool(false)],
                Some("null") => vec![Value::Null],
                _ => return Ok(None),
            }
        };
        let mut vals: Vec<Value> = Vec::new();
        for v in candidates {
            match super::check::check_value(&v, &item) {
                Some(true) if !vals.iter().any(|x| super::json_eq(x, &v)) => vals.push(v),
                Some(_) => {}
                None => return Ok(None),
            }
        }
        if vals.len() > 8 {
            return Ok(None);
        }
        let n = vals.len();
        let max = max.unwrap_or(n as u64).min(n as u64);
        let open = self.b.lit(from, b"[")?;
        let open = self.ws(open)?;
        let close = self.b.state()?;
        let mut ids: Vec<Option<StateId>> = vec![None; 1 << n];
        ids[0] = Some(open);
        for mask in 0usize..(1 << n) {
            let Some(me) = ids[mask] else { continue };
            let used = mask.count_ones() as u64;
            if used >= min {
                self.b.eps(me, close);
            }
            if used >= max {
                continue;
            }
            for (i, v) in vals.iter().enumerate() {
                if mask >> i & 1 == 1 {
                    continue;
                }
                let st = if mask == 0 { me } else { self.punct(me, b',')? };
                let e = self.literal(st, v)?;
                let next = mask | 1 << i;
                let t = match ids[next] {
                    Some(t) => t,
                    None => {
                        let t = self.b.state()?;
                        ids[next] = Some(t);
                        t
                    }
                };
                self.b.eps(e, t);
            }
        }
        let c = self.ws(close)?;
        Ok(Some(self.b.lit(c, b"]")?))
    }

    pub(super) fn object(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let empty = Map::new();
        let props = s
            .get("properties")
            .and_then(|p| p.as_object())
            .unwrap_or(&empty);
        let required: Vec<String> = s
            .get("required")
            .and_then(|r| r.as_array())
            .map(|r| {
                r.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let mut additional = match s.get("additionalProperties") {
            Some(Value::Bool(false)) => None,
            Some(v) => Some(v.clone()),
            None if self.opts.allow_undeclared_properties => Some(Value::Bool(true)),
            None => None,
        };
        let mut patterns: Vec<(String, Value)> = Vec::new();
        if let Some(pp) = s.get("patternProperties").and_then(|p| p.as_object()) {
            for (p, v) in pp {
                patterns.push((p.clone(), v.clone()));
            }
        }
        if patterns.len() > 16 {
            self.unsupported("patternProperties", ptr, "more than 16 patterns")?;
            patterns.truncate(16);
        }
        let mut matchers = Vec::new();
        for (p, _) in &patterns {
            match full_match_regex(p) {
                Ok(re) => matchers.push(re),
                Err(e) => {
                    return Err(CompileError::Unsupported {
                        keyword: "patternProperties".into(),
                        pointer: ptr.into(),
                        reason: format!("{p:?}: {e}"),
                    })
                }
            }
        }
        let min_p = f(s.get("minProperties")).map(|x| x as usize);
        let max_p = f(s.get("maxProperties")).map(|x| x as usize);
        // Items in order: declared properties, then required keys not declared.
        let mut items: Vec<(String, Value, bool)> = Vec::new();
        for (k, v) in props {
            items.push((k.clone(), v.clone(), required.contains(k)));
        }
        for r in &required {
            if !props.contains_key(r) {
                match &additional {
                    Some(a) => items.push((r.clone(), a.clone(), true)),
                    None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                        return self.nothing()
                    }
                    None => items.push((r.clone(), Value::Bool(true), true)),
                }
            }
        }
        // Keys a `not: {required: [k]}` forbids: never produced.
        let forbidden: Vec<String> = s
            .get("__forbidden")
            .and_then(|f| f.as_array())
            .map(|f| {
                f.iter()
                    .filter_map(|k| k.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if items.iter().any(|i| i.2 && forbidden.contains(&i.0)) {
            return self.nothing();
        }
        items.retain(|i| !forbidden.contains(&i.0));
        // A declared key that matches a pattern must satisfy both schemas.
        for item in items.iter_mut() {
            for (i, re) in matchers.iter().enumerate() {
                if re.is_match(item.0.as_str()) {
                    let iptr = format!("{ptr}/patternProperties");
                    item.1 = self.merge_schemas(&item.1, &patterns[i].1, &iptr, 0)?;
                }
            }
        }
        // propertyNames: declared keys checked here, undeclared keys through patterns.
        let mut name_pos: Vec<String> = Vec::new();
        let mut name_neg: Vec<String> = Vec::new();
        let mut name_excl: Vec<String> = Vec::new();
        if let Some(pn) = s.get("propertyNames") {
            let pn_ptr = format!("{ptr}/propertyNames");
            let pn_map = match pn {
                Value::Bool(true) => Map::new(),
                Value::Bool(false) => {
                    let mut m = Map::new();
                    m.insert("__false".into(), Value::Bool(true));
                    m
                }
                Value::Object(m) => {
                    let mark = self.merged_refs.len();
                    let n = self.normalize(m, &pn_ptr, 0);
                    self.merged_refs.truncate(mark);
                    n?
                }
                _ => return Err(self.invalid(&pn_ptr, "a schema must be an object or a boolean")),
            };
            let mut keep = Vec::new();
            for item in items.drain(..) {
                match super::check::check_value(&Value::String(item.0.clone()), &pn_map) {
                    Some(true) => keep.push(item),
                    Some(false) if item.2 => return self.nothing(),
                    Some(false) => {}
                    None => {
                        self.unsupported("propertyNames", &pn_ptr, "cannot check a declared key")?;
                        keep.push(item);
                    }
                }
            }
            items = keep;
            if additional.is_some() || !patterns.is_empty() {
                for (k, v) in &pn_map {
                    if super::is_annotation(k) {
                        continue;
                    }
                    match (k.as_str(), v) {
                        ("type", t) if super::norm::type_list(t).iter().any(|t| t == "string") => {}
                        ("type", _) | ("__false", _) => {
                            additional = None;
                            patterns.clear();
                            matchers.clear();
                        }
                        ("pattern", Value::String(p)) => name_pos.push(p.clone()),
                        ("minLength" | "maxLength", _) => {
                            let lo = pn_map
                                .get("minLength")
                                .and_then(|x| x.as_u64())
                                .unwrap_or(0);
                            let hi = pn_map.get("maxLength").and_then(|x| x.as_u64());
                            let re = match hi {
                                Some(h) => format!("^[\\s\\S]{{{lo},{h}}}$"),
                                None => format!("^[\\s\\S]{{{lo},}}$"),
                            };
                            if !name_pos.contains(&re) {
                                name_pos.push(re);
                            }
                        }
                        ("__not_enum", Value::Array(vals)) => name_excl
                            .extend(vals.iter().filter_map(|x| x.as_str().map(String::from))),
                        ("__not_pattern", Value::Array(ps)) => {
                            name_neg.extend(ps.iter().filter_map(|x| x.as_str().map(String::from)))
                        }
                        ("not", n) => {
                            let mut forms = Vec::new();
                            self.not_forms(n, &mut forms);
                            for f in forms {
                                match f {
                                    super::NotForm::NotValues(vals) => name_excl.extend(
                                        vals.iter().filter_map(|x| x.as_str().map(String::from)),
                                    ),
                                    super::NotForm::NotPattern(Value::String(p)) => {
                                        name_neg.push(p)
                                    }
                                    super::NotForm::NoOp => {}
                                    _ => self.unsupported(
                                        "propertyNames",
                                        &pn_ptr,
                                        "this `not` form",
                                    )?,
                                }
                            }
                        }
                        _ => {
                            self.unsupported("propertyNames", &pn_ptr, &format!("`{k}` on keys"))?
                        }
                    }
                }
            }
            if patterns.len() + name_pos.len() + name_neg.len() > 30 {
                self.unsupported("propertyNames", &pn_ptr, "too many key patterns")?;
                name_pos.clear();
                name_neg.clear();
            }
        }
        // Property counts: tracks 0..=cap; exact up to maxProperties, else saturating at
        // max(minProperties, 1).
        let n_req = items.iter().filter(|i| i.2).count();
        let cap = match (min_p, max_p) {
            (_, Some(mx)) => mx,
            (Some(mn), None) => mn.max(1),
            (None, None) => 1,
        };
        let exact = max_p.is_some();
        let min_count = min_p.unwrap_or(0);
        if max_p.is_some_and(|m| m < n_req || m < min_count) {
            return self.nothing();
        }
        if cap > 32 {
            let kw = if exact {
                "maxProperties"
            } else {
                "minProperties"
            };
            self.unsupported(kw, ptr, "property counts above 32 are not enforced")?;
        }
        let cap = cap.min(32);
        let open = self.b.lit(from, b"{")?;
        let open = self.ws(open)?;
        // Undeclared properties: one rule (`"other key": value`), called from every gap
        // between declared properties.
        let extra_rule = if additional.is_none() && patterns.is_empty() {
            None
        } else {
            let mut declared: Vec<String> = items.iter().map(|i| i.0.clone()).collect();
            declared.extend(forbidden.iter().cloned());
            declared.extend(name_excl.iter().cloned());
            let r = self.b.new_rule()?;
            let rr = self.b.rules[r as usize];
            let mut pats: Vec<&str> = patterns.iter().map(|p| p.0.as_str()).collect();
            let n_pp = pats.len();
            pats.extend(name_pos.iter().map(|p| p.as_str()));
            pats.extend(name_neg.iter().map(|p| p.as_str()));
            let pos_mask: u32 = ((1u32 << name_pos.len()) - 1) << n_pp;
            let neg_mask: u32 = ((1u32 << name_neg.len()) - 1) << (n_pp + name_pos.len());
            let any = additional.is_some() || pats.len() > n_pp;
            let exits = self.other_key(rr.start, &declared, &pats, any, ptr)?;
            for (set, exit) in exits {
                // propertyNames: every positive pattern matches, no negative one does.
                if set & pos_mask != pos_mask || set & neg_mask != 0 {
                    continue;
                }
                let set = set & ((1u32 << n_pp) - 1);
                let k = self.punct(exit, b':')?;
                let e = if set == 0 {
                    match &additional {
                        Some(add) => self.value(k, add, &format!("{ptr}/additionalProperties"))?,
                        None => continue,
                    }
                } else {
                    let mut schema = Value::Bool(true);
                    let pptr = format!("{ptr}/patternProperties");
                    for (i, (_, v)) in patterns.iter().enumerate() {
                        if set >> i & 1 == 1 {
                            schema = self.merge_schemas(&schema, v, &pptr, 0)?;
                        }
                    }
                    self.value(k, &schema, &pptr)?
                };
                self.b.eps(e, rr.end);
            }
            Some(r)
        };
        let tracks_n = cap + 1;
        // tracks[c]: the state after writing c properties (saturating at `cap` unless exact).
        let mut tracks: Vec<Option<StateId>> = vec![None; tracks_n];
        tracks[0] = Some(open);
        let bump = |c: usize| -> Option<usize> {
            if c < cap {
                Some(c + 1)
            } else if exact {
                None
            } else {
                Some(cap)
            }
        };
        let gap = |me: &mut Self, tracks: &mut Vec<Option<StateId>>| -> Result<(), CompileError> {
            let Some(r) = extra_rule else { return Ok(()) };
            let mut new: Vec<Option<StateId>> = vec![None; tracks_n];
            for c in 0..tracks_n {
                let reach_prev = c > 0 && new[c - 1].is_some();
                if tracks[c].is_none() && !reach_prev {
                    continue;
                }
                let lp = me.b.state()?;
                if let Some(t) = tracks[c] {
                    me.b.eps(t, lp);
                }
                if c > 0 {
                    if let Some(p) = new[c - 1] {
                        let s = if c > 1 { me.punct(p, b',')? } else { p };
                        let e = me.b.call(s, r)?;
                        me.b.eps(e, lp);
                    }
                }
                new[c] = Some(lp);
            }
            // Saturated: more undeclared properties keep the count.
            if !exact {
                if let Some(lp) = new[cap] {
                    let cm = me.punct(lp, b',')?;
                    let e = me.b.call(cm, r)?;
                    me.b.eps(e, lp);
                }
            }
            *tracks = new;
            Ok(())
        };
        let share = tracks.len() > 2;
        for (k, v, req) in &items {
            gap(self, &mut tracks)?;
            let key = serde_json::to_string(k).map_err(|e| CompileError::Json(e.to_string()))?;
            let vptr = format!(
                "{ptr}/properties/{}",
                k.replace('~', "~0").replace('/', "~1")
            );
            let rule = if share {
                Some(self.schema_rule(v, &vptr)?)
            } else {
                None
            };
            let kv = |c: &mut Self, s: StateId, comma: bool| -> Result<StateId, CompileError> {
                let s = if comma { c.punct(s, b',')? } else { s };
                let s = c.b.lit(s, key.as_bytes())?;
                let s = c.punct(s, b':')?;
                match rule {
                    Some(r) => c.b.call(s, r),
                    None => c.value(s, v, &vptr),
                }
            };
            let mut new: Vec<Option<StateId>> = vec![None; tracks_n];
            for c in 0..tracks_n {
                let Some(t) = tracks[c] else { continue };
                if !*req {
                    let a = match new[c] {
                        Some(a) => a,
                        None => {
                            let a = self.b.state()?;
                            new[c] = Some(a);
                            a
                        }
                    };
                    self.b.eps(t, a);
                }
                if let Some(c2) = bump(c) {
                    let e = kv(self, t, c > 0)?;
                    let a = match new[c2] {
                        Some(a) => a,
                        None => {
                            let a = self.b.state()?;
                            new[c2] = Some(a);
                            a
                        }
                    };
                    self.b.eps(e, a);
                }
            }
            tracks = new;
        }
        gap(self, &mut tracks)?;
        let close = self.b.state()?;
        for (c, st) in tracks.iter().enumerate() {
            if let Some(st) = st {
                if c >= min_count {
                    self.b.eps(*st, close);
                }
            }
        }
        let c = self.ws(close)?;
        self.b.lit(c, b"}")
    }

    /// A quoted key that is none of `declared`, split by which `patterns` it matches: one
    /// exit per matched-pattern set (bit i = pattern i; set 0 only when `allow_unmatched`).
    /// Keys are written canonically (no `\u`, no `\/`), so the written form decides the key
    /// and excluding declared spellings is exact.
    fn other_key(
        &mut self,
        from: StateId,
        declared: &[String],
        patterns: &[&str],
        allow_unmatched: bool,
        ptr: &str,
    ) -> Result<Vec<(u32, StateId)>, CompileError> {
        use regex_automata::dfa::Automaton;
        // Trie of canonical declared keys.
        let mut trie_children: Vec<HashMap<u8, usize>> = vec![HashMap::new()];
        let mut terminal = vec![false];
        for k in declared {
            let enc = serde_json::to_string(k).map_err(|e| CompileError::Json(e.to_string()))?;
            let bytes = &enc.as_bytes()[1..enc.len() - 1];
            let mut node = 0;
            for &b in bytes {
                node = match trie_children[node].get(&b) {
                    Some(&c) => c,
                    None => {
                        trie_children.push(HashMap::new());
                        terminal.push(false);
                        let c = trie_children.len() - 1;
                        trie_children[node].insert(b, c);
                        c
                    }
                };
            }
            terminal[node] = true;
        }
        // One anchored DFA per pattern, fed the decoded key bytes.
        let mut dfas = Vec::new();
        let mut starts = Vec::new();
        for p in patterns {
            let unsupported = |e: String| CompileError::Unsupported {
                keyword: "patternProperties".into(),
                pointer: ptr.into(),
                reason: format!("{p:?}: {e}"),
            };
            let hir = parse(p, Flavor::EcmaSearch).map_err(unsupported)?;
            let nfa = regex_automata::nfa::thompson::Compiler::new()
                .configure(
                    regex_automata::nfa::thompson::Config::new()
                        .which_captures(regex_automata::nfa::thompson::WhichCaptures::None),
                )
                .build_from_hir(&hir)
                .map_err(|e| unsupported(e.to_string()))?;
            let dfa = regex_automata::dfa::dense::Builder::new()
                .configure(
                    regex_automata::dfa::dense::Config::new()
                        .start_kind(regex_automata::dfa::StartKind::Anchored)
                        .match_kind(regex_automata::MatchKind::All)
                        .dfa_size_limit(Some(1 << 22)),
                )
                .build_from_nfa(&nfa)
                .map_err(|e| unsupported(e.to_string()))?;
            let st = dfa
                .start_state(
                    &regex_automata::util::start::Config::new()
                        .anchored(regex_automata::Anchored::Yes),
                )
                .map_err(|e| unsupported(e.to_string()))?;
            starts.push(st);
            dfas.push(dfa);
        }
        const OFF: usize = usize::MAX;
        type Key = (u8, usize, Vec<regex_automata::util::primitives::StateID>);
        let start = self.b.lit(from, b"\"")?;
        let mut exits: HashMap<u32, StateId> = HashMap::new();
        let mut ids: HashMap<Key, StateId> = HashMap::new();
        let k0: Key = (0, 0, starts);
        ids.insert(k0.clone(), start);
        let mut work = vec![k0];
        let mut steps = 0u32;
        while let Some(key) = work.pop() {
            steps += 1;
            if steps.is_multiple_of(256) {
                self.b.check_deadline()?;
            }
            let (d, t, ref ps) = key;
            let me = ids[&key];
            // The previous byte's successor: runs of bytes with the same successor skip
            // the hash lookup.
            let mut prev: Option<(Key, StateId)> = None;
            if d == 0 && (t == OFF || !terminal[t]) {
                let mut set = 0u32;
                for (i, dfa) in dfas.iter().enumerate() {
                    if dfa.is_match_state(dfa.next_eoi_state(ps[i])) {
                        set |= 1 << i;
                    }
                }
                if set != 0 || allow_unmatched {
                    let exit = match exits.get(&set) {
                        Some(&e) => e,
                        None => {
                            let e = self.b.state()?;
                            exits.insert(set, e);
                            e
                        }
                    };
                    self.b.range(me, b'"', b'"', exit);
                }
            }
            let mut run: Option<(u8, u8, StateId)> = None;
            for byte in 0u8..=255 {
                let target = match key_char_step(d, byte) {
                    None => None,
                    Some(d2) => {
                        let t2 = if t == OFF {
                            OFF
                        } else {
                            trie_children[t].get(&byte).copied().unwrap_or(OFF)
                        };
                        // The decoded byte the patterns see (none for the backslash itself).
                        let fed = match (d, byte) {
                            (0, b'\\') => None,
                            (1, b'b') => Some(8),
                            (1, b'f') => Some(12),
                            (1, b'n') => Some(10),
                            (1, b'r') => Some(13),
                            (1, b't') => Some(9),
                            (_, x) => Some(x),
                        };
                        let ps2: Vec<_> = match fed {
                            None => ps.clone(),
                            Some(x) => dfas
                                .iter()
                                .zip(ps)
                                .map(|(dfa, &s)| dfa.next_state(s, x))
                                .collect(),
                        };
                        let k2: Key = (d2, t2, ps2);
                        let id = match &prev {
                            Some((pk, pid)) if *pk == k2 => *pid,
                            _ => {
                                let id = match ids.get(&k2) {
                                    Some(&id) => id,
                                    None => {
                                        let id = self.b.state()?;
                                        ids.insert(k2.clone(), id);
                                        work.push(k2.clone());
                                        id
                                    }
                                };
                                prev = Some((k2, id));
                                id
                            }
                        };
                        Some(id)
                    }
                };
                match (run, target) {
                    (Some((lo, hi, id)), Some(t2)) if t2 == id && hi as u16 + 1 == byte as u16 => {
                        run = Some((lo, byte, id))
                    }
                    (r, t2) => {
                        if let Some((lo, hi, id)) = r {
                            self.b.range(me, lo, hi, id);
                        }
                        run = t2.map(|id| (byte, byte, id));
                    }
                }
            }
            if let Some((lo, hi, id)) = run {
                self.b.range(me, lo, hi, id);
            }
        }
        let mut out: Vec<(u32, StateId)> = exits.into_iter().collect();
        out.sort_unstable();
        Ok(out)
    }
}

/// A full-match regex for a JSON Schema pattern (search semantics included).
fn full_match_regex(p: &str) -> Result<regex_automata::meta::Regex, String> {
    let hir = parse(p, Flavor::EcmaSearch)?;
    let full = regex_syntax::hir::Hir::concat(vec![
        regex_syntax::hir::Hir::look(regex_syntax::hir::Look::Start),
        hir,
        regex_syntax::hir::Hir::look(regex_syntax::hir::Look::End),
    ]);
    regex_automata::meta::Regex::builder()
        .build_from_hir(&full)
        .map_err(|e| e.to_string())
}

/// The canonical key-character automaton: 0 = between characters, 1 = after `\`,
/// 2..=8 = inside a UTF-8 sequence.
fn key_char_step(d: u8, b: u8) -> Option<u8> {
    match d {
        0 => match b {
            0x20..=0x21 | 0x23..=0x5B | 0x5D..=0x7F => Some(0),
            b'\\' => Some(1),
            0xC2..=0xDF => Some(2),
            0xE0 => Some(5),
            0xE1..=0xEC | 0xEE..=0xEF => Some(3),
            0xED => Some(6),
            0xF0 => Some(7),
            0xF1..=0xF3 => Some(4),
            0xF4 => Some(8),
            _ => None,
        },
        1 => matches!(b, b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't').then_some(0),
        2 => (0x80..=0xBF).contains(&b).then_some(0),
        3 => (0x80..=0xBF).contains(&b).then_some(2),
        4 => (0x80..=0xBF).contains(&b).then_some(3),
        5 => (0xA0..=0xBF).contains(&b).then_some(2),
        6 => (0x80..=0x9F).contains(&b).then_some(2),
        7 => (0x90..=0xBF).contains(&b).then_some(3),
        8 => (0x80..=0x8F).contains(&b).then_some(3),
        _ => None,
    }
}

/// One JSON string character into a bare builder.
fn json_char_into(b: &mut crate::nfa::Builder, from: StateId) -> Result<StateId, CompileError> {
    let exit = b.state()?;
    for (lo, hi) in [(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7F)] {
        b.range(from, lo, hi, exit);
    }
    let c1 = b.state()?;
    b.range(c1, 0x80, 0xBF, exit);
    let c2 = b.state()?;
    b.range(c2, 0x80, 0xBF, c1);
    let c3 = b.state()?;
    b.range(c3, 0x80, 0xBF, c2);
    b.range(from, 0xC2, 0xDF, c1);
    let e0 = b.state()?;
    b.range(from, 0xE0, 0xE0, e0);
    b.range(e0, 0xA0, 0xBF, c1);
    b.range(from, 0xE1, 0xEC, c2);
    b.range(from, 0xEE, 0xEF, c2);
    let ed = b.state()?;
    b.range(from, 0xED, 0xED, ed);
    b.range(ed, 0x80, 0x9F, c1);
    let f0 = b.state()?;
    b.range(from, 0xF0, 0xF0, f0);
    b.range(f0, 0x90, 0xBF, c2);
    b.range(from, 0xF1, 0xF3, c3);
    let f4 = b.state()?;
    b.range(from, 0xF4, 0xF4, f4);
    b.range(f4, 0x80, 0x8F, c2);
    let bs = b.state()?;
    b.range(from, b'\\', b'\\', bs);
    for c in [b'"', b'\\', b'/', b'b', b'f', b'n', b'r', b't'] {
        b.range(bs, c, c, exit);
    }
    let u = b.state()?;
    b.range(bs, b'u', b'u', u);
    let h3 = b.state()?;
    let h2 = b.state()?;
    let h1 = b.state()?;
    for (a, t) in [(h3, h2), (h2, h1), (h1, exit)] {
        b.range(a, b'0', b'9', t);
        b.range(a, b'a', b'f', t);
        b.range(a, b'A', b'F', t);
    }
    for (lo, hi) in [
        (b'0', b'9'),
        (b'a', b'c'),
        (b'A', b'C'),
        (b'e', b'f'),
        (b'E', b'F'),
    ] {
        b.range(u, lo, hi, h3);
    }
    let d = b.state()?;
    b.range(u, b'd', b'd', d);
    b.range(u, b'D', b'D', d);
    b.range(d, b'0', b'7', h2);
    Ok(exit)
}
