//! A build without the KV transfer stack (the Python extension links no QUIC): no value of
//! [`Pd`] can exist, so `--disaggregation-mode prefill|decode` is refused at start-up.

use super::{Bootstrap, DisaggArgs, DisaggMode, PdStats};
use sglrs_scheduler::{RequestId, SchedEvent, SchedulerHandle};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Never constructed in this build.
pub enum Pd {}

impl Pd {
    /// Unified mode starts; a disaggregation role is refused.
    pub fn start(
        args: &DisaggArgs,
        _host: Option<&str>,
        _layout: sglrs_radix_cache::KvLayout,
        _page_io: Option<sglrs_executor::kv::PageIo>,
    ) -> Result<Option<Arc<Pd>>, String> {
        match args.disaggregation_mode {
            DisaggMode::Null => Ok(None),
            _ => Err("this build has no KV transfer (the Python extension): run \
                      `sglrs serve --disaggregation-mode …` instead"
                .into()),
        }
    }
    /// The role.
    pub fn mode(&self) -> DisaggMode {
        match *self {}
    }
    /// The prefill role's transfer port.
    pub fn bootstrap_port(&self) -> u16 {
        match *self {}
    }
    /// Counters.
    pub fn stats(&self) -> &PdStats {
        match *self {}
    }
    /// See the transfer build.
    pub fn set_scheduler(&self, _: SchedulerHandle) {
        match *self {}
    }
    /// See the transfer build.
    pub fn expect(&self, _: RequestId, _: &Bootstrap) {
        match *self {}
    }
    /// See the transfer build.
    pub fn forget(&self, _: RequestId) {
        match *self {}
    }
    /// See the transfer build.
    pub fn take_report(&self, _: RequestId) -> Option<serde_json::Value> {
        match *self {}
    }
    /// See the transfer build.
    pub fn info_json(&self) -> serde_json::Value {
        match *self {}
    }
    /// See the transfer build.
    pub fn track_import(
        self: &Arc<Self>,
        _: RequestId,
        _: mpsc::UnboundedReceiver<SchedEvent>,
    ) -> mpsc::UnboundedReceiver<SchedEvent> {
        match **self {}
    }
    /// See the transfer build.
    pub fn export(
        self: &Arc<Self>,
        _: u64,
        _: mpsc::UnboundedReceiver<SchedEvent>,
    ) -> mpsc::UnboundedReceiver<SchedEvent> {
        match **self {}
    }
}

/// Never constructed in this build: the remote tier needs the KV transfer stack.
pub enum RemoteKv {}

impl RemoteKv {
    /// Without a remote tier configured, nothing; with one, a refusal naming the flag.
    pub fn start(
        hicache: &crate::hicache::HiCacheArgs,
        _disagg: &DisaggArgs,
        _layout: sglrs_radix_cache::KvLayout,
    ) -> Result<Option<Arc<RemoteKv>>, String> {
        if hicache.remote_enabled() {
            return Err(
                "--hicache-storage-backend quic needs the KV transfer stack, which this \
                        build (the Python extension) lacks: run `sglrs serve` instead"
                    .into(),
            );
        }
        Ok(None)
    }
    /// See the transfer build.
    pub fn info_json(&self) -> serde_json::Value {
        match *self {}
    }
    /// See the transfer build.
    pub fn render(&self, _: &mut String) {
        match *self {}
    }
}

impl sglrs_scheduler::hicache::RemoteTier for RemoteKv {
    fn fetch(
        &self,
        _: Vec<sglrs_radix_cache::PageHash>,
        _: Box<dyn FnOnce(Vec<Option<bytes::Bytes>>) + Send>,
    ) {
        match *self {}
    }
    fn write(&self, _: Vec<(sglrs_radix_cache::PageHash, bytes::Bytes)>) {
        match *self {}
    }
}
