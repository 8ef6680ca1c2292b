//! From the scheduler's events to wire events: the namespace filter and the media each page
//! is announced in.

use std::collections::VecDeque;

use sglrs_scheduler::kv_events::{KvEvent, StoreEvent};

use super::WireEvent;

const GPU: u8 = 1;
const CPU: u8 = 2;
const DISK: u8 = 4;

fn medium(bit: u8) -> &'static str {
    match bit {
        GPU => "GPU",
        CPU => "CPU",
        _ => "DISK",
    }
}

/// `BlockStored` of page `h` in each lower medium that holds it.
fn lower_copies(h: u64, k: &Known) -> impl Iterator<Item = WireEvent> + '_ {
    [CPU, DISK]
        .into_iter()
        .filter(move |bit| k.media & bit != 0)
        .map(move |bit| WireEvent::Stored {
            hashes: vec![h],
            parent: k.parent,
            tokens: k.tokens.clone(),
            block_size: k.block_size,
            medium: medium(bit),
        })
}

/// What a page's events need and where it is announced.
#[derive(Debug, Clone)]
struct Known {
    parent: Option<u64>,
    tokens: Vec<u32>,
    block_size: usize,
    media: u8,
}

/// Pages that left every medium are remembered this long (write-back stores a page in the
/// host tier after the device dropped it).
const RECENT: usize = 1 << 16;

/// Lower-tier pages whose tokens are not known yet, remembered at most this many.
const PENDING: usize = 1 << 18;

/// Turns the scheduler's events into wire events. The device's events carry each page's
/// tokens; the lower tiers' name pages by hash only, so a page is announced in the host
/// (`CPU`) or disk (`DISK`) medium once its tokens are known from the device, and never
/// twice in one medium: a lower-tier page whose tokens are unknown (fetched from a remote
/// store, or found on disk from an earlier run) waits in `pending` until the device stores
/// it. Pages of other namespaces than the default are never announced.
#[derive(Default)]
pub struct Announcer {
    known: std::collections::HashMap<u64, Known>,
    recent: std::collections::HashMap<u64, Known>,
    recent_order: VecDeque<u64>,
    pending: std::collections::HashMap<u64, u8>,
    pending_order: VecDeque<u64>,
}

impl Announcer {
    fn forget(&mut self, h: u64) {
        if let Some(k) = self.known.remove(&h) {
            if self.recent.insert(h, k).is_none() {
                self.recent_order.push_back(h);
            }
            while self.recent_order.len() > RECENT {
                if let Some(old) = self.recent_order.pop_front() {
                    self.recent.remove(&old);
                }
            }
        }
    }

    /// Lower-tier pages not announced yet because their tokens are unknown.
    pub fn unannounced(&self) -> usize {
        self.pending.len()
    }

    fn hold(&mut self, h: u64, bit: u8) {
        let e = self.pending.entry(h).or_insert(0);
        if *e == 0 {
            self.pending_order.push_back(h);
        }
        *e |= bit;
        while self.pending_order.len() > PENDING {
            if let Some(old) = self.pending_order.pop_front() {
                self.pending.remove(&old);
            }
        }
    }

    fn lookup(&mut self, h: u64) -> Option<&mut Known> {
        if !self.known.contains_key(&h) {
            let k = self.recent.remove(&h)?;
            self.known.insert(h, k);
        }
        self.known.get_mut(&h)
    }

