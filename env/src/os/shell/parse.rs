//! The parser: tokens become pipelines of commands joined by `;`, `&&` and `||`, with bash's
//! syntax errors and the sandbox's pipeline and script length limits.

use super::lex::{Redir, Tok, Word, syntax};
use super::{MAX_COMMANDS, MAX_PIPELINE};

/// One simple command: its words and redirections, not yet expanded.
#[derive(Debug, Default)]
pub(super) struct Cmd {
    pub(super) words: Vec<Word>,
    pub(super) redirs: Vec<(Redir, Word)>,
}

/// How a pipeline joins the one before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Link {
    Seq,
    And,
    Or,
}

/// Groups tokens into pipelines joined by `;`, `&&` and `||`.
pub(super) fn parse(toks: Vec<Tok>) -> Result<Vec<(Link, Vec<Cmd>)>, String> {
    let mut lines: Vec<(Link, Vec<Cmd>)> = Vec::new();
    let mut link = Link::Seq;
    let mut pipeline: Vec<Cmd> = Vec::new();
    let mut cmd = Cmd::default();
    let mut pending: Option<Redir> = None;
    let mut commands = 0usize;
    let mut dangling = false;
    for tok in toks {
        if let Some(r) = pending {
            match tok {
                Tok::Word(w) => {
                    cmd.redirs.push((r, w));
                    pending = None;
                    continue;
                }
                other => return Err(syntax(other.show())),
            }
        }
        match tok {
            Tok::Word(w) => cmd.words.push(w),
            Tok::Redir(Redir::ErrToOut) => cmd.redirs.push((Redir::ErrToOut, Word::default())),
            Tok::Redir(r) => pending = Some(r),
            Tok::Pipe | Tok::And | Tok::Or | Tok::Semi => {
                let empty = cmd.words.is_empty() && cmd.redirs.is_empty();
                if empty {
                    if !matches!(tok, Tok::Semi) || !pipeline.is_empty() || dangling {
                        return Err(syntax(tok.show()));
                    }
                    continue;
                }
                commands += 1;
                pipeline.push(std::mem::take(&mut cmd));
                if pipeline.len() > MAX_PIPELINE {
                    return Err(format!(
                        "bash: pipeline too long (at most {MAX_PIPELINE} commands in this sandbox)"
                    ));
                }
                if matches!(tok, Tok::Pipe) {
                    dangling = true;
                    continue;
                }
                lines.push((link, std::mem::take(&mut pipeline)));
                link = match tok {
                    Tok::And => Link::And,
                    Tok::Or => Link::Or,
                    _ => Link::Seq,
                };
                dangling = !matches!(tok, Tok::Semi);
            }
        }
        if commands > MAX_COMMANDS {
            return Err(format!(
                "bash: script too long (at most {MAX_COMMANDS} commands in this sandbox)"
            ));
        }
    }
    if pending.is_some() {
        return Err(syntax("newline"));
    }
    if cmd.words.is_empty() && cmd.redirs.is_empty() {
        if dangling {
            return Err("bash: syntax error: unexpected end of file".to_string());
        }
    } else {
        commands += 1;
        pipeline.push(cmd);
        if pipeline.len() > MAX_PIPELINE {
            return Err(format!(
                "bash: pipeline too long (at most {MAX_PIPELINE} commands in this sandbox)"
            ));
        }
        lines.push((link, pipeline));
    }
    if commands > MAX_COMMANDS {
        return Err(format!(
            "bash: script too long (at most {MAX_COMMANDS} commands in this sandbox)"
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::super::lex::lex;
    use super::*;

    /// Each pipeline as its link and its commands' words.
    fn lines(script: &str) -> Vec<(Link, Vec<Vec<String>>)> {
        lex(script)
            .and_then(parse)
            .unwrap()
            .into_iter()
            .map(|(link, cmds)| {
                let words = cmds
                    .iter()
                    .map(|c| c.words.iter().map(|w| w.text.clone()).collect())
                    .collect();
                (link, words)
            })
            .collect()
    }

    fn error(script: &str) -> String {
        lex(script).and_then(parse).unwrap_err()
    }

    #[test]
    fn pipes_and_links() {
        let w = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            lines("a x | b; c && d || e\nf"),
            [
                (Link::Seq, vec![w(&["a", "x"]), w(&["b"])]),
                (Link::Seq, vec![w(&["c"])]),
                (Link::And, vec![w(&["d"])]),
                (Link::Or, vec![w(&["e"])]),
                (Link::Seq, vec![w(&["f"])]),
            ]
        );
        // Empty commands between `;` and at the ends are skipped.
        assert_eq!(lines("; a ; ; b ;").len(), 2);
        assert!(lines("").is_empty());
    }

    #[test]
    fn redirections() {
        let parsed = lex("a > f 2>&1 < g 2>> h b").and_then(parse).unwrap();
        let [(_, cmds)] = parsed.as_slice() else {
            panic!("one pipeline")
        };
        let [cmd] = cmds.as_slice() else {
            panic!("one command")
        };
        let words: Vec<&str> = cmd.words.iter().map(|w| w.text.as_str()).collect();
        assert_eq!(words, ["a", "b"]);
        let redirs: Vec<(Redir, &str)> = cmd
            .redirs
            .iter()
            .map(|(r, w)| (*r, w.text.as_str()))
            .collect();
        assert_eq!(
            redirs,
            [
                (Redir::Out, "f"),
                (Redir::ErrToOut, ""),
                (Redir::In, "g"),
                (Redir::ErrAppend, "h")
            ]
        );
        // A command of redirections only is a command.
        assert_eq!(lines("> f").len(), 1);
    }

    #[test]
    fn syntax_errors() {
        let near = |t: &str| format!("bash: syntax error near unexpected token `{t}'");
        assert_eq!(error("| echo"), near("|"));
        assert_eq!(error("echo a | | b"), near("|"));
        assert_eq!(error("&& echo b"), near("&&"));
        assert_eq!(error("echo a || || b"), near("||"));
        assert_eq!(error("echo a | ; b"), near(";"));
        assert_eq!(error("echo a && ; b"), near(";"));
        assert_eq!(error("echo >"), near("newline"));
        assert_eq!(error("echo > | cat"), near("|"));
        assert_eq!(error("echo > >> f"), near(">>"));
        assert_eq!(
            error("echo a &&"),
            "bash: syntax error: unexpected end of file"
        );
        assert_eq!(
            error("echo a |"),
            "bash: syntax error: unexpected end of file"
        );
    }

    #[test]
    fn limits() {
        let pipe = |n: usize| vec!["a"; n].join(" | ");
        assert_eq!(lines(&pipe(MAX_PIPELINE)).len(), 1);
        let too_long = "bash: pipeline too long (at most 8 commands in this sandbox)";
        assert_eq!(error(&pipe(MAX_PIPELINE + 1)), too_long);
        assert_eq!(error(&format!("{} | a; b", pipe(MAX_PIPELINE))), too_long);
        let seq = |n: usize| vec!["a"; n].join("; ");
        assert_eq!(lines(&seq(MAX_COMMANDS)).len(), MAX_COMMANDS);
        let script_long = "bash: script too long (at most 32 commands in this sandbox)";
        assert_eq!(error(&seq(MAX_COMMANDS + 1)), script_long);
        assert_eq!(error(&format!("{}; a", seq(MAX_COMMANDS + 1))), script_long);
    }
}
