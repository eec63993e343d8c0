//! What every lock family holds: the client's engine and the family's resolved settings.

use std::fmt;
use std::sync::Arc;

use crate::engine::Engine;
use crate::key::{KeyCodec, LockKeys};
use crate::options::LockSettings;

/// The engine and settings a family of locks (of any primitive) shares; cheap to clone.
#[derive(Clone)]
pub(crate) struct Family {
    pub(crate) engine: Arc<Engine>,
    pub(crate) settings: Arc<LockSettings>,
}

impl Family {
    pub(crate) fn new(engine: Arc<Engine>, settings: LockSettings) -> Self {
        Family {
            engine,
            settings: Arc::new(settings),
        }
    }

    /// The server-side names of `key`'s lock in this family's namespace.
    pub(crate) fn keys<Q: KeyCodec + ?Sized>(&self, key: &Q) -> Arc<LockKeys> {
        let mut encoded = Vec::new();
        key.encode_key(&mut encoded);
        Arc::new(LockKeys::new(&self.settings.namespace, &encoded))
    }

    /// Writes the settings as `Debug` fields of `name`.
    pub(crate) fn debug<'a, 'b>(
        &self,
        f: &'a mut fmt::Formatter<'b>,
        name: &str,
    ) -> fmt::DebugStruct<'a, 'b> {
        let mut out = f.debug_struct(name);
        out.field("lease", &self.settings.lease)
            .field("namespace", &self.settings.namespace)
            .field(
                "replica_acknowledgement",
                &self.settings.replica_acknowledgement,
            );
        out
    }
}
