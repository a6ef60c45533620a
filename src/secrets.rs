//! The one rule for secrets, applied to every output ups-doctor writes: the terminal (every line
//! it prints: verdicts, key lines, `attach`, `attach --all`, a sweep's `Failed:` line, errors),
//! `result.json` (and `--json`), `report.md` and each scenario's report, `trace.json`,
//! `report --issue` (with or without `--public`), `report --bundle` (the log tails in it
//! included), `bisect.json`/`bisect.md`, `sweep.json`/`sweep.md` and the sweep's cache,
//! `attach.json`, and `env` in all its forms. What it masks, as [`REDACTED`]:
//!
//! - the value of a variable, a `params` entry or an `NAME=value` assignment whose name suggests a
//!   secret ([`is_secret_name`]: `TOKEN`, `SECRET`, `KEY`, `PASSWORD`, … anywhere in the name, and
//!   the short words `PAT`, `PASS`, `PWD`, `PW`, `CRED(S)` as whole word parts, so that `PATH` and
//!   `COMPASS` are left alone);
//! - the value of such a flag in a command line (`--api-key X`, `--hf-token X`, `--token=X`,
//!   `--set params.api_key=X`);
//! - a password inside a URL, `/`, `+` and `=` in it included (`https://u:abc/def+g==@host/path`
//!   becomes `https://u:<redacted>@host/path`); `host:8080/path@x` is a port, not a password;
//! - the value of a variable of `launch.env` whose name suggests a secret;
//! - every such value found in the document (at least 6 characters) wherever else it appears: a
//!   program that prints its `--api-key` or its `HF_TOKEN` is quoted masked ([`secret_values`]);
//! - the values of ups-doctor's own environment variables whose names suggest a secret
//!   (`HF_TOKEN`, `WANDB_API_KEY` exported in the user's shell, which the program inherits and
//!   may print), wherever they appear, and the secret values of every scenario this process ran
//!   ([`learn`]), so that a line printed before its run's `result.json` is masked too;
//! - token-shaped strings wherever they appear, quoted program output included: GitHub
//!   (`ghp_…`, `github_pat_…`), Hugging Face (`hf_…`), OpenAI-style (`sk-…`), Slack (`xox?-…`),
//!   AWS access key ids (`AKIA…`, `ASIA…`).
//!
//! It also removes terminal control sequences from what the program wrote ([`strip_controls`]):
//! ANSI colours, OSC sequences with their payload (OSC 52 clipboard writes, OSC 0 titles), and
//! every other control character but tab and newline.
//!
//! # Where it is applied: one choke point
//!
//! Outgoing text passes [`scrub`] (text) or [`scrub_json`] (a JSON document: the name rules on its
//! structure, [`scrub`] on each string), and only the sinks call them:
//!
//! - the terminal: [`crate::output::write`], behind the crate's `print!`/`eprintln!` macros, so
//!   every line ups-doctor prints; [`crate::output::write_styled`] for ups-doctor's own colours
//!   (the matrix, the live line), which keeps colour sequences only; [`crate::output::write_json`]
//!   for `--json` documents;
//! - files: [`crate::report::write_text`] and [`crate::report::write_json`], which every report,
//!   record and cache file of a run, a sweep, a bisect and attach is written with, and the
//!   bundle's archive, each of whose entries passes [`scrub`] as it is added.
//!
//! The rank logs (`rankR.stdout.log`, …) stay as the program wrote them (their tails in a bundle
//! are masked), and `scenario.json` (and bisect's `minimal.json`) keep the values they need to run
//! again: they are the program's own records, not text to paste, and are written with
//! [`crate::run_files`] directly. The rules are pure; the one state is the list of values learnt
//! ([`learn`]), first filled from ups-doctor's own environment.

