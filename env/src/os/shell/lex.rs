//! The lexer: a script becomes words (quotes removed, variables recorded for later) and
//! operators, so that the parser never sees a quote or a backslash.

use super::HOME;

/// A word after quote removal; `pattern` keeps quoted glob characters escaped with `\`.
/// Variables are substituted when the command runs, at the recorded byte offsets.
#[derive(Clone, Debug, Default)]
pub(super) struct Word {
    pub(super) text: String,
    pub(super) pattern: String,
    pub(super) glob: bool,
    started: bool,
    quoted: bool,
    /// Whether the word has a character or quotes of its own (else an empty expansion drops it).
    pub(super) literal: bool,
    /// `(offset in text, offset in pattern, name)` of each variable reference.
    pub(super) vars: Vec<(usize, usize, String)>,
}

impl Word {
    fn plain(&mut self, c: char) {
        self.started = true;
        self.literal = true;
        self.text.push(c);
        if c == '\\' {
            self.pattern.push('\\');
        }
        self.pattern.push(c);
        if matches!(c, '*' | '?') {
            self.glob = true;
        }
    }

    fn quoted(&mut self, c: char) {
        self.started = true;
        self.quoted = true;
        self.literal = true;
        self.text.push(c);
        if matches!(c, '*' | '?' | '\\') {
            self.pattern.push('\\');
        }
        self.pattern.push(c);
    }

    fn quoted_str(&mut self, s: &str) {
        self.started = true;
        self.quoted = true;
        self.literal = true;
        for c in s.chars() {
            self.quoted(c);
        }
    }

    fn var(&mut self, name: String) {
        self.started = true;
        self.quoted = true;
        self.vars.push((self.text.len(), self.pattern.len(), name));
    }
}

/// A redirection operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Redir {
    Out,
    Append,
    In,
    Err,
    ErrAppend,
    ErrToOut,
}

/// A token: a word or an operator.
#[derive(Debug)]
pub(super) enum Tok {
    Word(Word),
    Pipe,
    And,
    Or,
    Semi,
    Redir(Redir),
}

impl Tok {
    /// The token as bash names it in a syntax error.
    pub(super) fn show(&self) -> &'static str {
        match self {
            Tok::Word(_) => "word",
            Tok::Pipe => "|",
            Tok::And => "&&",
            Tok::Or => "||",
            Tok::Semi => ";",
            Tok::Redir(Redir::Out) => ">",
            Tok::Redir(Redir::Append) => ">>",
            Tok::Redir(Redir::In) => "<",
            Tok::Redir(Redir::Err) => "2>",
            Tok::Redir(Redir::ErrAppend) => "2>>",
            Tok::Redir(Redir::ErrToOut) => "2>&1",
        }
    }
}

/// Bash's message for a token where it cannot be.
pub(super) fn syntax(token: &str) -> String {
    format!("bash: syntax error near unexpected token `{token}'")
}

