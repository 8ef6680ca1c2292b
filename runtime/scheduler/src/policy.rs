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

/// Reorders `order` (indices into `tenants`, in policy order) so that tenants take turns:
/// each next pick is the head of the tenant with the fewest sequences running, counting
/// `running` (sequences running per tenant now) plus the picks before it; ties go to the
/// tenant whose head comes first in `order`. Within a tenant `order` is kept. With one
/// tenant this is `order` itself.
pub fn interleave_tenants(
    order: Vec<usize>,
    tenants: &[u64],
    mut running: HashMap<u64, usize>,
) -> Vec<usize> {
    use std::collections::VecDeque;
    // Tenants in the order of their first candidate; each with its queue in policy order.
    let mut queues: Vec<(u64, VecDeque<usize>)> = Vec::new();
    for &i in &order {
        let t = tenants[i];
        match queues.iter_mut().find(|(q, _)| *q == t) {
            Some((_, q)) => q.push_back(i),
            None => queues.push((t, VecDeque::from([i]))),
        }
    }
    if queues.len() <= 1 {
        return order;
    }
    // Position of each index in `order`, for ties between the tenants' heads.
    let mut rank = vec![0usize; tenants.len()];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r;
    }
    let mut out = Vec::with_capacity(order.len());
    while let Some((t, q)) = queues
        .iter_mut()
        .filter(|(_, q)| !q.is_empty())
        .min_by_key(|(t, q)| (running.get(t).copied().unwrap_or(0), rank[q[0]]))
    {
        out.extend(q.pop_front());
        *running.entry(*t).or_default() += 1;
    }
    out
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

    #[test]
    fn tenants_take_turns_starting_with_the_fewest_running() {
        // Tenant 1 holds the first four places, tenant 2 the last two.
        let tenants = [1, 1, 1, 1, 2, 2];
        let order: Vec<usize> = (0..6).collect();
        let none = HashMap::new();
        assert_eq!(
            interleave_tenants(order.clone(), &tenants, none),
            vec![0, 4, 1, 5, 2, 3]
        );
        // Tenant 1 already runs two: tenant 2 goes first until it has as many.
        let running = HashMap::from([(1, 2)]);
        assert_eq!(
            interleave_tenants(order.clone(), &tenants, running),
            vec![4, 5, 0, 1, 2, 3]
        );
        // One tenant: the policy's order untouched.
        assert_eq!(
            interleave_tenants(vec![2, 0, 1], &[7, 7, 7], HashMap::new()),
            vec![2, 0, 1]
        );
    }
}
