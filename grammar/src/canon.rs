//! A canonical byte form of a JSON value: two texts get the same form iff they are equal
//! values under JSON Schema's equality (`uniqueItems`): objects regardless of key order
//! (a repeated key keeps its last value, as parsers do), strings by their characters
//! whatever their escapes, numbers by mathematical value (`1`, `1.0`, `10e-1` and `-0`/`0`
//! are equal; no rounding through floats, exponents of any size).
//!
//! The form is only compared, never shown: a tag byte per value, lengths as `u32`.

/// Deepest nesting given a form; deeper values get none (`None`).
const MAX_DEPTH: u32 = 1024;

/// The canonical form of the JSON text `text` (surrounding whitespace allowed), `None` when
/// it is not one JSON value or nests deeper than 1,024 levels.
pub(crate) fn canonical(text: &[u8]) -> Option<Vec<u8>> {
    let mut p = Parser { s: text, i: 0 };
    let mut out = Vec::with_capacity(text.len());
    p.ws();
    p.value(&mut out, 0)?;
    p.ws();
    (p.i == text.len()).then_some(out)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        (self.peek()? == b).then(|| self.i += 1)
    }

    fn lit(&mut self, word: &[u8]) -> Option<()> {
        self.s[self.i..]
            .starts_with(word)
            .then(|| self.i += word.len())
    }

    fn value(&mut self, out: &mut Vec<u8>, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'{' => {
                self.i += 1;
                // Members by key; the last of a repeated key wins.
                let mut members: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
                self.ws();
                if self.eat(b'}').is_none() {
                    loop {
                        self.ws();
                        let mut key = Vec::new();
                        self.string(&mut key)?;
                        self.ws();
                        self.eat(b':')?;
                        self.ws();
                        let mut v = Vec::new();
                        self.value(&mut v, depth + 1)?;
                        members.push((key, v));
                        self.ws();
                        if self.eat(b',').is_none() {
                            self.eat(b'}')?;
                            break;
                        }
                    }
                }
                // Stable sort: equal keys stay in text order, the last one is kept.
                members.sort_by(|a, b| a.0.cmp(&b.0));
                let mut kept: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(members.len());
                for m in members {
                    match kept.last_mut() {
                        Some(last) if last.0 == m.0 => *last = m,
                        _ => kept.push(m),
                    }
                }
                out.push(b'o');
                out.extend_from_slice(&(kept.len() as u32).to_le_bytes());
                for (k, v) in kept {
                    out.extend_from_slice(&k);
                    out.extend_from_slice(&v);
                }
            }
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                let mut n = 0u32;
                self.ws();
                if self.eat(b']').is_none() {
                    loop {
                        self.ws();
                        self.value(&mut items, depth + 1)?;
                        n += 1;
                        self.ws();
                        if self.eat(b',').is_none() {
                            self.eat(b']')?;
                            break;
                        }
                    }
                }
                out.push(b'a');
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&items);
            }
            b'"' => self.string(out)?,
            b't' => {
                self.lit(b"true")?;
                out.push(b't');
            }
            b'f' => {
                self.lit(b"false")?;
                out.push(b'f');
            }
            b'n' => {
                self.lit(b"null")?;
                out.push(b'n');
            }
            _ => self.number(out)?,
        }
        Some(())
    }

    /// A string as its UTF-16 code units (escaped or not, a character has one sequence of
    /// them; surrogate pairs written as two escapes are the character they encode).
    fn string(&mut self, out: &mut Vec<u8>) -> Option<()> {
        self.eat(b'"')?;
        let mut units: Vec<u16> = Vec::new();
        loop {
            let b = self.peek()?;
            self.i += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let e = self.peek()?;
                    self.i += 1;
                    let u = match e {
                        b'"' => b'"' as u16,
                        b'\\' => b'\\' as u16,
                        b'/' => b'/' as u16,
                        b'b' => 8,
                        b'f' => 12,
                        b'n' => b'\n' as u16,
                        b'r' => b'\r' as u16,
                        b't' => b'\t' as u16,
                        b'u' => {
                            let hex = self.s.get(self.i..self.i + 4)?;
                            self.i += 4;
                            u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?
                        }
                        _ => return None,
                    };
                    units.push(u);
                }
                _ => {
                    // One UTF-8 character.
                    let len = match b {
                        0..=0x7f => 1,
                        0xc0..=0xdf => 2,
                        0xe0..=0xef => 3,
                        0xf0..=0xf7 => 4,
                        _ => return None,
                    };
                    let start = self.i - 1;
                    let ch = std::str::from_utf8(self.s.get(start..start + len)?).ok()?;
                    self.i = start + len;
                    let mut buf = [0u16; 2];
                    for c in ch.chars() {
                        units.extend_from_slice(c.encode_utf16(&mut buf));
                    }
                }
            }
        }
        out.push(b's');
        out.extend_from_slice(&(units.len() as u32).to_le_bytes());
        for u in units {
            out.extend_from_slice(&u.to_le_bytes());
        }
        Some(())
    }

    /// A number as sign, significant digits and the exponent `e` of `0.d₁d₂… × 10^e` (in
    /// decimal, exactly); zero as one tag whatever its sign.
    fn number(&mut self, out: &mut Vec<u8>) -> Option<()> {
        let neg = self.eat(b'-').is_some();
        let mut digits: Vec<u8> = Vec::new();
        // Position of the point among `digits`.
        let mut point: i64 = 0;
        let start = self.i;
        while let Some(b @ b'0'..=b'9') = self.peek() {
            digits.push(b);
            self.i += 1;
        }
        if self.i == start {
            return None;
        }
        point += digits.len() as i64;
        if self.eat(b'.').is_some() {
            let f = self.i;
            while let Some(b @ b'0'..=b'9') = self.peek() {
                digits.push(b);
                self.i += 1;
            }
            if self.i == f {
                return None;
            }
        }
        let mut exp: Vec<u8> = Vec::new();
        let mut exp_neg = false;
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            match self.peek() {
                Some(b'-') => {
                    exp_neg = true;
                    self.i += 1;
                }
                Some(b'+') => self.i += 1,
                _ => {}
            }
            let e0 = self.i;
            while let Some(b @ b'0'..=b'9') = self.peek() {
                exp.push(b);
                self.i += 1;
            }
            if self.i == e0 {
                return None;
            }
        }
        // Leading zeros move the point left, trailing zeros go.
        let lead = digits.iter().take_while(|&&d| d == b'0').count();
        if lead == digits.len() {
            out.push(b'0');
            return Some(());
        }
        point -= lead as i64;
        let mut sig = &digits[lead..];
        while sig.last() == Some(&b'0') {
            sig = &sig[..sig.len() - 1];
        }
        let e = add_small(exp_neg, &exp, point);
        out.push(if neg { b'-' } else { b'+' });
        out.extend_from_slice(&(sig.len() as u32).to_le_bytes());
        out.extend_from_slice(sig);
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(&e);
        Some(())
    }
}

