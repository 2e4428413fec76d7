//! Instructions: what the agent must buy, generated from a target product, and the reward of a
//! purchase.
//!
//! A goal names a product type, some of the target's attributes, one value of some of its option
//! groups and a price cap, for example `i want to buy shockproof and heavy bass bluetooth speaker
//! , with color : grey , and price lower than 53.00 dollars`. At generation the oracle's query is run through
//! the real search, and a goal is kept only if a product satisfying it shows on the first results
//! page (and, at difficulty 3, next to a look-alike that does not satisfy it).

use rand::seq::index::sample;
use rand::{Rng, RngCore};

use super::catalog::{Catalog, PAGE_SIZE, Product, TYPES, is_suffix, join_and};

/// How instructions open; chosen per goal.
pub(crate) const LEADS: [&str; 4] = ["i need", "i am looking for", "find me", "i want to buy"];

/// What the agent must buy.
#[derive(Clone, Debug, PartialEq)]
pub struct Goal {
    /// The instruction shown to the agent; also the goal's canonical content, which decides its
    /// split.
    pub instruction: String,
    /// Difficulty 1..=3 it was generated for.
    pub difficulty: u8,
    /// Index of the product type in [`TYPES`].
    pub kind: usize,
    /// Attribute phrases the product must have.
    pub attributes: Vec<&'static str>,
    /// `(group, value)` options the agent must select.
    pub options: Vec<(&'static str, &'static str)>,
    /// Price cap in whole dollars: the price must be at most this.
    pub cap_dollars: u32,
    /// The product the goal was generated from.
    pub target: u32,
    /// The keywords the oracle searches for.
    pub query: String,
    /// The product the oracle buys: the first of the query's first results page that satisfies
    /// the goal.
    pub pick: u32,
}

impl Goal {
    /// Whether buying `product` with the right options selected earns reward 1: right type,
    /// every attribute, every option value available, price within the cap.
    pub fn satisfied_by(&self, product: &Product) -> bool {
        product.kind == self.kind
            && self
                .attributes
                .iter()
                .all(|a| product.attributes.contains(a))
            && self.options.iter().all(|(g, v)| {
                product
                    .options
                    .iter()
                    .any(|(pg, values)| pg == g && values.contains(v))
            })
            && product.price_cents <= self.cap_dollars * 100
    }

    /// The reward for buying `product` with `selected` option values (one per option group of
    /// the product, in its order): WebShop's
    /// `r_type * (attributes matched + options matched + [price <= cap]) / (attributes + options + 1)`,
    /// with `r_type` 1 for the right type, 0.5 for another type of the same category, 0.1
    /// otherwise.
    pub fn reward(&self, product: &Product, selected: &[Option<&str>]) -> f32 {
        let r_type = if product.kind == self.kind {
            1.0
        } else if product.product_type().category == TYPES[self.kind].category {
            0.5
        } else {
            0.1
        };
        let attributes = self
            .attributes
            .iter()
            .filter(|a| product.attributes.contains(a))
            .count();
        let options = self
            .options
            .iter()
            .filter(|(g, v)| {
                product
                    .options
                    .iter()
                    .zip(selected)
                    .any(|((pg, _), s)| pg == g && *s == Some(*v))
            })
            .count();
        let price = usize::from(product.price_cents <= self.cap_dollars * 100);
        let total = self.attributes.len() + self.options.len() + 1;
        r_type * (attributes + options + price) as f32 / total as f32
    }
}

