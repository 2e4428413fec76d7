//! Shell wildcards (`*`, `?`, `\c`) on names, shared by glob expansion and `find -name`.

pub(super) fn has_wildcard(pattern: &str) -> bool {
    let mut escaped = false;
    for c in pattern.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '*' | '?' => return true,
            _ => {}
        }
    }
    false
}

pub(super) fn unescape(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    let mut escaped = false;
    for c in pattern.chars() {
        if c == '\\' && !escaped {
            escaped = true;
        } else {
            out.push(c);
            escaped = false;
        }
    }
    out
}

/// Shell wildcard matching of a whole name: `*` any run, `?` one character, `\c` a literal.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum P {
        Star,
        One,
        Lit(char),
    }
    let mut pat = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        pat.push(match c {
            '*' => P::Star,
            '?' => P::One,
            '\\' => P::Lit(chars.next().unwrap_or('\\')),
            c => P::Lit(c),
        });
    }
    let text: Vec<char> = name.chars().collect();
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match (pat.get(p), text.get(t)) {
            (Some(P::Star), _) => {
                star = Some((p, t));
                p += 1;
            }
            (Some(P::One), Some(_)) => {
                p += 1;
                t += 1;
            }
            (Some(P::Lit(a)), Some(b)) if a == b => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pat.get(p..)
        .is_some_and(|rest| rest.iter().all(|x| *x == P::Star))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching() {
        assert!(glob_match("*.t?t", "a.txt"));
        assert!(!glob_match("*.txt", "a.txt.bak"));
        assert!(glob_match("*", "") && glob_match("a*b*c", "aXbYbc"));
        assert!(!glob_match("?", "") && glob_match("?", "é"));
        assert!(glob_match("\\*", "*") && !glob_match("\\*", "a"));
        assert!(!glob_match("a", "ab") && !glob_match("ab", "a"));
    }

    #[test]
    fn escapes() {
        assert!(has_wildcard("a*") && has_wildcard("\\\\?"));
        assert!(!has_wildcard("a\\*b\\?") && !has_wildcard("plain"));
        assert_eq!(unescape("a\\*b\\\\c"), "a*b\\c");
    }
}
