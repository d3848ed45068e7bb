//! Runs the built benchmark once in smoke mode and checks that its report has every section for
//! every backend it could reach. Under `CI=true` or `LEASE_TEST_REQUIRE=1` every backend must have
//! been reached (the skip rule of the workspace's conformance suites).

use std::process::Command;

const BACKENDS: [&str; 6] = ["postgres", "mysql", "redis", "etcd", "k8s", "sqlite"];
const SECTIONS: [&str; 7] = [
    "## 0. Goals against the minimal floor",
    "## 1. Acquire+release throughput",
    "## 2. Acquire latency",
    "## 3. Takeover after a holder dies",
    "## 4. Graceful handoff",
    "## 5. Renewal load",
    "## 6. Shard ownership at scale",
];

/// Whether every backend is required: under CI (`CI=true`) or with `LEASE_TEST_REQUIRE=1`.
fn require_services() -> bool {
    let set = |name: &str| {
        std::env::var(name)
            .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
    };
    set("CI") || set("LEASE_TEST_REQUIRE")
}

/// The rows of the section starting with `heading` (up to the next `## `).
fn section<'a>(report: &'a str, heading: &str) -> &'a str {
    let start = report
        .find(heading)
        .unwrap_or_else(|| panic!("section {heading:?} missing:\n{report}"));
    let rest = &report[start + heading.len()..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    &rest[..end]
}

#[test]
fn smoke_run_reports_every_section_for_every_reachable_backend() {
    let out = std::env::temp_dir().join(format!("leasehold-bench-smoke-{}.md", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_leasehold-bench"))
        .args(["--smoke", "--out"])
        .arg(&out)
        .status()
        .expect("the benchmark binary runs");
    assert!(status.success(), "leasehold-bench --smoke failed: {status}");
    let report = std::fs::read_to_string(&out).expect("the report was written");
    let _ = std::fs::remove_file(&out);

    let mut measured = Vec::new();
    for b in BACKENDS {
        let line = report
            .lines()
            .find(|l| l.starts_with(&format!("- `{b}`: ")))
            .unwrap_or_else(|| panic!("backend {b} is not listed:\n{report}"));
        if line.starts_with(&format!("- `{b}`: measured")) {
            measured.push(b);
        } else {
            assert!(
                !require_services(),
                "backend {b} is required (CI or LEASE_TEST_REQUIRE) but was not measured: {line}"
            );
            eprintln!("WARNING: {line}");
        }
    }
    for heading in SECTIONS {
        let rows = section(&report, heading);
        for b in &measured {
            // A row names its backend, followed by its store configuration where that is not
            // the default (etcd's renewal row: `| etcd (LeaseSharing::PerTtl) |`).
            let (plain, configured) = (format!("| {b} |"), format!("| {b} ("));
            let row = rows
                .lines()
                .find(|l| l.starts_with(&plain) || l.starts_with(&configured))
                .unwrap_or_else(|| panic!("no row for {b} in {heading:?}:\n{rows}"));
            assert!(
                !row.contains("error:"),
                "{b} failed a measurement in {heading:?}: {row}"
            );
        }
    }
    // The backends' own protocol issued directly and the minimal baselines ran: a figure in
    // their throughput columns (the 6th and 7th) for every backend.
    let throughput = section(&report, SECTIONS[1]);
    for b in &measured {
        for row in throughput
            .lines()
            .filter(|l| l.starts_with(&format!("| {b} |")))
        {
            for (column, what) in [(6, "same-protocol"), (7, "minimal baseline")] {
                let figure = row
                    .split('|')
                    .nth(column)
                    .map(str::trim)
                    .unwrap_or_default();
                assert!(
                    figure.parse::<f64>().is_ok_and(|x| x > 0.0),
                    "{b}: no {what} figure in {row}"
                );
            }
        }
    }
    // Every ratio of the goal and the A/A pair has its interval (`0.93 [0.90, 0.96]`, columns 8
    // and 11), from rounds of more than one process, and a verdict from it.
    for b in &measured {
        for row in throughput
            .lines()
            .filter(|l| l.starts_with(&format!("| {b} |")))
        {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            for (column, what) in [(8, "library / minimal"), (11, "minimal A/A")] {
                let cell = cells.get(column).copied().unwrap_or_default();
                assert!(
                    cell.contains(" [") && cell.ends_with(']'),
                    "{b}: no interval for {what} in {row}"
                );
            }
            let processes = cells.get(12).copied().unwrap_or_default();
            assert!(
                processes
                    .split(',')
                    .next()
                    .is_some_and(|p| p.trim().parse::<u32>().is_ok_and(|p| p >= 2)),
                "{b}: the row does not rest on two processes or more: {row}"
            );
            let verdict = cells.get(14).copied().unwrap_or_default();
            assert!(
                ["met", "**missed**", "inconclusive"].contains(&verdict),
                "{b}: verdict {verdict:?} in {row}"
            );
        }
    }
    // The split against the minimal split (table 6's second table) has a row per backend, with
    // both sides timed and no violation in the workers' beliefs (the last cell:
    // `beliefs / violations`).
    let splits = section(&report, SECTIONS[6]);
    let splits = &splits[splits
        .find("### The initial split against a minimal split")
        .unwrap_or_else(|| panic!("no split table in table 6:\n{splits}"))..];
    for b in &measured {
        let row = splits
            .lines()
            .find(|l| l.starts_with(&format!("| {b} |")))
            .unwrap_or_else(|| panic!("no split row for {b}:\n{splits}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert!(!row.contains("error:"), "{b}: split failed: {row}");
        for (column, what) in [(6, "library split"), (7, "minimal split")] {
            let cell = cells.get(column).copied().unwrap_or_default();
            assert!(
                cell.ends_with(')') && cell.contains(" s ("),
                "{b}: no {what} in {row}"
            );
        }
        let beliefs = cells.get(12).copied().unwrap_or_default();
        assert!(
            beliefs.ends_with("/ 0") && !beliefs.starts_with("0 /"),
            "{b}: beliefs / violations {beliefs:?} in {row}"
        );
    }
    // etcd's library with LeaseSharing::PerTtl has a throughput row of its own.
    if measured.contains(&"etcd") {
        assert!(
            throughput
                .lines()
                .any(|l| l.starts_with("| etcd (LeaseSharing::PerTtl) |") && !l.contains("error:")),
            "no PerTtl row:\n{throughput}"
        );
    }
    // The ablations ran too (table 1c; the backends that have them), each with a figure.
    let ablated = ["postgres", "mysql", "redis", "k8s"];
    if measured.iter().any(|b| ablated.contains(b)) {
        let steps = section(&report, "## 1c. Where a throughput gap goes");
        for b in measured.iter().filter(|b| ablated.contains(b)) {
            let rows: Vec<&str> = steps
                .lines()
                .filter(|l| l.starts_with(&format!("| {b} |")))
                .collect();
            // minimal, same protocol and library at 1 and 8 clients, and at least one ablation.
            assert!(rows.len() > 6, "{b}: too few rows in table 1c:\n{steps}");
            for row in rows {
                assert!(!row.contains("error:"), "{b}: an ablation failed: {row}");
            }
        }
    }
    assert!(report.contains("## Notes"), "the notes are missing");
}
