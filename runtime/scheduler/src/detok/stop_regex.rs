//! `stop_regex`: stop conditions given as regular expressions, matched on the detokenized
//! output as it grows.
//!
//! All of a request's patterns compile into one dense DFA (anchored starts, `MatchKind::All`).
//! [`RegexScan`] feeds the output one byte at a time to a set of *live starts*: pairs of a
//! start position and the anchored DFA state reached from it. A start leaves the set when
//! its state is dead (no match can begin there any more); two starts in the same state share
//! their future, so only the earlier one is kept and the set never outgrows the DFA. Hence:
//!
//! - a match is found at the earliest end where any pattern matches (the DFA's delayed match
//!   states mid-text; the end-of-input transition at the end of each appended piece, so `$`
//!   and `\b` see the text as it stands after each token, as SGLang's `re.search` does);
//! - its start is the leftmost start of the live set in a matching state (trimmed from the
//!   output unless `no_stop_trim`);
//! - a stream holds back text only from the earliest live start: everything before it can
//!   no longer be part of a match.

use regex_automata::dfa::{dense, Automaton};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use std::fmt;
use std::sync::Arc;

/// Most stop regexes per request.
pub const MAX_STOP_REGEX: usize = 16;
/// Longest stop regex pattern, in bytes.
pub const MAX_PATTERN_LEN: usize = 4096;
/// Size limit of a request's stop-regex DFA (and of its determinization), in bytes.
const DFA_SIZE_LIMIT: usize = 4 << 20;

/// Why a set of stop regexes was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopRegexError {
    /// More than [`MAX_STOP_REGEX`] patterns.
    #[error("at most {MAX_STOP_REGEX} stop regexes")]
    TooMany,
    /// A pattern longer than [`MAX_PATTERN_LEN`].
    #[error("pattern {0} is longer than {MAX_PATTERN_LEN} bytes")]
    TooLong(usize),
    /// A pattern that matches the empty string would stop every request at once.
    #[error("a pattern matches the empty string")]
    MatchesEmpty,
    /// The patterns do not parse, or use something a DFA cannot run (e.g. Unicode `\b`;
    /// `(?-u:\b)` works), or their DFA is too large.
    #[error("{0}")]
    Build(String),
}

/// A compiled set of stop regexes (cheap to clone; compared by pattern).
#[derive(Clone)]
pub struct StopRegex {
    patterns: Arc<[String]>,
    dfa: Arc<dense::DFA<Vec<u32>>>,
}

impl fmt::Debug for StopRegex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StopRegex").field(&self.patterns).finish()
    }
}

impl PartialEq for StopRegex {
    fn eq(&self, other: &Self) -> bool {
        self.patterns == other.patterns
    }
}

impl StopRegex {
    /// Compiles `patterns` (at least one, none empty) into one DFA.
    pub fn new(patterns: &[String]) -> Result<Self, StopRegexError> {
        if patterns.len() > MAX_STOP_REGEX {
            return Err(StopRegexError::TooMany);
        }
        if let Some((i, _)) = patterns
            .iter()
            .enumerate()
            .find(|(_, p)| p.len() > MAX_PATTERN_LEN)
        {
            return Err(StopRegexError::TooLong(i));
        }
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .match_kind(MatchKind::All)
                    .start_kind(regex_automata::dfa::StartKind::Anchored)
                    .dfa_size_limit(Some(DFA_SIZE_LIMIT))
                    .determinize_size_limit(Some(DFA_SIZE_LIMIT)),
            )
            .build_many(patterns)
            .map_err(|e| StopRegexError::Build(describe(&e)))?;
        let re = Self {
            patterns: patterns.to_vec().into(),
            dfa: Arc::new(dfa),
        };
        // Empty at the start of the output, or after any byte (e.g. `(?m)^` after '\n').
        let empty_somewhere = std::iter::once(None)
            .chain((0..=255u8).map(Some))
            .any(|lb| re.start(lb).is_some_and(|s| re.matches_at_end(s)));
        if empty_somewhere {
            return Err(StopRegexError::MatchesEmpty);
        }
        Ok(re)
    }

    /// The patterns, in the order given.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Anchored start state after `look_behind` (`None`: start of the output).
    fn start(&self, look_behind: Option<u8>) -> Option<StateID> {
        let cfg = start::Config::new()
            .anchored(Anchored::Yes)
            .look_behind(look_behind);
        self.dfa.start_state(&cfg).ok()
    }

    /// True when a match ends where the text ends now (after state `s`).
    fn matches_at_end(&self, s: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(s))
    }
}

