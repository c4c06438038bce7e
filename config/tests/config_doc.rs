//! `docs/CONFIG.md` documents exactly the keys the code accepts, with their
//! real types, defaults and environment behaviour.
//!
//! The key list comes from the code, not from a hand-written list: every
//! section is probed with a key that does not exist, and serde's
//! `deny_unknown_fields` answer ("unknown field `x`, expected one of `a`,
//! `b`, ...") lists the section's keys. Probing each key as a table, an
//! array of tables and a table of tables finds the nested sections
//! (`[policy]`, `[[tenants]]`, `[sampling.overrides.<name>]`, ...).
//!
//! The doc's tables are read under headings of the form
//! "### `FILE`: `SECTION`" (or "### `FILE`: top level"), with the header
//! `| Key | Type | Default | Meaning |`.

use flopwatch_config::{
    load_file_with, parse_str, AgentConfig, CollectorConfig, SpecTable, Validate,
};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use toml::{Table, Value};

/// A key no section has.
const PROBE: &str = "zz_not_a_key";
/// The entry name used inside a table of tables.
const ENTRY: &str = "probe_entry";

// ---------------------------------------------------------------------------
// The three files.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum File {
    Collector,
    Agent,
    Gpus,
}

const FILES: [File; 3] = [File::Collector, File::Agent, File::Gpus];

impl File {
    fn name(self) -> &'static str {
        match self {
            File::Collector => "collector.toml",
            File::Agent => "agent.toml",
            File::Gpus => "gpus.toml",
        }
    }

    /// The smallest text this file type loads from (validation included).
    fn base(self) -> &'static str {
        match self {
            File::Collector => {
                "anonymous_tenant = \"default\"\ntls = { cert = \"tls.crt\", key = \"tls.key\" }\n"
            }
            File::Agent | File::Gpus => "",
        }
    }

    fn base_table(self) -> Table {
        toml::from_str(self.base()).unwrap()
    }

    /// Loads `text` the way the program does (parse, validate); the error
    /// is the message a user sees.
    fn load(self, text: &str) -> Result<(), String> {
        let path = Path::new(self.name());
        match self {
            File::Collector => parse_str::<CollectorConfig>(text, path).map(drop),
            File::Agent => parse_str::<AgentConfig>(text, path).map(drop),
            File::Gpus => SpecTable::parse(text, path).map(drop),
        }
        .map_err(|e| e.to_string())
    }

    /// Decodes `doc` without the range checks (the GPU table has no
    /// separate decoding step: it is fully loaded).
    fn decode(self, doc: &Table) -> Result<(), String> {
        match self {
            File::Collector => decoded::<CollectorConfig>(doc).map(drop),
            File::Agent => decoded::<AgentConfig>(doc).map(drop),
            File::Gpus => self.load(&toml::to_string(doc).unwrap()),
        }
    }

    /// Whether two documents decode to the same configuration.
    fn same(self, a: &Table, b: &Table) -> bool {
        match self {
            File::Collector => {
                decoded::<CollectorConfig>(a).unwrap() == decoded::<CollectorConfig>(b).unwrap()
            }
            File::Agent => decoded::<AgentConfig>(a).unwrap() == decoded::<AgentConfig>(b).unwrap(),
            File::Gpus => {
                let p = Path::new("gpus.toml");
                SpecTable::parse(&toml::to_string(a).unwrap(), p).unwrap()
                    == SpecTable::parse(&toml::to_string(b).unwrap(), p).unwrap()
            }
        }
    }

    fn env_keys(self) -> &'static [&'static str] {
        match self {
            File::Collector => CollectorConfig::KEYS,
            File::Agent => AgentConfig::KEYS,
            File::Gpus => &[],
        }
    }

    fn from_name(name: &str) -> File {
        FILES
            .into_iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("CONFIG.md: unknown file `{name}`"))
    }
}

fn decoded<T: DeserializeOwned>(doc: &Table) -> Result<T, String> {
    Value::Table(doc.clone())
        .try_into()
        .map_err(|e: toml::de::Error| e.to_string())
}

// ---------------------------------------------------------------------------
// Sections found in the code.

