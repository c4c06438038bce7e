//! Bad CSV input: each case is an error naming the file and the line.

use std::path::{Path, PathBuf};

use flopwatch_selector::{run_csv, CsvRun, Outputs, SelectError, SelectOptions};

fn args(inputs: Vec<PathBuf>, dir: &Path) -> CsvRun {
    CsvRun {
        inputs,
        options: SelectOptions::default(),
        outputs: Outputs {
            output: dir.join("selected.toml"),
            report: None,
            json: false,
        },
        progress: false,
    }
}

const GOOD: &str = "workload,metric,timestamp_ms,value\nw,a,0,1\nw,a,100,2\nw,a,200,1\n";

/// Write `files` and run; return (file name, line, message) of the error.
fn error_for(files: &[(&str, &str)]) -> (String, u64, String) {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = files
        .iter()
        .map(|(name, text)| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        })
        .collect();
    match run_csv(&args(paths, dir.path())) {
        Err(SelectError::Csv {
            file,
            line,
            message,
        }) => (
            file.file_name().unwrap().to_string_lossy().into_owned(),
            line,
            message,
        ),
        other => panic!("expected a CSV error, got {other:?}"),
    }
}

#[test]
fn good_file_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ok.csv");
    std::fs::write(&p, GOOD).unwrap();
    let sel = run_csv(&args(vec![p], dir.path())).unwrap();
    assert_eq!(sel.kept, vec!["a"]);
}

#[test]
fn empty_file() {
    let (file, line, msg) = error_for(&[("empty.csv", "")]);
    assert_eq!((file.as_str(), line), ("empty.csv", 1));
    assert!(msg.contains("empty file"), "{msg}");
}

#[test]
fn no_header() {
    let (file, line, msg) = error_for(&[("nohdr.csv", "w,a,0,1\nw,a,100,2\n")]);
    assert_eq!((file.as_str(), line), ("nohdr.csv", 1));
    assert!(msg.contains("missing header"), "{msg}");
}

#[test]
fn unknown_column() {
    let (_, line, msg) = error_for(&[(
        "x.csv",
        "workload,metric,timestamp_ms,value,gpu\nw,a,0,1,0\n",
    )]);
    assert_eq!(line, 1);
    assert!(msg.contains("unknown column \"gpu\""), "{msg}");
}

#[test]
fn missing_column_in_header() {
    let (_, line, msg) = error_for(&[("x.csv", "workload,metric,value\nw,a,1\n")]);
    assert_eq!(line, 1);
    assert!(msg.contains("missing column \"timestamp_ms\""), "{msg}");
}

#[test]
fn missing_field_in_a_row() {
    let (_, line, msg) = error_for(&[("x.csv", &format!("{GOOD}w,a,300\n"))]);
    assert_eq!(line, 5);
    assert!(msg.contains("expected 4 fields"), "{msg}");
}

#[test]
fn non_numeric_value() {
    let (_, line, msg) = error_for(&[(
        "x.csv",
        "workload,metric,timestamp_ms,value\nw,a,0,1\nw,a,100,fast\n",
    )]);
    assert_eq!(line, 3);
    assert!(msg.contains("not a number"), "{msg}");
}

#[test]
fn non_integer_timestamp() {
    let (_, line, msg) = error_for(&[("x.csv", "workload,metric,timestamp_ms,value\nw,a,1e3,1\n")]);
    assert_eq!(line, 2);
    assert!(msg.contains("timestamp_ms"), "{msg}");
}

#[test]
fn nan_value() {
    let (_, line, msg) = error_for(&[("x.csv", &format!("{GOOD}w,a,300,NaN\n"))]);
    assert_eq!(line, 5);
    assert!(msg.contains("NaN"), "{msg}");
}

#[test]
fn infinite_value() {
    let (_, line, msg) = error_for(&[("x.csv", &format!("{GOOD}w,a,300,inf\n"))]);
    assert_eq!(line, 5);
    assert!(msg.contains("infinite"), "{msg}");
}

#[test]
fn error_names_the_second_file() {
    let (file, line, _) = error_for(&[
        ("one.csv", GOOD),
        ("two.csv", "workload,metric,timestamp_ms,value\n\nw,a,0,x\n"),
    ]);
    assert_eq!(file, "two.csv");
    assert_eq!(line, 3);
}

#[test]
fn display_has_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.csv");
    std::fs::write(&p, "workload,metric,timestamp_ms,value\nw,a,0,x\n").unwrap();
    let err = run_csv(&args(vec![p], dir.path())).unwrap_err().to_string();
    assert!(err.contains("bad.csv:2:"), "{err}");
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("absent.csv");
    let err = run_csv(&args(vec![p], dir.path())).unwrap_err();
    assert!(matches!(err, SelectError::Io { .. }));
    assert!(err.to_string().contains("absent.csv"));
}
