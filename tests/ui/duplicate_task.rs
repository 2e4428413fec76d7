agentry::experiment!("duplicate_task.arl");

fn main() {}
