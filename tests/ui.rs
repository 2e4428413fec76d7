//! Build-time errors: every mistake in an experiment file fails the build with a message that
//! points into the file (`tests/ui/*.rs`, each beside its `.arl` and expected `.stderr`).

#[test]
fn experiment_files_with_mistakes_fail_to_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
