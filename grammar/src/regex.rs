//! Regular expressions → NFA fragments, via regex-syntax (parse) and regex-automata's
//! Thompson compiler (UTF-8 byte automaton), copied into the grammar's NFA.

use regex_automata::nfa::thompson::{self, State as TState, WhichCaptures};
use regex_automata::util::primitives::StateID as TStateId;
use regex_syntax::hir::{Dot, Hir, HirKind, Look, Repetition};
use std::sync::Arc;

use crate::nfa::{Builder, CountedProduct, StateId, NO_CELL};
use crate::CompileError;

/// Most heap bytes a regex's Thompson automaton may take (the `regex` crate's default):
/// counted repetitions multiply (`((a{1000}){1000}){1000}` is a billion states), and the
/// parser's limits (nesting, pattern size) do not bound the expanded size.
pub(crate) const MAX_THOMPSON_BYTES: usize = 10 << 20;

/// How matched bytes are written into the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Escape {
    /// The bytes themselves.
    Raw,
    /// As the contents of a JSON string: `"`, `\` and control bytes are written escaped.
    JsonString,
}

/// Regex flavour of the source text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Flavor {
    /// Rust regex syntax, whole-text match (`^`/`$` at the ends are no-ops).
    FullMatch,
    /// ECMA-262 as JSON Schema's `pattern` uses it: a search (match anywhere) unless
    /// anchored; `\d`/`\w` are ASCII.
    EcmaSearch,
}

/// Parses `pattern` into the HIR of a whole-text match.
pub(crate) fn parse(pattern: &str, flavor: Flavor) -> Result<Arc<Hir>, String> {
    // Large schemas repeat the same patterns and formats many times (and complements
    // re-parse them): parsed results are memoised per thread, a few hundred at most, and
    // shared (a format's HIR is large: copying it cost a tenth of a big schema's compile).
    type Memo = std::collections::HashMap<(String, Flavor), Result<Arc<Hir>, String>>;
    thread_local! {
        static MEMO: std::cell::RefCell<Memo> = std::cell::RefCell::new(Memo::new());
    }
    let key = (pattern.to_string(), flavor);
    if let Some(r) = MEMO.with(|m| m.borrow().get(&key).cloned()) {
        return r;
    }
    let r = parse_uncached(pattern, flavor).map(Arc::new);
    MEMO.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= 512 {
            m.clear();
        }
        m.insert(key, r.clone());
    });
    r
}

fn parse_uncached(pattern: &str, flavor: Flavor) -> Result<Hir, String> {
    let src = match flavor {
        Flavor::FullMatch => pattern.to_string(),
        Flavor::EcmaSearch => ecma_to_rust(pattern)?,
    };
    // Top-level branches are parsed one by one, so that each keeps its own `^`/`$`
    // (regex-syntax would factor `^$|^a$` into a look-around in the middle).
    let branches = split_top_level(&src);
    if branches.len() > 1 && !src.contains("(?") {
        let mut alts = Vec::new();
        for b in branches {
            alts.push(parse_one(b, flavor)?);
        }
        return Ok(Hir::alternation(alts));
    }
    parse_one(&src, flavor)
}

/// Calls `f(i, c, depth)` for every character of a regex outside character classes and
/// escapes, where `depth` counts the groups open before `c` (so a `)` sees the depth of the
/// group it closes); stops early when `f` returns false.
pub(crate) fn scan_top(src: &str, mut f: impl FnMut(usize, char, i32) -> bool) {
    let (mut depth, mut in_class, mut esc) = (0i32, false, false);
    for (i, c) in src.char_indices() {
        if esc {
            esc = false;
            continue;
        }
        match c {
            '\\' => esc = true,
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            _ if in_class => {}
            _ => {
                if !f(i, c, depth) {
                    return;
                }
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
            }
        }
    }
}

