//! The KG task's questions: templates, their solution programs, and their enumeration.
//!
//! Every question comes from a template whose wording fixes the solution program: the same
//! words always mean the same relations, so a small policy can learn the mapping from the words
//! alone (it cannot know an entity's type from its made-up name). Difficulty 1 is one hop;
//! difficulty 2 is two hops, or one hop followed by `count` or `argmax`/`argmin`; difficulty 3
//! is an intersection of two hops, or two hops followed by `count` or `argmax`/`argmin`.
//! Only questions with a non-empty, well-defined answer are kept (a superlative needs at least
//! two candidates and no tie).

use super::world::{Attribute, EntityId, EntityType, Relation, World, intersect};

use EntityType::*;
use Relation::*;

/// What a template does after following its path(s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tail {
    /// The answer is the set reached.
    Set,
    /// The answer is the size of the set reached.
    Count,
    /// The answer is the entity of the set reached with the highest/lowest attribute value;
    /// the template is instantiated for every attribute of the set's type and both extremes.
    Best,
}

/// A question template. `{x}`, `{y}`, `{best}` and `{attr}` are filled in per question.
struct Template {
    difficulty: u8,
    text: &'static str,
    x: EntityType,
    x_path: &'static [Relation],
    /// The second entity's type and path, for intersections.
    y: Option<(EntityType, &'static [Relation])>,
    tail: Tail,
}

const fn t(
    difficulty: u8,
    text: &'static str,
    x: EntityType,
    x_path: &'static [Relation],
    tail: Tail,
) -> Template {
    Template {
        difficulty,
        text,
        x,
        x_path,
        y: None,
        tail,
    }
}

const fn both(
    text: &'static str,
    x: EntityType,
    x_path: &'static [Relation],
    y: EntityType,
    y_path: &'static [Relation],
    tail: Tail,
) -> Template {
    Template {
        difficulty: 3,
        text,
        x,
        x_path,
        y: Some((y, y_path)),
        tail,
    }
}

use Tail::{Best, Count, Set};

#[rustfmt::skip]
const TEMPLATES: &[Template] = &[
    // Difficulty 1: one hop.
    t(1, "who directed {x} ?", Film, &[DirectedBy], Set),
    t(1, "which films did {x} direct ?", Person, &[Directed], Set),
    t(1, "which films did {x} act in ?", Person, &[ActedIn], Set),
    t(1, "who acted in {x} ?", Film, &[Cast], Set),
    t(1, "where was {x} born ?", Person, &[BornIn], Set),
    t(1, "who was born in {x} ?", City, &[BirthplaceOf], Set),
    t(1, "which country is {x} in ?", City, &[LocatedIn], Set),
    t(1, "which cities are in {x} ?", Country, &[Contains], Set),
    t(1, "who founded {x} ?", Company, &[FoundedBy], Set),
    t(1, "which companies did {x} found ?", Person, &[Founded], Set),
    t(1, "where is {x} headquartered ?", Company, &[HeadquarteredIn], Set),
    t(1, "which companies are headquartered in {x} ?", City, &[HeadquartersOf], Set),
    t(1, "which team does {x} play for ?", Person, &[PlaysFor], Set),
    t(1, "who plays for {x} ?", Team, &[Players], Set),
    t(1, "where is {x} based ?", Team, &[BasedIn], Set),
    t(1, "which teams are based in {x} ?", City, &[HomeOf], Set),
    t(1, "which company produced {x} ?", Film, &[ProducedBy], Set),
    t(1, "which films did {x} produce ?", Company, &[Produced], Set),
    t(1, "which country is {x} a citizen of ?", Person, &[CitizenOf], Set),
    t(1, "who are the citizens of {x} ?", Country, &[Citizens], Set),
    // Difficulty 2: one hop and a count.
    t(2, "how many films did {x} direct ?", Person, &[Directed], Count),
    t(2, "how many films did {x} act in ?", Person, &[ActedIn], Count),
    t(2, "how many actors are in {x} ?", Film, &[Cast], Count),
    t(2, "how many people were born in {x} ?", City, &[BirthplaceOf], Count),
    t(2, "how many cities are in {x} ?", Country, &[Contains], Count),
    t(2, "how many companies did {x} found ?", Person, &[Founded], Count),
    t(2, "how many players does {x} have ?", Team, &[Players], Count),
    t(2, "how many films did {x} produce ?", Company, &[Produced], Count),
    t(2, "how many citizens does {x} have ?", Country, &[Citizens], Count),
    t(2, "how many companies are headquartered in {x} ?", City, &[HeadquartersOf], Count),
    // Difficulty 2: two hops.
    t(2, "where was the director of {x} born ?", Film, &[DirectedBy, BornIn], Set),
    t(2, "which country was {x} born in ?", Person, &[BornIn, LocatedIn], Set),
    t(2, "which country is {x} headquartered in ?", Company, &[HeadquarteredIn, LocatedIn], Set),
    t(2, "which country is {x} based in ?", Team, &[BasedIn, LocatedIn], Set),
    t(2, "who directed films starring {x} ?", Person, &[ActedIn, DirectedBy], Set),
    t(2, "who acted in films directed by {x} ?", Person, &[Directed, Cast], Set),
    t(2, "where were the founders of {x} born ?", Company, &[FoundedBy, BornIn], Set),
    t(2, "which companies produced films starring {x} ?", Person, &[ActedIn, ProducedBy], Set),
    t(2, "who directed films produced by {x} ?", Company, &[Produced, DirectedBy], Set),
    t(2, "which teams play in {x} ?", Country, &[Contains, HomeOf], Set),
    // Difficulty 2: one hop and a superlative.
    t(2, "which film directed by {x} has the {best} {attr} ?", Person, &[Directed], Best),
    t(2, "which film starring {x} has the {best} {attr} ?", Person, &[ActedIn], Best),
    t(2, "which actor in {x} has the {best} {attr} ?", Film, &[Cast], Best),
    t(2, "which person born in {x} has the {best} {attr} ?", City, &[BirthplaceOf], Best),
    t(2, "which city in {x} has the {best} {attr} ?", Country, &[Contains], Best),
    t(2, "which player of {x} has the {best} {attr} ?", Team, &[Players], Best),
    t(2, "which film produced by {x} has the {best} {attr} ?", Company, &[Produced], Best),
    t(2, "which citizen of {x} has the {best} {attr} ?", Country, &[Citizens], Best),
    t(2, "which company headquartered in {x} has the {best} {attr} ?", City, &[HeadquartersOf], Best),
    // Difficulty 3: intersections.
    both("which films did {x} and {y} both act in ?", Person, &[ActedIn], Person, &[ActedIn], Set),
    both("which films did {x} direct and {y} act in ?", Person, &[Directed], Person, &[ActedIn], Set),
    both("who acted in both {x} and {y} ?", Film, &[Cast], Film, &[Cast], Set),
    both("who was born in {x} and plays for {y} ?", City, &[BirthplaceOf], Team, &[Players], Set),
    both("who was born in {x} and acted in {y} ?", City, &[BirthplaceOf], Film, &[Cast], Set),
    both("which films did {x} produce and {y} direct ?", Company, &[Produced], Person, &[Directed], Set),
    both("how many films did {x} and {y} both act in ?", Person, &[ActedIn], Person, &[ActedIn], Count),
    // Difficulty 3: two hops and a superlative or a count.
    t(3, "which city in the country of {x} has the {best} {attr} ?", City, &[LocatedIn, Contains], Best),
    t(3, "which actor in films directed by {x} has the {best} {attr} ?", Person, &[Directed, Cast], Best),
    t(3, "which film directed by the director of {x} has the {best} {attr} ?", Film, &[DirectedBy, Directed], Best),
    t(3, "how many actors are in films directed by {x} ?", Person, &[Directed, Cast], Count),
    t(3, "how many films did the director of {x} direct ?", Film, &[DirectedBy, Directed], Count),
];

/// Words of the superlatives, `{best}` in the templates.
const HIGHEST: &str = "highest";
const LOWEST: &str = "lowest";

/// Every word the templates use outside their placeholders.
pub(crate) fn template_words() -> impl Iterator<Item = &'static str> {
    TEMPLATES
        .iter()
        .flat_map(|t| t.text.split_whitespace())
        .filter(|w| !w.starts_with('{'))
        .chain([HIGHEST, LOWEST])
}

