//! Terminal rendering helpers.

/// A bar of `width` cells for a fraction 0..=1.
pub fn bar(frac: f64, width: usize) -> String {
    let f = if frac.is_finite() {
        frac.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let cells = f * width as f64;
    let full = cells.floor() as usize;
    let partial = ((cells - full as f64) * 8.0).round() as usize;
    let blocks = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉', '█'];
    let mut s = "█".repeat(full);
    if full < width {
        s.push(blocks[partial.min(8)]);
        s.push_str(&" ".repeat(width - full - 1));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_have_fixed_width() {
        for f in [0.0, 0.013, 0.5, 0.999, 1.0, 2.0, f64::NAN] {
            assert_eq!(bar(f, 20).chars().count(), 20, "{f}");
        }
        assert_eq!(bar(0.5, 4), "██  ");
    }
}