/// Splits a Rust-syntax regex at its top-level `|` (outside groups and classes).
fn split_top_level(src: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0usize;
    scan_top(src, |i, c, depth| {
        if c == '|' && depth == 0 {
            out.push(&src[start..i]);
            start = i + 1;
        }
        true
    });
    out.push(&src[start..]);
    out
}

/// Parses one branch (already in Rust syntax) into the HIR of a whole-text match.
fn parse_one(src: &str, flavor: Flavor) -> Result<Hir, String> {
    let hir = regex_syntax::ParserBuilder::new()
        .utf8(true)
        .unicode(true)
        .build()
        .parse(src)
        .map_err(|e| {
            e.to_string()
                .lines()
                .last()
                .unwrap_or("parse error")
                .to_string()
        })?;
    let alts = split_anchors(hir);
    let any_star = || {
        Hir::repetition(Repetition {
            min: 0,
            max: None,
            greedy: true,
            sub: Box::new(Hir::dot(Dot::AnyChar)),
        })
    };
    let mut out = Vec::new();
    for (s, e, h) in alts {
        let mut parts = Vec::new();
        let search = flavor == Flavor::EcmaSearch;
        if search && !s {
            parts.push(any_star());
        }
        parts.push(h);
        if search && !e {
            parts.push(any_star());
        }
        out.push(Hir::concat(parts));
    }
    Ok(Hir::alternation(out))
}

/// Whether a text that matches `h` (an [`Flavor::EcmaSearch`] pattern's whole-text HIR) is
/// matched by every extension of it too: each branch ends in the `.*` that search semantics
/// add where a branch has no `$`, and no look-around (a `\b` at a match's end depends on the
/// byte after it) is left. Conservative: `false` for any other shape.
pub(crate) fn match_survives_extension(h: &Hir) -> bool {
    let any_star = |x: &Hir| {
        matches!(x.kind(), HirKind::Repetition(r)
            if r.min == 0 && r.max.is_none() && *r.sub == Hir::dot(Dot::AnyChar))
    };
    let open_end =
        |b: &Hir| matches!(b.kind(), HirKind::Concat(items) if items.last().is_some_and(any_star));
    h.properties().look_set().is_empty()
        && match h.kind() {
            HirKind::Alternation(alts) => alts.iter().all(open_end),
            _ => open_end(h),
        }
}

/// Splits a top-level alternation into branches with their `^`/`$` anchors removed.
fn split_anchors(h: Hir) -> Vec<(bool, bool, Hir)> {
    match h.kind() {
        HirKind::Alternation(alts) => alts.iter().cloned().flat_map(split_anchors).collect(),
        HirKind::Capture(c) => split_anchors((*c.sub).clone()),
        HirKind::Look(Look::Start) => vec![(true, false, Hir::empty())],
        HirKind::Look(Look::End) => vec![(false, true, Hir::empty())],
        HirKind::Concat(items) => {
            let mut items: Vec<Hir> = items.clone();
            let mut s = false;
            let mut e = false;
            while matches!(
                items.first().map(|h| h.kind()),
                Some(HirKind::Look(Look::Start))
            ) {
                items.remove(0);
                s = true;
            }
            while matches!(
                items.last().map(|h| h.kind()),
                Some(HirKind::Look(Look::End))
            ) {
                items.pop();
                e = true;
            }
            if items.len() == 1 && !s && !e {
                if let HirKind::Capture(_) | HirKind::Alternation(_) = items[0].kind() {
                    return split_anchors(items.remove(0));
                }
            }
            vec![(s, e, Hir::concat(items))]
        }
        _ => vec![(false, false, h)],
    }
}

/// ECMA-262 `\s` (WhiteSpace and LineTerminator), as class items.
const ECMA_SPACE: &str =
    r"\x09-\x0D\x20\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF}";

