//! `Peers`: a job's ranks wired together. Bootstrap (given, or from the environment) -> one link
//! (verbs RC on a device; none for a job of one) -> the active-message endpoint on it, plus the
//! barrier over it. This is what `fh_init` builds and what Firehose will send its moves through.
//! For simulation and tests, `Peers::from_link` puts the endpoint on an existing link instead
//! (no bootstrap, no device).

use super::am::Am;
use super::barrier::AmBarrier;
use super::bootstrap::{self, Bootstrap};
use super::settings::NetSettings;
use super::solo::SoloLink;
use super::verbs::{gid_index_from_env, LinkSettings, VerbsLink, VerbsLinkConfig};
use super::{Link, LinkError, Rank};
use crate::net::NetError;
use crate::pin::verbs::{open_device, Pd};
use std::sync::Arc;

/// Device chosen by name: `FH_DEVICE`, the same variable the cache's verbs backend reads.
pub(crate) const DEVICE_ENV: &str = "FH_DEVICE";
/// HCA port (default 1).
pub(crate) const PORT_ENV: &str = "FH_IB_PORT";

/// How `Peers::new` builds the job.
pub struct PeersConfig {
    /// `None`: `bootstrap::from_env()` (PMIx under `mpirun`, else a single process).
    pub bootstrap: Option<Box<dyn Bootstrap>>,
    /// `None`: `FH_DEVICE`, else the first device.
    pub device: Option<String>,
    /// HCA port.
    pub port: u8,
    pub settings: NetSettings,
    /// Leave the progress thread stopped until [`Peers::start_progress`]: for an owner that
    /// registers handlers after `Peers::new` and whose peers may send to them at once (the
    /// Firehose engine). Default false: the thread starts at the end of `Peers::new`, after the
    /// barrier's handlers.
    pub defer_progress: bool,
}

impl PeersConfig {
    /// Everything from the environment (`FH_BOOTSTRAP`, `FH_DEVICE`, `FH_IB_PORT`, `FH_AM_*`,
    /// `FH_PROGRESS_THREAD`); a bad value is `NetError::BadConfig` with the variable on stderr.
    pub fn from_env() -> Result<PeersConfig, NetError> {
        let port = match std::env::var(PORT_ENV) {
            Err(_) => 1,
            Ok(v) => match v.trim().parse::<u8>() {
                Ok(p) if p >= 1 => p,
                _ => {
                    crate::fh_error!("firehose: {PORT_ENV}={v:?}: expected a port number 1..=255");
                    return Err(NetError::BadConfig);
                }
            },
        };
        Ok(PeersConfig {
            bootstrap: None,
            device: std::env::var(DEVICE_ENV).ok().filter(|s| !s.is_empty()),
            port,
            settings: NetSettings::from_env()?,
            defer_progress: false,
        })
    }
}

/// The ranks of a job, connected. Field order is drop order: the endpoint (and its progress
/// thread) goes before the link it polls, the bootstrap (PMIx finalize) last.
pub struct Peers {
    am: Am,
    barrier: AmBarrier,
    link: Arc<dyn Link>,
    /// The same link as a verbs link (`None` in a job of one and on a given link), for what only
    /// verbs offers: memory windows bound through one peer's queue pair.
    verbs: Option<Arc<VerbsLink>>,
    /// The protection domain the link is on (`None` in a job of one): memory that peers reach
    /// by RDMA must be registered on it.
    pd: Option<Arc<Pd>>,
    settings: NetSettings,
    /// In a mutex only to make `Peers` `Sync` (a bootstrap is `Send`); used at setup only.
    /// `None` for a `Peers` built on a given link (`from_link`: simulation and tests).
    _bootstrap: Option<std::sync::Mutex<Box<dyn Bootstrap>>>,
}

fn bootstrap_status(e: impl std::fmt::Display) -> NetError {
    crate::fh_error!("firehose: {e}");
    NetError::Bootstrap
}

impl Peers {
    /// Builds the job's peers. Collective: every rank of the bootstrap calls it. A rank that
    /// cannot open its device tells the others, so all fail together instead of some hanging.
    pub fn new(mut cfg: PeersConfig) -> Result<Peers, NetError> {
        let mut boot = match cfg.bootstrap.take() {
            Some(b) => b,
            None => {
                // A bad FH_BOOTSTRAP is a configuration error, not a failed launcher.
                if let Err(e) = bootstrap::select::choose(&|k| std::env::var(k).ok()) {
                    crate::fh_error!("firehose: {e}");
                    return Err(NetError::BadConfig);
                }
                bootstrap::from_env().map_err(bootstrap_status)?
            }
        };
        let (link, pd, verbs): (Arc<dyn Link>, _, _) = if boot.size() == 1 {
            let solo = SoloLink {
                recv_slots: cfg.settings.recv_depth,
                max_msg: cfg.settings.max_size,
            };
            (Arc::new(solo), None, None)
        } else {
            let (link, pd) = Self::verbs_link(&cfg, boot.as_mut())?;
            let link = Arc::new(link);
            (link.clone(), Some(pd), Some(link))
        };
        // Handlers first, then the progress thread: a faster peer's first barrier message can
        // arrive at once, and a thread delivering it before the barrier's handler exists would
        // lose it (seen in CI: a 4-rank job with progress threads timed out in its first
        // barrier, twice).
        // FH_PROGRESS_THREAD=auto: a thread answers peers in any job with peers, so a put to a
        // rank sitting in MPI_Barrier (or computing) completes without that rank calling in.
        let settings = cfg.settings.for_job(boot.size());
        let am = Am::new_paused(link.clone(), settings)?;
        let barrier = AmBarrier::register(&am);
        if !cfg.defer_progress {
            am.start_progress_thread()?;
        }
        Ok(Peers {
            am,
            barrier,
            link,
            verbs,
            pd,
            settings,
            _bootstrap: Some(std::sync::Mutex::new(boot)),
        })
    }