/// A build error with its cause chain (regex-automata's top-level message alone is vague).
fn describe(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let m = s.to_string();
        if !msg.contains(&m) {
            msg.push_str(": ");
            msg.push_str(&m);
        }
        src = s.source();
    }
    msg
}

/// A stop regex found in the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegexMatch {
    /// Byte offset where the match starts.
    pub start: usize,
    /// Byte offset where it ends.
    pub end: usize,
    /// Index of the pattern that matched.
    pub pattern: usize,
}

/// Incremental search of a [`StopRegex`] over a growing text.
#[derive(Clone, Debug)]
pub struct RegexScan {
    re: StopRegex,
    /// Live starts, earliest first, each in a distinct non-dead state.
    live: Vec<(usize, StateID)>,
    /// Bytes fed so far.
    len: usize,
    prev: Option<u8>,
    scratch: Vec<(usize, StateID)>,
}

impl RegexScan {
    /// A scan at the start of the output.
    pub fn new(re: StopRegex) -> Self {
        Self {
            re,
            live: Vec::new(),
            len: 0,
            prev: None,
            scratch: Vec::new(),
        }
    }

    /// The patterns scanned for.
    pub fn regex(&self) -> &StopRegex {
        &self.re
    }

    /// Feeds the next piece of text. When `check` is set, returns the match with the
    /// earliest end (then the earliest start) that ends inside or at the end of this piece;
    /// when it is not (e.g. before `min_new_tokens`), matches are ignored but the scan keeps
    /// its place.
    pub fn feed(&mut self, piece: &[u8], check: bool) -> Option<RegexMatch> {
        let dfa = &*self.re.dfa;
        for &b in piece {
            // A match may begin at this byte.
            if let Some(s) = self.re.start(self.prev) {
                if !self.live.iter().any(|&(_, t)| t == s) {
                    self.live.push((self.len, s));
                }
            }
            self.scratch.clear();
            let mut found = None;
            for &(start, s) in &self.live {
                let next = dfa.next_state(s, b);
                // Match states are delayed by one byte: this one says a match ended
                // before `b`.
                if check && found.is_none() && dfa.is_match_state(next) {
                    found = Some(RegexMatch {
                        start,
                        end: self.len,
                        pattern: dfa.match_pattern(next, 0).as_usize(),
                    });
                }
                if dfa.is_dead_state(next) || dfa.is_quit_state(next) {
                    continue;
                }
                if !self.scratch.iter().any(|&(_, t)| t == next) {
                    self.scratch.push((start, next));
                }
            }
            std::mem::swap(&mut self.live, &mut self.scratch);
            self.len += 1;
            self.prev = Some(b);
            if found.is_some() {
                return found;
            }
        }
        if !check {
            return None;
        }
        // The text as it stands now (end of input: `$` and `\b` may match here).
        self.live.iter().find_map(|&(start, s)| {
            let eoi = dfa.next_eoi_state(s);
            dfa.is_match_state(eoi).then(|| RegexMatch {
                start,
                end: self.len,
                pattern: dfa.match_pattern(eoi, 0).as_usize(),
            })
        })
    }

