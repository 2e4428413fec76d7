//! A run's report: `report.md` with its tables and `plots/` with its learning curves, written
//! into the run directory at the end of a run and regenerated from the directory alone by
//! `agentry report RUN_DIR`.
//!
//! Everything is read back from the files the run wrote — `metrics.jsonl` (required),
//! `experiment.json` and `summary.json` (used when present) — so a report never depends on the
//! state of a live trainer, and a run cut short still gets one. The two JSON files are read as
//! plain JSON, field by field, so runs written by older versions of the spec still report.
//!
//! Plots are drawn twice, as SVG and as PNG: the PNG through plotters' bitmap backend into a
//! buffer that the `png` crate encodes, its text through ab_glyph with the DejaVu Sans font
//! embedded in this crate (`assets/fonts`, licence beside it), so nothing needs a system font
//! library.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use serde_json::Value;

use crate::metrics::{EvalPoint, Record, RlRecord, TaskStats};
use crate::spec::Decoding;

/// Why a report could not be written. Each says which file and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The directory has no `metrics.jsonl`.
    #[error(
        "`{path}` is not a run directory: it has no `metrics.jsonl` (every `agentry run` writes \
         one into runs/<experiment>/<run-id>/; pass that directory)"
    )]
    NotARun {
        /// The directory given.
        path: PathBuf,
    },
    /// A file could not be read.
    #[error("cannot read `{path}`: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file is not what a run writes.
    #[error("`{path}` line {line}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The line (1 for a JSON document).
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A file of the report could not be written.
    #[error("cannot write `{path}`: {source}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A plot could not be drawn.
    #[error("cannot draw `{path}`: {message}")]
    Plot {
        /// The plot's file.
        path: PathBuf,
        /// The drawing backend's message.
        message: String,
    },
}

/// Plot size in pixels (PNG) and user units (SVG).
const SIZE: (u32, u32) = (800, 480);

/// The font of the PNG plots' text (and of the SVG's text layout).
const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");

