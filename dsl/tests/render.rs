//! The rendered report: the exact shape a researcher sees.

mod common;

use agentry_dsl::check;

#[test]
fn renders_an_unknown_key_like_rustc() {
    let source = "\
experiment bad {
    model policy { arch = transformer }
    task kg { env = kg }
    train { steps = 100, batch = 16 }
    algorithm grpo {
        group_sise = 8
    }
}
";
    let report = check(source)
        .unwrap_err()
        .render("experiments/bad.arl", source);
    let expected = "\
error: unknown key `group_sise` in `algorithm`
 --> experiments/bad.arl:6:9
  |
6 |         group_sise = 8
  |         ^^^^^^^^^^ unknown key
  |
  = hint: did you mean `group_size`?

error: could not check `experiments/bad.arl` (1 error)
";
    assert_eq!(report, expected);
}

#[test]
fn renders_every_error_separated_by_a_blank_line() {
    let source = "experiment e {\n    seed = \"7\"\n    device = gpu\n}\n";
    let report = check(source).unwrap_err().render("e.arl", source);
    assert!(report.contains("e.arl:2:12"), "{report}");
    assert!(report.contains("e.arl:3:14"), "{report}");
    assert!(
        report.contains("\n\nerror: unknown value `gpu` for `device`"),
        "{report}"
    );
    assert!(
        report.ends_with("error: could not check `e.arl` (6 errors)\n"),
        "{report}"
    );
}

#[test]
fn renders_a_syntax_error_at_end_of_file() {
    let source = "experiment e {\n    seed =";
    let report = agentry_dsl::parse(source)
        .unwrap_err()
        .render("e.arl", source);
    assert!(
        report.starts_with("error: unclosed `{`\n --> e.arl:1:14\n"),
        "{report}"
    );
}
