//! The household: receptacle and object kinds, goals, and the seeded generation of one room.
//!
//! An instance is one room, as in ALFWorld: a kitchen or a bedroom with numbered receptacles
//! (`cabinet 2`), numbered objects lying in or on them (`apple 1`) and a goal. Everything the
//! episode needs is fixed here; the episode only tracks what changes (positions, states).

use std::fmt::Write as _;

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Declares a kind enum whose variants are named by one lowercase word, as in ALFWorld.
macro_rules! kinds {
    ($(#[$meta:meta])* $ty:ident { $($variant:ident = $name:literal),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $ty {
            $(#[doc = concat!("`", $name, "`.")] $variant),*
        }

        impl $ty {
            /// Every kind, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),*];

            /// The kind's name: one lowercase word, as in observations and actions.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),*
                }
            }

            /// The kind named `name`, if any.
            pub fn from_name(name: &str) -> Option<$ty> {
                Self::ALL.iter().copied().find(|k| k.name() == name)
            }
        }
    };
}

kinds! {
    /// A kind of receptacle: furniture or appliance that holds objects.
    ReceptacleKind {
        Countertop = "countertop",
        Cabinet = "cabinet",
        Drawer = "drawer",
        Fridge = "fridge",
        Microwave = "microwave",
        Sinkbasin = "sinkbasin",
        Stoveburner = "stoveburner",
        Diningtable = "diningtable",
        Garbagecan = "garbagecan",
        Shelf = "shelf",
        Desk = "desk",
        Sidetable = "sidetable",
        Dresser = "dresser",
        Bed = "bed",
        Safe = "safe",
    }
}

impl ReceptacleKind {
    /// Whether it opens and closes; a closed one hides and guards its contents.
    pub fn openable(self) -> bool {
        use ReceptacleKind::*;
        matches!(self, Cabinet | Drawer | Fridge | Microwave | Safe)
    }

    /// The preposition of putting something there: `in` a container, `on` a surface.
    pub fn preposition(self) -> &'static str {
        use ReceptacleKind::*;
        match self {
            Cabinet | Drawer | Fridge | Microwave | Safe | Sinkbasin | Garbagecan => "in",
            _ => "on",
        }
    }

    /// Most receptacles of this kind one room has.
    pub fn max_count(self) -> usize {
        use ReceptacleKind::*;
        match self {
            Cabinet | Drawer => 6,
            Stoveburner => 4,
            Shelf => 3,
            Countertop | Sidetable => 2,
            _ => 1,
        }
    }
}

kinds! {
    /// A kind of object. Every object can be carried except the lamps, which can be used.
    ObjectKind {
        Apple = "apple",
        Potato = "potato",
        Tomato = "tomato",
        Egg = "egg",
        Lettuce = "lettuce",
        Bread = "bread",
        Mug = "mug",
        Cup = "cup",
        Plate = "plate",
        Bowl = "bowl",
        Pan = "pan",
        Pot = "pot",
        Knife = "knife",
        Spoon = "spoon",
        Fork = "fork",
        Spatula = "spatula",
        Ladle = "ladle",
        Soapbottle = "soapbottle",
        Saltshaker = "saltshaker",
        Dishsponge = "dishsponge",
        Book = "book",
        Cellphone = "cellphone",
        Keychain = "keychain",
        Creditcard = "creditcard",
        Pen = "pen",
        Pencil = "pencil",
        Cd = "cd",
        Watch = "watch",
        Remotecontrol = "remotecontrol",
        Pillow = "pillow",
        Vase = "vase",
        Statue = "statue",
        Alarmclock = "alarmclock",
        Laptop = "laptop",
        Newspaper = "newspaper",
        Candle = "candle",
        Desklamp = "desklamp",
        Floorlamp = "floorlamp",
    }
}

impl ObjectKind {
    /// Whether it is a lamp: it stays where it is and `use` turns it on or off.
    pub fn is_lamp(self) -> bool {
        matches!(self, ObjectKind::Desklamp | ObjectKind::Floorlamp)
    }
}