/// Writes `report.md` and `plots/` into `run_dir` from the files the run wrote there; returns
/// the path of `report.md`.
pub fn write(run_dir: &Path) -> Result<PathBuf, ReportError> {
    let run = Run::read(run_dir)?;
    let plots_dir = run_dir.join("plots");
    std::fs::create_dir_all(&plots_dir).map_err(|source| ReportError::Write {
        path: plots_dir.clone(),
        source,
    })?;
    let charts = run.charts();
    for chart in &charts {
        chart.save(&plots_dir)?;
    }
    let path = run_dir.join("report.md");
    std::fs::write(&path, run.markdown(&charts)).map_err(|source| ReportError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// One evaluation line of `metrics.jsonl`, borrowed.
struct EvalView<'a> {
    step: u64,
    label: EvalPoint,
    decoding: Decoding,
    tasks: &'a BTreeMap<String, TaskStats>,
    success: f64,
    success_ci: [f64; 2],
}

/// What the report is built from.
struct Run {
    dir: PathBuf,
    /// `experiment.json`, or `Null` when absent.
    experiment: Value,
    /// `summary.json`, or `Null` when the run has not finished.
    summary: Value,
    records: Vec<Record>,
    /// Names of the `samples-*.txt` files, sorted.
    samples: Vec<String>,
}

impl Run {
    fn read(dir: &Path) -> Result<Self, ReportError> {
        let metrics = dir.join("metrics.jsonl");
        if !metrics.is_file() {
            return Err(ReportError::NotARun {
                path: dir.to_path_buf(),
            });
        }
        let text = read_text(&metrics)?;
        let mut records = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let record = serde_json::from_str(line).map_err(|e| ReportError::Parse {
                path: metrics.clone(),
                line: i + 1,
                message: format!("not a metrics record: {e}"),
            })?;
            records.push(record);
        }
        let entries = std::fs::read_dir(dir).map_err(|source| ReportError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut samples: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("samples-") && n.ends_with(".txt"))
            .collect();
        samples.sort();
        Ok(Run {
            dir: dir.to_path_buf(),
            experiment: read_json(&dir.join("experiment.json"))?,
            summary: read_json(&dir.join(crate::RunSummary::FILE))?,
            records,
            samples,
        })
    }

    fn rl(&self) -> impl Iterator<Item = &RlRecord> {
        self.records.iter().filter_map(|r| match r {
            Record::Rl(record) => Some(record.as_ref()),
            _ => None,
        })
    }

    fn evals(&self) -> impl Iterator<Item = EvalView<'_>> {
        self.records.iter().filter_map(|r| match r {
            Record::Eval {
                step,
                label,
                decoding,
                tasks,
                success,
                success_ci,
            } => Some(EvalView {
                step: *step,
                label: *label,
                decoding: *decoding,
                tasks,
                success: *success,
                success_ci: *success_ci,
            }),
            _ => None,
        })
    }

    /// The decodings evaluated, greedy first.
    fn decodings(&self) -> Vec<Decoding> {
        let mut decodings: Vec<Decoding> = self.evals().map(|e| e.decoding).collect();
        decodings.sort();
        decodings.dedup();
        decodings
    }

    /// The latest evaluation with `decoding`.
    fn last_eval(&self, decoding: Decoding) -> Option<EvalView<'_>> {
        self.evals().filter(|e| e.decoding == decoding).last()
    }

    /// The evaluation after the warm-up with `decoding`.
    fn warmup_eval(&self, decoding: Decoding) -> Option<EvalView<'_>> {
        self.evals()
            .find(|e| e.decoding == decoding && e.label == EvalPoint::Warmup)
    }

    /// Every task named by a record, in name order.
    fn task_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .evals()
            .flat_map(|e| e.tasks.keys().cloned().collect::<Vec<_>>())
            .chain(self.rl().flat_map(|r| r.tasks.keys().cloned()))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    fn charts(&self) -> Vec<Chart> {
        let tasks = self.task_names();
        let rl: Vec<&RlRecord> = self.rl().collect();
        let mut charts = Vec::new();
        if !rl.is_empty() {
            let per_task = tasks
                .iter()
                .map(|task| Line {
                    label: task.clone(),
                    points: rl
                        .iter()
                        .filter_map(|r| Some((r.step as f64, r.tasks.get(task)?.success)))
                        .collect(),
                    band: Vec::new(),
                })
                .filter(|line| !line.points.is_empty())
                .collect();
            charts.push(Chart {
                file: "train_success".into(),
                title: "Training success per task".into(),
                y_label: "success (training episodes)",
                unit_range: true,
                lines: per_task,
            });
            let series =
                |file: &str, title: &str, y_label, value: fn(&RlRecord) -> Option<f64>| Chart {
                    file: file.into(),
                    title: title.into(),
                    y_label,
                    unit_range: false,
                    lines: vec![Line {
                        label: y_label.to_string(),
                        points: rl
                            .iter()
                            .filter_map(|r| Some((r.step as f64, value(r)?)))
                            .collect(),
                        band: Vec::new(),
                    }],
                };
            charts.push(series("return", "Mean return", "mean return", |r| {
                Some(r.mean_return)
            }));
            // A skipped update has no loss terms (they are recorded as 0): left out.
            charts.push(series("entropy", "Entropy", "entropy (nats/token)", |r| {
                (!r.skipped).then_some(f64::from(r.entropy))
            }));
            charts.push(series("kl", "KL to the reference", "KL", |r| {
                (!r.skipped).then_some(f64::from(r.kl))
            }));
            if rl.iter().any(|r| !r.staleness.is_empty()) {
                charts.push(series(
                    "staleness",
                    "Staleness of the turns trained on",
                    "mean versions behind",
                    mean_staleness,
                ));
            }
        }
        for decoding in self.decodings() {
            let evals: Vec<EvalView<'_>> =
                self.evals().filter(|e| e.decoding == decoding).collect();
            let lines = tasks
                .iter()
                .map(|task| {
                    let stats: Vec<(f64, &TaskStats)> = evals
                        .iter()
                        .filter_map(|e| Some((e.step as f64, e.tasks.get(task)?)))
                        .collect();
                    Line {
                        label: task.clone(),
                        points: stats.iter().map(|(x, s)| (*x, s.success)).collect(),
                        band: stats
                            .iter()
                            .map(|(x, s)| (*x, s.success_ci[0], s.success_ci[1]))
                            .collect(),
                    }
                })
                .filter(|line| !line.points.is_empty())
                .collect();
            charts.push(Chart {
                file: match decoding {
                    Decoding::Greedy => "eval_success_greedy",
                    Decoding::Sampled => "eval_success_sampled",
                }
                .into(),
                title: format!("Held-out success per task, {} (95% CI)", decoding.name()),
                y_label: "success",
                unit_range: true,
                lines,
            });
        }
        charts
    }

    fn markdown(&self, charts: &[Chart]) -> String {
        let mut md = String::new();
        let name = self.experiment["name"].as_str().unwrap_or("?");
        let run_id = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = writeln!(md, "# Run report: `{name}`\n");
        let _ = writeln!(md, "| | |\n|---|---|");
        let _ = writeln!(md, "| run | `{run_id}` |");
        let _ = writeln!(md, "| experiment | `{name}` |");
        if let Some(kind) = self.experiment["algorithm"]["kind"].as_str() {
            let _ = writeln!(md, "| algorithm | {kind} |");
        }
        let device = match self.summary["device"].as_str() {
            Some(device) => device.to_string(),
            None => format!(
                "{} (requested; the run has not finished)",
                self.experiment["device"].as_str().unwrap_or("?")
            ),
        };
        let _ = writeln!(md, "| device | {device} |");
        let _ = writeln!(md, "| seed | {} |", show(&self.experiment["seed"]));
        let done = self.rl().map(|r| r.step).max().unwrap_or(0);
        let _ = writeln!(
            md,
            "| RL steps | {done} of {} |",
            show(&self.experiment["train"]["steps"])
        );
        if let Some(skipped) = self.summary["skipped_steps"].as_u64() {
            let _ = writeln!(md, "| steps skipped (every advantage zero) | {skipped} |");
        }
        let nonfinite: usize = self
            .records
            .iter()
            .map(|r| match r {
                Record::Sft {
                    skipped_nonfinite, ..
                } => usize::from(*skipped_nonfinite),
                Record::Rl(rl) => rl.skipped_nonfinite,
                Record::Eval { .. } => 0,
            })
            .sum();
        if nonfinite > 0 {
            let _ = writeln!(
                md,
                "| updates skipped (loss or gradient not finite) | {nonfinite} |"
            );
        }
        let eval = &self.experiment["eval"];
        let decodings: Vec<&str> = self.decodings().iter().map(|d| d.name()).collect();
        let _ = writeln!(
            md,
            "| evaluation | {} split, {} episodes per task, {} |",
            eval["split"].as_str().unwrap_or("?"),
            show(&eval["episodes"]),
            if decodings.is_empty() {
                "none recorded".to_string()
            } else {
                decodings.join(" and ")
            }
        );
        md.push('\n');

        self.final_table(&mut md);
        self.warmup_table(&mut md);
        self.history_table(&mut md);
        self.training(&mut md);

        let _ = writeln!(md, "## Plots\n");
        if charts.is_empty() {
            let _ = writeln!(md, "No RL step or evaluation was recorded yet.\n");
        }
        for chart in charts {
            let _ = writeln!(
                md,
                "### {}\n\n![{}](plots/{}.png)\n\n[SVG](plots/{}.svg)\n",
                chart.title, chart.title, chart.file, chart.file
            );
        }
        let _ = writeln!(md, "## Samples\n");
        if self.samples.is_empty() {
            let _ = writeln!(md, "No samples were written.");
        }
        for file in &self.samples {
            let _ = writeln!(md, "- [{file}]({file})");
        }
        md
    }

    /// The latest evaluation of each decoding, per task and pooled.
    fn final_table(&self, md: &mut String) {
        let last: Vec<EvalView<'_>> = self
            .decodings()
            .into_iter()
            .filter_map(|d| self.last_eval(d))
            .collect();
        let Some(first) = last.first() else {
            let _ = writeln!(
                md,
                "## Final evaluation\n\nNo evaluation was recorded yet.\n"
            );
            return;
        };
        // A finished run's latest evaluation is its final one; with no RL after a warm-up
        // (`steps = 0`) that is the warm-up's.
        if first.label == EvalPoint::Final || !self.summary.is_null() {
            let _ = writeln!(md, "## Final evaluation (step {})\n", first.step);
        } else {
            let _ = writeln!(
                md,
                "## Latest evaluation (step {}, {}): the run has not finished\n",
                first.step, first.label
            );
        }
        let _ = writeln!(
            md,
            "| task | decoding | success | 95% CI | mean return | mean turns |\n\
             |---|---|---:|---|---:|---:|"
        );
        for e in &last {
            for (task, s) in e.tasks {
                let _ = writeln!(
                    md,
                    "| {task} | {} | {:.3} | {} | {:.3} | {:.2} |",
                    e.decoding.name(),
                    s.success,
                    interval(s.success_ci),
                    s.mean_return,
                    s.mean_turns
                );
            }
        }
        for e in &last {
            let _ = writeln!(
                md,
                "| **all tasks** | {} | {:.3} | {} | | |",
                e.decoding.name(),
                e.success,
                interval(e.success_ci)
            );
        }
        let _ = writeln!(
            md,
            "\nSuccess per task with its 95% Wilson interval; \"all tasks\" is the mean over \
             tasks, its interval pooled over their episodes.\n"
        );
    }

    /// After the warm-up against the latest evaluation, when the run had a warm-up.
    fn warmup_table(&self, md: &mut String) {
        let pairs: Vec<(EvalView<'_>, EvalView<'_>)> = self
            .decodings()
            .into_iter()
            .filter_map(|d| Some((self.warmup_eval(d)?, self.last_eval(d)?)))
            .filter(|(before, after)| after.label != EvalPoint::Warmup && before.step <= after.step)
            .collect();
        if pairs.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "## After warm-up vs after RL\n\n\
             | task | decoding | after warm-up | after RL (step {}) | change |\n\
             |---|---|---|---|---:|",
            pairs[0].1.step
        );
        for (before, after) in &pairs {
            // Each task's success (and interval) after the warm-up and after RL, then all tasks'.
            let tasks = before.tasks.iter().filter_map(|(task, b)| {
                let a = after.tasks.get(task)?;
                Some((
                    task.as_str(),
                    (b.success, b.success_ci),
                    (a.success, a.success_ci),
                ))
            });
            let all = (
                "**all tasks**",
                (before.success, before.success_ci),
                (after.success, after.success_ci),
            );
            for (task, (b, b_ci), (a, a_ci)) in tasks.chain([all]) {
                let _ = writeln!(
                    md,
                    "| {task} | {} | {b:.3} {} | {a:.3} {} | {:+.3} |",
                    before.decoding.name(),
                    interval(b_ci),
                    interval(a_ci),
                    a - b
                );
            }
        }
        md.push('\n');
    }

    /// Every evaluation of the run, in order.
    fn history_table(&self, md: &mut String) {
        let evals: Vec<EvalView<'_>> = self.evals().collect();
        if evals.len() < 2 {
            return;
        }
        let _ = writeln!(
            md,
            "## Evaluations during the run\n\n\
             | step | point | decoding | success | 95% CI | per task |\n\
             |---:|---|---|---:|---|---|"
        );
        for e in &evals {
            let per_task: Vec<String> = e
                .tasks
                .iter()
                .map(|(task, s)| format!("{task} {:.2}", s.success))
                .collect();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.3} | {} | {} |",
                e.step,
                e.label,
                e.decoding.name(),
                e.success,
                interval(e.success_ci),
                per_task.join(", ")
            );
        }
        md.push('\n');
    }

    /// The warm-up's last loss, the last RL step's metrics and the alerts raised.
    fn training(&self, md: &mut String) {
        let _ = writeln!(md, "## Training\n");
        let sft: Vec<(u64, f32)> = self
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Sft {
                    step,
                    loss,
                    skipped_nonfinite: false,
                    ..
                } => Some((*step, *loss)),
                _ => None,
            })
            .collect();
        if let Some((step, loss)) = sft.last() {
            let _ = writeln!(
                md,
                "Supervised warm-up: {step} steps, last loss {loss:.4}.\n"
            );
        }
        let rl: Vec<&RlRecord> = self.rl().collect();
        let Some(last) = rl.last() else {
            let _ = writeln!(md, "No RL step was recorded yet.\n");
            return;
        };
        let _ = writeln!(
            md,
            "Last RL step ({}):\n\n| metric | value |\n|---|---:|",
            last.step
        );
        let mut rows = vec![
            ("training success", format!("{:.3}", last.success)),
            ("mean return", format!("{:.3}", last.mean_return)),
            ("reward std", format!("{:.3}", last.reward_std)),
            ("loss", format!("{:+.4}", last.loss)),
            ("entropy", format!("{:.3}", last.entropy)),
            ("KL", format!("{:.4}", last.kl)),
            ("gradient norm", format!("{:.3}", last.grad_norm)),
            ("agent tokens", last.agent_tokens.to_string()),
        ];
        if let Some(staleness) = mean_staleness(last) {
            rows.push(("mean versions behind", format!("{staleness:.2}")));
        }
        if let Some(value_loss) = last.value_loss {
            rows.push(("value loss", format!("{value_loss:.4}")));
        }
        for (metric, value) in rows {
            let _ = writeln!(md, "| {metric} | {value} |");
        }
        md.push('\n');
        // Alerts: the steps each held, first and last.
        let mut alerts: BTreeMap<&str, (usize, u64, u64)> = BTreeMap::new();
        for record in &rl {
            for alert in &record.alerts {
                let entry = alerts
                    .entry(alert.name())
                    .or_insert((0, record.step, record.step));
                entry.0 += 1;
                entry.2 = record.step;
            }
        }
        if alerts.is_empty() {
            let _ = writeln!(md, "Stability alerts: none raised.\n");
        } else {
            let _ = writeln!(
                md,
                "Stability alerts:\n\n| alert | steps held | first | last |\n|---|---:|---:|---:|"
            );
            for (name, (count, first, last)) in alerts {
                let _ = writeln!(md, "| {name} | {count} | {first} | {last} |");
            }
            md.push('\n');
        }
    }
}

