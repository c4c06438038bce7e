//! The example files under `config/` load, and bad files are reported with
//! the file and the key.

use flopwatch_config::{
    load_file_with, parse_str, AgentConfig, CollectorConfig, ConfigError, SourceKind,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn example(name: &str) -> PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join(name)
}

#[test]
fn example_collector_config_loads() {
    let c: CollectorConfig = load_file_with(&example("collector.toml"), &Vec::new()).unwrap();
    assert_eq!(c.listen.port(), 7070);
    assert_eq!(c.policy.min_interval, Duration::from_millis(100));
    assert_eq!(c.anonymous_tenant.as_deref(), Some("default"));
}

#[test]
fn example_agent_config_loads() {
    let a: AgentConfig = load_file_with(&example("agent.toml"), &Vec::new()).unwrap();
    assert_eq!(a.source_kind().unwrap(), SourceKind::Sim);
    assert_eq!(a.sim.gpus, 8);
    assert_eq!(a.collectors, vec!["http://127.0.0.1:7070"]);
}

#[test]
fn env_overrides_apply_to_declared_keys_only() {
    let env = vec![
        ("FLOPWATCH_SIM__GPUS".to_string(), "4".to_string()),
        (
            "FLOPWATCH_SOURCE".to_string(),
            "replay:/tmp/t.csv".to_string(),
        ),
        ("FLOPWATCH_LOG".to_string(), "debug".to_string()),
    ];
    let a: AgentConfig = load_file_with(&example("agent.toml"), &env).unwrap();
    assert_eq!(a.sim.gpus, 4);
    assert_eq!(
        a.source_kind().unwrap(),
        SourceKind::Replay("/tmp/t.csv".into())
    );
}

#[test]
fn unknown_key_names_file_and_key() {
    let e = parse_str::<AgentConfig>("intervall = \"1s\"\n", Path::new("a.toml")).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("a.toml:"), "{msg}");
    assert!(msg.contains("intervall"), "{msg}");
}

#[test]
fn invalid_value_names_file_and_key() {
    let e = parse_str::<AgentConfig>("source = \"gpu\"\n", Path::new("a.toml")).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "source"),
        "{e}"
    );
    assert!(e.to_string().starts_with("a.toml: key `source`"), "{e}");
    let e = parse_str::<CollectorConfig>(
        "anonymous_tenant = \"d\"\n[policy]\nmax_interval = \"1m\"\n",
        Path::new("c.toml"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("key `policy.max_interval`"), "{e}");
    let e =
        parse_str::<CollectorConfig>("max_future = \"soon\"\n", Path::new("c.toml")).unwrap_err();
    assert!(e.to_string().contains("max_future"), "{e}");
}

#[test]
fn collector_needs_a_way_in() {
    let e = parse_str::<CollectorConfig>("", Path::new("c.toml")).unwrap_err();
    assert!(e.to_string().contains("key `tenants`"), "{e}");
}

#[test]
fn storage_precision_takes_powers_of_ten() {
    let c = parse_str::<CollectorConfig>(
        "anonymous_tenant = \"d\"\nplaintext = true\n[storage.precision]\npower_w = 1\ntensor_active = 0.001\n",
        Path::new("c.toml"),
    )
    .unwrap();
    let d = c.storage.precision_decimals();
    assert_eq!(d.get("power_w"), Some(&0));
    assert_eq!(d.get("tensor_active"), Some(&3));
    let e = parse_str::<CollectorConfig>(
        "anonymous_tenant = \"d\"\nplaintext = true\n[storage.precision]\npower_w = 0.25\n",
        Path::new("c.toml"),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("key `storage.precision.power_w`"),
        "{e}"
    );
    // Lossless unless asked.
    let c = parse_str::<CollectorConfig>(
        "anonymous_tenant = \"d\"\nplaintext = true\n",
        Path::new("c.toml"),
    )
    .unwrap();
    assert!(c.storage.precision.is_empty());
}

