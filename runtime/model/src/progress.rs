//! The loading progress bar (indicatif, on stderr).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// When to draw a progress bar while loading.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShowProgress {
    /// Only when stderr is a terminal.
    #[default]
    Auto,
    /// Always (to stderr).
    Always,
    /// Never.
    Never,
}

/// A progress bar over the tensors being loaded, or nothing.
pub(crate) struct Progress(Option<ProgressBar>);

impl Progress {
    /// A bar with `total` steps labelled `what`, drawn if `show` says so.
    pub(crate) fn new(show: ShowProgress, total: usize, what: &str) -> Self {
        let draw = match show {
            ShowProgress::Always => true,
            ShowProgress::Never => false,
            ShowProgress::Auto => std::io::stderr().is_terminal(),
        };
        if !draw {
            return Progress(None);
        }
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tensors {elapsed}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(what.to_string());
        Progress(Some(bar))
    }

    /// One more step done.
    pub(crate) fn inc(&self) {
        if let Some(bar) = &self.0 {
            bar.inc(1);
        }
    }

    /// Done: leaves the bar's last state on screen.
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish();
        }
    }
}
