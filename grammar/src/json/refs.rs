//! `$ref` resolution: local JSON pointers, anchors of the root resource (`$anchor`,
//! `$dynamicAnchor`, draft-7 `$id: "#name"`), and references spelt with the root's own `$id`.

use std::collections::HashMap;

use serde_json::Value;

use super::JsonCompiler;
use crate::CompileError;

impl<'a> JsonCompiler<'a> {
    /// Resolves a local `$ref` ("#", "#/definitions/x", "#/$defs/x", any JSON pointer, an
    /// anchor "#name"), also when written against the root's own `$id`
    /// ("https://example.com/s.json#/$defs/x").
    pub fn resolve(&self, reference: &str, pointer: &str) -> Result<&'a Value, CompileError> {
        let (uri, frag) = reference.split_at(reference.find('#').unwrap_or(reference.len()));
        if !uri.is_empty() && !self.is_root_id(uri) {
            return Err(CompileError::Unsupported {
                keyword: "$ref".into(),
                pointer: pointer.into(),
                reason: format!(
                    "only local references are supported, got {:?}",
                    crate::excerpt(reference)
                ),
            });
        }
        let decoded = percent_decode(frag.strip_prefix('#').unwrap_or(""));
        if decoded.is_empty() {
            return Ok(self.root);
        }
        if !decoded.starts_with('/') {
            return self.anchor(&decoded, reference, pointer);
        }
        self.root
            .pointer(&decoded)
            .ok_or_else(|| CompileError::InvalidSchema {
                pointer: pointer.into(),
                reason: format!("unresolvable $ref {:?}", crate::excerpt(reference)),
            })
    }

    /// Whether `uri` (a `$ref` without its fragment) names the root schema by its `$id`.
    fn is_root_id(&self, uri: &str) -> bool {
        let id = self.root.get("$id").or_else(|| self.root.get("id"));
        id.and_then(|i| i.as_str())
            .is_some_and(|i| !i.is_empty() && i.trim_end_matches('#') == uri)
    }

    /// The subschema of the root resource that declares the anchor `name` (`$anchor`,
    /// `$dynamicAnchor`, or draft-7's `$id: "#name"`). Subschemas with an `$id` of their own
    /// are other resources, whose anchors a root-relative "#name" does not reach.
    fn anchor(
        &self,
        name: &str,
        reference: &str,
        pointer: &str,
    ) -> Result<&'a Value, CompileError> {
        let anchors = self.anchors.get_or_init(|| {
            let mut out = HashMap::new();
            collect_anchors(self.root, true, &mut out);
            out
        });
        match anchors.get(name).map(|v| v.as_slice()) {
            Some([one]) => Ok(one),
            Some(_) => Err(self.invalid(pointer, &format!("anchor {name:?} is declared twice"))),
            None => Err(CompileError::InvalidSchema {
                pointer: pointer.into(),
                reason: format!("unresolvable $ref {:?}", crate::excerpt(reference)),
            }),
        }
    }
}

/// Anchors of the resource at `v` (its root when `top`), by name.
fn collect_anchors<'a>(v: &'a Value, top: bool, out: &mut HashMap<String, Vec<&'a Value>>) {
    match v {
        Value::Object(m) => {
            let id = m
                .get("$id")
                .or_else(|| m.get("id"))
                .and_then(|i| i.as_str());
            if let Some(id) = id {
                match id.strip_prefix('#') {
                    Some(name) if !name.is_empty() => {
                        out.entry(name.to_string()).or_default().push(v)
                    }
                    Some(_) => {}
                    // Another resource: its anchors are its own.
                    None if !top => return,
                    None => {}
                }
            }
            for k in ["$anchor", "$dynamicAnchor"] {
                if let Some(name) = m.get(k).and_then(|a| a.as_str()) {
                    out.entry(name.to_string()).or_default().push(v);
                }
            }
            for (k, x) in m {
                if !matches!(k.as_str(), "enum" | "const" | "default" | "examples") {
                    collect_anchors(x, false, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_anchors(x, false, out)),
        _ => {}
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            // The two digits as bytes: a multi-byte character after `%` is not a digit,
            // and slicing the text there would cut inside it.
            let digits = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = digits.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_percent_before_a_multibyte_character_is_kept_as_text() {
        assert_eq!(percent_decode("#/$defs/%aé"), "#/$defs/%aé");
        assert_eq!(percent_decode("%é"), "%é");
        assert_eq!(percent_decode("#/a%20b"), "#/a b");
    }
}
