//! Kubernetes' CEL `url` library: `url('https://example.com:80/a?k=v')` takes a string
//! that Go's `url.ParseRequestURI` accepts (an absolute URI or an absolute path) and
//! parses it as `url.Parse` does (the `#fragment` split off), and `getScheme`,
//! `getHost`, `getHostname`, `getPort`, `getEscapedPath` and `getQuery` take it apart;
//! `isURL` says whether `ParseRequestURI` accepts a string.

use std::collections::HashMap;

use cel::common::types::{CelBool, CelList, CelMap, CelMapKey, CelString, Type};
use cel::common::value::Val;
use cel::{DeclarationError, Env, ExecutionError};

static URL: Type = Type::new_unspecified_type("kubernetes.URL");

/// A parsed URL: what the getters answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    scheme: String,
    /// `host[:port]` as written (brackets kept around IPv6).
    host: String,
    /// The path, unescaped.
    path: String,
    /// The path as written, when that is not how [`escape`] would write `path`.
    raw_path: Option<String>,
    raw_query: String,
}

opaque!(Url, URL);

/// Registers the library on `env`.
pub fn extension(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(URL.to_owned())?;
    cel::add_overload!(env, fn url: (CelString) -> Result<Url>)?;
    cel::add_overload!(env, fn is_url: (CelString) -> CelBool, name = "isURL")?;
    cel::add_member_overload!(env, fn get_scheme: (Url) -> CelString, name = "getScheme")?;
    cel::add_member_overload!(env, fn get_host: (Url) -> CelString, name = "getHost")?;
    cel::add_member_overload!(env, fn get_hostname: (Url) -> CelString, name = "getHostname")?;
    cel::add_member_overload!(env, fn get_port: (Url) -> CelString, name = "getPort")?;
    cel::add_member_overload!(
        env,
        fn get_escaped_path: (Url) -> CelString,
        name = "getEscapedPath"
    )?;
    cel::add_member_overload!(env, fn get_query: (Url) -> CelMap, name = "getQuery")?;
    Ok(())
}

fn url(text: &CelString<'_>) -> Result<Url, ExecutionError> {
    let raw = text.inner();
    parse(raw, true)
        .and_then(|_| parse(raw, false))
        .map_err(|why| {
            ExecutionError::function_error(
                "url",
                format!(
                    "URL parse error during conversion from string: parse {:?}: {why}",
                    text.inner()
                ),
            )
        })
}

fn is_url(text: &CelString<'_>) -> CelBool {
    CelBool::from(parse(text.inner(), true).is_ok())
}

fn get_scheme(this: &Url) -> CelString<'static> {
    CelString::from(this.scheme.clone())
}

fn get_host(this: &Url) -> CelString<'static> {
    CelString::from(this.host.clone())
}

fn get_hostname(this: &Url) -> CelString<'static> {
    let host = split_port(&this.host).0;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    CelString::from(host.to_string())
}

fn get_port(this: &Url) -> CelString<'static> {
    CelString::from(split_port(&this.host).1.to_string())
}

fn get_escaped_path(this: &Url) -> CelString<'static> {
    if this.path == "*" {
        return CelString::from("*".to_string());
    }
    let valid = this.raw_path.as_deref().filter(|raw| {
        valid_encoded(raw) && unescape(raw, Mode::Path).is_ok_and(|p| p == this.path)
    });
    CelString::from(valid.map_or_else(|| escape(&this.path), str::to_string))
}

fn get_query(this: &Url) -> CelMap<'static> {
    let mut query: Vec<(String, Vec<String>)> = Vec::new();
    for (key, value) in parse_query(&this.raw_query) {
        match query.iter_mut().find(|(k, _)| *k == key) {
            Some((_, values)) => values.push(value),
            None => query.push((key, vec![value])),
        }
    }
    let map: HashMap<CelMapKey<'static>, Box<dyn Val>> = query
        .into_iter()
        .map(|(key, values)| {
            let list: Vec<Box<dyn Val>> = values
                .into_iter()
                .map(|v| Box::new(CelString::from(v)) as Box<dyn Val>)
                .collect();
            (
                CelMapKey::from(key),
                Box::new(CelList::from(list)) as Box<dyn Val>,
            )
        })
        .collect();
    CelMap::from(map)
}