use std::borrow::Cow;
use std::sync::{Mutex, OnceLock};

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
    // The password runs to the `@` (`/`, `+`, `=` in it included: AWS keys, base64), never past
    // a quote or a space; the host and path after the `@` stay.
    let url = regex(&URL, r#"([A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@"'`]*):([^\s@"'`]+)@"#);
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
    apply(url, &|c| {
        // `host:8080/path@v1` is a port and a path, not a password.
        let port =
            c[2].split_once('/').is_some_and(|(p, _)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if port { c[0].to_string() } else { format!("{}:{REDACTED}@", &c[1]) }
    });
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
    learn_values(&known);
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
    sorted(&mut found);
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

/// [`strip_controls`] and [`mask_text`], and every one of `known` ([`secret_values`]) and of the
/// values learnt ([`learn`]: ups-doctor's own environment, the scenarios run) wherever it appears.
pub fn mask_text_knowing<'t>(text: &'t str, known: &[String]) -> Cow<'t, str> {
    match strip_controls(text, false) {
        Cow::Borrowed(t) => mask_values(mask_text(t), known),
        Cow::Owned(t) => Cow::Owned(mask_values(mask_text(&t), known).into_owned()),
    }
}

/// `text` with each of `known` and of the learnt values replaced by [`REDACTED`].
fn mask_values<'t>(mut out: Cow<'t, str>, known: &[String]) -> Cow<'t, str> {
    let learnt = store().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for secret in known.iter().chain(learnt.iter()) {
        if out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
        }
    }
    out
}

/// [`mask_text_knowing`] with the secret values of `doc` (the run a report is rendered from),
/// which are learnt ([`learn`]) for the rest of the process.
pub fn mask_rendered<'t>(text: &'t str, doc: &impl serde::Serialize) -> Cow<'t, str> {
    let known = serde_json::to_value(doc).map(|v| secret_values(&v)).unwrap_or_default();
    learn_values(&known);
    mask_text_knowing(text, &known)
}

/// The rule for outgoing text, as the sinks apply it (see the module's documentation): control
/// sequences removed, then [`mask_text`] and every value learnt.
pub fn scrub(text: &str) -> Cow<'_, str> {
    mask_text_knowing(text, &[])
}

/// [`scrub`] for ups-doctor's own styled terminal lines (the coloured matrix, the live line):
/// colour sequences (`ESC [ … m`), the erase-line sequence and carriage returns are kept; every
/// other control sequence goes as in [`scrub`].
pub fn scrub_styled(text: &str) -> Cow<'_, str> {
    match strip_controls(text, true) {
        Cow::Borrowed(t) => mask_values(mask_text(t), &[]),
        Cow::Owned(t) => Cow::Owned(mask_values(mask_text(&t), &[]).into_owned()),
    }
}

/// The rule for an outgoing JSON document: its secret values are learnt ([`learn`]), then
/// [`mask_json`] masks it, each string as [`scrub`] would.
pub fn scrub_json(value: &mut Value) {
    mask_json(value);
}

/// The secret values known to this process beyond the document at hand: those of ups-doctor's own
/// environment (read once, on first use) and those [`learn`]t since.
fn store() -> &'static Mutex<Vec<String>> {
    static STORE: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    STORE.get_or_init(|| Mutex::new(environment_secrets(std::env::vars_os())))
}

/// The values of the variables of `vars` whose names suggest a secret (at least [`MIN_KNOWN`]
/// characters), longest first: `HF_TOKEN` exported in the user's shell, inherited by the program.
pub fn environment_secrets(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Vec<String> {
    let mut found: Vec<String> = vars
        .into_iter()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, value)| is_secret_name(name) && !session_plumbing(name, value))
        .filter(|(_, value)| value.len() >= MIN_KNOWN && !value.contains(REDACTED))
        .map(|(_, value)| value)
        .collect();
    sorted(&mut found);
    found
}

