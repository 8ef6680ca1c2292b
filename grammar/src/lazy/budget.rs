//! Token-budget planning: the cost of the cheapest close of a configuration in tokens, and
//! the mask restriction that keeps a close within the tokens left.
//!
//! The **close** of a configuration is the shortest text that completes it, taken byte by
//! byte from the lowest byte that lowers `min_bytes` by one (as [`crate::Matcher::closing_bytes`]
//! does): a function of the configuration alone, so the close of every configuration on it
//! is its own suffix. Its **cost** is the fewest vocabulary tokens that spell it, found by a
//! backward pass over the close (each token a substring of it; where the close reaches a
//! configuration already costed, tokens do not cross that point, so the cost is an upper
//! bound on the fewest tokens of any complete text, and always one that can be followed).
//! The first token of
//! that spelling leads to the configuration the close passes through after it, whose cost
//! is one less; so a generator that only ever takes tokens after which the cost fits the
//! tokens left can always go on, and ends with a complete text at the latest when the
//! budget runs out. Calls are part of a configuration (its threads' stacks), so the close
//! of a thread deep in a recursion returns through every pending frame: a `$ref` cycle
//! costs what its open frames need.
//!
//! The restriction walks the token trie from the configuration once (every live token,
//! its end configuration's cost; inside a string only the tokens that leave it), and
//! remembers the largest cost a token can lead to and the tokens whose cost differs from
//! the configuration's own: a configuration met again is a lookup, and near the limit a
//! clearing of those tokens alone. A bound on every configuration's close (the grammar's
//! [`Lazy::close_cap`]) skips it altogether far from the limit.

use super::{ConfigId, FastMap, Lazy, DEAD, MAX_STACK_DEPTH};
use crate::nfa::{Nfa, StateId};
use crate::vocab::TokenVocab;

/// Longest close followed (bytes); a longer one has no planned cost.
const MAX_CLOSE_BYTES: usize = 1 << 16;

/// Per-grammar memo of the budget planning (filled only when a budget is asked about).
#[derive(Debug, Default)]
pub(crate) struct BudgetMemo {
    /// Per configuration: the first byte of its close and the configuration after it.
    step: FastMap<ConfigId, (u8, ConfigId)>,
    /// Per configuration: tokens of its close (`u32::MAX`: none planned).
    cost: FastMap<ConfigId, u32>,
    /// Per configuration: what the walk of its tokens found.
    parts: FastMap<ConfigId, Parts>,
    /// Bytes held by `parts`.
    parts_bytes: usize,
    /// Reused buffer of the tokens kept when every token left is needed.
    keep: Vec<u32>,
    /// Bound on any configuration's `min_bytes` (and so on its cost); `None` until needed.
    cap: Option<u32>,
    /// Reused stack of the trie walk.
    walk: Vec<ConfigId>,
}

impl BudgetMemo {
    pub fn heap_bytes(&self) -> usize {
        self.step.capacity() * 16 + self.cost.capacity() * 12 + self.parts_bytes
    }
}

impl Lazy {
    /// The first byte of `c`'s close and the configuration after it.
    fn close_step(&mut self, nfa: &Nfa, c: ConfigId) -> Option<(u8, ConfigId)> {
        if let Some(&s) = self.budget.step.get(&c) {
            return Some(s);
        }
        let m = self.configs[c as usize].min_bytes;
        if m == 0 || m == u32::MAX {
            return None;
        }
        let set = self.next_bytes(nfa, c);
        for b in crate::lazy::set_bytes(set) {
            let n = self.step(nfa, c, b);
            if n != DEAD && self.configs[n as usize].min_bytes == m - 1 {
                self.budget.step.insert(c, (b, n));
                return Some((b, n));
            }
        }
        None
    }

