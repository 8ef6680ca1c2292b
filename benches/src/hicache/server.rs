//! The `sglrs serve` children of the bench: starting one on a free port and waiting for
//! `GET /health`, streaming `POST /generate`, reading `GET /get_server_info`, and stopping
//! it with SIGTERM.

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bounds on a server's start, stop and on one request.
const START_TIMEOUT: Duration = Duration::from_secs(120);
const STOP_TIMEOUT: Duration = Duration::from_secs(120);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// Cached prompt tokens by the tier they came from (`meta_info.cached_tokens_details`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cached {
    pub(crate) device: u64,
    pub(crate) host: u64,
    pub(crate) disk: u64,
    pub(crate) remote: u64,
}

impl Cached {
    pub(super) fn from_json(v: &Value) -> Option<Cached> {
        let o = v.as_object()?;
        let f = |k: &str| o.get(k).and_then(Value::as_u64).unwrap_or(0);
        Some(Cached {
            device: f("device"),
            host: f("host"),
            disk: f("disk"),
            remote: f("remote"),
        })
    }

    pub(super) fn add(&mut self, o: Cached) {
        self.device += o.device;
        self.host += o.host;
        self.disk += o.disk;
        self.remote += o.remote;
    }

    pub(super) fn to_json(self) -> Value {
        json!({"device": self.device, "host": self.host, "disk": self.disk, "remote": self.remote})
    }
}

/// One streamed `/generate` reply.
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    pub(crate) text: String,
    pub(crate) ttft: f64,
    pub(crate) prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
    pub(crate) cached_tokens: u64,
    /// `None` when the final event has no `cached_tokens_details`.
    pub(crate) details: Option<Cached>,
}

/// How every server starts: the binary, the model and the kernel threads.
#[derive(Clone, Debug)]
pub(crate) struct ServeCommand {
    /// The `sglrs` binary (`None`: this one).
    pub(crate) bin: Option<PathBuf>,
    /// `--model` of serve.
    pub(crate) model: PathBuf,
    /// `--threads` of serve (`None`: the server's default).
    pub(crate) threads: Option<usize>,
}

/// A `sglrs serve` child on 127.0.0.1; killed on drop if still running.
pub(crate) struct Server {
    child: Child,
    pub(crate) base: String,
    log: PathBuf,
    agent: ureq::Agent,
}

