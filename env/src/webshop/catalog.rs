//! The WebShop task's catalogue: products generated deterministically from a seed, and the
//! BM25 index that search runs on.
//!
//! Products come in **families**: a base product and up to three near-duplicates of the same
//! brand and type, each with one attribute swapped, a slightly different price and different
//! options. Families are what makes hard instances hard: a search for the right words shows
//! several look-alikes of which only some satisfy the instruction.
//!
//! Every word of a product (brand, type noun, attribute phrases, option values, id, price) is
//! drawn from fixed tables or a bounded range, so the task's vocabulary stays small.

use std::collections::HashMap;

use rand::seq::SliceRandom;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Products in a catalogue.
pub const CATALOGUE_SIZE: usize = 1200;

/// Most results a search returns (as in WebShop), shown ten per page.
pub const MAX_RESULTS: usize = 50;

/// Results shown per results page.
pub const PAGE_SIZE: usize = 10;

/// Attributes per type; a product has between 3 and 5 of them.
const ATTRIBUTES_PER_TYPE: usize = 8;

/// A product type: its noun, category, candidate attributes, option groups and price range.
#[derive(Debug)]
pub struct ProductType {
    /// The noun that names the type in titles and instructions (`shampoo`, `running shoes`).
    pub noun: &'static str,
    /// The category; buying a product of another type in the same category earns half the
    /// type credit.
    pub category: &'static str,
    /// The attribute phrases products of this type may have. Phrases starting with `for` or
    /// `with` follow the noun in titles and instructions, the others precede it.
    pub attributes: [&'static str; ATTRIBUTES_PER_TYPE],
    /// Option groups (`size`, `color`, ...) and the values each may take; values are distinct
    /// across the groups of a type, so a clicked value names its group.
    pub groups: &'static [(&'static str, &'static [&'static str])],
    /// Lowest and highest whole-dollar price.
    pub price: (u32, u32),
}

const SCENT: (&str, &[&str]) = ("scent", &["lavender", "citrus", "coconut", "unscented"]);
const COLOR: (&str, &[&str]) = ("color", &["black", "white", "navy", "red", "grey"]);
const PACK: (&str, &[&str]) = ("pack", &["pack of 1", "pack of 2", "pack of 3"]);
const CLOTH_SIZE: (&str, &[&str]) = ("size", &["small", "medium", "large", "x-large"]);

