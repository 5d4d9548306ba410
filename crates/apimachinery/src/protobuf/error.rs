//! Errors of protobuf decoding and encoding: [`ProtobufError`] for the body as a whole,
//! and [`WireError`] for what was wrong at one place inside it.

use thiserror::Error;

/// Why a protobuf body could not be decoded, or an object encoded.
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
    /// An object whose JSON does not fit its kind's message (a stored object never is).
    #[error("cannot encode {at} as protobuf: {error}")]
    Unencodable {
        at: String,
        #[source]
        error: WireError,
    },
}

/// What was wrong with the bytes (or the JSON being encoded) at one place.
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
    #[error("the JSON holds {0}")]
    NotEncodable(&'static str),
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

    /// The public decoding error, with the path rooted at `root` (the top message's name).
    pub(super) fn at(self, root: &str) -> ProtobufError {
        let (at, error) = self.rooted(root);
        ProtobufError::Malformed { at, error }
    }

    /// The public encoding error, with the path rooted at `root`.
    pub(super) fn encoding(self, root: &str) -> ProtobufError {
        let (at, error) = self.rooted(root);
        ProtobufError::Unencodable { at, error }
    }

    fn rooted(self, root: &str) -> (String, WireError) {
        let mut at = root.to_string();
        for field in self.path.iter().rev() {
            at.push('.');
            at.push_str(field);
        }
        (at, self.error)
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
