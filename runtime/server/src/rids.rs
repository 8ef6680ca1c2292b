//! Client-chosen request ids (`rid`) of requests in flight, for `/abort_request`.
//!
//! A rid belongs to the one live request that claimed it: a second request naming a rid in
//! use is refused (400), so no client can take over, or be mistaken for, another's request
//! by reusing its rid. A [`RidClaim`] removes its entries when it is dropped — when the
//! request finishes, is aborted, fails, or its handler is dropped with the connection — so
//! the table holds exactly the rids of requests in flight.
//!
//! Rids belong to tenants ([`crate::auth::Tenant`], from `--api-keys-file`): the table is
//! keyed by (tenant, rid), so two tenants may use the same rid, and `/abort_request` (one
//! rid or `abort_all`) reaches only its caller's own requests. Without a keys file every
//! caller is the one tenant `default`, and the rid names what it may abort.

use crate::error::ApiError;
use sglrs_scheduler::{RequestId, SchedulerHandle};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// One claimed rid.
#[derive(Debug)]
struct Entry {
    /// The claim that owns it (entries are removed only by their own claim).
    claim: u64,
    /// The scheduler id, once submitted.
    id: Option<RequestId>,
    /// `/abort_request` named it before it was submitted: abort it as soon as it is.
    abort_requested: bool,
}

#[derive(Debug, Default)]
struct Inner {
    /// Keyed by (tenant id, rid).
    entries: HashMap<(u64, String), Entry>,
    next_claim: u64,
}

/// The rids of requests in flight.
#[derive(Debug, Default)]
pub struct RidTable {
    inner: Mutex<Inner>,
}

impl RidTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The table stays consistent under a panic (each change is one insert or remove).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims every given rid for one request (or one batch): all of them, or none when any
    /// is in use or named twice.
    pub fn claim(
        self: &Arc<Self>,
        tenant: u64,
        rids: &[Option<String>],
    ) -> Result<RidClaim, ApiError> {
        let mut t = self.lock();
        let named: Vec<&String> = rids.iter().flatten().collect();
        for (i, rid) in named.iter().enumerate() {
            if t.entries.contains_key(&(tenant, (*rid).clone())) || named[..i].contains(rid) {
                return Err(ApiError::BadRequest {
                    message: format!("rid already in use: {rid:?}"),
                    param: Some("rid".into()),
                });
            }
        }
        let claim = t.next_claim;
        t.next_claim += 1;
        for rid in &named {
            t.entries.insert(
                (tenant, (*rid).clone()),
                Entry {
                    claim,
                    id: None,
                    abort_requested: false,
                },
            );
        }
        Ok(RidClaim {
            table: self.clone(),
            claim,
            tenant,
            rids: rids.to_vec(),
        })
    }

    /// Rids in flight.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// True when no rid is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Aborts `tenant`'s request holding `rid` (or every request of `tenant` with a rid
    /// when `None`); how many requests that named. A request not submitted yet is aborted
    /// when it is. Other tenants' requests are never touched.
    pub fn abort(
        &self,
        sched: &SchedulerHandle,
        tenant: u64,
        rid: Option<&str>,
    ) -> Result<usize, ApiError> {
        let mut t = self.lock();
        let mut n = 0;
        for (_, e) in t
            .entries
            .iter_mut()
            .filter(|((owner, k), _)| *owner == tenant && rid.is_none_or(|r| r == k.as_str()))
        {
            match e.id {
                Some(id) => sched.abort(id)?,
                None => e.abort_requested = true,
            }
            n += 1;
        }
        Ok(n)
    }
}

/// The rids one request (or batch) claimed; released on drop.
#[derive(Debug)]
pub struct RidClaim {
    table: Arc<RidTable>,
    claim: u64,
    tenant: u64,
    /// Per batch item, its rid if it named one.
    rids: Vec<Option<String>>,
}

impl RidClaim {
    /// Records the scheduler ids (in batch order); aborts those `/abort_request` named
    /// while they were being submitted.
    pub fn bind(&self, sched: &SchedulerHandle, ids: &[RequestId]) -> Result<(), ApiError> {
        let mut t = self.table.lock();
        for (rid, &id) in self.rids.iter().zip(ids) {
            let Some(e) = rid
                .as_ref()
                .and_then(|r| t.entries.get_mut(&(self.tenant, r.clone())))
            else {
                continue;
            };
            if e.claim != self.claim {
                continue;
            }
            e.id = Some(id);
            if e.abort_requested {
                sched.abort(id)?;
            }
        }
        Ok(())
    }

    /// The rid of batch item `i`, if it named one.
    pub fn rid(&self, i: usize) -> Option<&str> {
        self.rids.get(i).and_then(|r| r.as_deref())
    }
}

impl Drop for RidClaim {
    fn drop(&mut self) {
        let mut t = self.table.lock();
        for rid in self.rids.iter().flatten() {
            let key = (self.tenant, rid.clone());
            if t.entries.get(&key).is_some_and(|e| e.claim == self.claim) {
                t.entries.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(rids: &[&str]) -> Vec<Option<String>> {
        rids.iter().map(|r| Some(r.to_string())).collect()
    }

    #[test]
    fn a_rid_is_held_by_one_claim_until_it_is_dropped() {
        let t = Arc::new(RidTable::default());
        let a = t.claim(1, &some(&["a", "b"])).unwrap();
        assert_eq!(t.len(), 2);
        let e = t.claim(1, &some(&["c", "b"])).unwrap_err();
        assert!(e.to_string().contains("rid already in use"), "{e}");
        assert_eq!(t.len(), 2, "a refused claim takes nothing");
        assert!(t.claim(1, &some(&["x", "x"])).is_err());
        assert!(
            t.claim(1, &[None, None]).is_ok(),
            "requests without rid never clash"
        );
        // Another tenant's "b" is its own.
        let other = t.claim(2, &some(&["b"])).unwrap();
        assert_eq!(t.len(), 3);
        drop(a);
        assert_eq!(t.len(), 1);
        drop(other);
        assert!(t.is_empty());
        let _b = t.claim(1, &some(&["b"])).unwrap();
        assert_eq!(t.len(), 1);
    }
}