impl Server {
    /// Starts `serve` of `how` with `flags`, its output to `log`, and waits until `/health`
    /// answers 200.
    pub(crate) fn start(
        how: &ServeCommand,
        flags: &[String],
        log: PathBuf,
    ) -> anyhow::Result<Server> {
        let bin = match &how.bin {
            Some(b) => b.clone(),
            None => std::env::current_exe().context("locating the sglrs binary")?,
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port")?
            .port();
        let mut cmd = Command::new(&bin);
        cmd.arg("serve").arg("--model").arg(&how.model).args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ]);
        if let Some(t) = how.threads {
            cmd.args(["--threads", &t.to_string()]);
        }
        cmd.args(flags);
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        println!("  serve {}", flags.join(" "));
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let agent = ureq::AgentBuilder::new().timeout(REQUEST_TIMEOUT).build();
        let mut s = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
            agent,
        };
        s.wait_healthy()?;
        Ok(s)
    }

    fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let t0 = Instant::now();
        while t0.elapsed() < START_TIMEOUT {
            if let Some(st) = self.child.try_wait()? {
                bail!("the server exited while starting ({st}){}", self.log_tail());
            }
            let r = self
                .agent
                .get(&format!("{}/health", self.base))
                .timeout(Duration::from_secs(2))
                .call();
            if matches!(r, Ok(ref resp) if resp.status() == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "the server did not answer /health with 200 within {} s{}",
            START_TIMEOUT.as_secs(),
            self.log_tail()
        )
    }

    /// The last lines of the server's output, for an error message.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("\n--- {} (last lines) ---\n{tail}", self.log.display())
    }

    /// Why a request may have failed: the server's state and its last output.
    pub(crate) fn failure_context(&mut self) -> String {
        match self.child.try_wait() {
            Ok(Some(st)) => format!("the server exited ({st}){}", self.log_tail()),
            _ => format!("the server is still running{}", self.log_tail()),
        }
    }

    /// `GET /get_server_info`, if it answers with JSON.
    pub(crate) fn info(&self) -> Option<Value> {
        self.agent
            .get(&format!("{}/get_server_info", self.base))
            .call()
            .ok()?
            .into_json()
            .ok()
    }

    /// `num_pages × page_size` from `/get_server_info`, if it reports both.
    pub(super) fn pool_tokens(&self) -> Option<u64> {
        let v = self.info()?;
        Some(v["num_pages"].as_u64()? * v["page_size"].as_u64()?)
    }

    /// Streams `POST /generate` of `text` for `max_new_tokens` tokens at temperature 0.
    pub(crate) fn generate(&self, text: &str, max_new_tokens: usize) -> anyhow::Result<Reply> {
        generate_at(&self.agent, &self.base, text, max_new_tokens)
    }

    /// SIGTERM, then waits (SIGKILL after [`STOP_TIMEOUT`]). Whether the exit was a clean
    /// shutdown (status 0), the only kind that flushes the disk tier; warns when not.
    pub(crate) fn stop(mut self) -> anyhow::Result<bool> {
        let pid = libc::pid_t::try_from(self.child.id()).context("server pid")?;
        // SAFETY: `pid` is our own child, not yet reaped (it is reaped below), so the id
        // names that process; kill(2) takes no pointers.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < STOP_TIMEOUT {
            if let Some(st) = self.child.try_wait()? {
                if st.signal() == Some(libc::SIGTERM) {
                    println!("  warning: the server died of SIGTERM without a clean shutdown (its disk tier may not be flushed)");
                } else if !st.success() {
                    println!("  warning: the server exited with {st}{}", self.log_tail());
                }
                return Ok(st.success());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        println!(
            "  warning: the server did not exit within {} s of SIGTERM; killed",
            STOP_TIMEOUT.as_secs()
        );
        self.child.kill()?;
        self.child.wait()?;
        Ok(false)
    }
}

/// Streams `POST /generate` of `text` to `base` (a server or a router) for
/// `max_new_tokens` tokens at temperature 0.
pub(crate) fn generate_at(
    agent: &ureq::Agent,
    base: &str,
    text: &str,
    max_new_tokens: usize,
) -> anyhow::Result<Reply> {
    let body = json!({
        "text": text,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
        "stream": true,
    });
    let t0 = Instant::now();
    let resp = match agent.post(&format!("{base}/generate")).send_json(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(code, r)) => {
            bail!(
                "POST /generate: HTTP {code}: {}",
                r.into_string().unwrap_or_default()
            )
        }
        Err(e) => return Err(anyhow!(e).context("POST /generate")),
    };
    let mut ttft = None;
    let mut first_event = None;
    let mut last: Option<Value> = None;
    for v in crate::common::sse_events(resp) {
        let v = v?;
        let now = t0.elapsed().as_secs_f64();
        first_event.get_or_insert(now);
        if v["text"].as_str().is_some_and(|t| !t.is_empty()) {
            ttft.get_or_insert(now);
        }
        last = Some(v);
    }
    let last = last.ok_or_else(|| anyhow!("POST /generate: no event before [DONE]"))?;
    let meta = &last["meta_info"];
    let n = |k: &str| meta[k].as_u64().unwrap_or(0);
    Ok(Reply {
        text: last["text"].as_str().unwrap_or("").to_string(),
        ttft: ttft.or(first_event).unwrap_or_default(),
        prompt_tokens: n("prompt_tokens"),
        completion_tokens: n("completion_tokens"),
        cached_tokens: n("cached_tokens"),
        details: Cached::from_json(&meta["cached_tokens_details"]),
    })
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_details_from_json() {
        assert_eq!(
            Cached::from_json(&json!({"device": 1, "disk": 2})),
            Some(Cached {
                device: 1,
                host: 0,
                disk: 2,
                remote: 0
            })
        );
        assert_eq!(Cached::from_json(&Value::Null), None);
    }
}
