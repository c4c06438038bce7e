//! `flopwatch top --collector URL [--token T] [--refresh 2s] [--since 5m] [--once]`
//!
//! A live terminal view of a collector's fleet — nodes, GPUs and jobs with
//! OFU bars (OFU paper eq. 1, job OFU eq. 11) — that works over SSH.
//!
//! The parts: `fetch` asks the Query service for one refresh, `model`
//! turns the answers into a [`Snapshot`], `render` draws a
//! snapshot, and this file runs the loop: a fetch task sends snapshots, the
//! UI task draws them and reads keys. A collector that is down shows as
//! "collector unreachable: …" above the last rows seen, and is retried
//! every refresh. The terminal is restored on quit, on error, on Ctrl-C,
//! SIGTERM and on panic (ratatui's panic hook).
//!
//! `--once` draws one frame into an off-screen buffer and prints it as
//! plain text (width `$COLUMNS` or 120): for scripts and tests.

mod fetch;
mod model;
mod render;

use crate::parse_ms;
use anyhow::Context;
use crossterm::event::{Event, EventStream, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use fetch::{Ask, Source};
use futures::StreamExt;
use model::{Snapshot, ViewState};
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;
use ratatui::Terminal;
use std::io::IsTerminal;
use std::time::Duration;

/// Length of the "now" window of every summary (capped by `--since`).
const WINDOW_MS: i64 = 60_000;
/// Width of a `--once` frame without `$COLUMNS`.
const ONCE_WIDTH: u16 = 120;

/// Arguments of `top`.
#[derive(clap::Args)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    conn: crate::conn::ConnArgs,
    /// Time between refreshes, e.g. 2s.
    #[arg(long, default_value = "2s")]
    refresh: String,
    /// Range of the fleet sparkline and of the lists, e.g. 5m.
    #[arg(long, default_value = "5m")]
    since: String,
    /// Print one frame as plain text and exit.
    #[arg(long)]
    once: bool,
}

fn now_ms() -> i64 {
    flopwatch_proto::clock::Clock::now_ms(&flopwatch_proto::clock::SystemClock)
}

pub(crate) async fn run(args: TopArgs) -> anyhow::Result<()> {
    let refresh_ms = parse_ms(&args.refresh).context("--refresh")?;
    let since_ms = parse_ms(&args.since).context("--since")?;
    anyhow::ensure!(refresh_ms > 0, "--refresh must be more than 0");
    anyhow::ensure!(since_ms >= 1000, "--since must be at least 1s");
    let window_ms = WINDOW_MS.min(since_ms);
    // A call may take a refresh or two, never forever.
    let timeout = Duration::from_millis((2 * refresh_ms).clamp(3_000, 30_000) as u64);
    let source = Source::new(&args.conn, timeout)?;
    let ask = move || Ask {
        now_ms: now_ms(),
        window_ms,
        since_ms,
    };
    if args.once {
        let a = ask();
        let r = source.fetch(a).await.map_err(anyhow::Error::msg)?;
        let snap = Snapshot::build(&args.conn.collector, a.now_ms, window_ms, since_ms, r);
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse::<u16>().ok())
            .filter(|&w| w >= 40)
            .unwrap_or(ONCE_WIDTH);
        print!("{}", once_text(&snap, &ViewState::default(), width)?);
        return Ok(());
    }
    anyhow::ensure!(
        std::io::stdout().is_terminal(),
        "standard output is not a terminal: use --once for plain text"
    );
    live(
        source,
        ask,
        Snapshot::empty(&args.conn.collector, window_ms, since_ms),
        Duration::from_millis(refresh_ms as u64),
    )
    .await
}

/// One frame of `s`, tall enough for every row, as plain text.
fn once_text(s: &Snapshot, view: &ViewState, width: u16) -> anyhow::Result<String> {
    let mut t = Terminal::new(TestBackend::new(width, render::height_for(s)))?;
    t.draw(|f| render::render(f, s, view))?;
    Ok(render::buffer_text(t.backend().buffer()))
}

/// What a key asks for.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    Quit,
    Redraw,
    Nothing,
}

