//! The report as a tree for people (colour and symbols on a terminal, plain when
//! piped) or as JSON for machines.

use std::fmt::Write;

use k8s_openapi::jiff::Timestamp;

use crate::report::{Link, Report, State};

/// Writes `report` as a tree; `colour` adds ANSI colours.
pub fn text(report: &Report, colour: bool, now: Timestamp) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} {}", mark(report.state, colour), report.target);
    let last = report.links.len().saturating_sub(1);
    for (i, link) in report.links.iter().enumerate() {
        tree(&mut out, link, "", i == last, colour, now);
    }
    match &report.first {
        Some(first) => {
            let word = if first.state == State::Broken {
                "Broken"
            } else {
                "Waiting"
            };
            let _ = writeln!(
                out,
                "\n{word}: {} [{}] {}{}",
                first.subject,
                first.owner.label(),
                first.evidence,
                ago(first, now)
            );
            if let Some(next) = &first.next {
                let _ = writeln!(out, "Next: {next}");
            }
        }
        None => {
            let _ = writeln!(out, "\nEvery link is ok.");
        }
    }
    out
}

fn tree(out: &mut String, link: &Link, indent: &str, last: bool, colour: bool, now: Timestamp) {
    let branch = if last { "└─ " } else { "├─ " };
    let _ = writeln!(
        out,
        "{indent}{branch}{} {}  [{}] {}{}",
        mark(link.state, colour),
        link.subject,
        link.owner.label(),
        link.evidence,
        ago(link, now)
    );
    let indent = format!("{indent}{}", if last { "   " } else { "│  " });
    let end = link.links.len().saturating_sub(1);
    for (i, child) in link.links.iter().enumerate() {
        tree(out, child, &indent, i == end, colour, now);
    }
}

fn mark(state: State, colour: bool) -> &'static str {
    match (state, colour) {
        (State::Ok, false) => "ok",
        (State::Waiting, false) => "..",
        (State::Broken, false) => "XX",
        (State::Ok, true) => "\x1b[32m✔\x1b[0m",
        (State::Waiting, true) => "\x1b[33m…\x1b[0m",
        (State::Broken, true) => "\x1b[31m✘\x1b[0m",
    }
}

/// ` (for 3m)` when the link is not ok and the API says since when.
fn ago(link: &Link, now: Timestamp) -> String {
    let Some(since) = link.since.filter(|_| link.state != State::Ok) else {
        return String::new();
    };
    let secs = now.duration_since(since).as_secs().max(0);
    let span = match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    };
    format!(" (for {span})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Owner;

    #[test]
    fn a_tree_with_the_first_broken_link_and_the_next_command() {
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let image = Link::new(
            "container c: image nope:1",
            Owner::Registry,
            State::Broken,
            "ImagePullBackOff: no such host",
        )
        .since(Some("2026-01-01T00:07:00Z".parse().unwrap()))
        .next("kubectl describe pod p -n default");
        let pod = Link::new(
            "pod/p",
            Owner::Kubelet,
            State::Waiting,
            "Pending, not Ready",
        )
        .with(vec![
            Link::ok("scheduled", Owner::Scheduler, "on node n1"),
            image,
        ]);
        let report = Report::new("pod/p".into(), vec![pod]);
        assert_eq!(
            text(&report, false, now),
            "XX pod/p\n\
             └─ .. pod/p  [kubelet] Pending, not Ready\n   \
                ├─ ok scheduled  [scheduler] on node n1\n   \
                └─ XX container c: image nope:1  [kubelet/registry] ImagePullBackOff: no such host (for 3m)\n\
             \nBroken: container c: image nope:1 [kubelet/registry] ImagePullBackOff: no such host (for 3m)\n\
             Next: kubectl describe pod p -n default\n"
        );
    }
}
