//! A POSIX signal, as the result names it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::protocol::Signal as Nix;

/// A signal by number, written in `result.json` by name: `"SIGSEGV"`, or `"SIG42"` for one
/// without a name (a real-time signal). Comparing two is comparing numbers, never spellings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Signal(i32);

impl Signal {
    // The platform's numbers, as nix knows them (they differ between architectures, so nothing
    // here spells one out); the named ones are those the verdicts speak of.
    pub const HUP: Signal = Signal(Nix::SIGHUP as i32);
    pub const INT: Signal = Signal(Nix::SIGINT as i32);
    pub const ILL: Signal = Signal(Nix::SIGILL as i32);
    pub const ABRT: Signal = Signal(Nix::SIGABRT as i32);
    pub const BUS: Signal = Signal(Nix::SIGBUS as i32);
    pub const FPE: Signal = Signal(Nix::SIGFPE as i32);
    pub const KILL: Signal = Signal(Nix::SIGKILL as i32);
    pub const SEGV: Signal = Signal(Nix::SIGSEGV as i32);
    pub const TERM: Signal = Signal(Nix::SIGTERM as i32);

    pub const fn from_number(number: i32) -> Signal {
        Signal(number)
    }

    pub const fn number(self) -> i32 {
        self.0
    }

    /// `SIGSEGV`; `SIG42` for a signal without a name.
    pub fn name(self) -> String {
        crate::protocol::signal_name(self.0)
    }

    /// A name such as `SIGSEGV`, `segv` or `SIG42`; `None` for one that names no signal.
    pub fn parse(name: &str) -> Option<Signal> {
        crate::protocol::signal_number(name).map(Signal).or_else(|| {
            let number: i32 = name.strip_prefix("SIG")?.parse().ok()?;
            (1..=64).contains(&number).then_some(Signal(number))
        })
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl From<Signal> for String {
    fn from(signal: Signal) -> String {
        signal.name()
    }
}

impl TryFrom<String> for Signal {
    type Error = String;

    fn try_from(name: String) -> Result<Signal, String> {
        Signal::parse(&name).ok_or_else(|| format!("`{name}` is not a signal name (such as `SIGSEGV`)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_constants_are_the_platforms_numbers() {
        for (signal, name) in [
            (Signal::HUP, "SIGHUP"),
            (Signal::INT, "SIGINT"),
            (Signal::ILL, "SIGILL"),
            (Signal::ABRT, "SIGABRT"),
            (Signal::BUS, "SIGBUS"),
            (Signal::FPE, "SIGFPE"),
            (Signal::KILL, "SIGKILL"),
            (Signal::SEGV, "SIGSEGV"),
            (Signal::TERM, "SIGTERM"),
        ] {
            assert_eq!(Some(signal.number()), crate::protocol::signal_number(name), "{name}");
            assert_eq!(signal.name(), name);
        }
    }

    #[test]
    fn a_signal_is_written_by_name_and_read_back() {
        assert_eq!(serde_json::to_string(&Signal::SEGV).unwrap(), r#""SIGSEGV""#);
        assert_eq!(serde_json::from_str::<Signal>(r#""SIGBUS""#).unwrap(), Signal::BUS);
        let realtime = Signal::from_number(40);
        assert_eq!(serde_json::to_string(&realtime).unwrap(), r#""SIG40""#);
        assert_eq!(serde_json::from_str::<Signal>(r#""SIG40""#).unwrap(), realtime);
        let err = serde_json::from_str::<Signal>(r#""SIGNOPE""#).unwrap_err().to_string();
        assert!(err.contains("`SIGNOPE` is not a signal name"), "{err}");
    }
}