/// Applies a key to the view: `rows` GPU rows, `visible` on screen.
fn on_key(view: &mut ViewState, key: KeyEvent, rows: usize, visible: usize) -> Action {
    if key.kind == KeyEventKind::Release {
        return Action::Nothing;
    }
    let last = rows.saturating_sub(visible.max(1));
    let page = visible.max(1);
    match key.code {
        KeyCode::Char('q') | KeyCode::Esc => return Action::Quit,
        KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return Action::Quit,
        KeyCode::Char('j') | KeyCode::Down => view.scroll = (view.scroll + 1).min(last),
        KeyCode::Char('k') | KeyCode::Up => view.scroll = view.scroll.saturating_sub(1),
        KeyCode::PageDown | KeyCode::Char(' ') => view.scroll = (view.scroll + page).min(last),
        KeyCode::PageUp => view.scroll = view.scroll.saturating_sub(page),
        KeyCode::Home | KeyCode::Char('g') => view.scroll = 0,
        KeyCode::End | KeyCode::Char('G') => view.scroll = last,
        KeyCode::Char('s') => view.sort = view.sort.next(),
        _ => return Action::Nothing,
    }
    Action::Redraw
}

/// Raw mode and the alternate screen while alive; restored when dropped,
/// whatever the way out (`ratatui::try_init` also hooks panics).
struct Screen(ratatui::DefaultTerminal);

