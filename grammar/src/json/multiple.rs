//! `multipleOf` with any decimal divisor, and its complement: a remainder automaton over the
//! number's digits (no exponent), intersected with the bounds regexes.
//!
//! Every divisor is `a · 10^-e`; with `K` the largest `e`, a number `x` is a multiple of
//! `a · 10^-e` iff `x · 10^K` is an integer (no nonzero fraction digit past the `K`-th)
//! and that integer is `≡ 0 (mod a · 10^(K-e))`. The automaton reads `-`, the integer
//! digits, `.` and the fraction digits, tracking the remainder of the digits read so far
//! modulo the least common multiple `L` of the scaled divisors, how many fraction digits it
//! has folded in (≤ K) and whether a later fraction digit was nonzero. Exact for plain
//! decimals; numbers with an exponent are not produced (stricter, by design).

use serde_json::{Map, Value};

use crate::regex::ByteAutomaton;

/// Largest `L · (K + 1)` (remainder × folded fraction digits) built.
const MAX_RESIDUE: u128 = 50_000;

/// The multiples a number must be (`pos`) and must not be (`neg`) of, scaled to integers.
pub(crate) struct Residue {
    pos: Vec<u128>,
    neg: Vec<u128>,
    /// Least common multiple of every scaled divisor.
    l: u128,
    /// Fraction digits folded into the remainder.
    k: u32,
}

/// The divisors of `multipleOf`, `__multiples` and `__not_multiple` in `s`: (must be a
/// multiple of each, must be a multiple of none).
pub(super) fn divisors(
    s: &Map<String, Value>,
) -> (Vec<serde_json::Number>, Vec<serde_json::Number>) {
    let list = |v: Option<&Value>| -> Vec<serde_json::Number> {
        v.and_then(|x| x.as_array())
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_number().cloned())
            .collect()
    };
    let mut pos = list(s.get("__multiples"));
    if let Some(m) = s.get("multipleOf").and_then(|m| m.as_number()) {
        pos.insert(0, m.clone());
    }
    (pos, list(s.get("__not_multiple")))
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Residue {
    /// The automaton for these divisors; `Err` names why it cannot be built (a divisor
    /// that is not a positive decimal, or a remainder space too large).
    pub(crate) fn new(
        pos: &[serde_json::Number],
        neg: &[serde_json::Number],
    ) -> Result<Self, String> {
        let mut parts = Vec::new();
        for n in pos.iter().chain(neg) {
            match super::check::decimal(n) {
                Some((m, e)) if m > 0 => parts.push((m as u128, e)),
                _ => return Err(format!("multipleOf {n} is not a positive decimal")),
            }
        }
        let k = parts.iter().map(|p| (-p.1).max(0)).max().unwrap_or(0) as u32;
        let mut scaled = Vec::new();
        for &(m, e) in &parts {
            let by = (e + k as i32) as u32;
            let v = 10u128
                .checked_pow(by)
                .and_then(|p| m.checked_mul(p))
                .filter(|v| *v <= MAX_RESIDUE)
                .ok_or_else(|| "a multipleOf divisor too large to enforce".to_string())?;
            scaled.push(v);
        }
        let mut l: u128 = 1;
        for &v in &scaled {
            l = l / gcd(l, v) * v;
            if l * (k as u128 + 1) > MAX_RESIDUE {
                return Err("the multipleOf divisors' common multiple is too large".into());
            }
        }
        let neg = scaled.split_off(pos.len());
        Ok(Residue {
            pos: scaled,
            neg,
            l,
            k,
        })
    }

    // State layout: phase (0 start, 1 after `-`, 2 integer digits, 3 after `.`/fraction
    // digits), remainder r < L, folded fraction digits f ≤ K, nonzero-beyond bit z.
    fn pack(&self, phase: u32, r: u128, f: u32, z: bool) -> u32 {
        let per_r = (self.k + 1) * 2;
        let per_phase = self.l as u32 * per_r;
        phase * per_phase + r as u32 * per_r + f * 2 + z as u32
    }

    fn unpack(&self, s: u32) -> (u32, u128, u32, bool) {
        let per_r = (self.k + 1) * 2;
        let per_phase = self.l as u32 * per_r;
        let phase = s / per_phase;
        let rest = s % per_phase;
        (
            phase,
            (rest / per_r) as u128,
            (rest % per_r) / 2,
            rest % 2 == 1,
        )
    }
}