/// A goal for `difficulty` from random choices, or `None` when the drawn goal fails the checks
/// (the caller draws again).
///
/// | difficulty | attributes | options | cap |
/// |---|---|---|---|
/// | 1 | 1, one shown in the title | 1 | price + 30–60 % |
/// | 2 | 2 | up to 2 | price + 10–30 % |
/// | 3 | 3 | every group (up to 3) | the next whole dollar |
///
/// At difficulty 3 the first results page must also show a non-satisfying product of the
/// target's or the pick's family (a near-duplicate).
pub(crate) fn generate(catalog: &Catalog, rng: &mut impl RngCore, difficulty: u8) -> Option<Goal> {
    let target = rng.random_range(0..catalog.len() as u32);
    let product = catalog.product(target)?;
    let ty = product.product_type();
    let attributes: Vec<&'static str> = if difficulty <= 1 {
        // One of the two title attributes: the obvious keyword.
        vec![*product.attributes.get(rng.random_range(0..2))?]
    } else {
        let k = usize::from(difficulty).min(product.attributes.len());
        let mut picked = sample(rng, product.attributes.len(), k).into_vec();
        picked.sort_unstable();
        picked
            .into_iter()
            .filter_map(|i| product.attributes.get(i).copied())
            .collect()
    };
    let groups = match difficulty {
        1 => 1,
        2 => 2,
        _ => 3,
    }
    .min(product.options.len());
    let mut chosen = sample(rng, product.options.len(), groups).into_vec();
    chosen.sort_unstable();
    let options: Vec<(&'static str, &'static str)> = chosen
        .into_iter()
        .filter_map(|g| {
            let (group, values) = product.options.get(g)?;
            Some((*group, *values.get(rng.random_range(0..values.len()))?))
        })
        .collect();
    let price = product.price_cents;
    let cap_cents = match difficulty {
        1 => price + price * rng.random_range(30..=60) / 100,
        2 => price + price * rng.random_range(10..=30) / 100,
        _ => price,
    };
    let cap_dollars = cap_cents / 100 + 1;
    let lead = LEADS[rng.random_range(0..LEADS.len())];
    let instruction = instruction(lead, ty.noun, &attributes, &options, cap_dollars);
    let query = format!("{} {}", attributes.join(" "), ty.noun);
    let mut goal = Goal {
        instruction,
        difficulty,
        kind: product.kind,
        attributes,
        options,
        cap_dollars,
        target,
        query,
        pick: target,
    };
    let results = catalog.search(&goal.query);
    let first_page = results.get(..PAGE_SIZE.min(results.len()))?;
    goal.pick = *first_page
        .iter()
        .find(|&&p| catalog.product(p).is_some_and(|p| goal.satisfied_by(p)))?;
    if difficulty >= 3 {
        let families = [product.family, catalog.product(goal.pick)?.family];
        let lookalike = first_page.iter().any(|&p| {
            catalog
                .product(p)
                .is_some_and(|p| families.contains(&p.family) && !goal.satisfied_by(p))
        });
        if !lookalike {
            return None;
        }
    }
    Some(goal)
}

/// `{lead} {prefix attributes} {noun} {suffix attributes} , with {group} : {value} and ... ,
/// and price lower than {cap}.00 dollars`.
fn instruction(
    lead: &str,
    noun: &str,
    attributes: &[&str],
    options: &[(&str, &str)],
    cap_dollars: u32,
) -> String {
    let prefix: Vec<&str> = attributes
        .iter()
        .copied()
        .filter(|a| !is_suffix(a))
        .collect();
    let suffix: Vec<&str> = attributes
        .iter()
        .copied()
        .filter(|a| is_suffix(a))
        .collect();
    let mut text = lead.to_string();
    if !prefix.is_empty() {
        text.push(' ');
        text.push_str(&join_and(&prefix));
    }
    text.push(' ');
    text.push_str(noun);
    if !suffix.is_empty() {
        text.push(' ');
        text.push_str(&join_and(&suffix));
    }
    if !options.is_empty() {
        let options: Vec<String> = options.iter().map(|(g, v)| format!("{g} : {v}")).collect();
        text.push_str(" , with ");
        text.push_str(&options.join(" and "));
    }
    text.push_str(&format!(" , and price lower than {cap_dollars}.00 dollars"));
    text
}

/// Words of the instructions besides the catalogue's words and the caps.
pub(crate) const INSTRUCTION_WORDS: &[&str] =
    &["with", "and", "price", "lower", "than", "dollars", ",", ":"];
