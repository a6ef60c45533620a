//! What the catalogue is made of: a known failure [`Pattern`], and a [`Finding`] of one in a
//! scenario's evidence. Every family file builds on these.

use crate::diagnose::evidence::{Evidence, RankEvidence};

/// A known failure pattern.
#[derive(Debug, PartialEq)]
pub struct Pattern {
    /// Stable id, kebab-case: `ddp-unused-parameters`.
    pub id: &'static str,
    pub title: &'static str,
    /// What in the evidence it matches.
    pub matches: &'static str,
    /// What it means, in general.
    pub explanation: &'static str,
    /// What to do.
    pub next_step: &'static str,
    /// The PyTorch document or issue that explains it.
    pub reference: &'static str,
}

/// A pattern found in one scenario's evidence.
#[derive(Debug, Clone)]
pub struct Finding {
    pub pattern: &'static Pattern,
    /// The rank the pattern blames, when the pattern decides it (ranks out of step: the odd
    /// rank; an OOM kill: the killed one's rank).
    pub culprit: Option<u32>,
    /// A headline replacing the outcome's generic one (collateral ranks are appended after it).
    pub headline: Option<String>,
    pub evidence: Vec<String>,
    /// The explanation for this case; the pattern's own when `None`.
    pub cause: Option<String>,
    /// The next step for this case; the pattern's own when `None`.
    pub next_step: Option<String>,
    /// Appended to the outcome's headline (a passed run that was input-bound).
    pub appendix: Option<String>,
    /// Failed ranks the headline names for what they were, neither collateral (although they
    /// ended after the first failure) nor said to have failed the same way: the ranks a
    /// timed-out collective waited for (or, where those cannot be told, the ranks stopped after
    /// it gave up) and the others that gave up waiting too.
    pub named: Vec<u32>,
    /// The evidence does not tell which rank caused it (two ranks whose collective sizes differ,
    /// neither's known to have changed): no rank is claimed as the first failure, and none is
    /// called collateral.
    pub undecided: bool,
    /// The culprit left the program's order of collectives: the failure began there even where
    /// its own process went on and ended well (gloo checks a size on the receiving side only, so
    /// a rank whose next collective met the others' skipped one may read its peer's smaller
    /// message and carry on). It is then the first failure, and the ranks that failed collateral.
    pub departed: bool,
}

impl Finding {
    pub(super) fn of(pattern: &'static Pattern) -> Self {
        Finding {
            pattern,
            culprit: None,
            headline: None,
            evidence: Vec::new(),
            cause: None,
            next_step: None,
            appendix: None,
            named: Vec::new(),
            undecided: false,
            departed: false,
        }
    }
}

/// The rank whose own error (its key line, not a line it merely printed) says one of `needles`:
/// the provisional culprit if it does, else the first failed rank, in the judge's order, that does.
pub(super) fn erring<'e>(
    ev: &'e Evidence,
    first: Option<&'e RankEvidence<'e>>,
    needles: &[&str],
) -> Option<&'e RankEvidence<'e>> {
    let says = |r: &RankEvidence| r.key.as_ref().is_some_and(|k| needles.iter().any(|n| k.text.contains(n)));
    first.filter(|r| says(r)).or_else(|| ev.ranks.iter().filter(|r| r.failed()).find(|r| says(r)))
}