/// A desktop session's plumbing, whose names read as secrets and whose values are not: sockets and
/// files (`SSH_AUTH_SOCK`, `XAUTHORITY`, `GNOME_KEYRING_CONTROL`: paths), bus addresses
/// (`DBUS_SESSION_BUS_ADDRESS=unix:…`), and the session's kind (`DESKTOP_SESSION=ubuntu`).
fn session_plumbing(name: &str, value: &str) -> bool {
    value.starts_with('/')
        || value.starts_with("unix:")
        || value.starts_with("local/")
        || name.starts_with("XDG_SESSION")
        || name == "DESKTOP_SESSION"
}

fn sorted(found: &mut Vec<String>) {
    found.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    found.dedup();
}

/// Remembers the secret values `doc` holds ([`secret_values`]: a scenario's `launch.env`, the
/// secret flags of its command) for every output this process writes from now on. The harness
/// calls it as each scenario starts, before any line about that run is printed.
pub fn learn(doc: &Value) {
    learn_values(&secret_values(doc));
}

fn learn_values(values: &[String]) {
    if values.is_empty() {
        return;
    }
    let mut known = store().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = known.len();
    known.extend(values.iter().filter(|v| !v.contains(REDACTED)).cloned());
    if known.len() != before {
        sorted(&mut known);
    }
}

