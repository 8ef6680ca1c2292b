//! Token vocabulary (token id → bytes) and the token trie the mask walk follows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::VocabError;

/// Longest token (in bytes) the trie holds; longer tokens are never allowed.
pub const MAX_TOKEN_BYTES: usize = 1000;

/// One trie node, in depth-first preorder.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TrieNode {
    /// Index of the first node after this subtree.
    pub next: u32,
    /// Start in `ids` of the ids of this whole subtree. They are contiguous, the node's own
    /// first (the token ids ending here: up to where the next node in preorder starts its
    /// subtree's, see [`TokenTrie::own_ids`]); the subtree's end where the node at `next`
    /// starts its own, or at the end of `ids`.
    pub sub_start: u32,
    /// Depth (1 for children of the root).
    pub depth: u16,
    /// The byte on the edge into this node.
    pub byte: u8,
}

/// A trie over token bytes, stored in preorder so a walk can skip a subtree in one step.
#[derive(Clone, Debug, Default)]
pub(crate) struct TokenTrie {
    pub nodes: Vec<TrieNode>,
    pub ids: Vec<u32>,
    /// Per first byte: its depth-1 node (`u32::MAX`: none; empty in an empty trie), so a
    /// walk from the root does not scan the root's children.
    pub root: Vec<u32>,
}

impl TokenTrie {
    fn build(tokens: &[Vec<u8>], usable: &[bool]) -> Self {
        let entries: Vec<(u32, &[u8])> = (0..tokens.len() as u32)
            .filter(|&i| usable[i as usize])
            .map(|i| (i, &tokens[i as usize][..]))
            .collect();
        Self::build_from(entries)
    }

    /// A trie over arbitrary non-empty `(id, bytes)` entries.
    fn build_from(mut entries: Vec<(u32, &[u8])>) -> Self {
        entries.sort_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(&b.0)));
        let mut nodes: Vec<TrieNode> = Vec::new();
        let mut ids: Vec<u32> = Vec::new();
        // path[d] = node index at depth d+1 on the current path.
        let mut path: Vec<usize> = Vec::new();
        let mut prev: &[u8] = &[];
        for &(id, t) in &entries {
            let lcp = prev.iter().zip(t).take_while(|(a, b)| a == b).count();
            while path.len() > lcp {
                let n = path.pop().unwrap_or_default();
                nodes[n].next = nodes.len() as u32;
            }
            for (k, &b) in t.iter().enumerate().skip(lcp) {
                nodes.push(TrieNode {
                    byte: b,
                    depth: (k + 1) as u16,
                    next: 0,
                    sub_start: ids.len() as u32,
                });
                path.push(nodes.len() - 1);
            }
            // Entries are sorted, so the ids ending at a node come before those of its
            // children (a token sorts before its extensions): the node's own ids are the
            // first of its subtree's.
            if !path.is_empty() {
                ids.push(id);
            }
            prev = t;
        }
        while let Some(n) = path.pop() {
            nodes[n].next = nodes.len() as u32;
        }
        let mut root = vec![u32::MAX; 256];
        let mut i = 0usize;
        while i < nodes.len() {
            root[nodes[i].byte as usize] = i as u32;
            i = nodes[i].next as usize;
        }
        TokenTrie { nodes, ids, root }
    }

    /// The token ids ending at node `i` (usually none or one).
    #[inline]
    pub fn own_ids(&self, i: usize) -> &[u32] {
        let end = self
            .nodes
            .get(i + 1)
            .map_or(self.ids.len(), |m| m.sub_start as usize);
        &self.ids[self.nodes[i].sub_start as usize..end]
    }

    /// Calls `f` with each node along `path` from the root (the node of `path[..1]`, of
    /// `path[..2]`, …) while there is one; returns how many it found.
    pub fn along(&self, path: &[u8], mut f: impl FnMut(usize)) -> usize {
        let nodes = &self.nodes;
        let Some(&first) = path.first() else {
            return 0;
        };
        let j = self.root.get(first as usize).copied().unwrap_or(u32::MAX);
        if j == u32::MAX {
            return 0;
        }
        let j = j as usize;
        f(j);
        let (mut i, mut end) = (j + 1, nodes[j].next as usize);
        for (d, &b) in path.iter().enumerate().skip(1) {
            // A node's children follow it in preorder, each subtree skipped by `next`.
            let mut j = i;
            while j < end && !(nodes[j].depth as usize == d + 1 && nodes[j].byte == b) {
                j = nodes[j].next as usize;
            }
            if j >= end {
                return d;
            }
            f(j);
            i = j + 1;
            end = nodes[j].next as usize;
        }
        path.len()
    }

    /// The node `path` reaches from the root, if any (`path` non-empty).
    pub fn find(&self, path: &[u8]) -> Option<usize> {
        let mut last = None;
        (self.along(path, |n| last = Some(n)) == path.len())
            .then_some(last)
            .flatten()
    }

    /// The token ids of the subtree rooted at node `i`.
    pub fn subtree_ids(&self, i: usize) -> &[u32] {
        let n = &self.nodes[i];
        let end = self
            .nodes
            .get(n.next as usize)
            .map_or(self.ids.len(), |m| m.sub_start as usize);
        &self.ids[n.sub_start as usize..end]
    }
}

