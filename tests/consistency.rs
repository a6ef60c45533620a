//! The reports never contradict their own `result.json` (issue 30): every count, time, rank, role
//! and label in a report's text is read back with a regex and compared with the JSON it was
//! rendered from. [`check_run_dir`] runs over every committed example here and, through
//! `Sandbox::run_with`, over every report the other integration tests produce.
//!
//! The checker is written against the JSON as data (`serde_json::Value`), never against the
//! renderer's own helpers: a check that called the code it checks could not fail.

use std::path::{Path, PathBuf};

use regex::Regex;
use serde_json::Value;

/// Slack for times: the report prints seconds with one decimal (two below one second), so a
/// value read back is off by at most half its last digit; this is that, plus clock stamps taken
/// by two processes (a marker's writer and the harness) a few milliseconds apart.
const TIME_SLACK_S: f64 = 0.06;

/// The contradictions between the reports of the run folder `dir` and its `result.json`: the
/// run's `report.md`, each scenario's `N-name/report.md` beside it, and any run folder nested in
/// it (a multi-node run's `nodeK/`). Empty when every report is consistent.
pub fn check_run_dir(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    check_one(dir, &mut out);
    out
}

fn check_one(dir: &Path, out: &mut Vec<String>) {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let (json, report) = match (read(&dir.join("result.json")), read(&dir.join("report.md"))) {
        (Ok(j), Ok(r)) => (j, r),
        (Err(e), _) | (_, Err(e)) => return out.push(e),
    };
    let run: Value = match serde_json::from_str(&json) {
        Ok(v) => v,
        Err(e) => return out.push(format!("{}: result.json does not parse: {e}", dir.display())),
    };
    let mut found = Vec::new();
    let scenarios = run["scenarios"].as_array().cloned().unwrap_or_default();
    let not_run = run["not_run"].as_array().map_or(0, Vec::len);
    let summary = scenarios.len() + not_run > 1;
    let sub_dirs = sub_dirs(dir);
    if summary {
        found.extend(check_summary(&report, &run).into_iter().map(|c| format!("report.md: {c}")));
        let mut seen = vec![false; scenarios.len()];
        for sub in &sub_dirs {
            let Ok(text) = std::fs::read_to_string(sub.join("report.md")) else { continue };
            if sub.join("result.json").is_file() {
                continue; // a nested run folder: checked below against its own result.json
            }
            let name = sub.file_name().unwrap().to_string_lossy().into_owned();
            match scenario_index(&text, scenarios.len() + not_run) {
                Ok(i) if i < scenarios.len() => {
                    seen[i] = true;
                    found.extend(
                        check_scenario(&text, &scenarios[i])
                            .into_iter()
                            .map(|c| format!("{name}/report.md: {c}")),
                    );
                }
                Ok(i) => found.push(format!(
                    "{name}/report.md: scenario {} of a run with {} results",
                    i + 1,
                    scenarios.len()
                )),
                Err(c) => found.push(format!("{name}/report.md: {c}")),
            }
        }
        for (i, s) in scenarios.iter().enumerate().filter(|(i, _)| !seen[*i]) {
            found.push(format!("scenario {} ({}) has no full report beside report.md", i + 1, s["name"]));
        }
    } else if let Some(s) = scenarios.first() {
        found.extend(check_header(&report, &run).into_iter().map(|c| format!("report.md: {c}")));
        found.extend(check_scenario(&report, s).into_iter().map(|c| format!("report.md: {c}")));
    }
    out.extend(found.into_iter().map(|c| format!("{}/{c}", dir.display())));
    for sub in &sub_dirs {
        // A multi-node run keeps each node's own run folder inside the scenario's.
        for nested in std::iter::once(sub.clone()).chain(self::sub_dirs(sub)) {
            if nested.join("result.json").is_file() && nested.join("report.md").is_file() {
                check_one(&nested, out);
            }
        }
    }
}

fn sub_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// `pattern` compiled once for the whole test binary (the checks run over thousands of lines).
fn re(pattern: &'static str) -> &'static Regex {
    static CACHE: std::sync::Mutex<Vec<(&'static str, &'static Regex)>> = std::sync::Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, r)) = cache.iter().find(|(p, _)| *p == pattern) {
        return r;
    }
    let compiled: &'static Regex = Box::leak(Box::new(Regex::new(pattern).expect("a valid regex")));
    cache.push((pattern, compiled));
    compiled
}

/// `Scenario K of N of one run`: which scenario a full report is of (0-based).
fn scenario_index(text: &str, total: usize) -> Result<usize, String> {
    let caps = re(r"(?m)^Scenario (\d+) of (\d+) of one run")
        .captures(text)
        .ok_or("a scenario's full report does not say which scenario of the run it is")?;
    let (k, n): (usize, usize) = (caps[1].parse().unwrap(), caps[2].parse().unwrap());
    if n != total {
        return Err(format!("says \"Scenario {k} of {n}\" but the run has {total} scenarios"));
    }
    if k == 0 {
        return Err("says \"Scenario 0\"".into());
    }
    Ok(k - 1)
}

/// The opening line of a run's `report.md`: `Ran N scenario(s): …`.
fn check_header(text: &str, run: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let scenarios = run["scenarios"].as_array().map_or(&[][..], Vec::as_slice);
    let caps = re(r"(?m)^Ran (\d+) scenarios?: (.*)$").captures(text);
    match caps {
        None if scenarios.is_empty() => {}
        None => found.push("no \"Ran N scenarios\" line".to_string()),
        Some(c) => {
            let n: usize = c[1].parse().unwrap();
            if n != scenarios.len() {
                found.push(format!("says \"Ran {n} scenarios\" but result.json has {}", scenarios.len()));
            }
            let met = scenarios.iter().filter(|s| s["met_expectation"] == true).count();
            let rest = &c[2];
            let says_all = rest.starts_with("all met") || rest.starts_with("it met");
            let says_none = rest.starts_with("**none**") || rest.starts_with("it did **not**");
            if says_all && met != scenarios.len() {
                found.push(format!("says all met their expectation but {met} of {} did", scenarios.len()));
            }
            if says_none && met != 0 {
                found.push(format!("says none met its expectation but {met} did"));
            }
            if let Some(m) = re(r"^(\d+) met (?:its|their) expectation, \*\*(\d+)\*\* did not").captures(rest)
            {
                let (m_met, m_not): (usize, usize) = (m[1].parse().unwrap(), m[2].parse().unwrap());
                if (m_met, m_not) != (met, scenarios.len() - met) {
                    found.push(format!(
                        "says {m_met} met and {m_not} did not, but result.json has {met} and {}",
                        scenarios.len() - met
                    ));
                }
            }
        }
    }
    found
}

