//! The HTML form of `tailor recommend`: one self-contained page (inline CSS and SVG, no
//! scripts) with the totals, a row per container, and for each container its hourly usage
//! read in this run against the current and the recommended request.

use std::fmt::Write as _;

use super::recommend::{Entry, Report};
use crate::model::quantity;
use crate::report::svg::{Chart, Series, escape, line_chart};

const GIB: f64 = (1u64 << 30) as f64;

fn cores(q: &Option<String>) -> Option<f64> {
    q.as_deref()
        .and_then(|q| quantity::parse_milli(q).ok())
        .map(|m| m as f64 / 1000.0)
}

fn gib(q: &Option<String>) -> Option<f64> {
    q.as_deref()
        .and_then(|q| quantity::parse_value(q).ok())
        .map(|b| b as f64 / GIB)
}

fn day_hour(t: f64) -> String {
    jiff::Timestamp::from_second(t as i64).map_or_else(
        |_| format!("{t:.0}"),
        |ts| ts.strftime("%m-%d %H:%M").to_string(),
    )
}

fn request_line(value: Option<f64>, x0: f64, x1: f64) -> Vec<(f64, f64)> {
    value.map_or_else(Vec::new, |v| vec![(x0, v), (x1, v)])
}

fn charts(e: &Entry) -> String {
    let Some((first, last)) = e.hours.first().zip(e.hours.last()) else {
        return "<p class=\"muted\">No usage was read for this container in this run.</p>"
            .to_string();
    };
    let (x0, x1) = (first.start as f64, last.start as f64 + 3600.0);
    let cpu = line_chart(
        &Chart {
            title: "CPU (cores)",
            y_format: |v| format!("{v:.2}"),
            x_format: day_hour,
            size: (560, 220),
        },
        &[
            Series {
                label: "hourly max",
                color: "#9ecae1",
                points: e
                    .hours
                    .iter()
                    .map(|h| (h.start as f64, h.cpu_max))
                    .collect(),
                dashed: false,
            },
            Series {
                label: "hourly mean",
                color: "#1f77b4",
                points: e
                    .hours
                    .iter()
                    .map(|h| (h.start as f64, h.cpu_mean))
                    .collect(),
                dashed: false,
            },
            Series {
                label: "current request",
                color: "#7f7f7f",
                points: request_line(cores(&e.current.requests.cpu), x0, x1),
                dashed: true,
            },
            Series {
                label: "recommended",
                color: "#2ca02c",
                points: request_line(cores(&e.recommended.requests.cpu), x0, x1),
                dashed: true,
            },
        ],
    );
    let memory = line_chart(
        &Chart {
            title: "Memory (GiB)",
            y_format: |v| format!("{v:.2}"),
            x_format: day_hour,
            size: (560, 220),
        },
        &[
            Series {
                label: "hourly peak",
                color: "#ff7f0e",
                points: e
                    .hours
                    .iter()
                    .map(|h| (h.start as f64, h.memory_max / GIB))
                    .collect(),
                dashed: false,
            },
            Series {
                label: "current request",
                color: "#7f7f7f",
                points: request_line(gib(&e.current.requests.memory), x0, x1),
                dashed: true,
            },
            Series {
                label: "recommended",
                color: "#2ca02c",
                points: request_line(gib(&e.recommended.requests.memory), x0, x1),
                dashed: true,
            },
        ],
    );
    format!("<div class=\"charts\">{cpu}{memory}</div>")
}

/// Renders the report as one HTML page.
pub fn html(report: &Report) -> String {
    let s = &report.summary;
    let mut out = String::new();
    out.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Tailor right-sizing report</title><style>\
         body{font-family:sans-serif;margin:2em;color:#222}\
         table{border-collapse:collapse;margin:1em 0}\
         td,th{border:1px solid #ddd;padding:4px 8px;text-align:left}\
         td.n{text-align:right}.muted{color:#777}\
         .charts{display:flex;flex-wrap:wrap;gap:1em}\
         section{margin:2em 0;border-top:1px solid #ccc}\
         </style></head><body>\n<h1>Tailor right-sizing report</h1>\n",
    );
    let _ = writeln!(
        out,
        "<p>{} containers in {} workloads; <b>{:+.2} $/month</b> if applied. Usage from {} to {} \
         ({} Prometheus queries, {} samples).</p>",
        s.containers,
        s.workloads,
        s.monthly_cost_delta,
        escape(&s.read_from),
        escape(&s.now),
        s.prometheus_queries,
        s.samples_read
    );
    out.push_str(
        "<table><tr><th>Namespace</th><th>Workload</th><th>Container</th><th>CPU</th>\
         <th>Memory</th><th>Confidence</th><th>Actionable</th><th>$/month</th></tr>\n",
    );
    for (i, e) in report.recommendations.iter().enumerate() {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td><a href=\"#c{i}\">{}/{}</a></td><td>{}</td><td>{} &rarr; {}</td>\
             <td>{} &rarr; {}</td><td class=\"n\">{:.0}%</td><td>{}</td><td class=\"n\">{:+.2}</td></tr>",
            escape(&e.namespace),
            escape(&e.workload.kind),
            escape(&e.workload.name),
            escape(&e.container),
            escape(e.current.requests.cpu.as_deref().unwrap_or("-")),
            escape(e.recommended.requests.cpu.as_deref().unwrap_or("-")),
            escape(e.current.requests.memory.as_deref().unwrap_or("-")),
            escape(e.recommended.requests.memory.as_deref().unwrap_or("-")),
            e.confidence * 100.0,
            if e.actionable { "yes" } else { "no" },
            e.monthly_cost_delta
        );
    }
    out.push_str("</table>\n");
    if !s.containers_without_usage.is_empty() {
        out.push_str("<p>Containers without usage in Prometheus (no recommendation):</p><ul>");
        for c in &s.containers_without_usage {
            let _ = write!(
                out,
                "<li>container {} of {} {} in namespace {}</li>",
                escape(&c.container),
                escape(&c.workload.kind),
                escape(&c.workload.name),
                escape(&c.namespace)
            );
        }
        out.push_str("</ul>\n");
    }
    for (i, e) in report.recommendations.iter().enumerate() {
        let _ = write!(
            out,
            "<section id=\"c{i}\"><h2>container {} of {} {} in namespace {}</h2>",
            escape(&e.container),
            escape(&e.workload.kind),
            escape(&e.workload.name),
            escape(&e.namespace)
        );
        if !e.reasons.is_empty() {
            out.push_str("<ul>");
            for r in &e.reasons {
                let _ = write!(out, "<li>{}</li>", escape(r));
            }
            out.push_str("</ul>");
        }
        out.push_str(&charts(e));
        out.push_str("</section>\n");
    }
    out.push_str("</body></html>\n");
    out
}