/// How a section hangs below its parent.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// `[parent.name]`.
    Table(String),
    /// `[[parent.name]]`.
    Array(String),
    /// `[parent.name.<name>]`: a table whose entries are sections.
    Map(String),
}

impl Step {
    fn name(&self) -> &str {
        match self {
            Step::Table(n) | Step::Array(n) | Step::Map(n) => n,
        }
    }

    /// The type a parent's table gives this key.
    fn doc_type(&self) -> &'static str {
        match self {
            Step::Table(_) => "table",
            Step::Array(_) => "table array",
            Step::Map(_) => "table of tables",
        }
    }
}

#[derive(Clone, Debug)]
struct Section {
    file: File,
    path: Vec<Step>,
    /// Keys in the code's order.
    keys: Vec<String>,
}

impl Section {
    /// How CONFIG.md's heading names it: `top level`, `[policy]`,
    /// `[[tenants.query_tokens]]`, `[sampling.overrides.<name>]`.
    fn title(&self) -> String {
        let Some(last) = self.path.last() else {
            return "top level".into();
        };
        let mut parts = Vec::new();
        for s in &self.path {
            parts.push(s.name().to_string());
            if matches!(s, Step::Map(_)) {
                parts.push("<name>".into());
            }
        }
        let dotted = parts.join(".");
        if matches!(last, Step::Array(_)) {
            format!("[[{dotted}]]")
        } else {
            format!("[{dotted}]")
        }
    }

    fn id(&self) -> String {
        format!("{}: {}", self.file.name(), self.title())
    }

    fn child(&self, step: Step, keys: Vec<String>) -> Section {
        let mut path = self.path.clone();
        path.push(step);
        Section {
            file: self.file,
            path,
            keys,
        }
    }
}

/// The document `path` leads to, with `leaf` as the innermost section.
fn doc_at(path: &[Step], leaf: Table) -> Table {
    let mut inner = leaf;
    for step in path.iter().rev() {
        let mut t = Table::new();
        let v = match step {
            Step::Table(_) => Value::Table(inner),
            Step::Array(_) => Value::Array(vec![Value::Table(inner)]),
            Step::Map(_) => {
                let mut m = Table::new();
                m.insert(ENTRY.into(), Value::Table(inner));
                Value::Table(m)
            }
        };
        t.insert(step.name().into(), v);
        inner = t;
    }
    inner
}

/// Deep merge; arrays of one table (as `doc_at` makes) merge element-wise.
fn merge(into: &mut Table, from: Table) {
    for (k, v) in from {
        match (into.get_mut(&k), v) {
            (Some(Value::Table(a)), Value::Table(b)) => merge(a, b),
            (Some(Value::Array(a)), Value::Array(mut b))
                if a.len() == 1 && b.len() == 1 && a[0].is_table() && b[0].is_table() =>
            {
                let (Some(Value::Table(a0)), Some(Value::Table(b0))) = (a.get_mut(0), b.pop())
                else {
                    unreachable!()
                };
                merge(a0, b0);
            }
            (_, v) => {
                into.insert(k, v);
            }
        }
    }
}

/// The section `path` leads to inside `doc`.
fn section_mut<'a>(doc: &'a mut Table, path: &[Step]) -> &'a mut Table {
    let mut t = doc;
    for step in path {
        let v = t.get_mut(step.name()).expect("section present");
        t = match (step, v) {
            (Step::Table(_), Value::Table(x)) => x,
            (Step::Array(_), Value::Array(a)) => a[0].as_table_mut().unwrap(),
            (Step::Map(_), Value::Table(m)) => m.get_mut(ENTRY).unwrap().as_table_mut().unwrap(),
            _ => panic!("section shape"),
        };
    }
    t
}

/// The keys of the section at `path`, read from the unknown-key error, or
/// `None` when there is no section there.
fn probe(file: File, path: &[Step]) -> Option<Vec<String>> {
    let mut leaf = Table::new();
    leaf.insert(PROBE.into(), Value::Integer(1));
    let mut doc = file.base_table();
    merge(&mut doc, doc_at(path, leaf));
    let text = toml::to_string(&doc).unwrap();
    let err = file.load(&text).err()?;
    // A struct: "unknown field"; a table keyed by an enum: "unknown variant".
    let line = err.lines().find(|l| {
        l.contains(&format!("unknown field `{PROBE}`"))
            || l.contains(&format!("unknown variant `{PROBE}`"))
    })?;
    Some(expected_names(line))
}