/// The summary `report.md` of a run with several scenarios: its opening line, the table (one row
/// per scenario) and each failed scenario's heading and verdict.
fn check_summary(text: &str, run: &Value) -> Vec<String> {
    let mut found = check_header(text, run);
    let scenarios = run["scenarios"].as_array().map_or(&[][..], Vec::as_slice);
    let table = table_after(text, "| scenario |");
    for row in &table {
        let name = cell(row, "scenario").unwrap_or_default();
        let Some(s) = scenarios.iter().find(|s| unescape(&name) == s["name"].as_str().unwrap_or("")) else {
            if cell(row, "outcome").as_deref() != Some("not run") {
                found.push(format!("the table has a row for `{name}`, a scenario result.json does not have"));
            }
            continue;
        };
        let want = scenario_phrase(s);
        if let Some(outcome) = cell(row, "outcome")
            && outcome != want
        {
            found.push(format!("table row `{name}`: outcome \"{outcome}\" but result.json says \"{want}\""));
        }
        if let Some(ranks) = cell(row, "ranks")
            && ranks != s["scenario"]["launch"]["world_size"].to_string()
        {
            found.push(format!(
                "table row `{name}`: {ranks} ranks but the scenario has world_size {}",
                s["scenario"]["launch"]["world_size"]
            ));
        }
        if let Some(expect) = cell(row, "expect") {
            let want = expectation_word(s);
            if expect != want {
                found
                    .push(format!("table row `{name}`: expect \"{expect}\" but result.json says \"{want}\""));
            }
        }
        if let Some(wall) = cell(row, "wall") {
            match (parse_secs(&wall), s["wall_s"].as_f64()) {
                (Some((v, slack)), Some(w)) if (v - w).abs() > slack => {
                    found.push(format!("table row `{name}`: wall {wall} but result.json's wall_s is {w:.3}"))
                }
                (None, Some(_)) => found.push(format!("table row `{name}`: wall `{wall}` is not a time")),
                _ => {}
            }
        }
        if let Some(speed) = cell(row, "steps/s") {
            match (speed.parse::<f64>().ok(), s["steps_per_s"].as_f64()) {
                (None, None) => {}
                (Some(v), Some(w)) if (v - w).abs() <= 0.006 => {}
                _ => found.push(format!(
                    "table row `{name}`: steps/s {speed} but result.json's steps_per_s is {}",
                    s["steps_per_s"]
                )),
            }
        }
    }
    if table.len() != scenarios.len() + run["not_run"].as_array().map_or(0, Vec::len) {
        found.push(format!("the table has {} rows for {} scenarios", table.len(), scenarios.len()));
    }
    for (name, section) in sections(text) {
        match scenarios.iter().find(|s| s["name"].as_str() == Some(name.as_str())) {
            Some(s) => found.extend(check_verdict(&section, s)),
            None => found.push(format!("a section for `{name}`, a scenario result.json does not have")),
        }
    }
    found
}

/// A scenario's full report against its result.
fn check_scenario(text: &str, s: &Value) -> Vec<String> {
    let name = s["name"].as_str().unwrap_or("");
    let mut found = Vec::new();
    let sections = sections(text);
    match sections.as_slice() {
        [(n, section)] if n == name => found.extend(check_verdict(section, s)),
        _ => found.push(format!("the report has no one `## {name}: …` section")),
    }
    found.extend(check_rank_table(text, s));
    found.extend(check_times(text, s));
    found.extend(check_stacks(text, s));
    found.extend(check_memory(text, s));
    found.into_iter().map(|c| format!("`{name}`: {c}")).collect()
}

/// `## name: outcome` sections, the heading's outcome checked here by [`check_verdict`] through the
/// returned text (its first line is the heading).
fn sections(text: &str) -> Vec<(String, String)> {
    let heading = re(r"(?m)^## (.+?): (.+)$");
    let starts: Vec<(usize, String)> = heading
        .captures_iter(text)
        .filter(|c| c[1].trim() != "Environment")
        .map(|c| (c.get(0).unwrap().start(), unescape(&c[1])))
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(i, (at, name))| {
            let end = starts.get(i + 1).map_or(text.len(), |n| n.0);
            let end = text[*at..end].find("\n## Environment").map_or(end, |e| at + e);
            (name.clone(), text[*at..end].to_string())
        })
        .collect()
}

/// A scenario's heading, headline, pattern and expectation line against its result.
fn check_verdict(section: &str, s: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let heading = section.lines().next().unwrap_or("");
    let words = heading.split_once(": ").map_or("", |(_, w)| w);
    let want = scenario_phrase(s);
    if unescape(words) != want {
        found.push(format!("heading \"{heading}\" but result.json's outcome is \"{want}\""));
    }
    let first = s["first_failure"].as_u64();
    let headline =
        section.lines().find(|l| l.starts_with("**") && !l.starts_with("**Key line")).unwrap_or("");
    if let Some(c) =
        re(r"^\*\*Rank (\d+) (?:was|hung|exited|failed|ended|raised|passed|timed)").captures(headline)
    {
        let named: u64 = c[1].parse().unwrap();
        if first != Some(named) {
            found.push(format!(
                "the headline names rank {named} first but result.json's first_failure is {first:?}"
            ));
        }
    }
    let ranks = s["ranks"].as_array().map_or(&[][..], Vec::as_slice);
    let collateral: Vec<u64> = ranks
        .iter()
        .filter(|r| r["collateral"] == true && r["rank"].as_u64() != first)
        .filter_map(|r| r["rank"].as_u64())
        .collect();
    let mut named = Vec::new();
    for c in re(r"Ranks? ([0-9, –]+) failed after it \(collateral\)").captures_iter(headline) {
        named.extend(rank_list(&c[1]));
    }
    // A rank whose process was not identified is named with why; one whose rank number is
    // unknown, by its pid (the verdict's `rank_name`).
    for c in re(r"Rank (\d+) \(its process was not identified: the launcher's status\) failed after it \(collateral\)")
        .captures_iter(headline)
    {
        named.extend(c[1].parse::<u64>().ok());
    }
    for c in
        re(r"[Tt]he process (\d+) below the launcher \(rank number unknown\) failed after it \(collateral\)")
            .captures_iter(headline)
    {
        let pid: u64 = c[1].parse().unwrap();
        match ranks.iter().find(|r| r["pid"].as_u64() == Some(pid)) {
            Some(r) => named.extend(r["rank"].as_u64()),
            None => {
                found.push(format!("the headline names process {pid} collateral, which is no rank's pid"))
            }
        }
    }
    named.sort_unstable();
    let mut want_named = collateral.clone();
    want_named.sort_unstable();
    if named != want_named {
        found.push(format!(
            "the headline names ranks {named:?} collateral but result.json has {want_named:?}"
        ));
    }
    for line in section.lines() {
        if let Some(c) = re(r"^\*\*Pattern:\*\* .*?`([a-z0-9-]+)`").captures(line) {
            let want = s["verdict"]["pattern"].as_str();
            if want != Some(&c[1]) {
                found.push(format!("pattern `{}` but result.json's pattern is {:?}", &c[1], want));
            }
        }
        if line.starts_with("**Expected:**") {
            let met = line.ends_with("— met.");
            if met != (s["met_expectation"] == true) {
                found.push(format!(
                    "\"{line}\" but result.json's met_expectation is {}",
                    s["met_expectation"]
                ));
            }
        }
        if let Some(c) = re(r"last marker from rank (\d+) at ([0-9.]+) s").captures(line) {
            let at: f64 = c[2].parse().unwrap();
            let wall = s["wall_s"].as_f64().unwrap_or(f64::INFINITY);
            if at > wall + TIME_SLACK_S {
                found.push(format!("\"{}\" after the scenario ended ({wall:.2} s)", &c[0]));
            }
        }
    }
    if s["verdict"]["pattern"].is_string() && !section.contains("**Pattern:**") {
        found.push(format!("no **Pattern:** line but result.json's pattern is {}", s["verdict"]["pattern"]));
    }
    found
}

