agentry::experiment!("group_size_too_small.arl");

fn main() {}
