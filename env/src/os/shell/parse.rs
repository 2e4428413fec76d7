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
