//! Number emitters: integer and decimal bounds, `multipleOf` (10^-k as a regex, other
//! divisors and excluded ones through the remainder automaton of `multiple.rs`), and
//! numbers that are not integers.

use serde_json::{Map, Value};

use super::formats::{dec_digits, dec_ge, dec_le, inc_digits, int_range_digits, number_range, Dec};
use super::types::emit_error;
use super::JsonCompiler;
use crate::nfa::StateId;
use crate::regex::{emit_intersection_excluding, parse, Escape, Flavor};
use crate::CompileError;
use regex_syntax::hir::Hir;

/// `k` when `m` is exactly 10^k.
fn power_of_ten(m: &serde_json::Number) -> Option<i32> {
    let (mm, e) = super::check::decimal(m)?;
    let t = mm.to_string();
    (mm > 0 && t.trim_start_matches('1').len() == t.len() - 1 && t[1..].bytes().all(|c| c == b'0'))
        .then(|| e + t.len() as i32 - 1)
}

/// Numbers in their one shortest spelling: no exponent, no trailing zero after the point
/// (no `.0` at all), no `-0` (an intersection with the number's other regexes).
const CANONICAL_NUMBER: &str = r"(0|-?[1-9][0-9]*)(\.[0-9]*[1-9])?|-0\.[0-9]*[1-9]";

/// Numbers written with an exponent that a single bound at zero admits (`minimum: 0`, as
/// pydantic's `NonNegativeFloat` and zod's `nonnegative()` write it, takes `1e-6`): the
/// sign and whether any mantissa digit is nonzero decide such a bound, whatever the
/// exponent. `None` for other bounds (their numbers have no exponent: stricter).
fn zero_bound_exponents(lo: Option<(i64, bool)>, hi: Option<(i64, bool)>) -> Option<String> {
    const E: &str = "[eE][+-]?[0-9]+";
    const ANY: &str = r"(0|[1-9][0-9]*)(\.[0-9]+)?";
    const NONZERO: &str = r"([1-9][0-9]*(\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)";
    const ZERO: &str = r"0(\.0+)?";
    Some(match (lo, hi) {
        (Some((0, true)), None) => format!("({ANY}|-{ZERO}){E}"),
        (Some((0, false)), None) => format!("{NONZERO}{E}"),
        (None, Some((0, true))) => format!("(-{ANY}|{ZERO}){E}"),
        (None, Some((0, false))) => format!("-{NONZERO}{E}"),
        _ => return None,
    })
}