impl ByteAutomaton for Residue {
    fn start(&self) -> u32 {
        self.pack(0, 0, 0, false)
    }

    fn step(&self, s: u32, b: u8) -> Option<u32> {
        let (phase, r, f, z) = self.unpack(s);
        match (phase, b) {
            (0, b'-') => Some(self.pack(1, 0, 0, false)),
            (0..=2, b'0'..=b'9') => {
                let r2 = (r * 10 + (b - b'0') as u128) % self.l;
                Some(self.pack(2, r2, 0, false))
            }
            (2, b'.') => Some(self.pack(3, r, 0, false)),
            (3, b'0'..=b'9') if f < self.k => {
                let r2 = (r * 10 + (b - b'0') as u128) % self.l;
                Some(self.pack(3, r2, f + 1, z))
            }
            (3, b'0'..=b'9') => Some(self.pack(3, r, f, z || b != b'0')),
            _ => None,
        }
    }

    fn accepts(&self, s: u32) -> bool {
        let (phase, r, f, z) = self.unpack(s);
        if phase < 2 {
            return false;
        }
        // The value times 10^K, modulo L.
        let mut v = r;
        for _ in f..self.k {
            v = v * 10 % self.l;
        }
        self.pos.iter().all(|&a| !z && v % a == 0) && self.neg.iter().all(|&a| z || v % a != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(t: &str) -> serde_json::Number {
        serde_json::from_str(t).unwrap()
    }

    fn run(r: &Residue, text: &str) -> bool {
        let mut s = r.start();
        for &b in text.as_bytes() {
            match r.step(s, b) {
                Some(x) => s = x,
                None => return false,
            }
        }
        r.accepts(s)
    }

    #[test]
    fn agrees_with_exact_division() {
        let divisors = [
            "2", "3", "7", "0.5", "2.5", "0.01", "1.25", "13.5", "6.75", "10",
        ];
        let values: Vec<String> = (-300i64..300)
            .flat_map(|i| {
                [
                    format!("{i}"),
                    format!("{}.{}", i / 4, i.unsigned_abs() % 100),
                    format!("{}.{:03}", i, (i * 7).unsigned_abs() % 1000),
                ]
            })
            .collect();
        for d in divisors {
            let pos = Residue::new(&[num(d)], &[]).unwrap();
            let neg = Residue::new(&[], &[num(d)]).unwrap();
            for v in &values {
                let want = super::super::check::is_multiple(&num(v), &num(d)).unwrap();
                assert_eq!(run(&pos, v), want, "{v} multipleOf {d}");
                assert_eq!(run(&neg, v), !want, "{v} not multipleOf {d}");
            }
        }
        // Two at once: a multiple of 6.75 that is not a multiple of 2.
        let both = Residue::new(&[num("6.75")], &[num("2")]).unwrap();
        for v in &values {
            let a = super::super::check::is_multiple(&num(v), &num("6.75")).unwrap();
            let b = super::super::check::is_multiple(&num(v), &num("2")).unwrap();
            assert_eq!(run(&both, v), a && !b, "{v}");
        }
    }

    #[test]
    fn refuses_what_it_cannot_build() {
        assert!(Residue::new(&[num("0")], &[]).is_err());
        assert!(Residue::new(&[num("-2")], &[]).is_err());
        assert!(Residue::new(&[num("1e-9"), num("7")], &[]).is_err());
        assert!(Residue::new(&[num("99991"), num("99989")], &[]).is_err());
    }
}
