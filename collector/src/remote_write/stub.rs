//! Test doubles for remote write: a scripted HTTP endpoint and fast
//! settings.

use super::queue::RemoteQueue;
use super::Endpoint;
use crate::stats::Stats;
use flopwatch_config::RemoteWriteConfig;
use flopwatch_proto::clock::Deadline;
use flopwatch_proto::clock::SystemClock;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// An HTTP endpoint answering with `script` in turn (then 200), one
/// request per connection; records each request's head and body. Status
/// 0 closes the connection without an answer, 1 answers the text as it is
/// (not HTTP), 2 answers nothing for a second.
pub(super) struct Stub {
    pub url: String,
    seen: Arc<Mutex<Vec<Request>>>,
}

/// A request's head (lowercased) and body.
pub(super) type Request = (String, Vec<u8>);

/// Reads one HTTP request (head lowercased, body by its
/// `Content-Length`); `None` when the connection closes first.
pub(super) async fn read_request(c: &mut tokio::net::TcpStream) -> Option<Request> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = c.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buf.len() >= end + 4 + len {
            return Some((head, buf[end + 4..end + 4 + len].to_vec()));
        }
    }
}

impl Stub {
    pub(super) async fn start(script: Vec<(u16, &'static str)>) -> Stub {
        use tokio::io::AsyncWriteExt;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api/v1/write", l.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            let mut script = script.into_iter();
            while let Ok((mut c, _)) = l.accept().await {
                let request = read_request(&mut c).await;
                let Some(request) = request else {
                    continue;
                };
                record.lock().unwrap().push(request);
                let (code, text) = script.next().unwrap_or((200, ""));
                match code {
                    0 => continue,
                    1 => {
                        let _ = c.write_all(text.as_bytes()).await;
                        let _ = c.shutdown().await;
                        continue;
                    }
                    2 => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                    _ => {}
                }
                let resp = format!(
                    "HTTP/1.1 {code} Scripted\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = c.write_all(resp.as_bytes()).await;
                let _ = c.shutdown().await;
            }
        });
        Stub { url, seen }
    }

    pub(super) fn requests(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

pub(super) fn fast(url: &str) -> RemoteWriteConfig {
    RemoteWriteConfig {
        url: url.into(),
        interval: Duration::from_millis(20),
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
        // One GPU's OFU, tensor activity and SM clock per request.
        max_samples_per_request: 3,
        ..Default::default()
    }
}

pub(super) async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Deadline::after(Duration::from_secs(10));
    while !done() {
        assert!(!deadline.passed(), "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs the sender until `done`, then stops it.
pub(super) async fn run_until(
    cfg: &RemoteWriteConfig,
    q: &Arc<RemoteQueue>,
    stats: &Arc<Stats>,
    done: impl FnMut() -> bool,
) {
    let endpoint = Endpoint::new(cfg).unwrap();
    let (stop, stop_rx) = watch::channel(false);
    let task = {
        let (cfg, q, stats) = (cfg.clone(), q.clone(), stats.clone());
        tokio::spawn(async move {
            super::sender::sender(&endpoint, &cfg, &q, &stats, &SystemClock, stop_rx).await
        })
    };
    wait_for("the sender's work", done).await;
    let _ = stop.send(true);
    task.await.unwrap();
}
