//! `sglrs bench serving`: drives any OpenAI-compatible server (sglrs, vLLM, llama.cpp's
//! server) with three workloads and reports what each one measures.
//!
//! - `shared_prefix`: 32 requests sharing a ~1,000-token prefix, each with a unique
//!   ~23-token question and 16 output tokens, from 4 concurrent clients (streamed, so the
//!   time to first token is measured). Reports `total_s` and `mean_ttft_s`. With
//!   `--repeat N` the workload runs N times, each time with another prefix (other prices in
//!   the facts, so no run finds the previous one's pages cached); `total_s` and
//!   `mean_ttft_s` are then those of the median run and `runs_s` lists every run's total.
//! - `concurrent`: 8 concurrent requests with ~94-token prompts and 128 output tokens.
//!   Reports `output_tok_s`.
//! - `json`: chat requests constrained by a JSON schema (a person with a nested address, a
//!   5-digit zip pattern and an email list; `max_tokens` 200) at temperature 0 and 0.7.
//!   Reports the share of outputs that parse and validate, and output tokens/s constrained
//!   versus the same requests unconstrained.
//!
//! With `--compare-url` (e.g. a second sglrs started with `--disable-jump-forward`) the
//! `json` workload also runs there and `"jump_forward": {"tok_s_on", "tok_s_off",
//! "speedup"}` reports the constrained tokens/s ratio. Otherwise the result has exactly the
//! shape `{"shared_prefix": {"total_s", "mean_ttft_s"}, "concurrent": {"output_tok_s"},
//! "json": {"valid_rate_t0", "valid_rate_t07", "tok_s_constrained", "tok_s_unconstrained"}}`.

use anyhow::{anyhow, Context};
use serde_json::{json, Value};
use std::io::BufRead;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Arguments of `sglrs bench serving`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServingArgs {
    /// Base URL of the server (without `/v1`).
    #[arg(long, default_value = "http://127.0.0.1:30000")]
    pub base_url: String,
    /// Model name to send (default: the first of `/v1/models`).
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer token, if the server wants one.
    #[arg(long)]
    pub api_key: Option<String>,
    /// What the server is, for the few fields peers name differently: sglrs, vllm, llamacpp.
    #[arg(long, default_value = "sglrs")]
    pub peer: String,
    /// Workloads to run (comma separated): shared_prefix, concurrent, json.
    #[arg(long, default_value = "shared_prefix,concurrent,json")]
    pub only: String,
    /// Runs of the shared_prefix workload (each with its own prefix); the median is reported.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Requests per temperature in the json workload.
    #[arg(long, default_value_t = 8)]
    pub json_requests: usize,
    /// A second server to run the json workload against (e.g. jump-forward off); adds
    /// `"jump_forward": {"tok_s_on", "tok_s_off", "speedup"}` to the result.
    #[arg(long)]
    pub compare_url: Option<String>,
}

struct Client {
    base: String,
    model: String,
    key: Option<String>,
    peer: String,
    agent: ureq::Agent,
}

/// Outcome of one request.
struct Outcome {
    text: String,
    completion_tokens: u64,
    ttft: f64,
    total: f64,
}

impl Client {
    fn new(
        base: &str,
        model: Option<String>,
        key: Option<String>,
        peer: &str,
    ) -> anyhow::Result<Client> {
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(600))
            .build();
        let mut c = Client {
            base: base.trim_end_matches('/').to_string(),
            model: String::new(),
            key,
            peer: peer.into(),
            agent,
        };
        c.model = match model {
            Some(m) => m,
            None => {
                let v: Value = c.request("GET", "/v1/models")?.call()?.into_json()?;
                v["data"][0]["id"]
                    .as_str()
                    .ok_or_else(|| anyhow!("no model in /v1/models: {v}"))?
                    .to_string()
            }
        };
        Ok(c)
    }

    fn request(&self, method: &str, path: &str) -> anyhow::Result<ureq::Request> {
        let mut r = self.agent.request(method, &format!("{}{path}", self.base));
        if let Some(k) = &self.key {
            r = r.set("Authorization", &format!("Bearer {k}"));
        }
        Ok(r)
    }

    /// Makes every request produce exactly `n` tokens where the peer allows it.
    fn exact_tokens(&self, body: &mut Value, n: usize) {
        body["max_tokens"] = json!(n);
        body["min_tokens"] = json!(n);
        if self.peer == "llamacpp" {
            body["repeat_penalty"] = json!(1.0);
        } else {
            body["ignore_eos"] = json!(true);
        }
    }

    /// Streams a request to `path`, measuring the time to the first text.
    fn stream(&self, path: &str, mut body: Value) -> anyhow::Result<Outcome> {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        body["model"] = json!(self.model);
        let t0 = Instant::now();
        let resp = self
            .request("POST", path)?
            .send_json(body)
            .context("request failed")?;
        let reader = std::io::BufReader::new(resp.into_reader());
        let mut ttft = None;
        let mut text = String::new();
        let mut completion_tokens = 0;
        let mut chunks = 0u64;
        for line in reader.lines() {
            let line = line?;
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data.trim() == "[DONE]" {
                break;
            }
            let v: Value = serde_json::from_str(data)?;
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
            }
            for c in v["choices"].as_array().into_iter().flatten() {
                let piece = c["text"]
                    .as_str()
                    .or_else(|| c["delta"]["content"].as_str())
                    .unwrap_or("");
                if !piece.is_empty() {
                    ttft.get_or_insert_with(|| t0.elapsed().as_secs_f64());
                    text.push_str(piece);
                    chunks += 1;
                }
            }
        }
        if completion_tokens == 0 {
            completion_tokens = chunks;
        }
        let total = t0.elapsed().as_secs_f64();
        Ok(Outcome {
            text,
            completion_tokens,
            ttft: ttft.unwrap_or(total),
            total,
        })
    }

    /// A non-streaming chat request.
    fn chat(&self, mut body: Value) -> anyhow::Result<Outcome> {
        body["model"] = json!(self.model);
        let t0 = Instant::now();
        let v: Value = self
            .request("POST", "/v1/chat/completions")?
            .send_json(body)?
            .into_json()?;
        let total = t0.elapsed().as_secs_f64();
        Ok(Outcome {
            text: v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            completion_tokens: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
            ttft: total,
            total,
        })
    }
}

