//! Completion indexes of Indexed Jobs: the `status.completedIndexes` text (`1,3-5,7`),
//! and which indexes still need a pod.

use std::collections::BTreeSet;

/// Reads `1,3-5,7`; anything unreadable is skipped, and indexes at or past
/// `completions` are dropped (the spec may have changed).
pub fn parse(text: &str, completions: i32) -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<i32>(), b.parse::<i32>()),
            None => (part.parse::<i32>(), part.parse::<i32>()),
        };
        if let (Ok(first), Ok(last)) = (first, last) {
            out.extend((first.max(0)..=last).filter(|i| *i < completions));
        }
    }
    out
}

/// Writes indexes as upstream: ascending, runs of consecutive ones as `first-last`.
pub fn format(indexes: &BTreeSet<i32>) -> String {
    let mut parts = Vec::new();
    let mut run: Option<(i32, i32)> = None;
    for &i in indexes {
        run = match run {
            Some((first, last)) if i == last + 1 => Some((first, i)),
            Some(done) => {
                parts.push(range(done));
                Some((i, i))
            }
            None => Some((i, i)),
        };
    }
    if let Some(done) = run {
        parts.push(range(done));
    }
    parts.join(",")
}

fn range((first, last): (i32, i32)) -> String {
    if first == last {
        first.to_string()
    } else {
        format!("{first}-{last}")
    }
}

/// The indexes below `completions` that are neither done nor running, lowest first.
pub fn missing(completions: i32, done: &BTreeSet<i32>, running: &BTreeSet<i32>) -> Vec<i32> {
    (0..completions)
        .filter(|i| !done.contains(i) && !running.contains(i))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_read_and_write_as_upstream_writes_them() {
        let set = parse("0,2-4,7", 10);
        assert_eq!(set.iter().copied().collect::<Vec<_>>(), [0, 2, 3, 4, 7]);
        assert_eq!(format(&set), "0,2-4,7");
        assert_eq!(format(&parse("1,2", 10)), "1-2");
        assert_eq!(format(&BTreeSet::new()), "");
        assert_eq!(parse("3-9", 5).len(), 2);
        assert!(parse("x,-", 5).is_empty());
        let running = BTreeSet::from([1]);
        assert_eq!(missing(5, &parse("0,3", 5), &running), [2, 4]);
    }
}
