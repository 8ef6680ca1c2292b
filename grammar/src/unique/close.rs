//! The planned close where the tracker refuses what the automaton allows: the next byte
//! of the shortest close that keeps every item new ([`closing_step`]), and the search for a
//! text that ends an item as a value no earlier item has ([`closing_detour`], also what
//! `searched.rs` asks of an array whose items may run out of new values).

use super::{advance, allows, can_end_new_within, JsonTracker, LIVE_BUDGET};
use crate::lazy::{ConfigId, Lazy, DEAD};
use crate::nfa::Nfa;

/// The next byte of the shortest close from `c` when a repeat is pending: the allowed byte
/// with the fewest bytes left after it that keeps the text able to end as a new item.
/// `None` when nothing here can repeat (the automaton's shortest step is then safe).
pub(crate) fn closing_step(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tracker: &mut JsonTracker,
) -> Option<u8> {
    if tracker.pending_rests().is_empty()
        || !lazy.configs[c as usize]
            .threads
            .iter()
            .any(|&(_, s)| nfa.in_unique(s))
    {
        return None;
    }
    let set = lazy.next_bytes(nfa, c);
    let mut options: Vec<(u32, u8)> = Vec::new();
    for b in crate::lazy::set_bytes(set) {
        let n = lazy.step(nfa, c, b);
        if n != DEAD {
            options.push((lazy.configs[n as usize].min_bytes, b));
        }
    }
    options.sort_unstable();
    options
        .into_iter()
        .map(|(_, b)| b)
        .find(|&b| allows(nfa, lazy, c, tracker, &[b]))
}

/// Most steps [`closing_detour`] takes before it gives up.
const DETOUR_BUDGET: u32 = 20_000;
/// Most bytes [`closing_detour`] adds to the shortest close.
const DETOUR_SLACK: u32 = 64;

/// Where the shortest close would end an item equal to an earlier one
/// (`Nfa::unique_after`): the shortest text that closes the open item as a new value
/// instead (an iterative deepening search over the bytes the automaton takes — each byte,
/// whitespace outside strings once — in order of the bytes left after it). `None` when
/// none is found within [`DETOUR_SLACK`] extra bytes and [`DETOUR_BUDGET`] steps.
pub(crate) fn closing_detour(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tracker: &mut JsonTracker,
) -> Option<Vec<u8>> {
    // The item closes when the text is back at its array: a string item's array is the
    // top frame, a container item's the one below it.
    // (At the top frame when it is an array: a string, number or literal item; in an
    // array whose items are searched, the item may be open deeper.)
    let top = tracker.frames.last()?;
    let depth = if top.array {
        tracker.frames.len()
    } else if let Some(&fi) = tracker.searched_frames().last() {
        fi + 1
    } else {
        tracker.frames.len() - 1
    };
    new_value_text(nfa, lazy, c, tracker, depth, DETOUR_BUDGET)
}

/// The shortest text (within [`DETOUR_SLACK`] bytes past the fewest left, found by
/// iterative deepening over [`detour_within`] in at most `budget` steps) that ends an item
/// of the array at `depth` frames as a value no earlier item has.
pub(super) fn new_value_text(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tracker: &mut JsonTracker,
    depth: usize,
    mut budget: u32,
) -> Option<Vec<u8>> {
    let m = lazy.configs[c as usize].min_bytes;
    let mut path = Vec::new();
    for limit in m..=m.saturating_add(DETOUR_SLACK) {
        if detour_within(nfa, lazy, c, tracker, depth, limit, &mut path, &mut budget) {
            return Some(path);
        }
        if budget == 0 {
            break;
        }
    }
    None
}

/// Depth-first part of [`closing_detour`]: a path from `c` of at most `limit` bytes in all
/// (bytes so far plus the fewest bytes left) that closes an item of the array at `depth`
/// frames.
#[allow(clippy::too_many_arguments)]
fn detour_within(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tracker: &mut JsonTracker,
    depth: usize,
    limit: u32,
    path: &mut Vec<u8>,
    budget: &mut u32,
) -> bool {
    let set = lazy.next_bytes(nfa, c);
    let mut options: Vec<(u32, u8)> = Vec::new();
    // Bytes that lead to the same configuration still write different values (`1e0`
    // repeats `1`, `1e1` does not), so each is tried; only whitespace outside strings is
    // one option (it is no part of any value).
    let mut ws_seen: Vec<ConfigId> = Vec::new();
    for b in crate::lazy::set_bytes(set) {
        let n = lazy.step(nfa, c, b);
        if n == DEAD {
            continue;
        }
        if !tracker.in_str && b.is_ascii_whitespace() {
            if ws_seen.contains(&n) {
                continue;
            }
            ws_seen.push(n);
        }
        let left = lazy.configs[n as usize].min_bytes;
        if left != u32::MAX && path.len() as u32 + 1 + left <= limit {
            options.push((left, b));
        }
    }
    options.sort_unstable();
    for (_, b) in options {
        if *budget == 0 {
            return false;
        }
        *budget -= 1;
        let cp = tracker.checkpoint();
        // The path found is its own proof that the searched items along it end as new
        // values: only the bounded arrays' check is needed at each step.
        let mut n = advance(nfa, lazy, c, tracker, &[b]);
        let mut inner = LIVE_BUDGET;
        if n != DEAD && !can_end_new_within(nfa, lazy, n, tracker, &mut inner) {
            n = DEAD;
        }
        let mut found = false;
        if n != DEAD {
            path.push(b);
            found = (tracker.item_done == Some(depth) && !tracker.closed_repeat())
                || detour_within(nfa, lazy, n, tracker, depth, limit, path, budget);
            if !found {
                path.pop();
            }
        }
        tracker.restore(cp);
        if found {
            return true;
        }
    }
    false
}
