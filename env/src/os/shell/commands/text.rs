//! The text filters `cat`, `head`, `tail`, `wc`, `sort`, `uniq` and `cut`: each reads the
//! files named or stdin through one reader that charges the work budget.

use super::super::{Out, Shell};
use super::options;

impl Shell {
    /// Reads the inputs of a text command: the files named, or stdin when none (or `-`).
    /// Errors are reported as `cmd: NAME: message`; returns `(display name, text)` pairs and
    /// whether an error occurred.
    fn inputs<'a>(
        &'a self,
        cmd: &str,
        files: &[&str],
        stdin: &'a str,
        err: &mut Out,
    ) -> (Vec<(String, &'a str)>, bool) {
        if files.is_empty() {
            let ok = self.charge(cmd, stdin.len(), err);
            return (
                if ok {
                    vec![(String::new(), stdin)]
                } else {
                    Vec::new()
                },
                !ok,
            );
        }
        let mut failed = false;
        let mut texts = Vec::new();
        for &f in files {
            if f == "-" {
                if !self.charge(cmd, stdin.len(), err) {
                    return (texts, true);
                }
                texts.push(("(standard input)".to_string(), stdin));
                continue;
            }
            match self.path(f).and_then(|p| self.fs.read(&p)) {
                Ok(text) if !self.charge(cmd, text.len(), err) => return (texts, true),
                Ok(text) => texts.push((f.to_string(), text)),
                Err(e) => {
                    err.line(&format!("{cmd}: {f}: {}", e.message()));
                    failed = true;
                }
            }
        }
        (texts, failed)
    }

    pub(super) fn cat(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let Some((_, files)) = options("cat", args, "", err) else {
            return 1;
        };
        let (texts, failed) = self.inputs("cat", &files, stdin, err);
        for (_, t) in texts {
            out.push(t);
        }
        i32::from(failed)
    }

    pub(super) fn head_tail(
        &self,
        head: bool,
        args: &[String],
        stdin: &str,
        out: &mut Out,
        err: &mut Out,
    ) -> i32 {
        let cmd = if head { "head" } else { "tail" };
        let mut count: Option<&str> = None;
        let mut files = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "-n" {
                match it.next() {
                    Some(n) => count = Some(n),
                    None => {
                        err.line(&format!("{cmd}: option requires an argument -- 'n'"));
                        return 1;
                    }
                }
            } else if let Some(n) = a.strip_prefix("-n") {
                count = Some(n);
            } else if a.len() > 1
                && a.starts_with('-')
                && a.chars().skip(1).all(|c| c.is_ascii_digit())
            {
                count = a.get(1..);
            } else if a.starts_with('-') && a.len() > 1 {
                let c = a.chars().nth(1).unwrap_or('-');
                err.line(&format!("{cmd}: invalid option -- '{c}'"));
                err.line(&format!("Try '{cmd} --help' for more information."));
                return 1;
            } else {
                files.push(a.as_str());
            }
        }
        let (from_start, digits) = match count {
            None => (false, "10"),
            Some(n) if !head && n.starts_with('+') => (true, n.get(1..).unwrap_or_default()),
            Some(n) => (false, n),
        };
        let Ok(n) = digits.parse::<usize>() else {
            err.line(&format!(
                "{cmd}: invalid number of lines: '{}'",
                count.unwrap_or_default()
            ));
            return 1;
        };
        let (texts, failed) = self.inputs(cmd, &files, stdin, err);
        let many = texts.len() > 1;
        for (k, (name, text)) in texts.iter().enumerate() {
            if many {
                if k > 0 {
                    out.push("\n");
                }
                out.line(&format!("==> {name} <=="));
            }
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            let range = if head {
                0..n.min(lines.len())
            } else if from_start {
                n.saturating_sub(1).min(lines.len())..lines.len()
            } else {
                lines.len().saturating_sub(n)..lines.len()
            };
            for l in lines.get(range).unwrap_or_default() {
                out.push(l);
            }
        }
        i32::from(failed)
    }

    pub(super) fn wc(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let Some((flags, files)) = options("wc", args, "lwcm", err) else {
            return 1;
        };
        let mut which: Vec<usize> = [('l', 0), ('w', 1), ('c', 2)]
            .into_iter()
            .filter(|(f, _)| flags.contains(*f) || (*f == 'c' && flags.contains('m')))
            .map(|(_, i)| i)
            .collect();
        if which.is_empty() {
            which = vec![0, 1, 2];
        }
        let (texts, failed) = self.inputs("wc", &files, stdin, err);
        let mut rows: Vec<([usize; 3], String)> = texts
            .iter()
            .map(|(name, t)| {
                let counts = [
                    t.matches('\n').count(),
                    t.split_whitespace().count(),
                    t.len(),
                ];
                (counts, name.clone())
            })
            .collect();
        if rows.len() > 1 {
            let mut total = [0; 3];
            for (c, _) in &rows {
                for (t, x) in total.iter_mut().zip(c) {
                    *t += x;
                }
            }
            rows.push((total, "total".to_string()));
        }
        let single = rows.len() == 1 && which.len() == 1;
        let width = rows
            .iter()
            .flat_map(|(c, _)| which.iter().filter_map(|&i| c.get(i)))
            .map(|n| n.to_string().len())
            .max()
            .unwrap_or(1);
        for (counts, name) in rows {
            let numbers: Vec<String> = which
                .iter()
                .filter_map(|&i| counts.get(i))
                .map(|n| {
                    if single {
                        n.to_string()
                    } else {
                        format!("{n:>width$}")
                    }
                })
                .collect();
            let mut line = numbers.join(" ");
            if !name.is_empty() {
                line.push(' ');
                line.push_str(&name);
            }
            out.line(&line);
        }
        i32::from(failed)
    }

    pub(super) fn sort(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let Some((flags, files)) = options("sort", args, "nru", err) else {
            return 2;
        };
        let (texts, failed) = self.inputs("sort", &files, stdin, err);
        let mut lines: Vec<&str> = texts.iter().flat_map(|(_, t)| t.lines()).collect();
        let numeric = flags.contains('n');
        let key = |l: &str| -> f64 { if numeric { leading_number(l) } else { 0.0 } };
        lines.sort_by(|a, b| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.cmp(b))
        });
        if flags.contains('r') {
            lines.reverse();
        }
        if flags.contains('u') {
            lines.dedup_by(|a, b| if numeric { key(a) == key(b) } else { a == b });
        }
        for l in lines {
            out.line(l);
        }
        if failed { 2 } else { 0 }
    }

    pub(super) fn uniq(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let Some((flags, files)) = options("uniq", args, "cdu", err) else {
            return 1;
        };
        if files.len() > 1 {
            err.line("uniq: writing to an output file is not supported in this sandbox");
            return 1;
        }
        let (texts, failed) = self.inputs("uniq", &files, stdin, err);
        let mut groups: Vec<(usize, &str)> = Vec::new();
        for l in texts.iter().flat_map(|(_, t)| t.lines()) {
            match groups.last_mut() {
                Some((n, last)) if *last == l => *n += 1,
                _ => groups.push((1, l)),
            }
        }
        for (n, l) in groups {
            if (flags.contains('d') && n < 2) || (flags.contains('u') && n > 1) {
                continue;
            }
            if flags.contains('c') {
                out.line(&format!("{n:>7} {l}"));
            } else {
                out.line(l);
            }
        }
        i32::from(failed)
    }

    pub(super) fn cut(&self, args: &[String], stdin: &str, out: &mut Out, err: &mut Out) -> i32 {
        let mut delim: Option<&str> = None;
        let mut list: Option<&str> = None;
        let mut files = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (opt, attached) = match a.strip_prefix("-d").or_else(|| a.strip_prefix("-f")) {
                Some(rest) if a.starts_with("-d") => ('d', rest),
                Some(rest) => ('f', rest),
                None if a.starts_with('-') && a.len() > 1 => {
                    let c = a.chars().nth(1).unwrap_or('-');
                    err.line(&format!("cut: invalid option -- '{c}'"));
                    err.line("Try 'cut --help' for more information.");
                    return 1;
                }
                None => {
                    files.push(a.as_str());
                    continue;
                }
            };
            let value = if attached.is_empty() {
                match it.next() {
                    Some(v) => v.as_str(),
                    None => {
                        err.line(&format!("cut: option requires an argument -- '{opt}'"));
                        return 1;
                    }
                }
            } else {
                attached
            };
            if opt == 'd' {
                delim = Some(value);
            } else {
                list = Some(value);
            }
        }
        let Some(list) = list else {
            err.line("cut: you must specify a list of bytes, characters, or fields");
            return 1;
        };
        let delim = delim.unwrap_or("\t");
        let mut chars = delim.chars();
        let (Some(d), None) = (chars.next(), chars.next()) else {
            err.line("cut: the delimiter must be a single character");
            return 1;
        };
        let ranges = match parse_fields(list) {
            Ok(r) => r,
            Err(m) => {
                err.line(&m);
                return 1;
            }
        };
        let (texts, failed) = self.inputs("cut", &files, stdin, err);
        for l in texts.iter().flat_map(|(_, t)| t.lines()) {
            if !l.contains(d) {
                out.line(l);
                continue;
            }
            let picked: Vec<&str> = l
                .split(d)
                .enumerate()
                .filter(|(i, _)| ranges.iter().any(|(a, b)| (*a..=*b).contains(&(i + 1))))
                .map(|(_, f)| f)
                .collect();
            out.line(&picked.join(&d.to_string()));
        }
        i32::from(failed)
    }
}

