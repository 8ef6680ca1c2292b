//! Waiting-queue ordering: `fcfs`, `lpm` (longest prefix match) and `dfs-weight`.

use std::collections::HashMap;

/// How the waiting queue is ordered (after priority, which always comes first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SchedulePolicy {
    /// First come, first served.
    Fcfs,
    /// Longest cached prefix first (SGLang's default): maximises cache hits.
    #[default]
    Lpm,
    /// SGLang's DFS-weight: requests grouped by the cache node their prefix ends at, heavier
    /// groups (more waiting requests under the same prefix) first, so a shared prefix is
    /// computed once and its group runs together before it can be evicted.
    DfsWeight,
}

impl std::str::FromStr for SchedulePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(Self::Fcfs),
            "lpm" => Ok(Self::Lpm),
            "dfs-weight" => Ok(Self::DfsWeight),
            other => Err(format!(
                "unknown schedule policy {other:?} (fcfs, lpm, dfs-weight)"
            )),
        }
    }
}

impl std::fmt::Display for SchedulePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Fcfs => "fcfs",
            Self::Lpm => "lpm",
            Self::DfsWeight => "dfs-weight",
        })
    }
}

/// What the policy knows about one waiting sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitingInfo {
    /// Position in the queue (arrival order; retracted sequences come first).
    pub order: u64,
    /// Priority (larger first).
    pub priority: i64,
    /// Tokens of its prefix found in the cache.
    pub prefix_len: usize,
    /// Key of the cache node (or prefix group) the match ends at.
    pub group: u64,
}

/// Returns the indices of `items` in the order they should be admitted.
pub fn order(policy: SchedulePolicy, items: &[WaitingInfo]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..items.len()).collect();
    match policy {
        SchedulePolicy::Fcfs => {
            idx.sort_by_key(|&i| (std::cmp::Reverse(items[i].priority), items[i].order));
        }
        SchedulePolicy::Lpm => {
            idx.sort_by_key(|&i| {
                (
                    std::cmp::Reverse(items[i].priority),
                    std::cmp::Reverse(items[i].prefix_len),
                    items[i].order,
                )
            });
        }
        SchedulePolicy::DfsWeight => {
            let mut weight: HashMap<u64, usize> = HashMap::new();
            let mut first: HashMap<u64, u64> = HashMap::new();
            for it in items {
                *weight.entry(it.group).or_default() += 1;
                let f = first.entry(it.group).or_insert(it.order);
                *f = (*f).min(it.order);
            }
            idx.sort_by_key(|&i| {
                let g = items[i].group;
                (
                    std::cmp::Reverse(items[i].priority),
                    std::cmp::Reverse(weight[&g]),
                    first[&g],
                    items[i].order,
                )
            });
        }
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(order: u64, priority: i64, prefix_len: usize, group: u64) -> WaitingInfo {
        WaitingInfo {
            order,
            priority,
            prefix_len,
            group,
        }
    }

    #[test]
    fn policies_order_as_documented() {
        let items = [w(0, 0, 0, 1), w(1, 0, 64, 2), w(2, 0, 32, 2), w(3, 5, 0, 3)];
        assert_eq!(order(SchedulePolicy::Fcfs, &items), vec![3, 0, 1, 2]);
        assert_eq!(order(SchedulePolicy::Lpm, &items), vec![3, 1, 2, 0]);
        assert_eq!(order(SchedulePolicy::DfsWeight, &items), vec![3, 1, 2, 0]);
        assert_eq!(
            "dfs-weight".parse::<SchedulePolicy>(),
            Ok(SchedulePolicy::DfsWeight)
        );
        assert!("nope".parse::<SchedulePolicy>().is_err());
    }
}