/// How a tokenizer spells bytes in its vocabulary strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenEncoding {
    /// Token strings are the bytes themselves (UTF-8).
    Raw,
    /// GPT-2 byte-level BPE: every byte is one printable char (`Ġ` = space).
    ByteLevel,
    /// SentencePiece with byte fallback: `▁` is a space and `<0xAB>` is byte 0xAB.
    ByteFallback,
}

/// The token vocabulary: bytes of every token, which tokens are special, which end the text.
#[derive(Clone, Debug)]
pub struct TokenVocab {
    tokens: Vec<Vec<u8>>,
    /// `plain_upto[k]`: tokens made of 1..=k whole plain JSON-string characters (no `"`,
    /// `\`, control characters), k up to [`MAX_PLAIN_CHARS`].
    plain_upto: Vec<Vec<u32>>,
    /// Trie of the usable tokens that are not plain.
    rest_trie: TokenTrie,
    /// For the usable tokens that are not in `plain_upto[MAX_PLAIN_CHARS]`: a trie of what
    /// follows their longest prefix of whole plain characters (the *suffix*; ids are token
    /// ids). A configuration that every plain character leads back to itself allows such a
    /// token iff it allows the suffix.
    suffix_trie: TokenTrie,
    /// Usable tokens made only of plain characters but longer than `MAX_PLAIN_CHARS`
    /// characters (empty suffix).
    long_plain: Vec<u32>,
    usable: Vec<bool>,
    eos: Vec<u32>,
    trie: TokenTrie,
    max_token_len: usize,
    /// Per character class: the parts a class loop's mask is made of (see
    /// [`TokenVocab::class_loop_parts`]), built on first use and shared by every grammar
    /// over this vocabulary (clones share it too).
    class_parts: Arc<Mutex<ClassCache>>,
    /// Per byte: the usable tokens that contain it (see [`TokenVocab::tokens_with_byte`]),
    /// built on first use and shared like `class_parts`.
    byte_tokens: Arc<Mutex<HashMap<u8, Arc<[u32]>>>>,
    /// Per length: the usable tokens longer than it (see [`TokenVocab::long_tokens`]).
    long_tokens: Arc<Mutex<HashMap<usize, Arc<LongTokens>>>>,
    /// The usable tokens with two or more `"` (see [`TokenVocab::multi_quote_tokens`]),
    /// built on first use and shared like `class_parts`.
    multi_quote: Arc<std::sync::OnceLock<Vec<u32>>>,
    /// The usable tokens that may open a key, by where they start (see
    /// [`TokenVocab::key_opening_tokens`]).
    key_opening: Arc<std::sync::OnceLock<[Vec<u32>; 3]>>,
    /// The usable tokens longest first (see [`TokenVocab::tokens_by_length`]), built on
    /// first use and shared like `class_parts`.
    by_length: Arc<std::sync::OnceLock<TokensByLength>>,
}