/// Rewrites ECMA-only syntax: ASCII `\d`, `\w`, ECMA's `\s` (and negations) outside and
/// inside classes, ASCII word boundaries, `[\b]` as the backspace.
fn ecma_to_rust(p: &str) -> Result<String, String> {
    let mut out = String::with_capacity(p.len() + 8);
    let mut in_class = false;
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(n) = chars.next() else {
                    return Err("trailing backslash".into());
                };
                match (n, in_class) {
                    ('d', false) => out.push_str("[0-9]"),
                    ('d', true) => out.push_str("0-9"),
                    ('D', false) => out.push_str("[^0-9]"),
                    ('w', false) => out.push_str("[A-Za-z0-9_]"),
                    ('w', true) => out.push_str("A-Za-z0-9_"),
                    ('W', false) => out.push_str("[^A-Za-z0-9_]"),
                    // ECMA's white space and line terminators (U+FEFF in, U+0085 out: not
                    // Unicode's White_Space, which Rust's `\s` is).
                    ('s', false) => out.push_str(&format!("[{ECMA_SPACE}]")),
                    ('s', true) => out.push_str(ECMA_SPACE),
                    // Inside a class, a nested negated class (Rust's class union).
                    ('S', _) => out.push_str(&format!("[^{ECMA_SPACE}]")),
                    ('D' | 'W', true) => return Err(format!("\\{n} inside a class")),
                    ('/', _) => out.push('/'),
                    // ECMA's word boundaries are ASCII ones (its `\w` is `[A-Za-z0-9_]`,
                    // with and without the `u` flag): Rust's `\b` is Unicode-aware, which
                    // no DFA can evaluate. In a class `\b` is the backspace.
                    ('b', false) => out.push_str("(?-u:\\b)"),
                    ('B', false) => out.push_str("(?-u:\\B)"),
                    ('b', true) => out.push_str("\\x08"),
                    // Identity escapes in ECMA-262 (word boundaries in Rust syntax).
                    ('<' | '>', _) => out.push(n),
                    ('-', _) => out.push_str("\\-"),
                    _ => {
                        out.push('\\');
                        out.push(n);
                    }
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    return Err("empty class".into());
                }
            }
            '[' if in_class => out.push_str("\\["),
            // ECMA `.` is any character but a line terminator (Rust's also takes `\r`,
            // U+2028 and U+2029).
            '.' if !in_class => out.push_str("[^\\n\\r\\u2028\\u2029]"),
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

/// Compiles `hir` and copies it into `b` from `from`; returns the exit state.
pub(crate) fn emit_hir(
    b: &mut Builder,
    from: StateId,
    hir: &Hir,
    esc: Escape,
) -> Result<StateId, String> {
    emit_hir_len(b, from, hir, esc, 0, None)
}

/// Largest product (regex states × character counts) [`emit_hir_len`] builds.
const MAX_PRODUCT: usize = 300_000;

/// `hir`'s Thompson NFA, as [`emit_hir_len`] walks it.
fn thompson_nfa(hir: &Hir) -> Result<thompson::NFA, String> {
    thompson::Compiler::new()
        .configure(
            thompson::Config::new()
                .which_captures(WhichCaptures::None)
                .nfa_size_limit(Some(MAX_THOMPSON_BYTES))
                .shrink(false),
        )
        .build_from_hir(hir)
        .map_err(|e| e.to_string())
}

/// States of `hir`'s Thompson NFA (what [`emit_hir_len`] multiplies by the count range).
pub(crate) fn thompson_states(hir: &Hir) -> Result<usize, String> {
    Ok(thompson_nfa(hir)?.states().len())
}

