//! The one rule for secrets, applied to every output ups-doctor writes: `result.json` (and
//! `--json`), `report.md` and each scenario's report, `trace.json`, `report --issue` (with or
//! without `--public`), `report --bundle` (the log tails in it included), and `env` in all its
//! forms. What it masks, as [`REDACTED`]:
//!
//! - the value of a variable, a `params` entry or an `NAME=value` assignment whose name suggests a
//!   secret ([`is_secret_name`]: `TOKEN`, `SECRET`, `KEY`, `PASSWORD`, … anywhere in the name, and
//!   the short words `PAT`, `PASS`, `PWD`, `PW`, `CRED(S)` as whole word parts, so that `PATH` and
//!   `COMPASS` are left alone);
//! - the value of such a flag in a command line (`--api-key X`, `--hf-token X`, `--token=X`,
//!   `--set params.api_key=X`);
//! - a password inside a URL (`tcp://admin:PW@host` becomes `tcp://admin:<redacted>@host`);
//! - the value of a variable of `launch.env` whose name suggests a secret;
//! - every such value found in the document (at least 6 characters) wherever else it appears: a
//!   program that prints its `--api-key` or its `HF_TOKEN` is quoted masked ([`secret_values`]);
//! - token-shaped strings wherever they appear, quoted program output included: GitHub
//!   (`ghp_…`, `github_pat_…`), Hugging Face (`hf_…`), OpenAI-style (`sk-…`), Slack (`xox?-…`),
//!   AWS access key ids (`AKIA…`, `ASIA…`).
//!
//! The rank logs (`rankR.stdout.log`, …) stay as the program wrote them (their tails in a bundle
//! are masked), and `scenario.json` keeps the values it needs to run again: they are the
//! program's own records, not text to paste. Pure: no IO.

use std::borrow::Cow;
use std::sync::OnceLock;

use regex::{Captures, Regex};
use serde_json::Value;

/// What a secret reads as.
pub const REDACTED: &str = "<redacted>";

/// Words that mark a secret wherever they appear in a name.
const ANYWHERE: [&str; 13] = [
    "TOKEN",
    "SECRET",
    "KEY",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "AUTH",
    "COOKIE",
    "SESSION",
    "PRIVATE",
    "SIGNATURE",
    "CERT",
];

/// Short words that mark a secret only as a whole part of a name (`GITHUB_PAT`, `DB_PASS`,
/// `SMTP_PW`, `AWS_CREDS`, `--pwd`), never inside another word (`PATH`, `COMPASS`).
const WHOLE_PART: [&str; 6] = ["PAT", "PASS", "PWD", "PW", "CRED", "CREDS"];

/// Whether a name (a variable, a flag, a `params` key) suggests its value is a secret.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ANYWHERE.iter().any(|w| upper.contains(w))
        || upper.split(|c: char| !c.is_ascii_alphanumeric()).any(|part| WHOLE_PART.contains(&part))
}

/// Sections of a scenario (`--set model.latent_tokens=16`): their fields hold no secrets, and
/// some names would read as one (`latent_tokens`). `params.…` can, and is not among them.
const SCENARIO_SECTIONS: [&str; 7] = ["model.", "data.", "train.", "launch.", "limits.", "expect.", "inject"];

/// Whether the value assigned to or following `name` (`NAME=…`, `--name …`) is a secret.
fn secret_setting(name: &str) -> bool {
    let bare = name.trim_start_matches('-');
    !SCENARIO_SECTIONS.iter().any(|s| bare.starts_with(s)) && is_secret_name(bare)
}

fn regex(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("a valid pattern"))
}

