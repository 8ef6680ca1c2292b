//! The bounded waiting queue as the handle sees it, and the interrupt a submit raises to
//! stop the pass in flight.

use super::SchedError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The bounded waiting queue as the handle sees it: requests submitted and not yet admitted.
/// A submit reserves its places here before its message is sent (so a burst of submits
/// cannot overshoot while the thread is busy in a forward pass); the thread gives them back
/// when the request is admitted or ends without having been admitted. Besides the total,
/// each tenant (not 0) holds at most `per_tenant` places, counted in a map behind a mutex
/// held only to check and bump one tenant's count. The thread also publishes, per tenant,
/// the lowest priority among its waiting requests: a submit that finds no place but has a
/// higher priority than that is sent on to take one ([`super::Command::Displace`]).
#[derive(Debug)]
pub(super) struct Queue {
    pub(super) queued: AtomicUsize,
    pub(super) limit: usize,
    pub(super) per_tenant: usize,
    pub(super) tenants: Mutex<HashMap<u64, usize>>,
    pub(super) lowest: Mutex<HashMap<u64, i64>>,
}

impl Queue {
    pub(super) fn new(limit: usize, per_tenant: usize) -> Self {
        Self {
            queued: AtomicUsize::new(0),
            limit,
            per_tenant,
            tenants: Mutex::new(HashMap::new()),
            lowest: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a request of `tenant` at `priority` may take a waiting request's place.
    pub(super) fn may_displace(&self, tenant: u64, priority: i64) -> bool {
        let lowest = self.lowest.lock().unwrap_or_else(|p| p.into_inner());
        lowest.get(&tenant).is_some_and(|&p| p < priority)
    }

    /// Takes a place for a request of `tenant` whatever the bounds (a place handed over
    /// from a displaced request, given back right after).
    pub(super) fn take(&self, tenant: u64) {
        self.queued.fetch_add(1, Ordering::AcqRel);
        if tenant != 0 {
            *self.tenants().entry(tenant).or_default() += 1;
        }
    }

    pub(super) fn tenants(&self) -> std::sync::MutexGuard<'_, HashMap<u64, usize>> {
        // The map is consistent after every statement: a panic elsewhere cannot break it.
        self.tenants.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a place for each of `tenants` (one entry per request), or none when the queue
    /// or one of those tenants' shares has too few free.
    pub(super) fn reserve(&self, tenants: &[u64]) -> Result<(), SchedError> {
        let k = tenants.len();
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + k <= self.limit).then_some(q + k)
            })
            .map_err(|_| SchedError::Overloaded { limit: self.limit })?;
        if tenants.iter().all(|&t| t == 0) {
            return Ok(());
        }
        let mut want: HashMap<u64, usize> = HashMap::new();
        for &t in tenants.iter().filter(|&&t| t != 0) {
            *want.entry(t).or_default() += 1;
        }
        let mut held = self.tenants();
        if want
            .iter()
            .any(|(t, n)| held.get(t).copied().unwrap_or(0) + n > self.per_tenant)
        {
            drop(held);
            self.queued.fetch_sub(k, Ordering::AcqRel);
            return Err(SchedError::TenantOverloaded {
                limit: self.per_tenant,
            });
        }
        for (t, n) in want {
            *held.entry(t).or_default() += n;
        }
        Ok(())
    }

    /// Gives back the places of requests of `tenants` (one entry per request).
    pub(super) fn release(&self, tenants: &[u64]) {
        self.queued.fetch_sub(tenants.len(), Ordering::AcqRel);
        if tenants.iter().all(|&t| t == 0) {
            return;
        }
        let mut held = self.tenants();
        for &t in tenants.iter().filter(|&&t| t != 0) {
            if let Some(n) = held.get_mut(&t) {
                *n -= 1;
                if *n == 0 {
                    held.remove(&t);
                }
            }
        }
    }
}

/// Lets a submit stop the pass in flight when it must not wait for it (priority
/// preemption, `core/preempt.rs`): the executor checks `flag` between layers.
#[derive(Debug, Default)]
pub(super) struct Interrupt {
    pub(super) flag: Arc<AtomicBool>,
    /// Per tenant, the priority above which a newcomer stops the pass in flight; empty
    /// between passes and during a pass that may not be interrupted.
    pub(super) bars: Mutex<HashMap<u64, i64>>,
}

impl Interrupt {
    pub(super) fn bars(&self) -> std::sync::MutexGuard<'_, HashMap<u64, i64>> {
        self.bars.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request of `tenant` at `priority` was just sent to the thread.
    pub(super) fn arrived(&self, tenant: u64, priority: i64) {
        if self.bars().get(&tenant).is_some_and(|&bar| priority > bar) {
            self.flag.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_tenant_cannot_take_every_place_in_the_queue() {
        let q = Queue::new(4, 2);
        q.reserve(&[1]).unwrap();
        q.reserve(&[1]).unwrap();
        assert_eq!(
            q.reserve(&[1]),
            Err(SchedError::TenantOverloaded { limit: 2 })
        );
        // The refusal took nothing: tenant 2 still finds both free places.
        assert_eq!(q.queued.load(Ordering::Acquire), 2);
        q.reserve(&[2, 2]).unwrap();
        assert_eq!(q.reserve(&[3]), Err(SchedError::Overloaded { limit: 4 }));
        // A group over its tenant's share is refused whole.
        q.release(&[2, 2, 1]);
        assert_eq!(
            q.reserve(&[3, 3, 3]),
            Err(SchedError::TenantOverloaded { limit: 2 })
        );
        assert_eq!(q.queued.load(Ordering::Acquire), 1);
        // Released places are reusable; tenant 0 (no tenant) has only the total bound.
        q.reserve(&[1]).unwrap();
        q.reserve(&[0, 0]).unwrap();
        assert_eq!(q.queued.load(Ordering::Acquire), 4);
        q.release(&[1, 1, 0, 0]);
        assert_eq!(q.queued.load(Ordering::Acquire), 0);
        assert!(q.tenants().is_empty());
    }
}