/// Like [`emit_hir`], but only texts of `min..=max` characters (code points) match: the
/// product of the regex automaton with a character counter (exact).
pub(crate) fn emit_hir_len(
    b: &mut Builder,
    from: StateId,
    hir: &Hir,
    esc: Escape,
    min: u64,
    max: Option<u64>,
) -> Result<StateId, String> {
    let nfa = thompson_nfa(hir)?;
    if nfa
        .states()
        .iter()
        .any(|s| matches!(s, TState::Look { .. }))
    {
        // `^`/`$` inside the regex (`^(a|$)`, `(x$|y)`), word boundaries: the dense DFA
        // evaluates them exactly (a look-ahead of one byte or the end of the text), so the
        // regex goes through the DFA product, with the length bounds as a second regex.
        let mut hirs = vec![Arc::new(hir.clone())];
        if min > 0 || max.is_some() {
            let re = match max {
                Some(hi) => format!("[\\s\\S]{{{min},{hi}}}"),
                None => format!("[\\s\\S]{{{min},}}"),
            };
            hirs.push(parse(&re, Flavor::FullMatch)?);
        }
        return emit_intersection(b, from, &hirs, esc);
    }
    // Counts 0..=cap; without a maximum the count saturates at `min`.
    let cap = max.unwrap_or(min) as usize;
    let n = nfa.states().len();
    if n.saturating_mul(cap + 1) > MAX_PRODUCT {
        return Err(format!(
            "length bounds up to {cap} on a regex of {n} states are too large to enforce"
        ));
    }
    let exit = b.state().map_err(|e| e.to_string())?;
    let mut map: Vec<Option<StateId>> = vec![None; n * (cap + 1)];
    let start = nfa.start_anchored();
    let mut work: Vec<(TStateId, usize)> = vec![(start, 0)];
    let s0 = b.state().map_err(|e| e.to_string())?;
    b.eps(from, s0);
    map[start.as_usize() * (cap + 1)] = Some(s0);
    let get = |b: &mut Builder,
               map: &mut Vec<Option<StateId>>,
               work: &mut Vec<(TStateId, usize)>,
               id: TStateId,
               c: usize|
     -> Result<StateId, String> {
        let slot = id.as_usize() * (cap + 1) + c;
        if let Some(s) = map[slot] {
            return Ok(s);
        }
        let s = b.state().map_err(|e| e.to_string())?;
        map[slot] = Some(s);
        work.push((id, c));
        Ok(s)
    };
    // The count after a byte range: a range starting a character counts one.
    let next_count = |c: usize, lo: u8| -> Option<usize> {
        let starts_char = !(0x80..0xC0).contains(&lo);
        if !starts_char {
            Some(c)
        } else if c < cap {
            Some(c + 1)
        } else if max.is_none() {
            Some(c)
        } else {
            None
        }
    };
    while let Some((tid, c)) = work.pop() {
        let me = map[tid.as_usize() * (cap + 1) + c].ok_or("internal: unmapped state")?;
        match nfa.state(tid) {
            TState::ByteRange { trans } => {
                if let Some(c2) = next_count(c, trans.start) {
                    let t = get(b, &mut map, &mut work, trans.next, c2)?;
                    edge(b, me, trans.start, trans.end, t, esc)?;
                }
            }
            TState::Sparse(sp) => {
                for tr in sp.transitions.iter() {
                    if let Some(c2) = next_count(c, tr.start) {
                        let t = get(b, &mut map, &mut work, tr.next, c2)?;
                        edge(b, me, tr.start, tr.end, t, esc)?;
                    }
                }
            }
            TState::Dense(d) => {
                for (byte, &nx) in d.transitions.iter().enumerate() {
                    if nx != TStateId::ZERO {
                        if let Some(c2) = next_count(c, byte as u8) {
                            let t = get(b, &mut map, &mut work, nx, c2)?;
                            edge(b, me, byte as u8, byte as u8, t, esc)?;
                        }
                    }
                }
            }
            TState::Look { .. } => {
                return Err("look-around assertion (only ^ and $ at the ends are supported)".into())
            }
            TState::Union { alternates } => {
                for &a in alternates.iter() {
                    let t = get(b, &mut map, &mut work, a, c)?;
                    b.eps(me, t);
                }
            }
            TState::BinaryUnion { alt1, alt2 } => {
                for a in [*alt1, *alt2] {
                    let t = get(b, &mut map, &mut work, a, c)?;
                    b.eps(me, t);
                }
            }
            TState::Capture { next, .. } => {
                let t = get(b, &mut map, &mut work, *next, c)?;
                b.eps(me, t);
            }
            TState::Fail => {}
            TState::Match { .. } => {
                if c as u64 >= min {
                    b.eps(me, exit)
                }
            }
        }
    }
    if max.is_some() {
        // Record the product's cells, so that masks can be shared between counts
        // (`Nfa::count_representatives`).
        let first = exit;
        let mut cells = vec![NO_CELL; b.states.len() - first as usize];
        for (slot, s) in map.iter().enumerate() {
            if let Some(s) = *s {
                cells[(s - first) as usize] =
                    ((slot / (cap + 1)) as u32, (slot % (cap + 1)) as u32);
            }
        }
        b.counted.push(CountedProduct {
            min: min as u32,
            cap: cap as u32,
            slack: completion_slack(&nfa),
            first,
            cells,
        });
    }
    Ok(exit)
}

