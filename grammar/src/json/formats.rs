//! Regexes for JSON Schema `format`s and for numeric ranges. Every regex here accepts only
//! text the format's RFC accepts (some valid text may be refused, never the reverse).

/// RFC 3987 `ucschar`, as regex class ranges.
const UCSCHAR: &str = r"\x{A0}-\x{D7FF}\x{F900}-\x{FDCF}\x{FDF0}-\x{FFEF}\x{10000}-\x{1FFFD}\x{20000}-\x{2FFFD}\x{30000}-\x{3FFFD}\x{40000}-\x{4FFFD}\x{50000}-\x{5FFFD}\x{60000}-\x{6FFFD}\x{70000}-\x{7FFFD}\x{80000}-\x{8FFFD}\x{90000}-\x{9FFFD}\x{A0000}-\x{AFFFD}\x{B0000}-\x{BFFFD}\x{C0000}-\x{CFFFD}\x{D0000}-\x{DFFFD}\x{E1000}-\x{EFFFD}";

/// RFC 3987 `iprivate`, as regex class ranges.
const IPRIVATE: &str = r"\x{E000}-\x{F8FF}\x{F0000}-\x{FFFFD}\x{100000}-\x{10FFFD}";

/// RFC 6570 URI Template (level 4): literals and `{op var[:n|*],...}` expressions.
fn uri_template_regex(pct: &str) -> String {
    let literal = format!(
        r"([\x21\x23-\x24\x26\x28-\x3B\x3D\x3F-\x5B\x5D\x5F\x61-\x7A\x7E{UCSCHAR}{IPRIVATE}]|{pct})"
    );
    let varchar = format!("([A-Za-z0-9_]|{pct})");
    let varspec = format!(r"{varchar}(\.?{varchar})*(:[1-9][0-9]{{0,3}}|\*)?");
    let expression = format!(r"\{{[+#./;?&=,!@|]?{varspec}(,{varspec})*\}}");
    format!("({literal}|{expression})*")
}

/// The regex (full match, over decoded string contents) for a known format; `None` when the
/// format is known to JSON Schema but not supported; `Some("")` marks unknown formats,
/// which validators ignore.
pub(crate) fn format_regex(format: &str) -> Option<String> {
    let date = date_regex();
    let time = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    let dec_octet = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    let ipv4 = format!(r"{d}\.{d}\.{d}\.{d}", d = dec_octet);
    let h16 = "[0-9A-Fa-f]{1,4}";
    let ls32 = format!("({h16}:{h16}|{ipv4})");
    let ipv6 = [
        format!("({h16}:){{6}}{ls32}"),
        format!("::({h16}:){{5}}{ls32}"),
        format!("({h16})?::({h16}:){{4}}{ls32}"),
        format!("(({h16}:){{0,1}}{h16})?::({h16}:){{3}}{ls32}"),
        format!("(({h16}:){{0,2}}{h16})?::({h16}:){{2}}{ls32}"),
        format!("(({h16}:){{0,3}}{h16})?::{h16}:{ls32}"),
        format!("(({h16}:){{0,4}}{h16})?::{ls32}"),
        format!("(({h16}:){{0,5}}{h16})?::{h16}"),
        format!("(({h16}:){{0,6}}{h16})?::"),
    ]
    .join("|");
    // Up to 30 characters, without `--` as the third and fourth: such labels are reserved
    // (RFC 5891 §4.2.3.1) and `xn--` ones are IDNA A-labels, valid only when their
    // Punycode decodes to a valid U-label — refused whole (stricter, never looser).
    let ad = "[A-Za-z0-9]";
    let adh = "[A-Za-z0-9-]";
    let label =
        format!("{ad}({adh}?{ad})?|{ad}{adh}{adh}{ad}|{ad}{adh}({ad}{adh}|-{ad}){adh}{{0,25}}{ad}");
    let label = format!("({label})");
    let sub_delims = r"!$&'()*+,;=";
    let pct = "%[0-9A-Fa-f]{2}";
    // RFC 3986 (URI) and RFC 3987 (IRI: `iunreserved` adds `ucschar`, `iquery` adds
    // `iprivate`); absolute form and relative reference.
    let uri_regexes = |ucs: &str, private: &str| {
        let unreserved = format!(r"A-Za-z0-9\-._~{ucs}");
        let pchar = format!("([{unreserved}{sub_delims}:@]|{pct})");
        let userinfo = format!("([{unreserved}{sub_delims}:]|{pct})*");
        let reg_name = format!("([{unreserved}{sub_delims}]|{pct})*");
        // The IP-literal stays ASCII in an IRI: `[` IPv6address or IPvFuture `]`.
        let ascii_unreserved = r"A-Za-z0-9\-._~";
        let ip_literal =
            format!(r"\[(({ipv6})|v[0-9A-Fa-f]+\.[{ascii_unreserved}{sub_delims}:]+)\]");
        let authority = format!("({userinfo}@)?({ip_literal}|{reg_name}|{ipv4})(:[0-9]*)?");
        let path_abempty = format!("(/{pchar}*)*");
        let path_rootless = format!("{pchar}+(/{pchar}*)*");
        let query = format!("(\\?({pchar}|[/?{private}])*)?(#({pchar}|[/?])*)?");
        let absolute = format!(
            "[A-Za-z][A-Za-z0-9+.\\-]*:(//{authority}{path_abempty}|/({path_rootless})?|{path_rootless}|){query}"
        );
        let seg_nc = format!("([{unreserved}{sub_delims}@]|{pct})+");
        let relative = format!(
            "(//{authority}{path_abempty}|/({path_rootless})?|{seg_nc}(/{pchar}*)*|){query}"
        );
        (absolute, relative)
    };
    Some(match format {
        "date-time" => format!("{date}[Tt]{time}"),
        "date" => date,
        "time" => time.to_string(),
        "email" => email_regex(""),
        // RFC 6531 §3.3: `atext` also takes every non-ASCII character; the domain is kept to
        // ASCII labels (an A-label domain; U-labels would need IDNA2008's tables).
        "idn-email" => email_regex(r"\x{80}-\x{10FFFF}"),
        "uuid" => "[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
            .to_string(),
        "ipv4" => ipv4,
        "ipv6" => ipv6,
        "hostname" => format!("{label}(\\.{label}){{0,7}}"),
        "duration" => duration_regex(),
        "uri" => uri_regexes("", "").0,
        "uri-reference" => {
            let (uri, relative) = uri_regexes("", "");
            format!("{uri}|{relative}")
        }
        "iri" => uri_regexes(UCSCHAR, IPRIVATE).0,
        "iri-reference" => {
            let (iri, relative) = uri_regexes(UCSCHAR, IPRIVATE);
            format!("{iri}|{relative}")
        }
        "json-pointer" => "(/([^~/]|~[01])*)*".to_string(),
        // A non-negative integer, then `#` or a JSON pointer.
        "relative-json-pointer" => "(0|[1-9][0-9]*)(#|(/([^~/]|~[01])*)*)".to_string(),
        "uri-template" => uri_template_regex(pct),
        "regex" => {
            // ~250 KB of regex text: built once per process.
            static RE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
            RE.get_or_init(|| regex_syntax(REGEX_FORMAT_DEPTH, false))
                .clone()
        }
        // Known formats whose exact check is not expressed here.
        "idn-hostname" => return None,
        _ => String::new(),
    })
}