/// `1, 3–5, 9` as rank numbers.
fn rank_list(text: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('–') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<u64>(), b.trim().parse::<u64>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<u64>().ok()),
        }
    }
    out
}

/// The rank table: each row's rank, its role (first failure / collateral), pid, outcome and steps.
fn check_rank_table(text: &str, s: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let ranks = s["ranks"].as_array().map_or(&[][..], Vec::as_slice);
    let rows = table_after(text, "| rank |")
        .into_iter()
        .chain(table_after(text, "| node | rank |"))
        .collect::<Vec<_>>();
    // A row is one rank (`3`, `**3** (first failure)`) or, above 16 ranks, a class of ranks with the
    // same row (`ranks 0–752, 754–1023 (1,023 ranks) (collateral)`), its list cut after a dozen
    // pieces (`…`): every rank it lists is checked, and the counts add up to the ranks.
    let class = re(r"^ranks (.+?) \(([\d,]+) ranks\)");
    let mut counted = 0;
    // (row, rank, its label, whether the row is that rank's alone)
    type Named<'a> = (&'a Vec<(String, String)>, u64, String, bool);
    let mut named: Vec<Named> = Vec::new();
    for row in &rows {
        let label = cell(row, "rank").unwrap_or_default();
        if let Some(c) = class.captures(&label) {
            counted += c[2].replace(',', "").parse::<usize>().unwrap_or(0);
            let listed = rank_list(c[1].trim_end_matches(", …"));
            named.extend(listed.into_iter().map(|n| (row, n, label.clone(), false)));
            continue;
        }
        let Some(n) = re(r"^\**(\d+)").captures(&label).map(|c| c[1].parse::<u64>().unwrap()) else {
            found.push(format!("rank cell `{label}` names no rank"));
            continue;
        };
        counted += 1;
        named.push((row, n, label, true));
    }
    if counted != ranks.len() {
        found.push(format!("the rank table has {counted} ranks but result.json has {} ranks", ranks.len()));
    }
    let first = s["first_failure"].as_u64();
    for (row, n, label, alone) in named {
        let Some(r) = ranks.iter().find(|r| r["rank"].as_u64() == Some(n)) else {
            found.push(format!("the rank table has rank {n}, result.json does not"));
            continue;
        };
        let says_first = label.contains("(first failure)");
        if says_first != (first == Some(n) && ranks.len() > 1) {
            found
                .push(format!("rank {n} is labelled `{label}` but result.json's first_failure is {first:?}"));
        }
        if label.contains("(collateral)") != (r["collateral"] == true && !says_first) {
            found.push(format!("rank {n} is labelled `{label}` but its collateral is {}", r["collateral"]));
        }
        if let Some(pid) = cell(row, "pid").filter(|_| alone) {
            let want = r["pid"].as_u64().map_or("—".to_string(), |p| p.to_string());
            if pid != want {
                found.push(format!("rank {n}: pid {pid} but result.json's pid is {want}"));
            }
        }
        if let Some(outcome) = cell(row, "outcome") {
            let want = kind_label(r["outcome"].as_str().unwrap_or(""));
            if !outcome.starts_with(want) {
                found.push(format!("rank {n}: outcome `{outcome}` but result.json's outcome is \"{want}\""));
            }
            if let Some(sig) = r["signal"].as_str()
                && !outcome.contains(sig)
            {
                found.push(format!("rank {n}: outcome `{outcome}` does not name its signal {sig}"));
            }
            if let Some(code) = r["exit_code"].as_i64()
                && r["signal"].is_null()
                && !outcome.contains(&format!("exit {code}"))
            {
                found.push(format!("rank {n}: outcome `{outcome}` does not name its exit code {code}"));
            }
        }
        if let Some(steps) = cell(row, "steps done") {
            let done = r["steps_done"].as_u64().unwrap_or(0);
            let unknown = r["markers"].as_u64() == Some(0) && done == 0;
            let ok = if steps == "—" { unknown } else { !unknown && steps == done.to_string() };
            if !ok {
                let want = if unknown { "— (unknown: no marker)".to_string() } else { done.to_string() };
                found.push(format!("rank {n}: steps done `{steps}` but result.json says {want}"));
            }
        }
    }
    found
}

