//! A Prometheus API on a loopback port whose range answers are as large as their shape
//! allows: every series lookup lists `containers` containers, and every range query is
//! answered with `series` series of as many samples as the query has steps, each series
//! carrying an extra label of `pad_bytes` bytes (or as long as Tailor takes a series of
//! that many steps to be). The answers are valid JSON of the API and
//! are written as they are generated, so the server itself holds one series at a time.
//!
//! With `pad_bytes: 0` and as many series as a query covers, the answers are ordinary
//! (the baseline); with padding, four answers in flight are hundreds of megabytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The shape of the answers.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Containers the series lookup lists (all in namespace `hostile`).
    pub containers: usize,
    /// Series in each range answer.
    pub series: usize,
    /// Bytes of the extra label on each series; `None` pads each series to the most
    /// Tailor reads of a series with its query's steps (64 bytes a step and 64 KiB).
    pub pad_bytes: Option<usize>,
}

/// A running server.
pub struct HostilePrometheus {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Bytes of range answers written so far.
    pub range_bytes: Arc<AtomicU64>,
    /// Range answers written to their end.
    pub range_answers: Arc<AtomicUsize>,
}

/// The request's path (without a query string) and its form fields.
fn parse_request(head: &str, body: &str) -> (String, Vec<(String, String)>) {
    let target = head.split_whitespace().nth(1).unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let fields = [query, body]
        .iter()
        .flat_map(|s| s.split('&'))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (path.to_string(), fields)
}

fn field(fields: &[(String, String)], name: &str) -> i64 {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse::<f64>().ok())
        .map_or(0, |v| v as i64)
}

/// Starts the server.
pub async fn start(shape: Shape) -> HostilePrometheus {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let range_bytes = Arc::new(AtomicU64::new(0));
    let range_answers = Arc::new(AtomicUsize::new(0));
    let (bytes, answers) = (range_bytes.clone(), range_answers.clone());
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (bytes, answers) = (bytes.clone(), answers.clone());
            tokio::spawn(async move {
                let _ = serve(socket, shape, &bytes, &answers).await;
            });
        }
    });
    HostilePrometheus {
        url,
        range_bytes,
        range_answers,
    }
}

async fn serve(
    mut socket: tokio::net::TcpStream,
    shape: Shape,
    bytes: &AtomicU64,
    answers: &AtomicUsize,
) -> std::io::Result<()> {
    let mut data = Vec::new();
    let mut buf = [0u8; 16384];
    let head_end = loop {
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = socket.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while data.len() < head_end + length {
        let n = socket.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        data.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&data[head_end..]).to_string();
    let (path, fields) = parse_request(&head, &body);
    socket
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
        )
        .await?;
    let labels = |i: usize| format!(r#""namespace":"hostile","pod":"p-{i}","container":"c""#);
    if path.ends_with("/api/v1/series") {
        let entries: Vec<String> = (0..shape.containers)
            .map(|i| {
                format!(
                    r#"{{"__name__":"container_memory_working_set_bytes",{}}}"#,
                    labels(i)
                )
            })
            .collect();
        let answer = format!(r#"{{"status":"success","data":[{}]}}"#, entries.join(","));
        return socket.write_all(answer.as_bytes()).await;
    }
    if !path.ends_with("/api/v1/query_range") {
        return socket
            .write_all(br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#)
            .await;
    }
    let (start, end, step) = (
        field(&fields, "start"),
        field(&fields, "end"),
        field(&fields, "step").max(1),
    );
    // One series' samples, shared by all of them.
    let mut values = String::from("[");
    let mut t = start;
    while t <= end {
        if t > start {
            values.push(',');
        }
        values.push_str(&format!("[{t},\"0.25\"]"));
        t += step;
    }
    values.push(']');
    let points = ((end - start) / step + 1).max(1) as usize;
    let pad = "x".repeat(
        shape
            .pad_bytes
            .unwrap_or((points * 64 + (64 << 10)).saturating_sub(values.len() + 256)),
    );
    let mut put = async |part: &[u8]| {
        bytes.fetch_add(part.len() as u64, Ordering::Relaxed);
        socket.write_all(part).await
    };
    put(br#"{"status":"success","data":{"resultType":"matrix","result":["#).await?;
    for i in 0..shape.series {
        let head = format!(
            r#"{}{{"metric":{{{},"pad":""#,
            if i > 0 { "," } else { "" },
            labels(i)
        );
        put(head.as_bytes()).await?;
        put(pad.as_bytes()).await?;
        put(br#""},"values":"#).await?;
        put(values.as_bytes()).await?;
        put(b"}").await?;
    }
    put(b"]}}").await?;
    answers.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