/// What must be done to the goal object before it is put down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Process {
    /// `clean OBJ with sinkbasin 1`.
    Clean,
    /// `heat OBJ with microwave 1`.
    Heat,
    /// `cool OBJ with fridge 1`.
    Cool,
}

impl Process {
    /// The command word (`clean`, `heat`, `cool`).
    pub fn verb(self) -> &'static str {
        match self {
            Process::Clean => "clean",
            Process::Heat => "heat",
            Process::Cool => "cool",
        }
    }

    /// The receptacle that does it.
    pub fn appliance(self) -> ReceptacleKind {
        match self {
            Process::Clean => ReceptacleKind::Sinkbasin,
            Process::Heat => ReceptacleKind::Microwave,
            Process::Cool => ReceptacleKind::Fridge,
        }
    }

    /// The adjective of the goal text (`a clean mug`, `a hot egg`, `a cool apple`).
    pub fn adjective(self) -> &'static str {
        match self {
            Process::Clean => "clean",
            Process::Heat => "hot",
            Process::Cool => "cool",
        }
    }
}

/// The six ALFWorld goal types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GoalKind {
    /// `put a apple in fridge.`
    PickAndPlace,
    /// `examine the book with the desklamp.`
    LookAtObjInLight,
    /// `put a clean mug in cabinet.`
    PickCleanThenPlace,
    /// `put a hot egg on countertop.`
    PickHeatThenPlace,
    /// `put a cool apple on diningtable.`
    PickCoolThenPlace,
    /// `put two cellphone in drawer.`
    PickTwoObjAndPlace,
}

impl GoalKind {
    /// Every goal type.
    pub const ALL: [GoalKind; 6] = [
        GoalKind::PickAndPlace,
        GoalKind::LookAtObjInLight,
        GoalKind::PickCleanThenPlace,
        GoalKind::PickHeatThenPlace,
        GoalKind::PickCoolThenPlace,
        GoalKind::PickTwoObjAndPlace,
    ];

    /// ALFWorld's name of the goal type.
    pub fn name(self) -> &'static str {
        match self {
            GoalKind::PickAndPlace => "pick_and_place",
            GoalKind::LookAtObjInLight => "look_at_obj_in_light",
            GoalKind::PickCleanThenPlace => "pick_clean_then_place",
            GoalKind::PickHeatThenPlace => "pick_heat_then_place",
            GoalKind::PickCoolThenPlace => "pick_cool_then_place",
            GoalKind::PickTwoObjAndPlace => "pick_two_obj_and_place",
        }
    }

    /// The processing the goal asks for.
    pub fn process(self) -> Option<Process> {
        match self {
            GoalKind::PickCleanThenPlace => Some(Process::Clean),
            GoalKind::PickHeatThenPlace => Some(Process::Heat),
            GoalKind::PickCoolThenPlace => Some(Process::Cool),
            _ => None,
        }
    }
}

/// An instance's goal. Goals name kinds, not numbered things: any `apple` in any `fridge` will
/// do, as in ALFWorld.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Goal {
    /// Put an object of kind `object` (processed first, if `kind` asks for it) in or on a
    /// receptacle of kind `target`; for [`GoalKind::PickTwoObjAndPlace`], two of them in the
    /// same receptacle.
    Place {
        /// The goal type (every type but [`GoalKind::LookAtObjInLight`]).
        kind: GoalKind,
        /// The kind of object to move.
        object: ObjectKind,
        /// Where it must end up.
        target: ReceptacleKind,
    },
    /// Hold an object of kind `object` at a lamp of kind `lamp` that is on.
    Look {
        /// The kind of object to hold.
        object: ObjectKind,
        /// The kind of lamp to light it with.
        lamp: ObjectKind,
    },
}