/// RFC 5321 `Mailbox` with a dot-atom local part (quoted strings and address literals are
/// refused) over a domain of at least two RFC 1123 labels; `extra` adds characters to
/// `atext`.
fn email_regex(extra: &str) -> String {
    let atext = format!("[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~{extra}-]");
    let label = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    format!(r"{atext}+(\.{atext}+)*@{label}(\.{label})+")
}

/// Groups nested deeper than this are not part of the `regex` format's language.
const REGEX_FORMAT_DEPTH: usize = 3;

/// The nesting depth of the `regex` format beside a `pattern`: their intersection is a
/// product of DFAs, and the full language's DFA is past the size limit.
const REGEX_FORMAT_PRODUCT_DEPTH: usize = 1;

/// The regex of `format` where it is intersected with a `pattern`: the `regex`
/// format with groups nested at most [`REGEX_FORMAT_PRODUCT_DEPTH`] deep (a subset: stricter,
/// never looser), any other as [`format_regex`] gives it.
pub(crate) fn format_regex_in_product(format: &str) -> Option<String> {
    if format == "regex" {
        static RE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        return Some(
            RE.get_or_init(|| regex_syntax(REGEX_FORMAT_PRODUCT_DEPTH, true))
                .clone(),
        );
    }
    format_regex(format)
}