/// An input of a program step: an entity named in the question, or an earlier step's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// An entity of the question.
    Entity(EntityId),
    /// The result of program step `i`.
    Step(usize),
}

/// One step of a solution program: one tool call that creates a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `get_neighbors(from, relation)`.
    Neighbors(Arg, Relation),
    /// `intersection(a, b)`.
    Intersection(Arg, Arg),
    /// `argmax(from, attribute)`.
    Argmax(Arg, Attribute),
    /// `argmin(from, attribute)`.
    Argmin(Arg, Attribute),
    /// `count(from)`.
    Count(Arg),
}

/// The value of a variable: a typed set of entities, or a number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A set of entities of one type, sorted.
    Set(EntityType, Vec<EntityId>),
    /// A count.
    Count(usize),
}

/// A question: its text, its solution program and its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    text: String,
    template: usize,
    difficulty: u8,
    entities: Vec<EntityId>,
    program: Vec<Op>,
    answer: Value,
}

impl Question {
    /// The question as the agent reads it: space-separated words.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The index of the template it was made from (templates are fixed for a version).
    pub fn template(&self) -> usize {
        self.template
    }

    /// Its difficulty, 1..=3.
    pub fn difficulty(&self) -> u8 {
        self.difficulty
    }

    /// The entities it names, which the agent may use as variables.
    pub fn entities(&self) -> &[EntityId] {
        &self.entities
    }