impl Goal {
    /// The goal type.
    pub fn kind(&self) -> GoalKind {
        match *self {
            Goal::Place { kind, .. } => kind,
            Goal::Look { .. } => GoalKind::LookAtObjInLight,
        }
    }

    /// The kind of object the goal is about.
    pub fn object(&self) -> ObjectKind {
        match *self {
            Goal::Place { object, .. } | Goal::Look { object, .. } => object,
        }
    }

    /// The goal as the instruction states it: `put a clean mug in cabinet.`
    pub fn text(&self) -> String {
        match *self {
            Goal::Look { object, lamp } => {
                format!("examine the {} with the {}.", object.name(), lamp.name())
            }
            Goal::Place {
                kind,
                object,
                target,
            } => {
                let what = match (kind, kind.process()) {
                    (GoalKind::PickTwoObjAndPlace, _) => "two".to_string(),
                    (_, Some(p)) => format!("a {}", p.adjective()),
                    _ => "a".to_string(),
                };
                format!(
                    "put {what} {} {} {}.",
                    object.name(),
                    target.preposition(),
                    target.name()
                )
            }
        }
    }
}

/// A numbered receptacle of an instance and whether it starts open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Receptacle {
    /// Its kind.
    pub kind: ReceptacleKind,
    /// Its number among the receptacles of its kind, from 1.
    pub number: u8,
    /// Whether it starts open (always true for kinds that do not open).
    pub open: bool,
}

/// A numbered object of an instance and where it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Object {
    /// Its kind.
    pub kind: ObjectKind,
    /// Its number among the objects of its kind, from 1.
    pub number: u8,
    /// The index of the receptacle it starts in or on.
    pub location: usize,
}

/// The kind of room, which decides the receptacles and objects it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Room {
    /// Kitchen receptacles and objects; the room of clean, heat and cool goals.
    Kitchen,
    /// Bedroom receptacles and objects, with a lamp; the room of look goals.
    Bedroom,
}

impl Room {
    fn name(self) -> &'static str {
        match self {
            Room::Kitchen => "kitchen",
            Room::Bedroom => "bedroom",
        }
    }

    fn receptacles(self) -> &'static [ReceptacleKind] {
        use ReceptacleKind::*;
        match self {
            Room::Kitchen => &[
                Countertop,
                Cabinet,
                Drawer,
                Fridge,
                Microwave,
                Sinkbasin,
                Stoveburner,
                Diningtable,
                Garbagecan,
                Shelf,
            ],
            Room::Bedroom => &[
                Desk, Drawer, Shelf, Bed, Sidetable, Dresser, Safe, Garbagecan, Cabinet,
            ],
        }
    }

    /// Receptacles that goals ask to put things in or on.
    fn targets(self) -> &'static [ReceptacleKind] {
        use ReceptacleKind::*;
        match self {
            Room::Kitchen => &[
                Countertop,
                Cabinet,
                Drawer,
                Fridge,
                Microwave,
                Diningtable,
                Shelf,
                Garbagecan,
                Stoveburner,
                Sinkbasin,
            ],
            Room::Bedroom => &[
                Desk, Drawer, Shelf, Bed, Sidetable, Dresser, Safe, Garbagecan,
            ],
        }
    }

    fn objects(self) -> &'static [ObjectKind] {
        use ObjectKind::*;
        match self {
            Room::Kitchen => &[
                Apple, Potato, Tomato, Egg, Lettuce, Bread, Mug, Cup, Plate, Bowl, Pan, Pot, Knife,
                Spoon, Fork, Spatula, Ladle, Soapbottle, Saltshaker, Dishsponge,
            ],
            Room::Bedroom => &[
                Book,
                Cellphone,
                Keychain,
                Creditcard,
                Pen,
                Pencil,
                Cd,
                Watch,
                Remotecontrol,
                Pillow,
                Vase,
                Statue,
                Alarmclock,
                Laptop,
                Newspaper,
                Candle,
            ],
        }
    }
}