    /// For simulation and tests: the peers of an existing link (e.g. one rank of a
    /// `net::sim::SimNet`), with no bootstrap and no device (`pd()` is `None`). Not collective:
    /// every rank of the link builds its own. The progress thread is left stopped (as with
    /// `defer_progress`): call [`Peers::start_progress`] once the owner's handlers are in.
    pub fn from_link(link: Arc<dyn Link>, settings: NetSettings) -> Result<Peers, NetError> {
        let am = Am::new_paused(link.clone(), settings)?;
        let barrier = AmBarrier::register(&am);
        Ok(Peers {
            am,
            barrier,
            link,
            verbs: None,
            pd: None,
            settings,
            _bootstrap: None,
        })
    }

    /// Starts the progress thread of a `Peers` built with `defer_progress` (once its owner's
    /// handlers are registered). Idempotent; nothing without `FH_PROGRESS_THREAD`.
    pub fn start_progress(&self) -> Result<(), NetError> {
        self.am.start_progress_thread()
    }

    /// Opens the device on every rank, agrees that all did, then connects.
    fn verbs_link(
        cfg: &PeersConfig,
        boot: &mut dyn Bootstrap,
    ) -> Result<(VerbsLink, Arc<Pd>), NetError> {
        let opened = open_device(cfg.device.as_deref())
            .and_then(|ctx| ctx.alloc_pd())
            .map_err(|e| {
                crate::fh_error!(
                    "firehose: rank {}: cannot open RDMA device {}: {e}",
                    boot.rank(),
                    cfg.device.as_deref().unwrap_or("(first)")
                );
                NetError::NoDevice
            });
        let gid_index = gid_index_from_env().map_err(|e| {
            crate::fh_error!("firehose: {e}");
            NetError::BadConfig
        });
        let mine = [u8::from(opened.is_ok() && gid_index.is_ok())];
        let all = boot.allgather(&mine).map_err(bootstrap_status)?;
        let pd: Arc<Pd> = opened?;
        let gid_index = gid_index?;
        if let Some(bad) = all.iter().position(|&ok| ok != 1) {
            crate::fh_error!("firehose: rank {bad} could not open its RDMA device; no peers");
            return Err(NetError::NoDevice);
        }
        let vcfg = VerbsLinkConfig {
            port: cfg.port,
            gid_index,
            settings: LinkSettings {
                recv_depth: cfg.settings.recv_depth,
                max_size: cfg.settings.max_size,
            },
            ..VerbsLinkConfig::default()
        };
        let link = VerbsLink::new(&pd, boot, &vcfg).map_err(|e| {
            crate::fh_error!("firehose: rank {}: connecting peers: {e}", boot.rank());
            match e {
                LinkError::PeerLost(_) => NetError::PeerLost,
                _ => NetError::Bootstrap,
            }
        })?;
        Ok((link, pd))
    }

    /// The protection domain of the link (`None` in a job of one).
    /// The verbs link under these peers, if they run on one (see the field).
    pub fn verbs(&self) -> Option<&Arc<VerbsLink>> {
        self.verbs.as_ref()
    }

    pub fn pd(&self) -> Option<&Arc<Pd>> {
        self.pd.as_ref()
    }

    pub fn rank(&self) -> Rank {
        self.am.rank()
    }

    pub fn size(&self) -> u32 {
        self.am.size()
    }

    /// The active-message endpoint (register handlers, request, reply).
    pub fn am(&self) -> &Am {
        &self.am
    }

    /// The link under the endpoint (tests use it to send raw bytes).
    pub fn link(&self) -> &Arc<dyn Link> {
        &self.link
    }

    pub fn settings(&self) -> &NetSettings {
        &self.settings
    }

    /// Every rank enters; returns when all have. Progresses while waiting; a dead peer is
    /// `NetError::PeerLost`, a peer that never comes `NetError::Timeout` (`FH_AM_TIMEOUT_MS`).
    pub fn barrier(&self) -> Result<(), NetError> {
        self.barrier
            .enter(&self.am, self.settings.timeout, self.settings.probe)
    }

    /// Runs handlers for what arrived; returns the number of events.
    pub fn progress(&self) -> Result<usize, NetError> {
        self.am.progress()
    }

    /// Says goodbye to every peer; later calls return `NetError::Finalized`. Idempotent.
    pub fn finalize(&self) -> Result<(), NetError> {
        self.am.finalize()
    }
}
