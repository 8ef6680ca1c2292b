//! Incremental detokenization with stop strings.
//!
//! Byte-level BPE tokens do not align with UTF-8 characters: one emoji may span three tokens,
//! and decoding a prefix of them yields U+FFFD. [`IncrementalDecoder`] uses the prefix-offset /
//! read-offset scheme of TGI and SGLang: it re-decodes a short window of recent tokens and only
//! emits text once the window no longer ends in an incomplete character. Decoding a window (not
//! single tokens) also keeps SentencePiece's leading-space handling right.
//!
//! [`DetokStream`] adds stop strings and stop regexes ([`StopRegex`]) on top: it holds back
//! any tail of the text that could still grow into a match, trims the match (unless
//! `no_stop_trim`), and reports it.

mod stop_regex;

pub use stop_regex::{RegexMatch, RegexScan, StopRegex, StopRegexError, MAX_STOP_REGEX};

/// Turns token ids into text; implemented for `tokenizers::Tokenizer` and the runtime's
/// tokenizer wrapper.
pub trait TokenDecoder {
    /// Decodes `ids` to text, dropping special tokens when `skip_special` is set.
    fn decode_ids(&self, ids: &[u32], skip_special: bool) -> Result<String, DetokError>;
}

impl TokenDecoder for tokenizers::Tokenizer {
    fn decode_ids(&self, ids: &[u32], skip_special: bool) -> Result<String, DetokError> {
        self.decode(ids, skip_special)
            .map_err(|e| DetokError::Decode(e.to_string()))
    }
}

impl TokenDecoder for sglrs_model::tokenizer::Tokenizer {
    fn decode_ids(&self, ids: &[u32], skip_special: bool) -> Result<String, DetokError> {
        self.decode(ids, skip_special)
            .map_err(|e| DetokError::Decode(e.to_string()))
    }
}

/// Why decoding failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DetokError {
    /// The tokenizer rejected the ids.
    #[error("detokenize: {0}")]
    Decode(String),
}

/// How many tokens before the read offset are re-decoded for context.
const CONTEXT_TOKENS: usize = 5;

/// Incremental decoder over a growing list of token ids.
#[derive(Clone, Debug, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special: bool,
}

impl IncrementalDecoder {
    /// A decoder for output that continues after `context` (the last few prompt tokens, so the
    /// first output token decodes with the right leading space).
    pub fn new(context: &[u32], skip_special: bool) -> Self {
        let ctx = &context[context.len().saturating_sub(CONTEXT_TOKENS)..];
        Self {
            ids: ctx.to_vec(),
            prefix_offset: 0,
            read_offset: ctx.len(),
            skip_special,
        }
    }

    /// Appends a token and returns the text it completes (possibly empty while a character is
    /// incomplete).
    pub fn push(&mut self, dec: &dyn TokenDecoder, token: u32) -> Result<String, DetokError> {
        self.ids.push(token);
        self.step(dec, false)
    }

    /// Returns whatever is still held back (an incomplete character decodes as U+FFFD).
    pub fn flush(&mut self, dec: &dyn TokenDecoder) -> Result<String, DetokError> {
        self.step(dec, true)
    }