/// The usable tokens, longest first (`crate::length` checks only those longer than what
/// the open counted string has room for).
#[derive(Debug)]
pub(crate) struct TokensByLength {
    /// Token ids, by decreasing byte length.
    pub ids: Vec<u32>,
    /// Their byte lengths.
    pub lens: Vec<u32>,
    /// Their characters when they are plain JSON-string text (no `"`, `\\` or control
    /// character, valid UTF-8: inside a string they stay inside it and add exactly this
    /// many characters); `u32::MAX` otherwise.
    pub chars: Vec<u32>,
}

/// A set of characters a configuration loops on: ASCII bytes by bit, and either every
/// non-ASCII character or none of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CharClass {
    /// Bit `b` set: ASCII byte `b` is in the class.
    pub ascii: u128,
    /// Every valid multi-byte UTF-8 character is in the class.
    pub non_ascii: bool,
}

impl CharClass {
    fn has_ascii(&self, b: u8) -> bool {
        b < 128 && (self.ascii >> b) & 1 == 1
    }

    /// A token starting with `b` may start with a character of the class.
    pub fn may_start(&self, b: u8) -> bool {
        self.has_ascii(b) || (self.non_ascii && (0xC2..=0xF4).contains(&b))
    }

    /// Length in bytes of the longest prefix of `t` made of whole characters of the class.
    fn prefix_len(&self, t: &[u8]) -> usize {
        let mut i = 0;
        while i < t.len() {
            let b = t[i];
            if b < 128 {
                if !self.has_ascii(b) {
                    break;
                }
                i += 1;
                continue;
            }
            let n = match b {
                0xC2..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF4 => 4,
                _ => break,
            };
            if !self.non_ascii || i + n > t.len() || std::str::from_utf8(&t[i..i + n]).is_err() {
                break;
            }
            i += n;
        }
        i
    }
}

/// What the mask of a configuration that every character of a class leads back to is made
/// of: a token is allowed iff it is made only of class characters, or what follows its
/// longest class prefix (its *tail*) is allowed. Tokens whose first byte cannot start a
/// class character are not here: the walk takes them from the full trie.
#[derive(Debug)]
pub(crate) struct ClassLoopParts {
    /// Usable tokens made only of whole class characters.
    pub all_in: Vec<u32>,
    /// Trie of the tails of the other usable tokens whose first byte may start a class
    /// character (ids are token ids).
    pub tails: TokenTrie,
    /// First bytes whose whole subtree of the full trie is covered by the two above.
    pub skip_root: [u64; 4],
}

/// The usable tokens longer than some length ([`TokenVocab::long_tokens`]).
#[derive(Debug)]
pub(crate) struct LongTokens {
    /// Their ids.
    pub ids: Vec<u32>,
    /// A trie of their bytes.
    pub trie: TokenTrie,
}

/// Class parts built so far (`None`: not worth it, see [`TokenVocab::class_loop_parts`]).
#[derive(Debug, Default)]
struct ClassCache {
    parts: HashMap<CharClass, Option<Arc<ClassLoopParts>>>,
    bytes: usize,
}

/// Memory the class parts of one vocabulary may take.
const CLASS_CACHE_BYTES: usize = 96 << 20;

