//! Numbers that went wrong: a loss that became NaN or infinite.

use super::{Finding, Pattern};
use crate::diagnose::evidence::{Evidence, RankEvidence};

pub const NAN_LOSS: Pattern = Pattern {
    id: "nan-loss",
    title: "NaN loss",
    matches: "a reported loss that is NaN or infinite (markers), or an error saying the loss became NaN or \
              non-finite",
    explanation: "The loss became NaN or infinite: a learning rate too high for the model, an overflow in \
                  half precision without loss scaling, a division by zero or `log(0)` in the loss, or bad \
                  input data; once a NaN reaches the weights, every later step is NaN too.",
    next_step: "Find the first non-finite step (`torch.autograd.set_detect_anomaly(True)` names the operation), \
                lower the learning rate, clip gradients, use `GradScaler` with AMP, and check the batch of that \
                step for NaN or infinite inputs.",
    reference: "https://pytorch.org/docs/stable/autograd.html#anomaly-detection",
};

fn says_nan(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    lower.contains("loss")
        && (lower.contains("non-finite")
            || lower.contains(" nan")
            || lower.contains("nan ")
            || lower.contains("(nan)"))
}

pub fn nan_loss(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let (rank, what) = ev.ranks.iter().find_map(|r| {
        let res = r.result;
        if let Some((step, loss)) = res.losses.iter().find(|(_, l)| !l.is_finite()) {
            return Some((r, format!("its loss at step {step} was {loss}")));
        }
        if res.final_loss.is_some_and(|l| !l.is_finite()) {
            return Some((r, "its final loss was not finite".to_string()));
        }
        let key = r.key.as_ref().map(|k| k.text.as_str()).or(res.error.as_deref())?;
        (r.failed() && says_nan(key)).then(|| (r, format!("`{key}`")))
    })?;
    let mut f = Finding::of(&NAN_LOSS);
    let line = format!("Rank {}'s loss became NaN: {what}.", rank.rank());
    if first.is_some() {
        f.culprit = Some(rank.rank());
        f.headline = Some(line);
    } else {
        f.appendix = Some(format!(" {line}"));
        f.cause = Some(NAN_LOSS.explanation.to_string());
    }
    Some(f)
}