/// Moments in the text: nothing after the scenario's end (`wall_s`), and no rank declared hung
/// later than it ended.
fn check_times(text: &str, s: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let wall = s["wall_s"].as_f64().unwrap_or(f64::INFINITY);
    let ranks = s["ranks"].as_array().map_or(&[][..], Vec::as_slice);
    let declared = re(
        r"Rank (\d+) sent no marker(?: and wrote no output)? for ([^()\n]+?)(?: \(last marker at ([^)\n]+)\))? and was declared hung",
    );
    for c in declared.captures_iter(text) {
        let n: u64 = c[1].parse().unwrap();
        let r = ranks.iter().find(|r| r["rank"].as_u64() == Some(n));
        if r.is_none_or(|r| r["hang_detected_after_s"].is_null()) {
            found.push(format!("\"{}\" but result.json has no hang for rank {n}", &c[0]));
        }
        let Some(last) = c.get(3) else { continue };
        let (Some((silent, a)), Some((last, b))) = (parse_secs(&c[2]), parse_secs(last.as_str())) else {
            found.push(format!("\"{}\": times that do not parse", &c[0]));
            continue;
        };
        let ended = r.and_then(|r| r["ended_at_s"].as_f64()).unwrap_or(wall).min(wall);
        if last + silent > ended + a + b + TIME_SLACK_S {
            found.push(format!(
                "\"{}\": declared hung at {:.2} s, after rank {n} ended ({ended:.2} s)",
                &c[0],
                last + silent
            ));
        }
    }
    // The gantt: every bar and milestone in milliseconds since the scenario started.
    let wall_ms = wall * 1000.0;
    for block in fenced(text, "mermaid").iter().filter(|b| b.starts_with("gantt")) {
        for line in block.lines() {
            let Some(c) = re(r"^\s+(.*?) :(?:milestone, )?(?:crit, )?(\d+), (\d+)$").captures(line) else {
                continue;
            };
            let (mut start, end): (f64, f64) = (c[2].parse().unwrap(), c[3].parse().unwrap());
            // A bar stretched to be visible says how long it really was: `(12 ms)`.
            let mut real_end =
                re(r"\((\d+) ms\)$").captures(&c[1]).map_or(end, |m| start + m[1].parse::<f64>().unwrap());
            // Mermaid draws a milestone at the middle of its span (a span gives its label room).
            if line.contains(":milestone") {
                (start, real_end) = ((start + end) / 2.0, (start + end) / 2.0);
            }
            if start > wall_ms + 1.0 || real_end > wall_ms + 1.0 {
                found.push(format!(
                    "gantt `{}` at {start}–{real_end} ms, after the scenario ended ({wall_ms:.0} ms)",
                    line.trim()
                ));
            }
        }
    }
    for block in fenced(text, "mermaid").iter().filter(|b| b.contains("xychart-beta")) {
        if let Some(c) =
            re(r#"x-axis "seconds since the scenario started" ([0-9.]+) --> ([0-9.]+)"#).captures(block)
        {
            let to: f64 = c[2].parse().unwrap();
            if to > wall + TIME_SLACK_S {
                found.push(format!(
                    "a chart's time axis runs to {to} s, after the scenario ended ({wall:.2} s)"
                ));
            }
        }
    }
    found
}

/// `### Stacks of rank N` and `### Backtrace of OWNER (SIGNAL)`: owned by the rank (or worker)
/// the JSON has them for, with as many threads as it has.
fn check_stacks(text: &str, s: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let ranks = s["ranks"].as_array().map_or(&[][..], Vec::as_slice);
    let rank = |n: u64| ranks.iter().find(|r| r["rank"].as_u64() == Some(n));
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if let Some(c) = re(r"^### Stacks of rank (\d+) at the hang$").captures(line) {
            let n: u64 = c[1].parse().unwrap();
            let stacks = rank(n).and_then(|r| r["stacks"].as_array()).map_or(&[][..], Vec::as_slice);
            if stacks.is_empty() {
                found.push(format!("\"{line}\" but result.json has no stacks for rank {n}"));
                continue;
            }
            let said = lines[i + 1..].iter().find_map(|l| re(r"^(\d+) threads? dumped").captures(l));
            if let Some(k) = said.map(|k| k[1].parse::<usize>().unwrap())
                && k != stacks.len()
            {
                found.push(format!("rank {n}: {k} threads dumped but result.json has {}", stacks.len()));
            }
            let tids: Vec<i64> = stacks.iter().filter_map(|t| t["tid"].as_i64()).collect();
            let next =
                lines[i + 1..].iter().position(|l| l.starts_with("### ")).map_or(lines.len(), |p| i + 1 + p);
            for l in &lines[i + 1..next] {
                if let Some(t) = re(r"\(tid (\d+)\)").captures(l) {
                    let tid: i64 = t[1].parse().unwrap();
                    if !tids.contains(&tid) {
                        found.push(format!(
                            "thread {tid} is shown under rank {n}, whose stacks are of {tids:?}"
                        ));
                    }
                }
            }
        }
        if let Some(c) = re(r"^### Backtrace of (.+) \((.+)\)$").captures(line) {
            let owner = &c[1];
            let Some(n) = re(r"rank (\d+)$").captures(owner).map(|m| m[1].parse::<u64>().unwrap()) else {
                found.push(format!("\"{line}\" names no rank"));
                continue;
            };
            let Some(r) = rank(n) else {
                found.push(format!("\"{line}\": result.json has no rank {n}"));
                continue;
            };
            if r["backtrace"].as_array().is_none_or(Vec::is_empty)
                && r["raw_backtrace"].as_array().is_none_or(Vec::is_empty)
            {
                found.push(format!("\"{line}\" but result.json has no backtrace for rank {n}"));
            }
            let in_worker = owner.contains("worker");
            // The rank's own signal is the rank's: a worker's stack is labelled as the worker's.
            if let Some(sig) = r["signal"].as_str() {
                if in_worker {
                    found.push(format!(
                        "\"{line}\": rank {n} itself was killed by {sig}, the stack is its own"
                    ));
                } else if &c[2] != sig {
                    found.push(format!("\"{line}\" but rank {n} was killed by {sig}"));
                }
            }
            if let Some(w) = re(r"worker (\d+) \(pid (\d+)\)").captures(owner) {
                let (id, pid): (u64, u64) = (w[1].parse().unwrap(), w[2].parse().unwrap());
                let known = r["workers"].as_array().is_some_and(|ws| {
                    ws.iter().any(|x| x["id"].as_u64() == Some(id) && x["pid"].as_u64() == Some(pid))
                });
                if !known {
                    found.push(format!("\"{line}\": rank {n} has no worker {id} with pid {pid}"));
                }
            }
        }
    }
    found
}

/// The memory sections (one per node in a multi-node run, under `### Node K (…)`): the sample
/// count and each process row's pid under its rank and role.
fn check_memory(text: &str, s: &Value) -> Vec<String> {
    let Some(nodes) = s["nodes"]["per_node"].as_array() else { return check_memory_of(text, &s["memory"]) };
    let mut found = Vec::new();
    for node in nodes {
        let heading = format!("### Node {} (", node["node"]);
        let Some(at) = text.find(&heading) else { continue };
        let rest = &text[at + heading.len()..];
        let segment = &rest[..rest.find("\n### Node ").unwrap_or(rest.len())];
        found.extend(
            check_memory_of(segment, &node["memory"])
                .into_iter()
                .map(|c| format!("node {}: {c}", node["node"])),
        );
    }
    found
}