impl TokenVocab {
    /// A vocabulary from raw token bytes. Tokens listed in `special` (and empty tokens) are
    /// never allowed by a mask; `eos` tokens are allowed only where the grammar accepts.
    pub fn new(tokens: Vec<Vec<u8>>, special: &[u32], eos: &[u32]) -> Result<Self, VocabError> {
        let n = tokens.len();
        for &id in special.iter().chain(eos) {
            if id as usize >= n {
                return Err(VocabError::BadTokenId { id, vocab_size: n });
            }
        }
        if eos.is_empty() {
            return Err(VocabError::NoEos);
        }
        let mut usable: Vec<bool> = tokens
            .iter()
            .map(|t| !t.is_empty() && t.len() <= MAX_TOKEN_BYTES)
            .collect();
        for &id in special.iter().chain(eos) {
            usable[id as usize] = false;
        }
        let trie = TokenTrie::build(&tokens, &usable);
        let mut plain_upto = vec![vec![0u32; n.div_ceil(32)]; MAX_PLAIN_CHARS + 1];
        let mut rest = usable.clone();
        for (id, t) in tokens.iter().enumerate() {
            if let Some(k) = plain_chars(t).filter(|_| usable[id]) {
                for m in &mut plain_upto[k..] {
                    m[id / 32] |= 1 << (id % 32);
                }
                rest[id] = false;
            }
        }
        let rest_trie = TokenTrie::build(&tokens, &rest);
        let mut long_plain = Vec::new();
        let mut suffixes: Vec<(u32, &[u8])> = Vec::new();
        for (id, t) in tokens.iter().enumerate() {
            if rest[id] {
                let tail = &t[plain_prefix_len(t)..];
                if tail.is_empty() {
                    long_plain.push(id as u32);
                } else {
                    suffixes.push((id as u32, tail));
                }
            }
        }
        let suffix_trie = TokenTrie::build_from(suffixes);
        let max_token_len = tokens
            .iter()
            .zip(&usable)
            .filter(|(_, u)| **u)
            .map(|(t, _)| t.len())
            .max()
            .unwrap_or(1);
        Ok(TokenVocab {
            tokens,
            plain_upto,
            rest_trie,
            suffix_trie,
            long_plain,
            usable,
            eos: eos.to_vec(),
            trie,
            max_token_len,
            class_parts: Arc::default(),
            byte_tokens: Arc::default(),
            long_tokens: Arc::default(),
            multi_quote: Arc::default(),
            key_opening: Arc::default(),
            by_length: Arc::default(),
        })
    }

    /// A vocabulary from token strings as the tokenizer spells them.
    pub fn from_token_strings(
        strings: &[Option<String>],
        encoding: TokenEncoding,
        special: &[u32],
        eos: &[u32],
    ) -> Result<Self, VocabError> {
        let table = byte_level_table();
        let mut special = special.to_vec();
        let mut tokens = Vec::with_capacity(strings.len());
        for (id, s) in strings.iter().enumerate() {
            let bytes = match s {
                None => None,
                Some(s) => match encoding {
                    TokenEncoding::Raw => Some(s.as_bytes().to_vec()),
                    TokenEncoding::ByteLevel => decode_byte_level(s, &table),
                    TokenEncoding::ByteFallback => Some(decode_byte_fallback(s)),
                },
            };
            match bytes {
                Some(b) => tokens.push(b),
                None => {
                    special.push(id as u32);
                    tokens.push(Vec::new());
                }
            }
        }
        Self::new(tokens, &special, eos)
    }