/// `text` with every secret in it masked (see the module's documentation).
pub fn mask_text(text: &str) -> Cow<'_, str> {
    static URL: OnceLock<Regex> = OnceLock::new();
    static TOKEN: OnceLock<Regex> = OnceLock::new();
    static ASSIGNED: OnceLock<Regex> = OnceLock::new();
    static FLAG: OnceLock<Regex> = OnceLock::new();
    let url = regex(&URL, r"([A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]*):[^\s/@]+@");
    let token = regex(
        &TOKEN,
        r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,}|xox[abposr]-[A-Za-z0-9\-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16})\b",
    );
    let assigned = regex(&ASSIGNED, r#"((?:--?)?[A-Za-z_][A-Za-z0-9_.\-]*)=("[^"]*"|'[^']*'|[^\s,;&"'`]+)"#);
    let flag =
        regex(&FLAG, r#"(^|\s)(--?[A-Za-z][A-Za-z0-9_.\-]*)(\s+)([^\s\-"'`][^\s"'`]*|"[^"]*"|'[^']*')"#);
    let mut out: Cow<'_, str> = Cow::Borrowed(text);
    let mut apply = |re: &Regex, f: &dyn Fn(&Captures<'_>) -> String| {
        if re.is_match(&out) {
            out = Cow::Owned(re.replace_all(&out, |c: &Captures<'_>| f(c)).into_owned());
        }
    };
    apply(url, &|c| format!("{}:{REDACTED}@", &c[1]));
    apply(token, &|_| REDACTED.to_string());
    apply(assigned, &|c| {
        if secret_setting(&c[1]) { format!("{}={REDACTED}", &c[1]) } else { c[0].to_string() }
    });
    apply(flag, &|c| {
        if secret_setting(&c[2]) && &c[4] != REDACTED {
            format!("{}{}{}{REDACTED}", &c[1], &c[2], &c[3])
        } else {
            c[0].to_string()
        }
    });
    out
}

/// A command line with its secrets masked: the value after a flag whose name suggests a secret
/// (`--api-key X`), and every argument as [`mask_text`] masks it (`--token=X`, URLs, tokens).
pub fn mask_argv(argv: &[String]) -> Vec<String> {
    let mut out: Vec<String> = argv.iter().map(|a| mask_text(a).into_owned()).collect();
    for i in 0..out.len().saturating_sub(1) {
        // A `{param}` placeholder of a scenario's command is not a value: its param is masked.
        let placeholder = argv[i + 1].starts_with('{') && argv[i + 1].ends_with('}');
        if secret_flag(&argv[i]) && !argv[i + 1].starts_with("--") && !placeholder {
            out[i + 1] = REDACTED.to_string();
        }
    }
    out
}

/// `--api-key`, `-p` is not: a flag without a value of its own whose name suggests a secret.
fn secret_flag(arg: &str) -> bool {
    arg.starts_with('-') && !arg.contains('=') && secret_setting(arg)
}

/// Masks every secret in a JSON document (the form every output is written from): strings as
/// [`mask_text`], arrays of strings as command lines ([`mask_argv`]), the values of `params`
/// entries and of `variables` pairs whose names suggest a secret.
pub fn mask_json(value: &mut Value) {
    let known = secret_values(value);
    mask_json_knowing(value, &known);
}

/// The shortest secret value that is also masked wherever it appears (shorter ones would mask
/// ordinary words and numbers).
const MIN_KNOWN: usize = 6;

/// The secret values a document holds under a secret name (a variable, a `params` or `env` entry,
/// the value of a secret flag in a command line): a program that prints its `--api-key` or its
/// `HF_TOKEN` puts it in the output ups-doctor quotes, so these are masked wherever they appear,
/// longest first.
pub fn secret_values(value: &Value) -> Vec<String> {
    let mut found = Vec::new();
    collect_values(value, &mut found);
    found.retain(|v: &String| v.len() >= MIN_KNOWN && v != REDACTED);
    found.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    found.dedup();
    found
}

fn collect_values(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Array(items) if items.iter().all(Value::is_string) => {
            let argv: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
            for (i, arg) in argv.iter().enumerate() {
                if let Some((name, v)) = arg.split_once('=')
                    && name.starts_with('-')
                    && secret_setting(name)
                {
                    found.push(v.to_string());
                } else if secret_flag(arg)
                    && let Some(next) = argv.get(i + 1).filter(|n| !n.starts_with("--"))
                {
                    found.push((*next).to_string());
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                if let Value::Array(pair) = item
                    && let [Value::String(name), Value::String(v)] = pair.as_slice()
                    && is_secret_name(name)
                {
                    found.push(v.clone());
                }
                collect_values(item, found);
            }
        }
        Value::Object(map) => {
            for (key, v) in map {
                if (key == "params" || key == "env")
                    && let Value::Object(entries) = v
                {
                    found.extend(
                        entries
                            .iter()
                            .filter(|(name, _)| is_secret_name(name))
                            .filter_map(|(_, p)| p.as_str().map(str::to_string)),
                    );
                }
                collect_values(v, found);
            }
        }
        _ => {}
    }
}

/// [`mask_text`], and every one of `known` ([`secret_values`]) wherever it appears.
pub fn mask_text_knowing<'t>(text: &'t str, known: &[String]) -> Cow<'t, str> {
    let mut out = mask_text(text);
    for secret in known {
        if out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
        }
    }
    out
}

/// [`mask_text_knowing`] with the secret values of `doc` (the run a report is rendered from).
pub fn mask_rendered<'t>(text: &'t str, doc: &impl serde::Serialize) -> Cow<'t, str> {
    let known = serde_json::to_value(doc).map(|v| secret_values(&v)).unwrap_or_default();
    mask_text_knowing(text, &known)
}