/// Runs `f(i)` for `i in 0..n` on `clients` threads; returns the outcomes in order.
fn run_concurrent<F>(n: usize, clients: usize, f: F) -> anyhow::Result<(Vec<Outcome>, f64)>
where
    F: Fn(usize) -> anyhow::Result<Outcome> + Sync,
{
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<Outcome>>> = Mutex::new((0..n).map(|_| None).collect());
    let err: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                match f(i) {
                    Ok(o) => out.lock().expect("results")[i] = Some(o),
                    Err(e) => {
                        *err.lock().expect("error slot") = Some(e);
                        break;
                    }
                }
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    if let Some(e) = err.into_inner().expect("error slot") {
        return Err(e);
    }
    let outs = out
        .into_inner()
        .expect("results")
        .into_iter()
        .flatten()
        .collect();
    Ok((outs, wall))
}

/// One run of the shared_prefix workload with prefix number `variant`: (total s, mean TTFT s).
fn shared_prefix_run(c: &Client, variant: usize) -> anyhow::Result<(f64, f64)> {
    // 68 facts: 1,007 tokens with SmolLM2's tokenizer (the issue's "1,000-token prefix").
    // Other variants change the prices from the first fact on.
    let mut prefix = String::from("You are a helpful assistant. Here are some facts.\n");
    for i in 0..68 {
        prefix.push_str(&format!(
            "Fact {i}: item {i} costs {} dollars. ",
            (i * 37 + variant * 13) % 101
        ));
    }
    let (outs, wall) = run_concurrent(32, 4, |i| {
        let mut body = json!({"prompt": format!("{prefix}\nQuestion {i}: how much do items {i} and {} cost together, in dollars?\nAnswer:", i + 1), "temperature": 0});
        c.exact_tokens(&mut body, 16);
        c.stream("/v1/completions", body)
    })?;
    let mean_ttft = outs.iter().map(|o| o.ttft).sum::<f64>() / outs.len().max(1) as f64;
    println!(
        "shared_prefix: 32 requests, 4 clients: total {wall:.2} s, mean TTFT {mean_ttft:.3} s"
    );
    Ok((wall, mean_ttft))
}

fn shared_prefix(c: &Client, repeat: usize) -> anyhow::Result<Value> {
    let mut runs = (0..repeat.max(1))
        .map(|v| shared_prefix_run(c, v))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let totals: Vec<f64> = runs.iter().map(|r| r.0).collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (wall, mean_ttft) = runs[(runs.len() - 1) / 2];
    if totals.len() > 1 {
        println!(
            "shared_prefix: median of {} runs: total {wall:.2} s",
            totals.len()
        );
        return Ok(json!({"total_s": wall, "mean_ttft_s": mean_ttft, "runs_s": totals}));
    }
    Ok(json!({"total_s": wall, "mean_ttft_s": mean_ttft}))
}

fn concurrent(c: &Client) -> anyhow::Result<Value> {
    let (outs, wall) = run_concurrent(8, 8, |i| {
        let topic = [
            "the ocean",
            "mountains",
            "cities",
            "forests",
            "deserts",
            "rivers",
            "islands",
            "the sky",
        ][i];
        let prompt = format!(
            "Write a long, detailed essay about {topic}. Describe its history, the people who live near it, the animals, the plants, the weather across the seasons, and why travellers love to visit it. Cover how it was formed, the oldest stories told about it, how trade and travel changed it over the centuries, what it looks like at dawn and at night, and what it may look like in a hundred years. Use vivid language and many examples. Essay:"
        );
        let mut body = json!({"prompt": prompt, "temperature": 0});
        c.exact_tokens(&mut body, 128);
        c.stream("/v1/completions", body)
    })?;
    let tokens: u64 = outs.iter().map(|o| o.completion_tokens).sum();
    let tps = tokens as f64 / wall;
    println!("concurrent: 8 requests x 128 tokens: {tokens} tokens in {wall:.2} s = {tps:.1} output tok/s");
    Ok(json!({"output_tok_s": tps}))
}

