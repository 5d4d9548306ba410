//! The apimachinery types whose JSON form is not their protobuf structure (they have a
//! `MarshalJSON` method in Go): `resource.Quantity`, `intstr.IntOrString`, `metav1.Time`,
//! `metav1.MicroTime`, `metav1.FieldsV1` and `runtime.RawExtension`; and the
//! authentication and authorization `ExtraValue`, a Go `[]string` that protobuf wraps in
//! a message.
//!
//! Each decoder takes the message's bytes in chunks (see [`super::wire::fields`]); no
//! chunks, or only empty ones, is the Go zero value.

use serde_json::Value;

use super::error::WireError;
use super::wire::fields;

/// `{string = 1}`: the quantity's canonical string, which Go clients always write.
/// The zero Quantity prints as "0".
pub(super) fn quantity(chunks: &[&[u8]]) -> Result<Value, WireError> {
    let mut value = "0".to_string();
    for field in fields(chunks) {
        if let (1, v) = field? {
            value = utf8(v.bytes(1)?);
        }
    }
    Ok(Value::String(value))
}

/// `{type = 1, intVal = 2, strVal = 3}`: a JSON number or string, by `type`.
pub(super) fn int_or_string(chunks: &[&[u8]]) -> Result<Value, WireError> {
    let (mut kind, mut int, mut string) = (0, 0, String::new());
    for field in fields(chunks) {
        match field? {
            (1, v) => kind = v.varint(1)? as i64,
            (2, v) => int = v.varint(2)? as i32,
            (3, v) => string = utf8(v.bytes(3)?),
            _ => {}
        }
    }
    match kind {
        0 => Ok(Value::from(int)),
        1 => Ok(Value::String(string)),
        other => Err(WireError::IntOrStringType(other)),
    }
}

/// `{seconds = 1, nanos = 2}` as RFC 3339 with second precision; Go drops the nanos
/// when decoding. Empty bytes are the zero time, which Go writes as `null`.
pub(super) fn time(chunks: &[&[u8]]) -> Result<Value, WireError> {
    let Some((seconds, _)) = timestamp(chunks)? else {
        return Ok(Value::Null);
    };
    Ok(Value::String(format!("{}Z", civil(seconds)?)))
}

/// Like [`time`], with six fractional digits: Go truncates the nanos to microseconds.
pub(super) fn micro_time(chunks: &[&[u8]]) -> Result<Value, WireError> {
    let Some((seconds, nanos)) = timestamp(chunks)? else {
        return Ok(Value::Null);
    };
    // `time.Unix(seconds, nanos)` normalizes nanos outside [0, 1e9) into the seconds.
    let micros = i128::from(seconds) * 1_000_000 + i128::from(nanos / 1000);
    let whole = micros.div_euclid(1_000_000);
    let fraction = micros.rem_euclid(1_000_000);
    let whole = i64::try_from(whole).map_err(|_| WireError::TimeRange(seconds))?;
    Ok(Value::String(format!("{}.{fraction:06}Z", civil(whole)?)))
}

/// `{Raw = 1}`: the managed-fields set, already JSON. Unset is `null`.
pub(super) fn fields_v1(chunks: &[&[u8]]) -> Result<Value, WireError> {
    embedded_json(chunks)
}

/// `{repeated string items = 1}`: a JSON list of strings; none is `null` (a nil slice).
pub(super) fn string_list(chunks: &[&[u8]]) -> Result<Value, WireError> {
    let mut items = Vec::new();
    for field in fields(chunks) {
        if let (1, v) = field? {
            items.push(Value::String(utf8(v.bytes(1)?)));
        }
    }
    Ok(if items.is_empty() {
        Value::Null
    } else {
        Value::Array(items)
    })
}

/// `{raw = 1}`: an embedded object, as JSON bytes. Unset is `null`.
pub(super) fn raw_extension(chunks: &[&[u8]]) -> Result<Value, WireError> {
    embedded_json(chunks)
}

fn embedded_json(chunks: &[&[u8]]) -> Result<Value, WireError> {
    let mut raw = None;
    for field in fields(chunks) {
        if let (1, v) = field? {
            raw = Some(v.bytes(1)?);
        }
    }
    match raw {
        None => Ok(Value::Null),
        Some(raw) => {
            serde_json::from_slice(raw).map_err(|e| WireError::EmbeddedJson(e.to_string()))
        }
    }
}