/// The backticked names after "expected" in a serde error line.
fn expected_names(line: &str) -> Vec<String> {
    let Some((_, rest)) = line.split_once(", expected") else {
        return Vec::new();
    };
    rest.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Every section of `file`, found by probing from the top.
fn code_sections(file: File) -> Vec<Section> {
    let top = Section {
        file,
        path: Vec::new(),
        keys: probe(file, &[]).expect("top level rejects unknown keys"),
    };
    let mut out = Vec::new();
    let mut todo = vec![top];
    while let Some(s) = todo.pop() {
        for k in &s.keys {
            for step in [
                Step::Table(k.clone()),
                Step::Array(k.clone()),
                Step::Map(k.clone()),
            ] {
                let mut path = s.path.clone();
                path.push(step.clone());
                if let Some(keys) = probe(file, &path) {
                    todo.push(s.child(step, keys));
                    break;
                }
            }
        }
        out.push(s);
    }
    out.sort_by_key(|s| (!s.path.is_empty(), s.id()));
    out
}

fn all_code_sections() -> Vec<Section> {
    FILES.into_iter().flat_map(code_sections).collect()
}

/// The section below `s` that key `k` opens, if any.
fn child_of<'a>(sections: &'a [Section], s: &Section, k: &str) -> Option<&'a Section> {
    sections.iter().find(|c| {
        c.file == s.file
            && c.path.len() == s.path.len() + 1
            && c.path[..s.path.len()] == s.path[..]
            && c.path.last().unwrap().name() == k
    })
}

// ---------------------------------------------------------------------------
// CONFIG.md.

#[derive(Clone, Debug)]
struct Row {
    key: String,
    ty: String,
    default: String,
}

fn doc_path() -> PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("../docs/CONFIG.md")
}

fn doc_text() -> String {
    std::fs::read_to_string(doc_path()).expect("docs/CONFIG.md")
}

/// Splits a table line into cells (`\|` is a literal bar).
fn cells(line: &str) -> Vec<String> {
    let line = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = vec![String::new()];
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                out.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => out.push(String::new()),
            c => out.last_mut().unwrap().push(c),
        }
    }
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

/// The text inside a cell that is one code span, e.g. `` `"1s"` ``.
fn code(cell: &str) -> Option<&str> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.contains('`')).then_some(inner)
}

/// Lines under each `### ` heading, up to the next heading.
fn doc_blocks(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            out.push((h.trim().to_string(), Vec::new()));
        } else if line.starts_with('#') {
            out.push((String::new(), Vec::new()));
        } else if let Some((_, lines)) = out.last_mut() {
            lines.push(line.to_string());
        }
    }
    out
}

/// The key tables: "file: section" → rows.
fn doc_tables() -> BTreeMap<String, Vec<Row>> {
    let mut out = BTreeMap::new();
    for (heading, lines) in doc_blocks(&doc_text()) {
        let spans: Vec<&str> = heading.split('`').skip(1).step_by(2).collect();
        let Some(file) = spans.first().filter(|f| f.ends_with(".toml")) else {
            continue;
        };
        let section = match spans.get(1) {
            Some(s) => s.to_string(),
            None if heading.ends_with("top level") => "top level".into(),
            None => panic!("CONFIG.md: heading `{heading}` names no section"),
        };
        let mut table = lines
            .iter()
            .skip_while(|l| cells(l) != ["Key", "Type", "Default", "Meaning"])
            .take_while(|l| l.trim_start().starts_with('|'));
        assert!(
            table.next().is_some(),
            "CONFIG.md: `{heading}` has no Key/Type/Default/Meaning table"
        );
        table.next(); // |---|
        let rows = table
            .map(|l| {
                let c = cells(l);
                assert_eq!(c.len(), 4, "CONFIG.md `{heading}`: row `{l}`");
                assert!(
                    c.iter().all(|c| !c.is_empty()),
                    "CONFIG.md `{heading}`: empty cell in `{l}`"
                );
                Row {
                    key: code(&c[0])
                        .unwrap_or_else(|| panic!("CONFIG.md `{heading}`: key cell `{}`", c[0]))
                        .to_string(),
                    ty: c[1].clone(),
                    default: c[2].clone(),
                }
            })
            .collect();
        let id = format!("{file}: {section}");
        assert!(
            out.insert(id.clone(), rows).is_none(),
            "CONFIG.md: `{id}` documented twice"
        );
    }
    out
}

