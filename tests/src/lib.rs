//! End-to-end tests of sglrs: real processes, the real default model, real clients.
//!
//! Helpers shared by the tests in `tests/tests/`: where the default model and the shared
//! reference data live.
#![warn(missing_docs)]

use std::path::PathBuf;

/// The workspace root (the folder holding the top-level `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits inside the workspace")
        .to_path_buf()
}

/// Path of the default model: `$SGLRS_MODEL` if set, else `models/SmolLM2-135M-Instruct.Q4_1.gguf`.
pub fn default_model() -> PathBuf {
    std::env::var_os("SGLRS_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"))
}

/// The shared reference data folder: `$SGLRS_SHARED` if set, else `../shared` beside the checkout.
pub fn shared_dir() -> PathBuf {
    std::env::var_os("SGLRS_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared"))
}

/// A running `sglrs serve` process on a free local port, killed on drop.
pub struct Server {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
}

/// Path of the `sglrs` binary next to this test binary (`target/release/sglrs`), built first
/// with `cargo build --release -p sglrs-runtime --bin sglrs` if `$SGLRS_BIN` is not set.
pub fn sglrs_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SGLRS_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> → target/<profile>/sglrs
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target profile folder")
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let profile = dir
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("release")
        .to_string();
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(workspace_root())
        .args(["build", "-p", "sglrs-runtime", "--bin", "sglrs"]);
    if profile == "release" {
        cmd.arg("--release");
    }
    if let Some(target) = dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    let status = cmd
        .status()
        .expect("running cargo build for the sglrs binary");
    assert!(status.success(), "building the sglrs binary failed");
    dir.join("sglrs")
}

/// A whole HTTP answer: status, headers (names lower-case) and body.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Header names (lower-case) and values.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON, or the body text as a JSON string when it is not JSON.
    pub body: serde_json::Value,
}

impl Reply {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Server {
    /// Starts `sglrs serve --model <default model> <extra args>` and waits (up to 5 minutes)
    /// until `/health` answers.
    pub fn start(extra: &[&str]) -> Server {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().expect("local addr").port()
        };
        let bin = sglrs_bin();
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--model".into(),
            default_model().display().to_string(),
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = std::process::Command::new(&bin)
            .args(&args)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let mut server = Server {
            child,
            base_url: format!("http://127.0.0.1:{port}"),
        };
        let t0 = std::time::Instant::now();
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("sglrs serve exited early: {status}");
            }
            if ureq::get(&format!("{}/health", server.base_url))
                .call()
                .is_ok()
            {
                return server;
            }
            assert!(
                t0.elapsed().as_secs() < 300,
                "server did not come up in 5 minutes"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// POSTs JSON to `path`; returns the status and the parsed body (or the body text as a
    /// JSON string when it is not JSON).
    pub fn post(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        self.post_raw(path, &body.to_string())
    }

    /// POSTs a raw body to `path`.
    pub fn post_raw(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let r = ureq::post(&format!("{}{path}", self.base_url))
            .set("Content-Type", "application/json")
            .send_string(body);
        let resp = match r {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("POST {path}: {e}"),
        };
        let status = resp.status();
        let text = resp.into_string().unwrap_or_default();
        let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        (status, v)
    }

    /// Sends `method path` with `headers` and an optional JSON `body`; the whole answer,
    /// whatever its status.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Reply {
        let mut req = ureq::request(method, &format!("{}{path}", self.base_url));
        for (k, v) in headers {
            req = req.set(k, v);
        }
        let r = match body {
            Some(b) => req.set("Content-Type", "application/json").send_string(b),
            None => req.call(),
        };
        let resp = match r {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = resp.status();
        let headers = resp
            .headers_names()
            .into_iter()
            .filter_map(|n| {
                let v = resp.header(&n)?.to_string();
                Some((n.to_ascii_lowercase(), v))
            })
            .collect();
        let text = resp.into_string().unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        Reply {
            status,
            headers,
            body,
        }
    }

    /// `/get_server_info` as JSON.
    pub fn server_info(&self) -> serde_json::Value {
        let (status, text) = self.get("/get_server_info");
        assert_eq!(status, 200, "/get_server_info: {text}");
        serde_json::from_str(&text).expect("/get_server_info is JSON")
    }

    /// `/get_server_info` as JSON, sending `authorization` (e.g. `Bearer KEY`).
    pub fn server_info_with(&self, authorization: &str) -> serde_json::Value {
        let r = self.request(
            "GET",
            "/get_server_info",
            &[("Authorization", authorization)],
            None,
        );
        assert_eq!(r.status, 200, "/get_server_info: {}", r.body);
        r.body
    }

    /// GETs `path`; returns the status and the body text.
    pub fn get(&self, path: &str) -> (u16, String) {
        let r = ureq::get(&format!("{}{path}", self.base_url)).call();
        let resp = match r {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("GET {path}: {e}"),
        };
        let status = resp.status();
        (status, resp.into_string().unwrap_or_default())
    }
}

impl Server {
    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (a clean shutdown) and waits for the process to exit (at most 60 s,
    /// then SIGKILL); returns whether it exited with status 0.
    pub fn terminate(mut self) -> bool {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(60) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