/// The product types of every catalogue.
pub const TYPES: &[ProductType] = &[
    ProductType {
        noun: "shampoo",
        category: "beauty",
        attributes: [
            "long lasting",
            "sulfate free",
            "paraben free",
            "for dry hair",
            "natural ingredients",
            "cruelty free",
            "travel size",
            "fragrance free",
        ],
        groups: &[
            ("size", &["8 fl oz", "12 fl oz", "16 fl oz", "32 fl oz"]),
            SCENT,
        ],
        price: (5, 29),
    },
    ProductType {
        noun: "conditioner",
        category: "beauty",
        attributes: [
            "sulfate free",
            "for curly hair",
            "paraben free",
            "natural ingredients",
            "cruelty free",
            "long lasting",
            "for dry hair",
            "leave in",
        ],
        groups: &[("size", &["8 fl oz", "12 fl oz", "16 fl oz"]), SCENT, PACK],
        price: (6, 32),
    },
    ProductType {
        noun: "face cream",
        category: "beauty",
        attributes: [
            "anti aging",
            "fragrance free",
            "for sensitive skin",
            "non greasy",
            "cruelty free",
            "with spf 30",
            "paraben free",
            "with hyaluronic acid",
        ],
        groups: &[("size", &["1.7 oz", "3.4 oz", "5 oz"])],
        price: (9, 59),
    },
    ProductType {
        noun: "coffee",
        category: "grocery",
        attributes: [
            "gluten free",
            "organic",
            "fair trade",
            "dark roast",
            "low acid",
            "non gmo",
            "decaf",
            "whole bean",
        ],
        groups: &[
            ("flavor", &["vanilla", "hazelnut", "caramel", "original"]),
            ("size", &["12 oz", "24 oz", "2 lb"]),
            PACK,
        ],
        price: (7, 39),
    },
    ProductType {
        noun: "tea",
        category: "grocery",
        attributes: [
            "organic",
            "caffeine free",
            "gluten free",
            "non gmo",
            "fair trade",
            "sugar free",
            "individually wrapped",
            "kosher",
        ],
        groups: &[
            ("flavor", &["green", "chamomile", "peppermint", "earl grey"]),
            ("count", &["20 count", "40 count", "100 count"]),
        ],
        price: (4, 24),
    },
    ProductType {
        noun: "protein bars",
        category: "grocery",
        attributes: [
            "gluten free",
            "high protein",
            "low sugar",
            "keto friendly",
            "vegan",
            "non gmo",
            "individually wrapped",
            "dairy free",
        ],
        groups: &[
            (
                "flavor",
                &["chocolate", "peanut butter", "vanilla", "cookie dough"],
            ),
            ("count", &["12 count", "24 count"]),
        ],
        price: (12, 45),
    },
    ProductType {
        noun: "headphones",
        category: "electronics",
        attributes: [
            "wireless",
            "noise cancelling",
            "long battery life",
            "water resistant",
            "over ear",
            "with microphone",
            "foldable",
            "fast charging",
        ],
        groups: &[COLOR],
        price: (19, 149),
    },
    ProductType {
        noun: "bluetooth speaker",
        category: "electronics",
        attributes: [
            "waterproof",
            "portable",
            "long battery life",
            "with microphone",
            "heavy bass",
            "fast charging",
            "lightweight",
            "shockproof",
        ],
        groups: &[COLOR],
        price: (15, 119),
    },
    ProductType {
        noun: "phone charger",
        category: "electronics",
        attributes: [
            "fast charging",
            "usb c",
            "wireless",
            "compact",
            "dual port",
            "with braided cable",
            "lightweight",
            "certified",
        ],
        groups: &[
            ("color", &["black", "white"]),
            ("length", &["3 ft", "6 ft", "10 ft"]),
            PACK,
        ],
        price: (6, 35),
    },
    ProductType {
        noun: "keyboard",
        category: "electronics",
        attributes: [
            "wireless",
            "backlit",
            "mechanical",
            "ergonomic",
            "rechargeable",
            "quiet",
            "compact",
            "water resistant",
        ],
        groups: &[COLOR],
        price: (18, 129),
    },
    ProductType {
        noun: "running shoes",
        category: "fashion",
        attributes: [
            "non slip",
            "lightweight",
            "breathable",
            "with memory foam",
            "water resistant",
            "with arch support",
            "slip on",
            "wide width",
        ],
        groups: &[("size", &["7", "8", "9", "10", "11", "12"]), COLOR],
        price: (25, 139),
    },
    ProductType {
        noun: "shirt",
        category: "fashion",
        attributes: [
            "short sleeve",
            "cotton",
            "machine wash",
            "slim fit",
            "moisture wicking",
            "quick dry",
            "long sleeve",
            "relaxed fit",
        ],
        groups: &[CLOTH_SIZE, COLOR],
        price: (9, 45),
    },
    ProductType {
        noun: "jacket",
        category: "fashion",
        attributes: [
            "water resistant",
            "hooded",
            "lightweight",
            "fleece lined",
            "windproof",
            "packable",
            "machine wash",
            "with zipper pockets",
        ],
        groups: &[CLOTH_SIZE, COLOR],
        price: (29, 149),
    },
    ProductType {
        noun: "bed sheets",
        category: "home",
        attributes: [
            "deep pocket",
            "machine wash",
            "wrinkle free",
            "cooling",
            "hypoallergenic",
            "cotton",
            "fade resistant",
            "soft",
        ],
        groups: &[("size", &["twin", "full", "queen", "king"]), COLOR],
        price: (19, 89),
    },
    ProductType {
        noun: "candle",
        category: "home",
        attributes: [
            "long lasting",
            "soy wax",
            "natural ingredients",
            "lead free",
            "gift set",
            "clean burning",
            "hand poured",
            "travel size",
        ],
        groups: &[
            (
                "scent",
                &["lavender", "vanilla", "sandalwood", "fresh linen"],
            ),
            PACK,
        ],
        price: (8, 39),
    },
    ProductType {
        noun: "water bottle",
        category: "home",
        attributes: [
            "bpa free",
            "leak proof",
            "insulated",
            "dishwasher safe",
            "wide mouth",
            "lightweight",
            "with straw",
            "stainless steel",
        ],
        groups: &[("size", &["18 oz", "24 oz", "32 oz", "40 oz"]), COLOR],
        price: (9, 45),
    },
];