fn rows_for<'a>(tables: &'a BTreeMap<String, Vec<Row>>, s: &Section) -> &'a [Row] {
    tables
        .get(&s.id())
        .unwrap_or_else(|| panic!("CONFIG.md has no table for `{}`", s.id()))
}

// ---------------------------------------------------------------------------
// Values by documented type.

const SECTION_TYPES: [&str; 3] = ["table", "table array", "table of tables"];

/// A value of the documented type (`None` for sections, which their own
/// table fills).
fn sample(ty: &str) -> Option<Value> {
    Some(match ty {
        "string" => Value::String("x".into()),
        "bool" => Value::Boolean(true),
        "integer" => Value::Integer(1),
        "float" => Value::Float(0.5),
        "duration" => Value::String("1s".into()),
        "address" => Value::String("127.0.0.1:1".into()),
        "path" => Value::String("/x".into()),
        "string array" => Value::Array(vec![Value::String("x".into())]),
        "string table" => {
            let mut t = Table::new();
            t.insert("k".into(), Value::String("x".into()));
            Value::Table(t)
        }
        "float table" => {
            let mut t = Table::new();
            // 1.0: a value every float table accepts (a resolution).
            t.insert("k".into(), Value::Float(1.0));
            Value::Table(t)
        }
        "integer table" => {
            let mut t = Table::new();
            t.insert("1g.10gb".into(), Value::Integer(1));
            Value::Table(t)
        }
        t if SECTION_TYPES.contains(&t) => return None,
        other => panic!("CONFIG.md: unknown type `{other}`"),
    })
}

/// A value that is not of the documented type.
fn wrong(ty: &str) -> Value {
    match ty {
        "bool" | "integer" | "float" => Value::String("x".into()),
        _ => Value::Integer(7),
    }
}

/// The same, as an environment variable's text.
fn wrong_env(ty: &str) -> &'static str {
    match ty {
        "bool" | "integer" | "float" => "x",
        _ => "7",
    }
}

/// The base document with every section on `path` present and the keys
/// documented as required filled in (sections recursively).
fn skeleton(
    sections: &[Section],
    tables: &BTreeMap<String, Vec<Row>>,
    file: File,
    path: &[Step],
) -> Table {
    let mut doc = file.base_table();
    for i in 0..=path.len() {
        let s = sections
            .iter()
            .find(|s| s.file == file && s.path == path[..i])
            .expect("section");
        merge(&mut doc, doc_at(&s.path, required(sections, tables, s)));
    }
    doc
}

/// Section `s` with only its required keys, sample-valued.
fn required(sections: &[Section], tables: &BTreeMap<String, Vec<Row>>, s: &Section) -> Table {
    let mut t = Table::new();
    for r in rows_for(tables, s)
        .iter()
        .filter(|r| r.default == "required")
    {
        if let Some(v) = sample(&r.ty) {
            t.insert(r.key.clone(), v);
        } else {
            let c = child_of(sections, s, &r.key).expect("documented section");
            let inner = required(sections, tables, c);
            let mut d = doc_at(std::slice::from_ref(c.path.last().unwrap()), inner);
            t.insert(r.key.clone(), d.remove(&r.key).unwrap());
        }
    }
    t
}

/// The key's path as the parser names it: `tenants.query_tokens.sha256`,
/// `sampling.overrides.probe_entry.min_interval`.
fn dotted(s: &Section, key: &str) -> String {
    let mut parts = Vec::new();
    for step in &s.path {
        parts.push(step.name().to_string());
        if matches!(step, Step::Map(_)) {
            parts.push(ENTRY.into());
        }
    }
    parts.push(key.into());
    parts.join(".")
}

// ---------------------------------------------------------------------------
// Tests.

