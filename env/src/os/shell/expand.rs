//! Expansion when a command runs: variables (`$HOME $USER $PWD $SHELL $?`), then globs
//! against the file system. `~` was already replaced by the lexer.

use super::glob::{glob_match, has_wildcard, unescape};
use super::lex::Word;
use super::{HOME, MAX_ARGS, Shell, USER};
use crate::os::fs;

impl Shell {
    fn var(&self, name: &str) -> String {
        match name {
            "HOME" => HOME.to_string(),
            "USER" => USER.to_string(),
            "PWD" => self.cwd.clone(),
            "SHELL" => "/bin/bash".to_string(),
            "?" => self.status.to_string(),
            _ => String::new(),
        }
    }

    /// Expands a word: variables are substituted, then an unquoted glob becomes the sorted
    /// matching paths (or stays as written when nothing matches, as in bash). A word made only
    /// of unquoted variables that are empty disappears.
    pub(super) fn expand(&self, word: &Word, into: &mut Vec<String>) {
        let mut text = String::with_capacity(word.text.len());
        let mut pattern = String::with_capacity(word.pattern.len());
        let (mut t0, mut p0) = (0, 0);
        for (t, p, name) in &word.vars {
            text.push_str(word.text.get(t0..*t).unwrap_or_default());
            pattern.push_str(word.pattern.get(p0..*p).unwrap_or_default());
            let value = self.var(name);
            text.push_str(&value);
            for c in value.chars() {
                if matches!(c, '*' | '?' | '\\') {
                    pattern.push('\\');
                }
                pattern.push(c);
            }
            (t0, p0) = (*t, *p);
        }
        text.push_str(word.text.get(t0..).unwrap_or_default());
        pattern.push_str(word.pattern.get(p0..).unwrap_or_default());
        if text.is_empty() && !word.literal {
            return;
        }
        let found = if word.glob {
            self.glob(&pattern)
        } else {
            Vec::new()
        };
        if found.is_empty() {
            into.push(text);
        } else {
            into.extend(found);
        }
    }

    fn glob(&self, pattern: &str) -> Vec<String> {
        let mut candidates = vec![if pattern.starts_with('/') {
            "/".to_string()
        } else {
            String::new()
        }];
        for comp in pattern.split('/').filter(|c| !c.is_empty()) {
            let mut next = Vec::new();
            let wild = has_wildcard(comp);
            let literal = unescape(comp);
            for c in &candidates {
                let join = |name: &str| -> String {
                    if c.is_empty() {
                        name.to_string()
                    } else if c.ends_with('/') {
                        format!("{c}{name}")
                    } else {
                        format!("{c}/{name}")
                    }
                };
                if !wild {
                    next.push(join(&literal));
                    continue;
                }
                let dir = if c.is_empty() { "." } else { c.as_str() };
                let Ok(dir) = self.path(dir) else { continue };
                for (p, _) in self.fs.children(&dir) {
                    let name = fs::name(p);
                    if name.starts_with('.') && !comp.starts_with('.') {
                        continue;
                    }
                    if glob_match(comp, name) && next.len() < MAX_ARGS {
                        next.push(join(name));
                    }
                }
                if next.len() >= MAX_ARGS {
                    break;
                }
            }
            candidates = next;
        }
        candidates.retain(|c| self.path(c).is_ok_and(|p| self.fs.get(&p).is_some()));
        candidates.sort();
        candidates
    }
}

#[cfg(test)]
mod tests {
    use super::super::run_fresh;

    #[test]
    fn variables() {
        assert_eq!(
            run_fresh("cd /data; echo $HOME $USER $PWD $SHELL $?"),
            "/home/user user /data /bin/bash 0\n"
        );
        assert_eq!(
            run_fresh("ls /nope; echo $? $?"),
            "ls: cannot access '/nope': No such file or directory\n2 2\n"
        );
        assert_eq!(
            run_fresh("echo ${HOME}x ${USER} $ a $1x"),
            "/home/userx user $ a $1x\n"
        );
        assert_eq!(
            run_fresh(r#"echo '$HOME' "$HOME" \$HOME"#),
            "$HOME /home/user $HOME\n"
        );
        // `$?` is read when the command runs, not when the script is parsed.
        assert_eq!(
            run_fresh("echo $?; ls /nope 2>/dev/null; echo $?"),
            "0\n2\n"
        );
    }

    #[test]
    fn empty_unquoted_expansion_is_dropped() {
        assert_eq!(
            run_fresh(r#"echo $NOPE x; echo "$NOPE" x; echo ''x"#),
            "x\n x\nx\n"
        );
        assert_eq!(run_fresh("$NOPE; echo $?"), "0\n");
    }

    #[test]
    fn tilde() {
        assert_eq!(
            run_fresh(r#"echo ~ ~/a x~ '~' ~user "~""#),
            "/home/user /home/user/a x~ ~ ~user ~\n"
        );
        assert_eq!(run_fresh("cd /; cd ~; pwd"), "/home/user\n");
    }

    #[test]
    fn globs() {
        assert_eq!(
            run_fresh("cd /data; echo *.txt; echo *.log ?.log; echo /data/*/*.log"),
            "nums.txt words.txt\na.log a.log\n/data/sub/b.log\n"
        );
        assert_eq!(
            run_fresh("echo /data/*"),
            "/data/a.log /data/nums.txt /data/sub /data/t.csv /data/words.txt\n"
        );
        // Quoted wildcards and no match leave the word as written.
        assert_eq!(
            run_fresh(r#"cd /data; echo '*.log' "*".log \*.log nomatch*"#),
            "*.log *.log *.log nomatch*\n"
        );
        // Hidden names need a leading dot in the pattern.
        assert_eq!(run_fresh("touch .hidden; echo *; echo .*"), "*\n.hidden\n");
        // A variable's value is never a pattern; the rest of the word still is.
        assert_eq!(run_fresh("cd /data; echo $PWD/*.log"), "/data/a.log\n");
        assert_eq!(run_fresh("cd /data/sub; echo ../*.csv"), "../t.csv\n");
    }
}