    /// The adapter from a Hugging Face tokenizer: detects byte-level vs byte-fallback
    /// spelling from its decoder and model, marks special added tokens.
    #[cfg(feature = "tokenizers")]
    pub fn from_tokenizer(tok: &tokenizers::Tokenizer, eos: &[u32]) -> Result<Self, VocabError> {
        let json: serde_json::Value = serde_json::from_str(
            &tok.to_string(false)
                .map_err(|e| VocabError::Tokenizer(e.to_string()))?,
        )
        .map_err(|e| VocabError::Tokenizer(e.to_string()))?;
        let decoder = json
            .get("decoder")
            .map(|d| d.to_string())
            .unwrap_or_default();
        let byte_fallback = json
            .pointer("/model/byte_fallback")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let encoding = if decoder.contains("ByteLevel") {
            TokenEncoding::ByteLevel
        } else if byte_fallback || decoder.contains("ByteFallback") {
            TokenEncoding::ByteFallback
        } else {
            TokenEncoding::Raw
        };
        let n = tok.get_vocab_size(true);
        let added = tok.get_added_tokens_decoder();
        let mut strings = Vec::with_capacity(n);
        let mut special = Vec::new();
        for id in 0..n as u32 {
            strings.push(tok.id_to_token(id));
        }
        let mut raw_added: Vec<(u32, Vec<u8>)> = Vec::new();
        for (&id, at) in added.iter() {
            if (id as usize) < n {
                if at.special {
                    special.push(id);
                } else {
                    raw_added.push((id, at.content.as_bytes().to_vec()));
                }
            }
        }
        let mut v = Self::from_token_strings(&strings, encoding, &special, eos)?;
        if !raw_added.is_empty() {
            let mut tokens = v.tokens.clone();
            let mut special: Vec<u32> = (0..n as u32)
                .filter(|&i| !v.usable[i as usize] && !eos.contains(&i))
                .collect();
            for (id, b) in raw_added {
                special.retain(|&s| s != id);
                tokens[id as usize] = b;
            }
            v = Self::new(tokens, &special, eos)?;
        }
        Ok(v)
    }

    /// Number of token ids (mask length in bits).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// `u32` words a bitmask over this vocabulary needs.
    pub fn mask_words(&self) -> usize {
        self.tokens.len().div_ceil(32)
    }

