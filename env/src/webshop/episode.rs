//! One WebShop episode: the page the agent is on, what each click does, the pages' text, the
//! reward of a purchase and the oracle.
//!
//! Pages mirror WebShop's: the search page, results pages (ten products each), an item page
//! (title, price, rating, options by group, buttons), and the item's description and features
//! pages. Clickable things are shown in brackets: `[next >]`, `[b04821]`, `[12 fl oz]`.

use std::sync::Arc;

use serde_json::json;

use super::catalog::{Catalog, PAGE_SIZE, Product, join_and};
use super::goal::Goal;
use super::tools::{self, Action};
use crate::{Environment, Reset, Status, Step, ToolCall};

/// The page the agent is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Page {
    /// The search page: only `search_action` works.
    Search,
    /// A results page of the last search.
    Results,
    /// A product's page.
    Item,
    /// A product's description.
    Description,
    /// A product's features.
    Features,
}

/// Button texts.
const BACK: &str = "back to search";
const NEXT: &str = "next >";
const PREV: &str = "< prev";
const DESCRIPTION: &str = "description";
const FEATURES: &str = "features";
const BUY: &str = "buy now";

/// One episode of a WebShop goal.
#[derive(Clone, Debug)]
pub struct WebshopEnv {
    catalog: Arc<Catalog>,
    goal: Arc<Goal>,
    page: Page,
    /// Products of the last search, best first.
    results: Vec<u32>,
    /// The results page shown (0-based).
    results_page: usize,
    /// The product of the item, description and features pages.
    product: u32,
    /// The selected value of each option group of `product`.
    selected: Vec<Option<&'static str>>,
    /// The product bought, which ends the episode.
    bought: Option<u32>,
    reward: f32,
}

impl WebshopEnv {
    /// An episode of `goal` in `catalog`.
    pub fn new(catalog: Arc<Catalog>, goal: Arc<Goal>) -> WebshopEnv {
        WebshopEnv {
            catalog,
            goal,
            page: Page::Search,
            results: Vec::new(),
            results_page: 0,
            product: 0,
            selected: Vec::new(),
            bought: None,
            reward: 0.0,
        }
    }

    /// The goal of this episode.
    pub fn goal(&self) -> &Goal {
        &self.goal
    }

    /// The page the agent is on.
    pub fn page(&self) -> Page {
        self.page
    }

    /// The product bought, once the agent clicked `buy now`.
    pub fn bought(&self) -> Option<&Product> {
        self.bought.and_then(|p| self.catalog.product(p))
    }

    /// The reward of the purchase (0 before it).
    pub fn reward(&self) -> f32 {
        self.reward
    }

    /// Whether the episode has ended (the agent bought something).
    pub fn finished(&self) -> bool {
        self.bought.is_some()
    }

    fn current(&self) -> Option<&Product> {
        self.catalog.product(self.product)
    }

    /// The products of the results page shown.
    fn shown(&self) -> &[u32] {
        let start = (self.results_page * PAGE_SIZE).min(self.results.len());
        let end = (start + PAGE_SIZE).min(self.results.len());
        self.results.get(start..end).unwrap_or_default()
    }

    fn has_next(&self) -> bool {
        (self.results_page + 1) * PAGE_SIZE < self.results.len()
    }

    fn pages(&self) -> usize {
        self.results.len().div_ceil(PAGE_SIZE).max(1)
    }

    fn render(&self) -> String {
        match self.page {
            Page::Search => "search page".to_string(),
            Page::Results => self.render_results(),
            Page::Item => self.render_item(),
            Page::Description | Page::Features => {
                let Some(p) = self.current() else {
                    return String::new();
                };
                let text = if self.page == Page::Description {
                    format!("description : {}", p.description())
                } else {
                    format!("features : {}", p.attributes.join(" ; "))
                };
                format!("[{BACK}] [{PREV}]\n{text}")
            }
        }
    }

