use super::*;
use crate::compare::tests::{close, eval, run, scratch};

/// Base seeds 1-3 after warm-up (kg, os) and final; an ablation that loses kg on every seed;
/// a configuration of seed 9 only.
fn study(root: &std::path::Path) {
    let base = [
        (1, (0.2, 0.4), (0.5, 0.6)),
        (2, (0.3, 0.3), (0.6, 0.5)),
        (3, (0.1, 0.5), (0.4, 0.7)),
    ];
    for (seed, warm, last) in base {
        run(
            &root.join("base"),
            &format!("s{seed}"),
            "base",
            seed,
            &[
                eval("warmup", warm.0, warm.1, None),
                eval("final", last.0, last.1, None),
            ],
        );
        run(
            &root.join("ablation"),
            &format!("s{seed}"),
            "ablate.x",
            seed,
            &[eval(
                "final",
                last.0 - 0.2 + 0.1 * seed as f64 / 10.0,
                last.1,
                None,
            )],
        );
    }
    run(
        &root.join("lonely"),
        "s9",
        "lonely",
        9,
        &[eval("final", 0.5, 0.5, None)],
    );
}

#[test]
fn configurations_are_paired_with_the_base_seed_by_seed() {
    let root = scratch("paired");
    study(&root);
    let paired = paired(std::slice::from_ref(&*root), "base", Decoding::Greedy).unwrap();
    assert_eq!(
        paired,
        super::paired(std::slice::from_ref(&*root), "study/base", Decoding::Greedy).unwrap()
    );
    assert_eq!(paired.base, ("study".into(), "base".into()));
    assert_eq!(paired.tasks, ["kg", "os"]);
    assert_eq!(paired.unpaired, [("study".into(), "lonely".into())]);
    let [gain, ablation] = paired.rows.as_slice() else {
        panic!("{:?}", paired.rows);
    };

    // RL over warm-up, run by run: kg +0.3 on every seed.
    assert_eq!(gain.label, "base: final − after warm-up");
    assert_eq!(gain.seeds, [1, 2, 3]);
    let kg = &gain.tasks["kg"];
    for d in &kg.per_seed {
        close(*d, 0.3);
    }
    close(kg.mean, 0.3);
    let [low, high] = kg.ci.unwrap();
    close(low, 0.3);
    close(high, 0.3);
    // os: +0.2, +0.2, +0.2.
    close(gain.tasks["os"].mean, 0.2);
    close(gain.overall.as_ref().unwrap().mean, 0.25);

    // The ablation: kg −0.19, −0.18, −0.17; os unchanged.
    assert_eq!(ablation.label, "ablate.x − base");
    let kg = &ablation.tasks["kg"];
    for (d, want) in kg.per_seed.iter().zip([-0.19, -0.18, -0.17]) {
        close(*d, want);
    }
    close(kg.mean, -0.18);
    // sd 0.01 over 3 seeds: half-width t(2) · 0.01 / √3.
    let half = 4.302_652_730 * 0.01 / 3f64.sqrt();
    let [low, high] = kg.ci.unwrap();
    close(low, -0.18 - half);
    close(high, -0.18 + half);
    assert!(kg.separates());
    assert!(!ablation.tasks["os"].separates(), "a zero difference");

    // A specialist: its one task against the base's, no overall.
    let specialist = run(
        &root.join("specialist"),
        "s2",
        "specialist.kg",
        2,
        &[eval("final", 0.7, 0.0, None)],
    );
    let metrics = specialist.join("metrics.jsonl");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let one_task = text.replace(
        &text[text.find(",\"os\":").unwrap()..text.find("},\"success\"").unwrap()],
        "",
    );
    std::fs::write(&metrics, one_task).unwrap();
    let paired = super::paired(std::slice::from_ref(&*root), "base", Decoding::Greedy).unwrap();
    let specialist = paired
        .rows
        .iter()
        .find(|r| r.label == "specialist.kg − base")
        .unwrap();
    assert_eq!(specialist.seeds, [2]);
    assert_eq!(specialist.tasks.keys().collect::<Vec<_>>(), ["kg"]);
    close(specialist.tasks["kg"].mean, 0.1);
    assert_eq!(specialist.tasks["kg"].ci, None, "one seed: no interval");
    assert!(specialist.overall.is_none());

    let table = paired.markdown();
    assert!(
        table.contains("| specialist.kg − base | 1 | +0.100 | – | – |"),
        "{table}"
    );
    assert!(
        table.contains("- specialist.kg − base: 2: +0.100"),
        "{table}"
    );
    assert!(
        table.contains("| ablate.x − base | 3 | -0.180 ["),
        "{table}"
    );
    assert!(table.contains("]* |"), "{table}");
    assert!(
        table.contains("- ablate.x − base: 1: -0.095, 2: -0.090, 3: -0.085"),
        "{table}"
    );
    assert!(
        table.contains("`study/lonely` shares no seed with the base"),
        "{table}"
    );
}

#[test]
fn the_base_must_name_one_configuration() {
    let root = scratch("paired-bases");
    study(&root);
    let message = paired(std::slice::from_ref(&*root), "basis", Decoding::Greedy)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("`--paired basis`: no configuration of that name among the runs; they hold study/base, study/ablate.x, study/lonely"),
        "{message}"
    );
    // A second experiment with a `base` configuration makes `base` ambiguous.
    run(
        &root.join("other"),
        "s1",
        "base",
        1,
        &[eval("final", 0.1, 0.1, None)],
    );
    let config = root.join("other/s1").join(crate::metrics::RunConfig::FILE);
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("study", "other");
    std::fs::write(&config, text).unwrap();
    let message = paired(std::slice::from_ref(&*root), "base", Decoding::Greedy)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("several experiments (other/base, study/base)"),
        "{message}"
    );
    assert!(message.contains("`EXPERIMENT/base`"), "{message}");
    assert!(paired(std::slice::from_ref(&*root), "study/base", Decoding::Greedy).is_ok());
}
