//! Addressing for an RC connection: which port/GID we send from (`Path`) and what the other side
//! must know about us (`Endpoint`). Exchanged out of band (or just copied, for loopback).

use crate::pin::verbs::{Context, Gid, VerbsError, VerbsResult};

/// Environment variable naming the GID table index to use on RoCE ports.
pub(crate) const GID_INDEX_ENV: &str = "FH_GID_INDEX";

/// Local addressing choices for one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    pub port: u8,
    /// `ibv_mtu` value used as the path MTU (the port's active MTU).
    pub mtu: u32,
    /// Source GID index; `Some` means a GRH is used (always on RoCE).
    pub gid_index: Option<u8>,
    /// Our GID at `gid_index` (zero when no GRH is used).
    pub gid: Gid,
    /// Our LID (0 on RoCE).
    pub lid: u16,
}

impl Path {
    /// Query `port` and choose a GID. On RoCE, `gid_index` wins if given; otherwise index 1 when it
    /// is populated (on rxe that is the IPv4-mapped GID, index 0 the link-local fe80:: one), else 0.
    /// On InfiniBand the LID is used and a GRH only if `gid_index` is given.
    pub fn discover(ctx: &Context, port: u8, gid_index: Option<u8>) -> VerbsResult<Self> {
        let info = ctx.query_port(port)?;
        if !info.is_active() {
            return Err(VerbsError::NoDevice(format!(
                "{} port {port} is not active (state {})",
                ctx.name(),
                info.state
            )));
        }
        let index = match (gid_index, info.is_ethernet()) {
            (Some(i), _) => Some(i),
            (None, false) => None,
            (None, true) => {
                let one_populated = info.gid_tbl_len > 1
                    && ctx
                        .query_gid(port, 1)
                        .map(|g| !g.is_zero())
                        .unwrap_or(false);
                Some(if one_populated { 1 } else { 0 })
            }
        };
        let gid = match index {
            Some(i) => {
                let gid = ctx.query_gid(port, i)?;
                if gid.is_zero() {
                    return Err(VerbsError::Call {
                        op: "ibv_query_gid (GID slot is empty)",
                        errno: libc::EINVAL,
                    });
                }
                gid
            }
            None => Gid::default(),
        };
        Ok(Path {
            port,
            mtu: info.active_mtu,
            gid_index: index,
            gid,
            lid: info.lid,
        })
    }
}

/// Read `FH_GID_INDEX`; unset means "choose", a bad value is an error rather than a silent default.
pub fn gid_index_from_env() -> VerbsResult<Option<u8>> {
    match std::env::var(GID_INDEX_ENV) {
        Err(_) => Ok(None),
        Ok(s) => s
            .trim()
            .parse::<u8>()
            .map(Some)
            .map_err(|_| VerbsError::Call {
                op: "parse FH_GID_INDEX",
                errno: libc::EINVAL,
            }),
    }
}

/// What the remote side of an RC connection needs to know about a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub qpn: u32,
    /// First packet sequence number this QP sends with (24 bits).
    pub psn: u32,
    pub lid: u16,
    pub gid: Gid,
}