/// The longest shortest completion of a Thompson NFA in characters: the largest, over
/// states that can reach a match, of the fewest characters that reach one (a byte range
/// that starts a character counts one, a continuation range none). A 0-1 breadth-first
/// search over the reversed moves.
fn completion_slack(nfa: &thompson::NFA) -> u32 {
    let n = nfa.states().len();
    let mut rev: Vec<Vec<(u32, u32)>> = vec![Vec::new(); n];
    let cost = |lo: u8| u32::from(!(0x80..0xC0).contains(&lo));
    let mut dist = vec![u32::MAX; n];
    let mut dq = std::collections::VecDeque::new();
    for (i, st) in nfa.states().iter().enumerate() {
        let i = i as u32;
        match st {
            TState::ByteRange { trans } => {
                rev[trans.next.as_usize()].push((i, cost(trans.start)));
            }
            TState::Sparse(sp) => {
                for tr in sp.transitions.iter() {
                    rev[tr.next.as_usize()].push((i, cost(tr.start)));
                }
            }
            TState::Dense(d) => {
                for (byte, &nx) in d.transitions.iter().enumerate() {
                    if nx != TStateId::ZERO {
                        rev[nx.as_usize()].push((i, cost(byte as u8)));
                    }
                }
            }
            TState::Union { alternates } => {
                for a in alternates.iter() {
                    rev[a.as_usize()].push((i, 0));
                }
            }
            TState::BinaryUnion { alt1, alt2 } => {
                rev[alt1.as_usize()].push((i, 0));
                rev[alt2.as_usize()].push((i, 0));
            }
            TState::Capture { next, .. } => rev[next.as_usize()].push((i, 0)),
            TState::Look { next, .. } => rev[next.as_usize()].push((i, 0)),
            TState::Match { .. } => {
                dist[i as usize] = 0;
                dq.push_back(i);
            }
            TState::Fail => {}
        }
    }
    while let Some(t) = dq.pop_front() {
        let d = dist[t as usize];
        for &(s, w) in &rev[t as usize] {
            if d + w < dist[s as usize] {
                dist[s as usize] = d + w;
                if w == 0 {
                    dq.push_front(s);
                } else {
                    dq.push_back(s);
                }
            }
        }
    }
    dist.into_iter()
        .filter(|&d| d != u32::MAX)
        .max()
        .unwrap_or(0)
}

