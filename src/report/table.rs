//! A plain-text table with aligned columns, in the style of `kubectl get`.

use std::fmt::Write as _;

use unicode_width::UnicodeWidthStr;

/// Columns a cell takes on a terminal: wide characters (CJK, most emoji) take two,
/// combining marks none.
fn width(cell: &str) -> usize {
    cell.width()
}

/// Rows of cells under a header; numeric-looking columns are right-aligned.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    right_aligned: Vec<bool>,
}

impl Table {
    /// A table with these column titles.
    pub fn new<I, S>(header: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let header: Vec<String> = header.into_iter().map(Into::into).collect();
        let right_aligned = vec![false; header.len()];
        Table {
            header,
            rows: Vec::new(),
            right_aligned,
        }
    }

    /// Right-aligns the given columns (numbers, prices).
    pub fn align_right(mut self, columns: &[usize]) -> Self {
        for &c in columns {
            if let Some(slot) = self.right_aligned.get_mut(c) {
                *slot = true;
            }
        }
        self
    }

    /// Appends a row; missing cells are blank, extra cells are dropped.
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut row: Vec<String> = cells.into_iter().map(Into::into).collect();
        row.resize(self.header.len(), String::new());
        self.rows.push(row);
    }

    /// The number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Renders with three spaces between columns and no trailing spaces.
    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                std::iter::once(&self.header[c])
                    .chain(self.rows.iter().map(|r| &r[c]))
                    .map(|s| width(s))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(self.rows.iter()) {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c > 0 {
                    line.push_str("   ");
                }
                let pad = widths[c].saturating_sub(width(cell));
                if self.right_aligned[c] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_numbers_align_right() {
        let mut t = Table::new(["NAME", "PRICE"]).align_right(&[1]);
        t.row(["Standard_D2s_v5", "0.096"]);
        t.row(["x", "12.5"]);
        assert_eq!(
            t.render(),
            "NAME              PRICE\nStandard_D2s_v5   0.096\nx                  12.5\n"
        );
    }

    #[test]
    fn wide_and_combining_characters_keep_the_columns_aligned() {
        let mut t = Table::new(["NAME", "PODS"]).align_right(&[1]);
        t.row(["ウェブ", "3"]); // three wide characters: six columns
        t.row(["cafe\u{301}", "12"]); // "café" with a combining accent: four columns
        t.row(["api", "1"]);
        let rendered = t.render();
        // Every row's right-aligned number ends in the same terminal column: the widest
        // name (six columns), the gap and the header.
        let ends: Vec<usize> = rendered.lines().map(width).collect();
        assert_eq!(ends, vec![6 + 3 + 4; 4], "{rendered}");
    }
}
