//! llama.cpp GBNF → NFA. Each rule becomes an NFA rule; references are calls, so recursion
//! is native. Supported: `name ::= ...`, `|`, `( )`, `*` `+` `?` `{m}` `{m,}` `{m,n}`,
//! string literals and character classes with `\n \r \t \\ \" \] \xHH \uHHHH \UHHHHHHHH`
//! escapes, `[^...]`, `.`, and `#` comments. The start rule is `root`.

//!
//! The parser and the passes after it recurse once per nested group, so the nesting is
//! bounded while parsing ([`MAX_NESTING`]), as are the text, the rules, the alternatives and
//! the repetition counts: a grammar past a limit is refused before anything is built.

use std::collections::HashMap;
use std::time::Instant;

use regex_syntax::hir::{ClassUnicode, ClassUnicodeRange, Dot, Hir};

use crate::nfa::{Builder, RuleId, StateId};
use crate::regex::{emit_hir, Escape};
use crate::{excerpt, CompileError};

/// Longest grammar text, in bytes (a large generated grammar is some tens of KiB).
pub(crate) const MAX_BYTES: usize = 512 << 10;
/// Most rules.
pub(crate) const MAX_RULES: usize = 10_000;
/// Most alternatives, counted over every rule and group (a sequence without `|` is one).
pub(crate) const MAX_ALTERNATIVES: usize = 65_536;
/// Deepest nesting of parenthesised groups (every level is a few stack frames in the
/// parser and in the NFA emission).
pub(crate) const MAX_NESTING: usize = 128;
/// Largest count in `{m}`, `{m,}` and `{m,n}`.
pub(crate) const MAX_REPEAT: u64 = 10_000;

#[derive(Debug, Clone)]
enum Atom {
    Lit(Vec<u8>),
    Class(Hir),
    /// A rule reference and the byte offset where it appears (for the error's line).
    Ref(String, usize),
    Group(Alts),
}

type Alts = Vec<Vec<(Atom, u64, Option<u64>)>>;

fn limit(limit: &'static str, max: usize) -> CompileError {
    CompileError::LimitExceeded { limit, max }
}

/// 1-based line of byte offset `pos` in `s`.
fn line_at(s: &[u8], pos: usize) -> usize {
    s[..pos.min(s.len())]
        .iter()
        .filter(|&&c| c == b'\n')
        .count()
        + 1
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    /// Alternatives parsed so far (bounded by [`MAX_ALTERNATIVES`]).
    alternatives: usize,
    deadline: Option<Instant>,
}

impl<'a> Parser<'a> {
    fn line(&self) -> usize {
        line_at(self.s, self.pos)
    }

    fn err(&self, msg: impl Into<String>) -> CompileError {
        CompileError::Gbnf {
            line: self.line(),
            message: msg.into(),
        }
    }

    /// Counts one more alternative.
    fn alternative(&mut self) -> Result<(), CompileError> {
        self.alternatives += 1;
        if self.alternatives > MAX_ALTERNATIVES {
            return Err(limit("GBNF alternatives", MAX_ALTERNATIVES));
        }
        Ok(())
    }