/// The `regex` format: a subset of the regular expressions that are valid both in
/// ECMA-262 (with and without the `u` flag: what JSON Schema names) and in Python's `re`
/// (what `python-jsonschema` checks with), so every string it admits is a valid regex to
/// either (stricter than the spec, never looser; its complement is therefore refused).
/// - Terms: literal characters (all but `\ ^ $ . | ? * + ( ) [ ] { }`), `.`, escapes
///   (`\d \D \w \W \s \S \n \r \t \f \v`, `\xHH`, `\uHHHH`, and `\` before a syntax
///   character or `/`), classes, groups `( )` and `(?: )` nested at most
///   [`REGEX_FORMAT_DEPTH`] deep, each optionally quantified (`* + ?`, `{n}` and `{n,}` up to
///   9,999, `{n,m}` with n ≤ 99 and n ≤ m ≤ 9,999; then an optional lazy `?`).
/// - Assertions, never quantified (Python refuses `^*`; ECMA's `u` mode a quantified
///   lookahead): `^`, `$`, `\b`, `\B`, and outside groups lookaheads `(?= )` and `(?! )`.
/// - Classes: `[`, an optional `^`, an optional leading `-`, one or more items, an optional
///   trailing `-`, `]`. Items: a character other than `\ ] [ - ^` (`[^]` is a class to ECMA,
///   an error to Python), an escape (as above, plus `\b` and `\-`), or a range between two
///   digits, two upper-case or two lower-case letters in order (`[z-a]` is an error to both).
/// - Alternatives `|` anywhere, empty ones included (`(|a)`, `a|`).
///
/// Left out: backreferences and named groups (spelled differently in the two), lookbehinds,
/// inline flags, `\0`, `\c`, `\k`, `\p`, `\u{…}`, literal `]`, `{` and `}` (errors with
/// ECMA's `u` flag), ranges between other characters.
///
/// With `small`, a subset whose DFA fits a product with a pattern: ranges only `0-9`, `1-9`,
/// `0-7`, `a-z`, `A-Z`, `a-f`, `A-F`; counts below 100 and `{n,m}` with single digits.
fn regex_syntax(max_depth: usize, small: bool) -> String {
    let hex = "[0-9A-Fa-f]";
    let syntax = r"\\^$.|?*+()\[\]{}/";
    let escape = format!(r"\\([dDwWsSnrtfv]|[{syntax}]|x{hex}{{2}}|u{hex}{{4}})");
    let class_escape = format!(r"\\([dDwWsSnrtfvb]|[{syntax}\-]|x{hex}{{2}}|u{hex}{{4}})");
    let mut ranges = Vec::new();
    if small {
        for r in ["0-9", "1-9", "0-7", "a-z", "A-Z", "a-f", "A-F"] {
            ranges.push(r.to_string());
        }
    } else {
        for (lo, hi) in [('0', '9'), ('A', 'Z'), ('a', 'z')] {
            for c in lo..=hi {
                ranges.push(format!("{c}-[{c}-{hi}]"));
            }
        }
    }
    let ranges = ranges.join("|");
    let class = format!(r"\[\^?-?({ranges}|[^\\\]\[\-^]|{class_escape})+-?\]");
    // Counts up to 9,999; `{n,m}` needs n ≤ m, written per n (n ≤ 99): m of n's length
    // and not below it, or longer.
    let count = if small {
        "(0|[1-9][0-9]?)"
    } else {
        "(0|[1-9][0-9]{0,3})"
    };
    let mut bounded = Vec::new();
    for n in 0..=9u32 {
        if small {
            bounded.push(format!(r"{n},[{n}-9]"));
        } else {
            bounded.push(format!(r"{n},([{n}-9]|[1-9][0-9]{{1,3}})"));
        }
    }
    for a in (1..=9u32).filter(|_| !small) {
        let higher = if a < 9 {
            format!("|[{}-9][0-9]", a + 1)
        } else {
            String::new()
        };
        let lows: Vec<String> = (0..=9u32)
            .map(|b| format!(r"{b},({a}[{b}-9]{higher}|[1-9][0-9]{{2,3}})"))
            .collect();
        bounded.push(format!("{a}({})", lows.join("|")));
    }
    let quant = format!(r"([*+?]|\{{({count}|{count},|{})\}})\??", bounded.join("|"));
    let literal = r"[^\\^$.|?*+()\[\]{}]";
    let assertion = r"[\^$]|\\[bB]";
    let mut alt = String::new();
    for depth in 0..=max_depth {
        // Groups at every level; lookaheads at the outermost only (each copy of the level
        // below doubles the automaton: inside a group, they would make it too large).
        let group = if depth == 0 {
            String::new()
        } else {
            format!(r"|\((\?:)?({alt})\)")
        };
        let lookahead = if depth == max_depth {
            format!(r"|\(\?[=!]({alt})\)")
        } else {
            String::new()
        };
        let atom = format!(r"({literal}|\.|{escape}|{class}{group})");
        let term = format!("({atom}({quant})?|{assertion}{lookahead})");
        alt = format!(r"({term})*(\|({term})*)*");
    }
    alt
}

/// Every host name RFC 1123 §2.1 allows, but for the total length (at most 253 characters,
/// RFC 1034): labels of letters, digits and inner hyphens, 1 to 63 characters, separated by
/// dots (no trailing dot). The `hostname` format itself is enforced stricter (labels ≤ 30,
/// ≤ 8 labels); this regex is what its complement excludes, so the complement is exact.
pub(crate) fn hostname_rfc_regex() -> String {
    let label = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    format!("{label}(\\.{label})*")
}

