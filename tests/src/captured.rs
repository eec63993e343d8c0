//! A `Write` sink for a tracing subscriber, to read back what a test logged.

use std::sync::{Arc, Mutex};

/// Collects everything written to it (and to its clones); give it to a subscriber with
/// `.with_writer(move || captured.clone())`.
#[derive(Clone, Debug, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
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
