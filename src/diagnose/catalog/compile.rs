//! `torch.compile` failing, in its own words: TorchDynamo refusing code it cannot trace into one
//! graph (`fullgraph=True`, a data-dependent branch) or the compiler backend failing (Inductor's
//! C++ or Triton compile). Named only from the rank's own error line.

use super::{Finding, Pattern, erring};
use crate::diagnose::evidence::{Evidence, RankEvidence};

pub const COMPILE_FAILED: Pattern = Pattern {
    id: "compile-failed",
    title: "torch.compile failed",
    matches: "the rank's error is one of TorchDynamo's or Inductor's own exceptions: `torch._dynamo.exc.Unsupported`, \
              `torch._dynamo.exc.UserError`, `torch._dynamo.exc.BackendCompilerFailed`, `torch._inductor.exc.…` \
              (`InductorError`, `CppCompileError`)",
    explanation: "`torch.compile` could not compile the code: TorchDynamo met something it cannot put into one graph \
                  (with `fullgraph=True` a graph break is an error: a data-dependent branch, `.item()`, an \
                  unsupported call), or the backend compiler failed on the graph it was given (a C++ or Triton \
                  compile error, a missing compiler). Where it fails on one rank only, that rank traced other code \
                  or other shapes (a rank-dependent branch, an uneven last batch).",
    next_step: "Run with `TORCH_LOGS=graph_breaks` (and `TORCHDYNAMO_VERBOSE=1`) to see where and why; \
                `torch._dynamo.explain(fn)(*args)` lists the breaks. Allow breaks (`fullgraph=False`), guard \
                data-dependent values with `torch._check`, or compile a smaller function; for a backend failure try \
                `backend=\"aot_eager\"` to tell a tracing problem from a compiler one.",
    reference: "https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html",
};

pub fn compile_failed(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let r = erring(ev, first, &["torch._dynamo.exc.", "torch._inductor.exc."])?;
    let key = r.key.as_ref()?.text.as_str();
    let kind = key.split(':').next().unwrap_or(key).rsplit('.').next().unwrap_or("error").to_string();
    let mut f = Finding::of(&COMPILE_FAILED);
    f.culprit = Some(r.rank());
    let backend = matches!(kind.as_str(), "BackendCompilerFailed" | "InductorError" | "CppCompileError");
    f.headline = Some(format!(
        "Rank {} failed in `torch.compile`: {} (`{kind}`).",
        r.rank(),
        if backend {
            "the backend compiler failed"
        } else {
            "TorchDynamo could not trace the code into one graph"
        }
    ));
    if let Some(line) = r.text.iter().find(|l| l.trim_start().starts_with("from user code:")) {
        f.evidence.push(line.trim().to_string());
    }
    Some(f)
}