/// A string field's value. Go does not check UTF-8 when decoding and its JSON encoder
/// replaces invalid bytes with U+FFFD, as this does.
pub(super) fn utf8(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The (seconds, nanos) of a `Timestamp`, or `None` for empty bytes. Go's Time and
/// MicroTime reset on each occurrence, so the last one counts.
fn timestamp(chunks: &[&[u8]]) -> Result<Option<(i64, i32)>, WireError> {
    let Some(last) = chunks.iter().rev().find(|c| !c.is_empty()) else {
        return Ok(None);
    };
    let (mut seconds, mut nanos) = (0, 0);
    for field in fields(&[last]) {
        match field? {
            (1, v) => seconds = v.varint(1)? as i64,
            (2, v) => nanos = v.varint(2)? as i32,
            _ => {}
        }
    }
    Ok(Some((seconds, nanos)))
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) for Unix seconds. Years outside 0000-9999 are refused:
/// RFC 3339 cannot write them, and Kubernetes could not read them back.
fn civil(seconds: i64) -> Result<String, WireError> {
    const MIN: i64 = -62_167_219_200; // 0000-01-01T00:00:00Z
    const MAX: i64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    if !(MIN..=MAX).contains(&seconds) {
        return Err(WireError::TimeRange(seconds));
    }
    let (days, secs) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days, with eras of 400 years from 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    Ok(format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    ))
}

#[cfg(test)]
mod tests {
    use super::super::fixture::Enc;
    use super::*;
    use serde_json::json;

    fn ts(seconds: i64, nanos: i32) -> Vec<u8> {
        Enc::new().int(1, seconds).int(2, nanos.into()).done()
    }

    #[test]
    fn times_format_as_rfc3339_in_utc() {
        assert_eq!(time(&[]), Ok(Value::Null));
        assert_eq!(time(&[&[]]), Ok(Value::Null));
        assert_eq!(time(&[&ts(0, 0)]), Ok(json!("1970-01-01T00:00:00Z")));
        assert_eq!(
            time(&[&ts(1_767_323_045, 999_999_999)]),
            Ok(json!("2026-01-02T03:04:05Z"))
        );
        assert_eq!(
            time(&[&ts(951_782_400, 0)]),
            Ok(json!("2000-02-29T00:00:00Z"))
        );
        assert_eq!(time(&[&ts(-1, 0)]), Ok(json!("1969-12-31T23:59:59Z")));
        assert_eq!(
            time(&[&ts(-62_167_219_200, 0)]),
            Ok(json!("0000-01-01T00:00:00Z"))
        );
        assert_eq!(
            time(&[&ts(253_402_300_799, 0)]),
            Ok(json!("9999-12-31T23:59:59Z"))
        );
        assert_eq!(
            time(&[&ts(253_402_300_800, 0)]),
            Err(WireError::TimeRange(253_402_300_800))
        );
        assert_eq!(
            time(&[&ts(i64::MIN, 0)]),
            Err(WireError::TimeRange(i64::MIN))
        );
        // Go resets a Time on each occurrence: the last one counts.
        assert_eq!(
            time(&[&ts(0, 0), &ts(1_767_323_045, 0)]),
            Ok(json!("2026-01-02T03:04:05Z"))
        );
    }

    #[test]
    fn micro_times_keep_microseconds() {
        assert_eq!(micro_time(&[]), Ok(Value::Null));
        assert_eq!(
            micro_time(&[&ts(1_767_323_045, 123_456_789)]),
            Ok(json!("2026-01-02T03:04:05.123456Z"))
        );
        assert_eq!(
            micro_time(&[&ts(1_767_323_045, 0)]),
            Ok(json!("2026-01-02T03:04:05.000000Z"))
        );
        // Negative nanos count back from the second, as time.Unix normalizes them.
        assert_eq!(
            micro_time(&[&ts(1_767_323_045, -1_000)]),
            Ok(json!("2026-01-02T03:04:04.999999Z"))
        );
    }

    #[test]
    fn int_or_string_follows_its_type() {
        assert_eq!(int_or_string(&[]), Ok(json!(0)));
        let int = Enc::new().int(1, 0).int(2, 3).str(3, "").done();
        assert_eq!(int_or_string(&[&int]), Ok(json!(3)));
        let negative = Enc::new().int(2, -2).done();
        assert_eq!(int_or_string(&[&negative]), Ok(json!(-2)));
        let string = Enc::new().int(1, 1).int(2, 0).str(3, "25%").done();
        assert_eq!(int_or_string(&[&string]), Ok(json!("25%")));
        let bad = Enc::new().int(1, 2).done();
        assert_eq!(int_or_string(&[&bad]), Err(WireError::IntOrStringType(2)));
    }

    #[test]
    fn embedded_json_is_inlined_and_checked() {
        assert_eq!(raw_extension(&[]), Ok(Value::Null));
        let raw = Enc::new().str(1, r#"{"a":[1]}"#).done();
        assert_eq!(raw_extension(&[&raw]), Ok(json!({"a": [1]})));
        assert_eq!(fields_v1(&[&raw]), Ok(json!({"a": [1]})));
        let bad = Enc::new().str(1, "{x").done();
        assert!(matches!(
            raw_extension(&[&bad]),
            Err(WireError::EmbeddedJson(_))
        ));
    }

    #[test]
    fn quantities_pass_through() {
        assert_eq!(quantity(&[]), Ok(json!("0")));
        let q = Enc::new().str(1, "500m").done();
        assert_eq!(quantity(&[&q]), Ok(json!("500m")));
    }
}
