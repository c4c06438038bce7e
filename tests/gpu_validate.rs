//! `deploy/gpu/validate.sh`, the one-command GPU validation, run here in
//! its dry-run mode: the real `flopwatch` binary (collector and agent, over
//! gRPC and RocksDB) with the agent reading the fake `libnvidia-ml.so`
//! through the NVML source, and a CPU stand-in for the load. The fake's
//! GPU 0 follows the load's schedule file, busy while a phase runs and idle
//! in the gap, so the report's per-phase OFU shows whether the script's
//! windows, queries and parsing line up with the phases. Also: the script
//! refuses the real mode where there is no `nvidia-smi`.

use flopwatch_proto::clock::Stopwatch;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The phases of the load with `--precisions bf16`, in the report's order
/// (deploy/gpu/load.py).
const PHASES: [&str; 6] = [
    "bf16 8192³",
    "bf16 4096³",
    "bf16 1024³",
    "bf16 8192x8192x8200",
    "idle gap",
    "bf16 16384³ ⇄ 4096³",
];

fn script() -> PathBuf {
    flopwatch_tests::repo_root().join("deploy/gpu/validate.sh")
}

fn run(args: &[&str], envs: &[(&str, &str)], dir: &Path) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(script())
        .args(args)
        .current_dir(dir)
        .env("TMPDIR", dir)
        .env_remove("FLOPWATCH_VALIDATE_OUT")
        .env_remove("FLOPWATCH_FAKE_NVML");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("bash runs deploy/gpu/validate.sh")
}

fn text(o: &Output) -> String {
    format!(
        "exit {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One pass's table: phase name → cells by column name.
fn table(report: &str, pass: &str) -> Vec<(String, Vec<(String, String)>)> {
    let body = report
        .split(&format!("## Pass: {pass}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("no `## Pass: {pass}` in the report:\n{report}"));
    let mut rows = body.lines().skip_while(|l| !l.starts_with('|'));
    let cells = |l: &str| -> Vec<String> {
        l.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let header = cells(rows.next().expect("a table header"));
    rows.next(); // the |---| line
    rows.take_while(|l| l.starts_with('|'))
        .map(|l| {
            let c = cells(l);
            assert_eq!(c.len(), header.len(), "row `{l}`");
            (c[0].clone(), header.iter().cloned().zip(c).collect())
        })
        .collect()
}

/// A percentage cell (`12.34 %`) as a number of percent.
fn percent(cells: &[(String, String)], column: &str) -> f64 {
    let v = &cells
        .iter()
        .find(|(k, _)| k == column)
        .unwrap_or_else(|| panic!("no column `{column}` in {cells:?}"))
        .1;
    v.strip_suffix(" %")
        .and_then(|x| x.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("`{column}` is `{v}`, not a percentage"))
}

#[test]
fn dry_run_reports_every_phase_with_ofu_that_follows_the_load() {
    let bin = flopwatch_tests::flopwatch_bin();
    // FLOPWATCH_FAKE_NVML_LIB names another build of the library, as
    // FLOPWATCH_BIN does the binary (and as validate.sh reads it).
    let fake = std::env::var_os("FLOPWATCH_FAKE_NVML_LIB")
        .map(PathBuf::from)
        .or_else(flopwatch_fake_nvml::library_path)
        .expect("the fake libnvidia-ml is built (cargo build -p flopwatch-fake-nvml)");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dry-run.md");
    let t0 = Stopwatch::start();
    let o = run(
        &[
            "--dry-run",
            "--bin",
            bin.to_str().unwrap(),
            "--fake-nvml",
            fake.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--precisions",
            "bf16",
            "--phase-seconds",
            "2",
            "--idle-seconds",
            "2",
            "--alt-seconds",
            "1",
            "--alt-cycles",
            "1",
        ],
        &[],
        dir.path(),
    );
    let log = text(&o);
    assert!(o.status.success(), "{log}");
    eprintln!("validate.sh --dry-run took {:?}", t0.elapsed());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("DRY RUN"), "no banner on stdout:\n{log}");
    let report = std::fs::read_to_string(&out).expect("the report is written to --out");
    assert!(
        report.lines().take(4).any(|l| l.contains("DRY RUN")),
        "no DRY RUN marker at the top:\n{report}"
    );
    for pass in ["fixed", "adaptive"] {
        let rows = table(&report, pass);
        let names: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, PHASES, "{pass} pass:\n{report}");
        for (name, cells) in &rows {
            for col in ["OFU (avg clock)", "OFU (point clock)", "TPA"] {
                let v = percent(cells, col);
                assert!(
                    v.is_finite() && (0.0..=100.0).contains(&v),
                    "{pass} / {name}: {col} {v}"
                );
            }
            let ofu = percent(cells, "OFU (avg clock)");
            let tpa = percent(cells, "TPA");
            let set = percent(cells, "Stand-in TPA");
            if name == "idle gap" {
                assert!(ofu < 1.0, "{pass} / idle: OFU {ofu} %\n{report}");
            } else {
                assert!(ofu > 10.0, "{pass} / {name}: OFU {ofu} %\n{report}");
                // OFU never exceeds the tensor activity it scales (eq. 1).
                assert!(ofu <= tpa + 1e-6, "{pass} / {name}: OFU {ofu} > TPA {tpa}");
            }
            // The window holds the phase and nothing else: the activity
            // flopwatch stored is what the fake GPU showed in it.
            if pass == "fixed" {
                assert!(
                    (tpa - set).abs() < 3.0,
                    "{pass} / {name}: TPA {tpa} % where the fake showed {set} %\n{report}"
                );
            }
        }
    }
    let elapsed = t0.elapsed().as_secs();
    assert!(elapsed < 90, "the dry run took {elapsed} s");
}

#[test]
fn real_mode_refuses_to_run_without_nvidia_smi() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir/nvidia-smi");
    let o = run(
        &["--bin", "/nonexistent/flopwatch"],
        &[("NVIDIA_SMI", missing.to_str().unwrap())],
        dir.path(),
    );
    let log = text(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("nvidia-smi not found") && stderr.contains("--dry-run"),
        "unclear refusal:\n{log}"
    );
}

#[test]
fn dry_run_never_writes_the_real_report() {
    let dir = tempfile::tempdir().unwrap();
    let real = flopwatch_tests::repo_root().join("docs/GPU-VALIDATION.md");
    let o = run(
        &["--dry-run", "--out", real.to_str().unwrap()],
        &[],
        dir.path(),
    );
    let log = text(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("never writes"),
        "{log}"
    );
}