#[test]
fn probing_finds_the_known_sections() {
    // Guards the probe itself: if serde's message changed, discovery would
    // find nothing and the tests below would pass vacuously.
    let ids: BTreeSet<String> = all_code_sections().iter().map(Section::id).collect();
    for id in [
        "collector.toml: top level",
        "collector.toml: [policy]",
        "collector.toml: [[tenants]]",
        "collector.toml: [[tenants.query_tokens]]",
        "collector.toml: [remote_write]",
        "agent.toml: [sampling.overrides.<name>]",
        "agent.toml: [attribution]",
        "gpus.toml: [[gpu]]",
        "gpus.toml: [gpu.flops_per_clock_per_sm]",
    ] {
        assert!(ids.contains(id), "{id} not found in {ids:#?}");
    }
    let top = code_sections(File::Collector).remove(0);
    assert!(top.path.is_empty());
    assert!(top.keys.iter().any(|k| k == "listen"), "{:?}", top.keys);
}

#[test]
fn doc_documents_every_key_the_code_accepts() {
    let tables = doc_tables();
    let mut missing = Vec::new();
    for s in all_code_sections() {
        let Some(rows) = tables.get(&s.id()) else {
            missing.push(format!("section {}", s.id()));
            continue;
        };
        for k in &s.keys {
            if !rows.iter().any(|r| &r.key == k) {
                missing.push(format!("{}: {k}", s.id()));
            }
        }
    }
    assert!(missing.is_empty(), "not in docs/CONFIG.md: {missing:#?}");
}

#[test]
fn doc_documents_no_key_the_code_rejects() {
    let sections = all_code_sections();
    let ids: BTreeSet<String> = sections.iter().map(Section::id).collect();
    let mut extra = Vec::new();
    for (id, rows) in doc_tables() {
        let Some(s) = sections.iter().find(|s| s.id() == id) else {
            extra.push(format!("section {id} (the code has: {ids:?})"));
            continue;
        };
        for r in rows {
            if !s.keys.contains(&r.key) {
                extra.push(format!("{id}: {}", r.key));
            }
        }
    }
    assert!(extra.is_empty(), "documented but not accepted: {extra:#?}");
}

#[test]
fn documented_sections_have_their_documented_type() {
    let sections = all_code_sections();
    let tables = doc_tables();
    for s in &sections {
        for r in rows_for(&tables, s) {
            match child_of(&sections, s, &r.key) {
                Some(c) => assert_eq!(
                    r.ty,
                    c.path.last().unwrap().doc_type(),
                    "{}: `{}` opens {}",
                    s.id(),
                    r.key,
                    c.id()
                ),
                None => assert!(
                    !SECTION_TYPES.contains(&r.ty.as_str()),
                    "{}: `{}` is documented as a {} but is a plain value",
                    s.id(),
                    r.key,
                    r.ty
                ),
            }
        }
    }
}

#[test]
fn a_document_setting_every_documented_key_is_accepted() {
    // deny_unknown_fields rejects any documented key that does not exist,
    // and a value of the documented type must decode.
    let sections = all_code_sections();
    let tables = doc_tables();
    for file in FILES {
        let mut doc = file.base_table();
        for s in sections.iter().filter(|s| s.file == file) {
            let mut t = Table::new();
            for r in rows_for(&tables, s) {
                if let Some(v) = sample(&r.ty) {
                    t.insert(r.key.clone(), v);
                }
            }
            merge(&mut doc, skeleton(&sections, &tables, file, &s.path));
            merge(&mut doc, doc_at(&s.path, t));
        }
        file.decode(&doc).unwrap_or_else(|e| {
            panic!(
                "{}: every documented key set:\n{}\n=> {e}",
                file.name(),
                toml::to_string(&doc).unwrap()
            )
        });
    }
}