fn check_memory_of(text: &str, m: &Value) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(c) = re(r"Sampled every [^(]+\((\d+) samples?\)").captures(text)
        && m["samples"].as_u64() != c[1].parse().ok()
    {
        found.push(format!("\"{}\" but result.json has {} samples", &c[0], m["samples"]));
    }
    let processes = m["processes"].as_array().map_or(&[][..], Vec::as_slice);
    let mut seen = std::collections::BTreeMap::new();
    for row in table_after(text, "| process | pid |") {
        let who = cell(&row, "process").unwrap_or_default();
        let pid: Option<u64> = cell(&row, "pid").and_then(|p| p.parse().ok());
        // One process, one row: a pid under two labels says it was two things at once.
        if let Some(first) = seen.insert(pid, who.clone()) {
            found.push(format!("memory rows `{first}` and `{who}` are one process, pid {pid:?}"));
        }
        let Some(p) = processes.iter().find(|p| p["pid"].as_u64() == pid) else {
            found.push(format!("memory row `{who}` with pid {pid:?}, a process result.json does not have"));
            continue;
        };
        let rank = re(r"^rank (\d+)").captures(&who).map(|c| c[1].parse::<u64>().unwrap());
        // `rank 0`, `rank 0 · worker 1`, `rank 0 · child `pt_data_worker`` (a program's own
        // process, whose command may say "worker": the role is the word after the dot).
        let role = match who.split_once(" · ").map(|(_, r)| r) {
            Some(r) if r.starts_with("worker") => "worker",
            Some(r) if r.starts_with("child") => "child",
            Some(_) => "an unknown role",
            None => "rank",
        };
        if rank != p["rank"].as_u64() || p["role"].as_str() != Some(role) {
            found.push(format!(
                "memory row `{who}` (pid {pid:?}) but result.json has it as {} of rank {}",
                p["role"], p["rank"]
            ));
        }
    }
    found
}

/// The rows of the markdown table whose header line starts with `header`, as (column, cell)
/// pairs, cells with markdown's escapes undone.
fn table_after(text: &str, header: &str) -> Vec<Vec<(String, String)>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate().filter(|(_, l)| l.starts_with(header)) {
        let names = split_row(line);
        for row in lines[i + 2..].iter().take_while(|l| l.starts_with('|')) {
            out.push(names.iter().cloned().zip(split_row(row)).collect());
        }
    }
    out
}

/// A table row's cells: `|` inside a code span or escaped as `\|` does not split.
fn split_row(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = vec![String::new()];
    let (mut code, mut escaped) = (false, false);
    for ch in inner.chars() {
        match ch {
            '|' if !code && !escaped => cells.push(String::new()),
            _ => {
                if ch == '`' && !escaped {
                    code = !code;
                }
                escaped = ch == '\\' && !escaped;
                cells.last_mut().unwrap().push(ch);
            }
        }
    }
    cells.into_iter().map(|c| c.trim().to_string()).collect()
}

fn cell(row: &[(String, String)], column: &str) -> Option<String> {
    row.iter().find(|(c, _)| c == column).map(|(_, v)| v.clone())
}

/// Markdown's backslash escapes undone: `a\_b` → `a_b`.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.peek().is_some_and(|n| n.is_ascii_punctuation()) {
            out.push(chars.next().unwrap());
        } else {
            out.push(c);
        }
    }
    out
}

/// The bodies of the fenced blocks of `lang`.
fn fenced(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match &mut current {
            None if line == format!("```{lang}") => current = Some(String::new()),
            Some(body) if line == "```" => {
                out.push(body.trim_end().to_string());
                current = None;
            }
            Some(body) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    out
}

/// A time as the report prints it (`0.35 s`, `4.2 s`, `2 min 05 s`, `1 h 02 min`), with how far
/// the printed value may be from the real one.
fn parse_secs(text: &str) -> Option<(f64, f64)> {
    // Table cells keep a number and its unit together with a no-break space.
    let t = &text.trim().replace('\u{a0}', " ");
    if let Some(c) = re(r"^(\d+) h (\d+) min$").captures(t) {
        return Some((c[1].parse::<f64>().ok()? * 3600.0 + c[2].parse::<f64>().ok()? * 60.0, 30.0));
    }
    if let Some(c) = re(r"^(\d+) min (\d+) s$").captures(t) {
        return Some((c[1].parse::<f64>().ok()? * 60.0 + c[2].parse::<f64>().ok()?, 0.5));
    }
    let c = re(r"^(\d+)(?:\.(\d+))? s$").captures(t)?;
    let value: f64 = t.trim_end_matches(" s").parse().ok()?;
    let decimals = c.get(2).map_or(0, |d| d.as_str().len()) as i32;
    Some((value, 0.5 * 10f64.powi(-decimals) + 1e-9))
}

/// The outcome of a scenario in words, from its JSON alone: its outcome with the first failing
/// rank's signal or exit code.
fn scenario_phrase(s: &Value) -> String {
    let first = s["first_failure"].as_u64();
    // Interrupted with no failure of its own: its ranks' ends were ups-doctor's teardown.
    if s["interrupted"] == true && first.is_none() && s["outcome"] != "passed" {
        return "interrupted".to_string();
    }
    let rank = s["ranks"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| first.is_some() && r["rank"].as_u64() == first));
    let signal = rank.and_then(|r| r["signal"].as_str());
    let code = rank.and_then(|r| r["exit_code"].as_i64());
    match (s["outcome"].as_str().unwrap_or(""), signal, code) {
        ("signaled", Some(sig), _) => format!("killed by {sig}"),
        ("exited", _, Some(code)) => format!("exited with code {code}"),
        ("exited", _, None) => "exited with an error".to_string(),
        (kind, _, _) => kind_label(kind).to_string(),
    }
}

/// An outcome kind of result.json in the report's words.
fn kind_label(kind: &str) -> &'static str {
    match kind {
        "passed" => "passed",
        "false_success" => "false success",
        "exited" => "exited",
        "signaled" => "killed by signal",
        "hung" => "hung",
        "timed_out" => "timed out",
        "launch_failed" => "failed to launch",
        _ => "an outcome result.json does not know",
    }
}

fn expectation_word(s: &Value) -> &'static str {
    if s["interrupted"] == true {
        "interrupted"
    } else if s["met_expectation"] == true {
        "met"
    } else {
        "NOT MET"
    }
}

/// The contradictions between a bisect's `bisect.md` and the `bisect.json` it was rendered from
/// (the folder `ups-doctor bisect` wrote): its verdict (the failure, what it still happens with,
/// what makes it pass), the runs and the budget, how flaky it was, the minimal command or
/// scenario, the boundary table and every probe's row.
pub fn check_bisect_dir(dir: &Path) -> Vec<String> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).map_err(|e| format!("{name}: {e}"));
    let (json, text) = match (read("bisect.json"), read("bisect.md")) {
        (Ok(j), Ok(t)) => (j, t),
        (Err(e), _) | (_, Err(e)) => return vec![e],
    };
    let r: Value = match serde_json::from_str(&json) {
        Ok(v) => v,
        Err(e) => return vec![format!("bisect.json does not parse: {e}")],
    };
    let mut out = Vec::new();
    let title = format!("# ups-doctor bisect: {}", r["original"]["name"].as_str().unwrap_or_default());
    if text.lines().next() != Some(title.as_str()) {
        out.push(format!("the title is not `{title}`"));
    }
    if r["signature"].is_null() {
        if !text.contains("**The scenario did not fail**") {
            out.push("bisect.json has no signature (it did not fail), the report does not say so".into());
        }
        return out.into_iter().map(|c| format!("bisect.md: {c}")).collect();
    }
    out.extend(check_bisect_verdict(&text, &r));
    out.extend(check_bisect_command(&text, &r));
    out.extend(check_bisect_tables(&text, &r));
    out.into_iter().map(|c| format!("bisect.md: {c}")).collect()
}

