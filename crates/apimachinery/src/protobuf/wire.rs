//! The protobuf wire format: varints and tagged fields, read without trusting any length
//! or tag in the input, and written as gogo-protobuf writes them.

use super::error::WireError;

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// The value of one field as it is on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WireValue<'a> {
    Varint(u64),
    Fixed64(u64),
    Len(&'a [u8]),
    Fixed32(u32),
}

impl<'a> WireValue<'a> {
    fn wire_type(self) -> u8 {
        match self {
            WireValue::Varint(_) => VARINT,
            WireValue::Fixed64(_) => FIXED64,
            WireValue::Len(_) => LEN,
            WireValue::Fixed32(_) => FIXED32,
        }
    }

    /// The value of a varint field (`int32`, `int64`, `bool`).
    pub(super) fn varint(self, field: u64) -> Result<u64, WireError> {
        match self {
            WireValue::Varint(v) => Ok(v),
            other => Err(other.mismatch(field, VARINT)),
        }
    }

    /// The payload of a length-delimited field (strings, bytes, messages, packed lists).
    pub(super) fn bytes(self, field: u64) -> Result<&'a [u8], WireError> {
        match self {
            WireValue::Len(bytes) => Ok(bytes),
            other => Err(other.mismatch(field, LEN)),
        }
    }

    fn mismatch(self, field: u64, expected: u8) -> WireError {
        WireError::FieldWireType {
            field,
            found: self.wire_type(),
            expected,
        }
    }
}

/// Writes fields in the order they are given.
#[derive(Default)]
pub(super) struct Writer(Vec<u8>);

impl Writer {
    pub(super) fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.0.push(value as u8 | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }

    fn key(&mut self, number: u32, wire_type: u8) {
        self.varint(u64::from(number) << 3 | u64::from(wire_type));
    }

    /// An `int32`, `int64` or `bool` field. Negative numbers take ten bytes, as Go
    /// writes `uint64(v)` of an int32 sign-extended.
    pub(super) fn int(&mut self, number: u32, value: i64) {
        self.key(number, VARINT);
        self.varint(value as u64);
    }

    /// A length-delimited field: a string, bytes or an encoded message.
    pub(super) fn bytes(&mut self, number: u32, value: &[u8]) {
        self.key(number, LEN);
        self.varint(value.len() as u64);
        self.0.extend_from_slice(value);
    }

    /// Bytes taken as they are, for the messages tests make up.
    #[cfg(test)]
    pub(super) fn extend(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    pub(super) fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// Reads values off the front of a byte slice.
pub(super) struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub(super) fn varint(&mut self) -> Result<u64, WireError> {
        let mut value = 0u64;
        for (i, &byte) in self.data.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                self.data = &self.data[i + 1..];
                return Ok(value);
            }
        }
        Err(if self.data.len() < 10 {
            WireError::Truncated
        } else {
            WireError::VarintOverflow
        })
    }

    fn take(&mut self, length: u64) -> Result<&'a [u8], WireError> {
        let remaining = self.data.len();
        let n = usize::try_from(length)
            .ok()
            .filter(|&n| n <= remaining)
            .ok_or(WireError::Length { length, remaining })?;
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        Ok(head)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let bytes = self.data.first_chunk::<N>().ok_or(WireError::Truncated)?;
        self.data = &self.data[N..];
        Ok(*bytes)
    }

    /// The next field's number and value, or `None` at the end of the data.
    pub(super) fn field(&mut self) -> Result<Option<(u64, WireValue<'a>)>, WireError> {
        if self.data.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = key >> 3;
        if number == 0 {
            return Err(WireError::FieldZero);
        }
        let value = match (key & 7) as u8 {
            VARINT => WireValue::Varint(self.varint()?),
            FIXED64 => WireValue::Fixed64(u64::from_le_bytes(self.fixed()?)),
            LEN => {
                let length = self.varint()?;
                WireValue::Len(self.take(length)?)
            }
            FIXED32 => WireValue::Fixed32(u32::from_le_bytes(self.fixed()?)),
            // 3 and 4 are the deprecated groups, which no Kubernetes type uses.
            other => return Err(WireError::WireType(other)),
        };
        Ok(Some((number, value)))
    }
}

/// The fields of a message whose bytes arrived in several chunks. Protobuf merges
/// repeated occurrences of a message field as if their bytes were concatenated, so
/// reading the chunks in turn is that merge.
pub(super) fn fields<'a>(
    chunks: &[&'a [u8]],
) -> impl Iterator<Item = Result<(u64, WireValue<'a>), WireError>> {
    let mut chunks = chunks.iter();
    let mut reader = Reader::new(&[]);
    std::iter::from_fn(move || {
        while reader.is_empty() {
            reader = Reader::new(chunks.next()?);
        }
        match reader.field() {
            Ok(field) => field.map(Ok),
            Err(error) => {
                // Stop after the first error: the rest of the bytes has no known framing.
                reader = Reader::new(&[]);
                chunks = Default::default();
                Some(Err(error))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(chunks: &[&'static [u8]]) -> Result<Vec<(u64, WireValue<'static>)>, WireError> {
        fields(chunks).collect()
    }

    #[test]
    fn reads_every_wire_type_across_chunks() {
        let a: &[u8] = &[0x08, 0x96, 0x01, 0x12, 0x02, b'h', b'i'];
        let b: &[u8] = &[0x19, 1, 0, 0, 0, 0, 0, 0, 0, 0x25, 2, 0, 0, 0];
        assert_eq!(
            read_all(&[a, &[], b]),
            Ok(vec![
                (1, WireValue::Varint(150)),
                (2, WireValue::Len(b"hi")),
                (3, WireValue::Fixed64(1)),
                (4, WireValue::Fixed32(2)),
            ])
        );
    }

    #[test]
    fn ten_byte_varints_are_the_limit() {
        let mut max = [0xffu8; 10];
        max[9] = 0x01;
        assert_eq!(Reader::new(&max).varint(), Ok(u64::MAX));
        assert_eq!(
            Reader::new(&[0x80; 11]).varint(),
            Err(WireError::VarintOverflow)
        );
        assert_eq!(
            Reader::new(&[0x80, 0x80]).varint(),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn rejects_bad_framing() {
        assert_eq!(
            read_all(&[&[0x12, 0x05, b'a']]),
            Err(WireError::Length {
                length: 5,
                remaining: 1
            })
        );
        assert_eq!(read_all(&[&[0x02, 0x00]]), Err(WireError::FieldZero));
        assert_eq!(read_all(&[&[0x0b]]), Err(WireError::WireType(3)));
        assert_eq!(read_all(&[&[0x09, 1, 2]]), Err(WireError::Truncated));
        assert_eq!(
            WireValue::Varint(1).bytes(7),
            Err(WireError::FieldWireType {
                field: 7,
                found: 0,
                expected: 2
            })
        );
    }
}
