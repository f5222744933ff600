//! Small self-contained SVG line charts for HTML reports: time on x, one or more series and
//! horizontal reference lines on y, axis ticks and a legend. No scripts, no external
//! resources, so a report opens anywhere.

use std::fmt::Write as _;

/// A line of (x, y) points.
#[derive(Debug, Clone)]
pub struct Series<'a> {
    /// Legend text.
    pub label: &'a str,
    /// CSS colour.
    pub color: &'a str,
    /// Points, x ascending.
    pub points: Vec<(f64, f64)>,
    /// Dashed stroke.
    pub dashed: bool,
}

/// A chart's frame.
#[derive(Debug, Clone)]
pub struct Chart<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// Formats a y value for the axis.
    pub y_format: fn(f64) -> String,
    /// Formats an x value (unix seconds) for the axis.
    pub x_format: fn(f64) -> String,
    /// Width and height in pixels.
    pub size: (u32, u32),
}

/// Height of one row of the legend, pixels.
const LEGEND_ROW: f64 = 16.0;

/// Escapes text for HTML and SVG.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A tick step of 1, 2 or 5 times a power of ten giving about `n` ticks over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / n;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let m = if norm < 1.5 {
        1.0
    } else if norm < 3.5 {
        2.0
    } else if norm < 7.5 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// Renders the chart as an inline `<svg>` element.
pub fn line_chart(chart: &Chart<'_>, series: &[Series<'_>]) -> String {
    let (w, h) = (f64::from(chart.size.0), f64::from(chart.size.1));
    let (left, right, top, bottom) = (70.0, 10.0, 28.0, 48.0);
    let pw = (w - left - right).max(1.0);
    let ph = (h - top - bottom).max(1.0);
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for (x, y) in all {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y1 = y1.max(*y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let ystep = nice_step(y1.max(1e-9), 4.0);
    let ymax = (y1 / ystep).ceil().max(1.0) * ystep;
    let sx = |x: f64| left + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| top + ph - y / ymax * ph;
    // The legend wraps into as many rows as its entries need; the chart grows by the
    // extra rows instead of cutting entries off at the right edge.
    let mut legend = Vec::with_capacity(series.len());
    let (mut lx, mut row) = (left, 0usize);
    for s in series {
        let width = 30.0 + 6.5 * s.label.chars().count() as f64;
        if lx > left && lx + width > w - right {
            row += 1;
            lx = left;
        }
        legend.push((s, lx, row));
        lx += width;
    }
    let h_total = h + LEGEND_ROW * row as f64;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h_total}" viewBox="0 0 {w} {h_total}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        out,
        r#"<text x="{left}" y="16" font-size="13" font-weight="bold">{}</text>"#,
        escape(chart.title)
    );
    // Y grid and labels.
    let mut y = 0.0;
    while y <= ymax + ystep / 2.0 {
        let py = sy(y);
        let _ = write!(
            out,
            r##"<line x1="{left}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            py + 4.0,
            escape(&(chart.y_format)(y))
        );
        y += ystep;
    }
    // X ticks: about six. The last label ends at its tick, so the right margin does not
    // cut it.
    for i in 0..=5 {
        let x = x0 + (x1 - x0) * f64::from(i) / 5.0;
        let px = sx(x);
        let anchor = if i == 5 { "end" } else { "middle" };
        let _ = write!(
            out,
            r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#999"/><text x="{px:.1}" y="{:.1}" text-anchor="{anchor}">{}</text>"##,
            top + ph,
            top + ph + 4.0,
            top + ph + 16.0,
            escape(&(chart.x_format)(x))
        );
    }
    let _ = write!(
        out,
        r##"<rect x="{left}" y="{top}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#999"/>"##
    );
    for s in series {
        if s.points.is_empty() {
            continue;
        }
        let mut d = String::new();
        for (i, (x, y)) in s.points.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { " L" },
                sx(*x),
                sy(*y)
            );
        }
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<path d="{d}" fill="none" stroke="{}" stroke-width="1.5"{dash}/>"#,
            escape(s.color)
        );
    }
    // Legend along the bottom.
    for (s, lx, row) in legend {
        let ly = h - 10.0 + LEGEND_ROW * row as f64;
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
            ly - 4.0,
            lx + 18.0,
            ly - 4.0,
            escape(s.color),
            lx + 22.0,
            escape(s.label)
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_draws_each_series_and_escapes_text() {
        let chart = Chart {
            title: "cpu <app>",
            y_format: |v| format!("{v:.1}"),
            x_format: |v| format!("{v:.0}"),
            size: (600, 240),
        };
        let svg = line_chart(
            &chart,
            &[
                Series {
                    label: "usage",
                    color: "#1f77b4",
                    points: vec![(0.0, 0.5), (60.0, 1.5), (120.0, 0.7)],
                    dashed: false,
                },
                Series {
                    label: "request",
                    color: "#d62728",
                    points: vec![(0.0, 2.0), (120.0, 2.0)],
                    dashed: true,
                },
            ],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<path").count(), 2);
        assert!(svg.contains("cpu &lt;app&gt;"));
        assert!(svg.contains("stroke-dasharray"));
    }

    #[test]
    fn a_long_legend_wraps_inside_the_chart_and_the_last_x_label_ends_at_its_tick() {
        let chart = Chart {
            title: "Nodes by type",
            y_format: |v| format!("{v:.0}"),
            x_format: |v| format!("{v:.0} UTC"),
            size: (600, 240),
        };
        let labels: Vec<String> = (0..11).map(|i| format!("Standard_D{i}as_v6")).collect();
        let series: Vec<Series<'_>> = labels
            .iter()
            .map(|l| Series {
                label: l,
                color: "#333",
                points: vec![(0.0, 1.0), (3600.0, 2.0)],
                dashed: false,
            })
            .collect();
        let svg = line_chart(&chart, &series);
        let height: f64 = svg
            .split("height=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|v| v.parse().ok())
            .expect("svg height");
        // Every label is drawn, within the width and the (grown) height.
        for l in &labels {
            let at = svg.find(&format!(">{l}<")).expect("label drawn");
            let tag_start = svg[..at].rfind("<text").expect("in a text element");
            let attrs = &svg[tag_start..at];
            let num = |name: &str| -> f64 {
                attrs
                    .split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .and_then(|v| v.parse().ok())
                    .expect("coordinate")
            };
            let right_edge = num("x") + 6.5 * l.len() as f64;
            assert!(right_edge <= 600.0, "{l} ends at {right_edge}");
            assert!(num("y") <= height, "{l} below the chart");
        }
        assert!(height > 240.0, "the chart grew for the legend: {height}");
        assert!(
            svg.contains(r#"text-anchor="end">3600 UTC</text>"#),
            "{svg}"
        );
    }

    #[test]
    fn tick_steps_are_round() {
        assert_eq!(nice_step(10.0, 4.0), 2.0);
        assert_eq!(nice_step(0.9, 4.0), 0.2);
        assert_eq!(nice_step(3000.0, 4.0), 1000.0);
    }
}
