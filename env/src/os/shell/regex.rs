//! `grep`'s matcher: a basic regular expression subset compiled to atoms and run as an
//! automaton, so that matching time is bounded by pattern length times line length.

use super::MAX_PATTERN;

/// One position of a pattern: a character, any character or a bracket class.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Atom {
    Any,
    Lit(char),
    Class(Vec<(char, char)>, bool),
}

impl Atom {
    fn accepts(&self, c: char) -> bool {
        match self {
            Atom::Any => true,
            Atom::Lit(l) => *l == c,
            Atom::Class(ranges, negated) => {
                ranges.iter().any(|(a, b)| (*a..=*b).contains(&c)) != *negated
            }
        }
    }
}

/// A basic regular expression subset: literals, `.`, `*` (after an atom), `[abc]`, `[a-z]`,
/// `[^...]`, `^` and `$` anchors and `\` escapes. Matching simulates the automaton, so it is
/// linear in the line length.
#[derive(Clone, Debug)]
pub(super) struct Regex {
    pub(super) atoms: Vec<(Atom, bool)>,
    start: bool,
    end: bool,
    ignore_case: bool,
}

impl Regex {
    pub(super) fn new(pattern: &str, fixed: bool, ignore_case: bool) -> Result<Regex, String> {
        let pattern = if ignore_case {
            pattern.to_lowercase()
        } else {
            pattern.to_string()
        };
        let mut atoms: Vec<(Atom, bool)> = Vec::new();
        let mut chars: Vec<char> = pattern.chars().collect();
        let mut start = false;
        let mut end = false;
        if !fixed {
            if chars.first() == Some(&'^') {
                start = true;
                chars.remove(0);
            }
            let escaped_dollar = chars.len() >= 2 && chars.get(chars.len() - 2) == Some(&'\\');
            if chars.last() == Some(&'$') && !escaped_dollar {
                end = true;
                chars.pop();
            }
        }
        let mut i = 0;
        while let Some(&c) = chars.get(i) {
            i += 1;
            if fixed {
                atoms.push((Atom::Lit(c), false));
                continue;
            }
            match c {
                '.' => atoms.push((Atom::Any, false)),
                '*' => match atoms.last_mut() {
                    Some((_, star)) => *star = true,
                    None => atoms.push((Atom::Lit('*'), false)),
                },
                '\\' => {
                    let n = chars.get(i).copied().unwrap_or('\\');
                    i += 1;
                    atoms.push((Atom::Lit(n), false));
                }
                '[' => {
                    let negated = chars.get(i) == Some(&'^');
                    if negated {
                        i += 1;
                    }
                    let mut ranges = Vec::new();
                    let mut first = true;
                    loop {
                        match chars.get(i) {
                            None => return Err("grep: Unmatched [, [^, [:, [., or [=".to_string()),
                            Some(']') if !first => {
                                i += 1;
                                break;
                            }
                            Some(&a) => {
                                if chars.get(i + 1) == Some(&'-')
                                    && chars.get(i + 2).is_some_and(|&b| b != ']')
                                {
                                    let b = chars.get(i + 2).copied().unwrap_or(a);
                                    ranges.push((a, b));
                                    i += 3;
                                } else {
                                    ranges.push((a, a));
                                    i += 1;
                                }
                            }
                        }
                        first = false;
                    }
                    atoms.push((Atom::Class(ranges, negated), false));
                }
                c => atoms.push((Atom::Lit(c), false)),
            }
            if atoms.len() > MAX_PATTERN {
                return Err("grep: pattern too long".to_string());
            }
        }
        if atoms.len() > MAX_PATTERN {
            return Err("grep: pattern too long".to_string());
        }
        Ok(Regex {
            atoms,
            start,
            end,
            ignore_case,
        })
    }

    fn closure(&self, set: &mut [bool]) {
        for i in 0..self.atoms.len() {
            if set.get(i) == Some(&true)
                && self.atoms.get(i).is_some_and(|(_, star)| *star)
                && let Some(next) = set.get_mut(i + 1)
            {
                *next = true;
            }
        }
    }

    pub(super) fn matches(&self, line: &str) -> bool {
        let m = self.atoms.len();
        let mut set = vec![false; m + 1];
        let mut next = vec![false; m + 1];
        let lowered;
        let line = if self.ignore_case {
            lowered = line.to_lowercase();
            lowered.as_str()
        } else {
            line
        };
        if let Some(s) = set.first_mut() {
            *s = true;
        }
        self.closure(&mut set);
        let accept = |set: &[bool]| set.get(m) == Some(&true);
        if accept(&set) && !self.end {
            return true;
        }
        for c in line.chars() {
            next.iter_mut().for_each(|x| *x = false);
            for (i, (atom, star)) in self.atoms.iter().enumerate() {
                if set.get(i) == Some(&true) && atom.accepts(c) {
                    let j = if *star { i } else { i + 1 };
                    if let Some(x) = next.get_mut(j) {
                        *x = true;
                    }
                }
            }
            if !self.start
                && let Some(x) = next.first_mut()
            {
                *x = true;
            }
            self.closure(&mut next);
            std::mem::swap(&mut set, &mut next);
            if accept(&set) && !self.end {
                return true;
            }
        }
        accept(&set)
    }
}

#[cfg(test)]
mod tests {
    use super::super::glob_match;
    use super::*;

    #[test]
    fn regex_subset() {
        let r = |p: &str, l: &str| Regex::new(p, false, false).unwrap().matches(l);
        assert!(r("^ab*c$", "ac"));
        assert!(r("^ab*c$", "abbbc"));
        assert!(!r("^ab*c$", "abbbcd"));
        assert!(r("b.d", "abcde"));
        assert!(r("[0-9][0-9]*", "x42"));
        assert!(!r("^[^a]", "abc"));
        assert!(r("a\\.b", "a.b"));
        assert!(!r("a\\.b", "axb"));
        assert!(r("", "anything"));
        assert!(
            Regex::new("ERROR", false, true)
                .unwrap()
                .matches("an error")
        );
        assert!(glob_match("*.t?t", "a.txt"));
        assert!(!glob_match("*.txt", "a.txt.bak"));
        assert!(glob_match("\\*", "*"));
    }
}
