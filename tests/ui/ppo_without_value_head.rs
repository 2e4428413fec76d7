agentry::experiment!("ppo_without_value_head.arl");

fn main() {}
