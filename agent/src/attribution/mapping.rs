//! A static per-GPU job mapping directory, as dcgm-exporter's
//! `--hpc-job-mapping-dir`: a scheduler prolog writes one file per GPU,
//! named by the GPU's index (`0`, `1`, ...) or UUID (`GPU-…`), whose first
//! non-empty line is the job id; the epilog removes it.

use std::io::Read;
use std::path::Path;

/// Most bytes read from one mapping file.
const MAX_MAPPING_BYTES: u64 = 4096;
/// Longest job id accepted.
const MAX_JOB_ID_CHARS: usize = 256;

/// The job id for GPU `index` / `uuid` in `dir`: the UUID-named file when
/// there is one (it cannot be confused after a renumbering), else the
/// index-named file. `None` when neither exists or holds a usable id (an
/// empty file, control characters, an id longer than 256 characters).
pub fn read_mapping(dir: &Path, index: u32, uuid: &str) -> Option<String> {
    let by_uuid = (!uuid.is_empty() && !uuid.contains(['/', '\0']) && uuid != "." && uuid != "..")
        .then(|| read_job(&dir.join(uuid)))
        .flatten();
    by_uuid.or_else(|| read_job(&dir.join(index.to_string())))
}

fn read_job(path: &Path) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MAX_MAPPING_BYTES).read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let job = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    (job.chars().count() <= MAX_JOB_ID_CHARS && !job.chars().any(char::is_control))
        .then(|| job.to_string())
}
