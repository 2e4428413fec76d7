agentry::experiment!("no_such_experiment.arl");

fn main() {}
