//! The generated code of every recipe in `experiments/`, pretty-printed and snapshotted.
//!
//! One glob covers every file, so a new recipe is covered without a new test. Review changes
//! with `cargo insta review`.

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
