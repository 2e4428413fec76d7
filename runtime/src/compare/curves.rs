//! `agentry compare RUNS --plot DIR`: learning curves across seeds. For each task and overall,
//! one line per configuration: held-out success at every evaluation step, the mean over the
//! seeds evaluated there with its 95% Student-t band (none where one seed was).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{
    CompareError, Decoding, Point, columns, group, read_runs, row_name, several_experiments,
    t_interval,
};
use crate::report::{Chart, Line};

/// Draws the learning curves of the runs under `paths` into `dir` (created if needed), as
/// `curves-TASK.{png,svg}` per task and `curves-overall.{png,svg}`; returns the PNG paths.
pub fn plot(
    paths: &[PathBuf],
    decoding: Decoding,
    dir: &Path,
) -> Result<Vec<PathBuf>, CompareError> {
    let runs = read_runs(paths, decoding)?;
    let groups = group(&runs)?;
    let several = several_experiments(groups.iter().map(|(g, _)| g.experiment.as_str()));
    let tasks = columns(
        runs.iter()
            .flat_map(|r| r.curve.values().flat_map(|p| p.tasks.keys())),
    );
    std::fs::create_dir_all(dir).map_err(|source| CompareError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    let columns = tasks.iter().map(Some).chain(std::iter::once(None));
    for task in columns {
        let value = |p: &Point| match task {
            Some(task) => p.tasks.get(task).map(|(s, _)| *s),
            None => Some(p.overall.0),
        };
        let lines = groups
            .iter()
            .map(|(g, runs)| {
                let mut by_step: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
                for run in runs {
                    for (&step, point) in &run.curve {
                        if let Some(v) = value(point) {
                            by_step.entry(step).or_default().push(v);
                        }
                    }
                }
                curve(row_name(several, &g.experiment, &g.config), &by_step)
            })
            .filter(|line| !line.points.is_empty())
            .collect();
        let label = task.map_or("overall", String::as_str);
        let chart = Chart {
            file: format!("curves-{label}"),
            title: format!(
                "Held-out success, {label} ({}; mean over seeds, 95% t band)",
                decoding.name()
            ),
            y_label: "success",
            unit_range: true,
            lines,
        };
        chart.save(dir)?;
        written.push(dir.join(format!("{}.png", chart.file)));
    }
    Ok(written)
}

/// One configuration's line: the mean at each step, and the t band where two seeds or more
/// were evaluated.
fn curve(label: String, by_step: &BTreeMap<u64, Vec<f64>>) -> Line {
    let mut points = Vec::new();
    let mut band = Vec::new();
    for (&step, values) in by_step {
        let x = step as f64;
        if values.len() >= 2 {
            let cell = t_interval(values);
            points.push((x, cell.mean));
            band.push((x, cell.ci[0], cell.ci[1]));
        } else {
            points.push((x, values[0]));
        }
    }
    Line {
        label,
        points,
        band,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::tests::{close, eval, run, scratch};
    use crate::compare::{find_runs, read_run};

    #[test]
    fn curves_average_seeds_at_each_step_with_a_band() {
        let mut by_step = BTreeMap::new();
        by_step.insert(0, vec![0.1, 0.3]);
        by_step.insert(5, vec![0.5]);
        let line = curve("base".into(), &by_step);
        assert_eq!(line.points.len(), 2);
        close(line.points[0].1, 0.2);
        assert_eq!(line.points[1], (5.0, 0.5));
        assert_eq!(line.band.len(), 1, "one seed at step 5: no band");
        let half = 12.706_204_736 * (0.02f64).sqrt() / 2f64.sqrt();
        close(line.band[0].2, (0.2 + half).min(1.0));

        let root = scratch("curves");
        for seed in [1, 2] {
            let mut periodic = eval("eval", 0.2 * seed as f64, 0.5, None);
            periodic = periodic.replace("\"step\":4", "\"step\":2");
            run(
                &root,
                &format!("s{seed}"),
                "base",
                seed,
                &[
                    eval("warmup", 0.0, 0.1, None).replace("\"step\":4", "\"step\":0"),
                    periodic,
                    eval("final", 0.5, 0.5, None),
                ],
            );
        }
        let out = root.join("plots");
        let written = plot(std::slice::from_ref(&*root), Decoding::Greedy, &out).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["curves-kg.png", "curves-os.png", "curves-overall.png"]
        );
        for png in &written {
            assert!(
                std::fs::metadata(png).unwrap().len() > 1000,
                "{}",
                png.display()
            );
            let svg = std::fs::read_to_string(png.with_extension("svg")).unwrap();
            assert!(
                svg.contains("<svg") && svg.contains("base"),
                "{}",
                png.display()
            );
        }
        let runs = find_runs(std::slice::from_ref(&*root)).unwrap();
        let first = read_run(&runs[0], Decoding::Greedy).unwrap();
        assert_eq!(first.curve.keys().copied().collect::<Vec<_>>(), [0, 2, 4]);
    }
}