/// The UTF-16 code units that the body of an open string (`body`: after its opening quote,
/// no closing quote) certainly starts with — an escape or a UTF-8 character cut short at
/// the end is left out — and whether they are the whole body. `None` when the body is not
/// JSON string text.
pub(crate) fn open_string_units(body: &[u8]) -> Option<(Vec<u16>, bool)> {
    let mut p = Parser { s: body, i: 0 };
    let mut units = Vec::new();
    while p.i < body.len() {
        let at = p.i;
        // One character: parse it as a one-character string, in a copy.
        let len = match body[at] {
            b'\\' if body.get(at + 1) == Some(&b'u') => 6,
            b'\\' => 2,
            0..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => return None,
        };
        if at + len > body.len() {
            return Some((units, false));
        }
        let mut one = Vec::with_capacity(len + 2);
        one.push(b'"');
        one.extend_from_slice(&body[at..at + len]);
        one.push(b'"');
        let mut q = Parser { s: &one, i: 0 };
        let mut out = Vec::new();
        q.string(&mut out)?;
        units.extend(
            out[5..]
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]])),
        );
        p.i = at + len;
    }
    Some((units, true))
}

/// The UTF-16 code units of a string's canonical form ([`canonical`]), `None` for another
/// kind of value.
pub(crate) fn string_units(form: &[u8]) -> Option<impl Iterator<Item = u16> + '_> {
    (form.first() == Some(&b's')).then(|| {
        form[5..]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    })
}

/// An object whose text is cut short: what its complete members are and what is open.
#[derive(Debug, Default)]
pub(crate) struct OpenObject {
    /// Complete members: key form, value form ([`canonical`]), in text order.
    pub members: Vec<(Vec<u8>, Vec<u8>)>,
    /// The key of the member being written, once its closing quote is written.
    pub open_key: Option<Vec<u8>>,
    /// The member being written has a string value still open: the UTF-16 code units it
    /// certainly starts with (`None` too when an escape or character is cut short).
    pub open_string: Option<Vec<u16>>,
}

