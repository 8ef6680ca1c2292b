//! The processes of a phase beyond hicache's [`Server`]: a server pinned to CPUs, the
//! cluster identity both PD roles read, free ports, and sglang-router in PD mode.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::hicache::server::{ServeCommand, Server};

/// Bounds on the router's start and stop.
const ROUTER_START_TIMEOUT: Duration = Duration::from_secs(120);
const ROUTER_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The `sglrs` binary of `how` (`None`: this one).
fn sglrs_bin(how: &ServeCommand) -> anyhow::Result<PathBuf> {
    match &how.bin {
        Some(b) => Ok(b.clone()),
        None => std::env::current_exe().context("locating the sglrs binary"),
    }
}

/// A TCP port of 127.0.0.1 that was free a moment ago, for each of `n` uses (all bound at
/// once, so they differ).
pub(crate) fn free_tcp_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("finding a free TCP port")?;
    held.iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect::<std::io::Result<_>>()
        .context("finding a free TCP port")
}

/// A UDP port of 127.0.0.1 that was free a moment ago (the prefill's KV endpoint).
pub(crate) fn free_udp_port() -> anyhow::Result<u16> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .context("finding a free UDP port")?
        .port())
}

/// `sglrs cluster-identity --out dir` with the binary of `how`.
pub(crate) fn write_identity(how: &ServeCommand, dir: &Path) -> anyhow::Result<()> {
    let bin = sglrs_bin(how)?;
    let out = Command::new(&bin)
        .arg("cluster-identity")
        .arg("--out")
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} cluster-identity", bin.display()))?;
    if !out.status.success() {
        bail!(
            "sglrs cluster-identity failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Pins the calling thread to `cpus` (as `taskset -c` pins the program it starts).
fn pin_this_thread(cpus: &[usize]) -> anyhow::Result<()> {
    // SAFETY: `cpu_set_t` is plain bits, valid all-zero; CPU_SET only writes inside `set`
    // for an index below CPU_SETSIZE (checked), and sched_setaffinity reads `size_of` bytes
    // of it for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as usize {
                bail!("CPU {c} is beyond CPU_SETSIZE");
            }
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            let e = std::io::Error::last_os_error();
            bail!("pinning to CPUs {cpus:?}: {e}");
        }
    }
    Ok(())
}

/// The CPUs this process may run on.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: as in `pin_this_thread`; sched_getaffinity writes at most `size_of` bytes into
    // `set`, and CPU_ISSET reads inside it for indices below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// [`Server::start`] with the server pinned to `cpus` from its first instruction: it is
