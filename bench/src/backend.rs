//! The pinning backends the bench runs on, and a counting wrapper that proves a "hit" row never
//! reached the backend and a "miss" row always did.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use firehose::internals::pin::{Access, PinError, Pinned, Pinner};

/// Pins nothing. Used for metadata measurements (so only cache bytes are counted).
pub use firehose::internals::pin::NullPinner;

/// Forwards to a real backend and counts calls (relaxed atomics: only on the miss path).
pub struct CountingBackend {
    inner: Arc<dyn Pinner>,
    pins: AtomicU64,
    unpins: AtomicU64,
    failures: AtomicU64,
}

impl CountingBackend {
    pub fn new(inner: Arc<dyn Pinner>) -> Arc<CountingBackend> {
        Arc::new(CountingBackend {
            inner,
            pins: AtomicU64::new(0),
            unpins: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        })
    }
    pub fn pins(&self) -> u64 {
        self.pins.load(Relaxed)
    }
    pub fn unpins(&self) -> u64 {
        self.unpins.load(Relaxed)
    }
    pub fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
    }
}

impl Pinner for CountingBackend {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        let r = self.inner.pin(addr, len, access);
        match r {
            Ok(_) => self.pins.fetch_add(1, Relaxed),
            Err(_) => self.failures.fetch_add(1, Relaxed),
        };
        r
    }
    fn unpin(&self, pinned: Pinned, addr: usize, len: usize) {
        self.unpins.fetch_add(1, Relaxed);
        self.inner.unpin(pinned, addr, len)
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

/// Open the backend named on the command line.
pub fn open(name: &str) -> Result<Arc<dyn Pinner>, String> {
    match name {
        "null" => Ok(Arc::new(NullPinner)),
        "mlock" => Ok(Arc::new(firehose::internals::pin::MlockPinner::new())),
        "verbs" => {
            // The first device and a PD of our own, as a verbs application would.
            use firehose::internals::pin::verbs::{open_device, VerbsPinner};
            let pd = open_device(None)
                .and_then(|ctx| ctx.alloc_pd())
                .map_err(|e| format!("verbs backend: {e:?}"))?;
            Ok(Arc::new(VerbsPinner::new(pd)))
        }
        other => Err(format!("unknown backend {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_backend_counts_pins_unpins() {
        let b = CountingBackend::new(Arc::new(NullPinner));
        let p = b.pin(4096, 4096, Access::LOCAL_WRITE).unwrap();
        assert_eq!(p.token, 4096);
        b.unpin(p, 4096, 4096);
        b.unpin(p, 4096, 4096);
        assert_eq!((b.pins(), b.unpins(), b.failures()), (1, 2, 0));
    }
}
