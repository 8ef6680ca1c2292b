//! Per-type emitters: numbers and strings (arrays: `array.rs`, objects: `object.rs`).

use serde_json::{Map, Value};

use super::formats::{format_regex, format_regex_in_product};
use super::{JsonCompiler, MAX_INLINE_REGEX_STATES};
use crate::nfa::{LongString, StateId};
use crate::regex::{
    emit_hir, emit_hir_len, emit_intersection, parse, thompson_states, Escape, Flavor,
};
use crate::CompileError;

/// Bounded repetitions longer than this are refused (they would not be enforced cheaply).
pub(super) const MAX_COUNT: u64 = 4096;

/// A string's `maxLength` above 64 is counted by the matcher (`crate::length`) instead of
/// built into the automaton when the regex × count product would have more states than this.
const MAX_LENGTH_PRODUCT: usize = 100_000;

/// A regex emitter's error as a compile error: too many states, the deadline, or else a
/// refusal naming `keyword` at `pointer`.
pub(super) fn emit_error(
    states: usize,
    e: &str,
    keyword: &str,
    pointer: &str,
    reason: String,
) -> CompileError {
    if e.contains("too many states") {
        CompileError::TooLarge { states }
    } else if e.contains("deadline") {
        CompileError::Timeout
    } else {
        CompileError::Unsupported {
            keyword: keyword.into(),
            pointer: pointer.into(),
            reason,
        }
    }
}

pub(super) fn f(v: Option<&Value>) -> Option<f64> {
    v.and_then(|x| x.as_f64())
}