    /// Bytes of a token (empty for special tokens).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.tokens.get(id as usize).map(|t| &t[..])
    }

    /// True when a mask may allow this token (not special, not EOS, not empty).
    pub fn is_usable(&self, id: u32) -> bool {
        self.usable.get(id as usize).copied().unwrap_or(false)
    }

    /// The end-of-sequence tokens.
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// Longest usable token, in bytes.
    pub fn max_token_len(&self) -> usize {
        self.max_token_len
    }

    /// The usable tokens longest first, with their lengths and plain characters.
    pub(crate) fn tokens_by_length(&self) -> &TokensByLength {
        self.by_length.get_or_init(|| {
            let mut ids: Vec<u32> = (0..self.tokens.len() as u32)
                .filter(|&t| self.usable[t as usize])
                .collect();
            ids.sort_by_key(|&t| std::cmp::Reverse(self.tokens[t as usize].len()));
            let lens = ids
                .iter()
                .map(|&t| self.tokens[t as usize].len() as u32)
                .collect();
            let chars = ids
                .iter()
                .map(|&t| {
                    let b = &self.tokens[t as usize];
                    match std::str::from_utf8(b) {
                        Ok(s) if !s.bytes().any(|x| x == b'"' || x == b'\\' || x < 0x20) => {
                            s.chars().count() as u32
                        }
                        _ => u32::MAX,
                    }
                })
                .collect();
            TokensByLength { ids, lens, chars }
        })
    }

    /// Usable tokens whose bytes hold two or more `"`: they may close a string after
    /// opening it (`uniqueItems` checks them one by one, `crate::unique`).
    pub(crate) fn multi_quote_tokens(&self) -> &[u32] {
        self.multi_quote.get_or_init(|| {
            (0..self.tokens.len() as u32)
                .filter(|&t| self.usable[t as usize])
                .filter(|&t| {
                    self.tokens[t as usize]
                        .iter()
                        .filter(|&&x| x == b'"')
                        .count()
                        >= 2
                })
                .collect()
        })
    }

    /// Builds the lists of [`TokenVocab::key_opening_tokens`] now (once per vocabulary).
    pub(crate) fn warm_key_opening_tokens(&self) {
        let _ = self.key_opening_tokens(KeyFrom::String);
    }

    /// The usable tokens that may open a string where an object key goes, when written
    /// from inside a string (`KeyFrom::String`), from where a key goes (`KeyFrom::Gap`), or
    /// from elsewhere outside strings (`KeyFrom::Other`): a `"` outside strings, at the
    /// starting depth or below, after a `,` there (or, from a key's place, before anything
    /// but whitespace). A superset of the tokens that open a key (a `,` in an array counts
    /// too), for the key-loop checks (`crate::unique`).
    pub(crate) fn key_opening_tokens(&self, from: KeyFrom) -> &[u32] {
        let lists = self.key_opening.get_or_init(|| {
            let mut lists: [Vec<u32>; 3] = Default::default();
            for (i, list) in lists.iter_mut().enumerate() {
                for t in 0..self.tokens.len() as u32 {
                    if self.usable[t as usize]
                        && may_open_key(&self.tokens[t as usize], i == 0, i == 1)
                    {
                        list.push(t);
                    }
                }
            }
            lists
        });
        &lists[from as usize]
    }

    pub(crate) fn trie(&self) -> &TokenTrie {
        &self.trie
    }

    /// Mask of plain-string tokens of at most `k` characters, and the trie of the tokens
    /// that are not plain.
    pub(crate) fn plain_split(&self, k: usize) -> (&[u32], &TokenTrie) {
        (&self.plain_upto[k.min(MAX_PLAIN_CHARS)], &self.rest_trie)
    }

    /// For a configuration every plain character leads back to: the mask of plain tokens
    /// (up to [`MAX_PLAIN_CHARS`] characters), the longer all-plain tokens, and the trie of
    /// the other tokens' suffixes after their plain prefix.
    pub(crate) fn plain_loop_parts(&self) -> (&[u32], &[u32], &TokenTrie) {
        (
            &self.plain_upto[MAX_PLAIN_CHARS],
            &self.long_plain,
            &self.suffix_trie,
        )
    }

    /// The parts of the mask of a configuration every character of `cls` leads back to
    /// (built once per class and cached). `None` when the tails would hold more than a
    /// quarter of the vocabulary (a trie walk costs about as much then) or the cache is full.
    pub(crate) fn class_loop_parts(&self, cls: CharClass) -> Option<Arc<ClassLoopParts>> {
        let mut cache = self.class_parts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache.parts.get(&cls) {
            return p.clone();
        }
        // A class that meets a full cache, or whose parts would overflow it, is remembered as
        // `None` too, so that it is not scanned again.
        if cache.bytes >= CLASS_CACHE_BYTES {
            cache.parts.insert(cls, None);
            return None;
        }
        let mut all_in = vec![0u32; self.mask_words()];
        let mut tails: Vec<(u32, &[u8])> = Vec::new();
        let mut usable = 0usize;
        for (id, t) in self.tokens.iter().enumerate() {
            if !self.usable[id] {
                continue;
            }
            usable += 1;
            if !cls.may_start(t[0]) {
                continue;
            }
            let k = cls.prefix_len(t);
            if k == t.len() {
                all_in[id / 32] |= 1 << (id % 32);
            } else {
                tails.push((id as u32, &t[k..]));
            }
        }
        let parts = if tails.len() > usable / 4 {
            None
        } else {
            let tails = TokenTrie::build_from(tails);
            let mut skip_root = [0u64; 4];
            for b in 0..=255u8 {
                if cls.may_start(b) {
                    skip_root[(b >> 6) as usize] |= 1 << (b & 63);
                }
            }
            let size = all_in.len() * 4
                + tails.nodes.len() * std::mem::size_of::<TrieNode>()
                + tails.ids.len() * 4;
            if cache.bytes + size > CLASS_CACHE_BYTES {
                None
            } else {
                cache.bytes += size;
                Some(Arc::new(ClassLoopParts {
                    all_in,
                    tails,
                    skip_root,
                }))
            }
        };
        cache.parts.insert(cls, parts.clone());
        parts
    }

    /// The usable tokens longer than `len` bytes: their ids and a trie of their bytes (built
    /// once per length and cached).
    pub(crate) fn long_tokens(&self, len: usize) -> Arc<LongTokens> {
        let mut cache = self.long_tokens.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(len)
            .or_insert_with(|| {
                let entries: Vec<(u32, &[u8])> = self
                    .tokens
                    .iter()
                    .enumerate()
                    .filter(|(id, t)| self.usable[*id] && t.len() > len)
                    .map(|(id, t)| (id as u32, &t[..]))
                    .collect();
                let ids = entries.iter().map(|e| e.0).collect();
                Arc::new(LongTokens {
                    ids,
                    trie: TokenTrie::build_from(entries),
                })
            })
            .clone()
    }

    /// The usable tokens whose bytes contain `b`, in id order (built once per byte and
    /// cached).
    pub(crate) fn tokens_with_byte(&self, b: u8) -> Arc<[u32]> {
        let mut cache = self.byte_tokens.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(b)
            .or_insert_with(|| {
                self.tokens
                    .iter()
                    .enumerate()
                    .filter(|(id, t)| self.usable[*id] && t.contains(&b))
                    .map(|(id, _)| id as u32)
                    .collect()
            })
            .clone()
    }

    /// Greedy longest-match tokenization of `bytes` over usable tokens (for tests and for
    /// turning forced bytes into tokens). `None` when some byte has no token.
    pub fn greedy_tokenize(&self, bytes: &[u8]) -> Option<Vec<u32>> {
        let nodes = &self.trie.nodes;
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < bytes.len() {
            let mut best: Option<(usize, u32)> = None;
            let mut i = 0usize;
            let mut depth = 1u16;
            let mut k = pos;
            while i < nodes.len() && k < bytes.len() {
                let n = &nodes[i];
                if n.depth < depth {
                    break;
                }
                if n.depth == depth && n.byte == bytes[k] {
                    if let Some(&id) = self.trie.own_ids(i).first() {
                        best = Some((k + 1 - pos, id));
                    }
                    depth += 1;
                    k += 1;
                    i += 1;
                } else if n.depth == depth {
                    i = n.next as usize;
                } else {
                    i += 1;
                }
            }
            let (len, id) = best?;
            out.push(id);
            pos += len;
        }
        Some(out)
    }
}