#[test]
fn remote_write_auth_and_tls_combinations_name_the_key() {
    let load = |rw: &str| {
        parse_str::<CollectorConfig>(
            &format!("anonymous_tenant = \"d\"\nplaintext = true\n[remote_write]\n{rw}\n"),
            Path::new("c.toml"),
        )
    };
    let https = "url = \"https://mimir.example:443/api/v1/push\"\n";
    let c = load(&format!(
        "{https}ca_file = \"ca.pem\"\nusername = \"u\"\npassword_file = \"pw\"\n\
         min_backoff = \"50ms\"\nmax_backoff = \"5s\"\n\
         [remote_write.headers]\nX-Scope-OrgID = \"team-a\"\n"
    ))
    .unwrap();
    let rw = c.remote_write.unwrap();
    assert_eq!(rw.headers.get("X-Scope-OrgID").unwrap(), "team-a");
    assert_eq!(rw.min_backoff, Duration::from_millis(50));
    load(&format!("{https}bearer_token_file = \"t\"\n")).unwrap();
    for (rw, key, words) in [
        (
            format!("{https}bearer_token = \"t\"\nusername = \"u\"\npassword = \"p\"\n"),
            "remote_write.username",
            "exclude each other",
        ),
        (
            format!("{https}bearer_token_file = \"t\"\npassword_file = \"p\"\n"),
            "remote_write.username",
            "exclude each other",
        ),
        (
            format!("{https}bearer_token = \"t\"\nbearer_token_file = \"t\"\n"),
            "remote_write.bearer_token_file",
            "not both",
        ),
        (
            format!("{https}username = \"u\"\npassword = \"p\"\npassword_file = \"p\"\n"),
            "remote_write.password_file",
            "not both",
        ),
        (
            format!("{https}password = \"p\"\n"),
            "remote_write.username",
            "must be set",
        ),
        (
            format!("{https}username = \"u\"\n"),
            "remote_write.password",
            "password_file",
        ),
        (
            "url = \"http://127.0.0.1:9090/api/v1/write\"\nca_file = \"ca.pem\"\n".to_string(),
            "remote_write.ca_file",
            "https://",
        ),
        (
            format!("{https}ca_file = \"\"\n"),
            "remote_write.ca_file",
            "empty",
        ),
        (
            format!("{https}[remote_write.headers]\nAuthorization = \"Bearer x\"\n"),
            "remote_write.headers.Authorization",
            "bearer_token",
        ),
        (
            format!("{https}[remote_write.headers]\n\"X Org\" = \"a\"\n"),
            "remote_write.headers.X Org",
            "header name",
        ),
        (
            format!("{https}max_backoff = \"100ms\"\n"),
            "remote_write.max_backoff",
            "min_backoff",
        ),
        (
            "url = \"prometheus:9090\"\n".to_string(),
            "remote_write.url",
            "https://",
        ),
    ] {
        let e = load(&rw).expect_err(&rw);
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("c.toml: key `{key}`:")) && msg.contains(words),
            "{rw}=> {msg}"
        );
    }
}

#[test]
fn exporter_section_reads_and_refuses_client_certificates_by_key() {
    let base = "anonymous_tenant = \"d\"\nplaintext = true\n";
    let c: CollectorConfig = parse_str(
        &format!("{base}[exporter]\ndcgm_compat = true\n[exporter.tls]\ncert = \"m.crt\"\nkey = \"m.key\"\n"),
        Path::new("c.toml"),
    )
    .unwrap();
    assert!(c.exporter.dcgm_compat);
    assert_eq!(c.exporter.tls.unwrap().cert, PathBuf::from("m.crt"));
    let e = parse_str::<CollectorConfig>(
        &format!(
            "{base}[exporter.tls]\ncert = \"m.crt\"\nkey = \"m.key\"\nclient_ca = \"ca.pem\"\n"
        ),
        Path::new("c.toml"),
    )
    .unwrap_err();
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "exporter.tls.client_ca"),
        "{e}"
    );
    let e = parse_str::<CollectorConfig>(
        &format!("{base}[exporter.tls]\ncert = \"\"\nkey = \"m.key\"\n"),
        Path::new("c.toml"),
    )
    .unwrap_err();
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "exporter.tls.cert"),
        "{e}"
    );
}

#[test]
fn prometheus_api_is_off_by_default_and_refuses_bad_values_by_key() {
    let base = "anonymous_tenant = \"d\"\nplaintext = true\n";
    let c: CollectorConfig = parse_str(base, Path::new("c.toml")).unwrap();
    assert_eq!(
        c.prometheus_api.listen_addr(),
        None,
        "off unless listen is set"
    );
    let c: CollectorConfig = parse_str(
        &format!("{base}[prometheus_api]\nlisten = \"0.0.0.0:9090\"\n[prometheus_api.tls]\ncert = \"a.crt\"\nkey = \"a.key\"\n"),
        Path::new("c.toml"),
    )
    .unwrap();
    assert_eq!(
        c.prometheus_api.listen_addr(),
        Some("0.0.0.0:9090".parse().unwrap())
    );
    assert_eq!(c.prometheus_api.tls.unwrap().key, PathBuf::from("a.key"));
    for (text, want) in [
        (
            "[prometheus_api]\nlisten = \"localhost\"\n",
            "prometheus_api.listen",
        ),
        (
            "[prometheus_api]\nlisten = \"127.0.0.1:9090\"\n[prometheus_api.tls]\ncert = \"a.crt\"\nkey = \"a.key\"\nclient_ca = \"ca.pem\"\n",
            "prometheus_api.tls.client_ca",
        ),
        (
            "[prometheus_api]\nlisten = \"127.0.0.1:9090\"\n[prometheus_api.tls]\ncert = \"\"\nkey = \"a.key\"\n",
            "prometheus_api.tls.cert",
        ),
        (
            "[prometheus_api.tls]\ncert = \"a.crt\"\nkey = \"a.key\"\n",
            "prometheus_api.tls",
        ),
    ] {
        let e = parse_str::<CollectorConfig>(&format!("{base}{text}"), Path::new("c.toml"))
            .unwrap_err();
        assert!(
            matches!(&e, ConfigError::Invalid { key, .. } if key == want),
            "{text}: {e}"
        );
        assert!(e.to_string().contains("c.toml"), "{e}");
    }
}
