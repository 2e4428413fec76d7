agentry::experiment!("cross_policy_without_stale.arl");

fn main() {}
