//! The backend every mode runs on, wrapped to record pinned bytes over time: every pin and unpin
//! that succeeds appends (time, bytes pinned now). Exact, the same for every mode, and what the
//! plot draws. A mutex per pin or unpin is nothing next to the call itself (microseconds).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use firehose::internals::pin::{Access, PinError, Pinned, Pinner};

pub struct Recorder {
    inner: Arc<dyn Pinner>,
    state: Mutex<State>,
}

struct State {
    t0: Instant,
    bytes: u64,
    series: Vec<(f64, u64)>,
    pins: u64,
}

/// What a run pinned.
#[derive(Debug, Clone, Default)]
pub struct PinnedLog {
    /// (ms since start, bytes pinned) at every change.
    pub series: Vec<(f64, u64)>,
    pub avg: f64,
    pub peak: u64,
    pub pins: u64,
}

impl Recorder {
    pub fn new(inner: Arc<dyn Pinner>) -> Arc<Recorder> {
        Arc::new(Recorder {
            inner,
            state: Mutex::new(State {
                t0: Instant::now(),
                bytes: 0,
                series: Vec::new(),
                pins: 0,
            }),
        })
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start the series now (what is pinned now is its first point).
    pub fn start(&self) {
        let mut s = self.st();
        s.t0 = Instant::now();
        s.series = vec![(0.0, s.bytes)];
        s.pins = 0;
    }

    /// The series up to now, its time average and peak.
    pub fn finish(&self) -> PinnedLog {
        let s = self.st();
        let end = s.t0.elapsed().as_secs_f64() * 1e3;
        let mut series = s.series.clone();
        series.push((end, s.bytes));
        let mut integral = 0.0;
        for w in series.windows(2) {
            integral += w[0].1 as f64 * (w[1].0 - w[0].0);
        }
        PinnedLog {
            avg: if end > 0.0 { integral / end } else { 0.0 },
            peak: series.iter().map(|p| p.1).max().unwrap_or(0),
            pins: s.pins,
            series,
        }
    }

    fn change(&self, delta: i64, pin: bool) {
        let mut s = self.st();
        s.bytes = s.bytes.wrapping_add_signed(delta);
        s.pins += pin as u64;
        let t = s.t0.elapsed().as_secs_f64() * 1e3;
        let b = s.bytes;
        s.series.push((t, b));
    }
}

impl Pinner for Recorder {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        let r = self.inner.pin(addr, len, access);
        if r.is_ok() {
            self.change(len as i64, true);
        }
        r
    }
    fn unpin(&self, pinned: Pinned, addr: usize, len: usize) {
        self.inner.unpin(pinned, addr, len);
        self.change(-(len as i64), false);
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
}
