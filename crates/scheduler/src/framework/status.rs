//! The outcome of running one plugin at one extension point.

use std::fmt;

/// How a plugin judged the pod (mirrors kube-scheduler's status codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    Success,
    /// Something went wrong inside the plugin; the cycle is aborted.
    Error,
    /// The pod does not fit now, but preemption might make it fit.
    Unschedulable,
    /// The pod does not fit, and preempting pods on this node would not help.
    UnschedulableAndUnresolvable,
    /// The plugin has nothing to do for this pod; its later extension points
    /// (Filter after PreFilter, Score after PreScore) are skipped this cycle.
    Skip,
}

/// A plugin's verdict: a code, human-readable reasons and the plugin that said so.
///
/// Reasons are kept separately (not pre-joined) because [`super::FitError`]
/// counts each distinct reason across nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    code: Code,
    reasons: Vec<String>,
    plugin: Option<&'static str>,
}

impl Status {
    pub const fn success() -> Self {
        Status {
            code: Code::Success,
            reasons: Vec::new(),
            plugin: None,
        }
    }

    pub fn new(code: Code, reasons: Vec<String>) -> Self {
        Status {
            code,
            reasons,
            plugin: None,
        }
    }

    pub fn unschedulable(reason: impl Into<String>) -> Self {
        Status::new(Code::Unschedulable, vec![reason.into()])
    }

    pub fn unresolvable(reason: impl Into<String>) -> Self {
        Status::new(Code::UnschedulableAndUnresolvable, vec![reason.into()])
    }

    pub fn error(message: impl Into<String>) -> Self {
        Status::new(Code::Error, vec![message.into()])
    }

    pub const fn skip() -> Self {
        Status {
            code: Code::Skip,
            reasons: Vec::new(),
            plugin: None,
        }
    }

    /// Records which plugin produced this status (kept if already set).
    pub fn with_plugin(mut self, plugin: &'static str) -> Self {
        self.plugin.get_or_insert(plugin);
        self
    }

    pub fn code(&self) -> Code {
        self.code
    }

    pub fn reasons(&self) -> &[String] {
        &self.reasons
    }

    pub fn plugin(&self) -> Option<&'static str> {
        self.plugin
    }

    /// The reasons joined with ", ", as upstream's `Status.Message()`.
    pub fn message(&self) -> String {
        self.reasons.join(", ")
    }

    pub fn is_success(&self) -> bool {
        self.code == Code::Success
    }

    pub fn is_skip(&self) -> bool {
        self.code == Code::Skip
    }

    /// Unschedulable or UnschedulableAndUnresolvable.
    pub fn is_rejected(&self) -> bool {
        matches!(
            self.code,
            Code::Unschedulable | Code::UnschedulableAndUnresolvable
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.plugin {
            Some(p) => write!(f, "{:?} ({p}): {}", self.code, self.message()),
            None => write!(f, "{:?}: {}", self.code, self.message()),
        }
    }
}
