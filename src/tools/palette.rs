//! Okabe and Ito's colour-blind-safe palette, the one colour set of every plot the tools draw
//! (`bench --plot`, `report --html`), so a colour means the same thing in both.

use plotters::style::RGBColor;

pub const BLUE: RGBColor = RGBColor(0, 114, 178);
pub const VERMILLION: RGBColor = RGBColor(213, 94, 0);
pub const BLUISH_GREEN: RGBColor = RGBColor(0, 158, 115);
pub const SKY_BLUE: RGBColor = RGBColor(86, 180, 233);
pub const ORANGE: RGBColor = RGBColor(230, 159, 0);
pub const REDDISH_PURPLE: RGBColor = RGBColor(204, 121, 167);
/// Thresholds (SLO lines) are black, apart from every series.
pub const BLACK: RGBColor = RGBColor(0, 0, 0);
