//! Which bootstrap `from_env` builds, decided from the environment alone (pure, so it is tested
//! with an injected lookup instead of the process environment).
//!
//! `FH_BOOTSTRAP`:
//! - unset, empty or `auto`: PMIx if `PMIX_RANK` is set (a PMIx launcher started us), else single;
//! - `pmix`: PMIx, even without `PMIX_RANK` (PMIx then decides whether a singleton works);
//! - `single`: a job of one, even under `mpirun` (every process is rank 0 of 1).
//!
//! Anything else is an error naming the variable. There is no silent fallback: when PMIx is
//! chosen and cannot be used (library missing, no server), `from_env` fails.

use super::BootstrapError;

/// The bootstrap to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Pmix,
    Single,
}

/// Picks the bootstrap from `FH_BOOTSTRAP` and `PMIX_RANK` as read by `env`.
pub fn choose(env: &dyn Fn(&str) -> Option<String>) -> Result<Choice, BootstrapError> {
    let forced = env("FH_BOOTSTRAP").map(|v| v.trim().to_ascii_lowercase());
    match forced.as_deref() {
        None | Some("") | Some("auto") => Ok(match env("PMIX_RANK") {
            Some(_) => Choice::Pmix,
            None => Choice::Single,
        }),
        Some("pmix") => Ok(Choice::Pmix),
        Some("single") => Ok(Choice::Single),
        Some(other) => Err(BootstrapError(format!(
            "FH_BOOTSTRAP={other:?}: expected auto, pmix or single"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<Choice, BootstrapError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        choose(&move |k: &str| {
            vars.iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn auto_follows_pmix_rank() {
        assert_eq!(with(&[]), Ok(Choice::Single));
        assert_eq!(with(&[("PMIX_RANK", "3")]), Ok(Choice::Pmix));
        assert_eq!(with(&[("FH_BOOTSTRAP", "auto")]), Ok(Choice::Single));
        assert_eq!(
            with(&[("FH_BOOTSTRAP", " Auto "), ("PMIX_RANK", "0")]),
            Ok(Choice::Pmix)
        );
        assert_eq!(
            with(&[("FH_BOOTSTRAP", ""), ("PMIX_RANK", "0")]),
            Ok(Choice::Pmix)
        );
    }

    #[test]
    fn fh_bootstrap_forces_a_choice() {
        assert_eq!(with(&[("FH_BOOTSTRAP", "pmix")]), Ok(Choice::Pmix));
        assert_eq!(
            with(&[("FH_BOOTSTRAP", "SINGLE"), ("PMIX_RANK", "1")]),
            Ok(Choice::Single)
        );
    }

    #[test]
    fn an_unknown_value_names_the_variable() {
        let e = with(&[("FH_BOOTSTRAP", "mpi")]).unwrap_err();
        assert!(e.0.contains("FH_BOOTSTRAP") && e.0.contains("mpi"), "{e}");
    }
}