/// Go's `url.ParseRequestURI` (`via_request`: an absolute URI — `scheme:` with
/// `//authority` and an absolute path, or opaque — or an absolute path, the whole string
/// taken as written) or `url.Parse` (the `#fragment` cut off first, `//authority`
/// without a scheme too). The error is Go's, after `parse "..": `.
fn parse(raw: &str, via_request: bool) -> Result<Url, String> {
    if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("net/url: invalid control character in URL".into());
    }
    if raw.is_empty() && via_request {
        return Err("empty url".into());
    }
    let raw = if via_request {
        raw
    } else {
        let (before, fragment) = raw.split_once('#').unwrap_or((raw, ""));
        unescape(fragment, Mode::Path)?;
        before
    };
    let mut url = Url {
        scheme: String::new(),
        host: String::new(),
        path: String::new(),
        raw_path: None,
        raw_query: String::new(),
    };
    if raw == "*" {
        url.path = "*".into();
        return Ok(url);
    }
    let (scheme, rest) = split_scheme(raw)?;
    url.scheme = scheme.to_ascii_lowercase();
    let rest = match rest.strip_suffix('?') {
        Some(before) if rest.matches('?').count() == 1 => before,
        _ => match rest.split_once('?') {
            Some((before, query)) => {
                url.raw_query = query.to_string();
                before
            }
            None => rest,
        },
    };
    if !rest.starts_with('/') {
        if url.scheme.is_empty() {
            return Err("invalid URI for request".into());
        }
        // Opaque (`mailto:someone`): nothing the getters take apart.
        return Ok(url);
    }
    let mut path = rest;
    let authority = !url.scheme.is_empty() || (!via_request && !rest.starts_with("///"));
    if authority && let Some(after) = rest.strip_prefix("//") {
        let (authority, remainder) = after.split_at(after.find('/').unwrap_or(after.len()));
        url.host = parse_authority(authority)?;
        path = remainder;
    }
    url.path = unescape(path, Mode::Path)?;
    url.raw_path = (escape(&url.path) != path).then(|| path.to_string());
    Ok(url)
}

/// A leading `scheme:`, if the string has one.
fn split_scheme(raw: &str) -> Result<(&str, &str), String> {
    for (i, b) in raw.bytes().enumerate() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i == 0 => return Err("missing protocol scheme".into()),
            b':' => return Ok((&raw[..i], &raw[i + 1..])),
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

/// `[userinfo@]host[:port]`: the host with its port (user information is dropped).
fn parse_authority(authority: &str) -> Result<String, String> {
    let host = match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            if !userinfo
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._:~!$&'()*+,;=%@".contains(&b))
            {
                return Err("net/url: invalid userinfo".into());
            }
            unescape(userinfo, Mode::Path)?;
            &authority[at + 1..]
        }
        None => authority,
    };
    parse_host(host)
}

fn parse_host(host: &str) -> Result<String, String> {
    let port = if host.starts_with('[') {
        let close = host.rfind(']').ok_or("missing ']' in host")?;
        &host[close + 1..]
    } else {
        host.rfind(':').map_or("", |colon| &host[colon..])
    };
    if !valid_optional_port(port) {
        return Err(format!("invalid port {port:?} after host"));
    }
    unescape(host, Mode::Host)
}

/// `""` or `:digits`.
fn valid_optional_port(port: &str) -> bool {
    port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_digit()))
}

/// `host` and `port` of `host[:port]`, as Go's `splitHostPort`.
fn split_port(host: &str) -> (&str, &str) {
    match host.rfind(':') {
        Some(colon) if valid_optional_port(&host[colon..]) => (&host[..colon], &host[colon + 1..]),
        _ => (host, ""),
    }
}

/// The query's pairs in order, as Go's `url.ParseQuery` (pairs it cannot decode, or
/// with a semicolon, are skipped).
fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|part| !part.is_empty() && !part.contains(';'))
        .filter_map(|part| {
            let (key, value) = part.split_once('=').unwrap_or((part, ""));
            Some((
                unescape(key, Mode::QueryComponent).ok()?,
                unescape(value, Mode::QueryComponent).ok()?,
            ))
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Path,
    Host,
    QueryComponent,
}

/// Whether Go escapes `b` in a path (or refuses it in a host).
fn should_escape(b: u8, mode: Mode) -> bool {
    if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
        return false;
    }
    match mode {
        Mode::Host => !b"!$&'()*+,;=:[]<>\"".contains(&b),
        Mode::Path => !b"$&+,/:;=@".contains(&b),
        Mode::QueryComponent => true,
    }
}

