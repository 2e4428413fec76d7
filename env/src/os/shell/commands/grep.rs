//! `grep` over stdin, files or trees (`-r`), with the work it costs charged to the script.

use super::super::regex::Regex;
use super::super::{Out, Shell};
use super::options;
use crate::os::fs::Node;

impl Shell {
    pub(super) fn grep(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let Some((flags, operands)) = options("grep", args, "cinvlFrRh", err) else {
            return 2;
        };
        let Some((pattern, files)) = operands.split_first() else {
            err.line("Usage: grep [OPTION]... PATTERNS [FILE]...");
            return 2;
        };
        let ignore = flags.contains('i');
        let regex = match Regex::new(pattern, flags.contains('F'), ignore) {
            Ok(r) => r,
            Err(m) => {
                err.line(&m);
                return 2;
            }
        };
        let recursive = flags.contains('r') || flags.contains('R');
        let mut failed = false;
        let mut texts: Vec<(String, &str)> = Vec::new();
        if files.is_empty() {
            texts.push(("(standard input)".to_string(), stdin));
        }
        for &f in files {
            match self.path(f) {
                Ok(p) if recursive && self.fs.is_dir(&p) => {
                    let base = f.trim_end_matches('/');
                    for (q, n) in self.fs.descendants(&p) {
                        if let Node::File { content, .. } = n {
                            let rel = q.get(p.len()..).unwrap_or_default();
                            let rel = if p == "/" { q.as_str() } else { rel };
                            texts.push((format!("{base}{rel}"), content.as_str()));
                        }
                    }
                }
                Ok(p) => match self.fs.read(&p) {
                    Ok(t) => texts.push((f.to_string(), t)),
                    Err(e) => {
                        err.line(&format!("grep: {f}: {}", e.message()));
                        failed = true;
                    }
                },
                Err(e) => {
                    err.line(&format!("grep: {f}: {}", e.message()));
                    failed = true;
                }
            }
        }
        let bytes: usize = texts.iter().map(|(_, t)| t.len()).sum();
        let cost = bytes.saturating_mul(1 + regex.atoms.len() / 16);
        if !self.charge("grep", cost, err) {
            return 2;
        }
        let prefix = (files.len() > 1 || recursive) && !flags.contains('h');
        let invert = flags.contains('v');
        let mut any = false;
        for (name, text) in &texts {
            let mut count = 0;
            for (i, line) in text.lines().enumerate() {
                if regex.matches(line) == invert {
                    continue;
                }
                count += 1;
                any = true;
                if flags.contains('l') {
                    break;
                }
                if flags.contains('c') {
                    continue;
                }
                let mut s = String::new();
                if prefix {
                    s.push_str(name);
                    s.push(':');
                }
                if flags.contains('n') {
                    s.push_str(&format!("{}:", i + 1));
                }
                s.push_str(line);
                out.line(&s);
            }
            if flags.contains('l') {
                if count > 0 {
                    out.line(name);
                }
            } else if flags.contains('c') {
                if prefix {
                    out.line(&format!("{name}:{count}"));
                } else {
                    out.line(&count.to_string());
                }
            }
        }
        if failed {
            2
        } else if any {
            0
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::run_fresh;

    #[test]
    fn grep() {
        assert_eq!(
            run_fresh(
                "grep -n ERROR /data/a.log; grep -r ERROR /data; grep -c ERROR /data/a.log /data/sub/b.log"
            ),
            "1:ERROR x\n3:ERROR z\n/data/a.log:ERROR x\n/data/a.log:ERROR z\n/data/sub/b.log:ERROR q\n/data/a.log:2\n/data/sub/b.log:1\n"
        );
        assert_eq!(
            run_fresh(
                "grep -l ERROR /data/*.log /data/nums.txt; grep -i error /data/a.log; grep -v ERROR /data/a.log; grep -h ERROR /data/a.log /data/sub/b.log"
            ),
            "/data/a.log\nERROR x\nERROR z\nINFO y\nERROR x\nERROR z\nERROR q\n"
        );
        assert_eq!(
            run_fresh(
                "grep -rn q /data/sub; cat /data/a.log | grep -c INFO; grep -rl ERROR /data/"
            ),
            "/data/sub/b.log:1:ERROR q\n1\n/data/a.log\n/data/sub/b.log\n"
        );
        assert_eq!(
            run_fresh("grep '^ERROR' /data/a.log; grep 'y$' /data/a.log; grep 'R.O' /data/a.log"),
            "ERROR x\nERROR z\nINFO y\nERROR x\nERROR z\n"
        );
        assert_eq!(run_fresh("grep -F 'a.b' /data/t.csv; echo $?"), "1\n");
    }

    #[test]
    fn grep_errors() {
        assert_eq!(
            run_fresh("grep; echo $?; grep x /nope; echo $?; grep zzz /data/a.log; echo $?"),
            "Usage: grep [OPTION]... PATTERNS [FILE]...\n2\ngrep: /nope: No such file or directory\n2\n1\n"
        );
        assert_eq!(
            run_fresh("grep -z x; echo $?; grep x /data; echo $?; grep '[a' /data/a.log; echo $?"),
            "grep: invalid option -- 'z'\nTry 'grep --help' for more information.\n2\ngrep: /data: Is a directory\n2\ngrep: Unmatched [, [^, [:, [., or [=\n2\n"
        );
    }
}