    fn render_results(&self) -> String {
        let mut out = format!(
            "results page {} of {} , {} results\n[{BACK}]",
            self.results_page + 1,
            self.pages(),
            self.results.len()
        );
        if self.results_page > 0 {
            out.push_str(&format!(" [{PREV}]"));
        }
        if self.has_next() {
            out.push_str(&format!(" [{NEXT}]"));
        }
        for p in self.shown().iter().filter_map(|&p| self.catalog.product(p)) {
            out.push_str(&format!("\n[{}] {} $ {}", p.id, p.title, p.price()));
        }
        out
    }

    fn render_item(&self) -> String {
        let Some(p) = self.current() else {
            return String::new();
        };
        let mut out = format!(
            "[{BACK}] [{PREV}]\n{} {}\nprice : $ {} rating : {}",
            p.id,
            p.title,
            p.price(),
            p.rating()
        );
        for (group, values) in &p.options {
            out.push_str(&format!("\n{group} :"));
            for v in values {
                out.push_str(&format!(" [{v}]"));
            }
        }
        let selected: Vec<&str> = self.selected.iter().flatten().copied().collect();
        if selected.is_empty() {
            out.push_str("\nselected : none");
        } else {
            out.push_str(&format!("\nselected : {}", join_and(&selected)));
        }
        out.push_str(&format!("\n[{DESCRIPTION}] [{FEATURES}] [{BUY}]"));
        out
    }

    /// Executes a checked action; `Ok` is the observation.
    fn execute(&mut self, action: Action<'_>) -> Result<String, String> {
        match action {
            Action::Search(keywords) => {
                if self.page != Page::Search {
                    return Err(
                        "Error: search is only available on the search page ; click back to search first"
                            .to_string(),
                    );
                }
                if keywords.is_empty() {
                    return Err("Error: keywords are empty".to_string());
                }
                self.results = self.catalog.search(keywords);
                self.results_page = 0;
                self.page = Page::Results;
            }
            Action::Click(value) => self.click(value)?,
        }
        Ok(self.render())
    }

    fn click(&mut self, value: &str) -> Result<(), String> {
        let value = value
            .strip_prefix('[')
            .and_then(|v| v.strip_suffix(']'))
            .unwrap_or(value)
            .trim()
            .to_ascii_lowercase();
        let not_clickable = || "Error: value is not clickable on this page".to_string();
        if self.page == Page::Search {
            return Err(
                "Error: nothing to click on the search page ; use search_action".to_string(),
            );
        }
        if value == BACK {
            self.page = Page::Search;
            return Ok(());
        }
        match self.page {
            Page::Search => {}
            Page::Results => {
                if value == NEXT && self.has_next() {
                    self.results_page += 1;
                } else if value == PREV && self.results_page > 0 {
                    self.results_page -= 1;
                } else {
                    let product = *self
                        .shown()
                        .iter()
                        .find(|&&p| self.catalog.product(p).is_some_and(|p| p.id == value))
                        .ok_or_else(not_clickable)?;
                    let groups = self.catalog.product(product).map_or(0, |p| p.options.len());
                    self.product = product;
                    self.selected = vec![None; groups];
                    self.page = Page::Item;
                }
            }
            Page::Item => match value.as_str() {
                PREV => self.page = Page::Results,
                DESCRIPTION => self.page = Page::Description,
                FEATURES => self.page = Page::Features,
                BUY => {
                    let product = self.current().ok_or_else(not_clickable)?;
                    self.reward = self.goal.reward(product, &self.selected);
                    self.bought = Some(self.product);
                }
                _ => {
                    let catalog = Arc::clone(&self.catalog);
                    let product = catalog.product(self.product).ok_or_else(not_clickable)?;
                    let (group, v) = product
                        .options
                        .iter()
                        .enumerate()
                        .find_map(|(g, (_, values))| {
                            values.iter().find(|v| **v == value).map(|v| (g, *v))
                        })
                        .ok_or_else(not_clickable)?;
                    let slot = self.selected.get_mut(group).ok_or_else(not_clickable)?;
                    *slot = Some(v);
                }
            },
            Page::Description | Page::Features => {
                if value == PREV {
                    self.page = Page::Item;
                } else {
                    return Err(not_clickable());
                }
            }
        }
        Ok(())
    }

