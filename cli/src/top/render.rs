//! Draws a [`Snapshot`]: header, fleet sparkline, jobs and nodes, GPUs,
//! keys. A pure function of its inputs, so tests render into
//! `ratatui::backend::TestBackend`.
//!
//! Every OFU bar is coloured by value (red < 20 %, yellow < 50 %, green
//! above) and always printed as a percent too: colour is never the only
//! cue, and `--once` output is plain text.

use super::model::{sorted_gpus, sorted_jobs, sorted_nodes, Ofu, Snapshot, ViewState};
use crate::table::bar;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;
use std::time::{Duration, UNIX_EPOCH};

const HEADER: u16 = 3;
const SPARK: u16 = 5;
const FOOTER: u16 = 1;
/// Borders and the column-title row of a table.
const TABLE_CHROME: u16 = 3;
/// Cells of an OFU bar.
const BAR: usize = 10;

/// Width of an OFU cell: bar, space, "100.0%".
fn ofu_cell(bar: usize) -> u16 {
    bar as u16 + 7
}

/// A fraction as a percent with one decimal: 0.4123 → "41.2%".
pub(super) fn pct(f: f64) -> String {
    format!("{:.1}%", f * 100.0)
}

/// Bar colour of an OFU value.
pub(super) fn ofu_color(f: f64) -> Color {
    if f < 0.2 {
        Color::Red
    } else if f < 0.5 {
        Color::Yellow
    } else {
        Color::Green
    }
}