/// A regex (full match) for a superset of the texts a format's RFC accepts, for the formats
/// enforced stricter than their RFC (or not at all): the complement of a format is written as
/// "outside this superset", so it stays within the texts the RFC refuses (some invalid text
/// may be refused by the complement, never a valid one admitted). `None` for formats with no
/// such superset written here.
/// - `date-time`, `time`: RFC 3339 with a leap second (`:60`) at any minute and offset (the
///   format itself refuses every leap second).
/// - `email`, `idn-email`: something, `@`, something (RFC 5321/5322 and RFC 6531 addresses
///   all have a non-empty local part and domain around an `@`).
pub(crate) fn format_superset_regex(format: &str) -> Option<String> {
    let time = r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    Some(match format {
        "date-time" => format!("{}[Tt]{time}", date_regex()),
        "time" => time.to_string(),
        "email" | "idn-email" => r"[\s\S]+@[\s\S]+".to_string(),
        _ => return None,
    })
}

/// Longest host name (RFC 1034: 255 octets on the wire, 253 characters written out).
pub(crate) const HOSTNAME_MAX_LEN: u64 = 253;

/// RFC 3339 Appendix A `duration` (ABNF literals are case-insensitive, RFC 5234 §2.3).
fn duration_regex() -> String {
    let n = "[0-9]+";
    let second = format!("{n}[Ss]");
    let minute = format!("{n}[Mm]({second})?");
    let hour = format!("{n}[Hh]({minute})?");
    let time = format!("[Tt]({hour}|{minute}|{second})");
    let day = format!("{n}[Dd]");
    let month = format!("{n}[Mm]({day})?");
    let year = format!("{n}[Yy]({month})?");
    let date = format!("({day}|{month}|{year})({time})?");
    format!("[Pp]({date}|{time}|{n}[Ww])")
}

/// RFC 3339 full-date with real month lengths and leap years.
fn date_regex() -> String {
    let y = "[0-9]{4}";
    let leap = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)";
    format!(
        "({y}-(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|{y}-(0[469]|11)-(0[1-9]|[12][0-9]|30)|{y}-02-(0[1-9]|1[0-9]|2[0-8])|{leap}-02-29)"
    )
}

/// Regex alternatives for the decimal numbers `lo..=hi` (both ≥ 0), canonical (no leading
/// zeros).
pub(crate) fn uint_range(lo: u64, hi: Option<u64>) -> String {
    let hi = hi.map(|h| h.to_string());
    uint_range_digits(&lo.to_string(), hi.as_deref())
}

/// [`uint_range`] over canonical digit strings, so bounds of any size are exact (a
/// `minimum` of `1e20`, a `maximum` of `18446744073709551615`).
pub(crate) fn uint_range_digits(lo: &str, hi: Option<&str>) -> String {
    let mut alts = Vec::new();
    let lo_len = lo.len();
    let ones = |len: usize| format!("1{}", "0".repeat(len - 1));
    let nines = |len: usize| "9".repeat(len);
    match hi {
        Some(hi) => {
            if cmp_digits(lo, hi) == std::cmp::Ordering::Greater {
                return "[^\\s\\S]".to_string();
            }
            if lo_len == hi.len() {
                alts.push(same_len(lo.as_bytes(), hi.as_bytes()));
            } else {
                alts.push(same_len(lo.as_bytes(), nines(lo_len).as_bytes()));
                // Every length strictly between, in one alternative (bounds of hundreds of
                // digits stay linear in size).
                if hi.len() > lo_len + 1 {
                    alts.push(format!("[1-9][0-9]{{{},{}}}", lo_len, hi.len() - 2));
                }
                alts.push(same_len(ones(hi.len()).as_bytes(), hi.as_bytes()));
            }
        }
        None => {
            alts.push(same_len(lo.as_bytes(), nines(lo_len).as_bytes()));
            alts.push(format!("[1-9][0-9]{{{},}}", lo_len));
        }
    }
    format!("({})", alts.join("|"))
}

/// Compares canonical digit strings (no leading zeros) as numbers.
pub(crate) fn cmp_digits(a: &str, b: &str) -> std::cmp::Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// `a + 1` for a canonical digit string.
pub(crate) fn inc_digits(a: &str) -> String {
    let mut d = a.as_bytes().to_vec();
    for c in d.iter_mut().rev() {
        if *c == b'9' {
            *c = b'0';
        } else {
            *c += 1;
            return String::from_utf8(d).expect("digits");
        }
    }
    format!("1{}", String::from_utf8(d).expect("digits"))
}

