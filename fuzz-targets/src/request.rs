//! Request body parsing and validation of the HTTP server (`sglrs_server`).

use sglrs_server::validate::{Limits, ValidParams, MAX_N};
use sglrs_server::{check_completion_body, check_generate_body, ApiError};

/// Largest body tried.
const MAX_BODY: usize = 16 << 10;

const LIMITS: Limits = Limits {
    max_context: 2048,
    vocab_size: 49_152,
};

/// A stand-in tokenizer: one token per byte.
fn encode(text: &str) -> Result<Vec<u32>, ApiError> {
    Ok(text.bytes().map(u32::from).collect())
}

/// The first byte picks the route (`/generate` or `/v1/completions`); the rest is the body,
/// parsed and checked as the handler does short of compiling grammars and submitting.
/// Asserts that a refused body is a 400 (`BadRequest`: the client's fault, never a 500) and
/// that accepted parameters are inside the documented bounds.
pub fn request(data: &[u8]) {
    let Some((&route, body)) = data.split_first() else {
        return;
    };
    if body.len() > MAX_BODY {
        return;
    }
    let checked = match route % 2 {
        0 => check_generate_body(body, LIMITS, 64, &encode),
        _ => check_completion_body(body, LIMITS, &encode),
    };
    match checked {
        Ok(jobs) => {
            assert!(!jobs.is_empty(), "an accepted request has no job");
            jobs.iter().for_each(check_bounds);
        }
        Err(ApiError::BadRequest { .. }) => {}
        Err(e) => panic!("a request body was refused with other than a 400: {e:?}"),
    }
}

fn check_bounds(p: &ValidParams) {
    let s = &p.sampling;
    assert!(p.n >= 1 && p.n <= MAX_N, "n = {}", p.n);
    assert!(p.stop.max_new_tokens < LIMITS.max_context);
    assert!(p.stop.min_new_tokens <= p.stop.max_new_tokens);
    assert!(s.temperature.is_finite() && (0.0..=100.0).contains(&s.temperature));
    assert!(s.top_p > 0.0 && s.top_p <= 1.0);
    assert!((0.0..=1.0).contains(&s.min_p));
    assert!(s.repetition_penalty > 0.0 && s.repetition_penalty <= 2.0);
    assert!((-2.0..=2.0).contains(&s.frequency_penalty));
    assert!((-2.0..=2.0).contains(&s.presence_penalty));
    assert!(s.top_k.is_none_or(|k| k >= 1));
    for &(id, b) in &s.logit_bias {
        assert!((id as usize) < LIMITS.vocab_size && b.is_finite() && b.abs() <= 100.0);
    }
    assert!(p
        .stop
        .stop_token_ids
        .iter()
        .all(|&t| (t as usize) < LIMITS.vocab_size));
    assert!(p.stop.stop_strings.len() <= 16);
}