/// Made-up brand names: single words, so each is one token and says nothing by itself.
pub const BRANDS: [&str; 32] = [
    "lumora", "vexio", "tandri", "koruma", "belvik", "orsana", "pelora", "quinzo", "ravilo",
    "sorvek", "taluma", "ulmira", "venaro", "wexley", "yarvin", "zolani", "ambrex", "corvina",
    "dellon", "efrano", "galvia", "hollin", "ivoran", "jasmer", "kelvo", "lornix", "mavido",
    "nerova", "olvin", "pravex", "quorra", "rendix",
];

/// One product of the catalogue.
#[derive(Clone, Debug, PartialEq)]
pub struct Product {
    /// The ASIN-like id the agent clicks, `b0` and four digits.
    pub id: String,
    /// Index of its type in [`TYPES`].
    pub kind: usize,
    /// Its family: a base product and its near-duplicates share one.
    pub family: u32,
    /// Its brand.
    pub brand: &'static str,
    /// The title shown on results and item pages: brand, the first two attributes, the noun.
    pub title: String,
    /// Price in cents; always whole dollars plus 49 or 99 cents.
    pub price_cents: u32,
    /// Rating in half stars, 5 (2.5 stars) to 10 (5.0 stars).
    pub rating_halves: u8,
    /// Its attribute phrases; the first two appear in the title.
    pub attributes: Vec<&'static str>,
    /// Available values of each of its type's option groups, in the type's order.
    pub options: Vec<(&'static str, Vec<&'static str>)>,
}

impl Product {
    /// The product's type.
    pub fn product_type(&self) -> &'static ProductType {
        // `kind` is always a valid index: products are only built from `TYPES`.
        &TYPES[self.kind]
    }

    /// The price as shown: `12.99`.
    pub fn price(&self) -> String {
        format_price(self.price_cents)
    }

    /// The rating as shown: `4.5`.
    pub fn rating(&self) -> String {
        format!(
            "{}.{}",
            self.rating_halves / 2,
            5 * (self.rating_halves % 2)
        )
    }

    /// The description page's text.
    pub fn description(&self) -> String {
        format!(
            "this {} from {} is {} .",
            self.product_type().noun,
            self.brand,
            join_and(&self.attributes)
        )
    }
}

/// `12.99` for 1299 cents.
pub fn format_price(cents: u32) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}

/// `a`, `a and b`, `a , b and c`.
pub(crate) fn join_and(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(" , ")),
    }
}

/// Whether an attribute phrase follows the noun (`shampoo for dry hair`).
pub(crate) fn is_suffix(attribute: &str) -> bool {
    attribute.starts_with("for ") || attribute.starts_with("with ")
}

/// `lumora long lasting shampoo for dry hair`: the brand, the prefix attributes, the noun, the
/// suffix attributes, of the first two attributes (the others show only on the features and
/// description pages).
fn title(brand: &str, noun: &str, attributes: &[&str]) -> String {
    let attributes = attributes.get(..2).unwrap_or(attributes);
    let mut words = vec![brand];
    words.extend(attributes.iter().filter(|a| !is_suffix(a)));
    words.push(noun);
    words.extend(attributes.iter().filter(|a| is_suffix(a)));
    words.join(" ")
}

/// The lowercase search terms of a text: runs of ASCII letters, digits and dots.
pub(crate) fn terms(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
        .filter(|t| !t.is_empty())
        .map(str::to_ascii_lowercase)
}

/// The generated catalogue with its search index.
#[derive(Debug)]
pub struct Catalog {
    products: Vec<Product>,
    index: Bm25,
}

impl Catalog {
    /// The catalogue generated from `seed`: [`CATALOGUE_SIZE`] products in families, types
    /// taken in turn.
    pub fn generate(seed: u64) -> Catalog {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut numbers: Vec<u32> = (0..10_000).collect();
        numbers.shuffle(&mut rng);
        let mut products: Vec<Product> = Vec::with_capacity(CATALOGUE_SIZE);
        let mut family = 0u32;
        while products.len() < CATALOGUE_SIZE {
            let kind = family as usize % TYPES.len();
            let size = rng.random_range(1..=4usize);
            let base = random_product(&mut rng, kind, family);
            products.push(base.clone());
            for _ in 1..size {
                if products.len() >= CATALOGUE_SIZE {
                    break;
                }
                products.push(near_duplicate(&mut rng, &base));
            }
            family += 1;
        }
        for (product, number) in products.iter_mut().zip(numbers) {
            product.id = format!("b0{number:04}");
        }
        let index = Bm25::new(products.iter().map(indexed_text));
        Catalog { products, index }
    }