    /// The observation after buying.
    fn receipt(&self) -> String {
        let id = self.bought().map_or("", |p| p.id.as_str());
        format!(
            "thank you for shopping ! you bought {id} . reward {:.2}",
            self.reward
        )
    }

    /// Whether the current product satisfies the goal.
    fn on_good_product(&self) -> bool {
        self.current().is_some_and(|p| self.goal.satisfied_by(p))
    }
}

fn click(value: &str) -> ToolCall {
    ToolCall::new(tools::CLICK, [("value", json!(value))])
}

/// Words of the pages and the receipt besides catalogue words, ids, prices, ratings, counts and
/// rewards.
pub(crate) const OBSERVATION_WORDS: &[&str] = &[
    "search",
    "page",
    "results",
    "of",
    ",",
    "[",
    "]",
    "back",
    "to",
    "next",
    ">",
    "<",
    "prev",
    "$",
    "price",
    ":",
    "rating",
    "selected",
    "none",
    "and",
    "description",
    "features",
    "buy",
    "now",
    ";",
    "this",
    "from",
    "is",
    ".",
    "thank",
    "you",
    "for",
    "shopping",
    "!",
    "bought",
    "reward",
];

impl Environment for WebshopEnv {
    fn reset(&mut self) -> Reset {
        self.page = Page::Search;
        self.results.clear();
        self.results_page = 0;
        self.product = 0;
        self.selected.clear();
        self.bought = None;
        self.reward = 0.0;
        Reset {
            instruction: self.goal.instruction.clone(),
            tools: tools::schemas(),
        }
    }

    fn step(&mut self, call: &ToolCall) -> Step {
        if self.finished() {
            return Step {
                observation: "Error: the episode is over".to_string(),
                reward: 0.0,
                status: Status::Completed,
            };
        }
        match tools::action(call).and_then(|a| self.execute(a)) {
            Err(observation) => Step {
                observation,
                reward: 0.0,
                status: Status::InvalidAction,
            },
            Ok(_) if self.finished() => Step {
                observation: self.receipt(),
                reward: self.reward,
                status: Status::Completed,
            },
            Ok(observation) => Step {
                observation,
                reward: 0.0,
                status: Status::Running,
            },
        }
    }

    /// From any state: search the goal's query from the search page; on a results page, open
    /// the first product shown that satisfies the goal (else go back to search); on a satisfying
    /// product, select each goal option not yet selected, then buy; from anywhere else, go back
    /// to search (or back to the item page from its description or features).
    fn oracle(&self) -> Option<ToolCall> {
        if self.finished() {
            return None;
        }
        Some(match self.page {
            Page::Search => ToolCall::new(tools::SEARCH, [("keywords", json!(self.goal.query))]),
            Page::Results => {
                let good = self.shown().iter().find_map(|&p| {
                    self.catalog
                        .product(p)
                        .filter(|p| self.goal.satisfied_by(p))
                });
                click(good.map_or(BACK, |p| p.id.as_str()))
            }
            Page::Item if self.on_good_product() => {
                let product = self.current()?;
                let missing = self.goal.options.iter().find(|(g, v)| {
                    !product
                        .options
                        .iter()
                        .zip(&self.selected)
                        .any(|((pg, _), s)| pg == g && *s == Some(*v))
                });
                click(missing.map_or(BUY, |(_, v)| v))
            }
            Page::Description | Page::Features if self.on_good_product() => click(PREV),
            Page::Item | Page::Description | Page::Features => click(BACK),
        })
    }

    fn success(&self) -> bool {
        self.reward == 1.0
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
}
