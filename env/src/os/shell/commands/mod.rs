//! The commands, one module a command or a small family, and the dispatch by name.

mod chmod;
mod files;
mod find;
mod grep;
pub(super) mod ls;
mod nav;
mod text;

use super::{Out, Shell};
use nav::echo;

impl Shell {
    /// Runs the command `name`; an unknown name is bash's `command not found`.
    pub(super) fn builtin(
        &mut self,
        name: &str,
        args: &[String],
        stdin: &str,
        out: &mut Out,
        err: &mut Out,
    ) -> i32 {
        match name {
            "cat" => self.cat(args, stdin, out, err),
            "cd" => self.cd(args, err),
            "chmod" => self.chmod(args, err),
            "cp" => self.cp_mv(true, args, err),
            "cut" => self.cut(args, stdin, out, err),
            "echo" => echo(args, out),
            "find" => self.find(args, out, err),
            "grep" => self.grep(args, stdin, out, err),
            "head" => self.head_tail(true, args, stdin, out, err),
            "ls" => self.ls(args, out, err),
            "mkdir" => self.mkdir(args, err),
            "mv" => self.cp_mv(false, args, err),
            "pwd" => self.pwd(out),
            "rm" => self.rm(args, err),
            "sort" => self.sort(args, stdin, out, err),
            "tail" => self.head_tail(false, args, stdin, out, err),
            "touch" => self.touch(args, err),
            "uniq" => self.uniq(args, stdin, out, err),
            "wc" => self.wc(args, stdin, out, err),
            _ if name.contains('/') => {
                match self.path(name).map(|p| self.fs.get(&p).is_some()) {
                    Ok(true) => err.line(&format!(
                        "bash: {name}: running programs is not supported in this sandbox"
                    )),
                    _ => err.line(&format!("bash: {name}: No such file or directory")),
                }
                127
            }
            _ => {
                err.line(&format!("bash: {name}: command not found"));
                127
            }
        }
    }
}

/// Splits leading and interleaved `-xyz` options from operands (`--` ends options). Unknown
/// options are reported bash-style and give `None`.
fn options<'a>(
    cmd: &str,
    args: &'a [String],
    allowed: &str,
    err: &mut Out,
) -> Option<(String, Vec<&'a str>)> {
    let mut flags = String::new();
    let mut operands = Vec::new();
    let mut done = false;
    for a in args {
        if !done && a == "--" {
            done = true;
        } else if !done && a.starts_with("--") {
            err.line(&format!("{cmd}: unrecognized option '{a}'"));
            err.line(&format!("Try '{cmd} --help' for more information."));
            return None;
        } else if !done && a.starts_with('-') && a.len() > 1 {
            for c in a.chars().skip(1) {
                if !allowed.contains(c) {
                    err.line(&format!("{cmd}: invalid option -- '{c}'"));
                    err.line(&format!("Try '{cmd} --help' for more information."));
                    return None;
                }
                flags.push(c);
            }
        } else {
            operands.push(a.as_str());
        }
    }
    Some((flags, operands))
}

#[cfg(test)]
mod tests {
    use super::super::Out;
    use super::options;

    #[test]
    fn options_split_flags_from_operands() {
        let args: Vec<String> = ["-la", "x", "-", "-1", "--", "-b"]
            .map(String::from)
            .to_vec();
        let mut err = Out::default();
        let (flags, operands) = options("ls", &args, "al1", &mut err).unwrap();
        assert_eq!((flags.as_str(), operands), ("la1", vec!["x", "-", "-b"]));
        assert_eq!(err.text, "");
        assert!(options("ls", &args, "l", &mut err).is_none());
        assert_eq!(
            err.text,
            "ls: invalid option -- 'a'\nTry 'ls --help' for more information.\n"
        );
    }
}