/// Objects that each processing goal asks for (as in ALFWorld's task lists).
fn processable(process: Process) -> &'static [ObjectKind] {
    use ObjectKind::*;
    match process {
        Process::Clean => &[
            Apple, Potato, Tomato, Lettuce, Mug, Cup, Plate, Bowl, Pan, Pot, Knife, Spoon, Fork,
            Spatula, Ladle,
        ],
        Process::Heat => &[Apple, Potato, Tomato, Egg, Bread, Mug, Cup, Plate],
        Process::Cool => &[
            Apple, Potato, Tomato, Lettuce, Bread, Mug, Cup, Plate, Bowl, Pan, Pot,
        ],
    }
}

/// Receptacles that hold a lamp.
const LAMP_HOLDERS: [ReceptacleKind; 3] = [
    ReceptacleKind::Desk,
    ReceptacleKind::Sidetable,
    ReceptacleKind::Dresser,
];

/// Most objects of one kind in a room, so numbers stay small words.
pub const MAX_PER_KIND: usize = 3;

/// Most receptacles in a room.
pub const MAX_RECEPTACLES: usize = 12;

/// The largest number in a name: receptacle numbers go up to the largest
/// [`ReceptacleKind::max_count`], object numbers up to [`MAX_PER_KIND`].
pub const MAX_NUMBER: usize = 6;

/// One generated room with its goal: the immutable part of an episode.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Instance {
    room: Room,
    receptacles: Vec<Receptacle>,
    objects: Vec<Object>,
    goal: Goal,
}

/// Per difficulty: goal types with weights, receptacle count range, distractor count range,
/// and the chance that an openable receptacle starts closed.
struct Level {
    goals: &'static [(GoalKind, u32)],
    receptacles: (usize, usize),
    distractors: (usize, usize),
    closed: f64,
}

fn level(difficulty: u8) -> Level {
    use GoalKind::*;
    match difficulty {
        0 | 1 => Level {
            goals: &[(PickAndPlace, 2), (LookAtObjInLight, 1)],
            receptacles: (4, 5),
            distractors: (2, 3),
            closed: 0.0,
        },
        2 => Level {
            goals: &[
                (PickAndPlace, 2),
                (LookAtObjInLight, 1),
                (PickCleanThenPlace, 1),
                (PickHeatThenPlace, 1),
                (PickCoolThenPlace, 1),
            ],
            receptacles: (6, 8),
            distractors: (4, 6),
            closed: 0.5,
        },
        _ => Level {
            goals: &[
                (PickAndPlace, 1),
                (LookAtObjInLight, 1),
                (PickCleanThenPlace, 2),
                (PickHeatThenPlace, 2),
                (PickCoolThenPlace, 2),
                (PickTwoObjAndPlace, 3),
            ],
            receptacles: (9, MAX_RECEPTACLES),
            distractors: (7, 10),
            closed: 1.0,
        },
    }
}

