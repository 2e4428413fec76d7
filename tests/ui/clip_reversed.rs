agentry::experiment!("clip_reversed.arl");

fn main() {}