    /// Where the earliest start that could still grow into a match is (text from there on
    /// must be held back from a stream); `None` when no match is under way.
    pub fn hold_from(&self) -> Option<usize> {
        self.live.first().map(|&(start, _)| start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn re(p: &[&str]) -> StopRegex {
        StopRegex::new(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    /// Feeds `pieces`, returning the first match and the piece index it came in.
    fn scan(r: &StopRegex, pieces: &[&str]) -> Option<(usize, RegexMatch)> {
        let mut sc = RegexScan::new(r.clone());
        pieces
            .iter()
            .enumerate()
            .find_map(|(i, p)| sc.feed(p.as_bytes(), true).map(|m| (i, m)))
    }

    #[test]
    fn finds_the_earliest_end_and_its_leftmost_start() {
        let r = re(&[r"and|or", r"\d{3}"]);
        let (i, m) = scan(&r, &["We s", "ell fl", "owers and trees"]).unwrap();
        assert_eq!(i, 2);
        let text = "We sell flowers and trees";
        assert_eq!(&text[m.start..m.end], "and");
        assert_eq!(m.pattern, 0);
        let (_, m) = scan(&r, &["x 12", "34 y"]).unwrap();
        assert_eq!((m.start, m.end, m.pattern), (2, 5, 1));
        // Leftmost start among matches that end first: "a+b" on "aaab" starts at 0.
        let (_, m) = scan(&re(&["a+b"]), &["xaa", "ab"]).unwrap();
        assert_eq!((m.start, m.end), (1, 5));
    }

    #[test]
    fn end_anchors_see_the_text_after_each_piece() {
        // SGLang's sentence stop: a sentence end followed by whitespace at the end.
        let r = re(&[r"[.!?]\s*$"]);
        assert!(scan(&r, &["Hello", " world"]).is_none());
        let (i, m) = scan(&r, &["Hello", " world.", " More"]).unwrap();
        assert_eq!(i, 1);
        assert_eq!((m.start, m.end), (11, 12));
        // Mid-piece, `$` does not match.
        assert!(scan(&r, &["a. b"]).is_none());
        // Word boundary at the end of the text now, as re.search on it would.
        let r = re(&[r"(?-u:\b)cat(?-u:\b)"]);
        assert!(scan(&r, &["concat", "enate"]).is_none());
        assert!(scan(&r, &["the cat", " sat"]).is_some());
    }

    #[test]
    fn hold_back_tracks_partial_matches_only() {
        let r = re(&["STOP[0-9]+"]);
        let mut sc = RegexScan::new(r.clone());
        assert_eq!(sc.feed(b"go ST", true), None);
        assert_eq!(sc.hold_from(), Some(3));
        assert_eq!(sc.feed(b"ay", true), None);
        assert_eq!(sc.hold_from(), None);
        assert_eq!(sc.feed(b" STOP", true), None);
        assert_eq!(sc.hold_from(), Some(8));
        // The earliest end wins: "STOP4" already matches inside the piece "42!".
        let m = sc.feed(b"42!", true).unwrap();
        assert_eq!((m.start, m.end), (8, 13));
        // An open-ended pattern holds back from its first possible start.
        let mut sc = RegexScan::new(re(&["<a>.*</a>"]));
        assert_eq!(sc.feed(b"x <a> lots of text", true), None);
        assert_eq!(sc.hold_from(), Some(2));
    }

    #[test]
    fn unchecked_pieces_keep_the_scan_going() {
        let mut sc = RegexScan::new(re(&["ab"]));
        assert_eq!(sc.feed(b"ab a", false), None);
        let m = sc.feed(b"b", true).unwrap();
        assert_eq!((m.start, m.end), (3, 5));
    }

    #[test]
    fn bad_patterns_are_refused() {
        let one = |p: &str| StopRegex::new(&[p.to_string()]);
        assert!(matches!(one("(unclosed"), Err(StopRegexError::Build(_))));
        assert!(matches!(one("a*"), Err(StopRegexError::MatchesEmpty)));
        assert!(matches!(one("(?m)^"), Err(StopRegexError::MatchesEmpty)));
        assert!(matches!(one(r"\bword"), Err(StopRegexError::Build(_))));
        let many: Vec<String> = (0..17).map(|i| format!("x{i}")).collect();
        assert_eq!(StopRegex::new(&many), Err(StopRegexError::TooMany));
        assert!(one("x+").is_ok());
    }
}