/// The person schema of the json workload.
pub fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "address": {"type": "object", "properties": {
                "street": {"type": "string"}, "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["street", "city", "zip"]},
            "emails": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["name", "age", "address", "emails"]
    })
}

/// Checks an output against [`person_schema`] (hand-written: the workload's one schema).
pub fn valid_person(text: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    let a = &v["address"];
    let zip_ok = a["zip"]
        .as_str()
        .is_some_and(|z| z.len() == 5 && z.bytes().all(|b| b.is_ascii_digit()));
    v["name"].is_string()
        && (v["age"].is_i64() || v["age"].is_u64())
        && a["street"].is_string()
        && a["city"].is_string()
        && zip_ok
        && v["emails"]
            .as_array()
            .is_some_and(|e| e.iter().all(Value::is_string))
}

fn json_workload(c: &Client, n: usize) -> anyhow::Result<Value> {
    let schema = person_schema();
    let format = if c.peer == "llamacpp" {
        json!({"type": "json_object", "schema": schema})
    } else {
        json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}})
    };
    let mut res = json!({});
    let mut tok_c = (0u64, 0f64);
    let mut tok_u = (0u64, 0f64);
    for (key, temp) in [("valid_rate_t0", 0.0), ("valid_rate_t07", 0.7)] {
        let mut valid = 0;
        for i in 0..n {
            let msg = format!("Invent a person (number {i}) with an address and emails, as JSON.");
            let body = json!({"messages": [{"role": "user", "content": msg}], "max_tokens": 200, "temperature": temp, "seed": i, "response_format": format});
            let o = c.chat(body)?;
            if valid_person(&o.text) {
                valid += 1;
            }
            tok_c.0 += o.completion_tokens;
            tok_c.1 += o.total;
            let body = json!({"messages": [{"role": "user", "content": msg}], "max_tokens": 200, "temperature": temp, "seed": i});
            let o = c.chat(body)?;
            tok_u.0 += o.completion_tokens;
            tok_u.1 += o.total;
        }
        let rate = valid as f64 / n as f64;
        println!("json: temperature {temp}: {valid}/{n} valid");
        res[key] = json!(rate);
    }
    let tc = tok_c.0 as f64 / tok_c.1.max(1e-9);
    let tu = tok_u.0 as f64 / tok_u.1.max(1e-9);
    println!(
        "json: constrained {tc:.1} tok/s, unconstrained {tu:.1} tok/s (ratio {:.2})",
        tc / tu.max(1e-9)
    );
    res["tok_s_constrained"] = json!(tc);
    res["tok_s_unconstrained"] = json!(tu);
    Ok(res)
}

/// Runs the selected workloads; returns the `--json` object.
pub fn run(args: &ServingArgs) -> anyhow::Result<Value> {
    let c = Client::new(
        &args.base_url,
        args.model.clone(),
        args.api_key.clone(),
        &args.peer,
    )?;
    println!(
        "bench serving: {} (model {}, peer kind {})",
        c.base, c.model, c.peer
    );
    let only: Vec<&str> = args.only.split(',').map(str::trim).collect();
    let mut out = json!({});
    if only.contains(&"shared_prefix") {
        out["shared_prefix"] = shared_prefix(&c, args.repeat)?;
    }
    if only.contains(&"concurrent") {
        out["concurrent"] = concurrent(&c)?;
    }
    if only.contains(&"json") {
        out["json"] = json_workload(&c, args.json_requests)?;
        if let Some(url) = &args.compare_url {
            let other = Client::new(url, args.model.clone(), args.api_key.clone(), &args.peer)?;
            println!("json: the same workload at {url}");
            let o = json_workload(&other, args.json_requests)?;
            let on = out["json"]["tok_s_constrained"].as_f64().unwrap_or(0.0);
            let off = o["tok_s_constrained"].as_f64().unwrap_or(0.0);
            let speedup = on / off.max(1e-9);
            println!("json: constrained tok/s here / at {url}: {speedup:.2}x");
            out["jump_forward"] = json!({"tok_s_on": on, "tok_s_off": off, "speedup": speedup});
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn person_validation() {
        assert!(valid_person(
            r#"{"name":"A","age":3,"address":{"street":"s","city":"c","zip":"12345"},"emails":["a@b"]}"#
        ));
        assert!(!valid_person(
            r#"{"name":"A","age":3,"address":{"street":"s","city":"c","zip":"1234"},"emails":[]}"#
        ));
        assert!(!valid_person(
            r#"{"name":"A","age":3.5,"address":{"street":"s","city":"c","zip":"12345"},"emails":[]}"#
        ));
        assert!(!valid_person("{"));
    }
}
