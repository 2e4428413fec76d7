agentry::experiment!("until_not_increasing.arl");

fn main() {}