/// The members of an object from its `{` to the end of `text`, which cuts it short (a
/// prefix of JSON text). A number at the very end counts as open (more digits may
/// follow). `None` when the text is not such a prefix or the object is complete.
pub(crate) fn open_object(text: &[u8]) -> Option<OpenObject> {
    let mut p = Parser { s: text, i: 0 };
    let mut out = OpenObject::default();
    p.eat(b'{')?;
    loop {
        p.ws();
        if p.i == text.len() {
            return Some(out);
        }
        let mut key = Vec::new();
        if p.string(&mut key).is_none() {
            // A key still open (or `}` of an empty object: complete).
            return (p.peek() != Some(b'}')).then_some(out);
        }
        p.ws();
        if p.i == text.len() || p.eat(b':').is_none() {
            out.open_key = Some(key);
            return Some(out);
        }
        p.ws();
        let at = p.i;
        let mut v = Vec::new();
        let number = p.peek().is_some_and(|b| b == b'-' || b.is_ascii_digit());
        if p.i == text.len() || p.value(&mut v, 1).is_none() || (number && p.i == text.len()) {
            if text.get(at) == Some(&b'"') {
                out.open_string = open_string_units(&text[at + 1..])
                    .and_then(|(units, whole)| whole.then_some(units));
            }
            out.open_key = Some(key);
            return Some(out);
        }
        out.members.push((key, v));
        p.ws();
        if p.i == text.len() {
            return Some(out);
        }
        p.eat(b',')?;
    }
}

/// Length of the canonical form at the start of `form`.
fn form_len(form: &[u8]) -> Option<usize> {
    let n = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(form.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    match *form.first()? {
        b't' | b'f' | b'n' | b'0' => Some(1),
        b's' => Some(5 + 2 * n(1)?),
        b'+' | b'-' => {
            let sig = n(1)?;
            Some(9 + sig + n(5 + sig)?)
        }
        b'o' => {
            let mut at = 5;
            for _ in 0..n(1)? {
                at += form_len(form.get(at..)?)?;
                at += form_len(form.get(at..)?)?;
            }
            Some(at)
        }
        b'a' => {
            let mut at = 5;
            for _ in 0..n(1)? {
                at += form_len(form.get(at..)?)?;
            }
            Some(at)
        }
        _ => None,
    }
}

/// The value form of member `key` (a key form) in an object's canonical form, without
/// allocating; `None` when absent or not an object.
pub(crate) fn member_value<'a>(form: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    if form.first() != Some(&b'o') {
        return None;
    }
    let count = u32::from_le_bytes(form.get(1..5)?.try_into().ok()?);
    let mut at = 5;
    for _ in 0..count {
        let k = form_len(form.get(at..)?)?;
        let v = form_len(form.get(at + k..)?)?;
        match form[at..at + k].cmp(key) {
            std::cmp::Ordering::Equal => return Some(&form[at + k..at + k + v]),
            // Sorted by key: past it.
            std::cmp::Ordering::Greater => return None,
            std::cmp::Ordering::Less => at += k + v,
        }
    }
    None
}

/// `±digits + k` in canonical decimal (`-` then digits without leading zeros; `0` for
/// zero), for exponents of any length.
fn add_small(neg: bool, digits: &[u8], k: i64) -> Vec<u8> {
    let digits = &digits[digits.iter().take_while(|&&d| d == b'0').count()..];
    if digits.len() <= 30 {
        let mut v: i128 = 0;
        for &d in digits {
            v = v * 10 + (d - b'0') as i128;
        }
        if neg {
            v = -v;
        }
        return (v + k as i128).to_string().into_bytes();
    }
    // |digits| ≥ 10^30 > |k|: the sign stays; add or subtract |k| on the magnitude.
    let mut mag: Vec<u8> = digits.iter().rev().map(|d| d - b'0').collect();
    let grow = (k >= 0) != neg;
    let mut carry = k.unsigned_abs() as u128;
    for d in mag.iter_mut() {
        if carry == 0 {
            break;
        }
        let c = (carry % 10) as i32;
        carry /= 10;
        let mut x = *d as i32 + if grow { c } else { -c };
        if x >= 10 {
            x -= 10;
            carry += 1;
        } else if x < 0 {
            x += 10;
            carry += 1;
        }
        *d = x as u8;
    }
    while carry > 0 {
        mag.push((carry % 10) as u8);
        carry /= 10;
    }
    while mag.len() > 1 && mag.last() == Some(&0) {
        mag.pop();
    }
    let mut s = Vec::with_capacity(mag.len() + 1);
    if neg {
        s.push(b'-');
    }
    s.extend(mag.iter().rev().map(|d| d + b'0'));
    s
}

#[cfg(test)]
mod tests {
    use super::{canonical, member_value, open_object};

    fn same(a: &str, b: &str) -> bool {
        canonical(a.as_bytes()).unwrap() == canonical(b.as_bytes()).unwrap()
    }