    /// Skips spaces, tabs, comments and (when `nl`) newlines.
    fn skip(&mut self, nl: bool) {
        while self.pos < self.s.len() {
            match self.s[self.pos] {
                b' ' | b'\t' | b'\r' => self.pos += 1,
                b'\n' if nl => self.pos += 1,
                b'#' => {
                    while self.pos < self.s.len() && self.s[self.pos] != b'\n' {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn ident(&mut self) -> Option<String> {
        let st = self.pos;
        while self.pos < self.s.len()
            && (self.s[self.pos].is_ascii_alphanumeric()
                || self.s[self.pos] == b'-'
                || self.s[self.pos] == b'_')
        {
            self.pos += 1;
        }
        (self.pos > st).then(|| String::from_utf8_lossy(&self.s[st..self.pos]).into_owned())
    }

    /// True when the next tokens are `ident ::=` (start of the next rule).
    fn at_rule_start(&mut self) -> bool {
        let save = self.pos;
        self.skip(true);
        let ok = self.ident().is_some() && {
            self.skip(true);
            self.s[self.pos..].starts_with(b"::=")
        };
        self.pos = save;
        ok
    }

    fn char_escape(&mut self) -> Result<u32, CompileError> {
        // At the byte after `\`.
        let c = *self
            .s
            .get(self.pos)
            .ok_or_else(|| self.err("dangling escape"))?;
        self.pos += 1;
        let hex = |p: &mut Self, n: usize| -> Result<u32, CompileError> {
            let t =
                p.s.get(p.pos..p.pos + n)
                    .ok_or_else(|| p.err("short hex escape"))?;
            p.pos += n;
            u32::from_str_radix(std::str::from_utf8(t).unwrap_or("x"), 16)
                .map_err(|_| p.err("bad hex escape"))
        };
        Ok(match c {
            b'n' => 10,
            b'r' => 13,
            b't' => 9,
            b'x' => hex(self, 2)?,
            b'u' => hex(self, 4)?,
            b'U' => hex(self, 8)?,
            other => other as u32,
        })
    }

    /// One UTF-8 char (or escape) as a code point.
    fn char_at(&mut self) -> Result<u32, CompileError> {
        let Some(&c) = self.s.get(self.pos) else {
            // `[a-` at the very end: a range with no upper end.
            return Err(self.err("unterminated class"));
        };
        if c == b'\\' {
            self.pos += 1;
            return self.char_escape();
        }
        let rest =
            std::str::from_utf8(&self.s[self.pos..]).map_err(|_| self.err("invalid UTF-8"))?;
        let ch = rest
            .chars()
            .next()
            .ok_or_else(|| self.err("unexpected end"))?;
        self.pos += ch.len_utf8();
        Ok(ch as u32)
    }

    /// The alternatives of a rule body (`depth` 0) or of a group `depth` levels deep.
    fn alts(&mut self, depth: usize) -> Result<Alts, CompileError> {
        let in_group = depth > 0;
        self.alternative()?;
        let mut alts = vec![Vec::new()];
        loop {
            self.skip(in_group);
            if self.pos >= self.s.len() {
                break;
            }
            if !in_group && self.s[self.pos] == b'\n' {
                if self.at_rule_start()
                    || self.s[self.pos..].iter().all(|c| c.is_ascii_whitespace())
                {
                    break;
                }
                self.pos += 1;
                continue;
            }
            let c = self.s[self.pos];
            let atom = match c {
                b'|' => {
                    self.pos += 1;
                    self.alternative()?;
                    alts.push(Vec::new());
                    continue;
                }
                b')' if in_group => break,
                b'"' => self.literal()?,
                b'[' => self.class()?,
                b'.' => {
                    self.pos += 1;
                    Atom::Class(Hir::dot(Dot::AnyChar))
                }
                b'(' => {
                    if depth >= MAX_NESTING {
                        return Err(limit("GBNF group nesting", MAX_NESTING));
                    }
                    self.pos += 1;
                    let g = self.alts(depth + 1)?;
                    self.skip(true);
                    if self.s.get(self.pos) != Some(&b')') {
                        return Err(self.err("missing )"));
                    }
                    self.pos += 1;
                    Atom::Group(g)
                }
                _ => {
                    let at = self.pos;
                    match self.ident() {
                        Some(name) => Atom::Ref(name, at),
                        None => return Err(self.err(format!("unexpected {:?}", c as char))),
                    }
                }
            };
            let (mut min, mut max) = self.postfix()?;
            if matches!(&atom, Atom::Lit(b) if b.is_empty()) {
                // The empty string repeated is the empty string (and costs nothing to
                // build, so the state budget would not stop a huge count of it).
                (min, max) = (1, Some(1));
            }
            if let Some(last) = alts.last_mut() {
                last.push((atom, min, max));
            }
        }
        Ok(alts)
    }

    /// A string literal, at its opening `"`.
    fn literal(&mut self) -> Result<Atom, CompileError> {
        self.pos += 1;
        let mut bytes = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.pos) else {
                return Err(self.err("unterminated string"));
            };
            if c == b'"' {
                self.pos += 1;
                break;
            }
            let cp = self.char_at()?;
            let ch = char::from_u32(cp).ok_or_else(|| self.err("bad code point"))?;
            let mut buf = [0u8; 4];
            bytes.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        }
        Ok(Atom::Lit(bytes))
    }

    /// A character class, at its opening `[`.
    fn class(&mut self) -> Result<Atom, CompileError> {
        self.pos += 1;
        let neg = self.s.get(self.pos) == Some(&b'^');
        if neg {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.pos) else {
                return Err(self.err("unterminated class"));
            };
            if c == b']' {
                self.pos += 1;
                break;
            }
            let lo = self.char_at()?;
            let mut hi = lo;
            if self.s.get(self.pos) == Some(&b'-') && self.s.get(self.pos + 1) != Some(&b']') {
                self.pos += 1;
                hi = self.char_at()?;
            }
            let (l, h) = (char::from_u32(lo), char::from_u32(hi));
            match (l, h) {
                (Some(l), Some(h)) if l <= h => ranges.push(ClassUnicodeRange::new(l, h)),
                _ => return Err(self.err("bad class range")),
            }
        }
        let mut cls = ClassUnicode::new(ranges);
        if neg {
            cls.negate();
        }
        Ok(Atom::Class(Hir::class(regex_syntax::hir::Class::Unicode(
            cls,
        ))))
    }

    /// The repetition after an atom: `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` (counts up to
    /// [`MAX_REPEAT`]) or none (once), as `(min, max)`.
    fn postfix(&mut self) -> Result<(u64, Option<u64>), CompileError> {
        let one = match self.s.get(self.pos) {
            Some(b'*') => (0, None),
            Some(b'+') => (1, None),
            Some(b'?') => (0, Some(1)),
            Some(b'{') => {
                let end = self.s[self.pos..]
                    .iter()
                    .position(|&c| c == b'}')
                    .ok_or_else(|| self.err("missing }"))?;
                let body =
                    String::from_utf8_lossy(&self.s[self.pos + 1..self.pos + end]).replace(' ', "");
                self.pos += end + 1;
                let parse = |t: &str| match t.parse::<u64>() {
                    Ok(n) if n > MAX_REPEAT => {
                        Err(limit("GBNF repetition count", MAX_REPEAT as usize))
                    }
                    Ok(n) => Ok(n),
                    Err(_) => Err(self.err("bad repetition")),
                };
                return Ok(match body.split_once(',') {
                    None => {
                        let n = parse(&body)?;
                        (n, Some(n))
                    }
                    Some((a, "")) => (parse(a)?, None),
                    Some((a, b)) => {
                        let min = if a.is_empty() { 0 } else { parse(a)? };
                        (min, Some(parse(b)?))
                    }
                });
            }
            _ => return Ok((1, Some(1))),
        };
        self.pos += 1;
        Ok(one)
    }
}

/// Compiles GBNF text into `b` (rule 0 = `root`).
pub(crate) fn compile(b: &mut Builder, text: &str) -> Result<(), CompileError> {
    if text.len() > MAX_BYTES {
        return Err(limit("GBNF text length in bytes", MAX_BYTES));
    }
    let mut p = Parser {
        s: text.as_bytes(),
        pos: 0,
        alternatives: 0,
        deadline: b.budget.deadline,
    };
    let mut defs: Vec<(String, Alts)> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    loop {
        p.skip(true);
        if p.pos >= p.s.len() {
            break;
        }
        if p.deadline.is_some_and(|d| Instant::now() > d) {
            return Err(CompileError::Timeout);
        }
        if defs.len() >= MAX_RULES {
            return Err(limit("GBNF rules", MAX_RULES));
        }
        let name = p.ident().ok_or_else(|| p.err("expected a rule name"))?;
        p.skip(true);
        if !p.s[p.pos..].starts_with(b"::=") {
            return Err(p.err("expected ::="));
        }
        p.pos += 3;
        let alts = p.alts(0)?;
        if seen.insert(name.clone(), defs.len()).is_some() {
            return Err(p.err(format!("rule {} defined twice", excerpt(&name))));
        }
        defs.push((name, alts));
    }
    let root = *seen.get("root").ok_or(CompileError::Gbnf {
        line: 1,
        message: "no root rule".into(),
    })?;
    defs.swap(0, root);
    let mut ids: HashMap<&str, RuleId> = HashMap::with_capacity(defs.len());
    for (n, _) in &defs {
        ids.insert(n, b.new_rule()?);
    }
    let emit = Emit { text, ids: &ids };
    for (n, alts) in &defs {
        b.check_deadline()?;
        let r = b.rules[ids[n.as_str()] as usize];
        let e = emit.alts(b, r.start, alts)?;
        b.eps(e, r.end);
    }
    Ok(())
}

/// Writes parsed rules into the NFA (recursing once per group: as deep as the parser
/// allowed).
struct Emit<'a> {
    text: &'a str,
    ids: &'a HashMap<&'a str, RuleId>,
}

impl Emit<'_> {
    fn alts(&self, b: &mut Builder, from: StateId, alts: &Alts) -> Result<StateId, CompileError> {
        let exit = b.state()?;
        for seq in alts {
            let mut cur = b.state()?;
            b.eps(from, cur);
            for (atom, min, max) in seq {
                cur = b.repeat(cur, *min, *max, &mut |b, s| self.atom(b, s, atom))?;
            }
            b.eps(cur, exit);
        }
        Ok(exit)
    }

    fn atom(&self, b: &mut Builder, from: StateId, atom: &Atom) -> Result<StateId, CompileError> {
        match atom {
            Atom::Lit(bytes) => b.lit(from, bytes),
            Atom::Class(h) => emit_hir(b, from, h, Escape::Raw).map_err(|m| {
                b.budget_error().unwrap_or(CompileError::Gbnf {
                    line: 0,
                    message: m,
                })
            }),
            Atom::Ref(name, at) => {
                let r = *self
                    .ids
                    .get(name.as_str())
                    .ok_or_else(|| CompileError::Gbnf {
                        line: line_at(self.text.as_bytes(), *at),
                        message: format!("undefined rule {}", excerpt(name)),
                    })?;
                b.call(from, r)
            }
            Atom::Group(g) => self.alts(b, from, g),
        }
    }
}