/// `1`, `1,3`, `2-4`, `3-`, `-2` as inclusive 1-based ranges.
fn parse_fields(list: &str) -> Result<Vec<(usize, usize)>, String> {
    let bad = || format!("cut: invalid field value '{list}'");
    let mut out = Vec::new();
    for item in list.split(',') {
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (
                if a.is_empty() {
                    1
                } else {
                    a.parse().map_err(|_| bad())?
                },
                if b.is_empty() {
                    usize::MAX
                } else {
                    b.parse().map_err(|_| bad())?
                },
            ),
            None => {
                let n = item.parse().map_err(|_| bad())?;
                (n, n)
            }
        };
        if a == 0 || b == 0 {
            return Err("cut: fields are numbered from 1".to_string());
        }
        out.push((a, b));
    }
    Ok(out)
}

/// The number at the start of a line (after blanks), as `sort -n` reads it; 0 if none.
fn leading_number(line: &str) -> f64 {
    let s = line.trim_start();
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || (i == 0 && c == '-')))
        .map_or(s.len(), |(i, _)| i);
    s.get(..end).and_then(|n| n.parse().ok()).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::super::super::run_fresh;
    use super::{leading_number, parse_fields};

    #[test]
    fn fields_and_numbers() {
        assert_eq!(parse_fields("1,3"), Ok(vec![(1, 1), (3, 3)]));
        assert_eq!(
            parse_fields("2-4,3-,-2"),
            Ok(vec![(2, 4), (3, usize::MAX), (1, 2)])
        );
        assert_eq!(
            parse_fields("0"),
            Err("cut: fields are numbered from 1".to_string())
        );
        assert_eq!(
            parse_fields("1-x"),
            Err("cut: invalid field value '1-x'".to_string())
        );
        assert_eq!(leading_number("  12abc"), 12.0);
        assert_eq!(leading_number("-3.5x"), -3.5);
        assert_eq!(leading_number("x1"), 0.0);
    }

    #[test]
    fn cat() {
        assert_eq!(
            run_fresh("cat /data/nums.txt; echo hi | cat - /data/nums.txt"),
            "5\n12\n3\nhi\n5\n12\n3\n"
        );
    }

    #[test]
    fn cat_errors() {
        assert_eq!(
            run_fresh("cat /data/nope /data/nums.txt; echo $?"),
            "cat: /data/nope: No such file or directory\n5\n12\n3\n1\n"
        );
        assert_eq!(
            run_fresh("cat /data; echo $?"),
            "cat: /data: Is a directory\n1\n"
        );
        assert_eq!(
            run_fresh("cat -n /data/nums.txt; echo $?"),
            "cat: invalid option -- 'n'\nTry 'cat --help' for more information.\n1\n"
        );
    }

    #[test]
    fn head() {
        assert_eq!(
            run_fresh("head -n 2 /data/nums.txt; head -1 /data/nums.txt; echo a | head"),
            "5\n12\n5\na\n"
        );
        assert_eq!(
            run_fresh("head -n1 /data/nums.txt /data/a.log"),
            "==> /data/nums.txt <==\n5\n\n==> /data/a.log <==\nERROR x\n"
        );
    }

    #[test]
    fn head_errors() {
        assert_eq!(
            run_fresh("head -n x /data/nums.txt; echo $?; head -n; echo $?"),
            "head: invalid number of lines: 'x'\n1\nhead: option requires an argument -- 'n'\n1\n"
        );
        assert_eq!(
            run_fresh("head -q; echo $?; head /nope; echo $?"),
            "head: invalid option -- 'q'\nTry 'head --help' for more information.\n1\nhead: /nope: No such file or directory\n1\n"
        );
    }

    #[test]
    fn tail() {
        assert_eq!(
            run_fresh(
                "tail -n 1 /data/nums.txt; tail -n +2 /data/nums.txt; tail -2 /data/nums.txt; echo a | tail"
            ),
            "3\n12\n3\n12\n3\na\n"
        );
        assert_eq!(
            run_fresh("tail -n 1 /data/nums.txt /data/a.log"),
            "==> /data/nums.txt <==\n3\n\n==> /data/a.log <==\nERROR z\n"
        );
    }

    #[test]
    fn tail_errors() {
        assert_eq!(
            run_fresh(
                "tail -n +x /data/nums.txt; echo $?; tail /nope; echo $?; tail -f x; echo $?"
            ),
            "tail: invalid number of lines: '+x'\n1\ntail: /nope: No such file or directory\n1\ntail: invalid option -- 'f'\nTry 'tail --help' for more information.\n1\n"
        );
    }

    #[test]
    fn wc() {
        assert_eq!(
            run_fresh("wc /data/nums.txt; wc -l -w /data/nums.txt; wc -m /data/t.csv"),
            "3 3 7 /data/nums.txt\n3 3 /data/nums.txt\n27 /data/t.csv\n"
        );
        assert_eq!(
            run_fresh("wc -c /data/nums.txt /data/a.log; echo a b | wc; echo a b | wc -w"),
            " 7 /data/nums.txt\n23 /data/a.log\n30 total\n1 2 4\n2\n"
        );
    }

    #[test]
    fn wc_errors() {
        assert_eq!(
            run_fresh("wc /nope; echo $?; wc /nope /data/nums.txt; echo $?; wc -x; echo $?"),
            "wc: /nope: No such file or directory\n1\nwc: /nope: No such file or directory\n3 3 7 /data/nums.txt\n1\nwc: invalid option -- 'x'\nTry 'wc --help' for more information.\n1\n"
        );
    }

    #[test]
    fn sort() {
        assert_eq!(
            run_fresh("sort /data/words.txt; sort -n /data/nums.txt; sort /data/nums.txt"),
            "apple\nfig\npear\npear\npear\n3\n5\n12\n12\n3\n5\n"
        );
        assert_eq!(
            run_fresh(
                "sort -r /data/words.txt; sort -u /data/words.txt; sort -nu /data/nums.txt /data/nums.txt"
            ),
            "pear\npear\npear\nfig\napple\napple\nfig\npear\n3\n5\n12\n"
        );
    }

    #[test]
    fn sort_errors() {
        assert_eq!(
            run_fresh("sort /nope; echo $?; sort -x; echo $?"),
            "sort: /nope: No such file or directory\n2\nsort: invalid option -- 'x'\nTry 'sort --help' for more information.\n2\n"
        );
    }

    #[test]
    fn uniq() {
        assert_eq!(
            run_fresh("uniq /data/words.txt; sort /data/words.txt | uniq"),
            "pear\napple\npear\nfig\napple\nfig\npear\n"
        );
        assert_eq!(
            run_fresh(
                "sort /data/words.txt | uniq -c; sort /data/words.txt | uniq -d; sort /data/words.txt | uniq -u"
            ),
            "      1 apple\n      1 fig\n      3 pear\npear\napple\nfig\n"
        );
    }

    #[test]
    fn uniq_errors() {
        assert_eq!(
            run_fresh("uniq a b; echo $?; uniq /nope; echo $?; uniq -x; echo $?"),
            "uniq: writing to an output file is not supported in this sandbox\n1\nuniq: /nope: No such file or directory\n1\nuniq: invalid option -- 'x'\nTry 'uniq --help' for more information.\n1\n"
        );
    }

    #[test]
    fn cut() {
        assert_eq!(
            run_fresh(
                "cut -d , -f 2 /data/t.csv; cut -d, -f1,3 /data/t.csv; cut -f2- -d , /data/t.csv"
            ),
            "name\nab\ncd\nid,qty\n1,3\n2,10\nname,qty\nab,3\ncd,10\n"
        );
        // A line without the delimiter is printed whole.
        assert_eq!(
            run_fresh("cut -d , -f -1 /data/t.csv; echo 'a b' | cut -f 2"),
            "id\n1\n2\na b\n"
        );
    }

    #[test]
    fn cut_errors() {
        assert_eq!(
            run_fresh(
                "cut -d , /data/t.csv; echo $?; cut -f 0 /data/t.csv; echo $?; cut -f x /data/t.csv; echo $?"
            ),
            "cut: you must specify a list of bytes, characters, or fields\n1\ncut: fields are numbered from 1\n1\ncut: invalid field value 'x'\n1\n"
        );
        assert_eq!(
            run_fresh(
                "cut -d ab -f 1 /data/t.csv; echo $?; cut -z; echo $?; cut -f; echo $?; cut -f 1 /nope; echo $?"
            ),
            "cut: the delimiter must be a single character\n1\ncut: invalid option -- 'z'\nTry 'cut --help' for more information.\n1\ncut: option requires an argument -- 'f'\n1\ncut: /nope: No such file or directory\n1\n"
        );
    }
}