    /// Tokens of `c`'s close, spelt in the fewest vocabulary tokens (0 when `c` accepts,
    /// `u32::MAX` when no close is planned). See the module docs.
    pub fn close_cost(&mut self, nfa: &Nfa, vocab: &TokenVocab, c: ConfigId) -> u32 {
        if c == DEAD {
            return u32::MAX;
        }
        if self.configs[c as usize].accept {
            return 0;
        }
        if let Some(&k) = self.budget.cost.get(&c) {
            return k;
        }
        // Follow the close to an accepting configuration or one whose cost is known.
        let mut path = vec![c];
        let mut bytes = Vec::new();
        let tail = loop {
            let cur = *path.last().unwrap_or(&c);
            if self.configs[cur as usize].accept {
                break 0;
            }
            if cur != c {
                if let Some(&k) = self.budget.cost.get(&cur) {
                    break k;
                }
            }
            if bytes.len() >= MAX_CLOSE_BYTES {
                break u32::MAX;
            }
            match self.close_step(nfa, cur) {
                Some((b, n)) => {
                    bytes.push(b);
                    path.push(n);
                }
                None => break u32::MAX,
            }
        };
        // Backward: cost[i] = 1 + min over tokens t spelling bytes[i..i+len] of cost[i+len].
        let n = bytes.len();
        let mut cost = vec![u32::MAX; n + 1];
        cost[n] = tail;
        let trie = vocab.trie();
        let nodes = &trie.nodes;
        for i in (0..n).rev() {
            let mut best = u32::MAX;
            let mut node = 0usize;
            let mut depth = 1u16;
            let mut k = i;
            while node < nodes.len() && k < n {
                let nd = &nodes[node];
                if nd.depth < depth {
                    break;
                }
                if nd.depth == depth && nd.byte == bytes[k] {
                    k += 1;
                    if !trie.own_ids(node).is_empty() && cost[k] != u32::MAX {
                        best = best.min(cost[k] + 1);
                    }
                    depth += 1;
                    node += 1;
                } else if nd.depth == depth {
                    node = nd.next as usize;
                } else {
                    node += 1;
                }
            }
            cost[i] = best;
        }
        for (i, &p) in path[..n].iter().enumerate() {
            self.budget.cost.insert(p, cost[i]);
        }
        cost[0]
    }

    /// A bound on every configuration's `min_bytes`, so on every cost: rules weighted by
    /// their largest distance, summed along the longest call chain from the root (a chain
    /// of [`MAX_STACK_DEPTH`] + 1 rules where calls recurse).
    fn close_cap(&mut self, nfa: &Nfa) -> u32 {
        if let Some(c) = self.budget.cap {
            return c;
        }
        let cap = call_chain_cap(nfa);
        self.budget.cap = Some(cap);
        cap
    }

    /// Whether the close of `c` costs at most `left` tokens.
    pub fn close_fits(&mut self, nfa: &Nfa, vocab: &TokenVocab, c: ConfigId, left: u32) -> bool {
        left >= self.close_cap(nfa) || self.close_cost(nfa, vocab, c) <= left
    }

    /// Clears in `mask` the tokens after which the close of `c` costs more than `after`
    /// tokens (the tokens left once this one is taken) — except those that lower the cost,
    /// so that a configuration already past the budget still moves towards its end.
    pub fn restrict_to_budget(
        &mut self,
        nfa: &Nfa,
        vocab: &TokenVocab,
        c: ConfigId,
        mask: &mut [u32],
        after: u32,
    ) {
        if c == DEAD || after >= self.close_cap(nfa) {
            return;
        }
        if !self.budget.parts.contains_key(&c) {
            let own = self.close_cost(nfa, vocab, c);
            if own == u32::MAX {
                // No plan to keep within the budget.
                return;
            }
            let parts = self.budget_parts(nfa, vocab, c, own);
            self.budget.parts_bytes += 16 + (parts.cheaper.len() + 2 * parts.dearer.len()) * 4;
            self.budget.parts.insert(c, parts);
        }
        let p = &self.budget.parts[&c];
        if p.worst <= after {
            return;
        }
        let clear = |mask: &mut [u32], t: u32| {
            if let Some(w) = mask.get_mut((t / 32) as usize) {
                *w &= !(1u32 << (t % 32));
            }
        };
        let limit = if p.own == 0 {
            after
        } else {
            after.max(p.own - 1)
        };
        for &(k, t) in p.dearer.iter() {
            if k <= limit {
                break;
            }
            clear(mask, t);
        }
        if limit < p.own {
            // Every token left is needed by the close: only the cheaper tokens remain (the
            // configuration does not accept, so there is no EOS bit to keep).
            let keep = &mut self.budget.keep;
            keep.clear();
            keep.extend(p.cheaper.iter().copied().filter(|&t| {
                mask.get((t / 32) as usize)
                    .is_some_and(|w| w >> (t % 32) & 1 == 1)
            }));
            mask.fill(0);
            for &t in keep.iter() {
                mask[(t / 32) as usize] |= 1u32 << (t % 32);
            }
        }
    }