    /// The canonical solution: each step creates the next variable, and the last step's
    /// variable is the final answer.
    pub fn program(&self) -> &[Op] {
        &self.program
    }

    /// The correct answer.
    pub fn answer(&self) -> &Value {
        &self.answer
    }
}

/// Runs a program on the world: the value of every step. `None` when a step is ill-typed.
pub fn evaluate(world: &World, program: &[Op]) -> Option<Vec<Value>> {
    let mut values: Vec<Value> = Vec::with_capacity(program.len());
    for op in program {
        let set = |arg: Arg| -> Option<(EntityType, Vec<EntityId>)> {
            match arg {
                Arg::Entity(e) => Some((world.entity_type(e), vec![e])),
                Arg::Step(i) => match values.get(i)? {
                    Value::Set(ty, members) => Some((*ty, members.clone())),
                    Value::Count(_) => None,
                },
            }
        };
        let value = match *op {
            Op::Neighbors(from, relation) => {
                let (ty, members) = set(from)?;
                (ty == relation.source()).then_some(())?;
                Value::Set(relation.target(), world.neighbors_of(&members, relation))
            }
            Op::Intersection(a, b) => {
                let (ta, a) = set(a)?;
                let (tb, b) = set(b)?;
                (ta == tb).then_some(())?;
                Value::Set(ta, intersect(&a, &b))
            }
            Op::Argmax(from, attribute) | Op::Argmin(from, attribute) => {
                let (ty, members) = set(from)?;
                (ty == attribute.owner()).then_some(())?;
                let max = matches!(op, Op::Argmax(..));
                Value::Set(ty, world.extreme(&members, attribute, max))
            }
            Op::Count(from) => Value::Count(set(from)?.1.len()),
        };
        values.push(value);
    }
    Some(values)
}