/// A byte-range edge, with JSON-string escaping of special bytes when asked.
fn edge(
    b: &mut Builder,
    a: StateId,
    lo: u8,
    hi: u8,
    t: StateId,
    esc: Escape,
) -> Result<(), String> {
    if esc == Escape::Raw {
        b.range(a, lo, hi, t);
        return Ok(());
    }
    let mut plain_lo: Option<u8> = None;
    for x in lo..=hi {
        let special = x < 0x20 || x == b'"' || x == b'\\';
        if special {
            if let Some(pl) = plain_lo.take() {
                b.range(a, pl, x - 1, t);
            }
            let seq = escape_seq(x);
            let mut cur = a;
            for (i, &(l, h)) in seq.iter().enumerate() {
                let nx = if i + 1 == seq.len() {
                    t
                } else {
                    b.state().map_err(|e| e.to_string())?
                };
                b.range(cur, l, h, nx);
                if l.is_ascii_lowercase() && l == h && i >= 2 {
                    b.range(cur, l.to_ascii_uppercase(), l.to_ascii_uppercase(), nx);
                }
                cur = nx;
            }
        } else if plain_lo.is_none() {
            plain_lo = Some(x);
        }
    }
    if let Some(pl) = plain_lo {
        b.range(a, pl, hi, t);
    }
    Ok(())
}

/// The escape of a special byte inside a JSON string, as byte classes.
fn escape_seq(x: u8) -> Vec<(u8, u8)> {
    let one = |c: u8| (c, c);
    match x {
        b'"' => vec![one(b'\\'), one(b'"')],
        b'\\' => vec![one(b'\\'), one(b'\\')],
        0x08 => vec![one(b'\\'), one(b'b')],
        0x09 => vec![one(b'\\'), one(b't')],
        0x0A => vec![one(b'\\'), one(b'n')],
        0x0C => vec![one(b'\\'), one(b'f')],
        0x0D => vec![one(b'\\'), one(b'r')],
        _ => {
            let hex = b"0123456789abcdef";
            vec![
                one(b'\\'),
                one(b'u'),
                one(b'0'),
                one(b'0'),
                one(hex[(x >> 4) as usize]),
                one(hex[(x & 15) as usize]),
            ]
        }
    }
}

/// Compiles a whole-text regex into `b` from `from` (used by [`crate::CompiledGrammar::regex`]
/// and GBNF); errors are reported as `CompileError::Regex`.
pub(crate) fn emit_pattern(
    b: &mut Builder,
    from: StateId,
    pattern: &str,
    flavor: Flavor,
    esc: Escape,
) -> Result<StateId, CompileError> {
    let hir = parse(pattern, flavor).map_err(|e| CompileError::Regex {
        pattern: crate::excerpt(pattern).into_owned(),
        reason: e,
    })?;
    emit_hir(b, from, &hir, esc).map_err(|reason| {
        b.budget_error().unwrap_or_else(|| CompileError::Regex {
            pattern: crate::excerpt(pattern).into_owned(),
            reason,
        })
    })
}

/// Largest intersection automaton [`emit_intersection`] builds (states).
const MAX_PRODUCT_DFA: usize = 20_000;

/// A small deterministic byte automaton intersected with regexes by
/// [`emit_intersection_with`] (e.g. the remainder automaton of `multipleOf`).
pub(crate) trait ByteAutomaton {
    /// The start state.
    fn start(&self) -> u32;
    /// The state after byte `b`, `None` when no text continues this way.
    fn step(&self, s: u32, b: u8) -> Option<u32>;
    /// Whether a text ending in `s` is accepted.
    fn accepts(&self, s: u32) -> bool;
}

/// The intersection of several whole-text regexes, copied into `b` from `from` (product
/// of their dense DFAs, exact); returns the exit state.
pub(crate) fn emit_intersection(
    b: &mut Builder,
    from: StateId,
    hirs: &[Arc<Hir>],
    esc: Escape,
) -> Result<StateId, String> {
    emit_intersection_with(b, from, hirs, None, esc)
}

/// [`emit_intersection`] with one more automaton in the product.
pub(crate) fn emit_intersection_with(
    b: &mut Builder,
    from: StateId,
    hirs: &[Arc<Hir>],
    extra: Option<&dyn ByteAutomaton>,
    esc: Escape,
) -> Result<StateId, String> {
    emit_intersection_excluding(b, from, hirs, &[], extra, esc)
}

