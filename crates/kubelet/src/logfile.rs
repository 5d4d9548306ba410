//! The CRI log file format containerd writes for each container: one record per line,
//! `<RFC 3339 time> <stdout|stderr> <P|F> <content>`, where `P` marks a partial line
//! that the next record continues. Read by the log server and for termination
//! messages taken from logs.

/// One record of a CRI log file.
#[derive(Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub time: &'a str,
    /// A piece of a longer line: no newline follows it.
    pub partial: bool,
    pub content: &'a [u8],
}

impl<'a> Record<'a> {
    /// Parses one line (without its newline); `None` for a malformed one.
    pub fn parse(line: &'a [u8]) -> Option<Record<'a>> {
        let mut fields = line.splitn(4, |b| *b == b' ');
        let time = std::str::from_utf8(fields.next()?).ok()?;
        let _stream = fields.next()?;
        let tag = fields.next()?;
        Some(Record {
            time,
            partial: tag == b"P",
            content: fields.next().unwrap_or_default(),
        })
    }

    /// Appends the record as a reader of the log sees it: its time first with
    /// `timestamps`, the content, a newline unless the line continues.
    pub fn write_to(&self, timestamps: bool, out: &mut Vec<u8>) {
        if timestamps {
            out.extend_from_slice(self.time.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(self.content);
        if !self.partial {
            out.push(b'\n');
        }
    }
}

/// The complete lines of a log's contents.
pub fn lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.split(|b| *b == b'\n').filter(|r| !r.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_render() {
        let r = Record::parse(b"2026-11-30T10:00:00.1Z stdout P hello ").unwrap();
        assert_eq!(
            (r.time, r.partial, r.content),
            ("2026-11-30T10:00:00.1Z", true, &b"hello "[..])
        );
        let empty = Record::parse(b"2026-11-30T10:00:02Z stdout F").unwrap();
        assert_eq!(empty.content, b"");
        assert!(Record::parse(b"garbage").is_none());
        let mut out = Vec::new();
        r.write_to(true, &mut out);
        empty.write_to(false, &mut out);
        assert_eq!(out, b"2026-11-30T10:00:00.1Z hello \n");
    }
}
