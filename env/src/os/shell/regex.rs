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
    use super::*;

    fn m(pattern: &str, line: &str) -> bool {
        Regex::new(pattern, false, false).unwrap().matches(line)
    }

    #[test]
    fn anchors() {
        assert!(m("^ab*c$", "ac"));
        assert!(m("^ab*c$", "abbbc"));
        assert!(!m("^ab*c$", "abbbcd"));
        assert!(m("^ab", "abc") && !m("^ab", "cab"));
        assert!(m("bc$", "abc") && !m("bc$", "bca"));
        assert!(m("^$", "") && !m("^$", "a"));
        assert!(m("", "anything"));
        // `^` elsewhere and an escaped final `$` are literals.
        assert!(m("a^", "a^") && m("a\\$", "a$") && !m("a\\$", "a"));
    }

    #[test]
    fn classes() {
        assert!(m("[0-9][0-9]*", "x42") && !m("[0-9]", "xy"));
        assert!(m("^[abc]*$", "cab") && !m("^[abc]*$", "cad"));
        assert!(!m("^[^a]", "abc") && m("^[^a]", "bc"));
        // `]` first in a class and `-` before `]` are members.
        assert!(m("[]x]", "]") && m("[a-]", "-") && !m("[a-]", "b"));
        assert_eq!(
            Regex::new("[ab", false, false).unwrap_err(),
            "grep: Unmatched [, [^, [:, [., or [="
        );
    }

    #[test]
    fn star_dot_and_escapes() {
        assert!(m("b.d", "abcde") && !m("b.d", "bd"));
        assert!(m("a.*z", "a to z") && !m("a.*z", "z to a"));
        assert!(m("*a", "x*a") && !m("*a", "xa"));
        assert!(m("a\\.b", "a.b"));
        assert!(!m("a\\.b", "axb"));
        assert!(m("a\\*", "a*") && !m("a\\*", "a"));
        assert_eq!(
            Regex::new("[a-z]x*.\\.", false, false).unwrap().atoms,
            [
                (Atom::Class(vec![('a', 'z')], false), false),
                (Atom::Lit('x'), true),
                (Atom::Any, false),
                (Atom::Lit('.'), false),
            ]
        );
    }

    #[test]
    fn fixed_and_ignore_case() {
        let fixed = Regex::new("^a.b$", true, false).unwrap();
        assert!(fixed.matches("x^a.b$y") && !fixed.matches("axb"));
        let folded = Regex::new("ERROR", false, true).unwrap();
        assert!(folded.matches("an error") && folded.matches("An ErRoR"));
    }

    #[test]
    fn pattern_too_long() {
        let at_most = "a".repeat(MAX_PATTERN);
        assert!(Regex::new(&at_most, false, false).is_ok());
        assert!(Regex::new(&"a*".repeat(MAX_PATTERN), false, false).is_ok());
        for fixed in [false, true] {
            assert_eq!(
                Regex::new(&format!("{at_most}a"), fixed, false).unwrap_err(),
                "grep: pattern too long"
            );
        }
    }
}
