//! `pool { ... }`: the rollout engines, stale engines and cross-policy sampling.

use crate::ast::{Value, ValueKind};
use crate::diagnostics::Diagnostic;
use crate::spec::{Pool, PoolMode};

use super::table::Interval;
use super::{Checker, Section};

impl Checker {
    pub(super) fn pool(&mut self, section: Section<'_>) -> Option<Pool> {
        let keys = ["engines", "stale", "cross_policy", "max_staleness", "mode"];
        let table = self.table(section.body, "pool", &keys);
        let engines = match table.get("engines") {
            Some(v) => self.size("engines", v, 1),
            None => Some(1),
        };
        let (stale, refresh_every) = match table.get("stale") {
            Some(v) => self.stale(v),
            None => (Some(0), Some(1)),
        };
        let cross_policy = match table.get("cross_policy") {
            Some(v) => self.number_in("cross_policy", v, Interval::new(0.0, false, 1.0, false)),
            None => Some(0.0),
        };
        let max_staleness = match table.get("max_staleness") {
            Some(v) => self.uint("max_staleness", v, 0),
            None => Some(1),
        };
        let mode = match table.get("mode") {
            Some(v) => self.choice(
                "mode",
                v,
                &[("sync", PoolMode::Sync), ("async", PoolMode::Async)],
            ),
            None => Some(PoolMode::Sync),
        };
        let span_of = |key: &str| table.get(key).map_or(section.keyword.span, |v| v.span);

        if let (Some(stale), Some(engines)) = (stale, engines)
            && stale >= engines
        {
            self.error(
                Diagnostic::new(
                    span_of("stale"),
                    format!("`stale` ({stale}) must be less than `engines` ({engines})"),
                    "too many stale engines",
                )
                .with_hint(format!(
                    "at least one engine must hold the newest weights; raise `engines` to {} or \
                     lower `stale`",
                    stale + 1
                )),
            );
        }
        if let (Some(cross), Some(0)) = (cross_policy, stale)
            && cross > 0.0
        {
            self.error(
                Diagnostic::new(
                    span_of("cross_policy"),
                    format!("`cross_policy = {cross}` needs at least one stale engine"),
                    "no stale engine to sample from",
                )
                .with_hint(
                    "add `stale = 1 { refresh_every = 25 }` (and enough `engines`), or set \
                     `cross_policy = 0`",
                ),
            );
        }
        if let (Some(cross), Some(max), Some(refresh)) =
            (cross_policy, max_staleness, refresh_every)
            && cross > 0.0
            && max < refresh
        {
            self.error(
                Diagnostic::new(
                    span_of("max_staleness"),
                    format!("`max_staleness` ({max}) is below `refresh_every` ({refresh})"),
                    "stale turns would be dropped",
                )
                .with_hint(format!(
                    "stale engines lag up to {refresh} steps behind, so their trajectories would \
                     exceed the bound; set `max_staleness = {refresh}` or more"
                )),
            );
        }
        Some(Pool {
            engines: engines?,
            stale: stale?,
            refresh_every: refresh_every?,
            cross_policy: cross_policy?,
            max_staleness: max_staleness?,
            mode: mode?,
        })
    }

    /// `stale = n` or `stale = n { refresh_every = k }`.
    fn stale(&mut self, value: &Value) -> (Option<usize>, Option<u64>) {
        match &value.kind {
            ValueKind::Ctor { head, body } => {
                let count = self.size("stale", head, 0);
                let table = self.table(body, "stale", &["refresh_every"]);
                let refresh = match table.get("refresh_every") {
                    Some(v) => {
                        let refresh = self.uint("refresh_every", v, 1);
                        if refresh.is_none()
                            && let Some(last) = self.errors.last_mut()
                        {
                            last.hint = Some(
                                "a stale engine is refreshed every `refresh_every` steps; 1 \
                                 means every step"
                                    .into(),
                            );
                        }
                        refresh
                    }
                    None => Some(1),
                };
                (count, refresh)
            }
            _ => (self.size("stale", value, 0), Some(1)),
        }
    }
}