impl Screen {
    fn open() -> anyhow::Result<Self> {
        Ok(Self(
            ratatui::try_init().context("setting up the terminal")?,
        ))
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

async fn live(
    source: Source,
    ask: impl Fn() -> Ask + Send + 'static,
    mut snap: Snapshot,
    refresh: Duration,
) -> anyhow::Result<()> {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(i64, Result<model::Responses, String>)>(1);
    let fetcher = tokio::spawn(async move {
        let mut tick = tokio::time::interval(refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let a = ask();
            let r = source.fetch(a).await;
            if tx.send((a.now_ms, r)).await.is_err() {
                return;
            }
        }
    });
    // Abort the fetcher however this function ends.
    struct AbortOnDrop(tokio::task::JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _fetcher = AbortOnDrop(fetcher);

    let mut screen = Screen::open()?;
    let mut events = EventStream::new();
    let mut view = ViewState::default();
    loop {
        screen.0.draw(|f| render::render(f, &snap, &view))?;
        tokio::select! {
            got = rx.recv() => match got {
                Some((taken, Ok(r))) => {
                    snap = Snapshot::build(&snap.collector, taken, snap.window_ms, snap.since_ms, r);
                }
                Some((_, Err(e))) => snap.error = Some(e),
                None => anyhow::bail!("the refresh task stopped"),
            },
            ev = events.next() => match ev {
                Some(Ok(Event::Key(k))) => {
                    let size = screen.0.size()?;
                    let area = Rect::new(0, 0, size.width, size.height);
                    let visible = render::gpu_rows_visible(area, &snap);
                    if on_key(&mut view, k, snap.gpus.len(), visible) == Action::Quit {
                        break;
                    }
                }
                Some(Ok(_)) => {} // resize and the rest: redraw
                Some(Err(e)) => return Err(e).context("reading the terminal"),
                None => break,
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
        }
    }
    drop(screen);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::model::{Ofu, Responses, Sort};
    use super::*;
    use flopwatch_proto::v1;
    use ratatui::backend::TestBackend;

    fn answer(mean: f64, p10: f64, tensor: f64, clock: f64, gpus: u32) -> v1::OfuResponse {
        v1::OfuResponse {
            points: vec![v1::OfuPoint {
                timestamp_ms: 1_000,
                ofu: mean,
                tensor_active: tensor,
                sm_clock_mhz: clock,
                gpus,
            }],
            summary: Some(v1::OfuSummary {
                mean,
                min: mean / 2.0,
                max: mean * 1.2,
                p50: mean,
                p10,
                samples: 100,
                gpus,
                peak_tflops: 989.4 * f64::from(gpus),
                achieved_tflops: 989.4 * f64::from(gpus) * mean,
                ..Default::default()
            }),
        }
    }

    /// 2 nodes × 2 GPUs, 2 jobs; GPU OFU 41.23 %, 12.5 %, 73.3 %, 55.1 %.
    fn snapshot() -> Snapshot {
        let mut r = Responses::default();
        let gpu_ofu = [0.4123, 0.125, 0.733, 0.551];
        for (n, node) in ["node-alpha", "node-beta"].into_iter().enumerate() {
            r.nodes.push(v1::NodeEntry {
                node_id: node.into(),
                hostname: node.into(),
                tenant: "default".into(),
                gpus: 2,
                last_seen_ms: 99_000,
                boot_id: "b".into(),
            });
            let node_mean = (gpu_ofu[2 * n] + gpu_ofu[2 * n + 1]) / 2.0;
            r.node_ofu
                .insert(node.into(), answer(node_mean, 0.1, 0.5, 1700.0, 2));
            for i in 0..2 {
                let uuid = format!("GPU-{n}{i}");
                let job = if i == 0 { "train-llm" } else { "serve-chat" };
                r.gpus.push(v1::GpuEntry {
                    info: Some(v1::GpuInfo {
                        index: i,
                        uuid: uuid.clone(),
                        model: "NVIDIA H100 80GB HBM3".into(),
                        ..Default::default()
                    }),
                    node_id: node.into(),
                    tenant: "default".into(),
                    job_id: job.into(),
                    shares: Vec::new(),
                    last_seen_ms: 99_000,
                });
                let f = gpu_ofu[2 * n + i as usize];
                r.gpu_ofu
                    .insert(uuid, answer(f, f, f * 1.1, 1755.0 - i as f64, 1));
            }
        }
        for (job, mean, p10) in [
            ("train-llm", 0.5726, 0.4201),
            ("serve-chat", 0.3381, 0.1302),
        ] {
            r.jobs.push(v1::JobEntry {
                job_id: job.into(),
                tenant: "default".into(),
                gpu_uuids: vec!["x".into(), "y".into()],
                node_ids: vec!["node-alpha".into(), "node-beta".into()],
                first_seen_ms: 1,
                last_seen_ms: 99_000,
            });
            r.job_ofu
                .insert(job.into(), answer(mean, p10, 0.6, 1700.0, 2));
        }
        r.fleet_now = Some(answer(0.455, 0.125, 0.5, 1700.0, 4));
        let mut series = answer(0.45, 0.1, 0.5, 1700.0, 4);
        series.points = (0..30)
            .map(|i| v1::OfuPoint {
                timestamp_ms: i * 10_000,
                ofu: 0.3 + 0.01 * i as f64,
                tensor_active: 0.5,
                sm_clock_mhz: 1700.0,
                gpus: 4,
            })
            .collect();
        r.fleet_series = Some(series);
        r.gpus_queried = 4;
        Snapshot::build("http://collector.test:7070", 100_000, 60_000, 300_000, r)
    }

    fn draw(s: &Snapshot, view: &ViewState, w: u16, h: u16) -> String {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| render::render(f, s, view)).unwrap();
        render::buffer_text(t.backend().buffer())
    }

    #[test]
    fn renders_nodes_jobs_and_percents_into_a_test_backend() {
        let s = snapshot();
        let text = draw(&s, &ViewState::default(), 120, 40);
        for id in ["node-alpha", "node-beta", "train-llm", "serve-chat"] {
            assert!(text.contains(id), "{id} missing:\n{text}");
        }
        // Percents computed from the inputs: GPUs, jobs (mean and p10),
        // nodes, fleet.
        for p in [
            "41.2%", "12.5%", "73.3%", "55.1%", "57.3%", "42.0%", "33.8%", "13.0%", "26.9%",
            "64.2%", "45.5%",
        ] {
            assert!(text.contains(p), "{p} missing:\n{text}");
        }
        assert!(text.contains("http://collector.test:7070"), "{text}");
        assert!(text.contains("H100 80GB HBM3"), "{text}");
        // Achieved vs peak TFLOP/s of the fleet: 4 × 989.4 × 0.455.
        assert!(text.contains("1800.7 of 3957.6 peak TFLOP/s"), "{text}");
        assert!(text.contains("q/Esc quit"), "{text}");
        // Tensor activity and SM clock of a GPU (0.4123 × 1.1 = 45.4 %).
        assert!(text.contains("45.4%") && text.contains("1755"), "{text}");
    }

    fn line_of(text: &str, needle: &str) -> usize {
        text.lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle} missing:\n{text}"))
    }

    #[test]
    fn sorting_by_ofu_desc_puts_the_higher_gpu_first() {
        let s = snapshot();
        let desc = ViewState {
            sort: Sort::OfuDesc,
            ..ViewState::default()
        };
        let text = draw(&s, &desc, 120, 40);
        // GPU rows end with their SM clock; the GPU percents are unique.
        assert!(line_of(&text, "73.3%") < line_of(&text, "41.2%"), "{text}");
        assert!(line_of(&text, "41.2%") < line_of(&text, "12.5%"), "{text}");
        let asc = ViewState {
            sort: Sort::OfuAsc,
            ..desc
        };
        let text = draw(&s, &asc, 120, 40);
        assert!(line_of(&text, "12.5%") < line_of(&text, "73.3%"), "{text}");
        // Jobs sort too.
        let text = draw(&s, &desc, 120, 40);
        assert!(line_of(&text, "train-llm") < line_of(&text, "serve-chat"));
        let by_name = ViewState {
            sort: Sort::Name,
            ..desc
        };
        let text = draw(&s, &by_name, 120, 40);
        assert!(line_of(&text, "serve-chat") < line_of(&text, "train-llm"));
    }

    #[test]
    fn ofu_bar_colour_follows_value_and_percent_is_printed() {
        assert_eq!(render::ofu_color(0.1), ratatui::style::Color::Red);
        assert_eq!(render::ofu_color(0.3), ratatui::style::Color::Yellow);
        assert_eq!(render::ofu_color(0.8), ratatui::style::Color::Green);
        assert_eq!(render::pct(0.4123), "41.2%");
        let mut t = Terminal::new(TestBackend::new(120, 40)).unwrap();
        let s = snapshot();
        t.draw(|f| render::render(f, &s, &ViewState::default()))
            .unwrap();
        let buf = t.backend().buffer();
        // The first bar cell of the 12.5 % GPU is red, of the 73.3 % one green.
        let find = |needle: &str| {
            let text = render::buffer_text(buf);
            let y = line_of(&text, needle) as u16;
            let x = (0..buf.area.width)
                .find(|&x| buf[(x, y)].symbol() == "█" || buf[(x, y)].symbol() == "▎")
                .unwrap();
            buf[(x, y)].fg
        };
        assert_eq!(find("12.5%"), ratatui::style::Color::Red);
        assert_eq!(find("73.3%"), ratatui::style::Color::Green);
    }

    #[test]
    fn an_unreachable_collector_is_shown_above_the_last_rows() {
        let mut s = snapshot();
        s.error = Some("collector unreachable: http://collector.test:7070: refused".into());
        let text = draw(&s, &ViewState::default(), 120, 40);
        assert!(
            text.contains("collector unreachable: http://collector.test:7070"),
            "{text}"
        );
        assert!(text.contains("node-alpha"), "{text}");
        let empty = Snapshot::empty("http://x:1", 60_000, 300_000);
        let text = draw(&empty, &ViewState::default(), 80, 24);
        assert!(text.contains("waiting for the first answer"), "{text}");
        // Tiny terminals draw without panicking.
        draw(&s, &ViewState::default(), 20, 5);
        draw(&s, &ViewState::default(), 1, 1);
    }

    #[test]
    fn once_text_fits_every_row() {
        let mut s = snapshot();
        let base = s.gpus[0].clone();
        for i in 0..40 {
            let mut g = base.clone();
            g.index = 10 + i;
            g.uuid = format!("GPU-extra-{i}");
            g.ofu = Some(Ofu {
                mean: 0.01 * f64::from(i),
                ..Ofu::default()
            });
            s.gpus.push(g);
        }
        let text = once_text(&s, &ViewState::default(), 120).unwrap();
        assert!(text.contains(" 49 "), "{text}");
        assert!(text.contains("GPUs 1-44 of 44"), "{text}");
        assert!(text.lines().all(|l| l.chars().count() <= 120));
    }

    #[test]
    fn keys_scroll_sort_and_quit() {
        let key = |c| KeyEvent::new(c, KeyModifiers::NONE);
        let mut v = ViewState::default();
        assert_eq!(
            on_key(&mut v, key(KeyCode::Char('j')), 50, 10),
            Action::Redraw
        );
        assert_eq!(v.scroll, 1);
        on_key(&mut v, key(KeyCode::End), 50, 10);
        assert_eq!(v.scroll, 40);
        on_key(&mut v, key(KeyCode::Down), 50, 10);
        assert_eq!(v.scroll, 40, "no scrolling past the last page");
        on_key(&mut v, key(KeyCode::PageUp), 50, 10);
        on_key(&mut v, key(KeyCode::Char('k')), 50, 10);
        assert_eq!(v.scroll, 29);
        on_key(&mut v, key(KeyCode::Char('s')), 50, 10);
        assert_eq!(v.sort, Sort::OfuAsc);
        assert_eq!(
            on_key(&mut v, key(KeyCode::Char('x')), 50, 10),
            Action::Nothing
        );
        assert_eq!(
            on_key(&mut v, key(KeyCode::Char('q')), 50, 10),
            Action::Quit
        );
        assert_eq!(on_key(&mut v, key(KeyCode::Esc), 50, 10), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(on_key(&mut v, ctrl_c, 50, 10), Action::Quit);
    }
}
