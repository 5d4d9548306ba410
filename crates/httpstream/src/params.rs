//! Query parameters as Go's `url.Values` writes them — pairs in order, repeated keys
//! kept (`command=sh&command=-c`), `+` for a space — for the requests the apiserver
//! forwards and the kubelet reads.

use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// One decoded key or value.
pub fn decode(raw: &str) -> String {
    percent_decode_str(&raw.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// A boolean parameter as Go's `strconv.ParseBool` reads it (the Python client sends
/// `True`/`False`); anything else is false.
pub fn flag(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// The decoded `(key, value)` pairs of a query string.
pub fn pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// `?k=v&...` for `pairs` (empty for none), every byte but letters and digits escaped.
pub fn encode(pairs: &[(String, String)]) -> String {
    let escape = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
    let joined: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
        .collect();
    if joined.is_empty() {
        String::new()
    } else {
        format!("?{}", joined.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_keys_and_spaces_survive_a_round_trip() {
        let given = pairs(Some("command=sh&command=-c&command=echo+a%20b&tty=1&x"));
        assert_eq!(
            given,
            [
                ("command", "sh"),
                ("command", "-c"),
                ("command", "echo a b"),
                ("tty", "1"),
                ("x", ""),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        let encoded = encode(&given);
        assert_eq!(pairs(encoded.strip_prefix('?')), given);
        assert_eq!(encode(&[]), "");
    }

    #[test]
    fn booleans_as_go_parses_them() {
        for yes in ["1", "t", "T", "true", "TRUE", "True"] {
            assert!(flag(yes), "{yes}");
        }
        for no in ["0", "false", "False", "", "yes", "tRuE"] {
            assert!(!flag(no), "{no}");
        }
    }
}
