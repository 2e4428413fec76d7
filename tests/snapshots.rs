//! The generated code of every recipe in `experiments/`: pretty-printed and snapshotted, and
//! compiled, building the very spec the checker returns.
//!
//! One glob covers every file for the snapshots, so a new recipe is covered without a new test.
//! Review changes with `cargo insta review`.

#[test]
fn generated_code_of_every_recipe() {
    insta::glob!("../experiments", "*.arl", |path| {
        let source = std::fs::read_to_string(path).expect("recipe is readable");
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let shown = format!("experiments/{name}");
        let code = agentry::expand_pretty(&source, &shown)
            .unwrap_or_else(|d| panic!("{}", d.render(&shown, &source)));
        insta::assert_snapshot!(code);
    });
}

/// The user's task `experiments/custom_env.arl` names (`crate::envs::Lights`).
#[path = "../examples/custom_env/envs.rs"]
mod envs;

/// The recipes compiled through the macro, as a user's program would.
mod compiled {
    agentry::experiment!("experiments/ablations.arl");
    agentry::experiment!("experiments/ablations_gpu.arl");
    agentry::experiment!("experiments/agentrl.arl");
    agentry::experiment!("experiments/agentrl_gpu.arl");
    agentry::experiment!("experiments/custom_env.arl");
    agentry::experiment!("experiments/monte_carlo_kg.arl");
    agentry::experiment!("experiments/ppo_kg.arl");
    agentry::experiment!("experiments/quickstart.arl");
    agentry::experiment!("experiments/reinforce_pp_kg.arl");
    agentry::experiment!("experiments/rloo_kg.arl");
    agentry::experiment!("experiments/smollm2_lora.arl");
    agentry::experiment!("experiments/smollm2_zero_shot.arl");
    agentry::experiment!("experiments/specialists.arl");
    agentry::experiment!("experiments/specialists_gpu.arl");
}

/// The code each recipe expands to builds exactly the spec the checker returns for its file:
/// codegen forgets no field and writes none differently (a default, a variant, a float).
#[test]
fn generated_code_builds_the_checked_spec() {
    use agentry::Experiment;
    use compiled::*;
    let compiled: [(&str, &dyn Experiment); 14] = [
        ("ablations.arl", &Ablations),
        ("ablations_gpu.arl", &AblationsGpu),
        ("agentrl.arl", &Agentrl),
        ("agentrl_gpu.arl", &AgentrlGpu),
        ("custom_env.arl", &CustomEnv),
        ("monte_carlo_kg.arl", &MonteCarloKg),
        ("ppo_kg.arl", &PpoKg),
        ("quickstart.arl", &Quickstart),
        ("reinforce_pp_kg.arl", &ReinforcePpKg),
        ("rloo_kg.arl", &RlooKg),
        ("smollm2_lora.arl", &Smollm2Lora),
        ("smollm2_zero_shot.arl", &Smollm2ZeroShot),
        ("specialists.arl", &Specialists),
        ("specialists_gpu.arl", &SpecialistsGpu),
    ];
    let mut recipes: Vec<String> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/experiments"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.ends_with(".arl"))
            .collect();
    recipes.sort();
    let listed: Vec<&str> = compiled.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        recipes, listed,
        "every recipe is compiled here: add the new one to `compiled`"
    );
    for (name, experiment) in compiled {
        let path = format!("{}/experiments/{name}", env!("CARGO_MANIFEST_DIR"));
        let source = std::fs::read_to_string(&path).unwrap();
        let checked =
            agentry::dsl::check(&source).unwrap_or_else(|d| panic!("{}", d.render(name, &source)));
        assert_eq!(
            experiment.spec(),
            checked,
            "{name}: the generated spec differs from the checked one"
        );
    }
}