/// Every well-defined question of `difficulty`, in a fixed order (template, then entities).
pub fn enumerate(world: &World, difficulty: u8) -> Vec<Question> {
    let mut out = Vec::new();
    for (index, template) in TEMPLATES.iter().enumerate() {
        if template.difficulty != difficulty {
            continue;
        }
        for &x in world.entities(template.x) {
            match template.y {
                None => instantiate(world, index, template, x, None, &mut out),
                Some((y_type, y_path)) => {
                    let symmetric = y_type == template.x && y_path == template.x_path;
                    for &y in world.entities(y_type) {
                        if y == x || (symmetric && y < x) {
                            continue;
                        }
                        instantiate(world, index, template, x, Some(y), &mut out);
                    }
                }
            }
        }
    }
    out
}

fn instantiate(
    world: &World,
    index: usize,
    template: &Template,
    x: EntityId,
    y: Option<EntityId>,
    out: &mut Vec<Question>,
) {
    let mut program = Vec::new();
    let mut from = Arg::Entity(x);
    for &relation in template.x_path {
        program.push(Op::Neighbors(from, relation));
        from = Arg::Step(program.len() - 1);
    }
    if let (Some(y), Some((_, y_path))) = (y, template.y) {
        let x_end = from;
        let mut y_from = Arg::Entity(y);
        for &relation in y_path {
            program.push(Op::Neighbors(y_from, relation));
            y_from = Arg::Step(program.len() - 1);
        }
        program.push(Op::Intersection(x_end, y_from));
        from = Arg::Step(program.len() - 1);
    }
    let mut entities = vec![x];
    entities.extend(y);
    let fill = |best: &str, attr: &str| -> String {
        template
            .text
            .replace("{x}", world.name(x))
            .replace("{y}", y.map_or("", |y| world.name(y)))
            .replace("{best}", best)
            .replace("{attr}", attr)
    };
    let Some(values) = evaluate(world, &program) else {
        return;
    };
    let Some(Value::Set(ty, set)) = values.last() else {
        return;
    };
    if set.is_empty() {
        return;
    }
    let mut push = |text: String, op: Option<Op>| {
        let mut program = program.clone();
        program.extend(op);
        if let Some(values) = evaluate(world, &program) {
            let answer = values.last().cloned().expect("non-empty program");
            out.push(Question {
                text,
                template: index,
                difficulty: template.difficulty,
                entities: entities.clone(),
                program,
                answer,
            });
        }
    };
    match template.tail {
        Tail::Set => push(fill("", ""), None),
        Tail::Count => push(fill("", ""), Some(Op::Count(from))),
        Tail::Best => {
            if set.len() < 2 {
                return;
            }
            for attribute in ty.attributes() {
                for max in [true, false] {
                    if world.extreme(set, attribute, max).len() != 1 {
                        continue;
                    }
                    let (word, op) = if max {
                        (HIGHEST, Op::Argmax(from, attribute))
                    } else {
                        (LOWEST, Op::Argmin(from, attribute))
                    };
                    push(fill(word, attribute.name()), Some(op));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_well_typed_and_distinct() {
        for (i, a) in TEMPLATES.iter().enumerate() {
            let mut ty = a.x;
            for r in a.x_path {
                assert_eq!(r.source(), ty, "{}", a.text);
                ty = r.target();
            }
            if let Some((y, path)) = a.y {
                let mut ty_y = y;
                for r in path {
                    assert_eq!(r.source(), ty_y, "{}", a.text);
                    ty_y = r.target();
                }
                assert_eq!(ty, ty_y, "{}", a.text);
            }
            for b in &TEMPLATES[i + 1..] {
                assert_ne!(a.text, b.text);
            }
        }
    }

    #[test]
    fn every_template_yields_questions() {
        let world = World::generate(super::super::STANDARD_WORLD_SEED, |_| false);
        let all: Vec<Question> = (1..=3).flat_map(|d| enumerate(&world, d)).collect();
        for (i, template) in TEMPLATES.iter().enumerate() {
            let n = all.iter().filter(|q| q.template == i).count();
            assert!(n > 0, "no question for `{}`", template.text);
        }
        for q in &all {
            let values = evaluate(&world, &q.program).expect("well-typed");
            assert_eq!(values.last(), Some(&q.answer));
            assert!(q.text.split_whitespace().all(|w| !w.starts_with('{')));
        }
    }
}
