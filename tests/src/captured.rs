//! A `Write` sink for a tracing subscriber, to read back what a test logged.

use std::sync::{Arc, Mutex};

/// Collects everything written to it (and to its clones); give it to a subscriber with
/// `.with_writer(move || captured.clone())`.
#[derive(Clone, Debug, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// A subscriber that writes `WARN` and above, as plain text, here: install it globally
    /// (`try_init`), for the current thread (`tracing::subscriber::set_default`), or for one
    /// future (`WithSubscriber::with_subscriber`).
    pub fn warn_subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        self.subscriber(tracing::Level::WARN)
    }

    /// A subscriber that writes `level` and above, as plain text, here.
    pub fn subscriber(
        &self,
        level: tracing::Level,
    ) -> impl tracing::Subscriber + Send + Sync + 'static {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish()
    }

    /// A sink with [`Captured::warn_subscriber`] installed as the global subscriber: for a
    /// binary of one test, whose events come from tasks of their own.
    ///
    /// # Panics
    /// When a global subscriber is installed already.
    pub fn global_warn() -> Captured {
        use tracing_subscriber::util::SubscriberInitExt as _;
        let captured = Captured::default();
        captured
            .warn_subscriber()
            .try_init()
            .expect("the only subscriber of this binary");
        captured
    }

    /// Everything written so far, as (lossy) UTF-8.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().map(|out| out.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut out) = self.0.lock() {
            out.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