/// Splits a script into tokens, removing quotes and recording variable references.
pub(super) fn lex(script: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = script.chars().collect();
    let mut toks = Vec::new();
    let mut word = Word::default();
    let mut i = 0;
    fn flush(word: &mut Word, toks: &mut Vec<Tok>) {
        if word.started {
            toks.push(Tok::Word(std::mem::take(word)));
        }
    }
    while let Some(&c) = chars.get(i) {
        let next = chars.get(i + 1).copied();
        i += 1;
        match c {
            ' ' | '\t' | '\r' => flush(&mut word, &mut toks),
            '\n' | ';' => {
                flush(&mut word, &mut toks);
                toks.push(Tok::Semi);
            }
            '#' if !word.started => {
                while chars.get(i).is_some_and(|&c| c != '\n') {
                    i += 1;
                }
            }
            '|' => {
                flush(&mut word, &mut toks);
                if next == Some('|') {
                    i += 1;
                    toks.push(Tok::Or);
                } else {
                    toks.push(Tok::Pipe);
                }
            }
            '&' => {
                flush(&mut word, &mut toks);
                if next == Some('&') {
                    i += 1;
                    toks.push(Tok::And);
                } else {
                    return Err(
                        "bash: background jobs (&) are not supported in this sandbox".to_string(),
                    );
                }
            }
            '>' => {
                let stderr = word.started && !word.quoted && word.text == "2";
                if stderr {
                    word = Word::default();
                } else {
                    flush(&mut word, &mut toks);
                }
                let append = next == Some('>');
                if append {
                    i += 1;
                }
                let redir = match (stderr, append) {
                    (true, false)
                        if chars.get(i) == Some(&'&') && chars.get(i + 1) == Some(&'1') =>
                    {
                        i += 2;
                        Redir::ErrToOut
                    }
                    (true, false) => Redir::Err,
                    (true, true) => Redir::ErrAppend,
                    (false, false) => Redir::Out,
                    (false, true) => Redir::Append,
                };
                toks.push(Tok::Redir(redir));
            }
            '<' => {
                flush(&mut word, &mut toks);
                toks.push(Tok::Redir(Redir::In));
            }
            '(' | ')' if !word.started => return Err(syntax(&c.to_string())),
            '`' => {
                return Err(
                    "bash: command substitution is not supported in this sandbox".to_string(),
                );
            }
            '\'' => {
                word.started = true;
                word.quoted = true;
                word.literal = true;
                loop {
                    match chars.get(i) {
                        None => {
                            return Err(
                                "bash: unexpected EOF while looking for matching `''".to_string()
                            );
                        }
                        Some('\'') => {
                            i += 1;
                            break;
                        }
                        Some(&c) => {
                            word.quoted(c);
                            i += 1;
                        }
                    }
                }
            }
            '"' => {
                word.started = true;
                word.quoted = true;
                word.literal = true;
                loop {
                    match chars.get(i) {
                        None => {
                            return Err(
                                "bash: unexpected EOF while looking for matching `\"'".to_string()
                            );
                        }
                        Some('"') => {
                            i += 1;
                            break;
                        }
                        Some('\\')
                            if chars
                                .get(i + 1)
                                .is_some_and(|c| matches!(c, '$' | '`' | '"' | '\\')) =>
                        {
                            if let Some(&c) = chars.get(i + 1) {
                                word.quoted(c);
                            }
                            i += 2;
                        }
                        Some('$') => match dollar(&chars, i + 1) {
                            Some((name, j)) => {
                                word.var(name);
                                i = j;
                            }
                            None => {
                                word.quoted('$');
                                i += 1;
                            }
                        },
                        Some('`') => {
                            return Err(
                                "bash: command substitution is not supported in this sandbox"
                                    .to_string(),
                            );
                        }
                        Some(&c) => {
                            word.quoted(c);
                            i += 1;
                        }
                    }
                }
            }
            '\\' => match next {
                Some('\n') => i += 1,
                Some(n) => {
                    word.quoted(n);
                    i += 1;
                }
                None => word.quoted('\\'),
            },
            '$' if next == Some('(') => {
                return Err(
                    "bash: command substitution is not supported in this sandbox".to_string(),
                );
            }
            '$' => match dollar(&chars, i) {
                Some((name, j)) => {
                    word.var(name);
                    i = j;
                }
                None => word.plain('$'),
            },
            '~' if !word.started
                && next.is_none_or(|n| {
                    n == '/' || n.is_whitespace() || matches!(n, ';' | '|' | '&' | '>' | '<')
                }) =>
            {
                word.quoted_str(HOME);
            }
            c => word.plain(c),
        }
    }
    flush(&mut word, &mut toks);
    Ok(toks)
}