    /// One walk of the token trie from `c` (whose close costs `own`): every live token's end
    /// configuration and its cost.
    fn budget_parts(&mut self, nfa: &Nfa, vocab: &TokenVocab, c: ConfigId, own: u32) -> Parts {
        let mut worst = 0u32;
        let mut cheaper = Vec::new();
        let mut dearer = Vec::new();
        // Inside a string every plain character leads back to `c`: all-plain tokens cost
        // what `c` does, and only the other tokens' suffixes after their plain prefix are
        // walked (the mask walk's split, `TokenVocab::plain_loop_parts`).
        let trie = if self.plain_successor(nfa, c) == c {
            worst = own;
            vocab.plain_loop_parts().2
        } else {
            vocab.trie()
        };
        let nodes = &trie.nodes;
        let mut stack = std::mem::take(&mut self.budget.walk);
        stack.clear();
        stack.push(c);
        let mut i = 0usize;
        while i < nodes.len() {
            let nd = nodes[i];
            let d = nd.depth as usize;
            stack.truncate(d);
            let here = self.step(nfa, stack[d - 1], nd.byte);
            if here == DEAD {
                i = nd.next as usize;
                continue;
            }
            stack.push(here);
            let ids = trie.own_ids(i);
            if !ids.is_empty() {
                let k = self.close_cost(nfa, vocab, here);
                worst = worst.max(k);
                if k < own {
                    cheaper.extend_from_slice(ids);
                } else if k > own {
                    dearer.extend(ids.iter().map(|&t| (k, t)));
                }
            }
            i += 1;
        }
        self.budget.walk = stack;
        dearer.sort_unstable_by(|a, b| b.cmp(a));
        Parts {
            own,
            worst,
            cheaper: cheaper.into(),
            dearer: dearer.into(),
        }
    }
}

/// What one walk from a configuration learnt (see [`Lazy::budget_parts`]).
#[derive(Debug)]
struct Parts {
    /// The configuration's own cost.
    own: u32,
    /// The largest cost after one of its tokens.
    worst: u32,
    /// Tokens after which the close costs less than `own`.
    cheaper: Box<[u32]>,
    /// Tokens after which it costs more, with that cost, dearest first.
    dearer: Box<[(u32, u32)]>,
}