/// An OFU bar with its percent beside it, else `absent` when the scope
/// was asked for and had no sample ("stale", "ended"), else "no data".
fn ofu_line(o: Option<&Ofu>, bar_cells: usize, absent: Option<&'static str>) -> Line<'static> {
    match (o, absent) {
        (Some(o), _) => Line::from(vec![
            Span::styled(bar(o.mean, bar_cells), Style::new().fg(ofu_color(o.mean))),
            Span::raw(format!(" {:>6}", pct(o.mean))),
        ]),
        (None, Some(why)) => Line::from(Span::styled(why, Style::new().fg(Color::DarkGray))),
        (None, None) => Line::from("no data"),
    }
}

fn opt_pct(o: Option<f64>) -> String {
    o.map(pct).unwrap_or_else(|| "-".into())
}

fn human(ms: i64) -> String {
    humantime::format_duration(Duration::from_millis(ms.max(0) as u64)).to_string()
}

fn bold() -> Style {
    Style::new().add_modifier(Modifier::BOLD)
}

/// Rows of a table of `n` entries; bounded so the sum of all fits a u16.
fn table_rows(n: usize) -> u16 {
    n.clamp(1, 16_000) as u16 + TABLE_CHROME
}

fn mid_need(s: &Snapshot) -> u16 {
    table_rows(s.jobs.len().max(s.nodes.len()))
}

fn gpu_need(s: &Snapshot) -> u16 {
    table_rows(s.gpus.len())
}

/// Rows a frame needs to show every row of `s` (for `--once`).
pub(super) fn height_for(s: &Snapshot) -> u16 {
    HEADER + SPARK + FOOTER + mid_need(s) + gpu_need(s)
}

/// Header, sparkline, jobs and nodes, GPUs, footer.
fn areas(area: Rect, s: &Snapshot) -> [Rect; 5] {
    let avail = area.height.saturating_sub(HEADER + SPARK + FOOTER);
    let mid = if mid_need(s) + gpu_need(s) <= avail {
        mid_need(s)
    } else {
        // Short terminal: the GPU table, which scrolls, gets most of it.
        mid_need(s).min((avail / 3).max(4))
    };
    Layout::vertical([
        Constraint::Length(HEADER),
        Constraint::Length(SPARK),
        Constraint::Length(mid),
        Constraint::Min(0),
        Constraint::Length(FOOTER),
    ])
    .areas(area)
}

/// GPU rows visible in a frame of `area` (for scrolling).
pub(super) fn gpu_rows_visible(area: Rect, s: &Snapshot) -> usize {
    areas(area, s)[3].height.saturating_sub(TABLE_CHROME) as usize
}

/// Draws one frame.
pub(super) fn render(frame: &mut Frame, s: &Snapshot, view: &ViewState) {
    let [header, spark, middle, gpus, footer] = areas(frame.area(), s);
    render_header(frame, header, s);
    render_sparkline(frame, spark, s);
    let [jobs, nodes] =
        Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(middle);
    render_jobs(frame, jobs, s, view);
    render_nodes(frame, nodes, s, view);
    render_gpus(frame, gpus, s, view);
    let keys = format!(
        " q/Esc quit · j/k ↑/↓ PgUp/PgDn scroll · s sort (now: {}) ",
        view.sort.label()
    );
    frame.render_widget(
        Paragraph::new(keys).style(Style::new().add_modifier(Modifier::REVERSED)),
        footer,
    );
}

fn render_header(frame: &mut Frame, area: Rect, s: &Snapshot) {
    let when = if s.taken_ms > 0 {
        let t = UNIX_EPOCH + Duration::from_millis(s.taken_ms as u64);
        format!("updated {}", humantime::format_rfc3339_seconds(t))
    } else {
        "waiting for the first answer".to_string()
    };
    let first = Line::from(vec![
        Span::styled("flopwatch top", bold()),
        Span::raw(format!(" · {} · {when}", s.collector)),
    ]);
    let mut fleet = vec![Span::raw("fleet OFU ")];
    match &s.fleet_now {
        Some(o) => {
            fleet.push(Span::styled(pct(o.mean), bold().fg(ofu_color(o.mean))));
            fleet.push(Span::raw(format!(" (last {})", human(s.window_ms))));
        }
        None => fleet.push(Span::raw("no data")),
    }
    if let Some(o) = &s.fleet_since {
        fleet.push(Span::raw(format!(
            " · {} mean over {}",
            pct(o.mean),
            human(s.since_ms)
        )));
    }
    if let Some(o) = &s.fleet_now {
        fleet.push(Span::raw(format!(
            " · {:.1} of {:.1} peak TFLOP/s",
            o.achieved_tflops, o.peak_tflops
        )));
    }
    fleet.push(Span::raw(format!(
        " · {} GPUs · {} nodes · {} jobs",
        s.gpus.len(),
        s.nodes.len(),
        s.jobs.len()
    )));
    let third = match &s.error {
        Some(e) => Line::from(Span::styled(e.clone(), bold().fg(Color::Red))),
        None if s.gpus_queried < s.gpus.len() => Line::from(format!(
            "per-GPU OFU for the first {} of {} GPUs",
            s.gpus_queried,
            s.gpus.len()
        )),
        None => Line::default(),
    };
    frame.render_widget(Paragraph::new(vec![first, Line::from(fleet), third]), area);
}

fn render_sparkline(frame: &mut Frame, area: Rect, s: &Snapshot) {
    let max = s.fleet_series.iter().copied().fold(f64::NAN, f64::max);
    let title = match s.fleet_series.last() {
        Some(last) => format!(
            " fleet OFU, last {} (0-100%): latest {}, max {} ",
            human(s.since_ms),
            pct(*last),
            pct(max)
        ),
        None => format!(" fleet OFU, last {} ", human(s.since_ms)),
    };
    let block = Block::new().borders(Borders::ALL).title(title);
    if s.fleet_series.is_empty() {
        frame.render_widget(Paragraph::new("no samples yet").block(block), area);
        return;
    }
    // The newest buckets that fit; 1000 = 100 % OFU.
    let width = area.width.saturating_sub(2) as usize;
    let tail = &s.fleet_series[s.fleet_series.len().saturating_sub(width)..];
    let data: Vec<u64> = tail
        .iter()
        .map(|f| (f.clamp(0.0, 1.0) * 1000.0).round() as u64)
        .collect();
    frame.render_widget(
        Sparkline::default()
            .block(block)
            .data(&data)
            .max(1000)
            .style(Style::new().fg(Color::Cyan)),
        area,
    );
}

/// Tables narrower than this drop their least useful column and halve
/// their bars, so names keep room on an 80-column terminal.
const ROOMY: u16 = 48;

/// A table of `columns` (title, width, cell per row); `None` widths are
/// the name column that takes what is left.
fn table<'a>(
    columns: Vec<(&'static str, Option<u16>)>,
    rows: Vec<Vec<Cell<'a>>>,
    title: String,
) -> Table<'a> {
    let widths: Vec<Constraint> = columns
        .iter()
        .map(|(_, w)| w.map_or(Constraint::Fill(1), Constraint::Length))
        .collect();
    Table::new(rows.into_iter().map(Row::new), widths)
        .header(Row::new(columns.iter().map(|(t, _)| *t)).style(bold()))
        .block(Block::new().borders(Borders::ALL).title(title))
}

