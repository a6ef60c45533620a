//! DistributedDataParallel's and FSDP's own errors.

use super::{Finding, Pattern};
use crate::diagnose::evidence::{Evidence, RankEvidence};

pub const DDP_UNUSED_PARAMETERS: Pattern = Pattern {
    id: "ddp-unused-parameters",
    title: "DDP: unused parameters",
    matches: "`Expected to have finished reduction in the prior iteration before starting a new one` (raised \
              on the forward after the one that left parameters without gradients), with `Parameter indices \
              which did not receive grad for rank R: …` and, under `TORCH_DISTRIBUTED_DEBUG=INFO` or `DETAIL`, \
              their names",
    explanation: "The model has parameters that took no part in producing the loss (a branch not taken, a \
                  layer built but not used, an output not in the loss). DDP waits for a gradient of every \
                  parameter before it reduces a bucket, so the iteration's reduction never finished and the \
                  next forward refuses to start.",
    next_step: "Pass `find_unused_parameters=True` to `DistributedDataParallel` (it costs a graph traversal \
                per step), or remove the unused parameters or make every output take part in the loss. \
                `TORCH_DISTRIBUTED_DEBUG=INFO` prints the parameters' names instead of their indices.",
    reference: "https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",
};

pub const DDP_MODEL_MISMATCH: Pattern = Pattern {
    id: "ddp-model-mismatch",
    title: "DDP: different models on different ranks",
    matches: "`DDP expects same model across all ranks, but Rank R has N params, while rank I has inconsistent \
              M params.`",
    explanation: "DDP checks at construction that every rank built the same parameters (count, shapes, order); \
                  a rank that built its model differently (a rank-dependent config, a different checkpoint) \
                  fails this check.",
    next_step: "Build the model from the same config on every rank, and load checkpoints before wrapping it \
                in DDP.",
    reference: "https://pytorch.org/docs/stable/notes/ddp.html",
};

pub const DDP_READY_TWICE: Pattern = Pattern {
    id: "ddp-ready-twice",
    title: "DDP: a gradient ready twice in one backward",
    matches: "`Expected to mark a variable ready only once` (DDP's reducer saw one parameter's gradient twice in \
              one iteration), with `Parameter at index N with name NAME has been marked as ready twice` where \
              PyTorch names it; told as reentrant activation checkpointing where the traceback passes through \
              `torch/utils/checkpoint.py`'s `backward`",
    explanation: "DDP reduces each parameter's gradient once per backward. Activation checkpointing in its \
                  reentrant form (`use_reentrant=True`, the long-standing default of `torch.utils.checkpoint` and \
                  of Hugging Face's `gradient_checkpointing_enable()`) runs a second, nested backward per \
                  checkpointed block, in which the block's parameters are marked ready again (with \
                  `find_unused_parameters=True`, or adapters such as PEFT's LoRA); so does a parameter used \
                  outside `forward` or by two passes before one backward.",
    next_step: "Use the non-reentrant checkpoint: `checkpoint(fn, x, use_reentrant=False)`; with Hugging Face's \
                Trainer or TRL, `gradient_checkpointing_kwargs={\"use_reentrant\": False}` (on their command line \
                `--gradient_checkpointing_kwargs '{\"use_reentrant\": false}'`). Where the graph is the same every \
                step, `model._set_static_graph()` on the DDP model also lets it through.",
    reference: "https://pytorch.org/docs/stable/checkpoint.html",
};

pub const FSDP_INPLACE_VIEW: Pattern = Pattern {
    id: "fsdp-inplace-view",
    title: "FSDP: in-place update of a view",
    matches: "`Output 0 of ViewBackward0 is a view and is being modified inplace. This view is the output of \
              a function that returns multiple views.`",
    explanation: "FSDP keeps parameters as views into one flat parameter; an in-place operation on such a view \
                  (`+=`, `.add_()`, `relu_`, an `inplace=True` module) is refused by autograd.",
    next_step: "Replace the in-place operation by an out-of-place one (`x = x + y`, `inplace=False`); the key \
                line's frame says which.",
    reference: "https://pytorch.org/docs/stable/notes/autograd.html#in-place-operations-with-autograd",
};

fn first_saying<'e>(ev: &'e Evidence, needle: &str) -> Option<&'e RankEvidence<'e>> {
    ev.ranks.iter().filter(|r| r.failed()).find(|r| r.said(needle))
}

/// `2 3` after `Parameter indices which did not receive grad for rank R:`.
fn after<'t>(text: &'t [String], label: &str) -> Option<&'t str> {
    text.iter().find_map(|l| {
        let rest = &l[l.find(label)? + label.len()..];
        let rest = rest.split_once(':').map_or(rest, |(_, r)| r);
        Some(rest.split(" (names").next().unwrap_or(rest).trim())
    })
}