/// `a - 1` for a canonical digit string above zero.
pub(crate) fn dec_digits(a: &str) -> String {
    let mut d = a.as_bytes().to_vec();
    for c in d.iter_mut().rev() {
        if *c == b'0' {
            *c = b'9';
        } else {
            *c -= 1;
            break;
        }
    }
    let t = String::from_utf8(d).expect("digits");
    let t = t.trim_start_matches('0');
    if t.is_empty() {
        "0".into()
    } else {
        t.into()
    }
}

/// Numbers with exactly `lo.len()` digits between `lo` and `hi` (same length).
fn same_len(lo: &[u8], hi: &[u8]) -> String {
    if lo.is_empty() {
        return String::new();
    }
    let (l0, h0) = (lo[0], hi[0]);
    if l0 == h0 {
        return format!("{}{}", l0 as char, same_len(&lo[1..], &hi[1..]));
    }
    let n = lo.len() - 1;
    let nines = vec![b'9'; n];
    let zeros = vec![b'0'; n];
    let mut alts = Vec::new();
    if lo[1..].iter().all(|&c| c == b'0') && hi[1..].iter().all(|&c| c == b'9') {
        return format!("[{}-{}][0-9]{{{}}}", l0 as char, h0 as char, n);
    }
    alts.push(format!("{}{}", l0 as char, same_len(&lo[1..], &nines)));
    if h0 - l0 > 1 {
        alts.push(format!(
            "[{}-{}][0-9]{{{}}}",
            (l0 + 1) as char,
            (h0 - 1) as char,
            n
        ));
    }
    alts.push(format!("{}{}", h0 as char, same_len(&zeros, &hi[1..])));
    format!("({})", alts.join("|"))
}

/// Regex for integers in `lo..=hi` (either side open).
#[cfg(test)]
pub(crate) fn int_range(lo: Option<i64>, hi: Option<i64>) -> String {
    let sig = |v: i64| (v < 0, v.unsigned_abs().to_string());
    let (lo, hi) = (lo.map(sig), hi.map(sig));
    int_range_digits(
        lo.as_ref().map(|(n, d)| (*n, d.as_str())),
        hi.as_ref().map(|(n, d)| (*n, d.as_str())),
    )
}

/// [`int_range`] over signed canonical digit strings (`(negative, magnitude)`, zero never
/// negative), so bounds of any size are exact.
pub(crate) fn int_range_digits(lo: Option<(bool, &str)>, hi: Option<(bool, &str)>) -> String {
    let mut alts = Vec::new();
    // Non-negative part.
    if hi.is_none_or(|(neg, _)| !neg) {
        let a = match lo {
            Some((false, l)) => l,
            _ => "0",
        };
        alts.push(uint_range_digits(a, hi.map(|(_, h)| h)));
    }
    // Negative part: magnitudes.
    if lo.is_none_or(|(neg, _)| neg) {
        let m_lo = match hi {
            Some((true, h)) => h,
            _ => "1",
        };
        alts.push(format!("-{}", uint_range_digits(m_lo, lo.map(|(_, l)| l))));
    }
    if alts.is_empty() {
        return "[^\\s\\S]".to_string();
    }
    format!("({})", alts.join("|"))
}