/// Every `code` span of `text`, in order.
fn code_spans(text: &str) -> Vec<String> {
    re(r"`([^`]+)`").captures_iter(text).map(|c| c[1].to_string()).collect()
}

fn strings_of(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_string)).collect()
}

/// The verdict lines: the failure, what it still happens with, what makes it pass, the runs.
fn check_bisect_verdict(text: &str, r: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let sig = &r["signature"];
    match re(r"(?m)^\*\*The failure \((.+?)\) still happens with (.+)\.\*\*$").captures(text) {
        None => out.push("no verdict line `The failure (…) still happens with …`".into()),
        Some(c) => {
            let outcome = sig["outcome"].as_str().unwrap_or_default().replace('_', " ");
            if !c[1].starts_with(&outcome) {
                out.push(format!("the failure reads `{}` but the signature's outcome is `{outcome}`", &c[1]));
            }
            if let Some(signal) = sig["signal"].as_str()
                && !c[1].contains(signal)
            {
                out.push(format!("the failure reads `{}` but the signature's signal is {signal}", &c[1]));
            }
            let delta = strings_of(&r["minimal_delta"]);
            let said =
                if c[2].starts_with("the original configuration") { Vec::new() } else { code_spans(&c[2]) };
            if said != delta {
                out.push(format!("it still happens with {said:?}, but minimal_delta is {delta:?}"));
            }
        }
    }
    let passing: Vec<String> = r["boundary_detail"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["passes"] == true)
        .filter_map(|b| b["cut"].as_str().map(str::to_string))
        .collect();
    match re(r"(?m)^It passes once any one of these is applied: (.+)\. Those components").captures(text) {
        Some(c) if code_spans(&c[1]) != passing => {
            out.push(format!("it passes once {:?}, but the passing cuts are {passing:?}", code_spans(&c[1])))
        }
        None if !passing.is_empty() => out.push(format!("no line of what makes it pass, but {passing:?} do")),
        _ => {}
    }
    match re(r"(\d+) real runs? of a budget of (\d+)\.").captures(text) {
        Some(c) if (c[1].parse().ok(), c[2].parse().ok()) != (r["runs"].as_u64(), r["budget"].as_u64()) => {
            out.push(format!(
                "{} real runs of a budget of {}, but bisect.json has {} of {}",
                &c[1], &c[2], r["runs"], r["budget"]
            ))
        }
        None => out.push("no line of the runs and the budget".into()),
        _ => {}
    }
    let flaky = re(r"The original fails in ([\d.]+)% of runs \(flaky\)").captures(text);
    match (r["is_flaky"].as_bool(), flaky) {
        (Some(true), Some(c)) => {
            let said: f64 = c[1].parse().unwrap_or(-1.0);
            let rate = r["flaky"].as_f64().unwrap_or(-1.0) * 100.0;
            if (said - rate).abs() > 0.5 + 1e-9 {
                out.push(format!("it fails in {said}% of runs, but the observed rate is {rate:.2}%"));
            }
        }
        (Some(true), None) => out.push("bisect.json says flaky, the report does not".into()),
        (_, Some(_)) => out.push("the report says flaky, bisect.json does not".into()),
        _ => {}
    }
    if text.contains("The budget ran out") != (r["budget_exhausted"] == true) {
        out.push(format!("the budget warning does not match budget_exhausted = {}", r["budget_exhausted"]));
    }
    out
}

/// A command's minimal failing command line and what makes it pass, and the minimal scenario.
fn check_bisect_command(text: &str, r: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let section =
        text.split("## Minimal failing command\n").nth(1).map(|s| s.split("\n## ").next().unwrap_or(s));
    match (&r["minimal_command"], section) {
        (Value::Null, Some(_)) => out.push("a minimal failing command, but bisect.json has none".into()),
        (Value::Null, None) => {}
        (_, None) => out.push("bisect.json has a minimal command, the report shows none".into()),
        (m, Some(section)) => {
            let line = m["line"].as_str().unwrap_or_default();
            if fenced(section, "sh") != [line.to_string()] {
                out.push(format!(
                    "the command to paste is {:?}, bisect.json's is {line:?}",
                    fenced(section, "sh")
                ));
            }
            let said_nodes = re(r"on each of its (\d+) nodes").captures(section).map(|c| c[1].to_string());
            if said_nodes != m["nodes"].as_u64().map(|n| n.to_string()) {
                out.push(format!(
                    "the command is run on each of {said_nodes:?} nodes, bisect.json's nodes is {}",
                    m["nodes"]
                ));
            }
            let passes = strings_of(&m["passes_once"]);
            let said = re(r"(?m)^It passes once (.+)\.$").captures(section).map(|c| c[1].to_string());
            if said
                .as_deref()
                .map(|s| s.split(", or once ").map(str::to_string).collect::<Vec<_>>())
                .unwrap_or_default()
                != passes
            {
                out.push(format!("it passes once {said:?}, bisect.json's passes_once is {passes:?}"));
            }
        }
    }
    let scenario =
        fenced(text, "json").into_iter().next().and_then(|j| serde_json::from_str::<Value>(&j).ok());
    match scenario {
        None => out.push("no minimal failing scenario as JSON".into()),
        Some(shown) => {
            let mut leaves = Vec::new();
            json_leaves(&shown, String::new(), &mut leaves);
            for (field, value) in leaves {
                let theirs = r["minimal"].pointer(&field);
                if theirs != Some(&value) {
                    out.push(format!(
                        "the minimal scenario's `{field}` is {value}, bisect.json's is {theirs:?}"
                    ));
                }
            }
        }
    }
    out
}

/// Every scalar of `v` with its JSON pointer.
fn json_leaves(v: &Value, at: String, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(o) => o.iter().for_each(|(k, x)| json_leaves(x, format!("{at}/{k}"), out)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| json_leaves(x, format!("{at}/{i}"), out)),
        scalar => out.push((at, scalar.clone())),
    }
}

