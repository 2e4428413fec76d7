//! `agentry compare` on run directories written here.

use super::*;

/// A fresh scratch directory for one test, removed when dropped (also when the test fails).
pub(super) struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh [`Scratch`] directory named for the test.
pub(super) fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("agentry-compare-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// An evaluation line: `kg` and `os` with 10 episodes each.
pub(super) fn eval(label: &str, kg: f64, os: f64, decoding: Option<&str>) -> String {
    let decoding = decoding
        .map(|d| format!(",\"decoding\":\"{d}\""))
        .unwrap_or_default();
    let task = |s: f64| {
        let ci = wilson((s * 10.0).round() as usize, 10);
        format!(
            "{{\"episodes\":10,\"success\":{s},\"success_ci\":[{},{}],\"mean_return\":0.0,\"mean_turns\":1.0}}",
            ci[0], ci[1]
        )
    };
    let overall = (kg + os) / 2.0;
    let ci = wilson((overall * 20.0).round() as usize, 20);
    format!(
        "{{\"phase\":\"eval\",\"step\":4,\"label\":\"{label}\",\"tasks\":{{\"kg\":{},\"os\":{}}},\"success\":{overall},\"success_ci\":[{},{}]{decoding}}}",
        task(kg),
        task(os),
        ci[0],
        ci[1]
    )
}

/// A run directory `root/name` with `config.json` and these metrics lines.
pub(super) fn run(root: &Path, name: &str, config: &str, seed: u64, lines: &[String]) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let config = RunConfig {
        experiment: "study".into(),
        config: config.into(),
        seed,
    };
    std::fs::write(
        dir.join(RunConfig::FILE),
        serde_json::to_string(&config).unwrap(),
    )
    .unwrap();
    let mut text = "{\"phase\":\"sft\",\"step\":1,\"loss\":2.0,\"grad_norm\":1.0}\n".to_string();
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(dir.join("metrics.jsonl"), text).unwrap();
    dir
}

pub(super) fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-6, "{a} != {b}");
}

#[test]
fn t_quantiles_match_tables() {
    close(t_quantile_975(1), 12.706_204_736);
    close(t_quantile_975(2), 4.302_652_730);
    close(t_quantile_975(30), 2.042_272_456);
    // Beyond the table: t(40) = 2.021075, t(120) = 1.979930 (numerical integration).
    assert!((t_quantile_975(40) - 2.021_075).abs() < 2e-6);
    assert!((t_quantile_975(120) - 1.979_930).abs() < 2e-6);
}

#[test]
fn seeds_average_with_a_t_interval_and_one_seed_keeps_its_wilson_interval() {
    let root = scratch("table");
    let sweep = root.join("runs/study");
    for (seed, kg, os) in [(1, 0.5, 0.2), (2, 0.6, 0.4), (3, 0.7, 0.3)] {
        run(
            &sweep,
            &format!("seed{seed}-1"),
            "base",
            seed,
            &[
                eval("warmup", 0.1, 0.0, None),
                eval("periodic", 0.0, 0.0, None),
                eval("final", 0.9, 0.9, Some("sampled")),
                eval("final", kg, os, Some("greedy")),
            ],
        );
    }
    run(
        &sweep,
        "ablate.pool.cross_policy=0/seed1-2",
        "ablate.pool.cross_policy=0",
        1,
        &[eval("final", 0.3, 0.8, None)],
    );
    let table = compare(&[root.join("runs")], Decoding::Greedy).unwrap();
    assert_eq!(table.tasks, ["kg", "os"]);
    let names: Vec<&str> = table.rows.iter().map(|r| r.config.as_str()).collect();
    assert_eq!(
        names,
        ["base", "base (after warm-up)", "ablate.pool.cross_policy=0"]
    );
    let base = &table.rows[0];
    assert_eq!((base.seeds, base.interval), (3, Interval::StudentT));
    // kg: 0.5, 0.6, 0.7: mean 0.6, sd 0.1, half-width 4.302653 * 0.1 / sqrt(3) = 0.248414.
    let kg = base.tasks["kg"];
    close(kg.mean, 0.6);
    close(kg.ci[0], 0.6 - 0.248_414_2);
    close(kg.ci[1], 0.6 + 0.248_414_2);
    // overall: 0.35, 0.5, 0.5: mean 0.45, sd 0.0866025, half 4.302653 * 0.05 = 0.215133.
    close(base.overall.mean, 0.45);
    close(base.overall.ci[0], 0.45 - 0.215_132_6);
    // The warm-up row: 0.0 for os on every seed, a zero-width interval.
    assert_eq!(table.rows[1].tasks["os"].ci, [0.0, 0.0]);
    let ablation = &table.rows[2];
    assert_eq!((ablation.seeds, ablation.interval), (1, Interval::Wilson));
    // One seed: the stored Wilson intervals (3 of 10, and 11 of 20 pooled).
    for (ci, hand) in [
        (ablation.tasks["kg"].ci, wilson(3, 10)),
        (ablation.overall.ci, wilson(11, 20)),
    ] {
        close(ci[0], hand[0]);
        close(ci[1], hand[1]);
    }

    let markdown = table.markdown();
    let lines: Vec<&str> = markdown.lines().collect();
    assert_eq!(lines[0], "| configuration | seeds | kg | os | overall |");
    assert_eq!(lines[1], "|---|---|---|---|---|");
    assert_eq!(
        lines[2],
        "| base | 3 | 0.600 [0.352, 0.848] | 0.300 [0.052, 0.548] | 0.450 [0.235, 0.665] |"
    );
    assert!(
        lines[4].starts_with("| ablate.pool.cross_policy=0 | 1* | 0.300 [0.108, 0.603] |"),
        "{markdown}"
    );
    assert!(markdown.contains("greedy decoding"), "{markdown}");
    assert!(
        markdown.contains("`*` one seed: the run's Wilson"),
        "{markdown}"
    );

    let sampled = compare(&[sweep.join("seed1-1")], Decoding::Sampled).unwrap();
    assert_eq!(sampled.rows.len(), 1, "no sampled warm-up evaluation");
    close(sampled.rows[0].overall.mean, 0.9);
    let e = compare(
        &[sweep.join("ablate.pool.cross_policy=0")],
        Decoding::Sampled,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("has no final evaluation with sampled decoding"),
        "{e}"
    );
}