impl JsonCompiler<'_> {
    pub(super) fn emit_regex(
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
                    reason: format!("{:?}: {e}", crate::excerpt(re)),
                })
            }
        };
        emit_hir(self.b, from, &hir, esc).map_err(|e| {
            emit_error(
                self.b.states.len(),
                &e,
                kw,
                ptr,
                format!("{:?}: {e}", crate::excerpt(re)),
            )
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
        // And each long (min, max) is one rule called at every use (`maxLength: 255` on
        // dozens of properties would otherwise copy ~512 states each time).
        let key = (String::new(), min, max);
        if long {
            if let Some(&r) = self.len_rules.get(&key) {
                let e = self.b.call(a, r)?;
                return self.b.lit(e, b"\"");
            }
            let r = self.b.new_rule()?;
            let rr = self.b.rules[r as usize];
            let e = self.string_body_free(rr.start, min, max)?;
            self.b.eps(e, rr.end);
            self.len_rules.insert(key, r);
            let e = self.b.call(a, r)?;
            return self.b.lit(e, b"\"");
        }
        let e = self.string_body_free(a, min, max)?;
        self.b.lit(e, b"\"")
    }

    /// A quoted string of at most `max` characters that the matcher counts
    /// (`crate::length`): `body` emits its characters inline (no calls) from the start of a
    /// rule that then closes the quote; one rule per `key`.
    fn counted_string(
        &mut self,
        from: StateId,
        max: u64,
        key: (String, u64, Option<u64>),
        ptr: &str,
        body: &mut dyn FnMut(&mut Self, StateId) -> Result<StateId, CompileError>,
    ) -> Result<StateId, CompileError> {
        let a = self.b.lit(from, b"\"")?;
        if let Some(&r) = self.len_rules.get(&key) {
            return self.b.call(a, r);
        }
        let r = self.b.new_rule()?;
        let rule = self.b.rules[r as usize];
        let e = body(self, rule.start)?;
        let close = self.b.lit(e, b"\"")?;
        self.b.eps(close, rule.end);
        let hi = self.b.states.len() as StateId;
        if (rule.start..hi).any(|s| !self.b.states[s as usize].calls.is_empty()) {
            return Err(CompileError::Unsupported {
                keyword: "maxLength".into(),
                pointer: ptr.into(),
                reason: "a counted string's characters call a rule".into(),
            });
        }
        self.b.long_strings.push(LongString {
            lo: rule.start,
            hi,
            end: rule.end,
            close,
            max: max.min(u64::from(u32::MAX)) as u32,
            chars_left: Vec::new(),
            reach: Vec::new(),
        });
        self.len_rules.insert(key, r);
        self.b.call(a, r)
    }

    /// Where a string body keyed `key` is built: inside a new rule (called from `a` by
    /// [`Self::shared_string_end`]) when `always_rule` or its inline copy was large, else at
    /// `a`; with the state count it starts from.
    fn shared_string_start(
        &mut self,
        a: StateId,
        key: &(String, u64, Option<u64>),
        always_rule: bool,
    ) -> Result<(StateId, Option<crate::nfa::RuleId>, usize), CompileError> {
        let large = !self.inline_strings
            && (always_rule
                || self
                    .regex_size
                    .get(key)
                    .is_some_and(|&n| n > MAX_INLINE_REGEX_STATES));
        let n0 = self.b.states.len();
        Ok(if large {
            let r = self.b.new_rule()?;
            (self.b.rules[r as usize].start, Some(r), n0)
        } else {
            (a, None, n0)
        })
    }

    /// Ends a string body built at `a` (or inside `rule`, called from `a`): a rule is
    /// registered under `key` for later uses; an inline body records its size (states
    /// from `n0`), so that a large one becomes a rule at its second use.
    fn shared_string_end(
        &mut self,
        a: StateId,
        e: StateId,
        rule: Option<crate::nfa::RuleId>,
        key: (String, u64, Option<u64>),
        n0: usize,
    ) -> Result<StateId, CompileError> {
        Ok(match rule {
            Some(r) => {
                let end = self.b.rules[r as usize].end;
                self.b.eps(e, end);
                self.len_rules.insert(key, r);
                self.b.call(a, r)?
            }
            None => {
                self.regex_size.insert(key, self.b.states.len() - n0);
                e
            }
        })
    }

    /// The characters of a free string of `min..=max` characters (no quotes).
    pub(super) fn string_body_free(
        &mut self,
        a: StateId,
        min: u64,
        max: Option<u64>,
    ) -> Result<StateId, CompileError> {
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
        Ok(e)
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
        // Every pattern (`pattern`, and `__patterns` from `allOf` merges); look-aheads at
        // the start (`^(?!X)(?=Y)Z`) or in a loop (`^((?!X).)*$`) become patterns of their
        // own, positive or negative.
        let mut patterns: Vec<String> = Vec::new();
        let mut look_neg: Vec<String> = Vec::new();
        let all = s
            .get("pattern")
            .into_iter()
            .chain(
                s.get("__patterns")
                    .and_then(|p| p.as_array())
                    .into_iter()
                    .flatten(),
            )
            .filter_map(|p| p.as_str());
        for p in all {
            match split_lookaheads(p) {
                Some((rest, pos, neg)) => {
                    patterns.push(rest);
                    patterns.extend(pos);
                    look_neg.extend(neg);
                }
                None => patterns.push(p.to_string()),
            }
        }
        let mut format = s.get("format").and_then(|p| p.as_str()).map(|fm| {
            // Beside a pattern the format goes into a DFA product.
            let re = if !patterns.is_empty() {
                format_regex_in_product(fm)
            } else {
                format_regex(fm)
            };
            (fm, re)
        });
        if let Some((fm, None)) = format {
            self.unsupported(
                "format",
                ptr,
                &format!("format {:?} is not enforced", crate::excerpt(fm)),
            )?;
            format = None;
        }
        let format_re = format.and_then(|(_, r)| r).filter(|r| !r.is_empty());
        let res: Vec<(&str, String, Flavor)> = patterns
            .into_iter()
            .map(|p| ("pattern", p, Flavor::EcmaSearch))
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
        let mut not_patterns: Vec<&str> = s
            .get("__not_pattern")
            .and_then(|e| e.as_array())
            .map(|e| e.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        not_patterns.extend(look_neg.iter().map(|p| p.as_str()));
        if !excluded.is_empty() || !not_patterns.is_empty() {
            // Key automaton: excluded spellings, then pattern i (bit i): the patterns, the
            // format (anchored) and the length bounds must match, none of the excluded
            // patterns may.
            let mut positive: Vec<String> = res
                .iter()
                .map(|(_, re, flavor)| match flavor {
                    Flavor::FullMatch => format!("^(?:{re})$"),
                    Flavor::EcmaSearch => re.clone(),
                })
                .collect();
            if min > 0 || max.is_some() {
                let lo = min.min(MAX_COUNT);
                positive.push(match max {
                    Some(hi) => format!("^[\\s\\S]{{{lo},{}}}$", hi.min(MAX_COUNT)),
                    None => format!("^[\\s\\S]{{{lo},}}$"),
                });
            }
            if min > MAX_COUNT {
                self.unsupported(
                    "minLength",
                    ptr,
                    &format!("length bounds above {MAX_COUNT} are not enforced"),
                )?;
            }
            if not_patterns.len() + positive.len() < 24 {
                // Every positive pattern must match.
                let mut pats: Vec<&str> = positive.iter().map(|r| r.as_str()).collect();
                let first_not = pats.len();
                let pos_mask: u32 = (1u32 << first_not) - 1;
                pats.extend(not_patterns.iter().copied());
                let exits = self
                    .other_key(from, &excluded, &pats, true, !pos_mask, ptr)
                    .map_err(|e| match e {
                        CompileError::Unsupported { reason, .. } => CompileError::Unsupported {
                            keyword: "not".into(),
                            pointer: ptr.into(),
                            reason: format!(
                                "excluded strings beside other string keywords: {reason}"
                            ),
                        },
                        other => other,
                    })?;
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
        if res.len() > 1 && min <= MAX_COUNT {
            // pattern and format: the product of their DFAs (and of a length regex when
            // bounded; a maximum above 256 is counted by the matcher).
            let mut hirs = Vec::new();
            for (kw, re, flavor) in &res {
                hirs.push(parse(re, *flavor).map_err(|e| CompileError::Unsupported {
                    keyword: (*kw).into(),
                    pointer: ptr.into(),
                    reason: format!("{:?}: {e}", crate::excerpt(re)),
                })?);
            }
            let counted = max.filter(|&m| m > 256);
            let max = max.filter(|_| counted.is_none());
            if min > 0 || max.is_some() {
                let re = match max {
                    Some(hi) => format!("[\\s\\S]{{{min},{hi}}}"),
                    None => format!("[\\s\\S]{{{min},}}"),
                };
                hirs.push(parse(&re, Flavor::FullMatch).map_err(|e| {
                    CompileError::Unsupported {
                        keyword: "maxLength".into(),
                        pointer: ptr.into(),
                        reason: format!("{:?}: {e}", crate::excerpt(&re)),
                    }
                })?);
            }
            let states = self.b.states.len();
            let too_large = |e: &str| {
                if e.contains("too many states") {
                    CompileError::TooLarge { states }
                } else {
                    CompileError::Unsupported {
                        keyword: "format".into(),
                        pointer: ptr.into(),
                        reason: format!("a pattern and a format on the same string: {e}"),
                    }
                }
            };
            if let Some(m) = counted {
                let key: String = res.iter().map(|(_, re, _)| format!("{re}\u{1}")).collect();
                return self.counted_string(from, m, (key, min, Some(m)), ptr, &mut |c, st| {
                    emit_intersection(c.b, st, &hirs, Escape::JsonString).map_err(|e| too_large(&e))
                });
            }
            let a = self.b.lit(from, b"\"")?;
            // Like a single regex below: a product whose inline copy was large (`regex`
            // beside a pattern) becomes a rule at its second use.
            let key: String = res
                .iter()
                .map(|(kw, re, _)| format!("{kw}\u{1}{re}\u{1}"))
                .collect();
            let key = (key, min, max);
            if let Some(&r) = self.len_rules.get(&key).filter(|_| !self.inline_strings) {
                let e = self.b.call(a, r)?;
                return self.b.lit(e, b"\"");
            }
            let (start, rule, n0) = self.shared_string_start(a, &key, false)?;
            match emit_intersection(self.b, start, &hirs, Escape::JsonString) {
                Ok(e) => {
                    let e = self.shared_string_end(a, e, rule, key, n0)?;
                    return self.b.lit(e, b"\"");
                }
                Err(e) if e.contains("too many states") => return Err(too_large(&e)),
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
                        reason: format!("{:?}: {e}", crate::excerpt(&re)),
                    })
                }
            };
            // Length bounds the regex already implies are dropped (no product needed).
            let p = hir.properties();
            let min_chars = p.minimum_len().map_or(0, |b| b.div_ceil(4)) as u64;
            let max_bytes = p.maximum_len().map(|b| b as u64);
            let lmin = if min_chars >= min { 0 } else { min };
            let lmax = max.filter(|m| max_bytes.is_none_or(|x| x > *m));
            // A long maximum whose product with the regex would be large is counted by the
            // matcher (pydantic's `HttpUrl`: a URI of at most 2,083 characters).
            if let Some(m) = lmax.filter(|&m| m > 64 && lmin <= MAX_COUNT && !self.inline_strings) {
                let n = thompson_states(&hir).unwrap_or(usize::MAX);
                if m > MAX_COUNT || n.saturating_mul(m as usize + 1) > MAX_LENGTH_PRODUCT {
                    let key = (format!("\u{1}{re}"), lmin, Some(m));
                    return self.counted_string(from, m, key, ptr, &mut |c, st| {
                        emit_hir_len(c.b, st, &hir, Escape::JsonString, lmin, None).map_err(|e| {
                            emit_error(
                                c.b.states.len(),
                                &e,
                                kw,
                                ptr,
                                format!("{:?}: {e}", crate::excerpt(&re)),
                            )
                        })
                    });
                }
            }
            // Otherwise a maximum above MAX_COUNT is clamped to it, as for free strings:
            // stricter, never looser.
            let lmax = lmax.map(|m| m.min(MAX_COUNT));
            let a = self.b.lit(from, b"\"")?;
            // A large product (length bounds on a big regex, e.g. `email` with
            // `maxLength`) is built once per schema as a rule and called.
            let key = (re.clone(), lmin, lmax);
            if let Some(&r) = self.len_rules.get(&key).filter(|_| !self.inline_strings) {
                let e = self.b.call(a, r)?;
                return self.b.lit(e, b"\"");
            }
            // A regex whose inline copy was large (word-count patterns like
            // `^(?:\S+\s+){0,199}\S+$` are ~30k states) becomes a rule at its second use.
            let long = lmax.unwrap_or(lmin) > 64;
            let (start, rule, n0) = self.shared_string_start(a, &key, long)?;
            let e =
                emit_hir_len(self.b, start, &hir, Escape::JsonString, lmin, lmax).map_err(|e| {
                    let keyword = if lmin > 0 || lmax.is_some() {
                        "maxLength"
                    } else {
                        kw
                    };
                    emit_error(
                        self.b.states.len(),
                        &e,
                        keyword,
                        ptr,
                        format!("{:?}: {e}", crate::excerpt(&re)),
                    )
                })?;
            let e = self.shared_string_end(a, e, rule, key, n0)?;
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
        // A maximum above MAX_COUNT is counted by the matcher (the characters inline).
        if let Some(m) = max.filter(|&m| m > MAX_COUNT && min <= 64) {
            return self.counted_string(
                from,
                m,
                (String::from("\u{1}"), min, Some(m)),
                ptr,
                &mut |c, st| c.b.repeat(st, min, None, &mut json_char_into),
            );
        }
        // Else a maximum above MAX_COUNT is clamped to it: stricter, never looser.
        self.string_free(from, min, max.map(|m| m.min(MAX_COUNT)))
    }
}

/// One JSON string character into a bare builder: any character, literal or escaped.
fn json_char_into(b: &mut crate::nfa::Builder, from: StateId) -> Result<StateId, CompileError> {
    let exit = b.state()?;
    json_literal_char_into(b, from, exit)?;
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

/// A character written as itself (printable ASCII but `"` and `\\`, and well-formed UTF-8
/// beyond ASCII), from `from` to `exit`.
fn json_literal_char_into(
    b: &mut crate::nfa::Builder,
    from: StateId,
    exit: StateId,
) -> Result<(), CompileError> {
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
    Ok(())
}

/// One JSON string character in its one canonical spelling (serde_json's, `JSON.stringify`'s):
/// itself where JSON allows that, `\"` `\\` `\b` `\f` `\n` `\r` `\t`, and `\u00xx` (lower-case
/// hex) for the other control characters. Two strings are then equal values iff their texts
/// are equal, which `uniqueItems` on strings rests on (`unique.rs`).
pub(super) fn json_char_canonical_into(
    b: &mut crate::nfa::Builder,
    from: StateId,
) -> Result<StateId, CompileError> {
    let exit = b.state()?;
    json_literal_char_into(b, from, exit)?;
    let bs = b.state()?;
    b.range(from, b'\\', b'\\', bs);
    for c in [b'"', b'\\', b'b', b'f', b'n', b'r', b't'] {
        b.range(bs, c, c, exit);
    }
    // \u0000–\u001f but the five with a short escape (\b \t \n \f \r: 08 09 0a 0c 0d).
    let u = b.state()?;
    let u0 = b.state()?;
    let u00 = b.state()?;
    let lo = b.state()?;
    let hi = b.state()?;
    b.range(bs, b'u', b'u', u);
    b.range(u, b'0', b'0', u0);
    b.range(u0, b'0', b'0', u00);
    b.range(u00, b'0', b'0', lo);
    b.range(u00, b'1', b'1', hi);
    for (a, z) in [(b'0', b'7'), (b'b', b'b'), (b'e', b'f')] {
        b.range(lo, a, z, exit);
    }
    b.range(hi, b'0', b'9', exit);
    b.range(hi, b'a', b'f', exit);
    Ok(exit)
}

/// Splits an ECMA pattern `^(?!X)(?=Y)Z` (look-aheads right after a leading `^`, one
/// branch) into `^Z`, the positive patterns `^(?:Y)` and the negative ones `^(?:X)`: the
/// text matches the pattern iff it matches `^Z` and every positive one and no negative one
/// (each look-ahead is tested at position 0, as `^X` is). `None` when the pattern has no
/// such prefix, or look-arounds elsewhere, or several top-level branches.
pub(super) fn split_lookaheads(p: &str) -> Option<(String, Vec<String>, Vec<String>)> {
    if let Some(r) = split_loop_lookaheads(p) {
        return Some(r);
    }
    let mut rest = p.strip_prefix('^')?;
    if !rest.starts_with("(?=") && !rest.starts_with("(?!") {
        return None;
    }
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    while let Some(positive) = rest
        .strip_prefix("(?=")
        .map(|_| true)
        .or_else(|| rest.strip_prefix("(?!").map(|_| false))
    {
        // The group's end: the matching `)` outside classes and escapes.
        let mut end = None;
        crate::regex::scan_top(rest, |i, c, depth| {
            if c == ')' && depth == 1 {
                end = Some(i);
                return false;
            }
            true
        });
        let end = end?;
        let inner = &rest[3..end];
        if inner.contains("(?=") || inner.contains("(?!") || inner.contains("(?<") {
            return None;
        }
        let pat = format!("^(?:{inner})");
        if positive {
            pos.push(pat);
        } else {
            neg.push(pat);
        }
        rest = &rest[end + 1..];
    }
    if rest.contains("(?=") || rest.contains("(?!") || rest.contains("(?<") {
        return None;
    }
    // `^(?!X)a|b` is `(^(?!X)a)|b`: only one top-level branch can be split this way.
    let mut branches = false;
    crate::regex::scan_top(rest, |_, c, depth| {
        branches = c == '|' && depth == 0;
        !branches
    });
    if branches {
        return None;
    }
    Some((format!("^{rest}"), pos, neg))
}

/// `^((?!X)(?!Y).)*$` (no position where X or Y starts; `.` is any character but a line
/// terminator, `[\s\S]` any character): `^[^\n\r\u2028\u2029]*$` (or nothing) and the
/// negative patterns `X`, `Y` searched anywhere. Exact when X and Y cannot match the empty
/// text (they are then never tried at the end); `None` otherwise or for other shapes.
fn split_loop_lookaheads(p: &str) -> Option<(String, Vec<String>, Vec<String>)> {
    let body = p
        .strip_prefix("^(?:")
        .or_else(|| p.strip_prefix("^("))?
        .strip_suffix(")*$")?;
    let (looks, any) = if let Some(l) = body.strip_suffix('.') {
        (l, false)
    } else {
        (body.strip_suffix("[\\s\\S]")?, true)
    };
    let mut neg = Vec::new();
    let mut rest = looks;
    while !rest.is_empty() {
        let inner_start = rest.strip_prefix("(?!")?;
        // The group's end (no nested groups, classes or escapes of parentheses needed
        // for the shapes met: refuse anything else).
        let end = inner_start.find(')')?;
        let inner = &inner_start[..end];
        if inner.is_empty()
            || inner.contains(['(', '[', '\\', '^', '$', '|', '*', '?', '+', '{', '.'])
        {
            return None;
        }
        neg.push(inner.to_string());
        rest = &inner_start[end + 1..];
    }
    if neg.is_empty() {
        return None;
    }
    let pos = if any {
        "^[\\s\\S]*$".to_string()
    } else {
        "^[^\\n\\r\\u2028\\u2029]*$".to_string()
    };
    Some((pos, Vec::new(), neg))
}