/// The boundary table and the probes table, row by row.
fn check_bisect_tables(text: &str, r: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let boundary = r["boundary_detail"].as_array().cloned().unwrap_or_default();
    let rows = table_after(text, "| component | cut |");
    if rows.len() != boundary.len() {
        out.push(format!(
            "the boundary table has {} rows, bisect.json {} entries",
            rows.len(),
            boundary.len()
        ));
    }
    for (row, b) in rows.iter().zip(&boundary) {
        let result = if b["passes"] == true { "passes" } else { "still fails" };
        let want = [
            ("component", format!("`{}`", b["component"].as_str().unwrap_or_default())),
            ("cut", format!("`{}`", b["cut"].as_str().unwrap_or_default())),
            ("result", result.to_string()),
            ("runs", b["runs"].to_string()),
        ];
        for (column, value) in want {
            if cell(row, column).map(|c| unescape(&c)) != Some(value.clone()) {
                out.push(format!("boundary row {:?}: `{column}` should be {value}", cell(row, "component")));
            }
        }
    }
    let probes = r["probes"].as_array().cloned().unwrap_or_default();
    let rows = table_after(text, "| # | stage |");
    if rows.len() != probes.len() {
        out.push(format!("the probes table has {} rows, bisect.json {} probes", rows.len(), probes.len()));
    }
    for (i, (row, p)) in rows.iter().zip(&probes).enumerate() {
        let delta = strings_of(&p["delta"]);
        let said = cell(row, "configuration delta").unwrap_or_default();
        let said = if said == "(original)" { Vec::new() } else { code_spans(&unescape(&said)) };
        let verdict = match p["verdict"].as_str() {
            Some("same") => "same failure",
            Some("passed") => "passed",
            _ => "**different**",
        };
        let wall = cell(row, "wall").unwrap_or_default();
        let wall_ok = match (p["cached"].as_bool(), parse_secs(&wall), p["wall_s"].as_f64()) {
            (Some(true), ..) => wall == "cached",
            (_, Some((v, slack)), Some(w)) => (v - w).abs() <= slack,
            _ => false,
        };
        if cell(row, "#") != Some((i + 1).to_string())
            || cell(row, "stage").as_deref() != p["stage"].as_str()
            || said != delta
            || cell(row, "signature").as_deref() != Some(verdict)
            || !wall_ok
        {
            out.push(format!("probe {}'s row {row:?} does not match its probe {p}", i + 1));
        }
    }
    out
}

/// The committed examples (`reports/examples/*/`), copied into a temporary folder and each run
/// folder in them re-rendered by this build's `ups-doctor report`, so the check reads what the
/// code writes today and the repository is never touched.
fn rendered_examples() -> tempfile::TempDir {
    let copy = tempfile::tempdir().expect("temp dir");
    let examples = crate::util::repo().join("reports/examples");
    let status = std::process::Command::new("cp").arg("-r").arg(&examples).arg(copy.path()).status().unwrap();
    assert!(status.success(), "cp -r {} failed", examples.display());
    let bisects =
        sub_dirs(&copy.path().join("examples")).into_iter().filter(|d| d.join("bisect.json").is_file());
    for run in run_dirs(&copy.path().join("examples")).into_iter().chain(bisects) {
        let out = std::process::Command::new(crate::util::bin()).arg("report").arg(&run).output().unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "ups-doctor report {} failed: {}",
            run.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    copy
}

/// Every folder under `dir` (itself included) that holds a `result.json` and a `report.md`.
fn run_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if dir.join("result.json").is_file() && dir.join("report.md").is_file() {
        out.push(dir.to_path_buf());
    }
    for sub in sub_dirs(dir) {
        out.extend(run_dirs(&sub));
    }
    out
}

#[test]
fn every_committed_example_is_consistent() {
    let copy = rendered_examples();
    let root = copy.path().join("examples");
    let runs: Vec<PathBuf> =
        sub_dirs(&root).into_iter().filter(|d| d.join("result.json").is_file()).collect();
    assert!(runs.len() >= 3, "the examples' run folders: {runs:?}");
    let bisects: Vec<PathBuf> =
        sub_dirs(&root).into_iter().filter(|d| d.join("bisect.json").is_file()).collect();
    assert!(bisects.len() >= 2, "the examples' bisect folders: {bisects:?}");
    let found: Vec<String> = runs.iter().chain(&bisects).flat_map(|r| check_dir(r)).collect();
    assert!(
        found.is_empty(),
        "the examples contradict their result.json or bisect.json:\n{}",
        found.join("\n")
    );
}

/// [`check_bisect_dir`] for a bisect's folder, else [`check_run_dir`].
fn check_dir(dir: &Path) -> Vec<String> {
    if dir.join("bisect.json").is_file() { check_bisect_dir(dir) } else { check_run_dir(dir) }
}