impl Instance {
    /// Generates the room of `seed` at `difficulty` (1..=3; other values are clamped).
    ///
    /// Difficulty 1: 4–5 receptacles, all open, 2–3 distractors, pick-and-place and look goals.
    /// Difficulty 2: 6–8 receptacles, half the openable ones closed, 4–6 distractors, plus
    /// clean, heat and cool goals. Difficulty 3: 9–12 receptacles, every openable one closed,
    /// 7–10 distractors, all six goal types, weighted towards two-object and processing goals.
    pub fn generate(seed: u64, difficulty: u8) -> Instance {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let difficulty = difficulty.clamp(1, 3);
        let level = level(difficulty);
        let kind = level
            .goals
            .choose_weighted(&mut rng, |(_, w)| *w)
            .map_or(GoalKind::PickAndPlace, |(g, _)| *g);
        let room = match kind {
            GoalKind::LookAtObjInLight => Room::Bedroom,
            k if k.process().is_some() => Room::Kitchen,
            _ if rng.random_bool(0.5) => Room::Kitchen,
            _ => Room::Bedroom,
        };
        let pool = match kind.process() {
            Some(p) => processable(p),
            None => room.objects(),
        };
        let object = *pool.choose(&mut rng).unwrap_or(&ObjectKind::Apple);

        // Receptacle kinds: the ones the goal needs first, then random ones of the room.
        let mut kinds: Vec<ReceptacleKind> = Vec::with_capacity(MAX_RECEPTACLES);
        let mut goal_lamp = None;
        let goal = if kind == GoalKind::LookAtObjInLight {
            kinds.push(
                *LAMP_HOLDERS
                    .choose(&mut rng)
                    .unwrap_or(&ReceptacleKind::Desk),
            );
            let lamp = if rng.random_bool(0.5) {
                ObjectKind::Desklamp
            } else {
                ObjectKind::Floorlamp
            };
            goal_lamp = Some(lamp);
            Goal::Look { object, lamp }
        } else {
            let appliance = kind.process().map(Process::appliance);
            if let Some(a) = appliance {
                kinds.push(a);
            }
            let targets: Vec<ReceptacleKind> = room
                .targets()
                .iter()
                .copied()
                .filter(|t| Some(*t) != appliance)
                .collect();
            let target = *targets
                .choose(&mut rng)
                .unwrap_or(&ReceptacleKind::Countertop);
            kinds.push(target);
            // A receptacle of another kind, so the object has somewhere else to start.
            let others: Vec<ReceptacleKind> = room
                .receptacles()
                .iter()
                .copied()
                .filter(|k| !kinds.contains(k))
                .collect();
            kinds.push(*others.choose(&mut rng).unwrap_or(&ReceptacleKind::Shelf));
            Goal::Place {
                kind,
                object,
                target,
            }
        };
        let total = rng.random_range(level.receptacles.0..=level.receptacles.1);
        while kinds.len() < total {
            let k = *room
                .receptacles()
                .choose(&mut rng)
                .unwrap_or(&ReceptacleKind::Shelf);
            if kinds.iter().filter(|x| **x == k).count() < k.max_count() {
                kinds.push(k);
            }
        }
        let mut receptacles: Vec<Receptacle> = Vec::with_capacity(kinds.len());
        for k in kinds {
            let number = receptacles.iter().filter(|r| r.kind == k).count() as u8 + 1;
            let open = !(k.openable() && rng.random_bool(level.closed));
            receptacles.push(Receptacle {
                kind: k,
                number,
                open,
            });
        }
        receptacles.shuffle(&mut rng);

        // Objects: the goal's, then a lamp, then distractors of other kinds.
        let goal_count = match kind {
            GoalKind::PickTwoObjAndPlace => 2 + usize::from(rng.random_bool(0.5)),
            _ if difficulty >= 2 => 1 + usize::from(rng.random_bool(0.3)),
            _ => 1,
        };
        let lamp_holder = receptacles
            .iter()
            .position(|r| LAMP_HOLDERS.contains(&r.kind));
        let sources: Vec<usize> = (0..receptacles.len())
            .filter(|&i| match goal {
                Goal::Place { target, .. } => receptacles[i].kind != target,
                Goal::Look { .. } => Some(i) != lamp_holder,
            })
            .collect();
        let mut objects: Vec<(ObjectKind, usize)> = Vec::new();
        for _ in 0..goal_count {
            objects.push((object, *sources.choose(&mut rng).unwrap_or(&0)));
        }
        if let Some(holder) = lamp_holder {
            let lamp = goal_lamp.unwrap_or(if rng.random_bool(0.5) {
                ObjectKind::Desklamp
            } else {
                ObjectKind::Floorlamp
            });
            objects.push((lamp, holder));
        }
        let distractors = rng.random_range(level.distractors.0..=level.distractors.1);
        for _ in 0..distractors {
            let candidates: Vec<ObjectKind> = room
                .objects()
                .iter()
                .copied()
                .filter(|k| {
                    *k != object && objects.iter().filter(|(o, _)| o == k).count() < MAX_PER_KIND
                })
                .collect();
            if let Some(k) = candidates.choose(&mut rng) {
                objects.push((*k, rng.random_range(0..receptacles.len())));
            }
        }
        objects.shuffle(&mut rng);
        let mut numbered: Vec<Object> = Vec::with_capacity(objects.len());
        for (k, location) in objects {
            let number = numbered.iter().filter(|o| o.kind == k).count() as u8 + 1;
            numbered.push(Object {
                kind: k,
                number,
                location,
            });
        }
        Instance {
            room,
            receptacles,
            objects: numbered,
            goal,
        }
    }