impl JsonCompiler<'_> {
    /// Whether the schema bounds numbers from below and from above (`minimum` /
    /// `exclusiveMinimum`, `maximum` / `exclusiveMaximum` as numbers).
    pub(super) fn bounded_sides(s: &Map<String, Value>) -> (bool, bool) {
        let num = |k: &str| s.get(k).is_some_and(Value::is_number);
        (
            num("minimum") || num("exclusiveMinimum"),
            num("maximum") || num("exclusiveMaximum"),
        )
    }

    pub(super) fn integer(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        // Every integer is a multiple of 10^-k (k >= 0); other divisors (and excluded
        // ones) take the remainder automaton.
        let (pos, neg) = super::multiple::divisors(s);
        let mut residue = None;
        if !neg.is_empty() || pos.iter().any(|m| power_of_ten(m).is_none_or(|k| k > 0)) {
            match super::multiple::Residue::new(&pos, &neg) {
                Ok(r) => residue = Some(r),
                Err(e) => self.unsupported("multipleOf", ptr, &e)?,
            }
        }
        let (lo, hi) = self.dec_bounds(s, ptr)?;
        let lo_i = lo.map(|(d, inc)| int_above(&d, inc));
        let hi_i = hi.map(|(d, inc)| int_below(&d, inc));
        let re = int_range_digits(
            lo_i.as_ref().map(|(n, d)| (*n, d.as_str())),
            hi_i.as_ref().map(|(n, d)| (*n, d.as_str())),
        );
        // `not: {enum: [..]}` values: integers have one spelling here (no fraction, no
        // exponent; `-0` is 0), so excluding them is excluding those texts.
        let excluded = excluded_numbers(s, true);
        match residue {
            Some(r) => self.emit_residue(from, &[re], &excluded, Some(&r), ptr),
            None if excluded.is_empty() => {
                self.emit_regex(from, &re, Flavor::FullMatch, Escape::Raw, "minimum", ptr)
            }
            None => self.emit_residue(from, &[re], &excluded, None, ptr),
        }
    }

    /// The intersection of number regexes (minus the `excluded` ones) with a `multipleOf`
    /// remainder automaton when there is one.
    fn emit_residue(
        &mut self,
        from: StateId,
        res: &[String],
        excluded: &[String],
        r: Option<&super::multiple::Residue>,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let hirs = parse_all(res)?;
        let neg = parse_all(excluded)?;
        let extra = r.map(|r| r as &dyn crate::regex::ByteAutomaton);
        emit_intersection_excluding(self.b, from, &hirs, &neg, extra, Escape::Raw)
            .map_err(|e| emit_error(self.b.states.len(), &e, "multipleOf", ptr, e.clone()))
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
        let (pos, neg) = super::multiple::divisors(s);
        // One divisor 10^-k (k >= 0) is a regex; anything else the remainder automaton.
        let mut mult = pos.first().cloned();
        let mut residue = None;
        if !neg.is_empty()
            || pos.len() > 1
            || mult
                .as_ref()
                .is_some_and(|m| power_of_ten(m).is_none_or(|k| k > 0))
        {
            mult = None;
            match super::multiple::Residue::new(&pos, &neg) {
                Ok(r) => residue = Some(r),
                Err(e) => self.unsupported("multipleOf", ptr, &e)?,
            }
        }
        let (lo, hi) = self.dec_bounds(s, ptr)?;
        // `not: {type: integer}` on numbers: a nonzero digit after the point (no exponent).
        let fraction = s.get("__fraction") == Some(&Value::Bool(true));
        // `not: {enum: [..]}` values: every spelling without an exponent (trailing zeros,
        // `-0`) is excluded; numbers with excluded values have no exponent (stricter).
        let excluded = excluded_numbers(s, false);
        let plain =
            excluded.is_empty() && !fraction && residue.is_none() && !self.canonical_numbers;
        if lo.is_none() && hi.is_none() && mult.is_none() && plain {
            return self.number_plain(from);
        }
        let as_int = |b: &Option<(Dec, bool)>| -> Option<Option<(i64, bool)>> {
            match b {
                None => Some(None),
                Some((d, inc)) if d.frac.is_empty() && d.int.len() <= 15 => {
                    let m: i64 = d.int.parse().ok()?;
                    Some(Some((if d.neg { -m } else { m }, *inc)))
                }
                Some(_) => None,
            }
        };
        if mult.is_none() && plain {
            if let (Some(l), Some(h)) = (as_int(&lo), as_int(&hi)) {
                let mut re = number_range(l, h);
                if let Some(e) = zero_bound_exponents(l, h) {
                    re = format!("{re}|{e}");
                }
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
        if fraction {
            res.push(r"-?(0|[1-9][0-9]*)\.[0-9]*[1-9][0-9]*".into());
        }
        if self.canonical_numbers {
            res.push(CANONICAL_NUMBER.into());
        }
        for (bound, is_lo) in [(&lo, true), (&hi, false)] {
            let Some((d, inc)) = bound else { continue };
            res.push(if is_lo {
                dec_ge(d, !inc)
            } else {
                dec_le(d, !inc)
            });
        }
        if residue.is_some() || !excluded.is_empty() {
            return self.emit_residue(from, &res, &excluded, residue.as_ref(), ptr);
        }
        let hirs = parse_all(&res)?;
        emit_intersection_excluding(self.b, from, &hirs, &[], None, Escape::Raw)
            .map_err(|e| emit_error(self.b.states.len(), &e, "minimum", ptr, e.clone()))
    }
}

/// An exact numeric bound: `(value, inclusive)`.
type DecBound = Option<(Dec, bool)>;

impl JsonCompiler<'_> {
    /// `minimum` / `maximum` and their exclusive forms as exact decimals, as the schema
    /// writes them (no `f64` rounding: `maximum: 18446744073709551615` stays that number):
    /// the tighter of an inclusive and a numeric exclusive bound, draft 4's boolean
    /// exclusives. A literal of more than 400 digits is refused by name.
    fn dec_bounds(
        &mut self,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<(DecBound, DecBound), CompileError> {
        let read = |k: &str| -> Result<Option<Dec>, CompileError> {
            let Some(Value::Number(n)) = s.get(k) else {
                return Ok(None);
            };
            match super::check::decimal(n).and_then(|(m, e)| Dec::new(m, e)) {
                Some(d) => Ok(Some(d)),
                None => {
                    self.unsupported(k, ptr, "a bound with more than 400 digits")?;
                    Ok(None)
                }
            }
        };
        let exclusive = |k: &str| s.get(k) == Some(&Value::Bool(true));
        let mut lo = read("minimum")?.map(|d| (d, !exclusive("exclusiveMinimum")));
        let mut hi = read("maximum")?.map(|d| (d, !exclusive("exclusiveMaximum")));
        if let Some(x) = read("exclusiveMinimum")? {
            if lo.as_ref().is_none_or(|(l, _)| x.cmp_value(l).is_ge()) {
                lo = Some((x, false));
            }
        }
        if let Some(x) = read("exclusiveMaximum")? {
            if hi.as_ref().is_none_or(|(h, _)| x.cmp_value(h).is_le()) {
                hi = Some((x, false));
            }
        }
        Ok((lo, hi))
    }
}

/// The smallest integer `>= d` (`> d` when not `inclusive`), as (negative, digits).
fn int_above(d: &Dec, inclusive: bool) -> (bool, String) {
    let whole = d.frac.is_empty();
    if !d.neg {
        if whole && inclusive {
            (false, d.int.clone())
        } else {
            (false, inc_digits(&d.int))
        }
    } else if whole && !inclusive {
        signed(true, dec_digits(&d.int))
    } else {
        // ceil(-(i.f)) = -i; -i itself when whole and inclusive.
        signed(true, d.int.clone())
    }
}

/// The largest integer `<= d` (`< d` when not `inclusive`), as (negative, digits).
fn int_below(d: &Dec, inclusive: bool) -> (bool, String) {
    let whole = d.frac.is_empty();
    if d.neg {
        if whole && inclusive {
            (true, d.int.clone())
        } else {
            (true, inc_digits(&d.int))
        }
    } else if whole && !inclusive {
        // `< 0` is `<= -1`.
        if d.int == "0" {
            (true, "1".into())
        } else {
            (false, dec_digits(&d.int))
        }
    } else {
        (false, d.int.clone())
    }
}

/// A signed integer with zero never negative.
fn signed(neg: bool, digits: String) -> (bool, String) {
    (neg && digits != "0", digits)
}

/// Parses whole-text regexes.
fn parse_all(res: &[String]) -> Result<Vec<std::sync::Arc<Hir>>, CompileError> {
    res.iter()
        .map(|re| {
            parse(re, Flavor::FullMatch).map_err(|e| CompileError::Regex {
                pattern: crate::excerpt(re).into_owned(),
                reason: e,
            })
        })
        .collect()
}

/// Regexes for the spellings of the numbers `__not_enum` lists (`not: {enum: [..]}`):
/// for `integer`, the canonical text (and `-0` for 0); for numbers, also the same value
/// with trailing zeros after the point (no exponent: the number regexes have none).
/// Values that are not integers are skipped for `integer` (it cannot spell them).
pub(super) fn excluded_numbers(s: &Map<String, Value>, integer: bool) -> Vec<String> {
    let mut out = Vec::new();
    for v in s
        .get("__not_enum")
        .and_then(|e| e.as_array())
        .into_iter()
        .flatten()
    {
        let Value::Number(n) = v else { continue };
        let Some((m, e)) = super::check::decimal(n) else {
            continue;
        };
        let neg = m < 0;
        let digits = m.unsigned_abs().to_string();
        let (int, frac) = if e >= 0 {
            (format!("{digits}{}", "0".repeat(e as usize)), String::new())
        } else {
            let k = (-e) as usize;
            let padded = format!(
                "{}{digits}",
                "0".repeat((k + 1).saturating_sub(digits.len()))
            );
            let (i, f) = padded.split_at(padded.len() - k);
            (i.to_string(), f.trim_end_matches('0').to_string())
        };
        let int = match int.trim_start_matches('0') {
            "" => "0".to_string(),
            t => t.to_string(),
        };
        let sign = if int == "0" && frac.is_empty() {
            "-?"
        } else if neg {
            "-"
        } else {
            ""
        };
        out.push(match (integer, frac.is_empty()) {
            (true, true) => format!("{sign}{int}"),
            (true, false) => continue,
            (false, true) => format!(r"{sign}{int}(\.0+)?"),
            (false, false) => format!(r"{sign}{int}\.{frac}0*"),
        });
    }
    out
}
