//! The key automaton: a quoted JSON string (object key, or a string under excluded
//! values/patterns) written canonically, split by which of a list of patterns it matches,
//! with a list of spellings excluded.

use std::collections::HashMap;

use super::JsonCompiler;
use crate::lazy::FastMap;
use crate::nfa::StateId;
use crate::regex::{parse, Flavor};
use crate::CompileError;
use regex_automata::hybrid::dfa::{Cache, DFA as LazyDfa};
use regex_automata::hybrid::LazyStateID;

/// Most memory one key pattern's lazy DFA may use (past it the pattern is refused).
const LAZY_CACHE_BYTES: usize = 8 << 20;

/// Marks a key pattern written in the engine's own regex syntax, matched against the whole
/// key (a `format`'s regex), where the others are ECMA-262 searches (`pattern`).
pub(super) const FULL_MATCH: &str = "\u{0}full:";

impl JsonCompiler<'_> {
    /// A quoted key that is none of `declared`, split by which `patterns` it matches: one
    /// exit per matched-pattern set (bit i = pattern i; set 0 only when `allow_unmatched`).
    /// Keys are written canonically (no `\u`, no `\/`), so the written form decides the key
    /// and excluding declared spellings is exact. `doomed`: patterns whose match makes the
    /// caller drop the exit (excluded patterns); where their match cannot be undone by more
    /// text, nothing past it is built.
    pub(super) fn other_key(
        &mut self,
        from: StateId,
        declared: &[String],
        patterns: &[&str],
        allow_unmatched: bool,
        doomed: u32,
        ptr: &str,
    ) -> Result<Vec<(u32, StateId)>, CompileError> {
        // Trie of canonical declared keys (children in byte order: a node has few, and the
        // walk below looks one up for every byte of every state).
        let mut trie_children: Vec<Vec<(u8, usize)>> = vec![Vec::new()];
        let mut terminal = vec![false];
        for k in declared {
            let enc = serde_json::to_string(k).map_err(|e| CompileError::Json(e.to_string()))?;
            let bytes = &enc.as_bytes()[1..enc.len() - 1];
            let mut node = 0;
            for &b in bytes {
                node = match trie_children[node].binary_search_by_key(&b, |&(x, _)| x) {
                    Ok(i) => trie_children[node][i].1,
                    Err(i) => {
                        trie_children.push(Vec::new());
                        terminal.push(false);
                        let c = trie_children.len() - 1;
                        trie_children[node].insert(i, (b, c));
                        c
                    }
                };
            }
            terminal[node] = true;
        }
        // One anchored lazy DFA per pattern, fed the decoded key bytes. Lazy, so that a
        // pattern whose full DFA would be huge (a long alternation under search
        // semantics) costs only the states the keys reach, one at a time, between the
        // deadline checks below.
        // A pattern with leading look-aheads (`^(?!X)(?=Y)Z`, `types::split_lookaheads`)
        // takes one automaton per part: its bit is set when `^Z` and every positive part
        // match and no negative one does.
        let mut parts: Vec<(usize, bool, String)> = Vec::new();
        for (i, p) in patterns.iter().enumerate() {
            if p.starts_with(FULL_MATCH) {
                parts.push((i, true, p.to_string()));
                continue;
            }
            match super::types::split_lookaheads(p) {
                Some((main, pos, neg)) => {
                    parts.push((i, true, main));
                    parts.extend(pos.into_iter().map(|x| (i, true, x)));
                    parts.extend(neg.into_iter().map(|x| (i, false, x)));
                }
                None => parts.push((i, true, p.to_string())),
            }
        }
        let mut dfas = Vec::new();
        let mut caches = Vec::new();
        let mut starts = Vec::new();
        // Parts whose match dooms the key for good: a `doomed` pattern of one part whose
        // match every longer text keeps (`regex::match_survives_extension`). A state where
        // one matches is left without exits or moves, so nothing past it is explored.
        let mut permanent = Vec::new();
        for (i, _, part) in &parts {
            let p = patterns[*i];
            let unsupported = |e: String| CompileError::Unsupported {
                keyword: "patternProperties".into(),
                pointer: ptr.into(),
                reason: format!("{:?}: {e}", crate::excerpt(p)),
            };
            let hir = match part.strip_prefix(FULL_MATCH) {
                Some(re) => parse(re, Flavor::FullMatch),
                None => parse(part, Flavor::EcmaSearch),
            }
            .map_err(unsupported)?;
            let one_part = parts.iter().filter(|x| x.0 == *i).count() == 1;
            permanent.push(
                doomed >> i & 1 == 1
                    && one_part
                    && !part.starts_with(FULL_MATCH)
                    && crate::regex::match_survives_extension(&hir),
            );
            let nfa = regex_automata::nfa::thompson::Compiler::new()
                .configure(
                    regex_automata::nfa::thompson::Config::new()
                        .which_captures(regex_automata::nfa::thompson::WhichCaptures::None)
                        .nfa_size_limit(Some(crate::regex::MAX_THOMPSON_BYTES)),
                )
                .build_from_hir(&hir)
                .map_err(|e| unsupported(e.to_string()))?;
            let dfa = LazyDfa::builder()
                .configure(
                    LazyDfa::config()
                        .match_kind(regex_automata::MatchKind::All)
                        .cache_capacity(LAZY_CACHE_BYTES),
                )
                .build_from_nfa(nfa)
                .map_err(|e| unsupported(e.to_string()))?;
            let mut cache = dfa.create_cache();
            let st = dfa
                .start_state(
                    &mut cache,
                    &regex_automata::util::start::Config::new()
                        .anchored(regex_automata::Anchored::Yes),
                )
                .map_err(|e| unsupported(e.to_string()))?;
            starts.push(st);
            dfas.push(dfa);
            caches.push(cache);
        }
        // A cache cleared (too many states) would invalidate the state ids held below.
        let too_large = |caches: &[Cache]| -> Result<(), CompileError> {
            if caches.iter().any(|c| c.clear_count() > 0) {
                return Err(CompileError::Unsupported {
                    keyword: "patternProperties".into(),
                    pointer: ptr.into(),
                    reason: "the key patterns' automaton is too large".into(),
                });
            }
            Ok(())
        };
        let lazy_err = |e: regex_automata::hybrid::CacheError| CompileError::Unsupported {
            keyword: "patternProperties".into(),
            pointer: ptr.into(),
            reason: format!("the key patterns' automaton is too large ({e})"),
        };
        const OFF: usize = usize::MAX;
        type Key = (u8, usize, Vec<LazyStateID>);
        let start = self.b.lit(from, b"\"")?;
        let mut exits: HashMap<u32, StateId> = HashMap::new();
        let mut ids: FastMap<Key, StateId> = FastMap::default();
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
            let mut dead = false;
            for (j, dfa) in dfas.iter().enumerate() {
                if permanent[j]
                    && dfa
                        .next_eoi_state(&mut caches[j], ps[j])
                        .map_err(lazy_err)?
                        .is_match()
                {
                    dead = true;
                    break;
                }
            }
            if dead {
                continue;
            }
            // The previous byte's successor: runs of bytes with the same successor skip
            // the hash lookup.
            let mut prev: Option<(Key, StateId)> = None;
            if d == 0 && (t == OFF || !terminal[t]) {
                // Bit i: no part of pattern i disagrees (a positive part not matching, a
                // negative one matching).
                let mut failed = 0u32;
                for (j, dfa) in dfas.iter().enumerate() {
                    let eoi = dfa
                        .next_eoi_state(&mut caches[j], ps[j])
                        .map_err(lazy_err)?;
                    let (i, positive, _) = &parts[j];
                    if eoi.is_match() != *positive {
                        failed |= 1 << i;
                    }
                }
                let set = !failed & ((1u64 << patterns.len()) - 1) as u32;
                too_large(&caches)?;
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
            // The successor key is built in place (no allocation per byte); it is cloned
            // only when it becomes a new state or the run's previous successor.
            let mut k2: Key = (0, 0, Vec::with_capacity(ps.len()));
            for byte in 0u8..=255 {
                let target = match key_char_step(d, byte) {
                    None => None,
                    Some(d2) => {
                        let t2 = if t == OFF {
                            OFF
                        } else {
                            let c = &trie_children[t];
                            match c.binary_search_by_key(&byte, |&(x, _)| x) {
                                Ok(i) => c[i].1,
                                Err(_) => OFF,
                            }
                        };
                        // The decoded byte the patterns see (none for the backslash itself).
                        let fed = match (d, byte) {
                            (0, b'\\') => None,
                            (1, b'b') => Some(8),
                            (1, b'f') => Some(12),
                            (1, b'n') => Some(10),
                            (1, b'r') => Some(13),
                            (1, b't') => Some(9),
                            // `\u00XY`: nothing until its last digit.
                            (1, b'u') | (9..=11, _) => None,
                            (12, y) => Some(hex_value(y)),
                            (13, y) => Some(16 + hex_value(y)),
                            (_, x) => Some(x),
                        };
                        k2.0 = d2;
                        k2.1 = t2;
                        k2.2.clear();
                        match fed {
                            None => k2.2.extend_from_slice(ps),
                            Some(x) => {
                                for (i, dfa) in dfas.iter().enumerate() {
                                    k2.2.push(
                                        dfa.next_state(&mut caches[i], ps[i], x)
                                            .map_err(lazy_err)?,
                                    );
                                }
                                too_large(&caches)?;
                            }
                        }
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
                                prev = Some((k2.clone(), id));
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

/// The value of a lowercase hex digit.
fn hex_value(y: u8) -> u8 {
    match y {
        b'0'..=b'9' => y - b'0',
        _ => y - b'a' + 10,
    }
}

/// The canonical key-character automaton: 0 = between characters, 1 = after `\`,
/// 2..=8 = inside a UTF-8 sequence, 9..=13 = inside `\u00XY` (9: after `u`, 10: `\u0`,
/// 11: `\u00`, 12: `\u000`, 13: `\u001`). Control characters without a short escape
/// are spelled `\u00XY` with lowercase digits, as serde_json and Python write them (the
/// only spelling JSON has for them); the others take their short escape.
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
        1 if b == b'u' => Some(9),
        1 => matches!(b, b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't').then_some(0),
        9 | 10 => (b == b'0').then_some(d + 1),
        11 => match b {
            b'0' => Some(12),
            b'1' => Some(13),
            _ => None,
        },
        // U+0008, U+0009, U+000A, U+000C and U+000D have short escapes.
        12 => matches!(b, b'0'..=b'7' | b'b' | b'e' | b'f').then_some(0),
        13 => matches!(b, b'0'..=b'9' | b'a'..=b'f').then_some(0),
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