/// Longest plain token (in characters) the mask fast path handles.
pub(crate) const MAX_PLAIN_CHARS: usize = 64;

/// Character count when the token is 1..=64 whole UTF-8 characters, none of them `"`,
/// `\\` or a control character.
fn plain_chars(t: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(t).ok()?;
    let n = s.chars().count();
    let ok =
        (1..=MAX_PLAIN_CHARS).contains(&n) && s.chars().all(|c| c >= ' ' && c != '"' && c != '\\');
    ok.then_some(n)
}

/// Length in bytes of the longest prefix of `t` made of whole plain characters.
fn plain_prefix_len(t: &[u8]) -> usize {
    let s = match std::str::from_utf8(t) {
        Ok(s) => s,
        // Only the valid UTF-8 prefix can hold whole characters.
        Err(e) => match std::str::from_utf8(&t[..e.valid_up_to()]) {
            Ok(s) => s,
            Err(_) => return 0,
        },
    };
    s.char_indices()
        .find(|&(_, c)| c < ' ' || c == '"' || c == '\\')
        .map(|(i, _)| i)
        .unwrap_or(s.len())
}

/// GPT-2's byte → char table, inverted: char → byte.
fn byte_level_table() -> std::collections::HashMap<char, u8> {
    let mut map = std::collections::HashMap::new();
    let mut n = 0u32;
    for b in 0u32..256 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        if let Some(ch) = char::from_u32(c) {
            map.insert(ch, b as u8);
        }
    }
    map
}

fn decode_byte_level(s: &str, table: &std::collections::HashMap<char, u8>) -> Option<Vec<u8>> {
    s.chars().map(|c| table.get(&c).copied()).collect()
}