/// Reads `$NAME`, `${NAME}` or `$?` at `chars[i]` (just after the `$`); returns the name and
/// the index after it, or `None` for a lone `$`.
fn dollar(chars: &[char], i: usize) -> Option<(String, usize)> {
    match chars.get(i) {
        Some('?') => Some(("?".to_string(), i + 1)),
        Some('{') => {
            let end = chars.get(i + 1..)?.iter().position(|&c| c == '}')? + i + 1;
            let name: String = chars.get(i + 1..end)?.iter().collect();
            Some((name, end + 1))
        }
        Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
            let mut j = i;
            while chars
                .get(j)
                .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
            {
                j += 1;
            }
            let name: String = chars.get(i..j)?.iter().collect();
            Some((name, j))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each token as a string: a word's text, or the operator.
    fn toks(script: &str) -> Vec<String> {
        lex(script)
            .unwrap()
            .iter()
            .map(|t| match t {
                Tok::Word(w) => w.text.clone(),
                t => t.show().to_string(),
            })
            .collect()
    }

    fn word(script: &str) -> Word {
        match lex(script).unwrap().pop() {
            Some(Tok::Word(w)) => w,
            other => panic!("not a word: {other:?}"),
        }
    }

    #[test]
    fn operators() {
        assert_eq!(
            toks("a|b&&c||d;e\nf"),
            ["a", "|", "b", "&&", "c", "||", "d", ";", "e", ";", "f"]
        );
        assert_eq!(
            toks("a >f >>g <h 2>i 2>>j 2>&1"),
            [
                "a", ">", "f", ">>", "g", "<", "h", "2>", "i", "2>>", "j", "2>&1"
            ]
        );
        // Only a bare unquoted `2` right before `>` names stderr.
        assert_eq!(toks("x2>f '2'>g"), ["x2", ">", "f", "2", ">", "g"]);
        assert_eq!(toks("a &&b"), ["a", "&&", "b"]);
    }

    #[test]
    fn quoting_and_escapes() {
        assert_eq!(toks(r#"'a  b' "c  d" e\ f"#), ["a  b", "c  d", "e f"]);
        assert_eq!(
            toks(r#""a\"b\\c\$d\e" 'x\y' a\"b"#),
            [r#"a"b\c$d\e"#, r"x\y", r#"a"b"#]
        );
        assert_eq!(toks("a\\\nb"), ["ab"]);
        assert_eq!(toks("a\\"), ["a\\"]);
        assert_eq!(toks("'' \"\""), ["", ""]);
        // Quoted glob characters are escaped in the pattern and do not make a glob.
        let w = word("'*'.t?t");
        assert_eq!(
            (w.text.as_str(), w.pattern.as_str(), w.glob),
            ("*.t?t", "\\*.t?t", true)
        );
        let w = word("\"*\"");
        assert_eq!((w.pattern.as_str(), w.glob), ("\\*", false));
    }

    #[test]
    fn variables_are_recorded_not_expanded() {
        let w = word(r#"a"$HOME/${USER}x"$?'$PWD'"#);
        assert_eq!(w.text, "a/x$PWD");
        let names: Vec<(usize, &str)> = w.vars.iter().map(|(t, _, n)| (*t, n.as_str())).collect();
        assert_eq!(names, [(1, "HOME"), (2, "USER"), (3, "?")]);
        // A lone `$` is a character.
        assert_eq!(toks("$ a$ \"$\""), ["$", "a$", "$"]);
        let w = word("$NOPE");
        assert!(!w.literal && w.text.is_empty());
    }

    #[test]
    fn comments_and_tilde() {
        assert_eq!(toks("echo a # b c"), ["echo", "a"]);
        assert_eq!(toks("echo a#b #c\nx"), ["echo", "a#b", ";", "x"]);
        assert_eq!(toks("# only"), Vec::<String>::new());
        assert_eq!(
            toks("~ ~/a x~ ~user '~' ~;"),
            [HOME, "/home/user/a", "x~", "~user", "~", HOME, ";"]
        );
    }

    #[test]
    fn errors() {
        let err = |s: &str| lex(s).unwrap_err();
        assert_eq!(
            err("echo 'a"),
            "bash: unexpected EOF while looking for matching `''"
        );
        assert_eq!(
            err("echo \"a"),
            "bash: unexpected EOF while looking for matching `\"'"
        );
        assert_eq!(
            err("sleep 1 &"),
            "bash: background jobs (&) are not supported in this sandbox"
        );
        let subst = "bash: command substitution is not supported in this sandbox";
        assert_eq!(err("echo $(ls)"), subst);
        assert_eq!(err("echo `ls`"), subst);
        assert_eq!(err("echo \"`ls`\""), subst);
        assert_eq!(err("(ls)"), "bash: syntax error near unexpected token `('");
        assert_eq!(toks("a(b)"), ["a(b)"]);
    }
}