/// See [`Lazy::close_cap`].
fn call_chain_cap(nfa: &Nfa) -> u32 {
    let nr = nfa.rules.len();
    // Per rule: its largest finite distance and the rules it calls.
    let mut far = vec![0u64; nr];
    let mut callees: Vec<Vec<u32>> = vec![Vec::new(); nr];
    let mut seen = vec![u32::MAX; nfa.states.len()];
    let mut work: Vec<StateId> = Vec::new();
    for (r, rule) in nfa.rules.iter().enumerate() {
        work.clear();
        work.push(rule.start);
        seen[rule.start as usize] = r as u32;
        while let Some(s) = work.pop() {
            let d = nfa.dist[s as usize];
            if d != u32::MAX {
                far[r] = far[r].max(d as u64);
            }
            let st = &nfa.states[s as usize];
            let mut visit = |t: StateId, work: &mut Vec<StateId>| {
                if seen[t as usize] != r as u32 {
                    seen[t as usize] = r as u32;
                    work.push(t);
                }
            };
            for &(_, _, t) in &st.bytes {
                visit(t, &mut work);
            }
            for &t in &st.eps {
                visit(t, &mut work);
            }
            for &(callee, ret) in &st.calls {
                callees[r].push(callee);
                visit(ret, &mut work);
            }
        }
        callees[r].sort_unstable();
        callees[r].dedup();
    }
    // Longest chain from the root, weights `far`; a cycle reachable from it means recursion.
    // Iterative depth-first search: 0 unvisited, 1 on the path, 2 done.
    let mut color = vec![0u8; nr];
    let mut chain = vec![0u64; nr];
    let mut cyclic = false;
    let mut dfs: Vec<(usize, usize)> = vec![(0, 0)];
    color[0] = 1;
    while let Some(top) = dfs.last_mut() {
        let (r, k) = *top;
        if k < callees[r].len() {
            top.1 += 1;
            let t = callees[r][k] as usize;
            match color[t] {
                0 => {
                    color[t] = 1;
                    dfs.push((t, 0));
                }
                1 => cyclic = true,
                _ => {}
            }
        } else {
            let below = callees[r].iter().map(|&t| chain[t as usize]).max();
            chain[r] = far[r] + below.unwrap_or(0);
            color[r] = 2;
            dfs.pop();
        }
    }
    let bound = if cyclic {
        let widest = (0..nr).filter(|&r| color[r] == 2).map(|r| far[r]).max();
        widest.unwrap_or(0) * (MAX_STACK_DEPTH as u64 + 1)
    } else {
        chain[0]
    };
    bound.min(u32::MAX as u64 - 1) as u32
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::{CompileOptions, CompiledGrammar, TokenVocab};

    fn bytes() -> Arc<TokenVocab> {
        let mut toks: Vec<Vec<u8>> = vec![Vec::new()];
        toks.extend((0x20u8..0x7f).map(|b| vec![b]));
        Arc::new(TokenVocab::new(toks, &[], &[0]).unwrap())
    }

    fn cap(g: &CompiledGrammar) -> u32 {
        g.with_lazy(|nfa, lazy| lazy.close_cap(nfa))
    }

    #[test]
    fn the_cap_bounds_the_longest_close_and_grows_with_recursion() {
        let opts = CompileOptions::default();
        let flat = CompiledGrammar::regex("abc|defgh", bytes(), &opts).unwrap();
        assert_eq!(flat.min_output_tokens(), 3);
        // The dearest close is after `d`: `efgh`.
        let mut m = flat.matcher();
        assert!(m.try_advance_bytes(b"d"));
        assert_eq!(m.closing_tokens(), 4);
        assert_eq!(cap(&flat), 4);
        // `x` nests: its close depends on how deep the text is, up to the stack limit.
        let rec = CompiledGrammar::ebnf("root ::= x\nx ::= \"(\" x \")\" | \"a\"", bytes(), &opts)
            .unwrap();
        assert!(cap(&rec) > 200, "{}", cap(&rec));
        let mut m = rec.matcher();
        for _ in 0..40 {
            assert!(m.try_advance_bytes(b"("));
        }
        assert_eq!(m.closing_tokens(), 41, "a, then 40 closing parentheses");
        assert!(m.closing_tokens() as u32 <= cap(&rec));
    }

    #[test]
    fn a_plan_past_the_budget_still_keeps_the_tokens_that_shorten_it() {
        let opts = CompileOptions::default();
        let v = bytes();
        let g = CompiledGrammar::ebnf("root ::= x\nx ::= \"(\" x \")\" | \"a\"", v.clone(), &opts)
            .unwrap();
        let mut m = g.matcher();
        assert!(m.try_advance_bytes(b"(((("));
        let mut mask = vec![0u32; v.mask_words()];
        m.fill_mask(&mut mask).unwrap();
        m.restrict_mask_to_budget(&mut mask, 2);
        let allowed: Vec<u32> = (0..v.len() as u32)
            .filter(|&t| mask[(t / 32) as usize] >> (t % 32) & 1 == 1)
            .collect();
        let a = 1 + (b'a' - 0x20) as u32;
        assert_eq!(allowed, vec![a], "only `a` shortens the close");
    }
}