/// [`mask_json`] with `known` secret values ([`secret_values`] of another document) too.
pub fn mask_json_knowing(value: &mut Value, known: &[String]) {
    match value {
        Value::String(text) => {
            if let Cow::Owned(masked) = mask_text_knowing(text, known) {
                *text = masked;
            }
        }
        Value::Array(items) => {
            if items.iter().all(Value::is_string) {
                let argv: Vec<String> = items.iter().filter_map(|v| v.as_str().map(str::to_string)).collect();
                *items = mask_argv(&argv)
                    .into_iter()
                    .map(|a| Value::String(mask_text_knowing(&a, known).into_owned()))
                    .collect();
                return;
            }
            for item in items.iter_mut() {
                // `["NAME", "value"]`: a variable of the environment.
                if let Value::Array(pair) = item
                    && let [Value::String(name), Value::String(value)] = pair.as_mut_slice()
                    && is_secret_name(name)
                {
                    *value = REDACTED.to_string();
                }
                mask_json_knowing(item, known);
            }
        }
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if (key == "params" || key == "env")
                    && let Value::Object(params) = v
                {
                    for (name, p) in params.iter_mut() {
                        if is_secret_name(name) {
                            *p = Value::String(REDACTED.to_string());
                        }
                    }
                }
                mask_json_knowing(v, known);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_under_secret_names_are_masked_wherever_else_they_appear() {
        let mut doc = serde_json::json!({
            "command": ["python", "train.py", "--api-key", "k3y-value", "--token=t0ken-value", "--lr", "0.1"],
            "launch": {"env": {"HF_TOKEN": "env-secret", "OMP_NUM_THREADS": "4"}},
            "params": {"db_pass": "short", "steps": 5},
            "variables": [["NCCL_DB_PASS", "variable-secret"]],
            "tail": "using k3y-value, t0ken-value, env-secret and variable-secret; lr 0.1; 4 threads"
        });
        assert_eq!(secret_values(&doc), ["variable-secret", "t0ken-value", "env-secret", "k3y-value"]);
        mask_json(&mut doc);
        assert_eq!(doc["tail"], "using <redacted>, <redacted>, <redacted> and <redacted>; lr 0.1; 4 threads");
        assert_eq!(doc["launch"]["env"]["HF_TOKEN"], REDACTED);
        assert_eq!(doc["launch"]["env"]["OMP_NUM_THREADS"], "4");
        assert_eq!(doc["params"]["db_pass"], REDACTED, "masked by name, too short to be masked elsewhere");
    }

    #[test]
    fn names_by_word_parts() {
        for name in [
            "TORCH_GITHUB_PAT",
            "DB_PASS",
            "NCCL_PWD",
            "AWS_CREDS",
            "SMTP_PW",
            "HF_TOKEN",
            "UPS_DOCTOR_API_KEY",
            "api-key",
            "params.api_key",
            "MY_AUTH",
            "SESSION_COOKIE",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in
            ["PATH", "COMPASS", "NCCL_IB_HCA", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PYTHONPATH"]
        {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn text_urls_tokens_assignments_and_flags() {
        let cases = [
            ("store at tcp://admin:hunter2@10.0.0.1:29500", "store at tcp://admin:<redacted>@10.0.0.1:29500"),
            (
                "push https://ghp_abcdefghijklmnopqrstuvwxyz0123@github.com",
                "push https://<redacted>@github.com",
            ),
            ("token hf_abcdefghijklmnopqrstuvwxyz here", "token <redacted> here"),
            ("OPENAI sk-proj-abcdefghijklmnopqrstuv1234", "OPENAI <redacted>"),
            ("slack xoxb-1234567890-abcdefghij", "slack <redacted>"),
            ("aws AKIAIOSFODNN7EXAMPLE!", "aws <redacted>!"),
            ("HF_TOKEN=abc123 WORLD=2", "HF_TOKEN=<redacted> WORLD=2"),
            ("train.py --token=xyz --lr=0.1", "train.py --token=<redacted> --lr=0.1"),
            ("--set params.api_key=v4lue", "--set params.api_key=<redacted>"),
            ("python train.py --api-key s3cr3t --steps 4", "python train.py --api-key <redacted> --steps 4"),
            ("KeyError: 'weight' in task-manager", "KeyError: 'weight' in task-manager"),
            ("PATH=/usr/bin", "PATH=/usr/bin"),
            ("--set model.latent_tokens=16", "--set model.latent_tokens=16"),
        ];
        for (text, want) in cases {
            assert_eq!(mask_text(text), want, "{text}");
        }
    }

    #[test]
    fn argv_flags_take_their_value_with_them() {
        let argv: Vec<String> =
            ["python", "t.py", "--hf-token", "abc", "--steps", "4", "--password", "--verbose"]
                .map(String::from)
                .into();
        assert_eq!(
            mask_argv(&argv),
            ["python", "t.py", "--hf-token", "<redacted>", "--steps", "4", "--password", "--verbose"]
        );
    }

    #[test]
    fn json_params_variables_and_every_string() {
        let mut v = serde_json::json!({
            "command": ["ups-doctor", "run", "--set", "params.api_key=XYZ"],
            "scenario": {"params": {"api_key": "XYZ", "steps": "4"}, "command": ["p", "--api-key", "{api_key}"]},
            "environment": {"variables": [["TORCH_GITHUB_PAT", "XYZ"], ["NCCL_DEBUG", "INFO"]]},
            "log_tail": ["connecting to tcp://u:XYZ@h", "done"]
        });
        mask_json(&mut v);
        assert!(!v.to_string().contains("XYZ"), "{v:#}");
        assert_eq!(v["scenario"]["params"]["steps"], "4");
        assert_eq!(v["environment"]["variables"][1][1], "INFO");
    }
}
