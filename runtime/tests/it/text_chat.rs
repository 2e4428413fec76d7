//! Chat format: layout, agent mask, tool-call syntax.

use crate::common;
use agentry_env::{Reset, ToolCall};
use agentry_env::{parse_call, render_call};
use agentry_runtime::text::{ChatFormat, Special, Tokenizer};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn reset() -> Reset {
    Reset {
        instruction: "How many neighbors does #0 have?".to_string(),
        tools: common::kg_tools(),
    }
}

fn chat() -> ChatFormat {
    let call = ToolCall::new("count", [("variable", json!("#0"))]);
    let texts = ChatFormat::corpus_text(&reset(), &[(call, "#1, 3 entities".to_string())]);
    ChatFormat::new(Tokenizer::train(texts.iter().map(String::as_str), 400))
}

#[test]
fn system_line_is_compact() {
    assert_eq!(
        ChatFormat::system_text(&reset().tools),
        "get_neighbors(variable, relation) count(variable)"
    );
}

#[test]
fn transcript_layout_and_mask() {
    let chat = chat();
    let tok = chat.tokenizer();
    let mut t = chat.begin(&reset());
    assert!(t.agent_mask.iter().all(|m| !m));
    assert_eq!(
        tok.decode(&t.tokens),
        "<|system|>get_neighbors(variable, relation) count(variable)<|end|>\
         <|user|>How many neighbors does #0 have?<|end|><|assistant|>"
    );
    let call = ToolCall::new("count", [("variable", json!("#0"))]);
    let generated = chat.demo_turn(&call);
    assert_eq!(*generated.last().unwrap(), chat.end_token());
    assert_eq!(chat.end_token(), tok.special(Special::End));
    assert_eq!(chat.agent_text(&generated), "count(variable=\"#0\")");
    let before = t.len();
    chat.push_agent(&mut t, &generated);
    chat.push_observation(&mut t, "3");
    assert_eq!(t.tokens.len(), t.agent_mask.len());
    let agent: Vec<u32> = t
        .tokens
        .iter()
        .zip(&t.agent_mask)
        .filter(|(_, m)| **m)
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(agent, generated);
    assert!(
        t.agent_mask[before..before + generated.len()]
            .iter()
            .all(|m| *m)
    );
    assert!(
        tok.decode(&t.tokens)
            .ends_with("<|assistant|>count(variable=\"#0\")<|end|><|tool|>3<|end|><|assistant|>")
    );
    assert_eq!(parse_call(&chat.agent_text(&generated)).unwrap(), call);
}

#[test]
fn cut_off_turn_gets_an_unmasked_end() {
    let chat = chat();
    let mut t = chat.begin(&reset());
    let partial = chat.tokenizer().encode("count(vari");
    chat.push_agent(&mut t, &partial);
    chat.push_observation(&mut t, "Error");
    let agent = t.agent_mask.iter().filter(|m| **m).count();
    assert_eq!(agent, partial.len());
    assert!(
        chat.tokenizer()
            .decode(&t.tokens)
            .contains("count(vari<|end|><|tool|>Error")
    );
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<String>().prop_map(Value::String),
        any::<i64>().prop_map(|n| json!(n)),
        // Dyadic fractions: serde_json's default float parser is not exact for every f64.
        (-1_000_000i64..1_000_000).prop_map(|n| json!(n as f64 / 8.0)),
        any::<bool>().prop_map(Value::Bool),
        Just(Value::Null),
        prop::collection::vec(any::<String>().prop_map(Value::String), 0..4).prop_map(Value::Array),
    ]
}

proptest! {
    #[test]
    fn calls_roundtrip(
        name in "[a-zA-Z_][a-zA-Z0-9_]{0,12}",
        args in prop::collection::btree_map("[a-z_][a-z0-9_]{0,8}", json_leaf(), 0..4),
    ) {
        let call = ToolCall { name, arguments: args.into_iter().collect::<Map<_, _>>() };
        let text = render_call(&call);
        prop_assert_eq!(parse_call(&text), Ok(call));
    }

    #[test]
    fn parse_never_panics(s in any::<String>()) {
        let _ = parse_call(&s);
    }

    #[test]
    fn parse_never_panics_on_call_like_text(s in "[a-z_]{0,4}[ (]{0,2}[a-z=\"\\[\\]{},):\\\\ 0-9.-]{0,30}") {
        if let Err(e) = parse_call(&s) {
            prop_assert!(e.starts_with("Error:"));
        }
    }
}

#[test]
fn adversarial_calls() {
    let bad = [
        "",
        "   ",
        "(",
        ")",
        "count(",
        "count(variable",
        "count(variable=",
        "count(variable=\"#0)",
        "count(variable=\"#0\"",
        "count(variable=\"#0\"))",
        "count((variable=1))",
        "count(variable=[1, [2, 3)",
        "count(variable=]",
        "count(variable={\"a\": (1)})",
        "count(variable=1 2)",
        "count(variable=1,)",
        "count(variable=1, variable=2)",
        "count(variable=\"a\") count(variable=\"b\")",
        "count variable=1",
        "9count()",
        "count(\"#0\")",
        "count(variable='#0')",
        "count(variable=\"\\u12\")",
        "count(variable=tru)",
    ];
    for text in bad {
        let err = parse_call(text).expect_err(text);
        assert!(err.starts_with("Error:"), "{text}: {err}");
        assert!(err.len() < 200, "{text}: {err}");
    }
    assert!(
        parse_call("count")
            .unwrap_err()
            .contains("expected `(` after `count`")
    );
    let huge = format!("count(variable=\"{}\")", "x".repeat(1_000_000));
    assert_eq!(
        parse_call(&huge).unwrap().str_arg("variable").len(),
        1_000_000
    );
    let deep = format!(
        "count(variable={}{})",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert!(parse_call(&deep).is_err());
    let open = format!("count(variable={}", "[".repeat(100_000));
    assert!(parse_call(&open).is_err());
    assert!(parse_call(&"(".repeat(100_000)).is_err());
    // Whitespace and JSON escapes are fine.
    let call = parse_call(" answer ( xs = [\"a\\\"b\", \"c\"] , n = -2.5 , ok = null ) ").unwrap();
    assert_eq!(call.arguments["xs"], json!(["a\"b", "c"]));
    assert_eq!(call.arguments["n"], json!(-2.5));
    assert_eq!(call.arguments["ok"], Value::Null);
}