    /// The kind of room.
    pub fn room(&self) -> Room {
        self.room
    }

    /// The receptacles, in the order the room lists them.
    pub fn receptacles(&self) -> &[Receptacle] {
        &self.receptacles
    }

    /// The objects, in the order receptacles list their contents.
    pub fn objects(&self) -> &[Object] {
        &self.objects
    }

    /// The goal.
    pub fn goal(&self) -> &Goal {
        &self.goal
    }

    /// The index of the receptacle named `kind number` (two words), if the room has it.
    pub fn find_receptacle(&self, kind: &str, number: &str) -> Option<usize> {
        let kind = ReceptacleKind::from_name(kind)?;
        let number: u8 = number.parse().ok()?;
        self.receptacles
            .iter()
            .position(|r| r.kind == kind && r.number == number)
    }

    /// The index of the object named `kind number` (two words), if the room has it.
    pub fn find_object(&self, kind: &str, number: &str) -> Option<usize> {
        let kind = ObjectKind::from_name(kind)?;
        let number: u8 = number.parse().ok()?;
        self.objects
            .iter()
            .position(|o| o.kind == kind && o.number == number)
    }

    /// The canonical text of the instance: room, goal, receptacles in order with their open
    /// state, objects in order with their place. Two instances are equal exactly when their
    /// keys are; the split is decided by a hash of it.
    pub fn key(&self) -> String {
        let mut out = String::with_capacity(512);
        let _ = write!(
            out,
            "{} | {} {} |",
            self.room.name(),
            self.goal.kind().name(),
            self.goal.text()
        );
        for r in &self.receptacles {
            let state = if r.open { "open" } else { "closed" };
            let _ = write!(out, " {} {} {state},", r.kind.name(), r.number);
        }
        out.push_str(" |");
        for o in &self.objects {
            let _ = write!(out, " {} {} @{},", o.kind.name(), o.number, o.location);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_respects_the_bounds() {
        for d in 1..=3u8 {
            for seed in 0..2_000 {
                let inst = Instance::generate(seed, d);
                let n = inst.receptacles().len();
                assert!((4..=MAX_RECEPTACLES).contains(&n));
                for r in inst.receptacles() {
                    assert!(usize::from(r.number) <= r.kind.max_count().min(MAX_NUMBER));
                    assert!(r.open || r.kind.openable());
                }
                for o in inst.objects() {
                    assert!(usize::from(o.number) <= MAX_PER_KIND);
                    assert!(o.location < n);
                }
                let goal_objects = inst
                    .objects()
                    .iter()
                    .filter(|o| o.kind == inst.goal().object())
                    .count();
                let needed = if inst.goal().kind() == GoalKind::PickTwoObjAndPlace {
                    2
                } else {
                    1
                };
                assert!(goal_objects >= needed, "{}", inst.key());
                if let Goal::Place { target, kind, .. } = *inst.goal() {
                    assert!(inst.receptacles().iter().any(|r| r.kind == target));
                    if let Some(p) = kind.process() {
                        assert!(inst.receptacles().iter().any(|r| r.kind == p.appliance()));
                    }
                }
                if d == 1 {
                    assert!(inst.receptacles().iter().all(|r| r.open));
                }
            }
        }
    }
}