    /// One step's events as wire events.
    pub fn convert(&mut self, device: Vec<KvEvent>, tiers: Vec<StoreEvent>) -> Vec<WireEvent> {
        let default = sglrs_radix_cache::Namespace::DEFAULT;
        let low = |h: sglrs_radix_cache::PageHash| h.0 as u64;
        let mut out = Vec::new();
        for e in device {
            match e {
                KvEvent::Stored {
                    namespace,
                    parent,
                    hashes,
                    tokens,
                    page_size,
                } if namespace == default && !hashes.is_empty() => {
                    let hashes: Vec<u64> = hashes.into_iter().map(low).collect();
                    let parent = parent.map(low);
                    let mut waited = Vec::new();
                    for (i, &h) in hashes.iter().enumerate() {
                        let p = if i == 0 { parent } else { Some(hashes[i - 1]) };
                        let t = tokens
                            .get(i * page_size..(i + 1) * page_size)
                            .unwrap_or_default()
                            .to_vec();
                        let held = self.pending.remove(&h).unwrap_or(0);
                        match self.lookup(h) {
                            Some(k) => {
                                k.media |= GPU;
                                // Announced in those media when the tokens were first known.
                            }
                            None => {
                                self.known.insert(
                                    h,
                                    Known {
                                        parent: p,
                                        tokens: t,
                                        block_size: page_size,
                                        media: GPU | held,
                                    },
                                );
                                if held != 0 {
                                    waited.push(h);
                                }
                            }
                        }
                    }
                    out.push(WireEvent::Stored {
                        hashes,
                        parent,
                        tokens,
                        block_size: page_size,
                        medium: "GPU",
                    });
                    // Lower-tier copies that waited for these tokens.
                    for h in waited {
                        if let Some(k) = self.known.get(&h) {
                            out.extend(lower_copies(h, k));
                        }
                    }
                }
                KvEvent::Removed { namespace, hashes } if namespace == default => {
                    let hashes: Vec<u64> = hashes.into_iter().map(low).collect();
                    for &h in &hashes {
                        if let Some(k) = self.known.get_mut(&h) {
                            k.media &= !GPU;
                            if k.media == 0 {
                                self.forget(h);
                            }
                        }
                    }
                    if !hashes.is_empty() {
                        out.push(WireEvent::Removed {
                            hashes,
                            medium: "GPU",
                        });
                    }
                }
                KvEvent::AllCleared => {
                    // Subscribers drop everything on AllBlocksCleared: what the lower tiers
                    // still hold is announced again right after.
                    out.push(WireEvent::AllCleared);
                    let mut again: Vec<(u64, Known)> = Vec::new();
                    for (&h, k) in self.known.iter_mut() {
                        k.media &= !GPU;
                        if k.media != 0 {
                            again.push((h, k.clone()));
                        }
                    }
                    let gone: Vec<u64> = self
                        .known
                        .iter()
                        .filter(|(_, k)| k.media == 0)
                        .map(|(&h, _)| h)
                        .collect();
                    for h in gone {
                        self.forget(h);
                    }
                    for (h, k) in again {
                        out.extend(lower_copies(h, &k));
                    }
                }
                _ => {}
            }
        }
        for e in tiers {
            let (stored, tier, hashes) = match e {
                StoreEvent::Stored { tier, hashes } => (true, tier, hashes),
                StoreEvent::Removed { tier, hashes } => (false, tier, hashes),
            };
            let bit = match tier {
                sglrs_radix_cache::store::Source::Ram => CPU,
                sglrs_radix_cache::store::Source::Disk => DISK,
            };
            if stored {
                // Runs of pages that chain on each other make one event.
                let mut run: Option<WireEvent> = None;
                for h in hashes.into_iter().map(low) {
                    let Some(k) = self.lookup(h) else {
                        self.hold(h, bit);
                        continue;
                    };
                    if k.media & bit != 0 {
                        continue;
                    }
                    k.media |= bit;
                    let k = k.clone();
                    match &mut run {
                        Some(WireEvent::Stored { hashes, tokens, .. })
                            if hashes.last().copied() == k.parent =>
                        {
                            hashes.push(h);
                            tokens.extend_from_slice(&k.tokens);
                        }
                        _ => {
                            out.extend(run.take());
                            run = Some(WireEvent::Stored {
                                hashes: vec![h],
                                parent: k.parent,
                                tokens: k.tokens,
                                block_size: k.block_size,
                                medium: medium(bit),
                            });
                        }
                    }
                }
                out.extend(run);
            } else {
                let mut gone = Vec::new();
                for h in hashes.into_iter().map(low) {
                    if let Some(held) = self.pending.get_mut(&h) {
                        *held &= !bit;
                        if *held == 0 {
                            self.pending.remove(&h);
                        }
                    }
                    if let Some(k) = self.known.get_mut(&h) {
                        if k.media & bit != 0 {
                            k.media &= !bit;
                            gone.push(h);
                            if k.media == 0 {
                                self.forget(h);
                            }
                        }
                    }
                }
                if !gone.is_empty() {
                    out.push(WireEvent::Removed {
                        hashes: gone,
                        medium: medium(bit),
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_default_namespace_is_announced() {
        use sglrs_radix_cache::{Namespace, PageHash};
        let stored = |ns: u64| KvEvent::Stored {
            namespace: Namespace(ns),
            parent: Some(PageHash(1 << 64 | 5)),
            hashes: vec![PageHash(3 << 64 | 9)],
            tokens: vec![1, 2],
            page_size: 2,
        };
        let w = Announcer::default()
            .convert(vec![stored(0), stored(42), KvEvent::AllCleared], Vec::new());
        assert_eq!(
            w,
            vec![
                WireEvent::Stored {
                    hashes: vec![9],
                    parent: Some(5),
                    tokens: vec![1, 2],
                    block_size: 2,
                    medium: "GPU",
                },
                WireEvent::AllCleared
            ]
        );
    }

    #[test]
    fn lower_tier_pages_are_announced_once_per_medium_with_the_devices_tokens() {
        use sglrs_radix_cache::store::Source;
        use sglrs_radix_cache::{Namespace, PageHash};
        let h = |i: u64| PageHash(u128::from(i));
        let mut a = Announcer::default();
        let w = a.convert(
            vec![KvEvent::Stored {
                namespace: Namespace::DEFAULT,
                parent: None,
                hashes: vec![h(1), h(2)],
                tokens: vec![10, 11, 20, 21],
                page_size: 2,
            }],
            vec![StoreEvent::Stored {
                tier: Source::Ram,
                hashes: vec![h(1), h(2), h(9)],
            }],
        );
        assert_eq!(
            w[1],
            WireEvent::Stored {
                hashes: vec![1, 2],
                parent: None,
                tokens: vec![10, 11, 20, 21],
                block_size: 2,
                medium: "CPU",
            },
            "{w:?}"
        );
        assert_eq!(a.unannounced(), 1, "page 9's tokens are unknown");
        // Dropped from the device, the pages stay known in the host tier; a second store
        // in the same medium is not announced again.
        let w = a.convert(
            vec![KvEvent::Removed {
                namespace: Namespace::DEFAULT,
                hashes: vec![h(1), h(2)],
            }],
            vec![
                StoreEvent::Stored {
                    tier: Source::Ram,
                    hashes: vec![h(2)],
                },
                StoreEvent::Removed {
                    tier: Source::Ram,
                    hashes: vec![h(1)],
                },
                StoreEvent::Stored {
                    tier: Source::Disk,
                    hashes: vec![h(1)],
                },
            ],
        );
        assert_eq!(w.len(), 3, "{w:?}");
        assert_eq!(
            w[1],
            WireEvent::Removed {
                hashes: vec![1],
                medium: "CPU"
            }
        );
        assert!(
            matches!(&w[2], WireEvent::Stored { hashes, parent: None, medium: "DISK", .. } if hashes == &vec![1])
        );
        // A flush clears the device; what the lower tiers hold is announced again.
        let w = a.convert(vec![KvEvent::AllCleared], Vec::new());
        assert_eq!(w[0], WireEvent::AllCleared);
        let mut again: Vec<(u64, &str)> = w[1..]
            .iter()
            .map(|e| match e {
                WireEvent::Stored { hashes, medium, .. } => (hashes[0], *medium),
                other => panic!("{other:?}"),
            })
            .collect();
        again.sort();
        assert_eq!(again, vec![(1, "DISK"), (2, "CPU")]);
        // Page 9 (in the host tier, tokens unknown) is announced there once the device
        // stores it with its tokens.
        let w = a.convert(
            vec![KvEvent::Stored {
                namespace: Namespace::DEFAULT,
                parent: Some(h(2)),
                hashes: vec![h(9)],
                tokens: vec![90, 91],
                page_size: 2,
            }],
            Vec::new(),
        );
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            matches!(&w[1], WireEvent::Stored { hashes, parent: Some(2), medium: "CPU", tokens, .. } if hashes == &vec![9] && tokens == &vec![90, 91])
        );
        assert_eq!(a.unannounced(), 0);
    }
}