    #[test]
    fn equal_values_share_a_form() {
        for (a, b) in [
            (
                r#"{"a":1,"b":[true,null]}"#,
                r#"{ "b" : [ true , null ] , "a" : 1 }"#,
            ),
            ("1", "1.0"),
            ("1", "10e-1"),
            ("100", "1e2"),
            ("0.5", "5E-1"),
            ("-0", "0"),
            ("0.0e7", "-0"),
            ("12.340", "1234e-2"),
            (r#""A""#, r#""\u0041""#),
            (r#""é/""#, r#""\u00e9\/""#),
            (r#""😀""#, r#""\ud83d\ude00""#),
            (r#"{"a":1,"a":2}"#, r#"{"a":2}"#),
            (
                "1e99999999999999999999999999999999999999",
                "10e99999999999999999999999999999999999998",
            ),
            (
                "-1e-99999999999999999999999999999999999999",
                "-0.1e-99999999999999999999999999999999999998",
            ),
        ] {
            assert!(same(a, b), "{a} vs {b}");
        }
    }

    #[test]
    fn different_values_do_not() {
        for (a, b) in [
            (r#"{"a":1}"#, r#"{"a":1,"b":1}"#),
            (r#"{"a":1,"a":2}"#, r#"{"a":1}"#),
            ("[1,2]", "[2,1]"),
            ("[[1],2]", "[[1,2]]"),
            ("1", "-1"),
            ("1", "11"),
            ("9007199254740993", "9007199254740992"),
            ("0.1", "0.10000000000000001"),
            (r#""a""#, r#""a ""#),
            (r#""ab""#, r#"["a","b"]"#),
            ("true", "false"),
            ("null", "0"),
            (
                "1e99999999999999999999999999999999999999",
                "1e99999999999999999999999999999999999998",
            ),
            (r#"{"ab":"c"}"#, r#"{"a":"bc"}"#),
            ("{}", "[]"),
        ] {
            assert!(!same(a, b), "{a} vs {b}");
        }
    }

    #[test]
    fn open_strings_give_the_units_they_start_with() {
        let units = |t: &str| super::open_string_units(t.as_bytes()).unwrap().0;
        let of = |t: &str| {
            let f = canonical(t.as_bytes()).unwrap();
            super::string_units(&f).unwrap().collect::<Vec<u16>>()
        };
        assert_eq!(units("ab"), of(r#""ab""#));
        assert_eq!(units(r#"a\u0041"#), of(r#""aA""#));
        assert_eq!(units(r#"a\u004"#), of(r#""a""#));
        assert_eq!(units(r#"a\"#), of(r#""a""#));
        assert_eq!(units("é"), of(r#""é""#));
        assert_eq!(
            super::open_string_units(b"a\xc3").unwrap(),
            (of(r#""a""#), false)
        );
        assert_eq!(units(r#"\n\/"#), of("\"\\n/\""));
    }

    #[test]
    fn open_objects_give_their_complete_members() {
        let o = open_object(br#"{"a": 1, "b" : {"x":[1,2]}, "c":"h\u0069"#).unwrap();
        assert_eq!(o.members.len(), 2);
        assert_eq!(o.members[0].1, canonical(b"1.0").unwrap());
        assert_eq!(o.members[1].1, canonical(br#"{"x":[1,2.0]}"#).unwrap());
        assert_eq!(o.open_key, canonical(br#""c""#));
        assert_eq!(o.open_string, Some("hi".encode_utf16().collect()));
        // A number at the end may go on; a key cut short is no member yet.
        let o = open_object(br#"{"a":12"#).unwrap();
        assert!(o.members.is_empty() && o.open_key.is_some() && o.open_string.is_none());
        let o = open_object(br#"{"a":true,"b"#).unwrap();
        assert_eq!(o.members.len(), 1);
        assert!(o.open_key.is_none());
        assert!(open_object(br#"{"a":1}"#).is_none());
        assert!(open_object(b"{}").is_none());
    }

    #[test]
    fn object_forms_give_their_members() {
        let form = canonical(br#"{"b":[1,{"z":null}],"a":-2.5e3,"c":"s"}"#).unwrap();
        let key = |k: &str| canonical(format!("\"{k}\"").as_bytes()).unwrap();
        let val = |v: &str| canonical(v.as_bytes()).unwrap();
        assert_eq!(member_value(&form, &key("a")), Some(&val("-2500")[..]));
        assert_eq!(
            member_value(&form, &key("b")),
            Some(&val(r#"[1.0,{"z":null}]"#)[..])
        );
        assert_eq!(member_value(&form, &key("c")), Some(&val(r#""s""#)[..]));
        assert_eq!(member_value(&form, &key("bb")), None);
        assert_eq!(member_value(&form, &key("0")), None);
        assert_eq!(member_value(&val("[1]"), &key("a")), None);
    }

    #[test]
    fn broken_texts_have_no_form() {
        for t in [
            "", "{", r#"{"a"}"#, "1.", "-", "1e", "[1,]", r#""\x""#, "tru", "1 2",
        ] {
            assert!(canonical(t.as_bytes()).is_none(), "{t}");
        }
    }
}
