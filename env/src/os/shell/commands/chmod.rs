//! `chmod` and its octal and symbolic modes.

use super::super::{Out, Shell};
use crate::os::fs::{FsError, Node};

impl Shell {
    pub(super) fn chmod(&mut self, args: &[String], err: &mut Out) -> i32 {
        let mut recursive = false;
        let mut mode = None;
        let mut files = Vec::new();
        for a in args {
            if a == "-R" {
                recursive = true;
            } else if mode.is_none() {
                mode = Some(a.as_str());
            } else {
                files.push(a.as_str());
            }
        }
        let Some(mode) = mode else {
            err.line("chmod: missing operand");
            return 1;
        };
        if mode.starts_with('-') && parse_mode(mode, 0).is_none() {
            let c = mode.chars().nth(1).unwrap_or('-');
            err.line(&format!("chmod: invalid option -- '{c}'"));
            err.line("Try 'chmod --help' for more information.");
            return 1;
        }
        if parse_mode(mode, 0).is_none() {
            err.line(&format!("chmod: invalid mode: '{mode}'"));
            return 1;
        }
        if files.is_empty() {
            err.line(&format!("chmod: missing operand after '{mode}'"));
            return 1;
        }
        let mut status = 0;
        for f in files {
            let Ok(path) = self
                .path(f)
                .and_then(|p| self.fs.get(&p).map(|_| p.clone()).ok_or(FsError::NotFound))
            else {
                err.line(&format!(
                    "chmod: cannot access '{f}': No such file or directory"
                ));
                status = 1;
                continue;
            };
            let mut targets = vec![path.clone()];
            if recursive {
                targets.extend(self.fs.descendants(&path).map(|(p, _)| p.clone()));
            }
            for t in targets {
                let old = self.fs.get(&t).map_or(0, Node::mode);
                if let Some(new) = parse_mode(mode, old) {
                    // The path was just listed, so this cannot fail.
                    let _ = self.fs.chmod(&t, new);
                }
            }
        }
        status
    }
}

/// Applies a `chmod` mode to `old`: octal (`755`, `0644`) or symbolic (`+x`, `u+rw`, `go-w`,
/// `a=r`).
fn parse_mode(mode: &str, old: u16) -> Option<u16> {
    if !mode.is_empty() && mode.len() <= 4 && mode.chars().all(|c| ('0'..='7').contains(&c)) {
        return u16::from_str_radix(mode, 8).ok();
    }
    let op_at = mode.find(['+', '-', '='])?;
    let (who, rest) = mode.split_at(op_at);
    let mut chars = rest.chars();
    let op = chars.next()?;
    let perms: String = chars.collect();
    if perms.is_empty() || !perms.chars().all(|c| matches!(c, 'r' | 'w' | 'x')) {
        return None;
    }
    if !who.chars().all(|c| matches!(c, 'u' | 'g' | 'o' | 'a')) {
        return None;
    }
    let mut bits = 0u16;
    for p in perms.chars() {
        bits |= match p {
            'r' => 4,
            'w' => 2,
            _ => 1,
        };
    }
    let mut mask = 0u16;
    let who = if who.is_empty() { "a" } else { who };
    for w in who.chars() {
        mask |= match w {
            'u' => bits << 6,
            'g' => bits << 3,
            'o' => bits,
            _ => bits << 6 | bits << 3 | bits,
        };
    }
    Some(match op {
        '+' => old | mask,
        '-' => old & !mask,
        _ => {
            let mut clear = 0u16;
            for w in who.chars() {
                clear |= match w {
                    'u' => 0o700,
                    'g' => 0o070,
                    'o' => 0o007,
                    _ => 0o777,
                };
            }
            (old & !clear) | mask
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::super::run_fresh;
    use super::parse_mode;

    #[test]
    fn modes() {
        assert_eq!(parse_mode("755", 0), Some(0o755));
        assert_eq!(parse_mode("0644", 0o777), Some(0o644));
        assert_eq!(parse_mode("+x", 0o644), Some(0o755));
        assert_eq!(parse_mode("u+rw", 0), Some(0o600));
        assert_eq!(parse_mode("go-w", 0o777), Some(0o755));
        assert_eq!(parse_mode("a=r", 0o777), Some(0o444));
        assert_eq!(parse_mode("o=x", 0o777), Some(0o771));
        for bad in ["", "8", "12345", "u+", "u+rw,g+r", "z+x", "+s"] {
            assert_eq!(parse_mode(bad, 0), None, "{bad}");
        }
    }

    #[test]
    fn chmod() {
        assert_eq!(
            run_fresh(
                "chmod 600 /data/nums.txt; chmod a=r /data/t.csv; chmod +x /data/words.txt; ls -l /data"
            ),
            "-rw-r--r-- 1 user user   23 a.log\n-rw------- 1 user user    7 nums.txt\ndrwxr-xr-x 1 user user 4096 sub\n-r--r--r-- 1 user user   27 t.csv\n-rwxr-xr-x 1 user user   25 words.txt\n"
        );
        assert_eq!(
            run_fresh("chmod -R go-rwx /data; ls -l /data /data/sub"),
            "/data:\n-rw------- 1 user user   23 a.log\n-rw------- 1 user user    7 nums.txt\ndrwx------ 1 user user 4096 sub\n-rw------- 1 user user   27 t.csv\n-rw------- 1 user user   25 words.txt\n\n/data/sub:\n-rw------- 1 user user 8 b.log\n"
        );
    }

    #[test]
    fn chmod_errors() {
        assert_eq!(
            run_fresh("chmod; echo $?; chmod 755; echo $?; chmod xyz /data; echo $?"),
            "chmod: missing operand\n1\nchmod: missing operand after '755'\n1\nchmod: invalid mode: 'xyz'\n1\n"
        );
        assert_eq!(
            run_fresh("chmod -v /data; echo $?; chmod 644 /nope; echo $?"),
            "chmod: invalid option -- 'v'\nTry 'chmod --help' for more information.\n1\nchmod: cannot access '/nope': No such file or directory\n1\n"
        );
        assert_eq!(
            run_fresh("chmod u+x,g+r /data/a.log; echo $?"),
            "chmod: invalid mode: 'u+x,g+r'\n1\n"
        );
    }
}
