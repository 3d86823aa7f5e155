//! Progress bars on standard error (nothing is drawn where it is not a terminal), and
//! lines on standard output that do not tear them.

use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

/// The run's bars: the suite's steps, and the measurement under way.
pub struct Progress {
    multi: MultiProgress,
    overall: ProgressBar,
}

impl Progress {
    /// Bars for a run of `steps` measurements.
    pub fn new(steps: u64) -> Progress {
        let multi = MultiProgress::new();
        let overall = multi.add(ProgressBar::new(steps));
        overall.set_style(
            ProgressStyle::with_template(
                "{prefix:>8} [{bar:32.cyan/blue}] {pos}/{len} measurements, {elapsed} (about {eta} left)",
            )
            .expect("template")
            .progress_chars("=> "),
        );
        overall.set_prefix("suite");
        Progress { multi, overall }
    }

    /// A spinner for one measurement, `label`; dropping it (or [`Step::done`]) counts the
    /// step as done.
    pub fn step(&self, label: impl Into<String>) -> Step {
        let bar = self
            .multi
            .insert_after(&self.overall, ProgressBar::new_spinner());
        bar.set_style(
            ProgressStyle::with_template("{prefix:>8} {spinner} {msg} ({elapsed})")
                .expect("template"),
        );
        bar.set_prefix("now");
        bar.set_message(label.into());
        bar.enable_steady_tick(Duration::from_millis(120));
        Step {
            bar,
            overall: self.overall.clone(),
        }
    }

    /// Removes the bars.
    pub fn finish(&self) {
        self.overall.finish_and_clear();
        let _ = self.multi.clear();
    }
}

/// The bar of one measurement.
pub struct Step {
    bar: ProgressBar,
    overall: ProgressBar,
}

impl Step {
    /// Ends the measurement.
    pub fn done(self) {}
}

impl Drop for Step {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
        self.overall.inc(1);
    }
}