#[test]
fn every_key_rejects_a_wrong_type_by_name() {
    // Each key, alone, set to a value of another type: the error is a type
    // error (the key exists) that names the key.
    let sections = all_code_sections();
    let tables = doc_tables();
    for s in &sections {
        let rows = rows_for(&tables, s);
        for k in &s.keys {
            let Some(r) = rows.iter().find(|r| &r.key == k) else {
                continue; // reported by doc_documents_every_key_the_code_accepts
            };
            let mut doc = skeleton(&sections, &tables, s.file, &s.path);
            section_mut(&mut doc, &s.path).insert(k.clone(), wrong(&r.ty));
            let text = toml::to_string(&doc).unwrap();
            let e = s
                .file
                .load(&text)
                .expect_err(&format!("{}: `{k}` = {}", s.id(), wrong(&r.ty)));
            assert!(
                e.contains("invalid type") && !e.contains("unknown field"),
                "{}: `{k}`: {e}",
                s.id()
            );
            let named = match s.file {
                // Parsed from the text: the message quotes the line.
                File::Gpus => e.contains(&format!("{k} =")) && e.contains("line"),
                _ => e.contains(&format!("in `{}`", dotted(s, k))),
            };
            assert!(named, "{}: `{k}` not named in: {e}", s.id());
        }
    }
}

#[test]
fn documented_defaults_are_the_real_defaults() {
    // A default written as one TOML literal (`"100ms"`, `false`, `[]`)
    // must change nothing when written into the file. Other defaults are
    // `required`, `unset`, or (for sections) a pointer to the section.
    let sections = all_code_sections();
    let tables = doc_tables();
    let mut checked = 0;
    for s in &sections {
        for r in rows_for(&tables, s) {
            let Some(lit) = code(&r.default) else {
                let ok = matches!(r.default.as_str(), "required" | "unset")
                    || SECTION_TYPES.contains(&r.ty.as_str());
                assert!(ok, "{}: `{}` default `{}`", s.id(), r.key, r.default);
                continue;
            };
            let v: Value = toml::from_str::<Table>(&format!("v = {lit}"))
                .unwrap_or_else(|e| panic!("{}: `{}` default {lit}: {e}", s.id(), r.key))
                .remove("v")
                .unwrap();
            let without = skeleton(&sections, &tables, s.file, &s.path);
            let mut with = without.clone();
            section_mut(&mut with, &s.path).insert(r.key.clone(), v);
            assert!(
                s.file.same(&without, &with),
                "{}: `{}` is documented with default {lit}, which is not the default",
                s.id(),
                r.key
            );
            checked += 1;
        }
    }
    assert!(checked >= 50, "only {checked} defaults checked");
}

#[test]
fn documented_required_keys_are_required() {
    let sections = all_code_sections();
    let tables = doc_tables();
    for s in &sections {
        let complete = skeleton(&sections, &tables, s.file, &s.path);
        s.file
            .decode(&complete)
            .unwrap_or_else(|e| panic!("{}: required keys only: {e}", s.id()));
        for r in rows_for(&tables, s)
            .iter()
            .filter(|r| r.default == "required")
        {
            let mut doc = complete.clone();
            section_mut(&mut doc, &s.path).remove(&r.key);
            let e = s.file.decode(&doc).expect_err(&format!(
                "{}: `{}` documented as required",
                s.id(),
                r.key
            ));
            assert!(e.contains(&r.key), "{}: `{}`: {e}", s.id(), r.key);
        }
    }
}

/// Loads `file` from a real file with `env`, as `flopwatch` does.
fn load_with_env<T: DeserializeOwned + Validate>(
    name: &str,
    text: &str,
    env: &[(String, String)],
) -> Result<T, String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "flopwatch-config-doc-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let r = load_file_with::<T>(&path, &env.to_vec()).map_err(|e| e.to_string());
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn load_env(file: File, text: &str, env: &[(String, String)]) -> Result<Box<dyn Debug>, String> {
    Ok(match file {
        File::Collector => Box::new(load_with_env::<CollectorConfig>(file.name(), text, env)?),
        File::Agent => Box::new(load_with_env::<AgentConfig>(file.name(), text, env)?),
        File::Gpus => unreachable!("no environment overrides"),
    })
}

