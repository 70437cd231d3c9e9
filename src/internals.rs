//! The library's internals that the LD_PRELOAD shim (`ld-preload/`), the benchmarks (`bench/`)
//! and the real-verbs test programs (`tests/verbs/`) use, in one place: exactly those items, grouped by the layer that owns them. Not a stable API
//! (hidden from the docs); the C API (`ffi`, `include/firehose.h`) is. A crate outside this one
//! that needs another internal adds it here, so what leaks out of the layers stays visible in
//! one file.

/// One assembly of a cache (`crate::assembly`).
pub mod assembly {
    pub use crate::assembly::{assemble, helper_config, AssembleError, Parts};
}

/// The pin-down cache (`crate::cache`).
pub mod cache {
    pub use crate::cache::{Cache, CacheError, Limits, Registration, Stats};
}

/// The `FH_*` settings (`crate::config`).
pub mod config {
    pub use crate::config::{helper_clock_from_env, parse_size, Config};
}

/// The helper thread (`crate::helper`).
pub mod helper {
    pub use crate::helper::events::Key;
    pub use crate::helper::planner::PlannerConfig;
    /// The helper's simulator (the benchmarks' model).
    #[cfg(any(test, feature = "test-support"))]
    pub mod sim {
        pub use crate::helper::sim::{simulate, Costs, Mode, Outcome, Step};
    }
    /// The helper's time source.
    pub mod clock {
        pub use crate::helper::clock::{selected, ClockChoice};
    }
    /// The cost model's calibration.
    pub mod cost {
        pub use crate::helper::cost::{calibrate, Fit};
    }
    /// The flag a wrapped backend raises when it pinned (a miss).
    pub mod pin_flag {
        pub use crate::helper::pin_flag::{clear, take};
    }
    /// Where the helper thread runs.
    pub mod placement {
        pub use crate::helper::placement::{allowed_cpus, bind_current_thread, decide};
    }
    pub use crate::helper::{
        install_unmap_windows, wrap_backend, Helper, HelperConfig, HelperState, HelperStats,
        Placement,
    };
}

/// Memory events (`crate::monitor`).
pub mod monitor {
    pub use crate::monitor::ranges::{madvise_drops_pages, mmap_replaces, mremap_fresh};
    pub use crate::monitor::{
        install, notify_unmapped, quiesce, reports_fresh, start_uffd_reader, status, subscribe,
        uffd_unwatch, uffd_watch, watch_costs, Hooked, MemoryListener, MonitorOptions,
        MonitorStatus, Subscription, WatchCosts,
    };
}

/// Peers and active messages (`crate::net`).
pub mod net {
    pub use crate::net::credits::RESERVED;
    /// The simulated link.
    #[cfg(any(test, feature = "test-support"))]
    pub use crate::net::sim::{Delivery, SimConfig, SimNet};
    pub use crate::net::stats::StatsSnapshot;
    pub use crate::net::wire::Kind as WireKind;
    pub use crate::net::{
        Am, Bootstrap, Link, LinkError, LinkEvent, NetError, NetSettings, Peers, PeersConfig, Rank,
        RdmaKind, RdmaOp, Ticket,
    };
    /// How the ranks of a job find each other.
    pub mod bootstrap {
        pub use crate::net::bootstrap::{from_env, Bootstrap, BootstrapError};
        /// The ranks of one process, one thread each (the real-verbs link tests).
        pub mod local {
            pub use crate::net::bootstrap::local::{LocalBootstrap, LocalGroup};
        }
    }
    /// The verbs objects a raw RDMA benchmark or test drives itself, and the verbs link.
    pub mod verbs {
        pub use crate::net::verbs::{
            gid_index_from_env, qp_state, wc_opcode, Completion, Cq, LinkSettings, Path, Qp,
            QpCaps, SendFlags, Sge, VerbsLink, VerbsLinkConfig,
        };
    }
    /// The active-message wire format (the MPI interop test writes it by hand).
    pub mod wire {
        pub use crate::net::wire::{Header, Kind, HEADER_LEN};
    }
}

/// Pinning backends (`crate::pin`).
pub mod pin {
    pub use crate::pin::counting::CountingPinner;
    /// What a forked child may touch of the pinned memory.
    pub mod fork_mode {
        pub use crate::pin::fork_mode::{resolve, ForkMode};
    }
    pub use crate::pin::mlock::MlockPinner;
    pub use crate::pin::null::NullPinner;
    pub use crate::pin::{Access, PinError, Pinned, Pinner};
    /// libibverbs objects.
    pub mod verbs {
        pub use crate::pin::verbs::{
            open_device, Context, DeviceList, Mr, Pd, VerbsError, VerbsPinner,
        };
    }
}

/// Puts and gets (`crate::rma`).
pub mod rma {
    /// The simulated target's pins.
    #[cfg(any(test, feature = "test-support"))]
    pub use crate::rma::sim_pins::SimPins;
    pub use crate::rma::Rma;
}

/// A first-use initialiser that never makes a thread wait (`crate::rt::race_once`).
pub use crate::rt::race_once::RaceOnce;