/// Mean versions behind over the step's turns, from its staleness histogram.
fn mean_staleness(record: &RlRecord) -> Option<f64> {
    let turns: usize = record.staleness.values().sum();
    (turns > 0).then(|| {
        record
            .staleness
            .iter()
            .map(|(behind, n)| *behind as f64 * *n as f64)
            .sum::<f64>()
            / turns as f64
    })
}

fn interval([low, high]: [f64; 2]) -> String {
    format!("[{low:.3}, {high:.3}]")
}

/// A JSON scalar as text, `?` when absent.
fn show(value: &Value) -> String {
    match value {
        Value::Null => "?".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn read_text(path: &Path) -> Result<String, ReportError> {
    std::fs::read_to_string(path).map_err(|source| ReportError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// A JSON file of the run directory, `Null` when it does not exist.
fn read_json(path: &Path) -> Result<Value, ReportError> {
    if !path.exists() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&read_text(path)?).map_err(|e| ReportError::Parse {
        path: path.to_path_buf(),
        line: e.line(),
        message: e.to_string(),
    })
}

/// One curve of a chart, with an optional band `(x, low, high)`.
pub(crate) struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub band: Vec<(f64, f64, f64)>,
}

/// One plot over RL steps: saved as `FILE.png` and `FILE.svg` (a run's are in `plots/`).
pub(crate) struct Chart {
    pub file: String,
    pub title: String,
    pub y_label: &'static str,
    /// The y axis is a rate: [0, 1].
    pub unit_range: bool,
    pub lines: Vec<Line>,
}

impl Chart {
    /// Writes the chart into `dir` as SVG and PNG.
    pub(crate) fn save(&self, dir: &Path) -> Result<(), ReportError> {
        let fail = |path: PathBuf| move |message: String| ReportError::Plot { path, message };
        let svg_path = dir.join(format!("{}.svg", self.file));
        let mut svg = String::new();
        self.draw(SVGBackend::with_string(&mut svg, SIZE).into_drawing_area())
            .map_err(fail(svg_path.clone()))?;
        std::fs::write(&svg_path, svg).map_err(|source| ReportError::Write {
            path: svg_path,
            source,
        })?;

        let png_path = dir.join(format!("{}.png", self.file));
        let (width, height) = SIZE;
        let mut pixels = vec![0u8; width as usize * height as usize * 3];
        self.draw(BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area())
            .map_err(fail(png_path.clone()))?;
        let file = std::fs::File::create(&png_path).map_err(|source| ReportError::Write {
            path: png_path.clone(),
            source,
        })?;
        let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        encoder
            .write_header()
            .and_then(|mut writer| {
                writer.write_image_data(&pixels)?;
                writer.finish()
            })
            .map_err(|e| fail(png_path)(e.to_string()))
    }

    /// The x and y ranges of the data, widened so that a single point or a flat line still
    /// has an axis around it.
    fn ranges(&self) -> ((f64, f64), (f64, f64)) {
        let points = || {
            self.lines
                .iter()
                .flat_map(|l| l.points.iter().copied())
                .filter(|(x, y)| x.is_finite() && y.is_finite())
        };
        let (mut x0, mut x1) = points().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.0), b.max(p.0))
        });
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if self.unit_range {
            return ((x0, x1), (0.0, 1.0));
        }
        let (mut y0, mut y1) = points().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.1), b.max(p.1))
        });
        if !y0.is_finite() {
            (y0, y1) = (0.0, 1.0);
        }
        let pad = if y1 > y0 {
            (y1 - y0) * 0.05
        } else {
            y0.abs().max(1.0) * 0.1
        };
        ((x0, x1), (y0 - pad, y1 + pad))
    }

    fn draw<DB: DrawingBackend>(&self, area: DrawingArea<DB, Shift>) -> Result<(), String> {
        font()?;
        let text = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        area.fill(&WHITE).map_err(text)?;
        let ((x0, x1), (y0, y1)) = self.ranges();
        let mut chart = ChartBuilder::on(&area)
            .caption(&self.title, ("sans-serif", 22))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(text)?;
        chart
            .configure_mesh()
            .x_desc("RL step")
            // Steps are whole: as many labels as steps, up to ten, so none repeats.
            .x_labels(((x1 - x0).round() as usize + 1).clamp(2, 10))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc(self.y_label)
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(text)?;
        for (i, line) in self.lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            if !line.band.is_empty() {
                let mut outline: Vec<(f64, f64)> =
                    line.band.iter().map(|(x, _, high)| (*x, *high)).collect();
                outline.extend(line.band.iter().rev().map(|(x, low, _)| (*x, *low)));
                chart
                    .draw_series(std::iter::once(Polygon::new(outline, color.mix(0.18))))
                    .map_err(text)?;
            }
            chart
                .draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(text)?
                .label(line.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    line.points
                        .iter()
                        .map(|&p| Circle::new(p, 3, color.filled())),
                )
                .map_err(text)?;
        }
        if !self.lines.is_empty() {
            chart
                .configure_series_labels()
                .label_font(("sans-serif", 13))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperRight)
                .draw()
                .map_err(text)?;
        }
        area.present().map_err(text)
    }
}

/// Registers the embedded font under the family the charts ask for (once per process).
fn font() -> Result<(), String> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    if *REGISTERED.get_or_init(|| register_font("sans-serif", FontStyle::Normal, FONT).is_ok()) {
        Ok(())
    } else {
        Err("the embedded DejaVu Sans font could not be read".into())
    }
}
