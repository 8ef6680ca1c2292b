//! GGUF metadata values: typed access to the key/value section of a GGUF file.
//!
//! Kept apart from the loader ([`crate::gguf`]) so that readers of metadata alone (the
//! tokenizer) depend on nothing else.

use candle_core::quantized::gguf_file::Value;
use std::collections::HashMap;

/// A GGUF file's metadata section.
#[derive(Clone, Copy, Debug)]
pub struct GgufMeta<'a> {
    map: &'a HashMap<String, Value>,
}

impl<'a> GgufMeta<'a> {
    /// Wraps a parsed metadata map.
    pub fn new(map: &'a HashMap<String, Value>) -> Self {
        Self { map }
    }

    /// A metadata value, if present.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key)
    }

    /// A string metadata value, if present and a string.
    pub fn get_str(&self, key: &str) -> Option<&'a str> {
        match self.get(key) {
            Some(Value::String(s)) => Some(s),
            _ => None,
        }
    }

    /// A boolean metadata value (an integer counts: non-zero is true), if present.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key) {
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => value_as_u64(v).map(|x| x != 0),
            None => None,
        }
    }

    /// An array metadata value, if present.
    pub fn get_array(&self, key: &str) -> Option<&'a [Value]> {
        match self.get(key) {
            Some(Value::Array(a)) => Some(a),
            _ => None,
        }
    }
}

/// An integer metadata value as `u64`.
pub fn value_as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::U8(x) => Some(*x as u64),
        Value::U16(x) => Some(*x as u64),
        Value::U32(x) => Some(*x as u64),
        Value::U64(x) => Some(*x),
        Value::I8(x) => u64::try_from(*x).ok(),
        Value::I16(x) => u64::try_from(*x).ok(),
        Value::I32(x) => u64::try_from(*x).ok(),
        Value::I64(x) => u64::try_from(*x).ok(),
        _ => None,
    }
}

/// A numeric metadata value as `f64`.
pub fn value_as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::F32(x) => Some(*x as f64),
        Value::F64(x) => Some(*x),
        Value::I8(x) => Some(*x as f64),
        Value::I16(x) => Some(*x as f64),
        Value::I32(x) => Some(*x as f64),
        Value::I64(x) => Some(*x as f64),
        other => value_as_u64(other).map(|x| x as f64),
    }
}

/// An integer metadata value as `i64` (token ids, token types).
pub fn value_as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::I8(x) => Some(*x as i64),
        Value::I16(x) => Some(*x as i64),
        Value::I32(x) => Some(*x as i64),
        Value::I64(x) => Some(*x),
        other => value_as_u64(other).and_then(|x| i64::try_from(x).ok()),
    }
}

/// A numeric metadata value as `f32` (token scores).
pub fn value_as_f32(v: &Value) -> Option<f32> {
    value_as_f64(v).map(|x| x as f32)
}
