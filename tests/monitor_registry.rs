//! Listener registry semantics (no hooks installed): fan-out, unsubscribe-on-drop, unsubscribe
//! waits for an in-flight call, slot exhaustion.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use firehose::monitor::{self, MemoryListener, MAX_LISTENERS};

static SERIAL: Mutex<()> = Mutex::new(());

#[derive(Default)]
struct Count(AtomicUsize);
impl MemoryListener for Count {
    fn on_unmap(&self, _: usize, len: usize) {
        // Only count our marker lengths (other tests' events in this process are ignored).
        if len == 0x1234_5000 {
            self.0.fetch_add(1, SeqCst);
        }
    }
}

#[test]
fn fan_out_and_unsubscribe_on_drop() {
    let _g = SERIAL.lock().unwrap();
    let a = Arc::new(Count::default());
    let b = Arc::new(Count::default());
    let sa = monitor::subscribe(a.clone());
    let sb = monitor::subscribe(b.clone());
    monitor::notify_unmapped(0x1000, 0x1234_5000);
    assert_eq!((a.0.load(SeqCst), b.0.load(SeqCst)), (1, 1));
    drop(sa);
    monitor::notify_unmapped(0x1000, 0x1234_5000);
    assert_eq!((a.0.load(SeqCst), b.0.load(SeqCst)), (1, 2));
    drop(sb);
    monitor::notify_unmapped(0x1000, 0x1234_5000);
    assert_eq!(b.0.load(SeqCst), 2);
    assert_eq!(Arc::strong_count(&a), 1, "registry released its reference");
}

struct Slow {
    entered: AtomicBool,
    done: AtomicBool,
}
impl MemoryListener for Slow {
    fn on_unmap(&self, _: usize, len: usize) {
        if len == 0x7777_0000 {
            self.entered.store(true, SeqCst);
            std::thread::sleep(Duration::from_millis(300));
            self.done.store(true, SeqCst);
        }
    }
}

#[test]
fn unsubscribe_waits_for_in_flight_call() {
    let _g = SERIAL.lock().unwrap();
    let l = Arc::new(Slow {
        entered: AtomicBool::new(false),
        done: AtomicBool::new(false),
    });
    let sub = monitor::subscribe(l.clone());
    let t = std::thread::spawn(|| monitor::notify_unmapped(0x1000, 0x7777_0000));
    while !l.entered.load(SeqCst) {
        std::thread::yield_now();
    }
    drop(sub);
    assert!(
        l.done.load(SeqCst),
        "Subscription::drop returned while the listener was running"
    );
    t.join().unwrap();
}

#[test]
fn slots_run_out_then_free_up() {
    let _g = SERIAL.lock().unwrap();
    let c = Arc::new(Count::default());
    let base = monitor::listener_count();
    let subs: Vec<_> = (0..MAX_LISTENERS + 3)
        .map(|_| monitor::subscribe(c.clone()))
        .collect();
    let active = subs.iter().filter(|s| s.is_active()).count();
    assert_eq!(active, MAX_LISTENERS - base);
    monitor::notify_unmapped(0, 0x1234_5000);
    assert_eq!(
        c.0.load(SeqCst),
        active,
        "each active subscription called once"
    );
    drop(subs);
    assert_eq!(monitor::listener_count(), base);
    let again = monitor::subscribe(c.clone());
    assert!(again.is_active());
}

#[test]
fn concurrent_notify_and_churn() {
    let _g = SERIAL.lock().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let notifiers: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(SeqCst) {
                    monitor::notify_unmapped(0x1000, 0x1234_5000);
                }
            })
        })
        .collect();
    for _ in 0..500 {
        let c = Arc::new(Count::default());
        let s = monitor::subscribe(c.clone());
        drop(s);
        let seen = c.0.load(SeqCst);
        std::thread::yield_now();
        assert_eq!(c.0.load(SeqCst), seen, "called after unsubscribe returned");
        assert_eq!(Arc::strong_count(&c), 1);
    }
    stop.store(true, SeqCst);
    for t in notifiers {
        t.join().unwrap();
    }
}