fn decode_byte_fallback(s: &str) -> Vec<u8> {
    if s.len() == 6 && s.starts_with("<0x") && s.ends_with('>') {
        if let Ok(b) = u8::from_str_radix(&s[3..5], 16) {
            return vec![b];
        }
    }
    s.replace('\u{2581}', " ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trie_preorder_and_greedy() {
        let toks: Vec<Vec<u8>> = ["a", "ab", "abc", "b", "", "ab"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        let v = TokenVocab::new(toks, &[], &[4]).unwrap();
        let t = v.trie();
        assert_eq!(t.nodes.len(), 4); // a, b(ab), c(abc), b
        assert_eq!(t.nodes[0].next, 3);
        assert_eq!(t.own_ids(0), &[0]);
        assert_eq!(t.own_ids(1), &[1, 5]); // "ab" twice
        assert_eq!(t.own_ids(2), &[2]);
        assert_eq!(t.own_ids(3), &[3]);
        assert_eq!(t.subtree_ids(0), &[0, 1, 5, 2]); // a, ab, ab, abc
        assert_eq!(t.subtree_ids(3), &[3]);
        assert_eq!(v.greedy_tokenize(b"abcab").map(|x| x.len()), Some(2));
        assert_eq!(v.greedy_tokenize(b"zz"), None);
    }

    #[test]
    fn plain_prefix_and_suffix_trie() {
        assert_eq!(plain_prefix_len(b"ab\"c"), 2);
        assert_eq!(plain_prefix_len("é\\".as_bytes()), 2);
        assert_eq!(plain_prefix_len(b"x\xE4\xB8"), 1);
        assert_eq!(plain_prefix_len(b"\n"), 0);
        let toks: Vec<Vec<u8>> = vec![
            b"ab".to_vec(),
            b"ab\",".to_vec(),
            b"\"".to_vec(),
            "x".repeat(70).into_bytes(),
            b"".to_vec(),
        ];
        let v = TokenVocab::new(toks, &[], &[4]).unwrap();
        let (plain, long, suffix) = v.plain_loop_parts();
        assert_eq!(plain[0], 1);
        assert_eq!(long, &[3]);
        // Suffixes `"` (token 2) and `",` (token 1) share the first node.
        assert_eq!(suffix.nodes.len(), 2);
        assert_eq!(suffix.ids, vec![2, 1]);
    }

    #[test]
    fn byte_level_and_fallback() {
        let t = byte_level_table();
        assert_eq!(decode_byte_level("\u{120}hi", &t), Some(b" hi".to_vec()));
        assert_eq!(decode_byte_level("\u{10a}", &t), Some(b"\n".to_vec()));
        assert_eq!(decode_byte_fallback("<0x0A>"), b"\n".to_vec());
        assert_eq!(decode_byte_fallback("\u{2581}the"), b" the".to_vec());
    }
}

/// Where a token is written from, for [`TokenVocab::key_opening_tokens`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyFrom {
    /// Inside a string.
    String = 0,
    /// Outside strings, where an object key goes.
    Gap = 1,
    /// Outside strings, elsewhere.
    Other = 2,
}

/// Whether `bytes`, written from inside a string (`in_str`) or from outside strings where a
/// key goes (`gap`) or not, open a string at the starting depth or below after a `,` there
/// (or, from a key's place, before any other byte but whitespace), or open an object and
/// write a `,` and a `"` after it (two keys of that object).
fn may_open_key(bytes: &[u8], mut in_str: bool, gap: bool) -> bool {
    let (mut depth, mut esc, mut expect) = (0i32, false, gap && !in_str);
    for (i, &b) in bytes.iter().enumerate() {
        if in_str {
            in_str = !crate::unique::closes_string(b, &mut esc);
            continue;
        }
        match b {
            b'"' => {
                if expect && depth <= 0 {
                    return true;
                }
                in_str = true;
                expect = false;
            }
            b'{' if crate::unique::opens_second_key(&bytes[i..]) => return true,
            b'{' | b'[' => {
                depth += 1;
                expect = false;
            }
            b'}' | b']' => {
                depth -= 1;
                expect = false;
            }
            b',' => expect = depth <= 0,
            b' ' | b'\t' | b'\n' | b'\r' => {}
            _ => expect = false,
        }
    }
    false
}