fn unescape(s: &str, mode: Mode) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    // A host may escape only bytes beyond ASCII, and `%` itself.
                    .filter(|b| mode != Mode::Host || *b >= 0x80 || *b == b'%');
                let Some(byte) = hex else {
                    let end = (i + 3).min(bytes.len());
                    return Err(format!(
                        "invalid URL escape {:?}",
                        String::from_utf8_lossy(&bytes[i..end])
                    ));
                };
                out.push(byte);
                i += 3;
            }
            b'+' if mode == Mode::QueryComponent => {
                out.push(b' ');
                i += 1;
            }
            b if mode == Mode::Host && b < 0x80 && should_escape(b, mode) => {
                return Err(format!(
                    "invalid character {:?} in host name",
                    char::from(b).to_string()
                ));
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A path as Go escapes it.
fn escape(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if should_escape(b, Mode::Path) {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(char::from(b));
        }
    }
    out
}

/// Whether a path as written is a valid escaping (Go's `validEncoded`).
fn valid_encoded(raw: &str) -> bool {
    raw.bytes()
        .all(|b| b"!$&'()*+,;=:@[]%".contains(&b) || !should_escape(b, Mode::Path))
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use cel::Value;

    #[test]
    fn urls_come_apart_as_upstream_documents() {
        for (expr, want) in [
            ("url('https://example.com/').getScheme()", "https"),
            ("url('https://example.com:80/').getHost()", "example.com:80"),
            ("url('https://[::1]:80/').getHost()", "[::1]:80"),
            (
                "url('https://example.com:80/').getHostname()",
                "example.com",
            ),
            ("url('https://[::1]:80/').getHostname()", "::1"),
            ("url('https://example.com:80/').getPort()", "80"),
            ("url('https://example.com/').getPort()", ""),
            (
                "url('https://example.com/path with spaces/').getEscapedPath()",
                "/path%20with%20spaces/",
            ),
            (
                "url('https://example.com/a%2Fb').getEscapedPath()",
                "/a%2Fb",
            ),
            ("url('/absolute-path').getEscapedPath()", "/absolute-path"),
            ("url('HTTPS://example.com/').getScheme()", "https"),
            ("url('https://example.com/p#frag').getEscapedPath()", "/p"),
            ("url('//example.com/p').getHost()", "example.com"),
            ("url('*').getEscapedPath()", "*"),
        ] {
            assert_eq!(
                eval(expr),
                Ok(Value::String(want.to_string().into())),
                "{expr}"
            );
        }
        for (expr, want) in [
            ("isURL('https://example.com')", true),
            ("isURL('/absolute-path')", true),
            ("isURL('../relative-path')", false),
            (
                "isURL('https://example.com:80/path?query=val#fragment')",
                true,
            ),
            ("isURL('https://exa mple.com/')", false),
            ("isURL('https://example.com:8a/')", false),
            ("isURL('https://example.com/%zz')", false),
            ("isURL('')", false),
            ("isURL(':nothing')", false),
            (
                "url('https://example.com/?k=a&k=b&x=y').getQuery() == {'k': ['a', 'b'], 'x': ['y']}",
                true,
            ),
            (
                "url('https://example.com/?a+b=c%20d').getQuery() == {'a b': ['c d']}",
                true,
            ),
            ("url('https://example.com/').getQuery() == {}", true),
            (
                "url('https://example.com/?a=b#f').getQuery() == {'a': ['b']}",
                true,
            ),
            ("isURL('https://a%20b/')", false),
            ("isURL('https://example.com/%+1')", false),
            ("isURL('https://us%zzer@example.com/')", false),
            (
                "url('https://example.com') == url('https://example.com')",
                true,
            ),
        ] {
            assert_eq!(eval(expr), Ok(Value::Bool(want)), "{expr}");
        }
        let err = eval("url('../relative')").unwrap_err();
        assert!(
            err.contains("URL parse error during conversion from string: parse \"../relative\": invalid URI for request"),
            "{err}"
        );
    }
}
