//! Errors of protobuf decoding: [`ProtobufError`] for the request body as a whole, and
//! [`WireError`] for what was wrong at one place inside it.

use thiserror::Error;

/// Why a protobuf request body could not be decoded.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProtobufError {
    #[error("protobuf body does not start with the Kubernetes magic prefix \"k8s\\0\"")]
    MissingMagic,
    #[error("no protobuf schema is known for apiVersion {api_version:?}, kind {kind:?}")]
    UnknownKind { api_version: String, kind: String },
    #[error("unsupported contentEncoding {0:?} in the protobuf envelope")]
    ContentEncoding(String),
    #[error("unsupported contentType {0:?} in the protobuf envelope")]
    ContentType(String),
    /// `at` is the message and JSON path of the field being read, like
    /// `apps.v1.Deployment.spec.template.spec.containers`.
    #[error("malformed protobuf at {at}: {error}")]
    Malformed {
        at: String,
        #[source]
        error: WireError,
    },
}

/// What was wrong with the bytes at one place.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    #[error("unexpected end of data")]
    Truncated,
    #[error("varint is longer than 10 bytes")]
    VarintOverflow,
    #[error("length {length} exceeds the {remaining} bytes left")]
    Length { length: u64, remaining: usize },
    #[error("field number 0 is invalid")]
    FieldZero,
    #[error("wire type {0} is not supported")]
    WireType(u8),
    #[error("field {field} has wire type {found}, expected {expected}")]
    FieldWireType { field: u64, found: u8, expected: u8 },
    #[error("embedded bytes are not JSON: {0}")]
    EmbeddedJson(String),
    #[error("timestamp {0}s is outside the years 0000 to 9999")]
    TimeRange(i64),
    #[error("IntOrString type {0} is neither 0 (int) nor 1 (string)")]
    IntOrStringType(i64),
}

/// A [`WireError`] on its way up through nested messages, collecting the JSON path.
#[derive(Debug)]
pub(super) struct Located {
    /// Field names, innermost first.
    path: Vec<&'static str>,
    error: WireError,
}

impl Located {
    /// Adds the name of the field the error happened under (none for an inline field).
    pub(super) fn within(mut self, field: &'static str) -> Self {
        if !field.is_empty() {
            self.path.push(field);
        }
        self
    }

    /// The public error, with the path rooted at `root` (the top message's name).
    pub(super) fn at(self, root: &str) -> ProtobufError {
        let mut at = root.to_string();
        for field in self.path.iter().rev() {
            at.push('.');
            at.push_str(field);
        }
        ProtobufError::Malformed {
            at,
            error: self.error,
        }
    }
}

impl From<WireError> for Located {
    fn from(error: WireError) -> Self {
        Located {
            path: Vec::new(),
            error,
        }
    }
}