pub fn unused_parameters(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let r = first_saying(ev, "Expected to have finished reduction in the prior iteration")?;
    let mut f = Finding::of(&DDP_UNUSED_PARAMETERS);
    f.culprit = Some(r.rank());
    let indices = after(&r.text, "Parameter indices which did not receive grad for rank");
    let names = after(&r.text, "Parameters which did not receive grad for rank").or_else(|| {
        r.text.iter().find_map(|l| l.split("(names: ").nth(1).map(|n| n.trim_end_matches(')').trim()))
    });
    let which = match (indices, names) {
        (_, Some(names)) => format!("parameters without a gradient: {names}"),
        (Some(i), None) => format!(
            "parameter indices without a gradient: {i} (names: rerun with `TORCH_DISTRIBUTED_DEBUG=INFO`)"
        ),
        (None, None) => "which parameters is not in the output".to_string(),
    };
    let key = r
        .key
        .as_ref()
        .map(|k| k.at.as_ref().map(|a| format!(" ({a})")).unwrap_or_default())
        .unwrap_or_default();
    f.headline = Some(format!(
        "DDP found unused parameters: rank {} raised `Expected to have finished reduction in the prior iteration \
         before starting a new one` on the next forward{key}; {which}.",
        r.rank()
    ));
    if let Some(i) = indices {
        f.evidence.push(format!(
            "rank {}: `Parameter indices which did not receive grad for rank {}: {i}`",
            r.rank(),
            r.rank()
        ));
    }
    if ev.foreign {
        f.next_step = Some(DDP_UNUSED_PARAMETERS.next_step.to_string());
    } else {
        f.next_step = Some(
            "Set `train.find_unused_parameters: true` (PyTorch: `find_unused_parameters=True` to \
             `DistributedDataParallel`), or make every parameter take part in the loss."
                .into(),
        );
    }
    Some(f)
}

/// `Expected to mark a variable ready only once`: the parameter PyTorch names, and whether the
/// rank's traceback passes through the reentrant checkpoint's nested backward.
pub fn ready_twice(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let r = first_saying(ev, "Expected to mark a variable ready only once")?;
    let mut f = Finding::of(&DDP_READY_TWICE);
    f.culprit = Some(r.rank());
    let name = r.text.iter().find_map(|l| {
        let rest = &l[l.find("Parameter at index ")?..];
        let name = rest.split(" with name ").nth(1)?.split(" has been marked as ready twice").next()?;
        Some(name.trim().to_string())
    });
    let reentrant = r
        .text
        .iter()
        .any(|l| l.contains("torch/utils/checkpoint.py") && l.trim_end().ends_with("in backward"));
    let which = name.as_ref().map(|n| format!(" (parameter `{n}`)")).unwrap_or_default();
    let why = if reentrant {
        "; its traceback passes through reentrant activation checkpointing (`torch/utils/checkpoint.py`'s \
         `backward`), whose nested backward marks the block's parameters ready again"
    } else {
        ""
    };
    f.headline = Some(format!(
        "DDP saw a gradient twice in one backward: rank {} raised `Expected to mark a variable ready only \
         once`{which}{why}.",
        r.rank()
    ));
    if let Some(n) = &name {
        f.evidence
            .push(format!("rank {}: `Parameter … with name {n} has been marked as ready twice`", r.rank()));
    }
    if reentrant {
        f.cause = Some(format!(
            "Activation checkpointing in its reentrant form under DDP: {}",
            DDP_READY_TWICE.explanation
        ));
    }
    Some(f)
}

pub fn model_mismatch(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let r = first_saying(ev, "DDP expects same model across all ranks")?;
    let mut f = Finding::of(&DDP_MODEL_MISMATCH);
    f.culprit = Some(r.rank());
    f.evidence.push(format!(
        "rank {}: `{}`",
        r.rank(),
        r.line_with("DDP expects same model").unwrap_or_default().trim()
    ));
    Some(f)
}

pub fn fsdp_inplace_view(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let r = first_saying(ev, "is a view and is being modified inplace")?;
    let mut f = Finding::of(&FSDP_INPLACE_VIEW);
    f.culprit = Some(r.rank());
    let at = r.key.as_ref().and_then(|k| k.at.clone()).map(|a| format!(" at `{a}`")).unwrap_or_default();
    f.headline = Some(format!(
        "Rank {} modified a view of a parameter in place{at}: `Output 0 of ViewBackward0 is a view and is being \
         modified inplace`.",
        r.rank()
    ));
    Some(f)
}