#[test]
fn a_run_without_config_json_is_its_experiments_base() {
    let root = scratch("legacy");
    let dir = run(
        &root,
        "seed4-1",
        "base",
        4,
        &[eval("final", 1.0, 0.5, None)],
    );
    std::fs::remove_file(dir.join(RunConfig::FILE)).unwrap();
    std::fs::write(
        dir.join("experiment.json"),
        r#"{"name":"old","seed":4,"more":1}"#,
    )
    .unwrap();
    let result = read_run(&dir, Decoding::Greedy).unwrap();
    assert_eq!(
        result.config,
        RunConfig {
            experiment: "old".into(),
            config: "base".into(),
            seed: 4
        }
    );
}

#[test]
fn bad_runs_are_errors_naming_the_file() {
    let root = scratch("bad");
    let good = eval("final", 0.5, 0.5, None);
    let cases: Vec<(&str, String, &str)> = vec![
        ("json", "{not json".into(), "line 2: not JSON"),
        ("phase", "{\"step\":1}".into(), "line 2: no `phase`"),
        (
            "shape",
            "{\"phase\":\"eval\",\"label\":\"final\",\"tasks\":3}".into(),
            "line 2: not an evaluation record",
        ),
        (
            "rate",
            good.replacen(
                "\"episodes\":10,\"success\":0.5",
                "\"episodes\":10,\"success\":1.5",
                1,
            ),
            "line 2: task `kg`: success 1.5 is not a rate in [0, 1]",
        ),
        (
            "decoding",
            format!("{},\"decoding\":\"beam\"}}", good.trim_end_matches('}')),
            "unknown decoding `beam`",
        ),
        (
            "unfinished",
            eval("periodic", 0.5, 0.5, None),
            "has no final evaluation with greedy decoding",
        ),
    ];
    // A warm-up evaluation alone is final only for a run that finished (zero RL steps).
    let unfinished = run(
        &root,
        "warmup-only",
        "base",
        1,
        &[eval("warmup", 0.5, 0.5, None)],
    );
    let e = compare(std::slice::from_ref(&unfinished), Decoding::Greedy).unwrap_err();
    assert!(e.to_string().contains("has no final evaluation"), "{e}");
    std::fs::write(unfinished.join(crate::RunSummary::FILE), "{}").unwrap();
    let table = compare(std::slice::from_ref(&unfinished), Decoding::Greedy).unwrap();
    assert_eq!(table.rows[0].config, "base");
    close(table.rows[0].overall.mean, 0.5);

    for (name, line, expected) in cases {
        let dir = run(&root, name, "base", 1, &[line]);
        let e = compare(std::slice::from_ref(&dir), Decoding::Greedy)
            .unwrap_err()
            .to_string();
        let file = dir.join("metrics.jsonl");
        assert!(e.contains(&format!("`{}`", file.display())), "{name}: {e}");
        assert!(e.contains(expected), "{name}: {e}");
    }
    let dir = run(&root, "config", "base", 1, std::slice::from_ref(&good));
    std::fs::write(dir.join(RunConfig::FILE), "{\"experiment\":\"x\"}").unwrap();
    let e = compare(std::slice::from_ref(&dir), Decoding::Greedy)
        .unwrap_err()
        .to_string();
    assert!(e.contains("config.json`: missing field"), "{e}");

    let missing = root.join("nope");
    let e = compare(&[missing], Decoding::Greedy)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("cannot read `") && e.contains("nope"), "{e}");
    let empty = root.join("empty/inner");
    std::fs::create_dir_all(&empty).unwrap();
    let e = compare(&[root.join("empty")], Decoding::Greedy)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("no run under `"), "{e}");

    let twice = root.join("twice");
    run(&twice, "a", "base", 1, std::slice::from_ref(&good));
    run(&twice, "b", "base", 1, &[good]);
    let e = compare(&[twice], Decoding::Greedy).unwrap_err().to_string();
    assert!(
        e.contains("are both seed 1 of `study` configuration `base`"),
        "{e}"
    );
}
