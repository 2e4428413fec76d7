//! `pool { ... }`: the rollout engines, stale engines and cross-policy sampling.

use crate::ast::{Value, ValueKind};
use crate::diagnostics::{Diagnostic, one_of, suggest};
use crate::spec::{Interrupt, Placement, Pool, PoolMode};

use super::table::Interval;
use super::{Checker, Section};

/// `interrupt`'s values, by name.
const INTERRUPTS: [(&str, Interrupt); 3] = [
    ("never", Interrupt::Never),
    ("turn", Interrupt::Turn),
    ("token", Interrupt::Token),
];

impl Checker {
    pub(super) fn pool(&mut self, section: Section<'_>) -> Option<Pool> {
        let keys = [
            "engines",
            "stale",
            "cross_policy",
            "max_staleness",
            "mode",
            "placement",
            "interrupt",
            "env_workers",
        ];
        let table = self.table(section.body, "pool", &keys);
        let defaults = Pool::default();
        let engines = match table.get("engines") {
            Some(v) => self.size("engines", v, 1),
            None => Some(defaults.engines),
        };
        let (stale, refresh_every) = match table.get("stale") {
            Some(v) => self.stale(v),
            None => (Some(defaults.stale), Some(defaults.refresh_every)),
        };
        let cross_policy = match table.get("cross_policy") {
            Some(v) => self.number_in("cross_policy", v, Interval::new(0.0, false, 1.0, false)),
            None => Some(defaults.cross_policy),
        };
        let max_staleness = match table.get("max_staleness") {
            Some(v) => self.uint("max_staleness", v, 0),
            None => Some(defaults.max_staleness),
        };
        let mode = match table.get("mode") {
            Some(v) => self.choice(
                "mode",
                v,
                &[("sync", PoolMode::Sync), ("async", PoolMode::Async)],
            ),
            None => Some(defaults.mode),
        };
        let placement = match table.get("placement") {
            Some(v) => self.placement(v),
            None => Some(defaults.placement),
        };
        let interrupt = match table.get("interrupt") {
            Some(v) => self.choice("interrupt", v, &INTERRUPTS),
            None => Some(defaults.interrupt),
        };
        let env_workers = match table.get("env_workers") {
            Some(v) => self
                .int_in("env_workers", v, 1, Pool::MAX_ENV_WORKERS as i128)
                .and_then(|n| usize::try_from(n).ok())
                .map(Some),
            None => Some(defaults.env_workers),
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
        if let (Some(Placement::Disaggregated { .. }), Some(PoolMode::Sync)) = (&placement, mode) {
            self.error(
                Diagnostic::new(
                    span_of("placement"),
                    "disaggregated engines need `mode = async`",
                    "engines on other devices",
                )
                .with_hint(
                    "in sync mode the trainer waits for every rollout, so engines on other \
                     devices gain nothing; add `mode = async` or use `placement = colocated`",
                ),
            );
        }
        if let (Some(interrupt), Some(PoolMode::Sync), true) =
            (interrupt, mode, table.get("interrupt").is_some())
        {
            let name = INTERRUPTS
                .iter()
                .find_map(|(name, i)| (*i == interrupt).then_some(*name))
                .unwrap_or("?");
            self.error(
                Diagnostic::new(
                    span_of("interrupt"),
                    format!("`interrupt = {name}` needs `mode = async`"),
                    "no weights arrive during a synchronous rollout",
                )
                .with_hint(
                    "a synchronous step plays its whole batch with one version of the weights; \
                     add `mode = async` or remove `interrupt`",
                ),
            );
        }
        Some(Pool {
            engines: engines?,
            stale: stale?,
            refresh_every: refresh_every?,
            cross_policy: cross_policy?,
            max_staleness: max_staleness?,
            mode: mode?,
            placement: placement?,
            interrupt: interrupt?,
            env_workers: env_workers?,
        })
    }

    /// `colocated` or `disaggregated { devices = [1, 2] }`.
    fn placement(&mut self, value: &Value) -> Option<Placement> {
        const PLACEMENTS: &[&str] = &["colocated", "disaggregated"];
        let (head, body) = match &value.kind {
            ValueKind::Ident(_) => (value, None),
            ValueKind::Ctor { head, body } => (head.as_ref(), Some(body)),
            _ => {
                self.wrong_type("placement", value, &one_of(PLACEMENTS));
                return None;
            }
        };
        match (&head.kind, body) {
            (ValueKind::Ident(kind), None) if kind == "colocated" => Some(Placement::Colocated),
            (ValueKind::Ident(kind), Some(_)) if kind == "colocated" => {
                self.error(Diagnostic::new(
                    value.span,
                    "`colocated` takes no block",
                    "nothing to configure",
                ));
                None
            }
            (ValueKind::Ident(kind), None) if kind == "disaggregated" => {
                self.error(
                    Diagnostic::new(head.span, "`disaggregated` needs `devices`", "no devices")
                        .with_hint(
                            "name the devices the engines run on, by index: \
                             `placement = disaggregated { devices = [1] }`",
                        ),
                );
                None
            }
            (ValueKind::Ident(kind), Some(body)) if kind == "disaggregated" => {
                let table = self.table(body, "disaggregated", &["devices"]);
                let Some(list) = table.get("devices") else {
                    self.error(
                        Diagnostic::new(head.span, "`disaggregated` needs `devices`", "no devices")
                            .with_hint("add `devices = [1]`: the indices of the engines' devices"),
                    );
                    return None;
                };
                self.devices(list)
                    .map(|devices| Placement::Disaggregated { devices })
            }
            (ValueKind::Ident(other), _) => {
                let hint = suggest(other, PLACEMENTS.iter().copied())
                    .unwrap_or_else(|| format!("a placement is {}", one_of(PLACEMENTS)));
                self.error(
                    Diagnostic::new(
                        head.span,
                        format!("unknown placement `{other}`"),
                        "not a placement",
                    )
                    .with_hint(hint),
                );
                None
            }
            _ => {
                self.wrong_type("placement", head, &one_of(PLACEMENTS));
                None
            }
        }
    }

    /// `devices = [1, 2]`: distinct device indices, at least one.
    fn devices(&mut self, value: &Value) -> Option<Vec<u16>> {
        let ValueKind::List(items) = &value.kind else {
            self.wrong_type(
                "devices",
                value,
                "a list of device indices such as `[1, 2]`",
            );
            return None;
        };
        if items.is_empty() {
            self.error(
                Diagnostic::new(value.span, "`devices` is empty", "no device")
                    .with_hint("name at least one device index, e.g. `devices = [1]`"),
            );
            return None;
        }
        let mut devices = Vec::new();
        let mut ok = true;
        for item in items {
            match self.int_in("devices", item, 0, i128::from(u16::MAX)) {
                Some(d) => {
                    let d = u16::try_from(d).ok()?;
                    if devices.contains(&d) {
                        self.error(Diagnostic::new(
                            item.span,
                            format!("device {d} is listed twice"),
                            "listed again here",
                        ));
                        ok = false;
                    }
                    devices.push(d);
                }
                None => ok = false,
            }
        }
        ok.then_some(devices)
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
                    None => Some(Pool::default().refresh_every),
                };
                (count, refresh)
            }
            _ => (
                self.size("stale", value, 0),
                Some(Pool::default().refresh_every),
            ),
        }
    }
}
