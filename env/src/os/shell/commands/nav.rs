//! `cd`, `pwd` and `echo`: the commands about where the shell is and what it says.

use super::super::{HOME, Out, Shell};
use crate::os::fs::FsError;

impl Shell {
    pub(super) fn cd(&mut self, args: &[String], err: &mut Out) -> i32 {
        let target = match args {
            [] => HOME,
            [one] => one.as_str(),
            _ => {
                err.line("bash: cd: too many arguments");
                return 1;
            }
        };
        match self.path(target) {
            Ok(p) if self.fs.is_dir(&p) => {
                self.cwd = p;
                0
            }
            Ok(p) => {
                let e = if self.fs.get(&p).is_some() {
                    FsError::NotDir
                } else {
                    FsError::NotFound
                };
                err.line(&format!("bash: cd: {target}: {}", e.message()));
                1
            }
            Err(e) => {
                err.line(&format!("bash: cd: {target}: {}", e.message()));
                1
            }
        }
    }

    pub(super) fn pwd(&self, out: &mut Out) -> i32 {
        out.line(&self.cwd);
        0
    }
}

pub(super) fn echo(args: &[String], out: &mut Out) -> i32 {
    let mut newline = true;
    let mut rest = args;
    while let Some((first, tail)) = rest.split_first() {
        if first.len() > 1
            && first.starts_with('-')
            && first.chars().skip(1).all(|c| matches!(c, 'n' | 'e' | 'E'))
        {
            if first.contains('n') {
                newline = false;
            }
            rest = tail;
        } else {
            break;
        }
    }
    out.push(&rest.join(" "));
    if newline {
        out.push("\n");
    }
    0
}

#[cfg(test)]
mod tests {
    use super::super::super::{run_fresh, test_shell};

    #[test]
    fn cd() {
        assert_eq!(
            run_fresh("cd /data/sub; pwd; cd ..; pwd; cd; pwd; cd ~; pwd; cd /; pwd"),
            "/data/sub\n/data\n/home/user\n/home/user\n/\n"
        );
        let mut sh = test_shell();
        assert_eq!(sh.run("cd /data/sub"), "");
        assert_eq!(sh.cwd(), "/data/sub");
    }

    #[test]
    fn cd_errors() {
        assert_eq!(
            run_fresh("cd a b; echo $?"),
            "bash: cd: too many arguments\n1\n"
        );
        assert_eq!(
            run_fresh("cd /data/nums.txt; echo $?"),
            "bash: cd: /data/nums.txt: Not a directory\n1\n"
        );
        assert_eq!(
            run_fresh("cd /nope/x; echo $?; pwd"),
            "bash: cd: /nope/x: No such file or directory\n1\n/home/user\n"
        );
    }

    #[test]
    fn pwd() {
        assert_eq!(
            run_fresh("pwd; cd /data; pwd; pwd extra"),
            "/home/user\n/data\n/data\n"
        );
        // `pwd` cannot fail; its output can.
        assert_eq!(
            run_fresh("pwd > /nope/f; echo $?"),
            "bash: /nope/f: No such file or directory\n1\n"
        );
    }

    #[test]
    fn echo() {
        assert_eq!(
            run_fresh("echo -n a b; echo; echo -e 'x\\ty'; echo -x; echo -nE c; echo -- d; echo"),
            "a b\nx\\ty\n-x\nc-- d\n\n"
        );
        // `echo` cannot fail; its output can.
        assert_eq!(
            run_fresh("echo x > /nope/f; echo $?"),
            "bash: /nope/f: No such file or directory\n1\n"
        );
    }
}