/// Each check can fail: a re-rendered example is consistent, and the same report with one word,
/// number or label changed to contradict its result.json is caught, with a message naming it.
#[test]
fn every_check_catches_a_contradiction() {
    let copy = rendered_examples();
    let root = copy.path().join("examples");
    // (run folder, file in it, text in the file, replaced by, words the contradiction names)
    let cases: &[(&str, &str, &str, &str, &str)] = &[
        ("run-shipped-scenarios", "report.md", "Ran 27 scenarios", "Ran 26 scenarios", "Ran 26 scenarios"),
        (
            "run-shipped-scenarios",
            "report.md",
            "all met their expectation",
            "**none** met its expectation",
            "none met",
        ),
        (
            "run-shipped-scenarios",
            "report.md",
            "## ddp-rank1-segv: killed by SIGSEGV",
            "## ddp-rank1-segv: killed by SIGBUS",
            "heading",
        ),
        (
            "run-shipped-scenarios",
            "report.md",
            "| 60.39 | 0.93\u{a0}s | met |",
            "| 60.39 | 0.93\u{a0}s | NOT MET |",
            "expect",
        ),
        ("run-shipped-scenarios", "report.md", "| 60.39 | 0.93\u{a0}s |", "| 60.39 | 1.93\u{a0}s |", "wall"),
        ("run-shipped-scenarios", "report.md", "| 60.39 |", "| 61.39 |", "steps/s"),
        (
            "run-shipped-scenarios",
            "report.md",
            "| ddp-rank1-segv | ddp | 2 |",
            "| ddp-rank1-segv | ddp | 3 |",
            "world_size",
        ),
        ("run-shipped-scenarios", "report.md", "(`ranks-out-of-step`)", "(`native-crash`)", "pattern"),
        (
            "run-shipped-scenarios",
            "report.md",
            "Rank 0 failed after it (collateral).**\n\n**Pattern:** Ranks",
            "Rank 1 failed after it (collateral).**\n\n**Pattern:** Ranks",
            "collateral",
        ),
        (
            "run-shipped-scenarios",
            "03-ddp-rank1-segv/report.md",
            "**Rank 1 was killed",
            "**Rank 0 was killed",
            "first_failure",
        ),
        (
            "run-shipped-scenarios",
            "03-ddp-rank1-segv/report.md",
            "last marker from rank 1 at 0.81 s",
            "last marker from rank 1 at 9.81 s",
            "after the scenario ended",
        ),
        (
            "run-shipped-scenarios",
            "03-ddp-rank1-segv/report.md",
            "Scenario 3 of 27",
            "Scenario 3 of 28",
            "Scenario 3 of 28",
        ),
        (
            "run-shipped-scenarios",
            "03-ddp-rank1-segv/report.md",
            "— met.",
            "— **not met**.",
            "met_expectation",
        ),
        ("run-shipped-scenarios", "03-ddp-rank1-segv/report.md", "| 0 (collateral) |", "| 0 |", "collateral"),
        (
            "run-shipped-scenarios",
            "03-ddp-rank1-segv/report.md",
            "| **1** (first failure) |",
            "| 1 (collateral) |",
            "first_failure",
        ),
        (
            "run-shipped-scenarios",
            "03-ddp-rank1-segv/report.md",
            "killed by signal (SIGSEGV)",
            "killed by signal (SIGBUS)",
            "SIGSEGV",
        ),
        (
            "run-shipped-scenarios",
            "03-ddp-rank1-segv/report.md",
            "### Backtrace of rank 1 (SIGSEGV)",
            "### Backtrace of rank 0 (SIGSEGV)",
            "no backtrace for rank 0",
        ),
        (
            "run-shipped-scenarios",
            "03-ddp-rank1-segv/report.md",
            "### Backtrace of rank 1 (SIGSEGV)",
            "### Backtrace of data-loader worker 0 (pid 1) of rank 1 (SIGSEGV)",
            "its own",
        ),
        (
            "run-shipped-scenarios",
            "04-ddp-uneven-steps/report.md",
            "### Stacks of rank 1 at the hang",
            "### Stacks of rank 1 at the hang\n\n### Stacks of rank 5 at the hang",
            "no stacks for rank 5",
        ),
        (
            "run-shipped-scenarios",
            "04-ddp-uneven-steps/report.md",
            "2 threads dumped",
            "3 threads dumped",
            "3 threads",
        ),
        (
            "run-shipped-scenarios",
            "04-ddp-uneven-steps/report.md",
            "(tid 9125)",
            "(tid 30999)",
            "thread 30999",
        ),
        (
            "run-shipped-scenarios",
            "04-ddp-uneven-steps/report.md",
            "and was declared hung.",
            "and was declared hung.\n- Rank 1 sent no marker for 5.0 s (last marker at 7.0 s) and was declared hung.",
            "after rank 1 ended",
        ),
        (
            "run-shipped-scenarios",
            "04-ddp-uneven-steps/report.md",
            "todayMarker off",
            "todayMarker off\n    late :99000, 99001",
            "after the scenario ended",
        ),
        (
            "run-shipped-scenarios",
            "04-ddp-uneven-steps/report.md",
            "| 5 | 3.19 → 8.823 |",
            "| 4 | 3.19 → 8.823 |",
            "steps done `4`",
        ),
        (
            "run-shipped-scenarios",
            "04-ddp-uneven-steps/report.md",
            "| rank 0 | 9125 |",
            "| rank 1 | 9125 |",
            "memory row",
        ),
        (
            "run-shipped-scenarios",
            "04-ddp-uneven-steps/report.md",
            "| rank 1 | 9130 |",
            "| rank 0 · child `python` | 9130 | 1 | 1 | 1 | 1 |\n| rank 1 | 9130 |",
            "are one process",
        ),
        (
            "run-shipped-scenarios",
            "04-ddp-uneven-steps/report.md",
            "(29 samples)",
            "(30 samples)",
            "29 samples",
        ),
        (
            "run-external-scenarios",
            "3-swallowed-error/report.md",
            "| rank | pid | outcome |\n| ---: | ---: | --- |\n| 0 | 15783 | false success (exit 0) |",
            "| rank | pid | outcome | steps done |\n| ---: | ---: | --- | ---: |\n| 0 | 15783 | false success (exit 0) | 0 |",
            "unknown",
        ),
        (
            "bisect-external-workers-pin-memory",
            "bisect.md",
            "still happens with `params.depths=[2]`, `params.workers=1`.",
            "still happens with `params.depths=[2]`, `params.workers=2`.",
            "minimal_delta",
        ),
        (
            "bisect-external-workers-pin-memory",
            "bisect.md",
            "applied: `params.pin_memory=false`, `params.workers=0`.",
            "applied: `params.workers=0`.",
            "passing cuts",
        ),
        (
            "bisect-external-workers-pin-memory",
            "bisect.md",
            "10 real runs of",
            "9 real runs of",
            "9 real runs",
        ),
        (
            "bisect-external-workers-pin-memory",
            "bisect.md",
            "(exited with code 1 in a rank",
            "(signaled SIGSEGV in a rank",
            "outcome",
        ),
        (
            "bisect-external-workers-pin-memory",
            "bisect.md",
            "| `params.workers=0` | passes | 1 |",
            "| `params.workers=0` | still fails | 1 |",
            "boundary row",
        ),
        (
            "bisect-external-workers-pin-memory",
            "bisect.md",
            "| 4 | ddmin | `params.workers=0` | passed | passed |",
            "| 4 | ddmin | `params.workers=0` | passed | same failure |",
            "probe 4",
        ),
        (
            "bisect-external-workers-pin-memory",
            "bisect.md",
            "| 10 | verify |",
            "| 10 | halving |",
            "probe 10",
        ),
        ("bisect-segv-needs-conditioning", "bisect.md", "\"hidden\": 4,", "\"hidden\": 8,", "/model/hidden"),
        (
            "bisect-segv-needs-conditioning",
            "bisect.md",
            "The failure reproduced in every confirming run",
            "The original fails in 50% of runs (flaky)",
            "flaky",
        ),
    ];
    let mut clean = Vec::new();
    for (run, _, _, _, _) in cases {
        let found = check_dir(&root.join(run));
        assert!(found.is_empty(), "{run} is not consistent to begin with:\n{}", found.join("\n"));
        clean.push(run);
    }
    let mut missed = Vec::new();
    for (run, file, from, to, names) in cases {
        let path = root.join(run).join(file);
        let original = std::fs::read_to_string(&path).unwrap();
        assert!(original.contains(from), "{run}/{file} no longer contains {from:?}: update this case");
        std::fs::write(&path, original.replacen(from, to, 1)).unwrap();
        let found = check_dir(&root.join(run));
        if !found.iter().any(|c| c.contains(names)) {
            missed.push(format!("{run}/{file}: {from:?} → {to:?} not caught (found: {found:?})"));
        }
        std::fs::write(&path, original).unwrap();
    }
    assert!(missed.is_empty(), "contradictions the check let through:\n{}", missed.join("\n"));
}