/// started from a thread pinned to them, and a child inherits the affinity of the thread
/// that starts it (what `taskset -c` does for the program it runs).
pub(crate) fn start_pinned(
    how: &ServeCommand,
    flags: &[String],
    log: PathBuf,
    cpus: &[usize],
) -> anyhow::Result<Server> {
    let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
    let threads = how
        .threads
        .map_or_else(|| "default".into(), |t| t.to_string());
    println!(
        "  server: --threads {threads}, pinned to CPU {}",
        list.join(",")
    );
    std::thread::scope(|s| {
        s.spawn(|| {
            pin_this_thread(cpus)?;
            Server::start(how, flags, log)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the thread starting a server panicked"))?
    })
}

/// `python3 -m sglang_router.launch_router --pd-disaggregation` over one prefill and one
/// decode server; killed on drop if still running.
pub(crate) struct Router {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
    log: PathBuf,
}

impl Router {
    /// Starts the router with `python` (its output to `log`) in front of `prefill`, whose KV
    /// endpoint is UDP `bootstrap_port`, and `decode`; waits until `/health` and
    /// `/readiness` answer 200.
    pub(super) fn start(
        python: &str,
        prefill: &Server,
        bootstrap_port: u16,
        decode: &Server,
        log: PathBuf,
    ) -> anyhow::Result<Router> {
        println!(
            "  router: prefill {} (bootstrap {bootstrap_port}), decode {}",
            prefill.base, decode.base
        );
        let port = bootstrap_port.to_string();
        Router::spawn(
            python,
            &[
                "--pd-disaggregation",
                "--prefill",
                &prefill.base,
                &port,
                "--decode",
                &decode.base,
            ],
            log,
        )
    }

    /// Starts the router in regular mode over `workers` with `policy` (`cache_aware`,
    /// `round_robin`, …).
    pub(crate) fn start_regular(
        python: &str,
        workers: &[&Server],
        policy: &str,
        log: PathBuf,
    ) -> anyhow::Result<Router> {
        let mut args = vec!["--worker-urls"];
        args.extend(workers.iter().map(|w| w.base.as_str()));
        args.extend(["--policy", policy]);
        println!("  router: --policy {policy} over {} workers", workers.len());
        Router::spawn(python, &args, log)
    }

    fn spawn(python: &str, mode: &[&str], log: PathBuf) -> anyhow::Result<Router> {
        let ports = free_tcp_ports(2)?;
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(python);
        cmd.args(["-m", "sglang_router.launch_router", "--host", "127.0.0.1"])
            .args(["--port", &ports[0].to_string()])
            .args(mode)
            .args(["--prometheus-port", &ports[1].to_string()]);
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {python} -m sglang_router.launch_router"))?;
        let mut r = Router {
            child,
            base: format!("http://127.0.0.1:{}", ports[0]),
            log,
        };
        r.wait_healthy()?;
        Ok(r)
    }

    fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(2))
            .build();
        let t0 = Instant::now();
        while t0.elapsed() < ROUTER_START_TIMEOUT {
            if let Some(st) = self.child.try_wait()? {
                bail!("the router exited while starting ({st}){}", self.log_tail());
            }
            let health = agent.get(&format!("{}/health", self.base)).call();
            if matches!(health, Ok(ref resp) if resp.status() == 200) {
                // Up; ready once it has found both workers healthy (a router without
                // `/readiness` answers 404 and is taken as ready).
                match agent.get(&format!("{}/readiness", self.base)).call() {
                    Ok(resp) if resp.status() == 200 => return Ok(()),
                    Err(ureq::Error::Status(404, _)) => return Ok(()),
                    _ => {}
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "the router was not up and ready within {} s{}",
            ROUTER_START_TIMEOUT.as_secs(),
            self.log_tail()
        )
    }

    /// The last lines of the router's output, for an error message.
    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("\n--- {} (last lines) ---\n{tail}", self.log.display())
    }

    /// SIGTERM, then waits (SIGKILL after [`ROUTER_STOP_TIMEOUT`]).
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        let pid = libc::pid_t::try_from(self.child.id()).context("router pid")?;
        // SAFETY: `pid` is our own child, not yet reaped (it is reaped below or on drop), so
        // the id names that process; kill(2) takes no pointers.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < ROUTER_STOP_TIMEOUT {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A fresh folder for the logs and the cluster identity, removed on drop.
pub(crate) struct RunDir(pub(crate) PathBuf);

impl RunDir {
    pub(crate) fn new(parent: Option<&Path>) -> anyhow::Result<RunDir> {
        let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = parent.join(format!("sglrs-bench-pd-{}-{nanos:09}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(RunDir(dir))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_differ_and_cpus_are_listed() {
        let p = free_tcp_ports(3).expect("ports");
        assert!(p[0] != p[1] && p[1] != p[2] && p[0] != p[2]);
        assert!(free_udp_port().expect("udp") > 0);
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        // A thread pinned to one allowed CPU reports just that one.
        let first = cpus[0];
        std::thread::spawn(move || {
            pin_this_thread(&[first]).expect("pin");
            assert_eq!(allowed_cpus(), [first]);
        })
        .join()
        .expect("pinned thread");
    }
}