/// Regex for decimal numbers (no exponent) `x` with integer-valued bounds.
pub(crate) fn number_range(lo: Option<(i64, bool)>, hi: Option<(i64, bool)>) -> String {
    const ANY: &str = r"(\.[0-9]+)?";
    const ZERO: &str = r"(\.0+)?";
    const NONZERO: &str = r"\.[0-9]*[1-9][0-9]*";
    // Magnitude intervals on each side: (A, A inclusive, B, B inclusive) with B None = ∞.
    fn side(a: u64, a_inc: bool, b: Option<(u64, bool)>) -> Vec<String> {
        let mut v = Vec::new();
        match b {
            Some((b, b_inc)) if b == a => {
                if a_inc && b_inc {
                    v.push(format!("{a}{ZERO}"));
                }
            }
            Some((b, _)) if b < a => {}
            _ => {
                v.push(format!("{a}{}", if a_inc { ANY } else { NONZERO }));
                match b {
                    Some((b, b_inc)) => {
                        if b > a + 1 {
                            v.push(format!("{}{ANY}", uint_range(a + 1, Some(b - 1))));
                        }
                        if b_inc {
                            v.push(format!("{b}{ZERO}"));
                        }
                    }
                    None => v.push(format!("{}{ANY}", uint_range(a + 1, None))),
                }
            }
        }
        v
    }
    let mut alts = Vec::new();
    // Non-negative values written without a sign.
    let pos_hi = hi;
    if pos_hi.is_none_or(|(h, inc)| h > 0 || (h == 0 && inc)) {
        let (a, a_inc) = match lo {
            Some((l, inc)) if l >= 0 => (l as u64, inc),
            _ => (0, true),
        };
        let b = pos_hi.map(|(h, inc)| (h.max(0) as u64, inc));
        alts.extend(side(a, a_inc, b));
    }
    // Negative values: "-" then magnitude m with -m in range.
    if lo.is_none_or(|(l, inc)| l < 0 || (l == 0 && inc)) {
        let (a, a_inc) = match hi {
            Some((h, inc)) if h <= 0 => (h.unsigned_abs(), inc),
            _ => (0, true),
        };
        let b = lo.map(|(l, inc)| (l.min(0).unsigned_abs(), inc));
        for s in side(a, a_inc, b) {
            alts.push(format!("-{s}"));
        }
    }
    if alts.is_empty() {
        return "[^\\s\\S]".to_string();
    }
    format!("({})", alts.join("|"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex_automata::meta::Regex;

    fn full(re: &str) -> Regex {
        Regex::new(&format!("^(?:{re})$")).unwrap()
    }

    #[test]
    fn int_ranges_are_exact() {
        for (lo, hi) in [
            (Some(0), Some(0)),
            (Some(-13), Some(250)),
            (Some(7), None),
            (None, Some(-3)),
            (Some(100), Some(999)),
            (Some(5), Some(4)),
        ] {
            let r = full(&int_range(lo, hi));
            for x in -400i64..1200 {
                let want = lo.is_none_or(|l| x >= l) && hi.is_none_or(|h| x <= h);
                assert_eq!(r.is_match(&x.to_string()), want, "{lo:?}..{hi:?} {x}");
            }
            assert!(!r.is_match("007"));
        }
    }

    #[test]
    fn number_ranges_are_exact() {
        let cases = [
            (Some((0, true)), Some((1, true))),
            (Some((0, false)), None),
            (None, Some((100, false))),
            (Some((-5, true)), Some((5, false))),
            (Some((-3, false)), Some((-1, true))),
        ];
        for (lo, hi) in cases {
            let r = full(&number_range(lo, hi));
            for x in -700i64..1200 {
                for s in [
                    format!("{}", x as f64 / 7.0),
                    format!("{}", x / 7),
                    format!("{}.0", x / 7),
                ] {
                    let v: f64 = s.parse().unwrap();
                    let want = lo
                        .is_none_or(|(l, inc)| if inc { v >= l as f64 } else { v > l as f64 })
                        && hi.is_none_or(|(h, inc)| if inc { v <= h as f64 } else { v < h as f64 });
                    if s == "-0" || s == "-0.0" {
                        continue;
                    }
                    assert_eq!(r.is_match(&s), want, "{lo:?}..{hi:?} {s}");
                }
            }
        }
    }

    #[test]
    fn dates() {
        let r = full(&date_regex());
        assert!(r.is_match("2024-02-29"));
        assert!(!r.is_match("2023-02-29"));
        assert!(r.is_match("2000-02-29"));
        assert!(!r.is_match("1900-02-29"));
        assert!(!r.is_match("2023-04-31"));
        assert!(r.is_match("2023-12-31"));
    }
}

/// A decimal bound split for regex building: sign, integer part, fraction digits (no
/// trailing zeros).
pub(crate) struct Dec {
    /// Below zero.
    pub neg: bool,
    /// The integer part of the magnitude: canonical digits (`"0"` for none).
    pub int: String,
    /// The fraction digits of the magnitude, trailing zeros removed.
    pub frac: Vec<u8>,
}

/// Most digits a bound's integer or fraction part may have (an `f64` needs at most 309
/// and 340; a decimal literal past that is refused by name).
const MAX_DEC_DIGITS: usize = 400;

impl Dec {
    /// From `mantissa * 10^exp` (see `check::decimal`); `None` past [`MAX_DEC_DIGITS`].
    pub(crate) fn new(m: i128, exp: i32) -> Option<Dec> {
        let neg = m < 0;
        let mag = m.unsigned_abs();
        let digits = mag.to_string();
        if exp.unsigned_abs() as usize > MAX_DEC_DIGITS {
            return None;
        }
        let (int, frac) = if exp >= 0 {
            let s = format!("{digits}{}", "0".repeat(exp as usize));
            (s, String::new())
        } else {
            let k = (-exp) as usize;
            let padded = format!("{}{digits}", "0".repeat(k.saturating_sub(digits.len())));
            let cut = padded.len() - k;
            (padded[..cut].to_string(), padded[cut..].to_string())
        };
        let int = int.trim_start_matches('0');
        let int = if int.is_empty() {
            "0".to_string()
        } else {
            int.to_string()
        };
        if int.len() > MAX_DEC_DIGITS {
            return None;
        }
        let frac: Vec<u8> = frac.trim_end_matches('0').bytes().collect();
        let zero = int == "0" && frac.is_empty();
        Some(Dec {
            neg: neg && !zero,
            int,
            frac,
        })
    }

    /// Compares two decimals as numbers.
    pub(crate) fn cmp_value(&self, other: &Dec) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        let magnitude = cmp_digits(&self.int, &other.int).then_with(|| self.frac.cmp(&other.frac));
        match (self.neg, other.neg) {
            (false, false) => magnitude,
            (true, true) => magnitude.reverse(),
            (false, true) => Ordering::Greater,
            (true, false) => Ordering::Less,
        }
    }
}

/// Fraction digit strings `s` (the digits after the point) compared with `f` as `0.s ? 0.f`:
/// whether the empty fraction qualifies, and a regex for the non-empty ones (`None` = none).
type Frac = (bool, Option<String>);

fn cls(lo: u8, hi: u8) -> Option<String> {
    (lo <= hi).then(|| format!("[{}-{}][0-9]*", lo as char, hi as char))
}

fn alt(parts: Vec<Option<String>>) -> Option<String> {
    let v: Vec<String> = parts.into_iter().flatten().collect();
    (!v.is_empty()).then(|| format!("({})", v.join("|")))
}

fn opt(empty: bool, ne: Option<String>) -> Option<String> {
    match (empty, ne) {
        (true, Some(r)) => Some(format!("({r})?")),
        (true, None) => Some(String::new()),
        (false, r) => r,
    }
}

fn frac_ge(f: &[u8], strict: bool) -> Frac {
    let Some((&f1, rest)) = f.split_first() else {
        return if strict {
            (false, Some("[0-9]*[1-9][0-9]*".into()))
        } else {
            (true, Some("[0-9]+".into()))
        };
    };
    let tail = if rest.is_empty() && !strict {
        Some("[0-9]*".to_string())
    } else {
        let (e, ne) = frac_ge(rest, strict);
        opt(e, ne)
    };
    let d = f1 - b'0';
    let ne = alt(vec![
        cls(b'0' + d + 1, b'9'),
        tail.map(|t| format!("{}{t}", f1 as char)),
    ]);
    (false, ne)
}

fn frac_le(f: &[u8], strict: bool) -> Frac {
    let Some((&f1, rest)) = f.split_first() else {
        return if strict {
            (false, None)
        } else {
            (true, Some("0+".into()))
        };
    };
    let tail = if rest.is_empty() {
        if strict {
            Some(String::new()).filter(|_| false)
        } else {
            Some("0*".to_string())
        }
    } else {
        let (e, ne) = frac_le(rest, strict);
        opt(e, ne)
    };
    let d = f1 - b'0';
    let ne = alt(vec![
        if d > 0 { cls(b'0', b'0' + d - 1) } else { None },
        tail.map(|t| format!("{}{t}", f1 as char)),
    ]);
    (true, ne)
}

fn frac_text((empty, ne): Frac) -> Option<String> {
    opt(empty, ne.map(|r| format!(r"\.{r}")))
}

/// Regex (no exponent) for numbers `x >= b` (`x > b` when `strict`).
pub(crate) fn dec_ge(b: &Dec, strict: bool) -> String {
    const ANY: &str = r"(\.[0-9]+)?";
    let a = b.int.as_str();
    let parts = if !b.neg {
        vec![
            Some(format!("{}{ANY}", uint_range_digits(&inc_digits(a), None))),
            frac_text(frac_ge(&b.frac, strict)).map(|t| format!("{a}{t}")),
        ]
    } else {
        let mut neg = vec![
            (a != "0").then(|| format!("{}{ANY}", uint_range_digits("0", Some(&dec_digits(a))))),
            frac_text(frac_le(&b.frac, strict)).map(|t| format!("{a}{t}")),
        ];
        neg.retain(|x| x.is_some());
        vec![
            Some(format!("{}{ANY}", uint_range(0, None))),
            alt(neg).map(|n| format!("-{n}")),
        ]
    };
    alt(parts).unwrap_or_else(|| "[^\\s\\S]".into())
}

/// Regex (no exponent) for numbers `x <= b` (`x < b` when `strict`).
pub(crate) fn dec_le(b: &Dec, strict: bool) -> String {
    const ANY: &str = r"(\.[0-9]+)?";
    let a = b.int.as_str();
    let parts = if !b.neg {
        vec![
            // Negative values, `-0` forms excluded (they equal 0: stricter, never looser).
            Some(r"-(0\.[0-9]*[1-9][0-9]*|[1-9][0-9]*(\.[0-9]+)?)".to_string()),
            (a != "0").then(|| format!("{}{ANY}", uint_range_digits("0", Some(&dec_digits(a))))),
            frac_text(frac_le(&b.frac, strict)).map(|t| format!("{a}{t}")),
        ]
    } else {
        vec![
            Some(format!("-{}{ANY}", uint_range_digits(&inc_digits(a), None))),
            frac_text(frac_ge(&b.frac, strict)).map(|t| format!("-{a}{t}")),
        ]
    };
    alt(parts).unwrap_or_else(|| "[^\\s\\S]".into())
}

#[cfg(test)]
mod dec_tests {
    use super::*;

    fn full(re: &str) -> regex_automata::meta::Regex {
        regex_automata::meta::Regex::new(&format!("^({re})$")).unwrap()
    }

    #[test]
    fn decimal_bounds_match_brute_force() {
        let texts: Vec<String> = {
            let mut v = Vec::new();
            for i in 0..=30 {
                for fr in ["", ".0", ".5", ".05", ".25", ".250", ".3", ".99", ".001"] {
                    v.push(format!("{i}{fr}"));
                    v.push(format!("-{i}{fr}"));
                }
            }
            v
        };
        for (m, e) in [
            (25i128, -1i32),
            (-25, -1),
            (5, -2),
            (-5, -2),
            (3, 0),
            (0, 0),
            (-7, 0),
            (125, -2),
        ] {
            let b = Dec::new(m, e).unwrap();
            let bv = m as f64 * 10f64.powi(e);
            for strict in [false, true] {
                let ge = full(&dec_ge(&b, strict));
                let le = full(&dec_le(&b, strict));
                for t in &texts {
                    let x: f64 = t.parse().unwrap();
                    let want_ge = if strict { x > bv } else { x >= bv };
                    let want_le = if strict { x < bv } else { x <= bv };
                    // -0 forms may be refused (stricter), never wrongly accepted.
                    let neg_zero = t.starts_with('-') && x == 0.0;
                    if !neg_zero || !want_ge {
                        assert_eq!(ge.is_match(t), want_ge, "{t} >= {bv} strict={strict}");
                    } else {
                        assert!(!ge.is_match(t) || want_ge);
                    }
                    if !neg_zero || !want_le {
                        assert_eq!(le.is_match(t), want_le, "{t} <= {bv} strict={strict}");
                    } else {
                        assert!(!le.is_match(t) || want_le);
                    }
                }
            }
        }
    }
    /// Bounds past `u64` and `f64`'s exact integers (`1e20`, 2^64 - 1, 10^40 ± a little)
    /// against exact `i128` comparisons on texts around them.
    #[test]
    fn bounds_of_any_size_are_exact() {
        let bounds: [(i128, i32); 6] = [
            (1, 20),
            (18446744073709551615, 0),
            (-18446744073709551615, 0),
            (9007199254740993, 0),
            (123456789012345678901234567, -7),
            (-5, 19),
        ];
        for (m, e) in bounds {
            let b = Dec::new(m, e).unwrap();
            // The bound scaled to units of 10^-8 (every text below has at most 8 decimals).
            let scaled = |mm: i128, ee: i32| mm * 10i128.pow((ee + 8) as u32);
            let bv = scaled(m, e);
            let mut texts = Vec::new();
            for delta in [
                -100_000_001i128,
                -100_000_000,
                -50_000_000,
                -1,
                0,
                1,
                50_000_000,
                100_000_000,
            ] {
                let v = bv + delta;
                let (neg, mag) = (v < 0, v.unsigned_abs());
                let (int, frac) = (mag / 100_000_000, mag % 100_000_000);
                let sign = if neg { "-" } else { "" };
                texts.push((format!("{sign}{int}.{frac:08}"), v));
                if frac == 0 {
                    texts.push((format!("{sign}{int}"), v));
                }
            }
            texts.push(("0".into(), 0));
            texts.push((
                "99999999999999999999999999999".into(),
                scaled(99999999999999999999999999999, 0),
            ));
            texts.push((
                "-99999999999999999999999999999".into(),
                scaled(-99999999999999999999999999999, 0),
            ));
            for strict in [false, true] {
                let ge = full(&dec_ge(&b, strict));
                let le = full(&dec_le(&b, strict));
                for (t, v) in &texts {
                    let want_ge = if strict { *v > bv } else { *v >= bv };
                    let want_le = if strict { *v < bv } else { *v <= bv };
                    assert_eq!(ge.is_match(t), want_ge, "{t} >= {m}e{e} strict={strict}");
                    assert_eq!(le.is_match(t), want_le, "{t} <= {m}e{e} strict={strict}");
                }
            }
        }
    }
}