    /// All products; a product's index is its position here.
    pub fn products(&self) -> &[Product] {
        &self.products
    }

    /// Product `index`, if there is one.
    pub fn product(&self, index: u32) -> Option<&Product> {
        self.products.get(index as usize)
    }

    /// Number of products.
    pub fn len(&self) -> usize {
        self.products.len()
    }

    /// Whether the catalogue is empty (never, for a generated one).
    pub fn is_empty(&self) -> bool {
        self.products.is_empty()
    }

    /// The products matching `query`, best first by BM25 (ties by catalogue order), at most
    /// [`MAX_RESULTS`]; products sharing no term with the query are left out.
    pub fn search(&self, query: &str) -> Vec<u32> {
        self.index.search(query, MAX_RESULTS)
    }
}

/// The text a product is indexed by: title, all attributes and all option values.
fn indexed_text(product: &Product) -> String {
    let mut text = product.title.clone();
    for a in &product.attributes {
        text.push(' ');
        text.push_str(a);
    }
    for (_, values) in &product.options {
        for v in values {
            text.push(' ');
            text.push_str(v);
        }
    }
    text
}

fn random_price(rng: &mut ChaCha8Rng, (low, high): (u32, u32)) -> u32 {
    let dollars = rng.random_range(low..=high);
    dollars * 100 + if rng.random_bool(0.5) { 49 } else { 99 }
}