#[test]
fn env_overrides_reach_every_overridable_key() {
    // FLOPWATCH_<PATH> with a wrong-typed value: an error naming the key
    // when the top-level key is in Validate::KEYS, ignored otherwise.
    let sections = all_code_sections();
    let tables = doc_tables();
    let mut reached = 0;
    for s in sections.iter().filter(|s| s.file != File::Gpus) {
        if s.path.iter().any(|p| matches!(p, Step::Array(_))) {
            continue; // array elements cannot be addressed
        }
        for r in rows_for(&tables, s) {
            if !s.keys.contains(&r.key) {
                continue;
            }
            let path = dotted(s, &r.key);
            let var = format!("FLOPWATCH_{}", path.replace('.', "__").to_uppercase());
            let env = [(var.clone(), wrong_env(&r.ty).to_string())];
            let top = path.split('.').next().unwrap();
            let got = load_env(s.file, s.file.base(), &env);
            if s.file.env_keys().contains(&top) {
                let e = got.expect_err(&var);
                assert!(
                    e.contains(&format!("in `{path}`")) && e.contains(s.file.name()),
                    "{var}: {e}"
                );
                reached += 1;
            } else {
                let plain = load_env(s.file, s.file.base(), &[]).unwrap();
                assert_eq!(
                    format!("{:?}", got.unwrap_or_else(|e| panic!("{var}: {e}"))),
                    format!("{plain:?}"),
                    "{var} is not an override but changed the config"
                );
            }
        }
    }
    assert!(reached >= 50, "only {reached} keys reached");
}

#[test]
fn keys_the_environment_does_not_override_are_documented() {
    let text = doc_text();
    let (_, lines) = doc_blocks(&text)
        .into_iter()
        .find(|(h, _)| h == "Keys the environment does not override")
        .expect("CONFIG.md: section `Keys the environment does not override`");
    let documented: BTreeSet<(String, String)> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("- "))
        .map(|l| {
            let spans: Vec<&str> = l.split('`').skip(1).step_by(2).collect();
            assert_eq!(spans.len(), 2, "`- `key` in `file``: {l}");
            (spans[1].to_string(), spans[0].to_string())
        })
        .collect();
    let mut code = BTreeSet::new();
    for file in [File::Collector, File::Agent] {
        let top = code_sections(file).remove(0);
        assert!(top.path.is_empty());
        for k in &top.keys {
            if !file.env_keys().contains(&k.as_str()) {
                code.insert((file.name().to_string(), k.clone()));
            }
        }
        for k in file.env_keys() {
            assert!(top.keys.iter().any(|t| t == k), "KEYS names `{k}`");
        }
    }
    assert_eq!(documented, code);
}

#[test]
fn env_examples_in_doc_behave_as_documented() {
    // | `FLOPWATCH_X=value` | `file` | `x = value` |: the variable loads
    // the same configuration as the TOML line, and changes something.
    let text = doc_text();
    let mut n = 0;
    for line in text.lines() {
        let c = cells(line);
        let Some(assignment) = c.first().and_then(|c| code(c)) else {
            continue;
        };
        let Some((var, raw)) = assignment.split_once('=') else {
            continue;
        };
        if !var.starts_with("FLOPWATCH_") || c.len() != 3 {
            continue;
        }
        let file = File::from_name(code(&c[1]).expect("file cell"));
        let toml_line = code(&c[2]).expect("TOML cell");
        let value = raw
            .strip_prefix('\'')
            .and_then(|v| v.strip_suffix('\''))
            .unwrap_or(raw);
        let env = [(var.to_string(), value.to_string())];
        let by_env = load_env(file, file.base(), &env)
            .map(|c| format!("{c:?}"))
            .unwrap_or_else(|e| panic!("{assignment}: {e}"));
        let by_file = load_env(file, &format!("{}{toml_line}\n", file.base()), &[])
            .map(|c| format!("{c:?}"))
            .unwrap_or_else(|e| panic!("{toml_line}: {e}"));
        let plain = format!("{:?}", load_env(file, file.base(), &[]).unwrap());
        assert_eq!(by_env, by_file, "{assignment} is not `{toml_line}`");
        assert_ne!(by_env, plain, "{assignment} changes nothing");
        n += 1;
    }
    assert!(n >= 10, "only {n} examples found");
    for var in [
        "FLOPWATCH_LISTEN=",
        "FLOPWATCH_POLICY__MIN_INTERVAL=",
        "FLOPWATCH_ATTRIBUTION__PROC_ROOT=",
    ] {
        assert!(text.contains(&format!("`{var}")), "no example of {var}");
    }
}
