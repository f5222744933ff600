//! The demo's HTML report as a browser draws it: headless Chromium lays the page out and
//! takes a screenshot. The layout is measured in the page itself (every chart text inside
//! its chart, no two texts of a chart on top of each other, nothing wider than the
//! window), and the screenshot must be the page's size and show the charts' colours.
//!
//! Needs Chromium (`scripts/test` installs Debian's `chromium` when it is missing). Without
//! it the test fails under `CI=true` and is skipped, with a word, elsewhere.

#[path = "support/bin.rs"]
mod bin;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Width of the browser window, CSS pixels (a laptop's browser window).
const WIDTH: u32 = 1000;

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    [
        "chromium",
        "chromium-browser",
        "chromium-headless-shell",
        "google-chrome",
    ]
    .iter()
    .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
    .find(|candidate| candidate.is_file())
}

/// Runs headless Chromium on `page` with `args`; returns its stdout.
fn run_chromium(browser: &Path, profile: &Path, page: &Path, args: &[String]) -> String {
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--no-first-run",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Measures the laid-out page and writes the findings, as JSON, into the element
/// `#layout` (read back from `--dump-dom`).
const MEASURE: &str = r#"<pre id="layout"></pre><script>
(function () {
  const r = { problems: [], charts: 0, texts: 0 };
  const doc = document.documentElement;
  r.viewport = doc.clientWidth;
  r.scrollWidth = doc.scrollWidth;
  r.height = Math.ceil(doc.scrollHeight);
  const inside = (b, box) => b.left >= box.left - 0.5 && b.right <= box.right + 0.5
      && b.top >= box.top - 0.5 && b.bottom <= box.bottom + 0.5;
  for (const svg of document.querySelectorAll('svg')) {
    r.charts++;
    const box = svg.getBoundingClientRect();
    const name = (svg.querySelector('text') || {}).textContent;
    if (box.width < 200 || box.height < 100) r.problems.push(name + ': chart drawn ' + box.width + 'x' + box.height);
    if (box.right > r.viewport + 0.5) r.problems.push(name + ': chart ends at ' + box.right + ', past the window');
    const texts = Array.from(svg.querySelectorAll('text')).map(t => [t.textContent, t.getBoundingClientRect()]);
    for (const [s, b] of texts) {
      r.texts++;
      if (!inside(b, box)) r.problems.push(name + ': "' + s + '" is cut off by the chart');
    }
    for (let i = 0; i < texts.length; i++) {
      for (let j = i + 1; j < texts.length; j++) {
        const [a, p] = texts[i], [b, q] = texts[j];
        const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
        const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
        if (w > 1 && h > 1) r.problems.push(name + ': "' + a + '" overlaps "' + b + '"');
      }
    }
  }
  for (const el of document.querySelectorAll('pre, table, h1, h2')) {
    if (el.id === 'layout') continue;
    const b = el.getBoundingClientRect();
    if (el.scrollWidth > el.clientWidth + 1) r.problems.push(el.tagName + ' "' + el.textContent.slice(0, 40) + '": content wider than its box');
    if (b.right > r.viewport + 0.5) r.problems.push(el.tagName + ' "' + el.textContent.slice(0, 40) + '": ends past the window');
  }
  document.getElementById('layout').textContent = JSON.stringify(r);
})();
</script>"#;

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Width, height and RGBA pixels of a PNG.
fn decode_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let file = std::fs::File::open(path).expect("the screenshot is written");
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().expect("a PNG");
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).expect("PNG pixels");
    pixels.truncate(info.buffer_size());
    let rgba: Vec<u8> = match info.color_type {
        png::ColorType::Rgba => pixels,
        png::ColorType::Rgb => pixels
            .chunks(3)
            .flat_map(|p| [p[0], p[1], p[2], 255])
            .collect(),
        other => panic!("unexpected screenshot colour type {other:?}"),
    };
    (info.width, info.height, rgba)
}

fn hex(color: &str) -> [u8; 3] {
    let v = u32::from_str_radix(color.trim_start_matches('#'), 16).expect("a colour");
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

#[test]
fn the_demo_report_renders_in_chromium_with_every_label_inside_its_chart() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "Chromium is needed to render the HTML report (scripts/test installs Debian's chromium)"
        );
        eprintln!("skipped: no chromium on PATH (scripts/test installs it)");
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, _, html) = bin::two_day_demo();
    let report = dir.path().join("demo.html");
    std::fs::write(&report, &html).expect("write the report");

    // 1. Layout, measured by the browser in a copy of the page with a measuring script.
    let measured = dir.path().join("measured.html");
    let with_script = html.replacen("</body>", &format!("{MEASURE}</body>"), 1);
    std::fs::write(&measured, with_script).expect("write the measured copy");
    let profile = dir.path().join("profile");
    let dom = run_chromium(
        &browser,
        &profile,
        &measured,
        &[format!("--window-size={WIDTH},1000"), "--dump-dom".into()],
    );
    let json = dom
        .split_once("<pre id=\"layout\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .map(|(json, _)| unescape(json))
        .unwrap_or_else(|| panic!("the measuring script ran: {dom:.2000}"));
    let layout: serde_json::Value = serde_json::from_str(&json).expect("layout JSON");
    println!("layout: {layout}");
    assert_eq!(layout["charts"], 7, "seven charts: {layout}");
    assert!(layout["texts"].as_u64().unwrap_or(0) > 60, "{layout}");
    assert_eq!(
        layout["problems"].as_array().map(Vec::len),
        Some(0),
        "the page lays out cleanly at {WIDTH} px: {layout:#}"
    );
    assert!(
        layout["scrollWidth"].as_u64() <= layout["viewport"].as_u64(),
        "nothing scrolls sideways: {layout}"
    );

    // 2. The screenshot of the whole page, as drawn.
    let height = layout["height"].as_u64().expect("page height") as u32;
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("demo-report.png");
    run_chromium(
        &browser,
        &profile,
        &report,
        &[
            format!("--window-size={WIDTH},{height}"),
            format!("--screenshot={}", shot.display()),
        ],
    );
    println!("screenshot: {}", shot.display());
    let (w, h, rgba) = decode_png(&shot);
    assert_eq!((w, h), (WIDTH, height), "the screenshot is the page's size");
    let pixels = rgba.len() / 4;
    let inked = rgba
        .chunks(4)
        .filter(|p| p[0] < 200 || p[1] < 200 || p[2] < 200)
        .count();
    let share = inked as f64 / pixels as f64;
    assert!(
        (0.01..0.5).contains(&share),
        "text and lines cover {:.1}% of the page: neither blank nor a solid block",
        share * 100.0
    );
    // Every series colour used by the charts is drawn somewhere.
    for color in ["#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd"] {
        let [r, g, b] = hex(color);
        let near =
            |p: &[u8]| p[0].abs_diff(r) < 24 && p[1].abs_diff(g) < 24 && p[2].abs_diff(b) < 24;
        let count = rgba.chunks(4).filter(|p| near(p)).count();
        assert!(count > 50, "colour {color} drawn on {count} pixels");
    }
}