/// Removes terminal control sequences and control characters (tab and newline stay): CSI
/// sequences (`ESC [ … final`, ANSI colours among them), OSC, DCS, APC, PM and SOS strings with
/// their payload up to BEL or `ESC \\` (an OSC 52 clipboard write, an OSC 0 title), their 8-bit
/// forms, and other two-character escapes. With `keep_colours`, colour sequences (`ESC [` digits
/// and `;` then `m`), `ESC [ K` and carriage returns are kept: ups-doctor's own styling.
pub fn strip_controls(s: &str, keep_colours: bool) -> Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        let introducer = match c {
            '\u{1b}' => chars.next(),
            '\u{9b}' => Some('['),
            '\u{9d}' => Some(']'),
            '\u{90}' => Some('P'),
            '\u{98}' => Some('X'),
            '\u{9e}' => Some('^'),
            '\u{9f}' => Some('_'),
            '\r' if keep_colours => {
                out.push(c);
                continue;
            }
            c if c == '\t' || c == '\n' || !c.is_control() => {
                out.push(c);
                continue;
            }
            _ => continue,
        };
        match introducer {
            Some('[') => {
                let mut seq = String::new();
                for c in chars.by_ref() {
                    seq.push(c);
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
                let colour = seq.ends_with('m')
                    && seq[..seq.len() - 1].chars().all(|c| c.is_ascii_digit() || c == ';');
                if keep_colours && (colour || seq == "K") {
                    out.push_str("\u{1b}[");
                    out.push_str(&seq);
                }
            }
            // A string up to its terminator: BEL, ST (`ESC \\`) or the 8-bit ST.
            Some(']' | 'P' | 'X' | '^' | '_') => {
                while let Some(c) = chars.next() {
                    if c == '\u{7}' || c == '\u{9c}' {
                        break;
                    }
                    if c == '\u{1b}' {
                        if chars.peek() == Some(&'\\') {
                            chars.next();
                        }
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    Cow::Owned(out)
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

/// The text of an outgoing JSON document (`pretty` or on one line, ending in a newline), masked as
/// a document by the one rule ([`scrub_json`]).
///
/// # Errors
///
/// The document cannot be encoded as JSON.
pub fn json_text(doc: &impl serde::Serialize, pretty: bool) -> Result<String, serde_json::Error> {
    let mut value = serde_json::to_value(doc)?;
    scrub_json(&mut value);
    let text = if pretty { serde_json::to_string_pretty(&value)? } else { serde_json::to_string(&value)? };
    Ok(text + "\n")
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

    /// Issue 57, defect 3: a password with `/` (AWS, base64) is masked whole; the path after the
    /// host, and a port followed by a path, are left alone.
    #[test]
    fn url_passwords_with_slashes_are_masked_whole_and_the_path_kept() {
        for (password, rest) in [
            ("abc/def+g==", "host/path"),
            ("wJalr/K7MDENG/bPxRfiCY==", "bucket/key"),
            ("hunter2", "10.0.0.1:29500"),
        ] {
            let text = format!("get s3://user:{password}@{rest} ok");
            assert_eq!(mask_text(&text), format!("get s3://user:<redacted>@{rest} ok"), "{text}");
        }
        for kept in ["https://host:8080/path@v1 stays", "pip install git+https://github.com/org/repo@v1.0"] {
            assert_eq!(mask_text(kept), kept);
        }
        // Quoted (a JSON document's text): the password stops at the quote.
        assert_eq!(
            mask_text(r#""https://u:p/w@h/x", "user@mail""#),
            r#""https://u:<redacted>@h/x", "user@mail""#
        );
    }

    /// Issue 57, defect 16: OSC strings go with their payload (BEL or ST ended), CSI colours and
    /// 8-bit forms too; ups-doctor's own styling keeps colours and erase-line only.
    #[test]
    fn control_sequences_go_with_their_payload() {
        let text = "err \u{1b}]52;c;c2VjcmV0\u{7}\u{1b}]0;title\u{1b}\\ \u{1b}[31mred\u{1b}[0m \u{9d}8;;x\u{9c}\u{9b}2Jend\r\u{7}";
        assert_eq!(strip_controls(text, false), "err  red end");
        assert_eq!(
            strip_controls("\r\u{1b}[K\u{1b}[38;5;9m NOT MET \u{1b}[39m\u{1b}]0;t\u{7}\u{1b}[2J", true),
            "\r\u{1b}[K\u{1b}[38;5;9m NOT MET \u{1b}[39m"
        );
        assert_eq!(scrub("key \u{1b}]52;c;QUJD\u{7}line"), "key line");
        assert!(matches!(strip_controls("plain\ttext\n", false), Cow::Borrowed(_)));
    }

    /// Issue 57, defect 2: ups-doctor's own environment gives the values of variables whose names
    /// suggest a secret; a session's plumbing and ordinary variables are left alone.
    #[test]
    fn secrets_of_the_own_environment_are_collected() {
        let vars = [
            ("HF_TOKEN", "hf_sh0rtT0ken"),
            ("WANDB_API_KEY", "wandb0secret0value"),
            ("DB_PASS", "tiny"),
            ("PATH", "/usr/bin:/bin"),
            ("SSH_AUTH_SOCK", "/tmp/ssh-x/agent.1"),
            ("DESKTOP_SESSION", "ubuntu"),
            ("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/1000/bus"),
            ("OMP_NUM_THREADS", "4"),
        ]
        .map(|(n, v)| (n.into(), v.into()));
        assert_eq!(environment_secrets(vars), ["wandb0secret0value", "hf_sh0rtT0ken"]);
    }

    /// Issue 57, defect 1: what the harness learnt as a scenario started (its `launch.env`, its
    /// command's secret flags) is masked in any text scrubbed later, such as the terminal's
    /// headline and key line, and attach's command lines are masked by the flag rule.
    #[test]
    fn learnt_values_are_masked_in_every_scrubbed_line() {
        learn(&serde_json::json!({
            "command": ["python", "t.py", "--api-key", "learnt-flag-value"],
            "launch": {"env": {"API_TOKEN": "learnt-env-value"}}
        }));
        let line = "  ✗ x: RuntimeError: auth failed for learnt-env-value with learnt-flag-value";
        assert_eq!(scrub(line), "  ✗ x: RuntimeError: auth failed for <redacted> with <redacted>");
        assert_eq!(
            scrub("attaching to python train.py --api-key ak-1234567 https://u:p/w@h (pid 3)"),
            "attaching to python train.py --api-key <redacted> https://u:<redacted>@h (pid 3)"
        );
    }
}