/// [`emit_intersection_with`] where the texts must also match none of `excluded` (their
/// DFAs are in the product with acceptance inverted: a dead state there is never dead for
/// the product).
pub(crate) fn emit_intersection_excluding(
    b: &mut Builder,
    from: StateId,
    hirs: &[Arc<Hir>],
    excluded: &[Arc<Hir>],
    extra: Option<&dyn ByteAutomaton>,
    esc: Escape,
) -> Result<StateId, String> {
    use regex_automata::dfa::{dense, Automaton, StartKind};
    use std::collections::HashMap;
    let mut dfas = Vec::new();
    let mut start = Vec::new();
    let n_pos = hirs.len();
    for h in hirs.iter().chain(excluded) {
        let nfa = thompson::Compiler::new()
            .configure(
                thompson::Config::new()
                    .which_captures(WhichCaptures::None)
                    .nfa_size_limit(Some(MAX_THOMPSON_BYTES)),
            )
            .build_from_hir(h)
            .map_err(|e| e.to_string())?;
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .start_kind(StartKind::Anchored)
                    .match_kind(regex_automata::MatchKind::All)
                    .dfa_size_limit(Some(1 << 22)),
            )
            .build_from_nfa(&nfa)
            .map_err(|e| e.to_string())?;
        let s = dfa
            .start_state(
                &regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes),
            )
            .map_err(|e| e.to_string())?;
        start.push(s);
        dfas.push(dfa);
    }
    type Key = (Vec<regex_automata::util::primitives::StateID>, u32);
    let start: Key = (start, extra.map_or(0, |x| x.start()));
    let exit = b.state().map_err(|e| e.to_string())?;
    let s0 = b.state().map_err(|e| e.to_string())?;
    b.eps(from, s0);
    let mut ids: HashMap<Key, StateId> = HashMap::new();
    ids.insert(start.clone(), s0);
    let mut work = vec![start];
    while let Some(key) = work.pop() {
        let me = ids[&key];
        if dfas
            .iter()
            .zip(&key.0)
            .enumerate()
            .all(|(i, (d, &s))| d.is_match_state(d.next_eoi_state(s)) == (i < n_pos))
            && extra.is_none_or(|x| x.accepts(key.1))
        {
            b.eps(me, exit);
        }
        let mut run: Option<(u8, u8, StateId)> = None;
        for byte in 0u8..=255 {
            let ex = match extra {
                Some(x) => x.step(key.1, byte),
                None => Some(0),
            };
            let next: Key = (
                dfas.iter()
                    .zip(&key.0)
                    .map(|(d, &s)| d.next_state(s, byte))
                    .collect(),
                ex.unwrap_or(0),
            );
            // A quit state (unknown) ends the text in either role: stricter, never looser.
            let dead =
                ex.is_none()
                    || dfas.iter().zip(&next.0).enumerate().any(|(i, (d, &s))| {
                        (i < n_pos && d.is_dead_state(s)) || d.is_quit_state(s)
                    });
            let target = if dead {
                None
            } else {
                Some(match ids.get(&next) {
                    Some(&id) => id,
                    None => {
                        let cap = if extra.is_some() {
                            MAX_PRODUCT_DFA * 3
                        } else {
                            MAX_PRODUCT_DFA
                        };
                        if ids.len() >= cap {
                            return Err("intersection of the regexes is too large".into());
                        }
                        let id = b.state().map_err(|e| e.to_string())?;
                        ids.insert(next.clone(), id);
                        work.push(next);
                        id
                    }
                })
            };
            match (run, target) {
                (Some((lo, hi, id)), Some(t)) if t == id && hi as u16 + 1 == byte as u16 => {
                    run = Some((lo, byte, id))
                }
                (r, t) => {
                    if let Some((lo, hi, id)) = r {
                        edge(b, me, lo, hi, id, esc)?;
                    }
                    run = t.map(|id| (byte, byte, id));
                }
            }
        }
        if let Some((lo, hi, id)) = run {
            edge(b, me, lo, hi, id, esc)?;
        }
    }
    Ok(exit)
}