    fn step(&mut self, dec: &dyn TokenDecoder, force: bool) -> Result<String, DetokError> {
        if self.read_offset >= self.ids.len() {
            return Ok(String::new());
        }
        let prefix = dec.decode_ids(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let full = dec.decode_ids(&self.ids[self.prefix_offset..], self.skip_special)?;
        if !force && full.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let out = if full.len() >= prefix.len()
            && full.is_char_boundary(prefix.len())
            && full.starts_with(&prefix)
        {
            full[prefix.len()..].to_string()
        } else {
            // The window re-segmented (rare with byte-level BPE); fall back to the tail.
            full.chars().skip(prefix.chars().count()).collect()
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        // Keep the window short.
        if self.prefix_offset > 64 {
            let cut = self.prefix_offset - CONTEXT_TOKENS.min(self.prefix_offset);
            self.ids.drain(..cut);
            self.prefix_offset -= cut;
            self.read_offset -= cut;
        }
        Ok(out)
    }
}

/// Output text of one sample with stop-string handling and streaming hold-back.
#[derive(Clone, Debug)]
pub struct DetokStream {
    decoder: IncrementalDecoder,
    text: String,
    sent: usize,
    stops: Vec<String>,
    /// Per stop string, its prefix function (see [`borders`]), for the hold-back.
    stop_borders: Vec<Vec<usize>>,
    max_stop_len: usize,
    regex: Option<RegexScan>,
    no_stop_trim: bool,
    matched: Option<String>,
}

/// How a [`DetokStream`] decodes and where it stops.
#[derive(Clone, Debug, Default)]
pub struct StreamOptions {
    /// Leave special tokens out of the text.
    pub skip_special: bool,
    /// Stop strings (empty ones are ignored).
    pub stops: Vec<String>,
    /// A stop regex, if any.
    pub stop_regex: Option<StopRegex>,
    /// Keep the matched stop string (or regex match) in the text.
    pub no_stop_trim: bool,
}

impl DetokStream {
    /// A stream continuing after `context` with these stop strings and stop regexes.
    pub fn new(context: &[u32], opts: StreamOptions) -> Self {
        let StreamOptions {
            skip_special,
            stops,
            stop_regex,
            no_stop_trim,
        } = opts;
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let max_stop_len = stops.iter().map(String::len).max().unwrap_or(0);
        let stop_borders = stops.iter().map(|s| borders(s.as_bytes())).collect();
        Self {
            decoder: IncrementalDecoder::new(context, skip_special),
            text: String::new(),
            sent: 0,
            stops,
            stop_borders,
            max_stop_len,
            regex: stop_regex.map(RegexScan::new),
            no_stop_trim,
            matched: None,
        }
    }

    /// Appends a token. Returns the stop string (or the stop regex's pattern) it completed,
    /// if any: the stream is then finished and further tokens are ignored. With `check`
    /// unset (before `min_new_tokens`) the text grows but nothing matches yet; a match that
    /// completes later still counts.
    pub fn push(
        &mut self,
        dec: &dyn TokenDecoder,
        token: u32,
        check: bool,
    ) -> Result<Option<String>, DetokError> {
        if self.matched.is_some() {
            return Ok(None);
        }
        let piece = self.decoder.push(dec, token)?;
        Ok(self.append(piece, check))
    }

    /// Decodes whatever the decoder still holds (end of generation).
    pub fn finish(&mut self, dec: &dyn TokenDecoder) -> Result<Option<String>, DetokError> {
        if self.matched.is_some() {
            return Ok(None);
        }
        let piece = self.decoder.flush(dec)?;
        Ok(self.append(piece, true))
    }

    fn append(&mut self, piece: String, check: bool) -> Option<String> {
        if piece.is_empty() {
            return None;
        }
        let search_from = self
            .text
            .len()
            .saturating_sub(self.max_stop_len.saturating_sub(1));
        self.text.push_str(&piece);
        // (start, end, what matched)
        let mut best: Option<(usize, usize, &str)> = None;
        if check {
            for s in &self.stops {
                let mut from = search_from;
                while !self.text.is_char_boundary(from) {
                    from -= 1;
                }
                if let Some(pos) = self.text[from..].find(s.as_str()) {
                    let at = from + pos;
                    if best.is_none_or(|(b, _, _)| at < b) {
                        best = Some((at, at + s.len(), s));
                    }
                }
            }
        }
        if let Some(scan) = self.regex.as_mut() {
            if let Some(m) = scan.feed(piece.as_bytes(), check) {
                if best.is_none_or(|(_, e, _)| m.end < e) {
                    let pattern = &scan.regex().patterns()[m.pattern];
                    best = Some((m.start, m.end, pattern));
                }
            }
        }
        let (start, end, s) = best?;
        let s = s.to_string();
        let mut cut = if self.no_stop_trim { end } else { start };
        // A regex may match inside a character's bytes; cut on a character boundary.
        while !self.text.is_char_boundary(cut) {
            cut -= 1;
        }
        self.text.truncate(cut);
        self.sent = self.sent.min(cut);
        self.matched = Some(s.clone());
        Some(s)
    }

    /// The stop string (or stop regex pattern) that ended the stream, if any.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// The full output text so far (stop string trimmed unless `no_stop_trim`).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Text not yet taken, minus any tail that might still become a stop string or a stop
    /// regex match (all of it when `finished` or once a stop matched).
    pub fn take_delta(&mut self, finished: bool) -> String {
        let mut end = self.text.len();
        if !finished && self.matched.is_none() {
            if self.max_stop_len > 0 {
                end = self.safe_end();
            }
            if let Some(from) = self.regex.as_ref().and_then(RegexScan::hold_from) {
                let mut from = from.min(end);
                while !self.text.is_char_boundary(from) {
                    from -= 1;
                }
                end = from;
            }
        }
        if end <= self.sent {
            return String::new();
        }
        let out = self.text[self.sent..end].to_string();
        self.sent = end;
        out
    }

    /// End of the prefix of `text` that no stop string could start in.
    fn safe_end(&self) -> usize {
        let t = self.text.as_bytes();
        let mut hold = 0;
        for (s, pi) in self.stops.iter().zip(&self.stop_borders) {
            hold = hold.max(longest_prefix_at_end(s.as_bytes(), pi, t));
        }
        let mut end = self.text.len() - hold;
        while !self.text.is_char_boundary(end) {
            end -= 1;
        }
        end.max(self.sent.min(end))
    }
}

/// The prefix function of `s`: entry `i` is the length of the longest proper border of
/// `s[..=i]` (a prefix that is also a suffix).
fn borders(s: &[u8]) -> Vec<usize> {
    let mut pi = vec![0usize; s.len()];
    let mut k = 0;
    for i in 1..s.len() {
        while k > 0 && s[i] != s[k] {
            k = pi[k - 1];
        }
        if s[i] == s[k] {
            k += 1;
        }
        pi[i] = k;
    }
    pi
}

/// The longest proper prefix of `s` that `t` ends with, in O(|s|) time whatever the bytes
/// (Knuth–Morris–Pratt with `s`'s prefix function `pi` over `t`'s last `|s| - 1` bytes),
/// where trying every prefix length is O(|s|²) on text like `aaaa…` against `a…aba…a`.
fn longest_prefix_at_end(s: &[u8], pi: &[usize], t: &[u8]) -> usize {
    let m = s.len();
    if m < 2 {
        return 0;
    }
    // A prefix shorter than `m` that `t` ends with starts in its last `m - 1` bytes.
    let mut k = 0;
    for &c in &t[t.len().saturating_sub(m - 1)..] {
        while k > 0 && (k == m || s[k] != c) {
            k = pi[k - 1];
        }
        if s[k] == c {
            k += 1;
        }
    }
    if k == m {
        pi[m - 1]
    } else {
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The linear hold-back agrees with trying every prefix length, on all short strings
    /// over a two-letter alphabet and on a long adversarial one.
    #[test]
    fn the_longest_stop_prefix_at_the_end_is_found_in_linear_time() {
        let naive = |s: &[u8], t: &[u8]| -> usize {
            (1..s.len().min(t.len() + 1))
                .rev()
                .find(|&k| t.ends_with(&s[..k]))
                .unwrap_or(0)
        };
        let words = |n: usize| -> Vec<Vec<u8>> {
            (0..1u32 << n)
                .map(|b| {
                    (0..n)
                        .map(|i| if b >> i & 1 == 1 { b'a' } else { b'b' })
                        .collect()
                })
                .collect()
        };
        for ls in 0..=6 {
            for s in words(ls) {
                for lt in 0..=7 {
                    for t in words(lt) {
                        assert_eq!(
                            longest_prefix_at_end(&s, &borders(&s), &t),
                            naive(&s, &t),
                            "{s:?} {t:?}"
                        );
                    }
                }
            }
        }
        // A long stop string whose long prefixes all fail late against the text's end.
        let stop = [vec![b'a'; 2048], vec![b'b'], vec![b'a'; 2047]].concat();
        let text = vec![b'a'; 8000];
        assert_eq!(longest_prefix_at_end(&stop, &borders(&stop), &text), 2048);
        assert_eq!(
            longest_prefix_at_end(&stop, &borders(&stop), &text[..100]),
            100
        );
    }

    /// A byte-level decoder: each token is one byte; invalid UTF-8 decodes lossily (U+FFFD),
    /// as byte-level BPE tokenizers do.
    struct Bytes;
    impl TokenDecoder for Bytes {
        fn decode_ids(&self, ids: &[u32], _skip: bool) -> Result<String, DetokError> {
            let b: Vec<u8> = ids.iter().map(|&i| i as u8).collect();
            Ok(String::from_utf8_lossy(&b).into_owned())
        }
    }

    fn toks(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    #[test]
    fn multibyte_characters_are_held_until_complete() {
        let mut d = IncrementalDecoder::new(&[], false);
        let mut out = Vec::new();
        for t in toks("a😀b€") {
            out.push(d.push(&Bytes, t).unwrap());
        }
        // 'a', then 3 empty pieces, then the emoji, 'b', 2 empty, then '€'
        assert_eq!(out.concat(), "a😀b€");
        assert!(out.iter().all(|p| !p.contains('\u{FFFD}')));
        assert_eq!(out[1], "");
        assert_eq!(out[4], "😀");
    }

    #[test]
    fn long_streams_decode_exactly() {
        let s = "héllo wörld — ünïcödé ".repeat(20);
        let mut d = IncrementalDecoder::new(&toks("ctx"), false);
        let mut out = String::new();
        for t in toks(&s) {
            out.push_str(&d.push(&Bytes, t).unwrap());
        }
        out.push_str(&d.flush(&Bytes).unwrap());
        assert_eq!(out, s);
    }

    #[test]
    fn stop_string_is_trimmed_and_never_streamed() {
        let mut st = DetokStream::new(
            &[],
            StreamOptions {
                skip_special: false,
                stops: vec!["END".into()],
                stop_regex: None,
                no_stop_trim: false,
            },
        );
        let mut streamed = String::new();
        let mut matched = None;
        for t in toks("hello ENxEND tail") {
            if let Some(m) = st.push(&Bytes, t, true).unwrap() {
                matched = Some(m);
                break;
            }
            streamed.push_str(&st.take_delta(false));
        }
        streamed.push_str(&st.take_delta(true));
        assert_eq!(matched.as_deref(), Some("END"));
        assert_eq!(streamed, "hello ENx");
        assert_eq!(st.text(), "hello ENx");
    }

    #[test]
    fn no_stop_trim_keeps_the_stop_string() {
        let mut st = DetokStream::new(
            &[],
            StreamOptions {
                skip_special: false,
                stops: vec!["\n\n".into(), "x".into()],
                stop_regex: None,
                no_stop_trim: true,
            },
        );
        for t in toks("ab\n\ncd") {
            if st.push(&Bytes, t, true).unwrap().is_some() {
                break;
            }
        }
        assert_eq!(st.text(), "ab\n\n");
        assert_eq!(st.take_delta(false), "ab\n\n");
    }

    #[test]
    fn hold_back_releases_at_finish() {
        let mut st = DetokStream::new(
            &[],
            StreamOptions {
                skip_special: false,
                stops: vec!["STOP".into()],
                stop_regex: None,
                no_stop_trim: false,
            },
        );
        for t in toks("go ST") {
            st.push(&Bytes, t, true).unwrap();
        }
        assert_eq!(st.take_delta(false), "go ");
        assert_eq!(st.take_delta(true), "ST");
    }

    fn regex(p: &str) -> Option<StopRegex> {
        Some(StopRegex::new(&[p.to_string()]).unwrap())
    }

    #[test]
    fn stop_regex_is_held_back_trimmed_and_reported() {
        let mut st = DetokStream::new(
            &[],
            StreamOptions {
                skip_special: false,
                stops: vec![],
                stop_regex: regex(r"Answer: [0-9]+\."),
                no_stop_trim: false,
            },
        );
        let mut streamed = String::new();
        let mut matched = None;
        for t in toks("so. Answer: x. Answer: 42. More") {
            if let Some(m) = st.push(&Bytes, t, true).unwrap() {
                matched = Some(m);
                break;
            }
            let d = st.take_delta(false);
            // Nothing that could still be a match is ever streamed.
            assert!(!d.contains("Answer: 4"), "{d:?}");
            streamed.push_str(&d);
        }
        streamed.push_str(&st.take_delta(true));
        assert_eq!(matched.as_deref(), Some(r"Answer: [0-9]+\."));
        assert_eq!(streamed, "so. Answer: x. ");
        assert_eq!(st.text(), "so. Answer: x. ");
    }

    #[test]
    fn stop_regex_no_trim_and_min_tokens() {
        let mut st = DetokStream::new(
            &[],
            StreamOptions {
                skip_special: false,
                stops: vec![],
                stop_regex: regex("[0-9]{2}"),
                no_stop_trim: true,
            },
        );
        let text = "a 12 b 34 c";
        let mut matched = None;
        for (i, t) in toks(text).into_iter().enumerate() {
            // Not armed for the first 5 bytes (as before min_new_tokens): "12" is skipped.
            if let Some(m) = st.push(&Bytes, t, i >= 5).unwrap() {
                matched = Some(m);
                break;
            }
        }
        assert_eq!(matched.as_deref(), Some("[0-9]{2}"));
        assert_eq!(st.text(), "a 12 b 34");
        // With stop strings too, the earlier end wins.
        let mut st = DetokStream::new(
            &[],
            StreamOptions {
                skip_special: false,
                stops: vec!["b 3".into()],
                stop_regex: regex("[0-9]{2}"),
                no_stop_trim: false,
            },
        );
        for t in toks(text) {
            if st.push(&Bytes, t, true).unwrap().is_some() {
                break;
            }
        }
        assert_eq!(st.text(), "a ");
        assert_eq!(st.matched(), Some("[0-9]{2}"));
    }
}
