//! The programs the helper bench runs: communication steps (a call site, a buffer, the computation
//! that follows) in the loop structure of Figure 1 of Li et al., "Scalable Memory Registration for
//! High Performance Networks Using Helper Threads" (CF 2011) and of NAS CG and MG. Sizes and times
//! are scaled so one run takes well under a second.

/// One communication call: `site` registers `buf` (index into the program's buffers), the
/// transfer reads it, it is released, then `compute_us` of computation follow.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub site: usize,
    pub buf: usize,
    pub compute_us: u64,
}

pub struct Program {
    pub name: &'static str,
    /// What the loop structure is, for the header.
    pub about: &'static str,
    /// Buffer sizes in bytes.
    pub bufs: Vec<usize>,
    pub steps: Vec<Step>,
}

impl Program {
    /// Every step's computation times `factor` (`--compute-scale`), rounded to whole us.
    pub fn stretch_compute(&mut self, factor: f64) {
        for s in &mut self.steps {
            s.compute_us = (s.compute_us as f64 * factor).round() as u64;
        }
    }
}

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// The buffer `--compute-scale auto` times: the size of CG's exchanges.
pub const SCALE_PROBE_BYTES: usize = 512 * KIB;

/// How long a copy of `SCALE_PROBE_BYTES` takes (median of back-to-back copies, `copy_ns`) on
/// the machines the computation times below were set for: this project's development hosts,
/// natively (13-14 us measured in November 2026). The times keep communication a small share of
/// each step, as in NAS; they are wall-clock spins, which an emulated CPU does not slow down
/// while it slows every copy.
pub const REFERENCE_COPY_NS: u64 = 15_000;

/// `--compute-scale auto`: the factor that gives computation back its share of each step on a
/// machine whose copies are slower than the reference's (an emulated guest: 10-30x), from the
/// probe's median copy time here. Within 2x of the reference the times stay as written (1.0), so
/// a native run is not rescaled by noise.
pub fn auto_scale(copy_ns: u64) -> f64 {
    let r = copy_ns as f64 / REFERENCE_COPY_NS as f64;
    if r >= 2.0 {
        r
    } else {
        1.0
    }
}

/// Li et al.'s Figure 1: three 4 MiB buffers sent in turn, each send followed by computation
/// (the paper: 1 s, 10 iterations; here 20 ms, 10 iterations; `quick`: 1 MiB, 10 ms).
pub fn figure1(quick: bool) -> Program {
    let (size, compute) = if quick {
        (MIB, 10_000)
    } else {
        (4 * MIB, 20_000)
    };
    let steps = (0..10)
        .flat_map(|_| {
            (0..3).map(move |b| Step {
                site: 0x100 + b,
                buf: b,
                compute_us: compute,
            })
        })
        .collect();
    Program {
        name: "fig1",
        about: "Li et al. (CF 2011) Figure 1: 10 x (send buffer_1, compute; send buffer_2, compute; send buffer_3, compute)",
        bufs: vec![size; 3],
        steps,
    }
}

/// The communication skeleton of NAS CG: per outer iteration, 25 inner iterations of the
/// conjugate gradient (exchange `w` with the transpose partner, a matvec, exchange `q`, two small
/// reductions), then the residual (`r`, and `w` again from another call site) and the outer
/// computation. Several call sites, a buffer shared between two of them, nested loops.
pub fn cg(quick: bool) -> Program {
    let outer = if quick { 8 } else { 15 };
    let (w, q, r, red) = (0, 1, 2, 3);
    let mut steps = Vec::new();
    for _ in 0..outer {
        for _ in 0..25 {
            steps.push(Step {
                site: 0x201,
                buf: w,
                compute_us: 400,
            });
            steps.push(Step {
                site: 0x202,
                buf: q,
                compute_us: 300,
            });
            steps.push(Step {
                site: 0x203,
                buf: red,
                compute_us: 40,
            });
            steps.push(Step {
                site: 0x204,
                buf: red,
                compute_us: 40,
            });
        }
        steps.push(Step {
            site: 0x205,
            buf: r,
            compute_us: 500,
        });
        steps.push(Step {
            site: 0x206,
            buf: w,
            compute_us: 12_000,
        });
    }
    Program {
        name: "cg",
        about: "NAS CG skeleton: outer x (25 x (w, matvec, q, 2 small reductions); r, w; outer compute)",
        bufs: vec![512 * KIB, 512 * KIB, 512 * KIB, 8 * KIB],
        steps,
    }
}

/// The communication skeleton of NAS MG: per iteration a V-cycle over 5 levels: down (rprj3:
/// exchange the level's ghost buffer, restrict), the coarsest solve, up (interp, resid, psinv:
/// three exchanges of the same level buffer from three call sites), then the residual norm.
/// Computation shrinks with the level (8x per level in 3-D; here 4x).
pub fn mg(quick: bool) -> Program {
    let iters = if quick { 6 } else { 12 };
    let levels = 5;
    // Level 0 is the finest.
    let bufs: Vec<usize> = (0..levels).map(|l| (1024 * KIB) >> l).collect();
    let work = |l: usize| 2_000u64 >> (2 * l as u64).min(10);
    let mut steps = Vec::new();
    for _ in 0..iters {
        steps.push(Step {
            site: 0x300,
            buf: 0,
            compute_us: work(0),
        });
        for l in 1..levels {
            steps.push(Step {
                site: 0x301,
                buf: l,
                compute_us: work(l),
            });
        }
        for l in (0..levels).rev() {
            steps.push(Step {
                site: 0x302,
                buf: l,
                compute_us: work(l) / 2,
            });
            steps.push(Step {
                site: 0x303,
                buf: l,
                compute_us: work(l),
            });
            steps.push(Step {
                site: 0x304,
                buf: l,
                compute_us: work(l),
            });
        }
        steps.push(Step {
            site: 0x305,
            buf: 0,
            compute_us: 6_000,
        });
    }
    Program {
        name: "mg",
        about: "NAS MG skeleton: iters x V-cycle over 5 levels (rprj3 down; interp, resid, psinv up; norm)",
        bufs,
        steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_scale_leaves_a_native_machine_alone_and_stretches_a_slow_one() {
        assert_eq!(auto_scale(REFERENCE_COPY_NS), 1.0);
        assert_eq!(auto_scale(REFERENCE_COPY_NS * 19 / 10), 1.0);
        assert_eq!(auto_scale(REFERENCE_COPY_NS / 3), 1.0);
        assert_eq!(auto_scale(REFERENCE_COPY_NS * 2), 2.0);
        assert_eq!(auto_scale(REFERENCE_COPY_NS * 15), 15.0);
    }

    #[test]
    fn stretching_scales_every_computation_and_nothing_else() {
        let mut p = cg(true);
        let before: Vec<Step> = p.steps.clone();
        p.stretch_compute(2.5);
        assert_eq!(p.steps.len(), before.len());
        for (a, b) in before.iter().zip(&p.steps) {
            assert_eq!((a.site, a.buf), (b.site, b.buf));
            assert_eq!(b.compute_us, (a.compute_us as f64 * 2.5).round() as u64);
        }
    }
}