/// A random subset of `values` (at least two, or all if fewer), in the type's order.
fn random_values(rng: &mut ChaCha8Rng, values: &[&'static str]) -> Vec<&'static str> {
    let n = rng.random_range(2.min(values.len())..=values.len());
    let mut picked = sample(rng, values.len(), n).into_vec();
    picked.sort_unstable();
    picked
        .into_iter()
        .filter_map(|i| values.get(i).copied())
        .collect()
}

fn random_product(rng: &mut ChaCha8Rng, kind: usize, family: u32) -> Product {
    let ty = &TYPES[kind];
    let brand = BRANDS[rng.random_range(0..BRANDS.len())];
    let k = rng.random_range(3..=5);
    let attributes: Vec<&'static str> = sample(rng, ATTRIBUTES_PER_TYPE, k)
        .into_iter()
        .map(|i| ty.attributes[i])
        .collect();
    let options = ty
        .groups
        .iter()
        .map(|(group, values)| (*group, random_values(rng, values)))
        .collect();
    Product {
        id: String::new(),
        kind,
        family,
        brand,
        title: title(brand, ty.noun, &attributes),
        price_cents: random_price(rng, ty.price),
        rating_halves: rng.random_range(5..=10),
        attributes,
        options,
    }
}

/// A look-alike of `base`: one attribute swapped for another of the type, the price moved by
/// one to four dollars, one option group redrawn, a new rating.
fn near_duplicate(rng: &mut ChaCha8Rng, base: &Product) -> Product {
    let ty = base.product_type();
    let mut p = base.clone();
    let unused: Vec<&'static str> = ty
        .attributes
        .iter()
        .copied()
        .filter(|a| !p.attributes.contains(a))
        .collect();
    let slot = rng.random_range(0..p.attributes.len());
    p.attributes[slot] = unused[rng.random_range(0..unused.len())];
    p.title = title(p.brand, ty.noun, &p.attributes);
    let step = rng.random_range(1..=4u32) * 100;
    p.price_cents = if rng.random_bool(0.5) || p.price_cents <= step + 100 {
        p.price_cents + step
    } else {
        p.price_cents - step
    };
    let g = rng.random_range(0..ty.groups.len());
    p.options[g].1 = random_values(rng, ty.groups[g].1);
    p.rating_halves = rng.random_range(5..=10);
    p
}

/// An Okapi BM25 index (k1 = 1.2, b = 0.75) over the products' indexed text.
#[derive(Debug)]
struct Bm25 {
    terms: HashMap<String, u32>,
    /// Per term: `(product, term frequency)`, by product.
    postings: Vec<Vec<(u32, f32)>>,
    /// Per term: its inverse document frequency.
    idf: Vec<f32>,
    /// Per product: `k1 * (1 - b + b * length / average length)`.
    norm: Vec<f32>,
}

const K1: f32 = 1.2;
const B: f32 = 0.75;

impl Bm25 {
    fn new(texts: impl Iterator<Item = String>) -> Bm25 {
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut postings: Vec<Vec<(u32, f32)>> = Vec::new();
        let mut lengths = Vec::new();
        for (doc, text) in texts.enumerate() {
            let mut length = 0usize;
            for term in terms(&text) {
                length += 1;
                let next = postings.len() as u32;
                let id = *ids.entry(term).or_insert(next);
                if id == next {
                    postings.push(Vec::new());
                }
                let list = &mut postings[id as usize];
                match list.last_mut() {
                    Some((d, tf)) if *d == doc as u32 => *tf += 1.0,
                    _ => list.push((doc as u32, 1.0)),
                }
            }
            lengths.push(length as f32);
        }
        let n = lengths.len() as f64;
        let average = (lengths.iter().map(|&l| f64::from(l)).sum::<f64>() / n.max(1.0)) as f32;
        // In f64, then rounded: the ranking (and so which goals are kept) does not hinge on the
        // last bit of a platform's `ln`.
        let idf = postings
            .iter()
            .map(|list| {
                let df = list.len() as f64;
                (1.0 + (n - df + 0.5) / (df + 0.5)).ln() as f32
            })
            .collect();
        let norm = lengths
            .iter()
            .map(|l| K1 * (1.0 - B + B * l / average))
            .collect();
        Bm25 {
            terms: ids,
            postings,
            idf,
            norm,
        }
    }

    fn search(&self, query: &str, limit: usize) -> Vec<u32> {
        let mut ids: Vec<u32> = terms(query)
            .filter_map(|t| self.terms.get(&t).copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut scores = vec![0.0f32; self.norm.len()];
        let mut touched: Vec<u32> = Vec::new();
        for id in ids {
            let (Some(list), Some(&idf)) =
                (self.postings.get(id as usize), self.idf.get(id as usize))
            else {
                continue;
            };
            for &(doc, tf) in list {
                if let (Some(score), Some(&norm)) =
                    (scores.get_mut(doc as usize), self.norm.get(doc as usize))
                {
                    if *score == 0.0 {
                        touched.push(doc);
                    }
                    *score += idf * tf * (K1 + 1.0) / (tf + norm);
                }
            }
        }
        // Every term adds a positive score (idf > 0), so a touched product has a positive one.
        let mut hits: Vec<(f32, u32)> = touched
            .into_iter()
            .filter_map(|doc| Some((*scores.get(doc as usize)?, doc)))
            .collect();
        let by_rank = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if hits.len() > limit {
            hits.select_nth_unstable_by(limit, by_rank);
            hits.truncate(limit);
        }
        hits.sort_unstable_by(by_rank);
        hits.into_iter().map(|(_, doc)| doc).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_values_are_distinct_within_a_type() {
        for ty in TYPES {
            let mut all: Vec<&str> = ty
                .groups
                .iter()
                .flat_map(|(_, v)| v.iter().copied())
                .collect();
            let n = all.len();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), n, "{}", ty.noun);
            let mut attrs = ty.attributes.to_vec();
            attrs.sort_unstable();
            attrs.dedup();
            assert_eq!(attrs.len(), ATTRIBUTES_PER_TYPE, "{}", ty.noun);
        }
    }

    #[test]
    fn bm25_prefers_rarer_and_repeated_terms() {
        let index = Bm25::new(
            ["red shoes", "blue shoes", "red red hat", "green hat"]
                .into_iter()
                .map(str::to_string),
        );
        assert_eq!(index.search("red", 10), vec![2, 0]);
        assert_eq!(index.search("blue shoes", 10), vec![1, 0]);
        assert_eq!(index.search("purple", 10), Vec::<u32>::new());
        assert_eq!(index.search("hat shoes red", 1).len(), 1);
    }
}