fn render_jobs(frame: &mut Frame, area: Rect, s: &Snapshot, view: &ViewState) {
    let roomy = area.width >= ROOMY;
    let bar = if roomy { BAR } else { BAR / 2 };
    let rows = sorted_jobs(s, view.sort)
        .into_iter()
        .map(|j| {
            let mut cells = vec![
                Cell::from(j.job_id.clone()),
                Cell::from(format!("{:>4}", j.gpus)),
            ];
            if roomy {
                cells.push(Cell::from(format!("{:>5}", j.nodes)));
            }
            cells.push(Cell::from(ofu_line(
                j.ofu.as_ref(),
                bar,
                j.ended.then_some("ended"),
            )));
            cells.push(Cell::from(format!("{:>6}", opt_pct(j.ofu.map(|o| o.p10)))));
            cells
        })
        .collect();
    let mut columns = vec![("job", None), ("GPUs", Some(4))];
    if roomy {
        columns.push(("nodes", Some(5)));
    }
    columns.push(("OFU", Some(ofu_cell(bar))));
    columns.push(("   p10", Some(6)));
    let title = format!(" jobs, last {} ", human(s.window_ms));
    frame.render_widget(table(columns, rows, title), area);
}

fn render_nodes(frame: &mut Frame, area: Rect, s: &Snapshot, view: &ViewState) {
    let roomy = area.width >= ROOMY;
    let bar = if roomy { BAR } else { BAR / 2 };
    let rows = sorted_nodes(s, view.sort)
        .into_iter()
        .map(|n| {
            let mut cells = vec![
                Cell::from(n.node_id.clone()),
                Cell::from(format!("{:>4}", n.gpus)),
                Cell::from(ofu_line(n.ofu.as_ref(), bar, n.stale.then_some("stale"))),
            ];
            if roomy && s.taken_ms > 0 {
                let secs = (s.taken_ms - n.last_seen_ms).max(0) / 1000;
                let ago = match secs {
                    0..60 => format!("{secs}s ago"),
                    60..3600 => format!("{}m ago", secs / 60),
                    _ => format!("{}h ago", secs / 3600),
                };
                cells.push(Cell::from(format!("{ago:>8}")));
            }
            cells
        })
        .collect();
    let mut columns = vec![
        ("node", None),
        ("GPUs", Some(4)),
        ("OFU", Some(ofu_cell(bar))),
    ];
    if roomy {
        columns.push(("    seen", Some(8)));
    }
    frame.render_widget(table(columns, rows, " nodes ".into()), area);
}

fn render_gpus(frame: &mut Frame, area: Rect, s: &Snapshot, view: &ViewState) {
    let all = sorted_gpus(s, view.sort);
    let visible = area.height.saturating_sub(TABLE_CHROME) as usize;
    let first = view.scroll.min(all.len().saturating_sub(visible));
    let shown = &all[first..(first + visible).min(all.len())];
    let rows = shown
        .iter()
        .map(|g| {
            let model = g.model.strip_prefix("NVIDIA ").unwrap_or(&g.model);
            let job = if g.job_id.is_empty() { "-" } else { &g.job_id };
            let clock = g
                .ofu
                .and_then(|o| o.sm_clock_mhz)
                .map(|c| format!("{c:>6.0}"))
                .unwrap_or_else(|| format!("{:>6}", "-"));
            vec![
                Cell::from(g.node_id.clone()),
                Cell::from(format!("{:>3}", g.index)),
                Cell::from(model.to_string()),
                Cell::from(job.to_string()),
                Cell::from(ofu_line(g.ofu.as_ref(), BAR, g.stale.then_some("stale"))),
                Cell::from(format!(
                    "{:>6}",
                    opt_pct(g.ofu.and_then(|o| o.tensor_active))
                )),
                Cell::from(clock),
            ]
        })
        .collect();
    let title = if all.is_empty() {
        " GPUs ".to_string()
    } else {
        format!(
            " GPUs {}-{} of {}, last {}, sorted by {} ",
            first + 1,
            first + shown.len(),
            all.len(),
            human(s.window_ms),
            view.sort.label()
        )
    };
    let columns = vec![
        ("node", None),
        ("GPU", Some(3)),
        ("model", Some(16)),
        ("job", None),
        ("OFU", Some(ofu_cell(BAR))),
        ("tensor", Some(6)),
        ("SM MHz", Some(6)),
    ];
    frame.render_widget(table(columns, rows, title), area);
}

/// The text of a buffer, one line per row, trailing blanks trimmed.
pub(super) fn buffer_text(buf: &Buffer) -> String {
    let a = buf.area;
    let mut out = String::new();
    for y in a.top()..a.bottom() {
        let mut line = String::new();
        for x in a.left()..a.right() {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
