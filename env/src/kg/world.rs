//! The KG task's world: a small typed knowledge graph generated deterministically from a seed.
//!
//! Six entity types, ten relations (each with a named inverse, so every link can be followed
//! both ways) and two numeric attributes per type. Entity names are single made-up lowercase
//! words built from syllables, so a word-level tokenizer gives each entity exactly one token
//! and a policy cannot answer from prior knowledge: it has to query the graph.

use std::collections::{BTreeSet, HashMap};

use rand::seq::IndexedRandom;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// An entity's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntityType {
    /// A person: directs and acts in films, founds companies, plays for teams.
    Person,
    /// A film.
    Film,
    /// A city.
    City,
    /// A country.
    Country,
    /// A company.
    Company,
    /// A sports team.
    Team,
}

impl EntityType {
    /// Every type, in a fixed order.
    pub const ALL: [EntityType; 6] = [
        EntityType::Person,
        EntityType::Film,
        EntityType::City,
        EntityType::Country,
        EntityType::Company,
        EntityType::Team,
    ];

    /// The type's name as shown in observations (`#0 = 3 film`).
    pub fn name(self) -> &'static str {
        match self {
            EntityType::Person => "person",
            EntityType::Film => "film",
            EntityType::City => "city",
            EntityType::Country => "country",
            EntityType::Company => "company",
            EntityType::Team => "team",
        }
    }

    /// The numeric attributes every entity of this type has.
    pub fn attributes(self) -> [Attribute; 2] {
        match self {
            EntityType::Person => [Attribute::Age, Attribute::Height],
            EntityType::Film => [Attribute::Year, Attribute::Runtime],
            EntityType::City => [Attribute::Population, Attribute::Elevation],
            EntityType::Country => [Attribute::Area, Attribute::Gdp],
            EntityType::Company => [Attribute::Revenue, Attribute::Employees],
            EntityType::Team => [Attribute::Wins, Attribute::Titles],
        }
    }

    /// How many entities of this type a world has.
    pub fn count(self) -> usize {
        match self {
            EntityType::Person => 90,
            EntityType::Film => 40,
            EntityType::City => 24,
            EntityType::Country => 6,
            EntityType::Company => 20,
            EntityType::Team => 12,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A typed, directed relation. Every relation has an [`inverse`](Relation::inverse).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Relation {
    /// film → its director.
    DirectedBy,
    /// person → films they directed.
    Directed,
    /// person → films they acted in.
    ActedIn,
    /// film → its actors.
    Cast,
    /// person → city of birth.
    BornIn,
    /// city → people born there.
    BirthplaceOf,
    /// city → its country.
    LocatedIn,
    /// country → its cities.
    Contains,
    /// company → its founders.
    FoundedBy,
    /// person → companies they founded.
    Founded,
    /// company → city of its headquarters.
    HeadquarteredIn,
    /// city → companies headquartered there.
    HeadquartersOf,
    /// person → their team.
    PlaysFor,
    /// team → its players.
    Players,
    /// team → its home city.
    BasedIn,
    /// city → teams based there.
    HomeOf,
    /// film → the company that produced it.
    ProducedBy,
    /// company → films it produced.
    Produced,
    /// person → their country of citizenship.
    CitizenOf,
    /// country → its citizens.
    Citizens,
}

impl Relation {
    /// Every relation, in a fixed order (the order `get_relations` lists them in).
    pub const ALL: [Relation; 20] = [
        Relation::DirectedBy,
        Relation::Directed,
        Relation::ActedIn,
        Relation::Cast,
        Relation::BornIn,
        Relation::BirthplaceOf,
        Relation::LocatedIn,
        Relation::Contains,
        Relation::FoundedBy,
        Relation::Founded,
        Relation::HeadquarteredIn,
        Relation::HeadquartersOf,
        Relation::PlaysFor,
        Relation::Players,
        Relation::BasedIn,
        Relation::HomeOf,
        Relation::ProducedBy,
        Relation::Produced,
        Relation::CitizenOf,
        Relation::Citizens,
    ];

    /// The relation's snake_case name, as the agent writes it.
    pub fn name(self) -> &'static str {
        match self {
            Relation::DirectedBy => "directed_by",
            Relation::Directed => "directed",
            Relation::ActedIn => "acted_in",
            Relation::Cast => "cast",
            Relation::BornIn => "born_in",
            Relation::BirthplaceOf => "birthplace_of",
            Relation::LocatedIn => "located_in",
            Relation::Contains => "contains",
            Relation::FoundedBy => "founded_by",
            Relation::Founded => "founded",
            Relation::HeadquarteredIn => "headquartered_in",
            Relation::HeadquartersOf => "headquarters_of",
            Relation::PlaysFor => "plays_for",
            Relation::Players => "players",
            Relation::BasedIn => "based_in",
            Relation::HomeOf => "home_of",
            Relation::ProducedBy => "produced_by",
            Relation::Produced => "produced",
            Relation::CitizenOf => "citizen_of",
            Relation::Citizens => "citizens",
        }
    }

    /// The relation called `name`, if any.
    pub fn from_name(name: &str) -> Option<Relation> {
        Relation::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The type of the entities the relation starts from.
    pub fn source(self) -> EntityType {
        use EntityType::*;
        match self {
            Relation::DirectedBy | Relation::Cast | Relation::ProducedBy => Film,
            Relation::Directed
            | Relation::ActedIn
            | Relation::BornIn
            | Relation::Founded
            | Relation::PlaysFor
            | Relation::CitizenOf => Person,
            Relation::BirthplaceOf
            | Relation::LocatedIn
            | Relation::HeadquartersOf
            | Relation::HomeOf => City,
            Relation::Contains | Relation::Citizens => Country,
            Relation::FoundedBy | Relation::HeadquarteredIn | Relation::Produced => Company,
            Relation::Players | Relation::BasedIn => Team,
        }
    }

    /// The type of the entities the relation leads to.
    pub fn target(self) -> EntityType {
        self.inverse().source()
    }

    /// The same link followed the other way.
    pub fn inverse(self) -> Relation {
        let i = self as usize;
        Relation::ALL[i ^ 1]
    }
}

/// A numeric attribute; each belongs to one entity type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Attribute {
    /// A person's age in years.
    Age,
    /// A person's height in centimetres.
    Height,
    /// A film's release year.
    Year,
    /// A film's runtime in minutes.
    Runtime,
    /// A city's population.
    Population,
    /// A city's elevation in metres.
    Elevation,
    /// A country's area in square kilometres.
    Area,
    /// A country's GDP.
    Gdp,
    /// A company's revenue.
    Revenue,
    /// A company's number of employees.
    Employees,
    /// A team's number of wins.
    Wins,
    /// A team's number of titles.
    Titles,
}

impl Attribute {
    /// Every attribute, in a fixed order.
    pub const ALL: [Attribute; 12] = [
        Attribute::Age,
        Attribute::Height,
        Attribute::Year,
        Attribute::Runtime,
        Attribute::Population,
        Attribute::Elevation,
        Attribute::Area,
        Attribute::Gdp,
        Attribute::Revenue,
        Attribute::Employees,
        Attribute::Wins,
        Attribute::Titles,
    ];

    /// The attribute's name, as the agent writes it.
    pub fn name(self) -> &'static str {
        match self {
            Attribute::Age => "age",
            Attribute::Height => "height",
            Attribute::Year => "year",
            Attribute::Runtime => "runtime",
            Attribute::Population => "population",
            Attribute::Elevation => "elevation",
            Attribute::Area => "area",
            Attribute::Gdp => "gdp",
            Attribute::Revenue => "revenue",
            Attribute::Employees => "employees",
            Attribute::Wins => "wins",
            Attribute::Titles => "titles",
        }
    }

    /// The attribute called `name`, if any.
    pub fn from_name(name: &str) -> Option<Attribute> {
        Attribute::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The type whose entities have this attribute.
    pub fn owner(self) -> EntityType {
        EntityType::ALL[self as usize / 2]
    }

    /// The half-open range values are drawn from.
    fn range(self) -> (i64, i64) {
        match self {
            Attribute::Age => (18, 90),
            Attribute::Height => (150, 205),
            Attribute::Year => (1950, 2025),
            Attribute::Runtime => (75, 200),
            Attribute::Population => (20_000, 9_000_000),
            Attribute::Elevation => (0, 3_000),
            Attribute::Area => (10_000, 3_000_000),
            Attribute::Gdp => (10, 5_000),
            Attribute::Revenue => (1, 90_000),
            Attribute::Employees => (10, 200_000),
            Attribute::Wins => (0, 600),
            Attribute::Titles => (0, 40),
        }
    }
}

/// An entity, by its index in the world.
pub type EntityId = u32;

/// The knowledge graph: entities with names, types, links and attribute values.
#[derive(Clone, Debug)]
pub struct World {
    seed: u64,
    names: Vec<String>,
    types: Vec<EntityType>,
    by_name: HashMap<String, EntityId>,
    by_type: Vec<Vec<EntityId>>,
    /// `edges[relation][entity]`: sorted targets.
    edges: Vec<Vec<Vec<EntityId>>>,
    /// `values[attribute][entity]`, meaningful for entities of the attribute's owner type.
    values: Vec<Vec<i64>>,
}

const ONSETS: [&str; 16] = [
    "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr",
];
const VOWELS: [&str; 5] = ["a", "e", "i", "o", "u"];
const CODAS: [&str; 8] = ["", "", "", "", "n", "r", "l", "s"];

impl World {
    /// Generates the world of `seed`. Names avoid every word for which `reserved` is true, so
    /// an entity name never collides with a relation, attribute or template word.
    pub fn generate(seed: u64, reserved: impl Fn(&str) -> bool) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut world = World {
            seed,
            names: Vec::new(),
            types: Vec::new(),
            by_name: HashMap::new(),
            by_type: vec![Vec::new(); EntityType::ALL.len()],
            edges: Vec::new(),
            values: Vec::new(),
        };
        for ty in EntityType::ALL {
            for _ in 0..ty.count() {
                let name = loop {
                    let name = make_name(&mut rng);
                    if !reserved(&name) && !world.by_name.contains_key(&name) {
                        break name;
                    }
                };
                let id = world.names.len() as EntityId;
                world.by_name.insert(name.clone(), id);
                world.names.push(name);
                world.types.push(ty);
                world.by_type[ty.index()].push(id);
            }
        }
        let n = world.names.len();
        world.edges = vec![vec![Vec::new(); n]; Relation::ALL.len()];
        world.link(&mut rng);
        for list in world.edges.iter_mut().flatten() {
            list.sort_unstable();
            list.dedup();
        }
        world.values = Attribute::ALL
            .iter()
            .map(|&attr| {
                let (lo, hi) = attr.range();
                (0..n)
                    .map(|i| {
                        if world.types[i] == attr.owner() {
                            rng.random_range(lo..hi)
                        } else {
                            0
                        }
                    })
                    .collect()
            })
            .collect();
        world
    }

    fn link(&mut self, rng: &mut ChaCha8Rng) {
        let persons = self.by_type[EntityType::Person.index()].clone();
        let films = self.by_type[EntityType::Film.index()].clone();
        let cities = self.by_type[EntityType::City.index()].clone();
        let countries = self.by_type[EntityType::Country.index()].clone();
        let companies = self.by_type[EntityType::Company.index()].clone();
        let teams = self.by_type[EntityType::Team.index()].clone();
        let pool = |rng: &mut ChaCha8Rng, k: usize| -> Vec<EntityId> {
            sample(rng, persons.len(), k)
                .into_iter()
                .map(|i| persons[i])
                .collect()
        };
        let directors = pool(rng, 12);
        let actors = pool(rng, 36);
        let athletes = pool(rng, 30);
        let founders = pool(rng, 16);
        let pick = |rng: &mut ChaCha8Rng, from: &[EntityId]| *from.choose(rng).expect("non-empty");

        // Every country has a city, every team a player.
        let mut country_of = HashMap::new();
        for (i, &city) in cities.iter().enumerate() {
            let country = countries
                .get(i)
                .copied()
                .unwrap_or_else(|| pick(rng, &countries));
            country_of.insert(city, country);
            self.add(Relation::LocatedIn, city, country);
        }
        for &person in &persons {
            let city = pick(rng, &cities);
            self.add(Relation::BornIn, person, city);
            let country = if rng.random_bool(0.8) {
                country_of[&city]
            } else {
                pick(rng, &countries)
            };
            self.add(Relation::CitizenOf, person, country);
        }
        for &film in &films {
            self.add(Relation::DirectedBy, film, pick(rng, &directors));
            let k = rng.random_range(2..=4);
            for i in sample(rng, actors.len(), k) {
                self.add(Relation::ActedIn, actors[i], film);
            }
            self.add(Relation::ProducedBy, film, pick(rng, &companies));
        }
        for &company in &companies {
            let k = rng.random_range(1..=2);
            for i in sample(rng, founders.len(), k) {
                self.add(Relation::FoundedBy, company, founders[i]);
            }
            self.add(Relation::HeadquarteredIn, company, pick(rng, &cities));
        }
        for (i, &person) in athletes.iter().enumerate() {
            let team = teams.get(i).copied().unwrap_or_else(|| pick(rng, &teams));
            self.add(Relation::PlaysFor, person, team);
        }
        for &team in &teams {
            self.add(Relation::BasedIn, team, pick(rng, &cities));
        }
    }

    fn add(&mut self, relation: Relation, from: EntityId, to: EntityId) {
        self.edges[relation as usize][from as usize].push(to);
        self.edges[relation.inverse() as usize][to as usize].push(from);
    }

    /// The seed the world was generated from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Number of entities.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the world has no entities (never true for a generated world).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every entity name, indexed by [`EntityId`].
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The name of `entity`.
    pub fn name(&self, entity: EntityId) -> &str {
        &self.names[entity as usize]
    }

    /// The type of `entity`.
    pub fn entity_type(&self, entity: EntityId) -> EntityType {
        self.types[entity as usize]
    }

    /// The entity called `name`, if any.
    pub fn lookup(&self, name: &str) -> Option<EntityId> {
        self.by_name.get(name).copied()
    }

    /// All entities of type `ty`, in id order.
    pub fn entities(&self, ty: EntityType) -> &[EntityId] {
        &self.by_type[ty.index()]
    }

    /// The targets of `relation` from `entity` (sorted; empty when the types do not match).
    pub fn neighbors(&self, entity: EntityId, relation: Relation) -> &[EntityId] {
        &self.edges[relation as usize][entity as usize]
    }

    /// The union of the neighbors of every entity in `set`, sorted.
    pub fn neighbors_of(&self, set: &[EntityId], relation: Relation) -> Vec<EntityId> {
        set.iter()
            .flat_map(|&e| self.neighbors(e, relation).iter().copied())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// The relations that lead somewhere from at least one entity of `set`, in
    /// [`Relation::ALL`] order.
    pub fn relations_of(&self, set: &[EntityId]) -> Vec<Relation> {
        Relation::ALL
            .into_iter()
            .filter(|&r| set.iter().any(|&e| !self.neighbors(e, r).is_empty()))
            .collect()
    }

    /// The value of `attribute` for `entity`, if the entity's type has it.
    pub fn value(&self, entity: EntityId, attribute: Attribute) -> Option<i64> {
        (self.entity_type(entity) == attribute.owner())
            .then(|| self.values[attribute as usize][entity as usize])
    }

    /// The entities of `set` with the highest (`max`) or lowest value of `attribute`; all of them
    /// when several tie. Entities without the attribute are ignored.
    pub fn extreme(&self, set: &[EntityId], attribute: Attribute, max: bool) -> Vec<EntityId> {
        let scored: Vec<(EntityId, i64)> = set
            .iter()
            .filter_map(|&e| self.value(e, attribute).map(|v| (e, v)))
            .collect();
        let best = if max {
            scored.iter().map(|&(_, v)| v).max()
        } else {
            scored.iter().map(|&(_, v)| v).min()
        };
        match best {
            Some(best) => scored
                .into_iter()
                .filter(|&(_, v)| v == best)
                .map(|(e, _)| e)
                .collect(),
            None => Vec::new(),
        }
    }
}

fn make_name(rng: &mut ChaCha8Rng) -> String {
    let syllables = if rng.random_bool(0.6) { 2 } else { 3 };
    let mut name = String::new();
    for i in 0..syllables {
        name.push_str(ONSETS.choose(rng).expect("non-empty"));
        name.push_str(VOWELS.choose(rng).expect("non-empty"));
        if i + 1 == syllables || rng.random_bool(0.2) {
            name.push_str(CODAS.choose(rng).expect("non-empty"));
        }
    }
    name
}

/// The intersection of two sorted sets.
pub fn intersect(a: &[EntityId], b: &[EntityId]) -> Vec<EntityId> {
    a.iter()
        .copied()
        .filter(|e| b.binary_search(e).is_ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverses_pair_up() {
        for r in Relation::ALL {
            assert_eq!(r.inverse().inverse(), r);
            assert_ne!(r.inverse(), r);
            assert_eq!(Relation::from_name(r.name()), Some(r));
        }
        for a in Attribute::ALL {
            assert!(a.owner().attributes().contains(&a));
            assert_eq!(Attribute::from_name(a.name()), Some(a));
        }
    }

    #[test]
    fn world_is_deterministic_and_linked_both_ways() {
        let a = World::generate(7, |_| false);
        let b = World::generate(7, |_| false);
        assert_eq!(a.names, b.names);
        assert_eq!(a.edges, b.edges);
        assert_eq!(a.values, b.values);
        assert_ne!(World::generate(8, |_| false).names, a.names);
        for r in Relation::ALL {
            for e in 0..a.len() as EntityId {
                for &t in a.neighbors(e, r) {
                    assert_eq!(a.entity_type(e), r.source());
                    assert_eq!(a.entity_type(t), r.target());
                    assert!(a.neighbors(t, r.inverse()).contains(&e));
                }
            }
        }
        assert!(
            a.names
                .iter()
                .all(|n| n.chars().all(|c| c.is_ascii_lowercase()))
        );
    }
}
